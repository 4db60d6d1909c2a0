"""A ``tf.compat.v1.train`` optimizer whose learning rate is a callable making a variable
(``lambda: tf.compat.v1.get_variable("rate", initializer=...)``): the graph makes it outside the
model's object graph, so Keras's object-based first checkpoint lacks it and stock 2.15's warm
start fails ("did not contain values for all variables ... {'rate'}"), as does a later
``train()`` restoring a checkpoint without it. tpushim's object-based checkpoints hold every
variable of the graph: the model trains as the same optimizer with the rate as a number does on
stock (live on TF 2.15, its recorded numbers on >= 2.16), on tpushim's estimator API (TF >= 2.16)
and the TPUEstimator path in cpu mode (2.15). A rate made eagerly (a ``tf.Variable``, a v1 decay
called at the top level) cannot be read in the estimator's graphs: stock fails at its first
checkpoint, after making ``model_dir/keras``; tpushim refuses before anything is written.

Record stock's numbers with a TensorFlow 2.15 environment:
``PYTHONPATH=tests python tests/estimator_api/test_variable_rates.py``.
"""

import json
import os

import numpy as np
import pytest
import tfcases

import tpushim
from tpushim import _versions

RECORD = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "reference",
    "api_variable_rates_tf215.json",
)
RATE = 0.01


def _shim_patch():
    # On 2.15 an unpatched run without a TPU is stock's estimator: its TPU path in cpu mode.
    return {} if _versions.uses_own_estimator() else {"mode": "cpu", "quiet": True}


def _run(patch, model_dir, rate):
    """(evaluate()'s metrics, checkpoint values) of an Adam model after two train() calls (the
    second restores the first's checkpoint)."""
    import tensorflow as tf

    x, y = tfcases.data(n=40)
    estimator = tfcases.convert(
        model_dir,
        lambda: tfcases.sequential(optimizer=tf.compat.v1.train.AdamOptimizer(rate)),
        patch=patch,
    )
    estimator.train(tfcases.dataset_input_fn(x, y, repeat=True), steps=3)
    estimator.train(tfcases.dataset_input_fn(x, y, repeat=True), steps=2)
    metrics = estimator.evaluate(tfcases.dataset_input_fn(x, y))
    values = tfcases.checkpoint_values(model_dir)
    return (
        {k: float(v) for k, v in metrics.items()},
        {k: np.asarray(v, np.float64).tolist() for k, v in values.items()},
    )


def _variable_rate():
    import tensorflow as tf

    return lambda: tf.compat.v1.get_variable("rate", initializer=RATE)


def record(root):  # run on TensorFlow 2.15: stock's numbers (the rate as a number)
    import tensorflow as tf

    metrics, values = _run({"mode": "off"}, os.path.join(root, "stock"), RATE)
    with open(RECORD, "w") as f:
        json.dump({"tensorflow": tf.__version__, "metrics": metrics, "values": values}, f, indent=1)
        f.write("\n")


@pytest.mark.slow
def test_a_v1_rate_making_a_variable_trains_as_the_rate_as_a_number_on_stock(tmp_path):
    with open(RECORD) as f:
        recorded = json.load(f)
    stock_metrics, stock_values = recorded["metrics"], recorded["values"]
    if not _versions.uses_own_estimator():  # stock, live here: its warm start fails on it
        with pytest.raises(ValueError, match="did not contain values for all variables"):
            _run({"mode": "off"}, tmp_path / "stock-variable", _variable_rate())
        live = _run({"mode": "off"}, tmp_path / "stock", RATE)
        assert live[0] == pytest.approx(stock_metrics, abs=1e-6)
        assert sorted(live[1]) == sorted(stock_values)
    metrics, values = _run(_shim_patch(), tmp_path / "shim", _variable_rate())
    extra = sorted(set(values) - set(stock_values))
    assert len(extra) == 1 and extra[0].startswith("graph_variable:rate"), extra
    assert values.pop(extra[0]) == pytest.approx(RATE)  # saved, so a later train() restores it
    assert sorted(values) == sorted(stock_values)
    for name, value in values.items():
        np.testing.assert_allclose(value, stock_values[name], atol=1e-5, rtol=0, err_msg=name)
    assert sorted(metrics) == sorted(stock_metrics)
    for key, value in metrics.items():
        assert value == pytest.approx(stock_metrics[key], abs=1e-5), key


@pytest.mark.parametrize("made", ["variable", "decay"])
def test_a_rate_made_eagerly_is_refused_before_anything_is_written(tmp_path, made):
    import tensorflow as tf

    def rate():
        if made == "variable":
            return tf.Variable(RATE)
        step = tf.Variable(0, dtype=tf.int64, trainable=False)  # an eager global step
        return tf.compat.v1.train.exponential_decay(RATE, step, 10, 0.5)

    model_dir = tmp_path / "model"
    with pytest.raises(tpushim.ConversionError, match="made eagerly") as raised:
        tfcases.convert(
            model_dir,
            lambda: tfcases.sequential(optimizer=tf.compat.v1.train.AdamOptimizer(rate())),
            patch=_shim_patch(),
        )
    assert "get_global_step()" in str(raised.value)  # what to do
    assert not model_dir.exists()


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        record(root)
