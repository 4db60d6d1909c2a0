"""A TF1-style script with disable_v2_behavior() (process-global, so in a subprocess): stock == cpu mode."""

import json
import os

import procs
import pytest
import tfcases

pytestmark = pytest.mark.slow  # trains estimators or runs scripts: outside the fast tier

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # this checkout's tpushim

SCRIPT = """
import json, sys
import numpy as np
import tensorflow.compat.v1 as tf
tf.disable_v2_behavior()
import tpushim

mode, model_dir = sys.argv[1], sys.argv[2]
rng = np.random.RandomState(0)
x, y = rng.rand(52, 4).astype("float32"), rng.randint(0, 3, size=(52, 1)).astype("int64")

def input_fn():
    return tf.data.Dataset.from_tensor_slices(({"dense_input": x}, y)).batch(8)

tf.keras.backend.clear_session()
tf.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.layers.Dense(3, activation="softmax", input_shape=(4,),
                             kernel_initializer=tf.keras.initializers.Constant(0.1))])
model.compile(tf.train.GradientDescentOptimizer(0.1), "sparse_categorical_crossentropy", ["accuracy"])
tpushim.patch(mode=mode)
est = tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=model_dir,
                                            config=tf.estimator.RunConfig(tf_random_seed=7))
est.train(input_fn, steps=5)
metrics = est.evaluate(input_fn)
print("RESULT " + json.dumps({k: float(v) for k, v in metrics.items() if k != "global_step"}))
"""


def _run(tmp_path, mode):
    script = tmp_path / "legacy_v1.py"
    script.write_text(SCRIPT)
    out = procs.python([script, mode, tmp_path / mode], env={"PYTHONPATH": ROOT}, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [line_ for line_ in out.stdout.splitlines() if line_.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


@pytest.mark.tpuestimator
def test_disable_v2_behavior_script_stock_equals_cpu(tmp_path):
    stock, shim = _run(tmp_path, "off"), _run(tmp_path, "cpu")
    assert set(stock) == set(shim)
    for key, value in stock.items():
        assert abs(shim[key] - value) <= tfcases.TOL, (key, shim[key], value)


PREFLIGHT = """
import json
import numpy as np
import tensorflow.compat.v1 as tf
tf.disable_v2_behavior()
import tpushim

x, y = np.zeros((64, 4), "float32"), np.zeros((64, 3), "float32")
fn = lambda: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64)
out = {}
for name, extra in (("clean", []), ("strings", [tf.keras.layers.Lambda(
        lambda v: v + 0.0 * tf.strings.to_number(tf.strings.as_string(v)), name="strs")])):
    model = tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(4,), name="d")] + extra)
    model.compile("adam", "mse")
    report = tpushim.check(model, fn)
    out[name] = [(f.code, f.where) for f in report.findings if f.severity != "info"]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.tpuestimator
def test_preflight_xla_check_under_disable_v2_behavior(tmp_path):
    """No eager context to ask XLA for its IR: the step is compiled in a graph instead -- no false
    'xla-compile' error on a clean model, the unsupported op named on a bad one."""
    script = tmp_path / "preflight_v1.py"
    script.write_text(PREFLIGHT)
    out = procs.python([script], env={"PYTHONPATH": ROOT}, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(
        [line_ for line_ in out.stdout.splitlines() if line_.startswith("RESULT ")][-1][7:]
    )
    assert result["clean"] == [], result
    assert result["strings"] == [["xla-unsupported-op", "layer 'strs' (op AsString)"]], result
