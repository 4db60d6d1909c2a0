"""RunConfig's ``train_distribute`` / ``eval_distribute`` and ``TF_CONFIG`` as legacy scripts set
them, on every path: what stock 2.15 trains, tpushim trains with stock's numbers; what no path
can honour is refused before anything is written, naming TF_CONFIG and what to do.

The scenario (tests/api215.py ``distribute``: a strategy of one replica, a cluster of one
"chief" as a job launcher sets it, train_and_evaluate as that chief, and the clusters stock's
RunConfig refuses) was recorded on stock 2.15 (tests/reference/tf215_api.json); here it runs on
TensorFlow 2.12-2.15 on both engines in cpu mode, and on >= 2.16 on tpushim's estimator API and
the strategy engine. Clusters of more than one task on >= 2.16: tests/estimator_api/test_tf216_api.py.
"""

import json
import os

import api215
import procs
import pytest

from tpushim import _versions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(ROOT, "tests", "reference", "tf215_api.json"), encoding="utf-8") as _f:
    RECORDED = json.load(_f)["results"]["distribute"]
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
