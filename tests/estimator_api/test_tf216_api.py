"""TensorFlow >= 2.16: the rest of the estimator API legacy scripts use, against stock 2.15.

Stock TensorFlow 2.15 ran each scenario of tests/api215.py (recorded in
tests/reference/tf215_api.json by ``python tests/api215.py`` in a TensorFlow 2.15 environment);
here the same programs run under tpushim and must give the same results:
- ``numpy_input_fn`` / ``pandas_input_fn`` with ``shuffle=True``: stock's example order (and so
  its trained weights), with the OS entropy stock's reader draws its start row from pinned;
- ``BestExporter`` (default compare_fn on loss, a custom one, the best so far read back from the
  eval dir's event files after a restart), ``LatestExporter`` (exports_to_keep, a user's own
  folders kept), ``FinalExporter`` (only at max_steps), ``stop_if_no_decrease_hook`` stopping
  ``train_and_evaluate``, and each hook of its family on that eval history;
- every public name of TensorFlow 2.15's ``tf.estimator`` / ``tf.compat.v1.estimator``: provided,
  or refused on access naming it and what to use instead.
Skipped on 2.12-2.15, where tf.estimator is stock's.
"""

import json
import os

import api215
import procs
import pytest

from tpushim import _versions

pytestmark = pytest.mark.skipif(
    not _versions.uses_own_estimator(),
    reason="TensorFlow < 2.16 installed: tf.estimator is stock's there (tests/tpuestimator/test_scripts.py)",
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(ROOT, "tests", "reference", "tf215_api.json"), encoding="utf-8") as _f:
    RECORDED = json.load(_f)
REFERENCE = RECORDED["results"]
PATCH = "import tpushim; tpushim.patch()"
ENV = {"TF_USE_LEGACY_KERAS": ""}


_close = api215.close


@pytest.mark.slow
def test_shuffled_numpy_and_pandas_input_fns_feed_stock_2_15s_order(tmp_path):
    got = api215.run("shuffle", tmp_path, patch=PATCH, env=ENV)
    want = REFERENCE["shuffle"]
    for kind in ("numpy", "pandas"):
        # The order itself (two epochs of 100 rows), then what training on it gave.
        assert got[kind]["order"] == want[kind]["order"]
        assert sorted(got[kind]["order"]) == sorted(list(range(100)) * 2)
    assert _close(got, want), (got, want)


@pytest.mark.slow
def test_negative_control_another_start_row_is_told_apart(tmp_path):
    # The comparison sees the order: the same program with other OS entropy (another start row,
    # as stock's next run would draw) gives a rotated order and other weights.
    source = api215.SCENARIOS["shuffle"].replace("1234 if a is None", "99 if a is None")
    api215.SCENARIOS["shuffle-control"] = source
    try:
        got = api215.run("shuffle-control", tmp_path, patch=PATCH, env=ENV)
    finally:
        del api215.SCENARIOS["shuffle-control"]
    want = REFERENCE["shuffle"]["numpy"]
    assert got["numpy"]["order"] != want["order"]
    assert not _close(got["numpy"]["w"], want["w"])


@pytest.mark.slow
def test_exporters_and_early_stopping_hooks_behave_as_stock_2_15(tmp_path):
    got = api215.run("exporters", tmp_path, patch=PATCH, env=ENV)
    want = REFERENCE["exporters"]
    # What stock did, spelled out: stopped at step 31 (no decrease for 20 steps after step 10),
    # best exported once at 10, the newest two kept beside the user's own folders, no final
    # export before max_steps; restarted, best compared with the event files' best.
    assert want["metrics"]["global_step"] == 31 and want["stop_var"] is True
    assert want["latest"] == ["12345", 30, 31, "notes"] and want["final"] == []
    assert want["restarted"]["best_exporter"] == [10, 41] and want["restarted"]["final"] == [70]
    assert _close(got, want), json.dumps(got)


# --- fast: every name of TF 2.15's estimator API, provided or refused with a hint ---------------

#: Names legacy scripts use through ``import tensorflow.compat.v1 as tf`` (tests/scripts): TF 2.15's
#: v2 ``tf.estimator`` had no ``inputs``, its v1 one did; tpushim provides both spellings.
SCRIPT_NAMES = [
    "tf.estimator.inputs.numpy_input_fn",
    "tf.estimator.inputs.pandas_input_fn",
    "tf.estimator.ModeKeys.TRAIN",
    "tf.estimator.ModeKeys.EVAL",
    "tf.estimator.ModeKeys.PREDICT",
]
#: TF 2.15's names tpushim does not provide (docs/reference/estimator-api.md says what instead).
REFUSED_PREFIXES = (
    "Baseline",
    "DNN",
    "Linear",
    "RNN",
    "KMeans",
    "BinaryClassHead",
    "Head",
    "LogisticRegressionHead",
    "MultiClassHead",
    "MultiHead",
    "MultiLabelHead",
    "PoissonRegressionHead",
    "RegressionHead",
    "InMemoryEvaluatorHook",
    "build_raw_supervised_input_receiver_fn",
    "call_logit_fn",
    "dnn_logit_fn_builder",
    "linear_logit_fn_builder",
)

WALK = """
import json, sys
import tpushim; tpushim.patch()
import tensorflow as tf
out = {}
for path in json.loads(sys.argv[1]):
    value, parts = tf, path.split(".")[1:]
    try:
        for part in parts:
            value = getattr(value, part)
        out[path] = "provided" if value is not None else "None"
    except AttributeError as e:
        out[path] = "refused: " + str(e)
print("RESULT " + json.dumps(out))
"""


def test_every_tf_2_15_estimator_name_is_provided_or_refused_with_what_instead():
    names = RECORDED["names"] + SCRIPT_NAMES
    proc = procs.python([json.dumps(names)], code=WALK, env={"PYTHONPATH": ROOT, **ENV})
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT ") :])
    for path, outcome in got.items():
        leaf = path.split(".")[-1]
        refused = ".tpu." in path or leaf.startswith(REFUSED_PREFIXES)
        if not refused:
            assert outcome == "provided", (path, outcome)
            continue
        assert outcome.startswith("refused: "), (path, outcome)
        # The error names the name (or the tpu namespace refused on access) and what to use.
        named = path if ".tpu." not in path else path[: path.index(".tpu.") + 4]
        assert f"{named} is not provided by tpushim on TensorFlow >= 2.16; use " in outcome, (
            path,
            outcome,
        )
        assert "docs/reference/estimator-api.md" in outcome
    provided = sum(v == "provided" for v in got.values())
    assert provided >= 100, provided  # the walk reached the names (not an empty list)


DISTRIBUTE = """
import json, os, sys
import tpushim; tpushim.patch()
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"])
out = {}
mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
out["mirrored"] = tf.estimator.RunConfig(train_distribute=mirrored).train_distribute is mirrored
for key, make in dict(
    train_distribute=lambda: tf.estimator.RunConfig(train_distribute=strategy),
    eval_distribute=lambda: tf.estimator.RunConfig(eval_distribute=strategy, model_dir=sys.argv[1]),
    replace=lambda: tf.estimator.RunConfig().replace(train_distribute=strategy),
).items():
    try:
        make()
        out[key] = "accepted"
    except NotImplementedError as e:
        out[key] = str(e)
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]},
                                      "task": {"type": "worker", "index": 0}})
try:
    tf.keras.estimator.model_to_estimator(
        tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))]), model_dir=sys.argv[1])
    out["TF_CONFIG"] = "accepted"
except NotImplementedError as e:
    out["TF_CONFIG"] = str(e)
print("RESULT " + json.dumps(out))
"""


def test_a_distribution_strategy_or_a_cluster_is_refused_by_name_before_anything_runs(tmp_path):
    # A strategy of two replicas other than a MirroredStrategy, or a cluster of two tasks: stock
    # 2.15 trains over them; tpushim's estimator API cannot (one process; several replicas only
    # as a MirroredStrategy): it says so, naming the argument and what to do, instead of training
    # on one device as if the strategy were there. (One replica, a MirroredStrategy of several
    # and a cluster of one chief train, with stock's numbers:
    # tests/tpuestimator/test_run_config_distribute.py.)
    model_dir = tmp_path / "model"
    proc = procs.python([model_dir], code=DISTRIBUTE, env={"PYTHONPATH": ROOT, **ENV})
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT ") :])
    assert got.pop("mirrored") is True
    for key in ("train_distribute", "eval_distribute", "replace"):
        name = "train_distribute" if key == "replace" else key
        assert got[key].startswith(
            f"RunConfig({name}=CentralStorageStrategy) over 2 replicas is not supported by "
            "tpushim's estimator API"
        ), got[key]
        assert "tf.distribute.MirroredStrategy over the same devices" in got[key]
        # Why: stock 2.15 itself fails on it with a slot optimizer, or has numbers of its own.
        assert "At least two variables have the same name" in got[key]
        assert "or a one-worker MultiWorkerMirroredStrategy" in got[key]
        assert "strategy one device" in got[key] and "TensorFlow <= 2.15" in got[key]
    assert got["TF_CONFIG"].startswith(
        "TF_CONFIG names a cluster of tf.estimator tasks (1 chief, 1 worker; this process: worker 0)"
    ), got["TF_CONFIG"]
    assert "unset TF_CONFIG" in got["TF_CONFIG"]
    assert not model_dir.exists()
