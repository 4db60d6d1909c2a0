"""Layers that read the training mode on the JAX engine as in stock's estimator graph
(tests/reference/training_arg_tf215.json, recorded by tests/training_arg.py): stock calls its
clone of the model with no ``training`` (a ``Lambda(lambda x, training=None: ...)`` or a custom
layer's call gets None) and ``K.learning_phase()`` True in training, False in evaluation and
prediction. Weights, evaluate's results and predictions within 1e-5 of stock 2.15's. Before,
the engine called the model with training=True/False: the Lambda branching on ``training`` and
the layer reading ``K.learning_phase()`` (0 in a traced function) trained and predicted other
numbers (weights up to 0.92 off)."""

import pytest
from jax_scripts import eight_devices, scripts_started  # noqa: F401 (scripts_started: the scripts' run, in the background)

pytestmark = pytest.mark.jax

jax = eight_devices()

import training_arg


def test_layers_read_the_training_mode_as_stock_2_15(tmp_path):
    import tpushim

    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    with tpushim.patched(mode="cpu", engine="jax", quiet=True):
        got = training_arg.run(str(tmp_path))
    assert training_arg.differences(got) == {}
