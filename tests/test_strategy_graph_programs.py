"""The strategy engine for programs in graph mode (#33): a Keras model built and converted in a
graph (``with tf.Graph().as_default()``, as ``tf.compat.v1.disable_v2_behavior()`` makes every
program's) trains, evaluates and predicts on the engine's eager runtime with stock's numbers,
and the program's graph is its own again after every call (and between two predictions).

In this process: ``disable_v2_behavior()`` itself is for the whole process; the legacy script
``census_numpy_tf1.py`` proves it (tests/test_scripts.py, tests/test_tf216_engine.py), and
tests/strategy_proof.py does on 8 replicas.
"""

import numpy as np
import pytest
import tensorflow as tf
import tfcases

from tpushim import _strategy
from tpushim._errors import ConversionError

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
    assert isinstance(engine[0], _strategy.StrategyEstimator)
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


@pytest.mark.slow
def test_lookup_tables_in_a_graph_programs_input_fn_are_refused_in_words(tmp_path):
    """A table made in the input_fn's graph (stock's session initialises it) is refused, naming
    the lookup, before any checkpoint of the call is written."""
    x, y = tfcases.data()

    def input_fn():
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(["a", "b"], [0, 1]), default_value=-1
        )
        shift = tf.cast(table.lookup(tf.constant("b")), tf.float32)
        return tf.data.Dataset.from_tensor_slices((x + shift, y)).batch(8)

    with tf.Graph().as_default():
        model = sequential()
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
        estimator = tfcases.convert(tmp_path / "m", model, patch=ENGINE, config=config)
        with pytest.raises(ConversionError, match="looks up values in lookup tables"):
            estimator.train(input_fn, steps=2)
        assert not tf.executing_eagerly()
    assert tf.train.latest_checkpoint(str(tmp_path / "m")) is None
