"""What stock accepts, tpushim accepts, with the same numbers (issue #24, items 5-8 and 10): the
members of each family the whole scripts (tests/scripts/, run by test_scripts.py: lists with a
string feature, lookups outside the map with batches of 100, decoded JPEGs for a declared Input)
do not reach, as stock-vs-cpu comparisons and as what one input_fn call becomes. The TPU path is
in test_tpu_system.py (faked TPU system) and test_tpu_emulation.py (eight shards)."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

estimator_util = tpuestimator_import("tensorflow_estimator.python.estimator", "util")

_batching = tpuestimator_import("tpushim._batching")
_padding = tpuestimator_import("tpushim._padding")
_shapes = tpuestimator_import("tpushim._shapes")

pytestmark = pytest.mark.tpuestimator  # the TPU path (cpu mode's TPUEstimator) throughout

ModeKeys = tfcases.ModeKeys
TRAIN = ModeKeys.TRAIN
numpy_input_fn = tfcases.ESTIMATOR.inputs.numpy_input_fn


# --- 5. features and labels as Python lists ----------------------------------------------------


def _columns(n=12):
    rng = np.random.RandomState(0)
    return {
        "a": rng.rand(n, 3).astype("float32"),
        "b": rng.rand(n, 3).astype("float32"),  # the shape of 'a': a stack would not fail
        "text": np.array([[f"{v:.2f}"] for v in rng.rand(n)]),
        "y1": rng.rand(n, 1).astype("float32"),
        "y2": rng.randint(0, 2, n).astype("float32"),
    }


def _numpy_values():
    c = _columns()
    return [c["a"][:4], c["b"][:4], c["text"][:4]], [c["y1"][:4], c["y2"][:4]]


def _iterator():
    c = _columns()
    ds = tf.data.Dataset.from_tensor_slices(((c["a"], c["b"], c["text"]), (c["y1"], c["y2"])))
    (a, b, text), (y1, y2) = tf.compat.v1.data.make_one_shot_iterator(ds.batch(4)).get_next()
    return [a, b, text], [y1, y2]


def _numpy_input_fn():
    c = _columns()
    x = collections.OrderedDict((k, c[k]) for k in ("a", "b", "text"))
    features, labels = numpy_input_fn(
        x, {"y1": c["y1"], "y2": c["y2"]}, batch_size=4, shuffle=False, num_epochs=1
    )()
    return [features["a"], features["b"], features["text"]], [labels["y1"], labels["y2"]]


def _as_one_list():
    features, labels = _numpy_values()
    return [features, labels]  # (features, labels) as a list: Estimator reads it so


@pytest.mark.parametrize("input_fn", [_numpy_values, _iterator, _numpy_input_fn, _as_one_list])
def test_list_features_and_labels_are_fed_component_by_component(input_fn):
    """tf.data would stack a list into one tensor (a TypeError for [float, float, string], and
    [a, b] of one shape silently one [2, batch, 3] tensor): each list reaches the model as its
    components, in order, as keras_lib reads a list."""
    with tf.Graph().as_default():
        features, labels = tfcases.adapted(input_fn, ModeKeys.EVAL, {"batch_size": 4}).element_spec
    features = _padding.split_padding(features)[0]
    assert [(s.shape.as_list(), s.dtype) for s in features] == [
        ([4, 3], tf.float32),
        ([4, 3], tf.float32),
        ([4, 1], tf.string),
    ]
    assert [s.shape.as_list() for s in labels] == [[4, 1], [4]]


def test_a_list_of_other_than_two_is_stocks_error():
    with pytest.raises(ValueError) as stock:
        estimator_util.parse_iterator_result([1, 2, 3])
    with tf.Graph().as_default(), pytest.raises(ValueError) as shim:
        tfcases.adapted(lambda: [np.ones([4, 1])] * 3, TRAIN, {"batch_size": 4})
    assert str(shim.value) == str(stock.value)


# --- 6. padding rows the model accepts -------------------------------------------------------


def test_padding_rows_copy_a_real_row_of_every_dtype():
    """A model's tf.strings.to_number fails on "", a lookup without OOV buckets on an unknown id,
    a log gives -inf (NaN once weighted 0): short batches are padded with copies of a real row."""
    ids = np.array([[7], [9], [8], [5], [6]], "int64")
    text = np.array([["1.5"], ["2"], ["3"], ["4"], ["5"]])
    size = np.array([3.0, 4.0, 5.0, 6.0, 7.0], "float32")
    ds = tf.data.Dataset.from_tensor_slices(({"ids": ids, "text": text, "size": size}, ids[:, 0]))
    padded = list(_batching.fit_batches(ds.batch(3), 3, ModeKeys.EVAL).as_numpy_iterator())
    last, label = padded[-1]
    features = last[_padding.FEATURES_KEY]
    assert last[_padding.PADDING_KEY].tolist() == [1, 1, 0]
    assert features["ids"][:, 0].tolist() == [5, 6, 5]
    assert features["text"][:, 0].tolist() == [b"4", b"5", b"4"]
    assert features["size"].tolist() == [6.0, 7.0, 6.0]
    assert label.tolist() == [5, 6, 5]


# --- 7. lookup tables in the input_fn's own graph ----------------------------------------------

WORDS = ["good", "bad", "fine", "poor"]
# 24 texts in batches of 8: a batch size the graph does not declare is read, and re-batched by it
# (as tpushim does then) they are stock's batches still.
TEXTS = [" ".join(WORDS[(i + k) % 4] for k in range(1 + i % 3)) for i in range(24)]


def _lookup_input_fn(vocab_file, kind, batch=8, hide_batch=False):
    """Ids looked up outside any Dataset.map -- from a vocabulary file, a StaticHashTable or a
    vocabulary-list feature column -- and sliced into a Dataset."""

    def input_fn():
        split = tf.compat.v1.string_split(tf.constant(TEXTS))
        if kind == "vocabulary-file":
            table = tf.lookup.StaticVocabularyTable(
                tf.lookup.TextFileInitializer(
                    vocab_file,
                    tf.string,
                    tf.lookup.TextFileIndex.WHOLE_LINE,
                    tf.int64,
                    tf.lookup.TextFileIndex.LINE_NUMBER,
                ),
                num_oov_buckets=1,
            )
            x = tf.cast(tf.sparse.to_dense(table.lookup(split), default_value=-1) + 1, tf.float32)
        elif kind == "static-hash-table":
            table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(WORDS, tf.constant([1.0, 2.0, 3.0, 4.0])), 0.0
            )
            x = tf.sparse.to_dense(table.lookup(split))
        else:  # a feature column's vocabulary
            column = tf.feature_column.indicator_column(
                tf.feature_column.categorical_column_with_vocabulary_list("words", WORDS)
            )
            x = tf.compat.v1.feature_column.input_layer({"words": split}, [column])
        x = tf.reshape(tf.pad(x, [[0, 0], [0, 4 - tf.shape(x)[1]]]), [len(TEXTS), 4])
        y = np.arange(len(TEXTS), dtype="int64")[:, None] % 3
        ds = tf.data.Dataset.from_tensor_slices(({"hidden_input": x}, y))
        size = tf.compat.v1.placeholder_with_default(tf.constant(batch, tf.int64), [])
        return ds.batch(size if hide_batch else batch)

    return input_fn


@pytest.fixture
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(WORDS) + "\n")
    return str(path)


@pytest.mark.parametrize("kind", ["vocabulary-file", "static-hash-table", "feature-column"])
@pytest.mark.parametrize("hide_batch", [False, True], ids=["declared-batch", "hidden-batch"])
def test_tables_the_input_fn_looks_up_are_initialised_before_tpushim_reads(
    vocab_file, kind, hide_batch
):
    """What tpushim reads before the estimator's session (how long an evaluation is, for a TPU;
    a batch size the graph does not declare) runs the lookup: its tables are initialised first,
    as stock's Scaffold initialises them before its dataset initializer runs."""
    fn = _lookup_input_fn(vocab_file, kind, hide_batch=hide_batch)
    facts = tfcases.input_facts(fn, ModeKeys.EVAL, count=True)
    assert (facts.batch_size, facts.examples, facts.batches) == (8, 24, 3)


@pytest.mark.slow
def test_lookup_outside_the_map_trains_evaluates_and_predicts_as_stock(tmp_path, vocab_file):
    """A batch size the graph does not declare: tpushim reads the first batch and asks whether
    the training input ends, both through the table."""
    fn = _lookup_input_fn(vocab_file, "vocabulary-file", hide_batch=True)
    features_only = lambda: fn().map(lambda x, y: x)
    tfcases.compare(tmp_path, tfcases.sequential, lambda: fn().repeat(), fn, features_only)


# --- 8. a global batch that does not divide among the cores ------------------------------------


def _padded_to_the_cores(input_fn, batch, cores=8):
    """``input_fn``'s batches as a TPU of ``cores`` cores gets them: padded to the next multiple
    of ``cores`` with zero-weight rows (tpushim's padding, given to cpu mode's model_fn)."""
    padded = -(-batch // cores) * cores
    return lambda: _batching.fit_batches(input_fn(), batch, TRAIN, padded_to=padded)


def _sample_weighted(batch):
    features, labels = tfcases.two_in_two_out_data(n=3 * batch, sample_weights=True)
    return lambda: tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch).repeat()


@pytest.mark.slow
def test_a_padded_global_batch_trains_as_stocks_with_sample_weights(tmp_path):
    """Stock's batches of 20, padded to 24 for 8 cores (cpu mode, one shard): every loss term
    weighs the padding out, so training equals stock's on the 20 rows."""
    fn = _sample_weighted(20)
    stock = tfcases.run("off", tfcases.two_in_two_out, fn, None, None, tmp_path / "stock")
    shim = tfcases.run(
        "cpu", tfcases.two_in_two_out, _padded_to_the_cores(fn, 20), None, None, tmp_path / "shim"
    )
    tfcases.assert_same(stock, shim)


def _batchnorm_model():
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(8, input_shape=(4,), name="hidden"),
            tf.keras.layers.BatchNormalization(name="norm"),
            tf.keras.layers.Dense(3, activation="softmax", name="probs"),
        ]
    )
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy")
    return model


@pytest.mark.slow
def test_a_padded_global_batch_trains_batchnorm_as_stocks(tmp_path):
    """With BatchNormalization: its statistics over the real rows only (#24 item 1)."""
    pytest.importorskip("tpushim._batchnorm", reason="BatchNormalization with padding: #24 item 1")
    x, y = tfcases.data(n=60)
    fn = lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(20).repeat()
    stock = tfcases.run("off", _batchnorm_model, fn, None, None, tmp_path / "stock")
    shim = tfcases.run(
        "cpu", _batchnorm_model, _padded_to_the_cores(fn, 20), None, None, tmp_path / "shim"
    )
    tfcases.assert_same(stock, shim)


# --- 10. shapes the model declares --------------------------------------------------------------


def _spec(*shape, dtype=tf.float32):
    return tf.TensorSpec([None, *shape], dtype)


def _two_inputs():
    a = tf.keras.Input((8, 8, 3), name="a")
    b = tf.keras.Input((None, 4), name="b")  # variable length: only the last dimension declared
    return tf.keras.Model(
        [a, b],
        tf.keras.layers.Concatenate()(
            [tf.keras.layers.Flatten()(a), tf.keras.layers.GlobalAveragePooling1D()(b)]
        ),
    )


@pytest.mark.parametrize(
    "features,completed",
    [
        ({"a": _spec(8, 8, None), "b": _spec(None, None)}, {"a": [8, 8, 3], "b": [None, 4]}),
        ((_spec(8, None, 3), _spec(5, None)), {"[0]": [8, 8, 3], "[1]": [5, 4]}),
        (
            {"features": {"a": _spec(None, 8, 3), "b": _spec(2, 4)}, "sample_weights": _spec()},
            {"a": [8, 8, 3]},
        ),
        ({"a": _spec(8, 8, 1), "b": _spec(None, 4), "c": _spec(None)}, {}),  # disagrees, declared
        ({"x": _spec(None, None, None), "y": _spec(None, 4)}, {}),  # names the model does not have
        ((_spec(None, None, None),), {}),  # one of two inputs: nothing matched
    ],
    ids=["dict", "tuple", "sample-weights", "nothing-to-add", "other-names", "other-length"],
)
def test_features_take_the_shapes_the_model_declares(features, completed):
    """Matched as keras_lib matches features to inputs: a dict by name, a list or tuple by
    position; only unknown dimensions are filled, and a shape the model disagrees with is left
    for the model to refuse, as stock's does."""
    inputs = _shapes.ModelInputs.of(_two_inputs())
    found = _shapes.completions((features, tf.TensorSpec([None], tf.int64)), inputs)
    got = {c.where.split(" ", 1)[1].strip("'"): c.completed.as_list()[1:] for c in found}
    assert got == completed


def test_a_single_tensor_takes_the_single_inputs_shape():
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(5,))])
    found = _shapes.completions(_spec(None), _shapes.ModelInputs.of(model))
    assert [(c.where, c.input_name, c.completed.as_list()) for c in found] == [
        ("features (a single tensor)", model.input_names[0], [None, 5])
    ]
    assert _shapes.ModelInputs.of(tfcases.Subclassed()) is None  # declares nothing: left alone
