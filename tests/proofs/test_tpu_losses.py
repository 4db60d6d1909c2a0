"""Rung 2b for every kind of loss Keras trains on: the TPU model_fn as 8 emulated shards
(:class:`replicas.Emulation`) against the STOCK estimator's own model_fn stepped on the whole
global batch, from the same weights, two SGD-with-momentum steps.

Compared: every replica's weights (within 1e-5) and the loss every replica reports for each step
(stock's loss on the global batch). Covered: built-in losses and loss objects (SUM_OVER_BATCH_SIZE
and SUM), custom functions returning one value per example or a summed or averaged scalar, custom
Loss classes, loss_weights, per-output sample weights, terms that need no kind (a constant
loss, an output weighted 0 or without a loss, a loss reading only the labels), a masked sequence output, padded short
batches, [batch] labels of a [batch, 1] output (a SUM mse and kl_divergence: one number for the
batch), and added losses (weight and activity regularizers, batch-dependent ``add_loss``). Also
evaluation: the loss every shard reports for a padded global batch (custom one-number losses,
terms that need no kind) against stock's EVAL model_fn on the real rows. The negative controls
break one aggregation at a time and must be caught.
"""

import numpy as np
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import
from replicas import GLOBAL, Assigner, Emulation, max_diff, tpu_model

_batching = tpuestimator_import("tpushim._batching")
_losses = tpuestimator_import("tpushim._losses")
_padding = tpuestimator_import("tpushim._padding")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tpuestimator,
]  # trains estimators: outside the fast tier

ModeKeys = tfcases.ModeKeys
TOL = 1e-5
STEPS = 2
SUM = tf.keras.losses.Reduction.SUM


# -- losses as users write them ----------------------------------------------------------------


def summed_squares(y_true, y_pred):
    """A custom loss returning ONE number: the batch's sum (Keras leaves it a per-batch sum)."""
    return tf.reduce_sum(tf.square(y_true - y_pred))


def mean_squares(y_true, y_pred):
    """A custom loss returning one number: the batch's mean."""
    return tf.reduce_mean(tf.square(y_true - y_pred))


class AbsRows(tf.keras.losses.Loss):
    """A custom Loss returning one value per example."""

    def call(self, y_true, y_pred):
        return tf.reduce_mean(tf.abs(y_true - y_pred), axis=-1)


@tf.keras.utils.register_keras_serializable(package="tpushim_tests")
class MeanActivity(tf.keras.regularizers.Regularizer):
    """A mean-valued activity regularizer: Keras divides it by the batch size once more."""

    def __call__(self, x):
        return 0.1 * tf.reduce_mean(tf.square(x))

    def get_config(self):
        return {}


@tf.keras.utils.register_keras_serializable(package="tpushim_tests")
class Penalty(tf.keras.layers.Layer):
    """A layer that adds a loss computed from its inputs (``self.add_loss``): their sum or mean."""

    def __init__(self, summed, rate, **kwargs):
        super().__init__(**kwargs)
        self.summed, self.rate = summed, rate

    def call(self, x):
        reduce = tf.reduce_sum if self.summed else tf.reduce_mean
        self.add_loss(self.rate * reduce(tf.square(x)))
        return tf.identity(x)  # Keras 2 cannot clone a layer returning its input tensor itself

    def get_config(self):
        return dict(super().get_config(), summed=self.summed, rate=self.rate)


# -- models and data ---------------------------------------------------------------------------


def _seeded():
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)


def _sgd():
    return tf.keras.optimizers.legacy.SGD(0.05, momentum=0.5)


def one_output(loss, **hidden):
    def build():
        _seeded()
        x = tf.keras.Input((4,), name="x")
        h = tf.keras.layers.Dense(6, activation="tanh", name="h", **hidden)(x)
        model = tf.keras.Model(x, tf.keras.layers.Dense(2, name="y")(h))
        model.compile(_sgd(), loss=loss)
        return model

    return build


def two_outputs():
    """'cls' (built-in mean) and 'reg' (a custom per-example loss, SUM), loss_weights; the data
    weighs both per example (stock cannot weigh a custom loss returning one number: Keras fails
    to broadcast the weights onto it)."""
    _seeded()
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(6, activation="tanh", name="h")(x)
    cls = tf.keras.layers.Dense(3, activation="softmax", name="cls")(h)
    reg = tf.keras.layers.Dense(1, name="reg")(h)
    model = tf.keras.Model(x, {"cls": cls, "reg": reg})
    model.compile(
        _sgd(),
        loss={"cls": "sparse_categorical_crossentropy", "reg": AbsRows(reduction=SUM)},
        loss_weights={"cls": 1.0, "reg": 0.5},
    )
    return model


def three_outputs():
    """A built-in mean, a summed and an averaged custom scalar loss, loss_weights."""
    _seeded()
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(6, activation="tanh", name="h")(x)
    outputs = {
        "cls": tf.keras.layers.Dense(3, activation="softmax", name="cls")(h),
        "total": tf.keras.layers.Dense(1, name="total")(h),
        "mean": tf.keras.layers.Dense(2, name="mean")(h),
    }
    model = tf.keras.Model(x, outputs)
    model.compile(
        _sgd(),
        loss={
            "cls": "sparse_categorical_crossentropy",
            "total": summed_squares,
            "mean": mean_squares,
        },
        loss_weights={"cls": 1.0, "total": 0.1, "mean": 2.0},
    )
    return model


def _three_outputs_data(n, seed=0):
    rng = np.random.RandomState(seed)
    labels = {
        "cls": rng.randint(0, 3, size=(n, 1)).astype("int64"),
        "total": rng.rand(n, 1).astype("float32"),
        "mean": rng.rand(n, 2).astype("float32"),
    }
    return rng.rand(n, 4).astype("float32"), labels


def added_losses():
    """Weight regularizer (batch-free), built-in activity regularizer (a mean), a mean-valued
    custom activity regularizer (a mean over the batch divided by it again), a summed and a
    mean loss added by layers (``add_loss``). (Stock cannot clone a functional model given
    ``model.add_loss(tensor)``: Keras 2 fails to clone its TFOpLambda layers.)"""
    _seeded()
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(
        6,
        activation="tanh",
        name="h",
        kernel_regularizer=tf.keras.regularizers.L2(0.01),
        activity_regularizer=tf.keras.regularizers.L1(0.01),
    )(x)
    h = Penalty(summed=False, rate=0.1, name="mean_penalty")(h)
    g = tf.keras.layers.Dense(5, activation="tanh", name="g", activity_regularizer=MeanActivity())
    g = Penalty(summed=True, rate=0.01, name="sum_penalty")(g(h))
    model = tf.keras.Model(x, tf.keras.layers.Dense(2, name="y")(g))
    model.compile(_sgd(), loss="mse")
    return model


def activity_regularized():
    """Activity regularizers alone: a built-in one (a mean), a user's mean-valued one (a mean
    over the batch divided by it again), on a layer called twice (a term per call)."""
    _seeded()
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(
        6, activation="tanh", name="h", activity_regularizer=tf.keras.regularizers.L1L2(0.01, 0.02)
    )(x)
    g = tf.keras.layers.Dense(6, activation="tanh", name="g", activity_regularizer=MeanActivity())
    model = tf.keras.Model(x, tf.keras.layers.Dense(2, name="y")(g(g(h))))
    model.compile(_sgd(), loss="mse")
    return model


def masked_sequence():
    """[batch, 5, 1] outputs whose zero-padded time steps are masked out of the mean."""
    _seeded()
    x = tf.keras.Input((5, 2), name="x")
    h = tf.keras.layers.Masking(0.0)(x)
    h = tf.keras.layers.TimeDistributed(tf.keras.layers.Dense(4, activation="tanh"), name="h")(h)
    model = tf.keras.Model(
        x, tf.keras.layers.TimeDistributed(tf.keras.layers.Dense(1), name="y")(h)
    )
    model.compile(_sgd(), loss="mse")
    return model


def _xy(n, seed=0):
    rng = np.random.RandomState(seed)
    return rng.rand(n, 4).astype("float32"), rng.rand(n, 2).astype("float32")


def _two_outputs_data(n, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.rand(n, 4).astype("float32")
    labels = {
        "cls": rng.randint(0, 3, size=(n, 1)).astype("int64"),
        "reg": rng.rand(n, 1).astype("float32"),
    }
    weights = {k: rng.uniform(0.2, 2.0, n).astype("float32") for k in ("cls", "reg")}
    return {"features": x, "sample_weights": weights}, labels


def _zero(y_true, y_pred):
    return tf.constant(0.0)


def _labels_mean(y_true, y_pred):
    return tf.reduce_mean(tf.square(y_true))


def passing_through(loss, weight):
    """'cls' (built-in) and 'aux', the hidden layer passed through (no weights of its own) with
    ``loss`` weighted ``weight``: terms that need no kind (#34). ``loss`` None: no loss."""

    def build():
        _seeded()
        x = tf.keras.Input((4,), name="x")
        h = tf.keras.layers.Dense(6, activation="tanh", name="h")(x)
        cls = tf.keras.layers.Dense(3, activation="softmax", name="cls")(h)
        aux = tf.keras.layers.Activation("linear", name="aux")(h)
        model = tf.keras.Model(x, {"cls": cls, "aux": aux})
        model.compile(
            _sgd(),
            loss={"cls": "sparse_categorical_crossentropy", "aux": loss},
            loss_weights={"cls": 1.0, "aux": weight},
        )
        return model

    return build


def _passing_through_data(n, seed=0):
    rng = np.random.RandomState(seed)
    labels = {
        "cls": rng.randint(0, 3, size=(n, 1)).astype("int64"),
        "aux": rng.rand(n, 6).astype("float32"),
    }
    return rng.rand(n, 4).astype("float32"), labels


def row_labels(loss):
    """A [batch, 1] output trained on [batch] labels: Keras squeezes the output to [batch], so a
    loss reducing the last axis is one number for the batch (a SUM mse: the rows' mean;
    kl_divergence: their sum)."""

    def build():
        _seeded()
        x = tf.keras.Input((4,), name="x")
        h = tf.keras.layers.Dense(6, activation="tanh", name="h")(x)
        y = tf.keras.layers.Dense(1, activation="sigmoid", name="y")(h)
        model = tf.keras.Model(x, y)
        model.compile(tf.keras.optimizers.legacy.SGD(0.5, momentum=0.5), loss=loss)
        return model

    return build


def _row_labels_data(n, seed=0):
    rng = np.random.RandomState(seed)
    return rng.rand(n, 4).astype("float32"), rng.uniform(0.1, 0.9, n).astype("float32")  # [n]


def _sequence_data(n, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.uniform(0.5, 1.0, (n, 5, 2)).astype("float32")
    lengths = rng.randint(1, 6, n)  # each shard masks a different number of steps
    x[np.arange(5)[None, :] >= lengths[:, None]] = 0.0
    return x, rng.rand(n, 5, 1).astype("float32")


CASES = {
    "builtin-mse": (one_output("mse"), _xy),
    "huber-object": (one_output(tf.keras.losses.Huber()), _xy),
    "mse-object-sum": (one_output(tf.keras.losses.MeanSquaredError(reduction=SUM)), _xy),
    "custom-summed-scalar": (one_output(summed_squares), _xy),
    "custom-mean-scalar": (one_output(mean_squares), _xy),
    "two-outputs-weighted": (two_outputs, _two_outputs_data),
    "three-outputs": (three_outputs, _three_outputs_data),
    "added-losses": (added_losses, _xy),
    "activity": (activity_regularized, _xy),
    "masked-sequence": (masked_sequence, _sequence_data),
    "constant-zero-weighted-0": (passing_through(_zero, 0.0), _passing_through_data),
    "constant-weighted-1": (passing_through(_zero, 1.0), _passing_through_data),
    "no-loss": (passing_through(None, 1.0), _passing_through_data),
    "mse-weighted-0": (passing_through("mse", 0.0), _passing_through_data),
    "labels-only-mean": (passing_through(_labels_mean, 0.5), _passing_through_data),
    "row-labels-sum": (
        row_labels(tf.keras.losses.MeanSquaredError(reduction=SUM)),
        _row_labels_data,
    ),
    "row-labels-kld": (row_labels("kl_divergence"), _row_labels_data),
}
PADDED = {  # batch(GLOBAL).repeat() over 45 rows: the second step is stock's short batch of 13
    "padded-two-outputs-weighted": "two-outputs-weighted",
    "padded-three-outputs": "three-outputs",
    "padded-constant-weighted-1": "constant-weighted-1",
    "padded-labels-only-mean": "labels-only-mean",
    "padded-row-labels-sum": "row-labels-sum",
    "padded-row-labels-kld": "row-labels-kld",
}


def _batches(case):
    data_fn = CASES[PADDED.get(case, case)][1]
    if case not in PADDED:
        features, labels = data_fn(GLOBAL * STEPS)
        return [
            tf.nest.map_structure(lambda a: a[s * GLOBAL : (s + 1) * GLOBAL], (features, labels))
            for s in range(STEPS)
        ]
    features, labels = data_fn(45, seed=1)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(GLOBAL).repeat()
        nxt = tf.compat.v1.data.make_one_shot_iterator(
            _batching.fit_batches(dataset, GLOBAL, ModeKeys.TRAIN)
        ).get_next()
        return [sess.run(nxt) for _ in range(STEPS)]


# -- stock: keras_lib's own model_fn on the whole global batch ---------------------------------


def _stock(build, batches, model_dir):
    """(initial weights, stock's loss per step, its weights after the steps). A padded batch is
    given to stock as its real rows only, as stock's input yields it."""
    model = build()
    init = model.get_weights()
    model_fn = tf.compat.v1.keras.estimator.model_to_estimator(
        keras_model=model, model_dir=str(model_dir)
    )._model_fn
    real = [_real_rows(batch) for batch in batches]
    with tf.Graph().as_default() as graph:
        tf.compat.v1.train.get_or_create_global_step()
        inputs = tf.nest.map_structure(
            lambda a: tf.compat.v1.placeholder(tf.as_dtype(a.dtype), [None] + list(a.shape[1:])),
            real[0],
        )
        clones = []
        from tensorflow_estimator.python.estimator import keras_lib

        build_clone = keras_lib._clone_and_build_model
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(
                keras_lib,
                "_clone_and_build_model",
                lambda *a, **k: clones.append(build_clone(*a, **k)) or clones[-1],
            )
            features, labels = tf.nest.map_structure(tf.identity, inputs)
            spec = model_fn(features, labels, ModeKeys.TRAIN)
        assign = Assigner(graph, clones[0].weights)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assign(sess, init)
            losses = []
            for batch in real:
                feed = dict(zip(tf.nest.flatten(inputs), tf.nest.flatten(batch)))
                losses.append(sess.run([spec.train_op, spec.loss], feed)[1])
            return init, losses, sess.run(clones[0].weights)


def _real_rows(batch):
    features, labels = batch
    features, weight = _padding.split_padding(features)
    if weight is None:
        return features, labels
    keep = weight > 0
    return tf.nest.map_structure(lambda a: a[keep], (features, labels))


@pytest.fixture(scope="module")
def stock_runs(tmp_path_factory):
    cache = {}

    def run(case):
        if case not in cache:
            build = CASES[PADDED.get(case, case)][0]
            cache[case] = _stock(build, _batches(case), tmp_path_factory.mktemp(case))
        return cache[case]

    return run


def _emulated(case, init):
    """(each step's reported losses, one list per replica; every replica's weights after)."""
    batches = _batches(case)
    emu = Emulation(tpu_model(CASES[PADDED.get(case, case)][0]), ModeKeys.TRAIN, batches[0])
    try:
        emu.load_weights(init)
        reported = [emu.train(batch) for batch in batches]
        return reported, emu.sess.run([clone.weights for clone in emu.clones])
    finally:
        emu.close()


def _differences(stock_runs, case):
    """(largest weight difference of any replica, largest relative reported-loss difference)."""
    init, stock_losses, stock_weights = stock_runs(case)
    reported, replicas = _emulated(case, init)
    weights = max(max_diff(w, stock_weights) for w in replicas)
    # relative: a summed loss is large, and float32 carries 7 digits of it
    losses = max(
        abs(float(r) - float(s)) / max(1.0, abs(float(s)))
        for rs, s in zip(reported, stock_losses)
        for r in rs
    )
    return weights, losses


@pytest.mark.parametrize("case", sorted(CASES) + sorted(PADDED))
def test_eight_shards_train_and_report_like_stock_on_the_global_batch(stock_runs, case):
    init, _, stock_weights = stock_runs(case)
    assert max_diff(init, stock_weights) > 1e-3  # the steps moved the weights
    weights, losses = _differences(stock_runs, case)
    assert weights < TOL and losses < TOL, (weights, losses)


# -- negative controls: each aggregation broken once must be caught -----------------------------


@pytest.mark.parametrize("case", ["mse-object-sum", "custom-summed-scalar", "added-losses"])
def test_negative_control_sums_not_scaled_by_the_shards_fail(stock_runs, case, monkeypatch):
    """A summed term differentiated as if it were a mean (shards = 1): 1/8 of its gradient."""
    real = _losses.training_loss
    monkeypatch.setattr(
        _losses,
        "training_loss",
        lambda model, plan, pad, shards, cross_replica: real(model, plan, pad, 1, cross_replica),
    )
    monkeypatch.setattr(_losses, "_needs_global", lambda *a: True)
    weights, _ = _differences(stock_runs, case)
    assert weights > 100 * TOL, weights


@pytest.mark.parametrize("case", ["masked-sequence", "padded-two-outputs-weighted"])
def test_negative_control_counts_and_weights_of_one_shard_fail(stock_runs, case, monkeypatch):
    """Element counts and sample-weight sums of each shard alone, not of the global batch."""
    real = _losses.Totals.resolve
    monkeypatch.setattr(_losses.Totals, "resolve", lambda self, cross_replica: real(self, False))
    weights, _ = _differences(stock_runs, case)
    assert weights > 100 * TOL, weights


def test_negative_control_reported_loss_of_shard_0_fails(stock_runs, monkeypatch):
    """The loss shard 0 trains on, reported as TPUEstimator would without tpushim's sum."""
    real = _losses.training_loss
    monkeypatch.setattr(
        _losses,
        "training_loss",
        lambda *a, **k: (lambda pair: (pair[0], pair[0]))(real(*a, **k)),
    )
    _, losses = _differences(stock_runs, "builtin-mse")
    assert losses > 100 * TOL, losses


def test_the_emulated_sum_has_cross_replica_sums_gradient(stock_runs, monkeypatch):
    """The emulated sum differentiates as CrossReplicaSum does (its gradient is a cross-replica
    sum of the upstream gradients): each shard training on the global loss, a cross-replica sum,
    gets eight times its rows' gradient of it, and the shards' mean is the global gradient again
    -- stock's step. (Here every replica's upstream gradient is the same; where they differ, a
    sum whose gradient is not summed over the replicas fails tests/proofs/test_tpu_emulation.py's
    synchronized BatchNormalization.)"""
    real = _losses.training_loss
    monkeypatch.setattr(
        _losses,
        "training_loss",
        lambda *a, **k: (lambda pair: (pair[1], pair[1]))(real(*a, **k)),  # train on the sum
    )
    weights, _ = _differences(stock_runs, "builtin-mse")
    assert weights < TOL, weights


def test_negative_control_a_labels_only_loss_taken_for_a_constant_fails(stock_runs, monkeypatch):
    """A loss reading only the labels has no gradient, but is no constant: taken for one, its
    value over a padded batch counts the padding rows, and the reported loss is wrong."""
    from tpushim import _loss_kinds

    monkeypatch.setattr(_loss_kinds, "_reads", lambda *a: (False, False))
    _, losses = _differences(stock_runs, "padded-labels-only-mean")
    assert losses > 100 * TOL, losses


@pytest.mark.parametrize("case", ["row-labels-sum", "row-labels-kld", "padded-row-labels-sum"])
def test_negative_control_batch_labels_read_per_row_fail(stock_runs, case, monkeypatch):
    """[batch] labels of a [batch, 1] output read as one loss per row (as before the loss's
    one-number kind was read from them): a SUM mse sums the rows where stock takes their mean,
    kl_divergence averages them where stock sums."""
    monkeypatch.setattr(_padding, "one_number_outputs", lambda *a, **k: {})
    weights, losses = _differences(stock_runs, case)
    assert max(weights, losses) > 100 * TOL, (weights, losses)


# -- evaluation on 8 shards: custom one-number losses and terms that need no kind (#34) --------

EVAL_CASES = ["custom-mean-scalar", "custom-summed-scalar", "constant-weighted-1"]
EVAL_CASES += ["constant-zero-weighted-0", "labels-only-mean", "no-loss"]
EVAL_CASES += ["row-labels-sum", "row-labels-kld"]  # [batch] labels: one number for the batch
EVAL_CASES += ["activity"]  # each regularizer's term over the real rows of the global batch


def _eval_batches(case):
    """45 rows in global batches of 32, padded as tpushim pads evaluation: the second batch has
    13 real rows (shard 3 partly, shards 4-7 wholly padding)."""
    features, labels = CASES[case][1](45, seed=2)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(GLOBAL)
    return list(_batching.fit_batches(dataset, GLOBAL, ModeKeys.EVAL).as_numpy_iterator())


def _stock_eval_losses(build, init, batches):
    """Stock's EVAL model_fn's loss on each batch's real rows (its evaluate() 'loss' is their
    mean), from the weights ``init``."""
    model = build()
    model_fn = tf.compat.v1.keras.estimator.model_to_estimator(keras_model=model)._model_fn
    real = [_real_rows(batch) for batch in batches]
    with tf.Graph().as_default() as graph:
        tf.compat.v1.train.get_or_create_global_step()
        inputs = tf.nest.map_structure(
            lambda a: tf.compat.v1.placeholder(tf.as_dtype(a.dtype), [None] + list(a.shape[1:])),
            real[0],
        )
        clones = []
        from tensorflow_estimator.python.estimator import keras_lib

        build_clone = keras_lib._clone_and_build_model
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(
                keras_lib,
                "_clone_and_build_model",
                lambda *a, **k: clones.append(build_clone(*a, **k)) or clones[-1],
            )
            features, labels = tf.nest.map_structure(tf.identity, inputs)
            spec = model_fn(features, labels, ModeKeys.EVAL)
        assign = Assigner(graph, clones[0].weights)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assign(sess, init)
            return [
                sess.run(spec.loss, dict(zip(tf.nest.flatten(inputs), tf.nest.flatten(batch))))
                for batch in real
            ]


def _eval_differences(stock_runs, case):
    """The largest relative difference of any shard's eval loss from stock's, per batch."""
    init, _, _ = stock_runs(case)
    batches = _eval_batches(case)
    want = _stock_eval_losses(CASES[case][0], init, batches)
    emu = Emulation(tpu_model(CASES[case][0]), ModeKeys.EVAL, batches[0])
    try:
        emu.load_weights(init)
        got = [emu.sess.run([s.loss for s in emu.specs], emu.feed(batch)) for batch in batches]
    finally:
        emu.close()
    return max(  # every shard reports the global batch's loss
        abs(float(loss) - float(value)) / max(1.0, abs(float(value)))
        for per_replica, value in zip(got, want)
        for loss in per_replica
    )


@pytest.mark.parametrize("case", EVAL_CASES)
def test_eight_shards_evaluate_the_loss_like_stock_with_padding_shards(stock_runs, case):
    assert _eval_differences(stock_runs, case) < TOL


def test_negative_control_an_eval_loss_of_batch_labels_read_per_row_fails(stock_runs, monkeypatch):
    """kl_divergence of [batch] labels read per row in evaluation: the rows' mean, not sum."""
    monkeypatch.setattr(_padding, "one_number_outputs", lambda *a, **k: {})
    assert _eval_differences(stock_runs, "row-labels-kld") > 100 * TOL


def test_negative_control_a_custom_scalar_eval_loss_of_each_shard_alone_fails(
    stock_runs, monkeypatch
):
    """Each shard's own value of a custom one-number loss, not combined over the shards."""
    real = _losses.global_output_loss
    monkeypatch.setattr(
        _losses,
        "global_output_loss",
        lambda endpoint, kind, pad, cross_replica: real(endpoint, kind, pad, False),
    )
    assert _eval_differences(stock_runs, "custom-mean-scalar") > 100 * TOL
