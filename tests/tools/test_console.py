"""The one-line route (``import tpushim; tpushim.patch()``) says what it did: a conversion to a
TPUEstimator prints its line on stderr in a script that configured no logging; the stock path stays
silent (on TensorFlow >= 2.16, where tf.keras and the estimator change, it says so); ``quiet`` and
``TPUSHIM_QUIET`` hide the line; ``TPUSHIM_LOG_LEVEL`` shows debug lines. The one line, the runner
and autopatch say the same lines in one format. Real scripts in subprocesses: whether logging is
configured is a property of the whole process."""

import os

import procs
import pytest

from tpushim import _versions

pytestmark = pytest.mark.slow  # runs TensorFlow subprocesses: outside the fast tier

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each case converts the same small model once, after a marker line on stderr.
SCRIPT = """
import logging, sys, tempfile
import tensorflow as tf
import tfcases
import tpushim

def convert(case, **patch):
    print(f"--- {case}", file=sys.stderr, flush=True)
    # What a Keras deprecation warning looks like from a venv named after tpushim (a common
    # name): it must not be taken for one of tpushim's own lines.
    print("WARNING:tensorflow:From /home/u/tpushim/venv/lib/python3.11/site-packages/keras/"
          "src/backend.py:873: The name tf.get_default_graph is deprecated.", file=sys.stderr)
    tpushim.patch(**patch)
    tf.keras.estimator.model_to_estimator(
        keras_model=tfcases.sequential(), model_dir=tempfile.mkdtemp(dir=sys.argv[1])
    )

convert("stock")  # no TPU, mode auto: the stock estimator
convert("cpu", mode="cpu")
convert("quiet", mode="cpu", quiet=True)
logging.basicConfig(format="LOGGED %(name)s: %(message)s", level=logging.INFO)
convert("logging configured", mode="cpu")
"""

LINE = "tpushim: model_to_estimator -> TPUEstimator(use_tpu=False"

#: How tpushim's own lines start: its console handler's prefix, or the configured format below.
OURS = ("tpushim: ", "LOGGED tpushim: ")


def cases(tmp_path, **env):
    proc = procs.python([str(tmp_path)], code=SCRIPT, env=dict(env, PYTHONPATH=TESTS), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {}
    for chunk in proc.stderr.split("--- ")[1:]:
        case, _, text = chunk.partition("\n")
        out[case] = [line for line in text.splitlines() if line.startswith(OURS)]
    return out


@pytest.mark.tpuestimator
def test_the_one_line_route_says_what_it_converted(tmp_path):
    out = cases(tmp_path)
    assert out["stock"] == []  # nothing changed, nothing said
    assert len(out["cpu"]) == 1 and out["cpu"][0].startswith(LINE)
    assert "[mode cpu from argument: the TPU code path on CPU]" in out["cpu"][0]
    assert out["quiet"] == []
    # Logging configured: the line goes there, once, in the application's format.
    conversions = [line for line in out["logging configured"] if " -> " in line]
    assert [line.split(" -> ")[0] for line in conversions] == ["LOGGED tpushim: model_to_estimator"]


@pytest.mark.tpuestimator
def test_variables_hide_the_line_or_show_debug_lines(tmp_path):
    quiet = cases(tmp_path, TPUSHIM_QUIET="1")
    assert quiet["cpu"] == [] and quiet["stock"] == []
    debug = cases(tmp_path, TPUSHIM_LOG_LEVEL="debug")
    assert any(
        line.startswith("tpushim: model_to_estimator called with Settings(mode='auto'")
        for line in debug["stock"]
    )
    assert any(line.startswith("tpushim: model_to_estimator -> stock") for line in debug["stock"])
    assert sum(line.startswith(LINE) for line in debug["cpu"]) == 1  # once, not twice


# A legacy script that converts and trains, then makes deprecated calls of its own: some tpushim
# makes too (tpu RunConfig, TPUEstimatorSpec), some stock makes (RunConfig, hooks). Not TPUConfig:
# TPUEstimator's own code copies one (its warning is TensorFlow's, as a stock TPUEstimator's).
DEPRECATED = """
import sys
import tensorflow as tf
import tpushim

tpushim.patch()  # the mode from TPUSHIM_MODE: cpu, or off (stock)
model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.1), loss="mse")
est = tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=sys.argv[1])

def input_fn():
    return tf.data.Dataset.from_tensor_slices((tf.zeros([16, 3]), tf.zeros([16, 2]))).batch(8)

est.train(input_fn, steps=2)
est.evaluate(input_fn)
tpu = tf.compat.v1.estimator.tpu
tpu.RunConfig()
tpu.TPUEstimatorSpec(mode="infer", predictions=tf.zeros([1]))
tf.estimator.RunConfig()
tf.compat.v1.train.StepCounterHook(every_n_steps=1)
"""


@pytest.mark.tpuestimator
def test_tensorflow_deprecation_warnings_of_tpushims_calls_only_are_silenced(tmp_path):
    """TensorFlow warns once per deprecated name, from the first caller: tpushim's own calls
    print nothing and use up no warning, so the script's own lines are exactly stock's."""
    import tpushim

    script = tmp_path / "legacy.py"
    script.write_text(DEPRECATED)
    lines = {}
    for mode in ("off", "cpu"):
        proc = procs.python([script, tmp_path / mode], env={"TPUSHIM_MODE": mode}, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        froms = [
            line for line in proc.stderr.splitlines() if line.startswith("WARNING:tensorflow:From ")
        ]
        ours = [line for line in froms if os.path.dirname(tpushim.__file__) in line]
        assert ours == [], ours
        lines[mode] = [line for line in froms if str(script) in line]
    assert lines["cpu"] == lines["off"]
    # The script's calls are the first outside tpushim: they warn, as in stock (tpushim's calls,
    # made first, did not use their warnings up).
    for name in (
        "RunConfig.__init__ (from tensorflow_estimator.python.estimator.tpu.tpu_config)",
        "TPUEstimatorSpec.__new__",
    ):
        assert any(name in line for line in lines["cpu"]), lines


# A legacy script with no tpushim in it: it converts, trains a step, and converts again (after
# TensorFlow's first absl log line, which puts a handler on the root logger: issue 45 saw the
# line as absl's ``INFO:tpushim:...`` from there on, or not at all).
LEGACY = """
import sys
{patch}
import numpy as np
import tensorflow as tf

def convert(name):
    inputs = tf.keras.layers.Input((4,))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(inputs))
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.1), loss="mse")
    return tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=sys.argv[1] + name)

def input_fn():
    x = np.ones((16, 4), "float32")
    return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8)

convert("/a").train(input_fn, steps=1)
# What TensorFlow >= 2.16 does inside the first conversion (its checkpoint code), here on every TF.
from absl import logging as absl_logging
absl_logging.warning("a library's first absl line: absl configures the root logger")
convert("/b")
print("RAN")
"""

#: The ways in that print tpushim's lines: (arguments before the script, environment, patch line).
WAYS = {
    "one line": ((), {}, "import tpushim; tpushim.patch()"),
    "runner": (("-m", "tpushim"), {}, ""),
    "autopatch": ((), {"TPUSHIM_AUTOPATCH": "1"}, ""),
}


def _said(stderr):
    """tpushim's log lines in ``stderr``, in whatever format they came (the run summary aside)."""
    return [
        line
        for line in stderr.splitlines()
        if (line.startswith("tpushim") and not line.startswith("tpushim run summary"))
        or ":tpushim:" in line
    ]


def _tf_version():
    return _versions.installed_versions(read_metadata=True)[0]


def _run_legacy(tmp_path, way, mode, **env):
    before, way_env, patch = WAYS[way]
    script = tmp_path / "legacy.py"
    script.write_text(LEGACY.format(patch=patch))
    proc = procs.python(
        [*before, script, tmp_path / way.replace(" ", "_")],
        env={"TPUSHIM_MODE": mode, "TF_USE_LEGACY_KERAS": "", **way_env, **env},
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and "RAN" in proc.stdout, proc.stderr[-3000:]
    return proc


def _expected(mode):
    """The lines every way in says for LEGACY under ``TPUSHIM_MODE=mode``, as the code words them."""
    version = _tf_version()
    if _versions.uses_own_estimator():
        keras2 = (
            f"tpushim set TF_USE_LEGACY_KERAS=1: tf.keras is tf_keras (Keras 2) on TensorFlow "
            f"{version}, and tf.estimator is tpushim's while it is patched"
        )
        converted = (
            "tpushim: model_to_estimator -> the strategy engine: tf.distribute.MirroredStrategy "
            "over this machine's devices [mode cpu from TPUSHIM_MODE], global batch from input, "
            f"steps_per_execution 100 [engine: TensorFlow {version} has no TPUEstimator]"
            if mode == "cpu"
            else "tpushim: model_to_estimator -> tpushim's EstimatorV2 on TensorFlow >= 2.16 "
            "(no TPU configured; stock 2.15's path)"
        )
        return [keras2, converted, converted]
    if mode == "cpu":
        converted = (
            "tpushim: model_to_estimator -> TPUEstimator(use_tpu=False, global batch from input, "
            "iterations_per_loop 100) [mode cpu from TPUSHIM_MODE: the TPU code path on CPU]"
        )
        return [converted, converted]
    return []  # TensorFlow <= 2.15, no TPU: the stock estimator, nothing changed, nothing said


@pytest.mark.parametrize("way", sorted(WAYS))
def test_every_way_in_says_the_same_lines_in_one_format(way, tmp_path):
    """The one line, the runner and autopatch: on TensorFlow >= 2.16 that tf.keras is Keras 2
    and tf.estimator tpushim's, then each conversion, every line as ``tpushim: ...`` -- also
    after TensorFlow's absl put its handler on the root logger."""
    proc = _run_legacy(tmp_path, way, "cpu")
    assert _said(proc.stderr) == _expected("cpu"), proc.stderr[-3000:]


def test_the_one_line_says_what_tensorflow_2_16_changes_on_the_stock_path(tmp_path):
    proc = _run_legacy(tmp_path, "one line", "auto")
    assert _said(proc.stderr) == _expected("auto"), proc.stderr[-3000:]
    quiet = _run_legacy(tmp_path, "one line", "auto", TPUSHIM_QUIET="1")
    assert _said(quiet.stderr) == [], quiet.stderr[-3000:]


def test_the_strategy_engine_prints_no_autograph_noise(tmp_path):
    """Its step is a tf.function: AutoGraph once followed tpushim's loss helpers into
    ``importlib.import_module`` and warned, twice a run, that it could not transform
    ``_gcd_import``."""
    proc = _run_legacy(tmp_path, "one line", "cpu", TPUSHIM_ENGINE="strategy")
    assert "model_to_estimator -> the strategy engine" in proc.stderr, proc.stderr[-3000:]
    assert "AutoGraph could not transform" not in proc.stderr, proc.stderr[-3000:]
