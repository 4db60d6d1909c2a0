"""Every legacy input_fn style on the strategy engine (tpushim/_strategy/input.py), unchanged, on 8
replicas: train, evaluate and predict equal the stock estimator's within 1e-5 -- (features,
labels) constants, one-shot and initializable iterators, ``slice_input_producer`` +
``train.batch``, ``shuffle_batch``, ``string_input_producer`` over CSV files,
``numpy_input_fn`` and ``pandas_input_fn`` (a label Series; shuffled and not); the Dataset-backed
ones also on a pod of 2 emulated hosts; and tensors a pod's hosts cannot run refused before
anything is written. Everything runs in one subprocess (tests/strategy_input_proof.py: 8
logical devices).

On every TensorFlow: on 2.12-2.15 against the stock estimator run beside it, on >= 2.16 (with
tpushim's own numpy_input_fn / pandas_input_fn) against stock TensorFlow 2.15's numbers,
tests/reference/strategy_inputs_tf215.json."""

import json
import os

import procs
import pytest
import tensorflow as tf

from tpushim import _padding
from tpushim._errors import ConversionError
from tpushim._strategy import input as _strategy_input

TOLERANCE = 1e-5
STYLES = (
    "tensors",
    "one_shot",
    "initializable",
    "queue",
    "shuffle_batch",
    "string_input",
    "numpy",
    "numpy_shuffled",
    "pandas",
    "pandas_shuffled",
)
POD_STYLES = ("one_shot", "numpy", "numpy_shuffled", "pandas")


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return procs.proof(os.path.join(here, "strategy_input_proof.py"), root)


def _assert_stocks(got, style):
    assert "error" not in got, got
    assert got["names_equal"] and got["metric_keys_equal"], got  # stock's names and keys
    assert got["rows"] == (20 if style == "tensors" else 45), got  # every example predicted once
    assert got["weights"] < TOLERANCE, got  # every weight and optimizer slot
    assert got["metrics"] < TOLERANCE, got
    assert got["predictions"] < TOLERANCE, got


@pytest.mark.slow
def test_stock_is_stock_tensorflow_215(proof):
    assert proof["replicas"] == 8
    if proof["stock_from"] == "live":
        assert proof["tensorflow"].split(".")[:2] <= ["2", "15"]
    else:
        with open(proof["stock_from"], encoding="utf-8") as f:
            assert json.load(f)["tensorflow"].startswith("2.15.")


@pytest.mark.slow
@pytest.mark.parametrize("style", STYLES)
def test_every_input_style_trains_evaluates_and_predicts_as_stock(proof, style):
    _assert_stocks(proof[style], style)


@pytest.mark.slow
@pytest.mark.parametrize("style", POD_STYLES)
def test_dataset_backed_styles_on_a_pod_of_two_hosts(proof, style):
    """Iterator tensors and numpy_input_fn / pandas_input_fn rows, traced back to a Dataset,
    built by each of 2 hosts: pooled, each step's global batch is stock's."""
    _assert_stocks(proof["pods"][style], style)


@pytest.mark.slow
@pytest.mark.parametrize(
    "style,names", [("queue", "queue-based input"), ("tensors", "tensors computed in")]
)
def test_tensors_on_a_pod_refused_before_anything_is_written(proof, style, names):
    got = proof["pod_refusals"][style]
    assert got["error"] is not None and got["error"].startswith("ConversionError"), got
    assert names in got["error"] and "Return a tf.data.Dataset instead" in got["error"]
    assert not got["written"]  # no model.ckpt-0, no events: model_dir as it was


class _Config:
    tf_random_seed = None
    session_config = None


def test_queue_input_on_a_pod_names_the_style_and_the_dataset_to_return():
    def input_fn():
        x, y = tf.compat.v1.train.slice_input_producer([tf.zeros([8, 2]), tf.zeros([8, 1])])
        return tf.compat.v1.train.batch([x, y], 4)

    with pytest.raises(ConversionError) as raised:
        _strategy_input.HostInput(input_fn, "train", _Config(), None, ((0, 1), (2, 3)), "auto")
    message = str(raised.value)
    assert "'input_fn' returns queue-based input" in message
    assert "tf.data.TextLineDataset(files)" in message
    assert "from_tensor_slices(arrays).batch(B) for slice_input_producer" in message


@pytest.mark.parametrize("frame", [False, True])
def test_numpy_and_pandas_input_on_a_pod_every_row_once(frame):
    """numpy_input_fn / pandas_input_fn on 2 hosts (4 replicas): each host's copy carries the
    arrays (tpushim feeds them by placeholder, tpushim._arrays), and pooled the hosts feed
    every row once, in stock's order (on TensorFlow >= 2.16 tpushim's own input_fns, traced back
    to a Dataset as stock's are)."""
    import numpy as np
    import pandas as pd
    import tfcases

    x = np.arange(20, dtype=np.float32)
    if frame:
        data = pd.DataFrame({"x": x}, index=np.arange(100, 120))
        input_fn = tfcases.ESTIMATOR.inputs.pandas_input_fn(
            data, pd.Series(x, index=data.index), batch_size=4, num_epochs=1, shuffle=False
        )
    else:
        input_fn = tfcases.ESTIMATOR.inputs.numpy_input_fn(
            {"x": x}, x, batch_size=4, num_epochs=1, shuffle=False
        )
    pod = _strategy_input.HostInput(input_fn, "eval", _Config(), None, ((0, 1), (2, 3)), "auto")
    assert pod.path.name == "exact"
    per_host = [list(pod(tf.distribute.InputContext(2, h, 4))) for h in range(2)]
    fed = []
    for step in range(5):  # replica r of each step: host r // 2's piece r % 2
        for r in range(4):
            features, labels = per_host[r // 2][2 * step + r % 2]
            fed += features[_padding.FEATURES_KEY]["x"].numpy().tolist()
            assert labels.numpy().tolist() == features[_padding.FEATURES_KEY]["x"].numpy().tolist()
    assert fed == x.tolist()
