"""``SparseTensor`` model inputs (``Input(sparse=True)``) on the strategy engine and the
TPUEstimator path (tpushim/_sparse_inputs.py): no TPU is fed a SparseTensor, so a
``CategoryEncoding`` (multi_hot, count) and a ``Lambda`` of weight-free sparse ops reading one
run on the host, in the input pipeline, and a ``Dense`` reading one gets it made dense there at
its static width. The sparse-input program every engine's tests train
(tests/sparse_program.py: 27 rows in batches of 8, the last of 3, padded), trained,
evaluated and predicting in ``--mode cpu`` as stock: its weights as live stock's on TF 2.15,
its metrics and first predictions as stock 2.15's recorded ones everywhere, within 1e-5. A
reader the engines cannot take is refused at conversion, naming the input, the layer and what
to do, before anything is written."""

import os

import numpy as np
import pytest
import sparse_program
import tfcases

pytestmark = pytest.mark.slow


def _trained(model_dir, patch):
    import tensorflow as tf

    import tpushim

    features, _ = sparse_program.features()
    input_fn = sparse_program.input_fn()
    model = sparse_program.model()
    config = tfcases.ESTIMATOR.RunConfig(model_dir=str(model_dir), tf_random_seed=1)
    with tpushim.patched(quiet=True, **patch):
        estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
    estimator.train(input_fn, steps=4)
    metrics = estimator.evaluate(input_fn)
    predictions = estimator.predict(lambda: tf.data.Dataset.from_tensor_slices(features()).batch(8))
    return (
        {k: float(v) for k, v in metrics.items()},
        [float(p["y"][0]) for p in predictions],
        tfcases.checkpoint_values(str(model_dir)),
    )


@pytest.fixture()
def stock(tmp_path_factory):
    """Stock's estimator live (TF 2.15), or None (TF >= 2.16: its recorded numbers)."""
    if tfcases.TF_VERSION >= (2, 16):
        return None
    return _trained(tmp_path_factory.mktemp("stock") / "stock", {"mode": "off"})


def _as_stock(got, stock):
    metrics, predictions, weights = got
    for key, value in sparse_program.STOCK_2_15.items():
        assert abs(metrics[key] - value) < 1e-5, (key, metrics)
    assert len(predictions) == 27
    np.testing.assert_allclose(predictions[:5], sparse_program.STOCK_2_15_PREDICTIONS, atol=1e-5)
    if stock is not None:
        assert stock[0] == pytest.approx(metrics, abs=1e-5)
        np.testing.assert_allclose(predictions, stock[1], atol=1e-5)
        kernels = [k for k in stock[2] if "kernel" in k]
        assert len(kernels) == 3 and set(weights) >= set(stock[2]), sorted(weights)
        for key, value in stock[2].items():
            np.testing.assert_allclose(weights[key], value, atol=1e-5, err_msg=key)


@pytest.mark.tpuestimator
def test_sparse_inputs_train_evaluate_predict_as_stock_on_the_tpuestimator_path(tmp_path, stock):
    _as_stock(_trained(tmp_path / "engine", {"mode": "cpu", "engine": "tpuestimator"}), stock)


def test_sparse_inputs_train_evaluate_predict_as_stock_on_the_strategy_engine(tmp_path):
    """On the newest TensorFlow only (tests/conftest.py's NEWEST_ONLY_TESTS: the same code on
    every TensorFlow), against stock 2.15's recorded numbers."""
    _as_stock(_trained(tmp_path / "engine", {"mode": "cpu", "engine": "strategy"}), None)


@pytest.mark.parametrize(
    "engine", ["strategy", pytest.param("tpuestimator", marks=pytest.mark.tpuestimator)]
)
@pytest.mark.parametrize(
    "reader, said",
    [
        ("momentum", "Dense 'd': ResourceGather (embedding_lookup_sparse)"),
        ("sparse_output", "CategoryEncoding 'enc': SparseCountSparseOutput"),
    ],
)
def test_a_sparse_input_the_engine_cannot_take_is_refused_before_anything_is_written(
    tmp_path, engine, reader, said
):
    """A ``Dense`` whose optimizer's sparse update differs from its dense one (a legacy
    momentum: stock moves only the rows the batch gives), and a reader with a sparse output."""
    import tensorflow as tf

    import tpushim

    if reader == "momentum":
        model = sparse_program.model(tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9))
    else:
        ids = tf.keras.Input((4,), sparse=True, dtype=tf.int64, name="ids")
        encoded = tf.keras.layers.CategoryEncoding(5, "count", sparse=True, name="enc")(ids)
        model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(encoded))
        model.compile("sgd", "mse")
    model_dir = tmp_path / "refused"
    with (
        pytest.raises(tpushim.ConversionError) as refused,
        tpushim.patched(quiet=True, mode="cpu", engine=engine),
    ):
        tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=str(model_dir))
    message = str(refused.value)
    assert "is a SparseTensor read by" in message and said in message, message
    assert "tf.sparse.to_dense" in message and "Nothing was written" in message
    assert not os.path.exists(model_dir)


@pytest.mark.parametrize(
    "engine", ["strategy", pytest.param("tpuestimator", marks=pytest.mark.tpuestimator)]
)
def test_a_subclassed_model_on_a_sparse_feature_is_refused_before_anything_is_written(
    tmp_path, engine
):
    """Stock trains a subclassed model whose call reads a SparseTensor feature; its call would
    read it on the devices, which no TPU is fed: refused at train(), naming the feature and
    what to do, before anything is written (it failed in the padding with TensorFlow's raw
    ``Failed to convert elements of SparseTensor``)."""
    import tensorflow as tf

    import tpushim

    model = sparse_program.subclassed_model()
    model_dir = tmp_path / "refused"
    with tpushim.patched(quiet=True, mode="cpu", engine=engine):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=model, model_dir=str(model_dir), checkpoint_format="saver"
        )
    converted = sorted(os.listdir(model_dir)) if os.path.exists(model_dir) else None
    with pytest.raises(tpushim.ConversionError) as refused:
        estimator.train(sparse_program.input_fn(), steps=1)
    message = str(refused.value)
    assert "does not feed the SparseTensor feature 'ids' to the TPU" in message, message
    assert "build the model functional" in message and "tf.sparse.to_dense" in message
    assert "Nothing was written" in message
    assert converted is None, converted  # the conversion wrote nothing, as stock's (no folder)
    assert (sorted(os.listdir(model_dir)) if os.path.exists(model_dir) else None) == converted
