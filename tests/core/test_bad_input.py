"""Every bad input, in one table: a clear error that names what was wrong and how to fix it,
raised before anything is patched or written."""

import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

import tpushim
from tpushim import _patch, _versions

keras_lib = tpuestimator_import("tensorflow_estimator.python.estimator", "keras_lib")
ORIGINAL = keras_lib.model_to_estimator
#: TensorFlow >= 2.16 has no stock estimator: there the conversions that fail as stock's fail on
#: tpushim's own estimator (mode auto), with stock's errors; mode cpu is the strategy engine there.
STOCKS = {"mode": "auto"} if _versions.uses_own_estimator() else {"mode": "cpu"}
TPU = pytest.mark.tpuestimator


def _train(model_dir, input_fn):
    est = tfcases.convert(model_dir, patch={"mode": "cpu"})
    est.train(input_fn, steps=1)


def _env(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    tpushim.patch()


# name: (action, error type, what was wrong, how to fix it) -- both must be in the message.
# (TensorFlow 2.16, which warns rather than raises, is tests/unit/test_versions.py's.)
CASES = {
    "uncompiled model": (
        lambda d, mp: tfcases.convert(d, tfcases.uncompiled, patch=STOCKS),
        ValueError,
        "has not been compiled yet",
        "Please compile the model with `model.compile()`",
    ),
    "subclassed model, object checkpoints": (
        lambda d, mp: tfcases.convert(d, tfcases.subclassed, patch=STOCKS),
        ValueError,
        "Object-based checkpoints are currently not supported with subclassed models",
        "Pass checkpoint_format='saver'",
    ),
    "neither model nor path": (
        lambda d, mp: tfcases.convert(d, patch=STOCKS, keras_model=None),
        ValueError,
        "Either `keras_model` or `keras_model_path`",
        "needs to be provided",
    ),
    "unaggregatable optimizer": (
        lambda d, mp: tfcases.convert(
            d, tfcases.sequential(optimizer=tfcases.HandRolledSGD(name="h")), patch={"mode": "cpu"}
        ),
        tpushim.ConversionError,
        "optimizer HandRolledSGD has no tf.keras.optimizers.legacy equivalent",
        "Compile with a built-in Keras optimizer",
    ),
    "metric without config": (
        lambda d, mp: tfcases.convert(
            d, tfcases.sequential(metrics=[tfcases.NoConfigMetric(0.5)]), patch={"mode": "cpu"}
        ),
        tpushim.ConversionError,
        "cannot rebuild metric 'above'",
        "Implement get_config() on it",
    ),
    "TPUSHIM_MODE garbage": (
        lambda d, mp: _env(mp, "TPUSHIM_MODE", "turbo"),
        tpushim.ConfigurationError,
        "TPUSHIM_MODE='turbo' is not a valid tpushim mode",
        "choose one of auto, cpu, tpu, off",
    ),
    "TPUSHIM_BATCH_SIZE garbage": (
        lambda d, mp: _env(mp, "TPUSHIM_BATCH_SIZE", "lots"),
        tpushim.ConfigurationError,
        "TPUSHIM_BATCH_SIZE='lots' is not a positive integer",
        "set it to e.g. 128, or unset it",
    ),
    "TPUSHIM_ITERATIONS_PER_LOOP garbage": (
        lambda d, mp: _env(mp, "TPUSHIM_ITERATIONS_PER_LOOP", "0"),
        tpushim.ConfigurationError,
        "TPUSHIM_ITERATIONS_PER_LOOP must be a positive integer",
        "(e.g. 128); got 0",
    ),
    "TPUSHIM_TPU garbage": (
        lambda d, mp: _env(mp, "TPUSHIM_TPU", "https://tpu"),
        tpushim.ConfigurationError,
        "TPUSHIM_TPU='https://tpu'",
        "must start with grpc:// (e.g. grpc://10.0.0.2:8470); or give a TPU name or 'local'",
    ),
    "input_fn returns None": (
        lambda d, mp: _train(d, lambda: None),
        tpushim.ConversionError,
        "input_fn '<lambda>' returned None",
        "Return a tf.data.Dataset instead",
    ),
    "input_fn returns an object": (
        lambda d, mp: _train(d, object),
        tpushim.ConversionError,
        "returned <object object",
        "it must return a tf.data.Dataset of (features, labels)",
    ),
    "input_fn finite, fewer rows than TPUSHIM_BATCH_SIZE": (
        lambda d, mp: (
            _env(mp, "TPUSHIM_BATCH_SIZE", "100"),
            _train(d, tfcases.dataset_input_fn(*tfcases.data(n=64), batch=8)),
        ),
        tpushim.ConversionError,
        "the training input holds 64 examples (stock trains them in 8 steps of 8), fewer than "
        "the global batch size 100 tpushim was given",
        "Set the batch size to at most 64 (tpushim.patch(batch_size=...) or TPUSHIM_BATCH_SIZE)",
    ),
    "mode tpu without a TPU": (
        lambda d, mp: tfcases.convert(d, patch={"mode": "tpu"}),
        tpushim.NoTPUError,
        "needs a TPU, and none is configured",
        "Name one with tpushim.patch(tpu=...) or TPUSHIM_TPU",
    ),
}
#: The cases of the TPU path (its refusals, cpu mode's input adaptation): TensorFlow <= 2.15 only.
TPU_CASES = {
    "unaggregatable optimizer",
    "metric without config",
    "input_fn returns None",
    "input_fn returns an object",
    "input_fn finite, fewer rows than TPUSHIM_BATCH_SIZE",
}


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=TPU) if c in TPU_CASES else c for c in sorted(CASES)]
)
def test_bad_input(case, tmp_path, monkeypatch):
    action, error, wrong, fix = CASES[case]
    model_dir = tmp_path / "model_dir"
    with pytest.raises(error) as info:
        action(model_dir, monkeypatch)
    assert wrong in str(info.value)
    assert fix in str(info.value)
    # nothing half-done: no checkpoint written, and the patch is either fully on or not at all
    assert tf.train.latest_checkpoint(str(model_dir)) is None
    assert not (model_dir / "keras").exists() or case.startswith("input_fn")
    if isinstance(info.value, tpushim.ConfigurationError):
        assert not tpushim.is_patched()
        if _versions.uses_own_estimator():  # tpushim's tf.estimator names were not installed
            assert not hasattr(tf, "estimator")
        else:
            assert keras_lib.model_to_estimator is ORIGINAL


@TPU
def test_public_names_bound_before_patching_still_convert(tmp_path):
    from tensorflow.keras.estimator import model_to_estimator  # bound before patch()

    tpushim.patch(mode="cpu")
    est = model_to_estimator(keras_model=tfcases.sequential(), model_dir=str(tmp_path))
    assert isinstance(est, tf.compat.v1.estimator.tpu.TPUEstimator)
    assert _patch.is_ours(keras_lib.model_to_estimator)


@TPU
def test_a_batch_size_the_finite_input_fills_trains(tmp_path, monkeypatch):
    """The boundary of the refusal above: 64 examples fill one global batch of 64."""
    monkeypatch.setenv("TPUSHIM_BATCH_SIZE", "64")
    est = tfcases.convert(tmp_path, patch={"mode": "cpu"})
    est.train(tfcases.dataset_input_fn(*tfcases.data(n=64), batch=8))
    assert est.latest_checkpoint().endswith("model.ckpt-1")
