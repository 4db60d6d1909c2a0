"""Rung 2b: the TPU model_fn run as 8 shards on CPU, with different data and a real cross-replica sum,
compared with the STOCK estimator on the whole global batch.

The 8 replicas are :class:`replicas.Emulation` (one graph, cross-replica sums rewired into true
sums, a global step per replica). Every replica starts from the stock estimator's initial (or
trained) weights. Eval emulates TPUEstimator's host call: each shard's ``eval_metrics`` tensors
concatenated along axis 0 in shard order, ``metric_fn`` run once on that, its update ops once per
batch, the loss the mean of shard 0's per-batch losses (tpu_estimator.py:
``_OutfeedHostCall.create_tpu_hostcall``, ``_eval_on_tpu_system``).
"""

import os

import numpy as np
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import
from replicas import GLOBAL, PER, REPLICAS, Assigner, Emulation, max_diff, shard, tpu_model

keras_lib = tpuestimator_import("tensorflow_estimator.python.estimator", "keras_lib")

_batching = tpuestimator_import("tpushim._batching")
_batchnorm = tpuestimator_import("tpushim._batchnorm")
_extenders = tpuestimator_import("tpushim._extenders")
_losses = tpuestimator_import("tpushim._losses")
_model_fn = tpuestimator_import("tpushim._model_fn")
_padding = tpuestimator_import("tpushim._padding")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tpuestimator,
]  # trains estimators or runs scripts: outside the fast tier

ModeKeys = tfcases.ModeKeys
TOL = 1e-5


# -- the stock side --------------------------------------------------------------------------------


def _stock_estimator(model, model_dir, **config):
    """Stock model_to_estimator (v1 spelling: name-based checkpoints, graph variable names)."""
    estimator = tf.compat.v1.keras.estimator.model_to_estimator(
        keras_model=model,
        model_dir=str(model_dir),
        config=tf.estimator.RunConfig(tf_random_seed=7, **config),
    )
    assert not isinstance(estimator, tf.compat.v1.estimator.tpu.TPUEstimator)
    return estimator


def _dataset_fn(*structure, batch):
    return lambda: tf.data.Dataset.from_tensor_slices(
        structure if len(structure) > 1 else structure[0]
    ).batch(batch)


def _rows(structure, rows):
    return tf.nest.map_structure(lambda a: a[rows], structure)


# -- the model and data ----------------------------------------------------------------------------

OPTIMIZERS = {
    "keras-sgd-momentum": lambda: tf.keras.optimizers.legacy.SGD(0.3, momentum=0.9),
    "keras-adam-legacy": lambda: tf.keras.optimizers.legacy.Adam(0.05),
    "keras-adam-new": lambda: tf.keras.optimizers.Adam(0.05),  # converted to legacy, as stock does
    "keras-rmsprop": lambda: tf.keras.optimizers.legacy.RMSprop(0.02, momentum=0.5),
    "tf1-adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),  # the CrossShardOptimizer path
}


def two_in_two_out(optimizer):
    """tfcases' 2-in/2-out model with one more metric object on 'cls', compiled with ``optimizer``."""
    return tfcases.two_in_two_out(OPTIMIZERS[optimizer], cls_crossentropy_metric=True)


def two_in_two_out_data(n, seed=3, reg_labels_1d=False):
    """(features with per-output sample weights, as stock reads them, labels)."""
    return tfcases.two_in_two_out_data(n, seed, sample_weights=True, reg_labels_1d=reg_labels_1d)


# -- 1. training -----------------------------------------------------------------------------------

STEPS = 3
COMPARED_AT = (1, STEPS)  # one step, and several


def _train_data():
    return two_in_two_out_data(GLOBAL * STEPS)


@pytest.fixture(scope="module")
def stock_training(tmp_path_factory):
    """optimizer -> (initial weights, [stock checkpoint at each COMPARED_AT step]), trained once:
    one train() of STEPS global batches, a checkpoint saved at every step."""
    cache = {}

    def run(optimizer):
        if optimizer not in cache:
            features, labels = _train_data()
            model = two_in_two_out(optimizer)
            init = model.get_weights()
            stock = _stock_estimator(
                model, tmp_path_factory.mktemp("stock_" + optimizer), save_checkpoints_steps=1
            )
            stock.train(_dataset_fn(features, labels, batch=GLOBAL), steps=STEPS)
            cache[optimizer] = (
                init,
                [
                    tfcases.checkpoint_values(os.path.join(stock.model_dir, f"model.ckpt-{step}"))
                    for step in COMPARED_AT
                ],
            )
        return cache[optimizer]

    return run


def _emulated_vs_stock_training(stock_training, optimizer, compared_at=COMPARED_AT):
    """The 8-shard emulation on the slices of the global batches stock trained on, in the same
    order; at each ``compared_at`` step, the largest difference of any replica's variable (weights
    and optimizer slots, matched to stock's by name) from stock's checkpoint."""
    init, checkpoints = stock_training(optimizer)
    features, labels = _train_data()
    emu = Emulation(
        tpu_model(lambda: two_in_two_out(optimizer)),
        ModeKeys.TRAIN,
        _rows((features, labels), slice(0, GLOBAL)),
    )
    try:
        emu.load_weights(init)
        names = emu.var_names()
        diffs = []
        for step in range(1, max(compared_at) + 1):
            emu.train(_rows((features, labels), slice((step - 1) * GLOBAL, step * GLOBAL)))
            if step not in compared_at:
                continue
            ref = dict(checkpoints[COMPARED_AT.index(step)])
            assert ref.pop("global_step") == step
            assert sorted(ref) == sorted(names)  # every stock variable, and only those, is compared
            assert emu.sess.run(emu.steps) == [step] * REPLICAS  # each replica's own step
            assert (
                max_diff(init, [ref[n] for n in emu.weight_names()]) > 1e-2
            )  # training moved them
            want = [ref[n] for n in names]
            diffs.append(max(max_diff(values, want) for values in emu.sess.run(emu.vars)))
        return diffs
    finally:
        emu.close()


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_eight_shards_train_like_stock_on_the_global_batch(stock_training, optimizer):
    """2-in/2-out, loss weights, per-output sample weights: after 1 step and after 3."""
    diffs = _emulated_vs_stock_training(stock_training, optimizer)
    assert max(diffs) < TOL, diffs


def test_negative_control_summed_gradients_fail(stock_training, monkeypatch):
    """Gradients summed over shards instead of averaged must be caught by the comparison."""
    monkeypatch.setattr(_model_fn._tfprivate.tpu, "num_shards_in_replica_context", lambda: 1)
    diffs = _emulated_vs_stock_training(stock_training, "keras-sgd-momentum", compared_at=(1,))
    assert diffs[0] > 100 * TOL, diffs


# -- BatchNormalization: per-shard statistics ------------------------------------------------------


def _bn_model(synchronized=False, conv=False):
    """Dense (or a 1x1 Conv2D: BatchNormalization's fused kernel) -> BatchNormalization -> softmax.
    ``conv="axis1"``: the fused layer normalises axis 1 (the kernel's NCHW layout)."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    hidden = (
        [tf.keras.layers.Reshape((2, 2, 1), input_shape=(4,)), tf.keras.layers.Conv2D(3, 1)]
        if conv
        else [tf.keras.layers.Dense(6, input_shape=(4,), name="hidden")]
    )
    model = tf.keras.Sequential(
        [
            *hidden,
            # SyncBatchNormalization: BatchNormalization(synchronized=True) leaves the flag out of
            # its config, so no estimator's clone (stock's neither) is synchronized.
            (
                tf.keras.layers.experimental.SyncBatchNormalization
                if synchronized
                else tf.keras.layers.BatchNormalization
            )(momentum=0.5, axis=1 if conv == "axis1" else -1, name="bn"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(3, activation="softmax", name="probs"),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.legacy.SGD(0.5),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def _stock_one_step_per_slice(model_dir, x, y, slices, **bn):
    """The stock estimator's own model_fn (keras_lib's), one SGD step from the model's initial
    weights on each slice of rows alone: (initial weights, weight names, weights after, per slice)."""
    model = _bn_model(**bn)
    init = model.get_weights()
    model_fn = _stock_estimator(model, model_dir)._model_fn
    clones = []
    build_clone = keras_lib._clone_and_build_model
    with tf.Graph().as_default(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            keras_lib,
            "_clone_and_build_model",
            lambda *a, **k: clones.append(build_clone(*a, **k)) or clones[-1],
        )
        xs = tf.compat.v1.placeholder(tf.float32, [None, 4])
        ys = tf.compat.v1.placeholder(tf.int64, [None, 1])
        spec = model_fn(tf.identity(xs), tf.identity(ys), ModeKeys.TRAIN)
        assign = Assigner(tf.compat.v1.get_default_graph(), clones[0].weights)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            out = []
            for rows in slices:
                assign(sess, init)
                sess.run(spec.train_op, {xs: x[rows], ys: y[rows]})
                out.append(sess.run(clones[0].weights))
            names = [w.name.split(":")[0] for w in clones[0].weights]
    return init, names, out


def _emulated_one_step(build_model, batch):
    """(weight names, every replica's model weights) after one emulated step on ``batch``."""
    emu = Emulation(tpu_model(build_model), ModeKeys.TRAIN, batch)
    try:
        emu.load_weights(build_model().get_weights())
        emu.train(batch)
        return emu.weight_names(), emu.sess.run([clone.weights for clone in emu.clones])
    finally:
        emu.close()


@pytest.mark.parametrize("conv", [False, True], ids=["dense", "conv-fused"])
def test_batchnorm_uses_per_shard_statistics_and_averaged_gradients(tmp_path, conv):
    """Documented TPU behaviour (docs/reference/parity.md): BatchNormalization normalises each shard over its
    own slice and each replica updates its moving statistics from it; the trainable weights still
    move by the gradient averaged over shards."""
    x, y = tfcases.data(n=GLOBAL)
    slices = [shard(r) for r in range(REPLICAS)]
    _, stock_names, per_slice = _stock_one_step_per_slice(tmp_path, x, y, slices, conv=conv)
    names, replicas = _emulated_one_step(lambda: _bn_model(conv=conv), (x, y))
    assert names == stock_names
    moving = [i for i, n in enumerate(names) if "moving_" in n]
    trainable = [i for i, n in enumerate(names) if "moving_" not in n]
    assert len(moving) == 2 and len(trainable) == 6
    for r in range(REPLICAS):
        # Replica r's moving mean and variance: those of a single model stepped on slice r alone.
        assert max_diff([replicas[r][i] for i in moving], [per_slice[r][i] for i in moving]) < TOL
        # Trainable weights: one SGD step with the shards' gradients averaged = the mean of the
        # weights each slice alone would give (SGD is linear in the gradient).
        mean = [np.mean([per_slice[s][i] for s in range(REPLICAS)], axis=0) for i in trainable]
        assert max_diff([replicas[r][i] for i in trainable], mean) < TOL
    # The replicas' moving statistics differ from one another: they are per shard.
    assert max_diff([replicas[0][i] for i in moving], [replicas[1][i] for i in moving]) > 1e-3


SHORT_REAL = 13  # real rows of a padded global batch: shards 0-2 full, 3 one row, 4-7 padding only


def _padded_global_batch(x, y):
    """x, y (fewer than GLOBAL rows) as tpushim feeds a short batch: padded, with its weight."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL).repeat()
        fitted = _batching.fit_batches(dataset, GLOBAL, ModeKeys.TRAIN)
        return sess.run(tf.compat.v1.data.make_one_shot_iterator(fitted).get_next())


@pytest.mark.parametrize("rows", [SHORT_REAL, GLOBAL], ids=["short", "full"])
@pytest.mark.parametrize(
    "conv", [False, True, "axis1"], ids=["dense", "conv-fused", "conv-fused-channels-first"]
)
def test_batchnorm_on_a_padded_short_batch_uses_each_shards_real_rows(tmp_path, conv, rows):
    """A short batch padded over the shards (issue 24, item 1): each replica's moving statistics
    are those of its own real rows (unchanged on a shard of padding only), and the weights move
    by the gradient of the real rows, each weighing the same. A full batch of a padded input
    (weights of one, the same graph) is each shard's own batch (#36)."""
    x, y = tfcases.data(n=rows)
    batch = _padded_global_batch(x, y)
    assert int(batch[0][_padding.PADDING_KEY].sum()) == rows
    slices = [slice(r * PER, min((r + 1) * PER, rows)) for r in range(REPLICAS)]
    real = [max(0, s.stop - s.start) for s in slices]
    used = sum(1 for n in real if n)
    init, _, per_slice = _stock_one_step_per_slice(tmp_path, x, y, slices[:used], conv=conv)
    names, replicas = _emulated_one_step(lambda: _bn_model(conv=conv), batch)
    moving = [i for i, n in enumerate(names) if "moving_" in n]
    trainable = [i for i, n in enumerate(names) if "moving_" not in n]
    for r in range(REPLICAS):
        want = per_slice[r] if real[r] else init
        assert max_diff([replicas[r][i] for i in moving], [want[i] for i in moving]) < TOL, r
        step = [
            init[i] + sum(real[s] / rows * (per_slice[s][i] - init[i]) for s in range(used))
            for i in trainable
        ]
        assert max_diff([replicas[r][i] for i in trainable], step) < TOL, r


def _synchronized_short_batches(tmp_path, conv=False):
    """Largest difference of any replica's variables from stock's after each of 3 steps of
    ``batch(GLOBAL).repeat()`` over SHORT_ROWS rows, with a synchronized BatchNormalization."""
    x, y = tfcases.data(n=SHORT_ROWS, seed=4)
    return _short_batch_diffs(
        tmp_path, lambda: _bn_model(synchronized=True, conv=conv), (x, y), [32, 13, 32]
    )


def test_synchronized_batchnorm_on_eight_shards_trains_like_stock_on_the_global_batch(tmp_path):
    """SyncBatchNormalization (``synchronized=True``) on a TPU: the statistics' sums are added
    across shards, so every replica -- weights, moving mean and variance -- equals stock on the
    whole global batch, a padded short one included."""
    diffs = _synchronized_short_batches(tmp_path)
    assert max(diffs) < TOL, diffs


def test_negative_control_synchronized_batchnorm_per_shard_fails(tmp_path, monkeypatch):
    real = _batchnorm.real_rows_call
    monkeypatch.setattr(
        _batchnorm, "real_rows_call", lambda weight, cross_replica: real(weight, False)
    )
    diffs = _synchronized_short_batches(tmp_path)
    assert diffs[0] > 100 * TOL, diffs


# -- 3. evaluation, 4. prediction ------------------------------------------------------------------

EVAL_ROWS = 45  # global batches of 32: the second has 13 real rows, shards 4-7 only padding
EVAL_MODEL = "keras-adam-legacy"


@pytest.fixture(scope="module")
def trained_stock(tmp_path_factory):
    """The stock estimator after 2 steps (what eval and predict are compared with)."""
    features, labels = two_in_two_out_data(GLOBAL * 2, seed=5)
    stock = _stock_estimator(two_in_two_out(EVAL_MODEL), tmp_path_factory.mktemp("stock_eval"))
    stock.train(_dataset_fn(features, labels, batch=GLOBAL), steps=2)
    return stock


def _padded_global_batches(structure, mode):
    """tpushim's own padding (as TPUShimEstimator's input_fn does it) of ``structure`` in global
    batches of GLOBAL, as numpy."""
    dataset = tf.data.Dataset.from_tensor_slices(structure).batch(10)  # the user's batch size
    return list(_batching.fit_batches(dataset, GLOBAL, mode).as_numpy_iterator())


def _emulation_from(stock, mode, template):
    emu = Emulation(tpu_model(lambda: two_in_two_out(EVAL_MODEL)), mode, template)
    ckpt = tfcases.checkpoint_values(stock.model_dir)
    emu.load_weights([ckpt[n] for n in emu.weight_names()])
    return emu


def _emulated_eval(emu, batches, shards=tuple(range(REPLICAS)), loss=None):
    """TPUEstimator's eval on a TPU: metric_fn on the shards' tensors concatenated in shard order,
    updated once per global batch; the loss the mean over batches of shard 0's ``loss``."""
    metric_fn, tensors = emu.specs[0].eval_metrics
    with emu.graph.as_default():
        concat = {
            k: tf.concat([emu.specs[r].eval_metrics[1][k] for r in shards], axis=0) for k in tensors
        }
        metric_ops = metric_fn(**concat)
        emu.sess.run(tf.compat.v1.local_variables_initializer())
    losses = []
    for batch in batches:
        value, _ = emu.sess.run(
            [emu.specs[0].loss if loss is None else loss, [u for _, u in metric_ops.values()]],
            emu.feed(batch),
        )
        losses.append(value)
    values = emu.sess.run({k: v for k, (v, _) in metric_ops.items()})
    values["loss"] = float(np.mean(losses))
    return values


def _stock_eval(stock, reg_labels_1d):
    """(stock evaluate() without global_step, tpushim's padded global batches of the same data)."""
    features, labels = two_in_two_out_data(EVAL_ROWS, seed=7, reg_labels_1d=reg_labels_1d)
    # Stock's eval loss is the mean of its batches' losses: on a TPU the batches are global ones.
    want = tfcases.stock_metric_names(
        stock.evaluate(_dataset_fn(features, labels, batch=GLOBAL)), ("cls", "reg")
    )
    assert want.pop("global_step") == 2
    batches = _padded_global_batches((features, labels), ModeKeys.EVAL)
    assert len(batches) == 2
    assert batches[1][0][_padding.PADDING_KEY].reshape(REPLICAS, PER).sum(axis=1).tolist() == [
        4,
        4,
        4,
        1,
        0,
        0,
        0,
        0,
    ]
    return want, batches


@pytest.fixture(scope="module")
def eval_runs(trained_stock):
    """reg_labels_1d -> (stock's evaluate(), the emulation's, and two wrong emulations: the loss
    of shard 0 alone, not all-reduced, as TPUEstimator reports it; metrics of shard 0's tensors)."""
    cache = {}

    def run(reg_labels_1d):
        if reg_labels_1d not in cache:
            want, batches = _stock_eval(trained_stock, reg_labels_1d)
            emu = _emulation_from(trained_stock, ModeKeys.EVAL, batches[0])
            try:
                got = _emulated_eval(emu, batches)
                with emu.graph.as_default():
                    _, padding = _padding.split_padding(emu.features[0])
                    shard_0_loss = _padding.eval_loss(emu.clones[0], padding, cross_replica=False)
                loss_of_shard_0 = _emulated_eval(emu, batches, loss=shard_0_loss)
                metrics_of_shard_0 = _emulated_eval(emu, batches, shards=(0,))
            finally:
                emu.close()
            cache[reg_labels_1d] = want, got, loss_of_shard_0, metrics_of_shard_0
        return cache[reg_labels_1d]

    return run


@pytest.mark.parametrize("reg_labels_1d", [False, True], ids=["labels-2d", "reg-labels-1d"])
def test_eight_shards_evaluate_like_stock_with_padding_shards(eval_runs, reg_labels_1d):
    """45 examples in global batches of 32: in the last batch shard 3 is 3/4 padding and shards
    4-7 only padding. Loss and every metric equal stock evaluate()'s within 1e-5; per-output sample
    weights (only 'cls' weighted with [batch] labels for the [batch, 1] mse output: stock cannot
    weight that output, and then weights none -- see test_equivalence)."""
    want, got, _, _ = eval_runs(reg_labels_1d)
    assert (
        set(got)
        == set(want)
        == {
            "loss",
            "cls_accuracy",
            "cls_sparse_categorical_crossentropy",
            "reg_mae",
            "reg_root_mean_squared_error",
        }
    )
    for key, value in want.items():
        assert abs(got[key] - value) < TOL, (key, got[key], value)


def test_negative_controls_eval_loss_of_shard_0_or_metrics_of_shard_0_fail(eval_runs):
    """The eval comparison must catch a loss of shard 0 alone (not all-reduced) and metrics
    computed on shard 0's tensors alone."""
    want, _, loss_of_shard_0, metrics_of_shard_0 = eval_runs(False)
    assert abs(loss_of_shard_0["loss"] - want["loss"]) > 100 * TOL
    metrics = [key for key in want if key != "loss"]
    assert max(abs(metrics_of_shard_0[key] - want[key]) for key in metrics) > 100 * TOL


def _added_metrics(features, labels, predictions):
    """A tf.estimator.add_metrics metric_fn: a (value, update_op) pair on labels and predictions, a
    Keras metric object on features, and a name the model already reports (overridden)."""
    mean_a = tf.keras.metrics.Mean(name="mean_a")
    mean_a.update_state(features["features"]["a"][:, 0])
    return {
        "reg_mse_added": tf.compat.v1.metrics.mean_squared_error(labels["reg"], predictions["reg"]),
        "mean_a": mean_a,
        "cls_accuracy": tf.compat.v1.metrics.mean(predictions["cls"][:, 0]),
    }


def test_eight_shards_evaluate_added_metrics_like_stock(trained_stock):
    """tf.estimator.add_metrics (issue 24, item 3): on a TPU the added metric_fn runs on the host
    over every shard's rows, padding dropped; every metric, added and compiled, equals stock's
    add_metrics estimator's."""
    features, labels = two_in_two_out_data(EVAL_ROWS, seed=7)
    stock = tf.estimator.add_metrics(trained_stock, _added_metrics)
    want = stock.evaluate(_dataset_fn(features, labels, batch=GLOBAL))
    want = tfcases.stock_metric_names(want, ("cls", "reg"))
    assert want.pop("global_step") == 2
    batches = _padded_global_batches((features, labels), ModeKeys.EVAL)
    emu = Emulation(
        tpu_model(lambda: two_in_two_out(EVAL_MODEL)),
        ModeKeys.EVAL,
        batches[0],
        wrap_model_fn=lambda model_fn: _extenders._with(model_fn, _added_metrics, None),
    )
    try:
        ckpt = tfcases.checkpoint_values(trained_stock.model_dir)
        emu.load_weights([ckpt[n] for n in emu.weight_names()])
        got = _emulated_eval(emu, batches)
    finally:
        emu.close()
    assert {"reg_mse_added", "mean_a", "cls_accuracy", "reg_mae"} <= set(got) == set(want)
    for key, value in want.items():
        assert abs(got[key] - value) < TOL, (key, got[key], value)


def test_eight_shards_predict_every_example_once_in_order(trained_stock):
    """45 examples: each shard's predictions concatenated in shard order, padding dropped (as
    TPUShimEstimator.predict does) equal stock predict() in order within 1e-5."""
    inputs = two_in_two_out_data(EVAL_ROWS, seed=9)[0]["features"]
    want = list(trained_stock.predict(_dataset_fn(inputs, batch=10)))
    batches = _padded_global_batches(inputs, ModeKeys.PREDICT)
    emu = _emulation_from(trained_stock, ModeKeys.PREDICT, batches[0])
    try:
        got = []
        for batch in batches:
            shards = emu.sess.run([spec.predictions for spec in emu.specs], emu.feed(batch))
            merged = {k: np.concatenate([s[k] for s in shards]) for k in shards[0]}
            keep = merged.pop(_padding.PADDING_KEY) > 0
            got.extend({k: v[i] for k, v in merged.items()} for i in np.flatnonzero(keep))
    finally:
        emu.close()
    assert len(got) == len(want) == EVAL_ROWS
    for g, w in zip(got, want):
        assert set(g) == set(w) == {"cls", "reg"}
        for key in w:
            np.testing.assert_allclose(g[key], w[key], atol=TOL, rtol=0)


# -- short training batches: padded over the shards, trained like stock's short batch --------------

SHORT_ROWS = (
    45  # batch(32).repeat(): stock trains on 32, then 13 (shards 4-7 only padding), 32, ...
)


def _short_batch_diffs(tmp_path, build_model, data, real_rows):
    """Largest difference of any replica's variables from stock's after each step of
    ``batch(GLOBAL).repeat()`` over ``data``; ``real_rows``: each step's real rows."""
    model = build_model()
    init = model.get_weights()
    stock = _stock_estimator(model, tmp_path / "stock", save_checkpoints_steps=1)
    repeated = lambda: tf.data.Dataset.from_tensor_slices(data).batch(GLOBAL).repeat()
    steps = len(real_rows)
    stock.train(repeated, steps=steps)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        nxt = tf.compat.v1.data.make_one_shot_iterator(
            _batching.fit_batches(repeated(), GLOBAL, ModeKeys.TRAIN)
        ).get_next()
        batches = [sess.run(nxt) for _ in range(steps)]
    assert [int(b[0][_padding.PADDING_KEY].sum()) for b in batches] == real_rows
    emu = Emulation(tpu_model(build_model), ModeKeys.TRAIN, batches[0])
    try:
        emu.load_weights(init)
        names, diffs = emu.var_names(), []
        for step, batch in enumerate(batches, 1):
            emu.train(batch)
            ref = tfcases.checkpoint_values(os.path.join(stock.model_dir, f"model.ckpt-{step}"))
            want = [ref[n] for n in names]
            diffs.append(max(max_diff(values, want) for values in emu.sess.run(emu.vars)))
        return diffs
    finally:
        emu.close()


def _short_batch_training(tmp_path):
    """Largest difference of any replica's variables from stock's after each of 3 steps of
    ``batch(GLOBAL).repeat()`` over SHORT_ROWS rows: step 2 is stock's short batch."""
    optimizer = "keras-adam-legacy"
    return _short_batch_diffs(
        tmp_path,
        lambda: two_in_two_out(optimizer),
        two_in_two_out_data(SHORT_ROWS, seed=11),
        [32, 13, 32],
    )


def test_eight_shards_train_a_padded_short_batch_like_stock(tmp_path):
    diffs = _short_batch_training(tmp_path)
    assert max(diffs) < TOL, diffs


def test_negative_control_padding_counted_per_shard_fails(tmp_path, monkeypatch):
    """Real rows counted per shard (no cross-shard sum) weigh a short batch's rows unevenly (and,
    as the mean divides by the global count of rows, the full batches' too)."""
    real = _losses.Totals.resolve
    monkeypatch.setattr(_losses.Totals, "resolve", lambda self, cross_replica: real(self, False))
    diffs = _short_batch_training(tmp_path)
    assert diffs[1] > 100 * TOL, diffs


# -- a global batch that does not divide among the cores: each padded, trained like stock's ---------

INDIVISIBLE = GLOBAL - 2  # batch(30) on 8 cores: each step 30 real rows and 2 of padding


def test_eight_shards_train_an_indivisible_global_batch_like_stock(tmp_path):
    """Stock's batches of 30 (with per-output sample weights), padded to 32 for 8 shards: every
    step trains as stock's on its 30 rows (the padding, copies of real rows, weighted out)."""
    optimizer = "keras-adam-legacy"
    features, labels = two_in_two_out_data(INDIVISIBLE * 3, seed=13)
    model = two_in_two_out(optimizer)
    init = model.get_weights()
    stock = _stock_estimator(model, tmp_path / "stock", save_checkpoints_steps=1)
    batched = lambda: tf.data.Dataset.from_tensor_slices((features, labels)).batch(INDIVISIBLE)
    stock.train(batched, steps=3)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        padded = _batching.fit_batches(batched(), INDIVISIBLE, ModeKeys.TRAIN, padded_to=GLOBAL)
        nxt = tf.compat.v1.data.make_one_shot_iterator(padded).get_next()
        batches = [sess.run(nxt) for _ in range(3)]
    assert [int(b[0][_padding.PADDING_KEY].sum()) for b in batches] == [INDIVISIBLE] * 3
    emu = Emulation(tpu_model(lambda: two_in_two_out(optimizer)), ModeKeys.TRAIN, batches[0])
    try:
        emu.load_weights(init)
        names, diffs = emu.var_names(), []
        for step, batch in enumerate(batches, 1):
            losses = emu.train(batch)
            ref = tfcases.checkpoint_values(os.path.join(stock.model_dir, f"model.ckpt-{step}"))
            want = [ref[n] for n in names]
            diffs.append(max(max_diff(values, want) for values in emu.sess.run(emu.vars)))
            assert max(losses) - min(losses) < TOL  # every shard reports the global batch's loss
    finally:
        emu.close()
    assert max(diffs) < TOL, diffs
