"""Layers that read the training mode on the strategy engine as in stock's estimator graph
(tests/reference/training_arg_tf215.json, recorded by tests/training_arg.py): no ``training``
given to the model (a ``Lambda(lambda x, training=None: ...)`` or a custom layer's call gets
None) and ``K.learning_phase()`` True in training, False in evaluation and prediction, in each
replica. Weights, evaluate's results and predictions within 1e-5 of stock 2.15's. Before, the
engine called the model with training=True/False: the Lambda branching on ``training`` and the
layer reading ``K.learning_phase()`` trained and predicted other numbers (weights up to 0.92
off)."""

import pytest
import training_arg

import tpushim

pytestmark = pytest.mark.slow


def test_layers_read_the_training_mode_as_stock_2_15(tmp_path):
    with tpushim.patched(mode="cpu", engine="strategy", quiet=True):
        got = training_arg.run(str(tmp_path))
    assert training_arg.differences(got) == {}
