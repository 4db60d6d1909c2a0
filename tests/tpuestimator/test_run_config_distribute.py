"""RunConfig's ``train_distribute`` / ``eval_distribute`` and ``TF_CONFIG`` as legacy scripts set
them, on every path: what stock 2.15 trains, tpushim trains with stock's numbers; what no path
can honour is refused before anything is written, naming TF_CONFIG and what to do.

The scenario (tests/api215.py ``distribute``: a strategy of one replica, a cluster of one
"chief" as a job launcher sets it, train_and_evaluate as that chief, and the clusters stock's
RunConfig refuses) was recorded on stock 2.15 (tests/reference/tf215_api.json); here it runs on
TensorFlow 2.12-2.15 on both engines in cpu mode, and on >= 2.16 on tpushim's estimator API and
the strategy engine. Clusters of more than one task on >= 2.16: tests/estimator_api/test_tf216_api.py.

Scenario ``replicas``: a MirroredStrategy over 2 and 4 logical CPU devices, and a one-worker
MultiWorkerMirroredStrategy over 2 (each replica its own
batch of the input_fn's, BatchNormalization's statistics each replica's), recorded on stock 2.15;
on >= 2.16 tpushim's estimator API trains it over the replicas with stock's numbers, and cpu mode
(a TPU's path: the input_fn's batch global) refuses it on every engine, naming why.
"""

import json
import os

import api215
import procs
import pytest

from tpushim import _versions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(ROOT, "tests", "reference", "tf215_api.json"), encoding="utf-8") as _f:
    _RESULTS = json.load(_f)["results"]
RECORDED = _RESULTS["distribute"]
REPLICAS = _RESULTS["replicas"]
OWN = _versions.uses_own_estimator()
PATHS = (
    {"estimator API": "", "strategy engine": "mode='cpu'"}
    if OWN
    else {"TPUEstimator path": "mode='cpu'", "strategy engine": "mode='cpu', engine='strategy'"}
)


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(PATHS))
def test_one_replica_and_a_one_chief_cluster_as_stock_2_15(tmp_path, path):
    """``MirroredStrategy()`` on a CPU machine (one replica) trains with the numbers of no
    strategy; ``TF_CONFIG`` of one chief trains as the chief, and its train_and_evaluate trains
    to max_steps, evaluates nothing and returns None, as stock's; stock's errors for a cluster
    without a chief, with two, and a chief task without a cluster."""
    patch = f"import tpushim; tpushim.patch({PATHS[path]})"
    got = api215.run("distribute", tmp_path, patch=patch, env={"TF_USE_LEGACY_KERAS": ""})
    assert api215.close(got, RECORDED), json.dumps(got)
    assert got["one_replica"] == got["plain"] or api215.close(got["one_replica"], got["plain"])


@pytest.mark.tpuestimator
@pytest.mark.parametrize("engine", ["tpuestimator", "strategy"])
def test_a_distribute_coordinator_cluster_is_refused_before_anything_is_written(
    tmp_path, monkeypatch, engine
):
    """A strategy in RunConfig and a cluster in TF_CONFIG (a loopback address) put stock 2.15's
    RunConfig in its distribute coordinator's mode (each task a copy of the estimator; stock
    itself fails there for a MirroredStrategy): refused at conversion, naming TF_CONFIG and what
    to do, on both engines; the TPUEstimator path raised TensorFlow's raw "must have one chief"
    and the strategy engine failed copying the estimator."""
    import tensorflow as tf
    import tfcases

    from tpushim import ConversionError

    cluster = {"worker": ["127.0.0.1:1"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker"}}))
    config = tf.estimator.RunConfig(train_distribute=tf.distribute.MirroredStrategy())
    with pytest.raises(ConversionError) as raised:
        tfcases.convert(
            tmp_path / "model",
            patch={"mode": "cpu", "engine": engine, "quiet": True},
            config=config,
        )
    assert "TF_CONFIG (1 worker)" in str(raised.value)
    assert "Unset TF_CONFIG" in str(raised.value)
    assert not (tmp_path / "model").exists()


CHECKED = """
import json, os, sys
import numpy as np, tensorflow as tf
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": ["127.0.0.1:1"]},
                                      "task": {"type": "worker", "index": 0}})
model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
model.compile("sgd", "mse")
config = tf.estimator.RunConfig(model_dir=sys.argv[1],
                                train_distribute=tf.distribute.MirroredStrategy())
estimator = tf.keras.estimator.model_to_estimator(model, config=config)
x = np.ones((8, 2), "float32")
estimator.train(lambda: tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(4), steps=1)
"""


@pytest.mark.slow
@pytest.mark.tpuestimator
def test_the_preflight_reports_the_cluster_it_cannot_honour(tmp_path):
    """``tpushim check`` on such a script: blocked (exit 1), naming TF_CONFIG, nothing written."""
    script = tmp_path / "distributed.py"
    script.write_text(CHECKED)
    model_dir = tmp_path / "model"
    proc = procs.python(
        ["-m", "tpushim", "check", str(script), str(model_dir)], env={"PYTHONPATH": ROOT}
    )
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "TF_CONFIG (1 worker)" in proc.stdout + proc.stderr
    assert not model_dir.exists()


def _largest_difference(got, want):
    """The largest absolute difference between two results' numbers (same structure)."""
    if isinstance(want, dict):
        return max((_largest_difference(got[k], want[k]) for k in want), default=0.0)
    if isinstance(want, list):
        return max((_largest_difference(a, b) for a, b in zip(got, want)), default=0.0)
    if isinstance(want, float):
        return abs(got - want)
    return 0.0


V2_KEYS = ("v2_object_checkpoints", "v2_object_checkpoints_written")


def _run_config(**kwargs):
    """A RunConfig as a script makes one: tf.estimator's (TensorFlow >= 2.16: tpushim's)."""
    if OWN:
        from tpushim._estimator_api._config import RunConfig

        return RunConfig(**kwargs)
    import tensorflow as tf

    return tf.estimator.RunConfig(**kwargs)


@pytest.mark.slow
def test_several_replicas_as_stock_2_15(tmp_path):
    """``MirroredStrategy`` over 2 and 4 devices in ``train_distribute`` / ``eval_distribute``
    (and its v1 class, and in ``train_distribute`` alone; and a one-worker
    ``MultiWorkerMirroredStrategy`` over 2 devices, a machine's 2 GPUs, either API's class), with
    model_to_estimator's v1
    spelling: loss, metrics, weights and predictions stock 2.15's within 1e-5 (on 2.15: stock
    itself, through tpushim's patch with no TPU). The v2 spelling's object checkpoints fail on
    stock at ``train()`` after writing its first checkpoint; tpushim's estimator API refuses
    them at conversion, with nothing written."""
    patch = "import tpushim; tpushim.patch()"
    got = api215.run("replicas", tmp_path, patch=patch, env={"TF_USE_LEGACY_KERAS": ""})
    want = dict(REPLICAS)
    if OWN:
        assert [got.pop(key) for key in V2_KEYS] == ["ValueError", []]
        for key in V2_KEYS:
            want.pop(key)
        # Stock's v2 run called the input_fn (its train()) before failing; refused, none is made.
        assert want["input_contexts"][-1] == [1, 0, 2]
        want["input_contexts"] = want["input_contexts"][:-1]
    assert set(got) == set(want), sorted(got)
    assert api215.close(got, want, rel=1e-5), json.dumps(got)
    assert _largest_difference(got, want) < 1e-5, _largest_difference(got, want)
    # What the proof rests on: the replicas change the numbers (each its own batch).
    for replicas in ("mirrored2", "mirrored4", "multi_worker2", "v1_multi_worker2"):
        assert not api215.close(want[replicas]["weights"], want["plain"]["weights"], rel=1e-3)


GLOBAL_BATCH = """import tpushim; tpushim.patch()
from tpushim._estimator_api import _estimator as _control
_call_input_fn = _control.Estimator._call_input_fn
def _as_global(self, input_fn, mode, input_context=None):  # the batch split over the replicas
    dataset = _call_input_fn(self, input_fn, mode, input_context)
    if input_context is None:
        return dataset
    batch = {"train": 8, "eval": 32}[mode]
    return dataset.unbatch().batch(batch // input_context.num_replicas_in_sync)
_control.Estimator._call_input_fn = _as_global
"""


@pytest.mark.slow
@pytest.mark.skipif(not OWN, reason="on TensorFlow <= 2.15 the estimator is stock's own")
def test_the_batch_taken_as_global_is_not_stock(tmp_path):
    """Negative control: the same run with the input_fn's batch split over the 2 replicas (a
    global batch, as a TPU takes it) instead of each replica's own is far from stock's."""
    got = api215.run(
        "replicas",
        tmp_path,
        patch=GLOBAL_BATCH,
        env={"TF_USE_LEGACY_KERAS": "", "REPLICAS_ONLY": "2"},
    )
    assert set(got) == {"mirrored2"}
    assert not api215.close(got["mirrored2"], REPLICAS["mirrored2"], rel=1e-5)
    assert _largest_difference(got["mirrored2"]["weights"], REPLICAS["mirrored2"]["weights"]) > 1e-2


@pytest.mark.parametrize("engine", ["tpuestimator", "strategy"] if not OWN else ["strategy"])
@pytest.mark.parametrize("key", ["train_distribute", "eval_distribute"])
def test_cpu_mode_refuses_several_replicas_naming_why(tmp_path, engine, key):
    """cpu mode runs a TPU's path, where the input_fn's batch is the global one: for a strategy
    of several replicas (each its own batch on stock) it cannot give stock's numbers, so it
    refuses at conversion, on every engine, saying why and what to do; nothing is written.
    (Before: the TPUEstimator path ignored the strategy with a warning, the strategy engine
    silently, both training on the batch as global.)"""
    import tensorflow as tf
    import tfcases

    from tpushim import ConversionError

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    config = _run_config(**{key: strategy})
    with pytest.raises(ConversionError) as raised:
        tfcases.convert(
            tmp_path / "model",
            spelling="v1",
            patch={"mode": "cpu", "engine": engine, "quiet": True},
            config=config,
        )
    text = str(raised.value)
    assert f"RunConfig({key}=MirroredStrategy) over 2 replicas" in text, text
    assert "mode 'cpu' runs a TPU's path" in text and "global batch (2 x its batch)" in text
    assert "mode 'auto' trains as stock" in text
    assert not (tmp_path / "model").exists()


@pytest.mark.skipif(not OWN, reason="on TensorFlow <= 2.15 stock's own model_to_estimator runs")
def test_object_checkpoints_over_several_replicas_are_refused_with_the_fix(tmp_path):
    """The v2 spelling's object-based checkpoints over several replicas (stock 2.15 fails at
    train(): its Saver is built inside each replica): refused at conversion, naming
    checkpoint_format='saver' and the v1 spelling; nothing written."""
    import tensorflow as tf
    import tfcases

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.raises(ValueError) as raised:
        tfcases.convert(tmp_path / "model", patch={}, config=_run_config(train_distribute=strategy))
    text = str(raised.value)
    assert "RunConfig(train_distribute=MirroredStrategy) of 2 replicas" in text, text
    assert "checkpoint_format='saver'" in text
    assert "tf.compat.v1.keras.estimator.model_to_estimator" in text
    assert not (tmp_path / "model").exists()
