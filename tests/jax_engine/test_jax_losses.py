"""Every loss kind on the JAX engine's step against stock TensorFlow 2.15's estimator
(tests/reference/jax_losses_tf215.json, recorded by tests/jax_engine/jax_losses.py): one small
model per kind (a mean, a SUM reduction, one-number custom losses, activity regularizers, a
layer's add_loss, Masking's and Embedding(mask_zero=True)'s masks), trained on 8 XLA CPU devices
and on 1 with a short last batch padded to the global batch, every weight within 1e-5 of stock's;
negative controls (padding rows counted, the devices' gradients combined the wrong way) that
must differ; a reduction NONE refused with stock's reason, what the step still refuses by name.

Needs jax and tf2jax (the ``jax`` extra); 8 devices come from
``XLA_FLAGS=--xla_force_host_platform_device_count=8``, set here before jax is first imported.
"""

import json

import numpy as np
import pytest
from jax_scripts import eight_devices, scripts_started  # noqa: F401 (scripts_started: the scripts' run, in the background)

pytestmark = pytest.mark.jax

jax = eight_devices()

import jax_losses as kinds
import tensorflow as tf

from tpushim import ConversionError
from tpushim._jax import _step

TOL = 1e-5
with open(kinds.RECORD, encoding="utf-8") as _f:
    STOCK = json.load(_f)

#: The devices' combination that is wrong for each kind: summing the devices' own losses'
#: gradients is right for a sum over the rows (each device's sum adds up to the batch's), so a
#: sum's control averages them instead.
WRONG_COMBINATION = {"sum": "mean_device_losses", "custom_sum": "mean_device_losses"}


def eight_devices():
    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    return jax.local_devices()[:8]


def trained(kind, devices, control=None):
    trainer = _step.Trainer(
        kinds.model(kind),
        kinds.BATCH,
        devices=devices,
        custom_objects=kinds.CUSTOM_OBJECTS,
        control=control,
    )
    trainer.train(kinds.batches(kind))  # 3 full batches and the short one, in one call
    return trainer


def from_stock(kind, weights, which="final"):
    """The largest difference of any weight to stock's, relative to its scale (at least 1)."""
    stock = {k: np.asarray(v) for k, v in STOCK[kind][which].items()}
    assert set(weights) == set(stock), (sorted(weights), sorted(stock))
    return max(
        float(np.max(np.abs(weights[k] - v)) / max(1.0, float(np.max(np.abs(v)))))
        for k, v in stock.items()
    )


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_eight_devices_equal_one_equal_stock_2_15(kind):
    devices = eight_devices()
    start = {v.name.split(":")[0]: v.numpy() for v in kinds.model(kind).weights}
    assert from_stock(kind, start, "start") < 1e-7  # stock's starting point
    eight, one = trained(kind, devices), trained(kind, devices[:1])
    assert eight.slots()["iterations"] == STOCK[kind]["global_step"] == 4
    assert from_stock(kind, eight.weights()) < TOL
    assert from_stock(kind, one.weights()) < TOL
    assert from_stock(kind, start) > 1e-2  # the weights did move


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_negative_controls_differ(kind):
    """Padding rows (copies of a real row) counted as real rows, or the devices' own losses'
    gradients combined the wrong way for the kind: not stock's numbers (a NaN differs too: a
    device holding padding only divides by no rows)."""
    for control in ("count_padding", WRONG_COMBINATION.get(kind, "sum_device_means")):
        got = from_stock(kind, trained(kind, eight_devices(), control).weights())
        assert not got < 1e-3, (control, got)


def _dense(loss=None, layer=None):
    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(5, name="hidden")(x)
    if layer is not None:
        h = layer(h)
    model = tf.keras.Model(x, tf.keras.layers.Dense(1, name="out")(h))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), loss or "mse")
    return model


def test_reduction_none_is_refused_with_stocks_reason():
    # Stock hands its estimator the unreduced loss and fails at its first step.
    model = _dense(tf.keras.losses.MeanSquaredError(reduction="none"))
    with pytest.raises(ValueError, match=r"Loss must be scalar.*reduction NONE"):
        _step.Trainer(model, kinds.BATCH, devices=jax.local_devices()[:1])


def test_refuses_an_added_loss_beside_batchnormalization_naming_both():
    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input((4,), name="x")
    h = kinds.Penalty(0.1, name="penalty")(tf.keras.layers.Dense(5, name="hidden")(x))
    h = tf.keras.layers.BatchNormalization(name="bn")(h)
    model = tf.keras.Model(x, tf.keras.layers.Dense(1, name="out")(h))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    with pytest.raises(ConversionError, match=r"add_loss: penalty.*BatchNormalization \(bn\)"):
        _step.Trainer(
            model, kinds.BATCH, jax.local_devices()[:1], custom_objects=kinds.CUSTOM_OBJECTS
        )


def test_row_labels_of_a_sum_are_refused_naming_the_fix():
    # [batch] labels of a [batch, 1] output: stock squeezes the output, so a SUM is the rows' mean
    model = _dense(tf.keras.losses.MeanSquaredError(reduction="sum"))
    trainer = _step.Trainer(model, kinds.BATCH, devices=jax.local_devices()[:1])
    batch = ([kinds.X[:8]], [kinds.Y[:8, 0]], None)
    with pytest.raises(ConversionError, match=r"\[batch\] labels.*labels\[:, None\]"):
        trainer.check(batch)


@pytest.mark.parametrize("kind", ["activity", "masking"])
def test_the_estimator_trains_and_evaluates_as_stock_2_15(kind, tmp_path):
    # model_to_estimator on the engine (8 devices), train and evaluate with the short batch
    # padded: the loss's added terms and masks over the real rows in evaluate() too.
    import tpushim

    eight_devices()
    with (
        tpushim.patched(mode="cpu", engine="jax", quiet=True),
        tf.keras.utils.custom_object_scope(kinds.CUSTOM_OBJECTS),
    ):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=kinds.model(kind),
            model_dir=str(tmp_path),
            checkpoint_format="saver",
            custom_objects=kinds.CUSTOM_OBJECTS,
        )
    estimator.train(lambda: kinds.input_fn(kind))
    loss = float(estimator.evaluate(lambda: kinds.input_fn(kind))["loss"])
    assert (
        from_stock(kind, {n: estimator.get_variable_value(n) for n in STOCK[kind]["final"]}) < TOL
    )
    assert abs(loss - STOCK[kind]["loss"]) < TOL * max(1.0, abs(STOCK[kind]["loss"]))
