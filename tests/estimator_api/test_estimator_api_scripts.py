"""TensorFlow >= 2.16: legacy scripts run on tpushim's estimator API with stock 2.15's numbers.

Runs only where TensorFlow >= 2.16 is installed (CI's Python 3.12 step); skipped on 2.12-2.15,
where tf.estimator is stock's. The numbers of stock TensorFlow 2.15 -- the demo and every script
in tests/scripts -- are recorded in tests/reference/tf215.json by tests/scripts/record_reference.py
(run in a TensorFlow 2.15 environment); here the same scripts, unchanged, run on this TensorFlow
under tpushim (no TPU: the stock-equivalent path) and must give them within rel 1e-4.
Each run is a subprocess: ``TF_USE_LEGACY_KERAS`` is decided once per process.
"""

import json
import math
import os
import runpy
import shutil

import procs
import pytest

from tpushim import _versions

pytestmark = pytest.mark.skipif(
    not _versions.uses_own_estimator(),
    reason="TensorFlow < 2.16 installed: tf.estimator is stock's there (tests/tpuestimator/test_scripts.py)",
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
with open(os.path.join(ROOT, "tests", "reference", "tf215.json"), encoding="utf-8") as _f:
    REFERENCE = json.load(_f)["results"]
#: Relative tolerance against stock 2.15 (another TensorFlow release: kernels may round differently).
REL = 1e-4
DEMO = "\n".join(
    [
        "import json, sys",
        "{patch}",
        "from tpushim.demo import legacy_mlp",
        "results, predictions = legacy_mlp.train_and_evaluate(sys.argv[1])",
        "out = {{k: float(v) for k, v in results.items()}}",
        "out.update(predictions=len(predictions), first=float(predictions[0][0]),"
        " last=float(predictions[-1][0]))",
        "print('RESULT ' + json.dumps(out))",
    ]
)


def _result(proc):
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _differences(got, want):
    """Keys whose values differ beyond REL (or are missing on either side)."""
    out = {k: (got.get(k), want.get(k)) for k in set(got) ^ set(want)}
    for key, value in want.items():
        if key in got and not math.isclose(got[key], value, rel_tol=REL, abs_tol=1e-6):
            out[key] = (got[key], value)
    return out


def _script_names():
    return sorted(name for name in REFERENCE if name.endswith(".py"))


#: Scripts whose stock order is its feeding thread's race (numpy_input_fn(shuffle=True): stock's
#: RandomShuffleQueue gives the recorded order while its reader keeps it full, which a loaded
#: machine does not; tests/tpuestimator/test_scripts.py's FEEDER_RACE). The estimator API runs
#: stock's queue and thread, race included: here the machine is made a quiet one -- each dequeue
#: waits 50 ms first, as a reader ahead of its consumer -- through a post-import hook.
FEEDER_RACE = ("shapes_cnn_shuffled_numpy.py",)
QUIET_READER = "\n".join(
    [
        "import runpy, sys, time, wrapt",
        "@wrapt.when_imported('tpushim._estimator_api._inputs')",
        "def _quiet(module, dequeue=None):",
        "    import tensorflow as tf",
        "    dequeue = module._dequeue",
        "    def waited(queue, batch_size, num_epochs):",
        "        wait = tf.py_function(lambda: time.sleep(0.05) or 0, [], tf.int32)",
        "        with tf.control_dependencies([wait]):",
        "            return dequeue(queue, batch_size, num_epochs)",
        "    module._dequeue = waited",
        "sys.argv = ['tpushim', *sys.argv[1:]]",
        "runpy.run_module('tpushim', run_name='__main__', alter_sys=True)",
    ]
)


@pytest.mark.slow
@pytest.mark.parametrize("script", _script_names())
def test_script_under_the_runner_equals_stock_2_15(script, tmp_path):
    runner = ["-c", QUIET_READER] if script in FEEDER_RACE else ["-m", "tpushim"]
    proc = procs.python(
        [*runner, os.path.join(SCRIPTS, script), tmp_path],
        env={"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": ""},
        cwd=tmp_path,
        timeout=600,
    )
    assert "tpushim set TF_USE_LEGACY_KERAS=1" in proc.stderr, proc.stderr[-3000:]
    assert "model_to_estimator -> tpushim's Estimator" in proc.stderr
    assert _differences(_result(proc), REFERENCE[script]) == {}


@pytest.mark.slow
@pytest.mark.parametrize("script", _script_names())
def test_script_on_the_strategy_engine_equals_stock_2_15(script, tmp_path):
    """``--mode cpu`` on 2.16+ is the strategy engine (the TPU path there; #33): every script
    gives stock 2.15's numbers, or the refusal tests/engine_scripts.py names."""
    import engine_scripts

    proc = procs.python(
        ["-m", "tpushim", "--mode", "cpu", os.path.join(SCRIPTS, script), tmp_path],
        env={"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": ""},
        cwd=tmp_path,
        timeout=600,
    )
    if script in engine_scripts.REFUSED:
        assert engine_scripts.refused_as_said(script, proc.returncode, proc.stderr), proc.stderr[
            -3000:
        ]
        return
    assert "the strategy engine" in proc.stderr, proc.stderr[-3000:]
    assert _differences(_result(proc), REFERENCE[script]) == {}


@pytest.mark.slow
@pytest.mark.parametrize(
    "patch,env",
    [
        ("import tpushim; tpushim.patch()", {}),
        ("", {"TPUSHIM_AUTOPATCH": "1"}),
        ("import tpushim; tpushim.patched().__enter__()", {}),
    ],
    ids=["one-line", "autopatch", "scoped"],
)
def test_demo_equals_stock_2_15_under_each_entry_point(patch, env, tmp_path):
    proc = procs.python(
        [tmp_path],
        code=DEMO.format(patch=patch),
        env={"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": "", **env},
        cwd=tmp_path,
    )
    assert _differences(_result(proc), REFERENCE["demo"]) == {}


@pytest.mark.slow
def test_negative_control_one_step_less_is_told_apart(tmp_path):
    # The comparison sees a real difference: the demo trained 299 steps instead of 300.
    code = DEMO.format(patch="import tpushim; tpushim.patch()").replace(
        "from tpushim.demo import legacy_mlp",
        "from tpushim.demo import legacy_mlp; legacy_mlp.TRAIN_STEPS = 299",
    )
    proc = procs.python(
        [tmp_path], code=code, env={"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": ""}, cwd=tmp_path
    )
    differences = _differences(_result(proc), REFERENCE["demo"])
    assert {"loss", "global_step"} <= set(differences), differences


def _resume(model_dir):
    """Phase 2 of record_reference.RESUME under tpushim: resume the demo's model in model_dir."""
    code = runpy.run_path(os.path.join(SCRIPTS, "record_reference.py"))["RESUME"]
    proc = procs.python(
        ["2", model_dir],
        code="import tpushim; tpushim.patch()\n" + code,
        env={"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": ""},
        cwd=model_dir,
    )
    return _result(proc)


@pytest.mark.slow
def test_a_model_dir_stock_2_15_wrote_resumes_with_stock_numbers(tmp_path):
    # Stock 2.15 trained 100 steps and kept its checkpoint (tests/reference/tf215_demo_model);
    # tpushim on this TensorFlow restores it, trains 100 more, and ends where stock 2.15 ended.
    model_dir = tmp_path / "model"
    shutil.copytree(os.path.join(ROOT, "tests", "reference", "tf215_demo_model"), model_dir)
    got = _resume(model_dir)
    assert got["global_step"] == 200
    assert _differences(got, REFERENCE["demo resumed"]) == {}


@pytest.mark.slow
def test_negative_control_without_the_checkpoint_the_numbers_differ(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    differences = _differences(_resume(model_dir), REFERENCE["demo resumed"])
    assert {"global_step", "loss", "kernel"} <= set(differences), differences


def test_the_saved_model_exported_here_loads_and_predicts_as_recorded():
    # tests/reference/tf221_saved_model: exported by tpushim on TensorFlow 2.21
    # (record_reference.py --engine); tests/estimator_api/test_tf216_interop.py loads it on stock 2.15.
    code = (
        "import json, sys, tensorflow as tf\n"
        "from tpushim.demo import legacy_mlp\n"
        "x, _ = legacy_mlp.make_data(200, seed=2)\n"
        "serve = tf.saved_model.load(sys.argv[1]).signatures['serving_default']\n"
        "p = serve(x=tf.constant(x))['probabilities'].numpy()\n"
        "print('RESULT ' + json.dumps(dict(first=p[0].tolist(), last=p[-1].tolist(),"
        " class0=float(p[:, 0].sum()))))\n"
    )
    saved = os.path.join(ROOT, "tests", "reference", "tf221_saved_model")
    got = _result(procs.python([saved], code=code, env={"PYTHONPATH": ROOT}))
    with open(os.path.join(ROOT, "tests", "reference", "tf221.json"), encoding="utf-8") as f:
        want = json.load(f)["saved_model"]
    for key in ("first", "last"):
        assert all(
            math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7) for a, b in zip(got[key], want[key])
        )
    assert math.isclose(got["class0"], want["class0"], rel_tol=1e-5)


# --- fast: names, spellings, refusals (each a short subprocess, no training) ---------------------

SPELLINGS = """
import sys
import tpushim; tpushim.patch()
import tensorflow as tf
import tensorflow.compat.v1 as tf1
from tensorflow.keras.estimator import model_to_estimator as from_import
from tensorflow.compat.v1.keras.estimator import model_to_estimator as from_import_v1
from tpushim import _patch
spellings = [tf.keras.estimator.model_to_estimator, tf.compat.v1.keras.estimator.model_to_estimator,
             tf.compat.v2.keras.estimator.model_to_estimator, from_import, from_import_v1,
             tf1.keras.estimator.model_to_estimator]
print("wrapped", [_patch.is_ours(f) for f in spellings])
print("namespaces", [_patch.is_ours(n) for n in (tf.estimator, tf1.estimator, tf.compat.v2.estimator)])
names = ["RunConfig", "TrainSpec", "EvalSpec", "train_and_evaluate", "ModeKeys", "EstimatorSpec",
         "Estimator", "FinalExporter", "LatestExporter", "add_metrics", "SessionRunHook",
         "LoggingTensorHook", "WarmStartSettings"]
print("names", all(hasattr(ns, n) for ns in (tf.estimator, tf1.estimator) for n in names))
print("inputs", tf.estimator.inputs.numpy_input_fn is tf1.estimator.inputs.numpy_input_fn,
      callable(tf.estimator.inputs.pandas_input_fn))
print("export", [hasattr(tf.estimator.export, n) for n in ("ServingInputReceiver",
      "build_raw_serving_input_receiver_fn", "build_parsing_serving_input_receiver_fn")])
try:
    tf.estimator.DNNClassifier
except AttributeError as e:
    print("missing:", e)
tpushim.unpatch()
print("after unpatch", hasattr(tf, "estimator"), _patch.is_ours(tf.keras.estimator.model_to_estimator))
"""


def test_every_spelling_and_name_is_there_while_patched_and_gone_after():
    proc = procs.python(code=SPELLINGS, env={"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": ""})
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wrapped [True, True, True, True, True, True]" in out
    assert "namespaces [True, True, True]" in out
    assert "names True" in out and "inputs True True" in out
    assert "export [True, True, True]" in out
    assert (
        "missing: tf.estimator.DNNClassifier is not provided by tpushim on TensorFlow >= 2.16; "
        "use a tf.keras model converted with tf.keras.estimator.model_to_estimator instead"
    ) in out
    assert "after unpatch False False" in out


def test_patch_sets_legacy_keras_before_tf_keras_is_touched():
    code = (
        "import os, tpushim; tpushim.patch()\n"
        "print('env', os.environ.get('TF_USE_LEGACY_KERAS'))\n"
        "import tensorflow as tf\nprint('keras', tf.keras.__name__)\n"
    )
    proc = procs.python(
        code=code,
        env={"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": "", "TPUSHIM_LOG_LEVEL": "INFO"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "env 1" in proc.stdout and "keras tf_keras.api._v2.keras" in proc.stdout
    assert proc.stderr.count("tpushim set TF_USE_LEGACY_KERAS=1") == 1, proc.stderr


def test_too_late_for_legacy_keras_refuses_clearly():
    code = (
        "import warnings, tensorflow as tf\ntf.keras.layers\n"  # tf.keras resolved: Keras 3
        "import tpushim\nwith warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always'); tpushim.patch()\n"
        "print('patched', tpushim.is_patched(), hasattr(tf, 'estimator'))\n"
        "print(w[0].message)\n"
    )
    proc = procs.python(code=code, env={"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "patched False False" in proc.stdout
    assert (
        "tpushim does not support Keras 3 as tf.keras: tf.keras already resolved to Keras 3"
    ) in proc.stdout
    assert "Fix: call tpushim.patch() before the script first uses tf.keras" in proc.stdout


def test_info_says_what_a_call_returns_and_check_runs_on_the_engine(tmp_path):
    (tmp_path / "prog.py").write_text("print('RAN')\n")
    env = {"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": ""}
    info = procs.python(["-m", "tpushim", "info"], env=env, cwd=tmp_path)
    assert info.returncode == 0, info.stderr[-3000:]
    assert "returns: tpushim's estimator (TensorFlow >= 2.16 has none" in info.stdout
    # The preflight runs on tpushim's estimator API here (tests/tools/test_tf216_tools.py): a script that
    # converts nothing is its finding, no traceback.
    check = procs.python(["-m", "tpushim", "check", "prog.py"], env=env, cwd=tmp_path)
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr[-3000:]
    assert "RAN" in check.stdout and "[ERROR] no-conversion at script" in check.stdout


def test_load_ext_in_a_notebook_brings_the_names_before_tensorflow():
    code = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "shell.run_line_magic('load_ext', 'tpushim')\n"
        "shell.run_cell('import tensorflow as tf')\n"
        "shell.run_cell('print(\"names\", tf.keras.__name__, callable(tf.estimator.RunConfig))')\n"
    )
    proc = procs.python(code=code, env={"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "names tf_keras.api._v2.keras True" in proc.stdout, proc.stdout + proc.stderr[-2000:]


HOOKS = """
import json, sys
import tpushim; tpushim.patch()
import numpy as np, tensorflow as tf
seen = []
class Counter(tf.estimator.SessionRunHook):  # a user's own hook, as scripts write them
    def after_run(self, run_context, run_values):
        seen.append(1)
m = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,), name="out")])
m.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
est = tf.keras.estimator.model_to_estimator(keras_model=m, model_dir=sys.argv[1])
x = np.ones((8, 2), np.float32); y = np.ones((8, 1), np.float32)
fn = lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat()
est.train(fn, steps=3, hooks=[Counter()])
try:
    tf.estimator.experimental.InMemoryEvaluatorHook(est, fn)
except AttributeError as e:
    print("refused:", e)
# max_steps already reached: stock 2.15 cannot read the step from the object-based checkpoint
# (no "global_step" key), so it trains once more and stops: model.ckpt-4, as measured on 2.15.
est.train(fn, max_steps=3)
print("RESULT " + json.dumps({"hook_calls": len(seen),
    "latest": est.latest_checkpoint().endswith("model.ckpt-4")}))
"""


@pytest.mark.slow
def test_a_users_own_hook_runs_and_unprovided_hooks_refuse_clearly(tmp_path):
    proc = procs.python([tmp_path], code=HOOKS, env={"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": ""})
    assert _result(proc) == {"hook_calls": 3, "latest": True}
    assert "refused: tf.estimator.experimental.InMemoryEvaluatorHook is not provided" in (
        proc.stdout
    )
