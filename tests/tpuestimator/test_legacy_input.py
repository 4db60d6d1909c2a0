"""Legacy input as public scripts write it (issue 11): numpy_input_fn / pandas_input_fn, short batches
of ``batch(B).repeat()``, lookup tables. Each compared with the stock estimator within 1e-5."""

import random
import time
import types

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

_padding = tpuestimator_import("tpushim._padding")
_source = tpuestimator_import("tpushim._source")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tpuestimator,
]  # trains estimators or runs scripts: outside the fast tier

ModeKeys = tfcases.ModeKeys
N, B = tfcases.N, tfcases.BATCH  # 52 examples, batches of 8
numpy_input_fn = tfcases.ESTIMATOR.inputs.numpy_input_fn
TPU_CONTEXT = types.SimpleNamespace(num_hosts=1, current_host=0)  # what adapt() sees on a TPU


def _dict_model():
    """Functional model reading a dict feature 'x', as numpy_input_fn(dict) feeds it."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    inp = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(8, activation="relu", name="hidden")(inp)
    out = tf.keras.layers.Dense(3, activation="softmax", name="probs")(h)
    model = tf.keras.Model({"x": inp}, out)
    model.compile(
        tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9),
        "sparse_categorical_crossentropy",
        ["accuracy"],
    )
    return model


def _float64_xy():
    x, y = tfcases.data()
    return x.astype("float64"), y  # float64, as numpy and pandas hand features over


# --- numpy_input_fn / pandas_input_fn ---------------------------------------------------------


@pytest.mark.parametrize("v1_spelling", [True, False])
def test_numpy_input_fn_unshuffled_equals_stock(tmp_path, v1_spelling):
    x, y = _float64_xy()
    make = numpy_input_fn if v1_spelling else tf.compat.v1.estimator.inputs.numpy_input_fn
    train = make({"x": x}, y, batch_size=B, shuffle=False, num_epochs=None)
    evaluate = make({"x": x}, y, batch_size=B, shuffle=False, num_epochs=1)
    predict = make({"x": x}, batch_size=B, shuffle=False, num_epochs=1)

    def wrapped_train():  # scripts often call it inside their own input_fn
        return train()

    _, shim = tfcases.compare(tmp_path, _dict_model, wrapped_train, evaluate, predict, steps=9)
    assert len(shim[2]) == N


def test_numpy_input_fn_array_features_and_epochs(tmp_path):
    x, y = tfcases.data()
    # 2 epochs of 52 in batches of 8: 13 batches, the last one short (4 rows), as stock's queue.
    train = numpy_input_fn(x, y[:, 0], batch_size=B, shuffle=False, num_epochs=2)
    evaluate = numpy_input_fn(x, y[:, 0], batch_size=B, shuffle=False, num_epochs=1)
    stock, shim = (
        _train_to_the_end(mode, tfcases.sequential, train, evaluate, tmp_path / mode)
        for mode in ("off", "cpu")
    )
    assert shim[1]["global_step"] == stock[1]["global_step"] == 13
    tfcases.assert_same(stock, shim)


def _train_to_the_end(mode, build, train_fn, eval_fn, model_dir):
    """tfcases.run's result, training until the (finite) input ends."""
    est = tfcases.convert(
        model_dir, build, patch={"mode": mode}, config=tf.estimator.RunConfig(tf_random_seed=7)
    )
    est.train(train_fn)
    return est, est.evaluate(eval_fn), None, tfcases.checkpoint_values(model_dir)


def test_numpy_input_fn_on_a_tpu_is_a_static_dataset_without_queue_threads():
    x, y = _float64_xy()
    fn = numpy_input_fn({"x": x}, y, batch_size=B, shuffle=False, num_epochs=1)
    with tf.Graph().as_default() as graph:
        ds = tfcases.adapted(fn, ModeKeys.EVAL, {"batch_size": B, "context": TPU_CONTEXT})
        assert isinstance(ds, tf.data.Dataset)
        features, labels = ds.element_spec
        assert features[_padding.FEATURES_KEY]["x"].shape.as_list() == [B, 4]
        assert (
            features[_padding.FEATURES_KEY]["x"].dtype == tf.float32
        )  # no TPU infeed takes float64
        assert labels.shape.as_list() == [B, 1]
        # The queue is never read: no runner may start threads filling it, no summary report it.
        assert graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS) == []
        assert graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES) == []
        seen = [
            f[_padding.FEATURES_KEY]["x"][f[_padding.PADDING_KEY] > 0]
            # then zero-weight filler: a TPU cannot stop early
            for f, _ in tfcases.read_batches(ds, -(-N // B) + 2)
        ]
    assert [len(s) for s in seen[-3:]] == [N % B, 0, 0]
    np.testing.assert_array_equal(
        np.concatenate(seen), x.astype("float32")
    )  # every row once, in order


def _rows_seen(fn, mode=ModeKeys.TRAIN, batches=None):
    """Labels of the rows the recovered Dataset yields (padding dropped), in order."""
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(7)  # as RunConfig(tf_random_seed=7) sets it
        ds = _source.call_and_recover(fn, mode, {}, None)
        assert isinstance(ds, tf.data.Dataset)
        if batches:
            ds = ds.take(batches)
        return [int(i) for _, labels in tfcases.read_batches(ds) for i in labels.ravel()]


def _stock_rows(fn, batches, pause=0.2):
    """Labels of the rows stock's own queue gives -- the input_fn called in a graph as stock's
    Estimator makes it, its reading thread started with the session -- each batch read after a
    pause (a training step's time: the reader fills the queue meanwhile, as in any real run;
    0.05 s was too short for it on a loaded machine, where stock's order is its race's)."""
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(7)
        tf.compat.v1.train.create_global_step()
        _, labels = fn()
        rows = []
        with tf.compat.v1.train.MonitoredSession() as session:
            while batches is None or len(rows) < batches:
                time.sleep(pause)
                try:
                    rows.append(session.run(labels))
                except tf.errors.OutOfRangeError:
                    break
        return [int(i) for batch in rows for i in batch.ravel()]


def _pin_entropy(monkeypatch):
    """The environment: the operating-system entropy stock's reader draws its start row from
    (``random.seed(None)``) pinned, so that stock and tpushim start at the same row."""
    original = random.seed
    monkeypatch.setattr(random, "seed", lambda a=None, *args: original(1234 if a is None else a))


@pytest.mark.parametrize(
    "kind,rows,epochs,batches",
    [
        ("numpy", N, 2, None),  # fewer rows than the queue keeps: all in it at the first read
        ("numpy", 2000, None, 24),  # a full queue at every read, refilled between reads
        ("pandas", 700, 1, None),  # closes while read: a short last batch
    ],
)
def test_shuffled_input_in_stocks_order(monkeypatch, kind, rows, epochs, batches):
    """numpy_input_fn / pandas_input_fn(shuffle=True): the Dataset gives the rows stock's queue
    gives, in its order (its seeds, its reader's start row), batch by batch; run to run the same."""
    _pin_entropy(monkeypatch)
    y = np.arange(rows)
    x = np.arange(rows, dtype="float32")[:, None].repeat(4, axis=1)
    if kind == "numpy":
        fn = numpy_input_fn({"x": x}, y, batch_size=B * 4, shuffle=True, num_epochs=epochs)
    else:
        frame = pd.DataFrame({"a": x[:, 0], "b": x[:, 1]})
        fn = tfcases.ESTIMATOR.inputs.pandas_input_fn(
            frame, pd.Series(y), batch_size=B * 4, shuffle=True, num_epochs=epochs
        )
    stock = _stock_rows(fn, batches)
    assert len(stock) == (rows * epochs if epochs else batches * B * 4)
    assert stock != sorted(stock)  # shuffled
    assert _rows_seen(fn, batches=batches) == stock
    assert _rows_seen(fn, batches=batches) == stock  # the seeds fix it: run to run the same


def test_numpy_input_fn_shuffled_evaluation_counts_every_example(tmp_path):
    """Stock's shuffled order is the queue threads'; accuracy over one epoch does not depend on it."""
    x, y = tfcases.data()
    train = numpy_input_fn({"x": x}, y, batch_size=B, shuffle=False, num_epochs=None)
    shuffled = numpy_input_fn({"x": x}, y, batch_size=B, shuffle=True, num_epochs=1)
    stock = tfcases.run("off", _dict_model, train, shuffled, None, tmp_path / "stock", steps=5)
    shim = tfcases.run("cpu", _dict_model, train, shuffled, None, tmp_path / "shim", steps=5)
    np.testing.assert_allclose(shim[1]["accuracy"], stock[1]["accuracy"], atol=tfcases.TOL)
    assert shim[1]["global_step"] == 5


def test_pandas_input_fn_equals_stock(tmp_path):
    x, y = tfcases.data()
    frame = pd.DataFrame(
        {"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "d": x[:, 3]}, index=np.arange(100, 100 + N)
    )
    target = pd.Series(y[:, 0], index=frame.index)

    def build():
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        inputs = {k: tf.keras.Input((), name=k) for k in "abcd"}
        stacked = tf.keras.layers.Lambda(lambda d: tf.stack([d[k] for k in "abcd"], axis=1))(inputs)
        out = tf.keras.layers.Dense(3, activation="softmax", name="probs")(stacked)
        model = tf.keras.Model(inputs, out)
        model.compile(
            tf.keras.optimizers.legacy.Adam(0.05), "sparse_categorical_crossentropy", ["accuracy"]
        )
        return model

    pandas_input_fn = tf.compat.v1.estimator.inputs.pandas_input_fn
    train = pandas_input_fn(frame, target, batch_size=B, shuffle=False, num_epochs=None)
    evaluate = pandas_input_fn(frame, target, batch_size=B, shuffle=False, num_epochs=1)
    predict = pandas_input_fn(frame, batch_size=B, shuffle=False, num_epochs=1)
    tfcases.compare(tmp_path, build, train, evaluate, predict, steps=8)


# --- batch(B).repeat(): stock's short batch at each epoch's end --------------------------------


def _repeat_after_batch(x, y, batch):
    return lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()


def test_batch_then_repeat_trains_and_evaluates_on_stocks_batches(tmp_path):
    """52 rows in batch(16).repeat(): stock's batches are 16,16,16,4,16,... ; tpushim pads the 4
    instead of filling it from the next epoch, so training and evaluate(steps=N) match stock."""
    x, y = tfcases.data()
    fn = _repeat_after_batch(x, y, 16)
    stock = tfcases.run("off", tfcases.sequential, fn, None, None, tmp_path / "stock", steps=9)
    shim = tfcases.run("cpu", tfcases.sequential, fn, None, None, tmp_path / "shim", steps=9)
    stock = stock[:1] + (stock[0].evaluate(fn, steps=6), None, stock[3])
    shim = shim[:1] + (shim[0].evaluate(fn, steps=6), None, shim[3])
    tfcases.assert_same(stock, shim)


def test_batch_then_repeat_evaluate_steps_reads_what_stock_reads():
    """The official tutorial's numbers: 150 rows, batch(32).repeat(): 10 batches are 300 examples."""
    x = np.arange(150, dtype="float32")[:, None]
    fn = _repeat_after_batch(x, np.zeros(150, "int64"), 32)
    with tf.Graph().as_default():
        ds = tfcases.adapted(fn, ModeKeys.EVAL, {"batch_size": 32, "context": TPU_CONTEXT})
        assert ds.element_spec[0][_padding.FEATURES_KEY].shape.as_list() == [32, 1]
        nxt = tf.compat.v1.data.make_one_shot_iterator(ds.take(10)).get_next()
        with tf.compat.v1.Session() as sess:
            weights = [sess.run(nxt)[0][_padding.PADDING_KEY] for _ in range(10)]
    assert [int(w.sum()) for w in weights] == [32, 32, 32, 32, 22] * 2
    assert sum(int(w.sum()) for w in weights) == 300


def test_batch_then_repeat_with_sample_weights_and_two_outputs(tmp_path):
    features, labels = tfcases.two_in_two_out_data()
    fn = lambda: tf.data.Dataset.from_tensor_slices((features, labels)).batch(20).repeat()
    stock = tfcases.run("off", tfcases.two_in_two_out, fn, None, None, tmp_path / "stock", steps=5)
    shim = tfcases.run("cpu", tfcases.two_in_two_out, fn, None, None, tmp_path / "shim", steps=5)
    tfcases.assert_same(stock, shim)


def test_finite_training_input_trains_on_every_row_as_stock(tmp_path, tpushim_log):
    x, y = tfcases.data()
    fn = tfcases.dataset_input_fn(x, y, batch=16)  # 16,16,16,4 then the input ends
    stock, shim = (
        _train_to_the_end(mode, tfcases.sequential, fn, fn, tmp_path / mode)
        for mode in ("off", "cpu")
    )
    assert "dropped" not in tpushim_log.text
    assert stock[1]["global_step"] == shim[1]["global_step"] == 4
    tfcases.assert_same(stock, shim)


# --- BatchNormalization on padded short batches (issue 24, item 1) -------------------------------


def _every_batchnorm():
    """One functional model with a BatchNormalization of every kind on each branch: 2-D, the v1
    layer, renorm, synchronized, and 4-D fused (the default) and not fused."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    bn = dict(momentum=0.5)
    x = tf.keras.Input((4,))
    h = tf.keras.layers.Dense(6)(x)
    image = tf.keras.layers.Conv2D(3, 1)(tf.keras.layers.Reshape((2, 2, 1))(x))
    branches = [
        tf.keras.layers.BatchNormalization(**bn, name="plain")(h),
        tf.compat.v1.keras.layers.BatchNormalization(**bn, name="v1")(h),
        tf.keras.layers.BatchNormalization(**bn, renorm=True, renorm_momentum=0.5, name="re")(h),
        tf.keras.layers.experimental.SyncBatchNormalization(**bn, name="sync")(h),
        tf.keras.layers.Flatten()(tf.keras.layers.BatchNormalization(**bn, name="fused")(image)),
        tf.keras.layers.Flatten()(
            tf.keras.layers.BatchNormalization(**bn, fused=False, name="unfused")(image)
        ),
    ]
    out = tf.keras.layers.Dense(3, activation="softmax")(tf.keras.layers.Concatenate()(branches))
    model = tf.keras.Model(x, out)
    model.compile(tf.keras.optimizers.legacy.SGD(0.5), "sparse_categorical_crossentropy", ["acc"])
    return model


def _ghost_batchnorm():
    """Ghost batches (virtual_batch_size): an unbuilt Sequential, as Keras's own config of a built
    layer cannot be cloned (its axis is saved shifted), by stock neither."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(6),
            tf.keras.layers.BatchNormalization(momentum=0.5, virtual_batch_size=4),
            tf.keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(tf.keras.optimizers.legacy.SGD(0.5), "sparse_categorical_crossentropy", ["acc"])
    return model


def _masked_batchnorm():
    """A Keras mask (Embedding(mask_zero=True)) reaching the BatchNormalization: stock leaves the
    masked steps out of the statistics, tpushim the masked steps and the padding rows."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Embedding(10, 4, mask_zero=True, input_shape=(5,)),
            tf.keras.layers.BatchNormalization(momentum=0.5),
            tf.keras.layers.Lambda(lambda steps: tf.reduce_mean(steps, 1)),
            tf.keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(tf.keras.optimizers.legacy.SGD(0.5), "sparse_categorical_crossentropy", ["acc"])
    return model


def _sequences():
    rng = np.random.RandomState(0)
    ids = rng.randint(1, 10, (N, 5))
    ids[:, 3:] *= rng.randint(0, 2, (N, 2))  # id 0: masked steps
    return ids, rng.randint(0, 3, (N, 1))


@pytest.mark.parametrize(
    "build",
    [_every_batchnorm, _ghost_batchnorm, _masked_batchnorm, tfcases.batchnorm_variants],
    ids=["kinds", "ghost", "mask", "variants"],
)
def test_batchnorm_statistics_leave_padding_out_as_stock(tmp_path, build):
    """52 rows in batch(16).repeat(): every 4th batch has 4 rows, padded to 16. Every moving mean
    and variance (fused: with Bessel's correction), every weight, metric and prediction equals
    stock's, whose BatchNormalization sees the 4 rows alone. ``variants``: a layer under
    TimeDistributed (its batch of rows x steps: before, the padding rows' steps were taken for
    real rows), renorm with clipping, momenta and epsilons, nested, frozen, ``training=False``,
    fused or not, channels first."""
    x, y = _sequences() if build is _masked_batchnorm else tfcases.data()
    if build is tfcases.batchnorm_variants:
        x, y = tfcases.data(dim=12)
        x = x.reshape((-1, *tfcases.BATCHNORM_VARIANTS_SHAPE))
    finite = tfcases.dataset_input_fn(x, y, batch=16)
    tfcases.compare(
        tmp_path,
        build,
        _repeat_after_batch(x, y, 16),
        finite,
        tfcases.dataset_input_fn(x, batch=16),
        steps=9,
    )


# --- lookup tables ------------------------------------------------------------------------------

VOCAB = ["the", "cat", "sat", "on", "mat", "dog", "ran"]
SENTENCES = [
    "the cat sat",
    "the dog ran",
    "cat on mat",
    "dog sat on the mat",
    "the cat ran",
    "mat",
    "on the dog",
    "ran sat cat",
] * 4 + ["the the", "dog"]  # 34 lines


def _text_model():
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    tokens = tf.keras.Input((5,), dtype="int64", name="tokens")
    h = tf.keras.layers.Embedding(len(VOCAB) + 2, 4, name="embed")(tokens)
    h = tf.keras.layers.GlobalAveragePooling1D()(h)
    out = tf.keras.layers.Dense(1, activation="sigmoid", name="score")(h)
    model = tf.keras.Model({"tokens": tokens}, out)
    model.compile(tf.keras.optimizers.legacy.Adam(0.05), "binary_crossentropy", ["accuracy"])
    return model


def _text_input_fn(repeat):
    def input_fn():
        table = tf.lookup.StaticVocabularyTable(
            tf.lookup.KeyValueTensorInitializer(VOCAB, tf.range(1, len(VOCAB) + 1, dtype=tf.int64)),
            num_oov_buckets=1,
        )

        def encode(line, label):
            words = tf.strings.split([line]).to_tensor(shape=[1, 5], default_value="")[0]
            ids = tf.where(words == "", tf.zeros([5], tf.int64), table.lookup(words))
            return {"tokens": ids}, label

        labels = np.array([("cat" in s) * 1.0 for s in SENTENCES], "float32")
        ds = tf.data.Dataset.from_tensor_slices((SENTENCES, labels)).map(encode).batch(8)
        return ds.repeat() if repeat else ds

    return input_fn


def test_vocabulary_lookup_table_in_dataset_map(tmp_path):
    tfcases.compare(
        tmp_path, _text_model, _text_input_fn(True), _text_input_fn(False), None, steps=6
    )


def test_vocabulary_lookup_table_without_a_declared_batch_is_read_once(tmp_path):
    """A batch size the graph does not hold as a constant: read from one batch, tables initialised."""
    fn = _text_input_fn(False)
    hidden = lambda: (
        fn().unbatch().batch(tf.compat.v1.placeholder_with_default(tf.constant(8, tf.int64), []))
    )
    assert tfcases.input_facts(hidden, ModeKeys.EVAL).batch_size == 8
    assert tfcases.input_facts(hidden, ModeKeys.EVAL, count=True).examples == len(SENTENCES)


# --- inspection: the input_fn called as often as stock calls it, no data read when the graph declares
# the batch -----------------------------------------------------------------------------------------


def test_input_fn_called_as_stock_calls_it_without_reading_data(tmp_path):
    x, y = tfcases.data()
    calls, elements = [], []

    def count(a, b):
        elements.append(1)
        return a, b

    def input_fn():
        calls.append(1)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000)
        ds = ds.map(lambda a, b: tf.numpy_function(count, [a, b], [tf.float32, tf.int64]))
        return (
            ds.map(lambda a, b: (tf.ensure_shape(a, [4]), tf.ensure_shape(b, [1])))
            .repeat()
            .batch(B)
        )

    assert tfcases.input_facts(input_fn, ModeKeys.TRAIN).batch_size == B
    assert elements == []  # the batch op said it: no element read, no shuffle buffer filled
    est = tfcases.convert(tmp_path, patch={"mode": "cpu"})
    calls.clear()
    est.train(input_fn, steps=1)
    est.train(input_fn, steps=1)
    assert len(calls) == 2  # one call per train(), as stock makes
