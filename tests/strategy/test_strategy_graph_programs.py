"""The strategy engine for programs in graph mode (#33): a Keras model built and converted in a
graph (``with tf.Graph().as_default()``, as ``tf.compat.v1.disable_v2_behavior()`` makes every
program's) trains, evaluates and predicts on the engine's eager runtime with stock's numbers,
and the program's graph is its own again after every call (and between two predictions).

In this process: ``disable_v2_behavior()`` itself is for the whole process; the legacy script
``census_numpy_tf1.py`` proves it (tests/tpuestimator/test_scripts.py, tests/estimator_api/test_estimator_api_scripts.py), and
tests/strategy_proof.py does on 8 replicas.
"""

import numpy as np
import pytest
import tensorflow as tf
import tfcases

from tpushim._errors import ConversionError
from tpushim._strategy import estimator as _strategy_estimator
from tpushim._strategy import input as _strategy_input

ENGINE = {"mode": "cpu", "engine": "strategy", "quiet": True}
STOCK = {"mode": "off"}


def sequential():
    return tfcases.sequential(clear_session=False)


def functional_tf1_optimizer():
    """tfcases.two_in_two_out("tf1-momentum") less its RootMeanSquaredError object: in a
    program's graph stock names that metric reg_reg_reg_reg_root_mean_squared_error, the engine
    reg_root_mean_squared_error (not matched yet)."""
    a = tf.keras.Input((4,), name="a")
    b = tf.keras.Input((2,), name="b")
    h = tf.keras.layers.Dense(6, activation="tanh", name="h")(tf.keras.layers.Concatenate()([a, b]))
    cls = tf.keras.layers.Dense(3, activation="softmax", name="cls")(h)
    reg = tf.keras.layers.Dense(1, name="reg")(h)
    model = tf.keras.Model({"a": a, "b": b}, {"cls": cls, "reg": reg})
    model.compile(
        optimizer=tfcases.OPTIMIZERS["tf1-momentum"](),
        loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
        loss_weights={"cls": 1.0, "reg": 0.5},
        metrics={"cls": ["accuracy"], "reg": ["mae"]},
    )
    return model


def in_a_graph(patch, model_dir, build, train_fn, eval_fn, predict_fn, before=None):
    """Builds, converts, trains 6 steps, evaluates and predicts in a graph of the program's own,
    checking after each call that the graph is the default again and runs in a session."""
    graph = tf.Graph()

    def still_the_programs():
        assert not tf.executing_eagerly()
        assert tf.compat.v1.get_default_graph() is graph
        with tf.compat.v1.Session() as session:  # later TF1 code of the program still runs
            assert session.run(tf.constant(2) + 1) == 3

    with graph.as_default():
        # Python's, numpy's and the graph's seeds: Keras draws an unseeded initializer's seed
        # from numpy, and stock's first checkpoint initialises a clone of its own.
        tf.keras.utils.set_random_seed(0)
        model = build()
        if before is not None:
            before(model)
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
        estimator = tfcases.convert(model_dir, model, patch=patch, config=config)
        estimator.train(train_fn, steps=6)
        still_the_programs()
        metrics = estimator.evaluate(eval_fn)
        still_the_programs()
        predictions = []
        for prediction in estimator.predict(predict_fn):
            assert not tf.executing_eagerly()  # the caller's code between two predictions
            predictions.append(prediction)
        still_the_programs()
        assert not model._is_graph_network or model.get_weights()  # its v1 classes kept
    return estimator, metrics, predictions, tfcases.checkpoint_values(model_dir)


def compare(tmp_path, build, train_fn, eval_fn, predict_fn, before=None):
    stock = in_a_graph(STOCK, tmp_path / "stock", build, train_fn, eval_fn, predict_fn, before)
    engine = in_a_graph(ENGINE, tmp_path / "engine", build, train_fn, eval_fn, predict_fn, before)
    assert isinstance(engine[0], _strategy_estimator.StrategyEstimator)
    tfcases.assert_same(stock, engine)
    return stock, engine


def compare_sequential(tmp_path, before=None):
    """:func:`compare` for the Sequential model on Dataset input (train repeated)."""
    x, y = tfcases.data()
    train, once, features = (
        tfcases.dataset_input_fn(x, y, repeat=True),
        tfcases.dataset_input_fn(x, y),
        tfcases.dataset_input_fn(x),
    )
    return compare(tmp_path, sequential, train, once, features, before)


@pytest.mark.slow
def test_sequential_with_dataset_input_in_a_graph_equals_stock(tmp_path):
    """Weights never initialised in the program's session: stock starts from its first
    checkpoint's clone (seeded with tf_random_seed), and so does the engine."""
    compare_sequential(tmp_path)


@pytest.mark.slow
def test_functional_with_numpy_input_and_a_tf1_optimizer_in_a_graph_equals_stock(tmp_path):
    features, labels = tfcases.two_in_two_out_data()
    numpy_input_fn = tfcases.ESTIMATOR.inputs.numpy_input_fn

    def fn(y, epochs):
        return numpy_input_fn(
            features, y, batch_size=tfcases.BATCH, num_epochs=epochs, shuffle=False
        )

    compare(tmp_path, functional_tf1_optimizer, fn(labels, None), fn(labels, 1), fn(None, 1))


def reading_dimensions():
    """A Lambda and a loss function that read a shape's ``.value``, as TF1 code does: where the
    program disabled v2 behaviour its shapes hold Dimensions, also in the engine's clone."""

    def halves(t):
        n = t.shape[1].value
        return tf.concat([t[:, : n // 2] * 2.0, tf.reduce_mean(t[:, n // 2 :], 1, True)], 1)

    def loss(y_true, y_pred):
        classes = y_pred.shape[-1].value
        scale = float(classes) / 3.0
        return tf.keras.losses.sparse_categorical_crossentropy(y_true, y_pred) * scale

    x = tf.keras.Input((4,), name="x")
    probs = tf.keras.layers.Dense(3, activation="softmax", name="probs")(
        tf.keras.layers.Lambda(halves, name="halves")(x)
    )
    model = tf.keras.Model(x, probs)
    model.compile(
        tf.keras.optimizers.legacy.SGD(0.1), loss, metrics=["sparse_categorical_accuracy"]
    )
    return model


@pytest.fixture
def v1_shapes():
    """The program's TensorShape as ``disable_v2_behavior()`` makes it (Dimensions), for one
    test (it is a process-wide switch)."""
    tf.compat.v1.disable_v2_tensorshape()
    try:
        yield
    finally:
        tf.compat.v1.enable_v2_tensorshape()


@pytest.mark.slow
def test_a_lambda_and_a_loss_reading_dimensions_equal_stock(tmp_path, v1_shapes):
    """The engine's eager clone runs a graph program's Lambda functions and loss functions with
    the program's TensorShape (``shape[1].value``), as stock's graph does."""
    x, y = tfcases.data()
    compare(
        tmp_path,
        reading_dimensions,
        tfcases.dataset_input_fn(x, y, repeat=True),
        tfcases.dataset_input_fn(x, y),
        tfcases.dataset_input_fn(x),
    )


@pytest.mark.slow
def test_negative_control_a_lambda_seeing_the_engines_shapes_fails(
    tmp_path, v1_shapes, monkeypatch
):
    """Without :func:`tpushim._tfprivate.graph.in_programs_shapes` the Lambda reads an int."""
    from tpushim import _tfprivate

    monkeypatch.setattr(_tfprivate.graph, "in_programs_shapes", lambda fn: fn)
    x, y = tfcases.data()
    with pytest.raises(AttributeError, match="has no attribute 'value'"):
        in_a_graph(ENGINE, tmp_path, reading_dimensions, *[tfcases.dataset_input_fn(x, y)] * 3)


@pytest.mark.slow
def test_warm_start_from_the_weights_in_the_programs_session(tmp_path):
    """Weights the program set in its Keras session are where both start (stock reads them from
    that session into its first checkpoint), not a fresh clone's."""

    def set_weights(model):
        rng = np.random.RandomState(11)
        model.set_weights([rng.uniform(-0.5, 0.5, w.shape) for w in model.get_weights()])

    compare_sequential(tmp_path, before=set_weights)
    rng = np.random.RandomState(11)
    first = rng.uniform(-0.5, 0.5, (4, 8)).astype(np.float32)
    start = tf.train.load_checkpoint(str(tmp_path / "engine" / "model.ckpt-0"))
    np.testing.assert_allclose(
        start.get_tensor("layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"), first, atol=1e-6
    )


WORDS = ["good", "bad", "fine", "awful"]


def lookup_input_fns(vocabulary_file):
    """Input_fns that look up in tables of the input_fn's graph, as the legacy scripts do: a
    vocabulary file's table in a ``Dataset.map`` (an initializable iterator, its initializer in
    TABLE_INITIALIZERS) and a hash table outside any Dataset, whose ids ``from_tensor_slices``
    holds. Stock's session initialises both; the engine's own session (see
    tpushim._strategy.input._initialise_tables) must, or it looks up in empty tables."""
    x, y = tfcases.data()
    rng = np.random.RandomState(3)
    words = [str(w) for w in rng.choice(WORDS + ["unknown"], len(x))]
    classes = ["c0", "c1", "c2"]
    names = [classes[int(c)] for c in y[:, 0]]

    def make(labels, repeat=False, iterator=False):
        def input_fn():
            vocabulary = tf.lookup.StaticVocabularyTable(
                tf.lookup.TextFileInitializer(
                    str(vocabulary_file),
                    tf.string,
                    tf.lookup.TextFileIndex.WHOLE_LINE,
                    tf.int64,
                    tf.lookup.TextFileIndex.LINE_NUMBER,
                ),
                num_oov_buckets=1,
            )
            classes_table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(classes, [0, 1, 2], value_dtype=tf.int64),
                default_value=-1,
            )

            def features(x, word):
                shift = tf.cast(vocabulary.lookup(word), tf.float32) * 0.5
                return x + shift

            # Outside any Dataset, and after its table's initializer: stock's scaffold runs the
            # table initializers and the iterator's as one group, in no order (a race stock's
            # estimator API lost in a CI run: "Table not initialized").
            initializers = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)
            with tf.control_dependencies(initializers):
                ids = classes_table.lookup(tf.constant(names))[:, None]
            if labels:
                ds = tf.data.Dataset.from_tensor_slices(((x, words), ids))
                ds = ds.map(lambda xw, label: (features(*xw), label))
            else:
                ds = tf.data.Dataset.from_tensor_slices((x, words)).map(features)
            if repeat:
                ds = ds.shuffle(len(x), seed=1).repeat()
            ds = ds.batch(tfcases.BATCH)
            if not iterator:
                return ds
            it = tf.compat.v1.data.make_initializable_iterator(ds)
            tables = tf.compat.v1.GraphKeys.TABLE_INITIALIZERS
            with tf.control_dependencies(tf.compat.v1.get_collection(tables)):
                initializer = tf.group(it.initializer)
            tf.compat.v1.add_to_collection(tables, initializer)
            return it.get_next()

        return input_fn

    return make(True, repeat=True), make(True, iterator=True), make(False)


def vocabulary(path, words=WORDS):
    path.write_text("\n".join(words) + "\n")
    return path


@pytest.mark.slow
def test_lookup_tables_in_a_graph_programs_input_fn_equal_stock(tmp_path):
    """Tables made in the input_fn's graph (a vocabulary file looked up in Dataset.map, a hash
    table outside it): the engine initialises them in a session of its own before the pipeline
    moves to its eager runtime, and its numbers are stock's (a shuffle's order too)."""
    compare(tmp_path, sequential, *lookup_input_fns(vocabulary(tmp_path / "vocab.txt")))


def eagerly(patch, model_dir, train_fn, eval_fn, predict_fn):
    """As :func:`in_a_graph`, in a TF2 program (eager)."""
    tf.keras.utils.set_random_seed(0)
    model = sequential()
    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
    estimator = tfcases.convert(model_dir, model, patch=patch, config=config)
    estimator.train(train_fn, steps=6)
    metrics = estimator.evaluate(eval_fn)
    predictions = list(estimator.predict(predict_fn))
    return estimator, metrics, predictions, tfcases.checkpoint_values(model_dir)


@pytest.mark.slow
def test_lookup_tables_in_a_tf2_programs_seeded_input_fn_equal_stock(tmp_path):
    """The same input_fns in a TF2 program: with ``tf_random_seed`` the engine builds the
    input_fn in a graph of its own (stock's shuffle order), whose tables its first step found
    uninitialised ("Table not initialized") before the engine initialised them."""
    fns = lookup_input_fns(vocabulary(tmp_path / "vocab.txt"))
    stock = eagerly(STOCK, tmp_path / "stock", *fns)
    engine = eagerly(ENGINE, tmp_path / "engine", *fns)
    assert isinstance(engine[0], _strategy_estimator.StrategyEstimator)
    tfcases.assert_same(stock, engine)


@pytest.mark.slow
def test_negative_control_an_uninitialised_or_other_table_is_told_apart(tmp_path, monkeypatch):
    """The proof above is not vacuous: the engine with tables left uninitialised fails, and a
    table of other keys (the vocabulary's lines swapped) gives other numbers than stock's."""
    fns = lookup_input_fns(vocabulary(tmp_path / "vocab.txt"))
    stock = in_a_graph(STOCK, tmp_path / "stock", sequential, *fns)
    swapped = lookup_input_fns(vocabulary(tmp_path / "swapped.txt", WORDS[::-1]))
    other = in_a_graph(ENGINE, tmp_path / "other", sequential, *swapped)
    with pytest.raises(AssertionError):
        tfcases.assert_same(stock, other)
    monkeypatch.setattr(_strategy_input, "_initialise_tables", lambda graph, session: None)
    with pytest.raises(tf.errors.FailedPreconditionError, match="Table not initialized"):
        in_a_graph(ENGINE, tmp_path / "uninitialised", sequential, *fns)


@pytest.mark.slow
def test_a_table_the_engines_session_cannot_initialise_is_refused_in_words(tmp_path):
    """A table initialised from a variable of the input_fn's graph (stock's session initialises
    the variable first; the engine's does not): refused, naming the table, before any
    checkpoint of the call is written."""
    x, y = tfcases.data()

    def input_fn():
        values = tf.compat.v1.Variable([0, 1], name="values", use_resource=True)
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(["a", "b"], values.read_value()), default_value=-1
        )
        shift = tf.cast(table.lookup(tf.constant("b")), tf.float32)
        return tf.data.Dataset.from_tensor_slices((x + shift, y)).batch(8)

    with tf.Graph().as_default():
        model = sequential()
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
        estimator = tfcases.convert(tmp_path / "m", model, patch=ENGINE, config=config)
        with pytest.raises(ConversionError, match="cannot initialise the lookup tables"):
            estimator.train(input_fn, steps=2)
        assert not tf.executing_eagerly()
    assert tf.train.latest_checkpoint(str(tmp_path / "m")) is None


V1_SCRIPT = """
import json, os, random, sys
import numpy as np
{patch}
import tensorflow as tf
tf.compat.v1.disable_v2_behavior()
random.seed(0); np.random.seed(0); tf.compat.v1.set_random_seed(0)
x = np.random.RandomState(0).normal(size=(300, 4)); y = (x.sum(1) > 0).astype("int64")
inputs = tf.keras.layers.Input(shape=(4,), name="x")
# (seeded initializers: in a graph-mode program Keras's unseeded ones differ run to run)
init = tf.keras.initializers.GlorotUniform
hidden = tf.keras.layers.Dense(8, activation="relu", kernel_initializer=init(1))(inputs)
output = tf.keras.layers.Dense(1, activation="sigmoid", kernel_initializer=init(2))(hidden)
model = tf.keras.Model(inputs, output)
model.compile(tf.compat.v1.train.AdamOptimizer(0.01), "binary_crossentropy", metrics=["accuracy"])
model_dir = sys.argv[1]
estimator = tf.compat.v1.keras.estimator.model_to_estimator(keras_model=model, model_dir=model_dir)

def input_fn(repeat):
    def make():
        dataset = tf.compat.v1.data.Dataset.from_tensor_slices(({{"x": x}}, y))
        dataset = dataset.repeat() if repeat else dataset
        return tf.compat.v1.data.make_one_shot_iterator(dataset.batch(100)).get_next()
    return make

estimator.train(input_fn(True), steps=5)
metrics = estimator.evaluate(input_fn(False))

def serving():
    rows = tf.compat.v1.placeholder(tf.float64, [None, 4])
    return tf.estimator.export.ServingInputReceiver({{"x": rows}}, {{"x": rows}})

path = estimator.export_savedmodel(os.path.join(model_dir, "export"), serving)
with tf.compat.v1.Session(graph=tf.Graph()) as session:
    meta = tf.compat.v1.saved_model.load(session, ["serve"], path)
    signature = meta.signature_def["serving_default"]
    served = session.run(signature.outputs[next(iter(signature.outputs))].name,
                         {{signature.inputs["x"].name: x[:5]}})
out = {{k: float(v) for k, v in metrics.items()}}
out["served"] = [float(v) for v in np.ravel(served)]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_a_v1_api_script_exports_with_export_savedmodel_as_stock(tmp_path):
    """``disable_v2_behavior()``, ``tf.compat.v1.keras.estimator.model_to_estimator``, a one-shot
    iterator's batches of 100 and ``estimator.export_savedmodel(...)``: through the v1 API stock
    returns a v1 Estimator, whose deprecated export exports; the engine's did not
    (``AttributeError: Estimator.export_savedmodel has been deprecated``). Its metrics and the
    SavedModel's outputs are stock's; ``tpushim check`` of the script passes on the engine (its
    reading of the eager input failed in a graph-mode program: "Attempting to capture an
    EagerTensor")."""
    import json

    import procs

    from tpushim import _versions

    results = {}
    for name, patch in (  # stock: tf.estimator (on TensorFlow >= 2.16 tpushim's, stock 2.15's)
        ("stock", "import tpushim; tpushim.patch()" if _versions.uses_own_estimator() else ""),
        ("engine", "import tpushim; tpushim.patch(mode='cpu', engine='strategy', quiet=True)"),
    ):
        proc = procs.python(
            [tmp_path / name], code=V1_SCRIPT.format(patch=patch), env={"TF_USE_LEGACY_KERAS": ""}
        )
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stderr[-3000:]
        results[name] = json.loads(lines[-1][len("RESULT ") :])
    assert set(results["engine"]) == set(results["stock"])
    for key, value in results["stock"].items():
        np.testing.assert_allclose(results["engine"][key], value, atol=1e-5, err_msg=key)

    script = tmp_path / "v1_script.py"
    script.write_text(V1_SCRIPT.format(patch=""))
    proc = procs.python(
        ["-m", "tpushim", "--engine", "strategy", "check", script, tmp_path / "checked"],
        env={"TF_USE_LEGACY_KERAS": ""},
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "preflight-failed" not in proc.stdout
    assert not (tmp_path / "checked").exists()
