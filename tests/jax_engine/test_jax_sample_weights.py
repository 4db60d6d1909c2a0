"""Sample weights given in the input_fn, as stock's Keras estimator takes them (``features =
{"features": ..., "sample_weights": ...}``, keras_lib's spelling), on the JAX engine: training,
the evaluated loss and the unweighted metrics as stock's, on 8 devices with a short padded
batch; the weighted metrics weighted, as tpushim's other engines weigh them (stock reads none of
the weights there: the documented difference). Stock here is the stock path of the same
TensorFlow, in the same process."""

import json

import numpy as np
import procs
from jax_scripts import JAX_TESTS, ROOT

pytestmark = JAX_TESTS

# Stock 2.15's estimator on the same script (its stock run alone, TensorFlow 2.15.1): keras_lib
# recompiles the loss with the input's weights, but its weighted metrics read none of them.
# tpushim's TPUEstimator path and strategy engine on 2.15 give the same, but for those two
# (weighted): a_mae_1 0.8229231, b_accuracy_1 0.48567533.
STOCK_2_15 = {
    "loss": 1.2104609,
    "a_mae": 0.79902637,
    "a_mae_1": 0.79902637,
    "b_accuracy": 0.44444445,
    "b_accuracy_1": 0.44444445,
    "global_step": 4,
}
WEIGHTED_ON_THE_OTHER_ENGINES = {"a_mae_1": 0.8229231, "b_accuracy_1": 0.48567533}

EIGHT = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PYTHONPATH": ROOT}

CODE = """
import json, os, sys
import tpushim; tpushim.patch()
import numpy as np, tensorflow as tf
rng = np.random.RandomState(0)
x = rng.randn(27, 4).astype(np.float32)  # 27 rows in batches of 8: the last has 3
y = {"a": rng.randn(27, 1).astype(np.float32), "b": rng.randint(0, 2, (27, 1)).astype(np.float32)}
w = {"a": rng.rand(27).astype(np.float32) * 2, "b": rng.rand(27).astype(np.float32)}

def input_fn(weighted):
    def make():
        features = {"x": x}
        if weighted:
            features = {"features": features, "sample_weights": w}
        return tf.data.Dataset.from_tensor_slices((features, y)).batch(8)
    return make

out = {}
for run, scope, weighted in (
    ("engine", dict(mode="cpu", engine="jax"), True),
    ("stock", {}, True),
    ("stock unweighted", {}, False),
):
    tf.keras.utils.set_random_seed(3)
    inputs = tf.keras.Input((4,), name="x")
    hidden = tf.keras.layers.Dense(8, activation="tanh", name="h")(inputs)
    a = tf.keras.layers.Dense(1, name="a")(hidden)
    b = tf.keras.layers.Dense(1, activation="sigmoid", name="b")(hidden)
    model = tf.keras.Model(inputs, [a, b])
    model.compile(
        tf.keras.optimizers.legacy.SGD(0.1, momentum=0.5),
        {"a": "mse", "b": "binary_crossentropy"},
        metrics={"a": ["mae"], "b": ["accuracy"]},
        weighted_metrics={"a": ["mae"], "b": ["accuracy"]},
    )
    config = tf.estimator.RunConfig(model_dir=os.path.join(sys.argv[1], run), tf_random_seed=1)
    with tpushim.patched(**scope):
        est = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
    print("MADE", run, type(est).__name__)
    est.train(input_fn(weighted), steps=5)  # four batches, then the short one
    results = est.evaluate(input_fn(weighted))
    out[run] = {
        "metrics": {k: float(v) for k, v in results.items()},
        "weights": {
            n: np.asarray(est.get_variable_value(n)).tolist()
            for n in est.get_variable_names()
            if "/" in n and "global_step" not in n
        },
    }
print("RESULT " + json.dumps(out))
"""


def test_sample_weights_in_the_input_train_and_evaluate_as_stocks(tmp_path):
    proc = procs.python([tmp_path], code=CODE, env=EIGHT, cwd=tmp_path, timeout=600)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    got = json.loads(lines[-1][len("RESULT ") :])
    made = [x for x in proc.stdout.splitlines() if x.startswith("MADE ")]
    assert made[0] == "MADE engine JaxEstimator", made
    engine, stock, unweighted = got["engine"], got["stock"], got["stock unweighted"]
    assert set(engine["metrics"]) == set(stock["metrics"]) == set(STOCK_2_15), (engine, stock)
    for key, value in STOCK_2_15.items():  # this TensorFlow's stock path is stock 2.15's
        assert np.isclose(stock["metrics"][key], value, rtol=1e-5, atol=1e-6), (key, stock)
    assert set(engine["weights"]) == set(stock["weights"]) != set()
    for name, value in stock["weights"].items():
        np.testing.assert_allclose(engine["weights"][name], value, rtol=1e-5, atol=1e-6)
    want = {**stock["metrics"], **WEIGHTED_ON_THE_OTHER_ENGINES}
    for key, value in want.items():
        assert np.isclose(engine["metrics"][key], value, rtol=1e-5, atol=1e-6), (key, engine, stock)
    # Negative control: the weights change stock's numbers (the loss and the weighted metrics),
    # so an engine that dropped them would fail above.
    assert not np.isclose(unweighted["metrics"]["loss"], stock["metrics"]["loss"], rtol=1e-3)
    differ = [k for k in stock["metrics"] if "weighted" in k or k.endswith("_1")]
    assert any(
        not np.isclose(unweighted["metrics"][k], stock["metrics"][k], rtol=1e-3) for k in differ
    ), (unweighted, stock)
