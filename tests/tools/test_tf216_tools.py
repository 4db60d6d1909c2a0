"""TensorFlow >= 2.16: the preflight, the run summary, ``info`` and the notebooks on tpushim's
estimator API.

Runs only where TensorFlow >= 2.16 is installed (CI's Python 3.12 step). Each run is a subprocess
(``TF_USE_LEGACY_KERAS`` is decided once per process), as a user runs the command line.
"""

import json
import os
import re

import procs
import pytest

from tpushim import _versions

pytestmark = pytest.mark.skipif(
    not _versions.uses_own_estimator(),
    reason="TensorFlow < 2.16 installed: the preflight runs the TPU code path there",
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
ENV = {"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": ""}

#: A legacy script whose model holds a host-only op (a Python function in a Lambda layer), a
#: model_dir given in its RunConfig; ``{layer}`` is the layer's body.
HOST_ONLY = """
import sys
import numpy as np
import tensorflow as tf

model_dir = sys.argv[1]
x = np.random.RandomState(0).rand(64, 4).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 2).astype("float32")
inputs = tf.keras.Input((4,), name="x")
hidden = tf.keras.layers.Dense(8, name="dense")(inputs)
hidden = tf.keras.layers.Lambda({layer}, name="python_layer")(hidden)
outputs = tf.keras.layers.Dense(1, activation="sigmoid", name="out")(hidden)
model = tf.keras.Model(inputs, outputs)
model.compile(tf.keras.optimizers.legacy.SGD(0.1), "binary_crossentropy")
config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=3)
est = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
input_fn = lambda: tf.data.Dataset.from_tensor_slices(({{"x": x}}, y)).batch(32).repeat()
est.train(input_fn, steps=20)
print("RESULT", est.evaluate(input_fn, steps=2)["loss"])
"""
PY_FUNC = (  # no gradient of its own: the layer's input passes through it
    "lambda t: t + tf.stop_gradient(tf.reshape(tf.numpy_function(lambda a: a * 2, [t], "
    "tf.float32), [-1, 8]))"
)
CLEAN = "lambda t: t * 2"


def _check(args, cwd):
    return procs.python(["-m", "tpushim", "check", *args], env=ENV, cwd=cwd, timeout=600)


def _tree(folder):
    """{relative path: (size, mtime_ns, bytes)} of every file under ``folder``."""
    out = {}
    for base, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                data = f.read()
            stat = os.stat(path)
            out[os.path.relpath(path, folder)] = (stat.st_size, stat.st_mtime_ns, data)
    return out


@pytest.mark.slow
def test_check_of_a_clean_script_runs_it_a_few_steps_and_exits_0(tmp_path):
    proc = _check(["--json", os.path.join(SCRIPTS, "iris_add_metrics.py"), tmp_path], tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert report["exit_code"] == 0 and report["ok"], report
    assert report["checked"] == [
        "input pipeline",
        "batch size for 8 cores",
        "host-only ops in the model",
        "XLA compile of the training step",
    ]
    # Its steps were capped (the script trains 40), and the TPUEstimator-only checks named.
    assert '"global_step": 3.0' in proc.stderr
    not_run = [n for n in report["notes"] if n.startswith("not run on TensorFlow 2.")]
    assert len(not_run) == 1 and "TPUEstimator's TPU graphs on a faked TPU system" in not_run[0]
    codes = {f["code"] for f in report["findings"]}
    assert codes == {"batch-small", "float64-input", "no-prefetch"}, report["findings"]
    assert "on tpushim's estimator API (training capped at 3 steps)" in proc.stderr
    assert not os.path.exists(tmp_path / "model")  # its model_dir: not created


@pytest.mark.slow
def test_check_names_a_python_function_in_the_model_and_leaves_the_model_dir(tmp_path):
    model_dir = tmp_path / "model"
    (tmp_path / "train.py").write_text(HOST_ONLY.format(layer=PY_FUNC))
    # A model_dir a real run wrote: the check reads its checkpoint, and writes nothing there.
    first = procs.python(["-m", "tpushim", "train.py", model_dir], env=ENV, cwd=tmp_path)
    assert first.returncode == 0 and "RESULT" in first.stdout, first.stderr[-3000:]
    before = _tree(model_dir)
    assert any(name.startswith("model.ckpt-20") for name in before)
    proc = _check(["train.py", model_dir], tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-4000:]
    assert "tpushim check: FAIL - would not run on a TPU" in proc.stdout
    assert (
        "[ERROR] host-only-op at layer 'python_layer' (op PyFunc): a Python function "
        "(tf.py_function / tf.numpy_function) inside the model runs on the host"
    ) in proc.stdout
    assert "[ERROR] xla-unsupported-op at layer 'python_layer' (op PyFunc)" in proc.stdout
    assert f"note: model_dir {model_dir} is left as it is" in proc.stdout
    assert "starting from a copy of its latest checkpoint model.ckpt-20" in proc.stdout
    assert _tree(model_dir) == before


@pytest.mark.slow
def test_negative_control_the_same_model_without_the_python_function_passes(tmp_path):
    (tmp_path / "train.py").write_text(HOST_ONLY.format(layer=CLEAN))
    proc = _check(["train.py", tmp_path / "model"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "host-only-op" not in proc.stdout and "xla-" not in proc.stdout


@pytest.mark.slow
def test_check_reports_a_script_that_raises(tmp_path):
    script = HOST_ONLY.format(layer=CLEAN).replace(
        'print("RESULT"', 'raise RuntimeError("boom after training")\nprint("RESULT"'
    )
    (tmp_path / "train.py").write_text(script)
    proc = _check(["--json", "train.py", tmp_path / "model"], tmp_path)
    assert proc.returncode == 3, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    raised = [f for f in report["findings"] if f["code"] == "script-raised"]
    assert raised and "RuntimeError: boom after training" in raised[0]["message"]
    assert "on tpushim's estimator API" in raised[0]["message"]


def _run_notebook(name, tmp_path, monkeypatch, env=None):
    import test_notebooks  # its one way to execute a notebook, as CI does

    for var, value in dict(ENV, **(env or {})).items():
        monkeypatch.setenv(var, value)
    return test_notebooks.execute(name, tmp_path, monkeypatch, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("tpu", [None, "local"], ids=["no-tpu", "tpu-vm-runtime"])
def test_colab_quickstart_runs_the_strategy_engine_on_the_cpu(tmp_path, monkeypatch, tpu):
    out, err, _ = _run_notebook(
        "colab_quickstart.ipynb", tmp_path, monkeypatch, env={"TPUSHIM_TPU": tpu} if tpu else None
    )
    assert re.search(
        r"^ready: Python 3\.1[23], TensorFlow 2\.(1[6-9]|2[01])\.\d+, tf-keras 2\.\d+\.\d+, "
        r"tpushim \S+: this runtime runs the notebook\. On TensorFlow >= 2\.16 tpushim brings the "
        r"estimator API itself and runs the legacy script on CPU/GPU with stock 2\.15's numbers; "
        r"its TPU path there is the strategy engine",
        out,
        re.M,
    ), out[:2000]
    assert "skipped:" not in out  # every cell ran
    # No TPU here: cpu mode at once, or (a faked local TPU) once TensorFlow shows no TPU devices.
    assert ("tpushim mode: cpu" if tpu is None else "tpushim mode: auto") in out
    assert re.search(r"Can TensorFlow \S+ use a TPU here\? (no TPU on this runtime|NO: )", out)
    assert "estimator: StrategyEstimator" in out  # the TPU path on 2.16+ (TPUShimEstimator on 2.15)
    accuracy = float(re.search(r"'accuracy': ([0-9.]+)", out).group(1))
    assert accuracy > 0.9
    assert f"exported to {tmp_path}" in out and "served predictions:" in out
    if tpu is None:
        import test_notebooks

        test_notebooks.check_page_quotes("colab_quickstart.ipynb", out, err)


@pytest.mark.slow
def test_migrate_legacy_cnn_trains_the_estimator_api_and_the_strategy_engine(tmp_path, monkeypatch):
    """On Colab's Python the notebook runs to its end: the stock run on tpushim's estimator API,
    the tpushim run on the strategy engine in cpu mode, their loss curves equal."""
    out, err, images = _run_notebook("migrate_legacy_cnn.ipynb", tmp_path, monkeypatch)
    assert "skipped:" not in out and images == 1
    assert "tpushim run will use mode: cpu" in out and "preflight ok: True" in out
    assert "model_to_estimator -> tpushim's EstimatorV2 on TensorFlow >= 2.16" in err
    assert "model_to_estimator -> the strategy engine: " in err
    assert re.search(r"tpushim: +StrategyEstimator", out)
    difference = float(re.search(r"training-loss difference along the curve: (\S+)", out).group(1))
    assert difference <= 1e-4
    import test_notebooks

    test_notebooks.check_page_quotes("migrate_legacy_cnn.ipynb", out, err)


CHECK_API = """
import json
import tpushim; tpushim.patch()
import numpy as np, tensorflow as tf
x = np.zeros((64, 4), np.float32); y = np.zeros((64, 1), np.float32)
out = {}
for name, layer in (("clean", %s), ("py_func", %s)):
    inputs = tf.keras.Input((4,), name="x")
    hidden = tf.keras.layers.Lambda(layer, name="python_layer")(tf.keras.layers.Dense(8)(inputs))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, name="out")(hidden))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    report = tpushim.check(model, lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(64))
    out[name] = [report.ok, sorted({f.code for f in report.findings}), report.checked]
print("RESULT " + json.dumps(out))
""" % (CLEAN, PY_FUNC)


@pytest.mark.slow
def test_the_check_function_runs_the_same_checks_on_the_engine(tmp_path):
    proc = procs.python(code=CHECK_API, env=ENV, cwd=tmp_path)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    checked = [
        "input pipeline",
        "batch size for 8 cores",
        "host-only ops in the model",
        "XLA compile of the training step",
    ]
    assert out["clean"] == [True, ["no-prefetch"], checked]
    assert out["py_func"] == [False, ["host-only-op", "no-prefetch", "xla-unsupported-op"], checked]


@pytest.mark.slow
def test_run_summary_says_the_engine_and_times_each_call(tmp_path):
    proc = procs.python(
        ["-m", "tpushim", "--summary", os.path.join(SCRIPTS, "iris_add_metrics.py"), tmp_path],
        env=ENV,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = proc.stderr[proc.stderr.index("tpushim run summary:") :]
    assert re.search(
        r"estimator 1: model_to_estimator -> tpushim's EstimatorV2 on TensorFlow 2\.\d+\.\d+ with "
        r"tf-keras 2\.\d+\.\d+: stock 2\.15's path on CPU/GPU \(tpushim's estimator API\); the TPU path "
        r"there is the strategy engine \(mode cpu / tpu\)",
        summary,
    ), summary
    assert re.search(r"train\(\) +[0-9.]+ s  40 steps, [0-9.]+ steps/s", summary), summary
    # add_metrics' estimator: its evaluate() is the conversion's.
    assert re.search(r"evaluate\(\) +[0-9.]+ s", summary), summary
    assert re.search(r"train\(\) +CPU/GPU \(tpushim's estimator API\) +[0-9.]+ +40 ", summary), (
        summary
    )


def test_info_names_the_engine_tf_keras_and_the_tpu_path(tmp_path):
    info = procs.python(["-m", "tpushim", "info"], env=ENV, cwd=tmp_path)
    assert info.returncode == 0, info.stderr[-3000:]
    first, engine = info.stdout.splitlines()[:2]
    assert re.match(r"tpushim \S+: TensorFlow 2\.\d+\.\d+, Keras \S+, tf-keras 2\.\d+\.\d+ ", first)
    assert engine == (
        "estimator:   tpushim's estimator API (TensorFlow >= 2.16 has no tf.estimator: "
        "tf.compat.v1 graphs and sessions, on CPU/GPU); TPU path: the tf.distribute strategy "
        "engine (TPUStrategy)"
    )
    as_json = json.loads(
        procs.python(["-m", "tpushim", "info", "--json"], env=ENV, cwd=tmp_path).stdout
    )
    assert as_json["estimator_api"]["provider"] == "tpushim"
    assert as_json["estimator_api"]["tpu_path"] is True
    versions = as_json["versions"]
    assert versions["tf_keras"].split(".")[:2] == versions["tensorflow"].split(".")[:2]
