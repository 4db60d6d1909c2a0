"""Layer families legacy scripts use, each in a small model, their training step converted as
the JAX engine converts it: the loss and ``jax.grad`` of it against TensorFlow's loss and
``GradientTape``'s gradients within 1e-6 (benchmarks/jax_layers.py's models and table). Here the
families whose ops tpushim/_jax/_ops.py writes (3D convolutions and pooling, Bucketize); recurrent
layers' loops in test_jax_recurrent.py."""

import os
import sys

import pytest
from jax_scripts import ROOT, eight_devices, scripts_started  # noqa: F401 (scripts_started: the scripts' run, in the background)

pytestmark = pytest.mark.jax

jax = eight_devices()

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import jax_layers


@pytest.mark.parametrize(
    "family",
    [
        "Conv3D",
        "Conv3DTranspose",
        "MaxPooling3D",
        "AveragePooling3D",
        "Discretization",
    ],
)
def test_layer_family_loss_and_gradients_equal_tensorflows(family):
    row = jax_layers.measure(family)
    assert row["step"] == "converts", row
    assert row["loss_diff"] < 1e-6 and row["grad_diff"] < 1e-6, row
