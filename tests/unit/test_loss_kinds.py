"""How tpushim tells the kinds of loss terms apart (tpushim/_loss_kinds.py), and what it refuses:
a loss TPU cores cannot split is refused by the conversion before anything is written and
reported by the preflight; a loss that stock cannot train either fails as stock's does."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

import tpushim

_loss_kinds = tpuestimator_import("tpushim._loss_kinds")
_model_fn = tpuestimator_import("tpushim._model_fn")
_padding = tpuestimator_import("tpushim._padding")
from tpushim._errors import ConversionError

pytestmark = pytest.mark.tpuestimator  # the TPU path (cpu mode's TPUEstimator) throughout

ModeKeys = tfcases.ModeKeys


# -- the kinds, on values ----------------------------------------------------------------------


def _on_parts(per_row, combine):
    """A term's values on 8 rows and on the parts of 1, 3 and 4 rows, from per-row values."""
    full = combine(per_row)
    return full, [combine(per_row[part]) for part in _loss_kinds._PARTS]


@pytest.mark.parametrize(
    "combine, kind",
    [
        (lambda v: v, _loss_kinds.ROWS),
        (np.mean, _loss_kinds.MEAN),
        (np.sum, _loss_kinds.SUM),
        (lambda v: np.mean(v) / len(v), _loss_kinds.Degree(-1)),  # Keras's activity regularizer
        (lambda v: np.float32(0.7), _loss_kinds.MEAN),  # ignores the batch: a weight regularizer
    ],
    ids=["per-example", "mean", "sum", "mean-per-batch-size", "batch-free"],
)
def test_kinds_of_terms(combine, kind):
    per_row = np.random.RandomState(0).rand(8).astype("float32") + 0.5
    assert _loss_kinds._kind(*_on_parts(per_row, combine)) == (kind, None)


@pytest.mark.parametrize(
    "combine, why",
    [
        (np.std, "neither a sum nor a mean"),
        (lambda v: v - v.mean(), "depends on the other examples"),
        (lambda v: np.full(len(v) + 1, v.sum()), "shape changes with the batch"),
    ],
    ids=["batch-statistic", "rows-compared", "shape-of-batch"],
)
def test_terms_no_split_can_reproduce(combine, why):
    per_row = np.random.RandomState(0).rand(8).astype("float32") + 0.5
    kind, reason = _loss_kinds._kind(*_on_parts(per_row, combine))
    assert kind == "unsplittable" and why in reason


@pytest.mark.parametrize(
    "per_row, why",
    [(np.zeros(8, "float32"), "more than one kind"), (np.full(8, np.nan), "non-finite")],
    ids=["all-zero", "nan"],
)
def test_draws_that_cannot_tell_are_retried(per_row, why):
    kind, reason = _loss_kinds._kind(*_on_parts(per_row, np.sum))
    assert kind is None and why in reason


# -- the kinds, on loss functions and models ---------------------------------------------------


def _summed(y_true, y_pred):
    return tf.reduce_sum(tf.square(y_true - y_pred))


def _batch_centered(y_true, y_pred):
    """Predictions centred on the batch's mean: a batch statistic."""
    return tf.reduce_mean(tf.square(y_pred - tf.reduce_mean(y_pred, 0) - y_true))


def _rows_compared(y_true, y_pred):
    """One value per example, each compared with the batch's largest prediction."""
    return tf.reduce_mean(tf.square(y_true - y_pred / tf.reduce_max(y_pred)), axis=-1)


def _needs_seven_columns(y_true, y_pred):
    return tf.reduce_sum(tf.reshape(y_true - y_pred, [-1, 7]))


def _log_of_negative(y_true, y_pred):
    return tf.reduce_mean(tf.math.log(-tf.abs(y_pred) - 1.0 + 0.0 * y_true))


def _model(loss, **dense):
    tf.keras.backend.clear_session()
    x = tf.keras.Input((4,), name="x")
    model = tf.keras.Model(x, tf.keras.layers.Dense(2, name="y", **dense)(x))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), loss=loss)
    return model


@tf.keras.utils.register_keras_serializable(package="tpushim_tests")
class MeanSquare(tf.keras.regularizers.Regularizer):
    def __call__(self, x):
        return tf.reduce_mean(tf.square(x))  # Keras divides it by the batch size again

    def get_config(self):
        return {}


class Variance(tf.keras.layers.Layer):
    def call(self, x):
        self.add_loss(tf.math.reduce_variance(x))  # over the batch: a batch statistic
        return tf.identity(x)


def _added_variance():
    tf.keras.backend.clear_session()
    x = tf.keras.Input((4,), name="x")
    h = Variance(name="variance")(tf.keras.layers.Dense(3, name="h")(x))
    model = tf.keras.Model(x, tf.keras.layers.Dense(2, name="y")(h))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), loss="mse")
    return model


def test_plan_of_a_model_with_every_kind():
    plan = _loss_kinds.plan(_model({"y": _summed}))
    assert plan.outputs == {"y": _loss_kinds.SUM} and plan.added == {}
    plan = _loss_kinds.plan(
        _model(
            "mse",
            kernel_regularizer="l2",
            activity_regularizer=MeanSquare(),
        )
    )
    assert plan.outputs == {"y": _loss_kinds.ROWS}
    assert plan.added == {("y", 0): _loss_kinds.Degree(-1)}
    # Built-in losses and regularizers are known without evaluating anything.
    plan = _loss_kinds.plan(_model(tf.keras.losses.Huber(), activity_regularizer="l2"))
    assert plan.outputs == {"y": _loss_kinds.ROWS} and plan.added == {}


UNSPLITTABLE = {
    "batch-centered": (lambda: _model(_batch_centered), "loss of output 'y'", "neither"),
    "rows-compared": (lambda: _model(_rows_compared), "loss of output 'y'", "other examples"),
    "added-variance": (_added_variance, "loss added by layer 'variance'", "neither"),
}


@pytest.mark.parametrize("case", sorted(UNSPLITTABLE))
def test_a_loss_no_split_can_reproduce_is_refused_before_anything_is_written(tmp_path, case):
    build, where, why = UNSPLITTABLE[case]
    model_dir = tmp_path / "model"
    with pytest.raises(ConversionError) as raised:
        tfcases.convert(model_dir, build, patch={"mode": "cpu"})
    message = str(raised.value)
    assert where in message and why in message and "Fix:" in message
    assert not os.path.exists(model_dir) or not os.listdir(model_dir)
    report = tpushim.check(build())
    finding = next(f for f in report.findings if f.code == "unconvertible-loss")
    assert (finding.severity, finding.where) == ("error", raised.value.where)
    assert finding.fix == raised.value.fix and not report.ok


@pytest.mark.parametrize(
    "loss, gave",
    [(_needs_seven_columns, "InvalidArgumentError"), (_log_of_negative, "non-finite values")],
    ids=["fails-on-synthetic-rows", "nan-on-synthetic-rows"],
)
def test_a_loss_that_cannot_be_told_apart_says_so_and_how_to_fix(loss, gave):
    with pytest.raises(ConversionError) as raised:
        _loss_kinds.plan(_model(loss))
    message = str(raised.value)
    assert "could not tell whether it is a sum or a mean" in message and gave in message
    assert "return one value per example" in message


# -- refused when the TPU training step is built ------------------------------------------------


def _train_spec(model, features, labels):
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        return _model_fn.make_model_fn(model)(
            features(), labels(), ModeKeys.TRAIN, params={"use_tpu": False}
        )


def test_reduction_none_fails_with_stocks_reason_when_training_is_built():
    """Stock hands the estimator one loss per example and fails at its first step ('Input to
    reshape is a tensor with 8 values, but the requested shape has 1'); tpushim says why when it
    builds the step."""
    model = _model(tf.keras.losses.MeanSquaredError(reduction=tf.keras.losses.Reduction.NONE))
    with pytest.raises(
        ValueError, match=r"Loss must be scalar.*reduction NONE.*SUM_OVER_BATCH_SIZE"
    ):
        _train_spec(model, lambda: tf.zeros([8, 4]), lambda: tf.zeros([8, 2]))


def test_an_added_loss_from_the_inputs_on_a_padded_batch_is_refused():
    """Padding rows would count in it: the message says how to make every batch full."""
    model = _model("mse", activity_regularizer="l2")
    padded = lambda: {
        _padding.FEATURES_KEY: tf.zeros([8, 4]),
        _padding.PADDING_KEY: tf.constant([1.0] * 5 + [0.0] * 3),
    }
    with pytest.raises(ConversionError, match=r"short batches.*dataset.repeat\(\).batch\(B\)"):
        _train_spec(model, padded, lambda: tf.zeros([8, 2]))
    # A full batch of the same model trains.
    assert _train_spec(model, lambda: tf.zeros([8, 4]), lambda: tf.zeros([8, 2])).train_op


# -- terms that need no kind: constant, weighted 0, no loss, labels only (#34) -----------------


def _zero(y_true, y_pred):
    """A loss some scripts give an output they only pass through: the constant 0."""
    return tf.constant(0.0)


def _labels_mean(y_true, y_pred):
    """Reads the labels only: no gradient, yet its value (a mean) is part of the loss."""
    return tf.reduce_mean(tf.square(y_true))


def _labels_max(y_true, y_pred):
    """Reads the labels only, and is a batch statistic: the reported loss cannot be split."""
    return tf.reduce_max(y_true)


def _predictions_mean(y_true, y_pred):
    return tf.reduce_mean(tf.square(y_true - y_pred))


def _passing_through(aux_loss, aux_weight=1.0):
    """'cls' (a built-in loss) and 'aux', the hidden layer passed through: no weights of its
    own, so a loss that ignores its predictions leaves no variable without a gradient."""

    def build():
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        x = tf.keras.Input((4,), name="x")
        h = tf.keras.layers.Dense(6, activation="tanh", name="h")(x)
        cls = tf.keras.layers.Dense(3, activation="softmax", name="cls")(h)
        aux = tf.keras.layers.Activation("linear", name="aux")(h)
        model = tf.keras.Model(x, {"cls": cls, "aux": aux})
        weights = {"cls": 1.0} if aux_weight is None else {"cls": 1.0, "aux": aux_weight}
        model.compile(
            tf.keras.optimizers.legacy.SGD(0.1, momentum=0.5),
            loss={"cls": "sparse_categorical_crossentropy", "aux": aux_loss},
            loss_weights=weights,
            metrics={"cls": ["accuracy"]},
        )
        return model

    return build


PASSING_THROUGH = {  # case -> (aux loss, its weight, its kind)
    "constant-zero-weighted-0": (_zero, 0.0, _loss_kinds.UNWEIGHTED),
    "constant-zero": (_zero, 1.0, _loss_kinds.CONSTANT),
    "constant-two": (lambda y_true, y_pred: tf.constant(2.0), 0.5, _loss_kinds.CONSTANT),
    "no-loss": (None, None, None),
    "batch-statistic-weighted-0": (_batch_centered, 0.0, _loss_kinds.UNWEIGHTED),
    "labels-only-mean": (_labels_mean, 0.5, _loss_kinds.MEAN),
    "predictions-mean": (_predictions_mean, 0.5, _loss_kinds.MEAN),
}


@pytest.mark.parametrize("case", sorted(PASSING_THROUGH))
def test_terms_that_need_no_kind_are_planned_without_refusal(case):
    loss, weight, kind = PASSING_THROUGH[case]
    plan = _loss_kinds.plan(_passing_through(loss, weight)())
    assert plan.outputs == dict(
        {"cls": _loss_kinds.ROWS}, **({} if kind is None else {"aux": kind})
    )


def test_a_labels_only_batch_statistic_is_refused_saying_it_changes_no_weight():
    with pytest.raises(ConversionError) as raised:
        _loss_kinds.plan(_passing_through(_labels_max)())
    assert "neither a sum nor a mean" in str(raised.value)
    assert raised.value.fix.startswith("give its output loss_weights 0 or loss None")
    assert "changes no weight" in raised.value.fix


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(PASSING_THROUGH))
def test_terms_that_need_no_kind_train_in_cpu_mode_as_stock(tmp_path, case):
    """Weights, every eval metric (52 rows in batches of 8: the last one padded in cpu mode, so
    every custom scalar loss goes through the padded evaluation) and predictions."""
    loss, weight, _ = PASSING_THROUGH[case]
    rng = np.random.RandomState(1)
    x = rng.rand(tfcases.N, 4).astype("float32")
    labels = {
        "cls": rng.randint(0, 3, (tfcases.N, 1)).astype("int64"),
        "aux": rng.rand(tfcases.N, 6).astype("float32"),
    }
    stock, _ = tfcases.compare(
        tmp_path,
        _passing_through(loss, weight),
        tfcases.dataset_input_fn(x, labels, repeat=True),
        tfcases.dataset_input_fn(x, labels),
        tfcases.dataset_input_fn(x),
        output_names=("cls", "aux"),
    )
    assert stock[1]["loss"] > 0
