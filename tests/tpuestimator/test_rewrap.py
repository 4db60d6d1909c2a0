"""An estimator rebuilt around a converted one's model_fn (issue 34, item 2), as trainers do to
add metrics or change the model_dir: ``tf.estimator.Estimator(model_fn=converted.model_fn,
model_dir=..., config=...)``. Every spelling (v2 and tf.compat.v1 Estimator, TPUEstimator, a
name bound before ``patch()``, ``converted._model_fn``, ``functools.partial``) returns tpushim's
estimator with the call's model_dir and config, which trains in cpu mode as stock's rebuilt
Estimator trains and builds the TPU computation on a faked TPU system; where tpushim cannot keep
the TPU path, stock's estimator is built and tpushim says so."""

import functools
import inspect
import logging

import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

bound_before_patch = tpuestimator_import("tensorflow.estimator", "Estimator")

estimator_lib = tpuestimator_import("tensorflow_estimator.python.estimator", "estimator")

import tpushim
from tpushim import _observe, _patch

TPUShimEstimator = tpuestimator_import("tpushim._estimator", "TPUShimEstimator")
faketpu = tpuestimator_import("tpushim._preflight.faketpu")

# Rebuilding converts to tpushim's TPUEstimator: the TPU path throughout.
pytestmark = [pytest.mark.slow, pytest.mark.tpuestimator]

SEED = 7


def _tpu_estimator(model_fn, model_dir, config):
    """TPUEstimator as a script written for a TPU builds it (stock refuses a model_fn without
    ``params`` here: model_to_estimator's)."""
    return tf.compat.v1.estimator.tpu.TPUEstimator(
        model_fn=model_fn,
        model_dir=model_dir,
        config=tf.compat.v1.estimator.tpu.RunConfig(tf_random_seed=config.tf_random_seed),
        use_tpu=False,
        train_batch_size=8,
        eval_batch_size=8,
        predict_batch_size=8,
    )


#: tf.estimator.Estimator (EstimatorV2); on TensorFlow >= 2.16, where this module's tests are
#: skipped, the name tpushim installs while patched.
EstimatorV2 = tf.estimator.Estimator if hasattr(tf, "estimator") else tfcases.ESTIMATOR.Estimator

SPELLINGS = {  # name -> (converted -> the model_fn passed, the constructor)
    "tf.estimator.Estimator": (lambda c: c.model_fn, EstimatorV2),
    "tf.compat.v1.estimator.Estimator": (lambda c: c.model_fn, tfcases.ESTIMATOR.Estimator),
    "bound before patch()": (lambda c: c.model_fn, bound_before_patch),
    "converted._model_fn": (lambda c: c._model_fn, EstimatorV2),
    "functools.partial": (lambda c: functools.partial(c.model_fn), EstimatorV2),
    "TPUEstimator": (lambda c: c.model_fn, _tpu_estimator),
}


def _rebuilt(spelling, model_dir, **patch):
    """(the converted estimator, the one rebuilt around its model_fn) under ``patch``."""
    tpushim.patch(**patch)
    try:
        converted = tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(),
            model_dir=str(model_dir / "converted"),
            config=tf.estimator.RunConfig(tf_random_seed=SEED),
        )
        model_fn, construct = SPELLINGS[spelling]
        rebuilt = construct(
            model_fn=model_fn(converted),
            model_dir=str(model_dir / "rebuilt"),
            config=tf.estimator.RunConfig(tf_random_seed=SEED),
        )
        return converted, rebuilt
    finally:
        tpushim.unpatch()


def _with_params(input_fn):
    return lambda params: input_fn()  # TPUEstimator's input_fns take params


def _trained(estimator):
    x, y = tfcases.data()
    estimator.train(_with_params(tfcases.dataset_input_fn(x, y, repeat=True)), steps=6)
    return (
        estimator,
        estimator.evaluate(_with_params(tfcases.dataset_input_fn(x, y))),
        list(estimator.predict(_with_params(tfcases.dataset_input_fn(x)))),
        tfcases.checkpoint_values(estimator.model_dir),
    )


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    """Stock's Estimator rebuilt around stock's converted model_fn (no warm start: it starts from
    the clone's seeded initialisation, not the Keras weights)."""
    _, rebuilt = _rebuilt("tf.estimator.Estimator", tmp_path_factory.mktemp("stock"), mode="off")
    assert type(rebuilt) is estimator_lib.EstimatorV2
    return _trained(rebuilt)


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_every_spelling_keeps_the_tpu_path_and_trains_as_stock(
    spelling, tmp_path, stock, tpushim_log
):
    _, rebuilt = _rebuilt(spelling, tmp_path, mode="cpu", iterations_per_loop=3)
    assert isinstance(rebuilt, TPUShimEstimator), type(rebuilt)
    assert rebuilt.model_dir == str(tmp_path / "rebuilt")  # the call's, not the converted one's
    assert rebuilt.config.tf_random_seed == SEED
    assert rebuilt.config.tpu_config.iterations_per_loop == 3  # the conversion's settings
    assert rebuilt._tpushim_use_tpu is False
    assert "-> TPUShimEstimator(use_tpu=False), the converted model" in tpushim_log.text
    tfcases.assert_same(stock, _trained(rebuilt))


def test_the_rebuilt_estimators_train_graph_is_the_tpu_computation(tmp_path):
    """On a faked 8-core TPU system: replicated, fed by infeed, gradients summed across cores."""
    x, y = tfcases.data(n=128)
    with faketpu.faked_tpu_system() as tpu:
        tpushim.patch(tpu=tpu.master, iterations_per_loop=2)
        try:
            converted = tf.keras.estimator.model_to_estimator(
                keras_model=tfcases.sequential(), model_dir=str(tmp_path / "converted")
            )
            rebuilt = tf.estimator.Estimator(
                model_fn=converted.model_fn, model_dir=str(tmp_path / "rebuilt")
            )
        finally:
            tpushim.unpatch()
        assert isinstance(rebuilt, TPUShimEstimator) and rebuilt._tpushim_use_tpu
        fn = tfcases.dataset_input_fn(x, y, batch=64, repeat=True)
        build = tpu.build(lambda: rebuilt.train(fn, steps=4))
    metadata = build.nodes("TPUReplicateMetadata")
    assert len(metadata) == 1 and metadata[0].attr["num_replicas"].i == 8
    assert len(build.nodes("InfeedEnqueueTuple")) == 8
    assert len(build.nodes("CrossReplicaSum")) >= 4  # one per trainable variable, and the loss


class _Recorder(_observe.Observer):
    """An observer, as the preflight's recorder and the run summary are."""

    def __init__(self):
        self.made, self.stock = [], []

    def derived(self, estimator, source, model_fn):
        self.made.append((estimator, source))

    def bypassed(self, source, why):
        self.stock.append((source, why))


def test_observers_hear_of_the_rebuilt_estimator(tmp_path):
    recorder = _Recorder()
    with _observe.observing(recorder):
        converted, rebuilt = _rebuilt("tf.estimator.Estimator", tmp_path, mode="cpu")
    assert recorder.made == [(rebuilt, converted)] and not recorder.stock


class TheirEstimator(EstimatorV2):
    """A script's own Estimator subclass: a converted estimator cannot be one."""


def test_where_the_tpu_path_cannot_be_kept_stock_is_built_and_said(tmp_path, caplog):
    recorder = _Recorder()
    caplog.set_level(logging.INFO, logger="tpushim")
    tpushim.patch(mode="cpu")
    try:
        converted = tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(), model_dir=str(tmp_path / "converted")
        )
        with _observe.observing(recorder):
            theirs = TheirEstimator(model_fn=converted.model_fn, model_dir=str(tmp_path / "a"))
            bound = tf.estimator.Estimator(
                model_fn=functools.partial(converted._model_fn, labels=None),
                model_dir=str(tmp_path / "b"),
            )
    finally:
        tpushim.unpatch()
    assert type(theirs) is TheirEstimator and type(bound) is estimator_lib.EstimatorV2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        w.startswith("TheirEstimator(model_fn=<converted estimator>.model_fn) -> stock ")
        and "subclass of EstimatorV2" in w
        for w in warnings
    ), warnings
    assert any("functools.partial around the model_fn binds its inputs" in w for w in warnings)
    assert [source for source, _ in recorder.stock] == [converted, converted]


def test_a_model_fn_of_the_scripts_own_calling_the_converted_one_is_said(tmp_path, caplog):
    """tpushim cannot see what a script's own model_fn does: when it names a converted estimator,
    stock's estimator is built and tpushim says what may happen."""
    recorder = _Recorder()
    tpushim.patch(mode="cpu")
    try:
        converted = tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(), model_dir=str(tmp_path / "converted")
        )

        def model_fn(features, labels, mode, config):
            return converted.model_fn(features, labels, mode, config)

        with _observe.observing(recorder):
            theirs = tf.estimator.Estimator(model_fn=model_fn, model_dir=str(tmp_path / "a"))
            plain = tf.estimator.Estimator(
                model_fn=lambda features, labels, mode: None, model_dir=str(tmp_path / "b")
            )
    finally:
        tpushim.unpatch()
    assert type(theirs) is type(plain) is estimator_lib.EstimatorV2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    said = [w for w in warnings if w.startswith("tf.estimator.Estimator(model_fn=model_fn) -> ")]
    assert len(said) == 1 and "names an estimator tpushim converted" in said[0], warnings
    assert [source for source, _ in recorder.stock] == [converted]


def test_other_estimators_and_unpatching_leave_the_classes_as_they_were(tmp_path):
    """Estimator.__new__ is wrapped from the first conversion on, while patched: a class
    TensorFlow's deprecation decorator makes before then (as it makes every estimator class it
    exports) keeps its own constructor, not tpushim's."""
    from tensorflow.python.util import deprecation

    key = "tensorflow_estimator.python.estimator.estimator.Estimator.__new__"
    signature = inspect.signature(tf.compat.v1.estimator.Estimator)
    _patch.reset()  # no conversion yet in this process, as far as patching knows
    tpushim.patch(mode="cpu")
    try:
        assert tpushim.status()["applied"][key] == "pending conversion"

        @deprecation.deprecated(None, "Use tf.keras instead.")
        class Exported(tf.estimator.Estimator):
            def __init__(self, model_fn):
                super().__init__(model_fn=model_fn, model_dir=str(tmp_path / "exported"))

        # tpushim's __new__ was not there for it to take
        assert not _patch.is_ours(estimator_lib.Estimator.__new__)
        tfcases.convert(tmp_path / "converted")
        assert tpushim.status()["applied"][key] is True
        assert inspect.signature(tf.compat.v1.estimator.Estimator) == signature
        plain = tf.estimator.Estimator(
            model_fn=lambda features, labels, mode: None, model_dir=str(tmp_path / "plain")
        )
        assert type(plain) is estimator_lib.EstimatorV2
        assert type(Exported(lambda features, labels, mode: None)) is Exported
    finally:
        tpushim.unpatch()
    assert tpushim.status()["applied"][key] is False
    assert not _patch.is_ours(estimator_lib.Estimator.__new__)
    plain = tf.estimator.Estimator(
        model_fn=lambda features, labels, mode: None, model_dir=str(tmp_path / "after")
    )
    assert type(plain) is estimator_lib.EstimatorV2
    assert type(Exported(lambda features, labels, mode: None)) is Exported
    assert inspect.signature(tf.compat.v1.estimator.Estimator) == signature
