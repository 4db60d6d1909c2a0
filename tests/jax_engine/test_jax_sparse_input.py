"""A ``SparseTensor`` model input on the JAX engine (``Input(sparse=True)``): made dense on the
host at a size known statically, for a ``CategoryEncoding`` (multi_hot, count: the layer itself
runs on the host) and a ``Dense`` reading it; trained, evaluated and predicting as stock's
estimator (the stock path of the same TensorFlow, in the same process, and stock 2.15's
recorded numbers) on 8 XLA CPU devices with a short padded batch, beside a ``Lambda`` of
weight-free sparse ops (``sparse_dense_matmul`` by a constant, ``reduce_sum``, ``to_dense``)
that runs on the host too. What stays out of reach (a sparse output) is refused when the model is converted, before
anything is written, naming the input, the layer and the op."""

import jax_scripts
import numpy as np
import pytest
import sparse_program
from jax_scripts import eight_devices, scripts_started  # noqa: F401 (scripts_started: the scripts' run, in the background)

pytestmark = pytest.mark.jax

jax = eight_devices()

import tensorflow as tf

from tpushim import ConversionError


@pytest.mark.parametrize(
    "reader, op",
    [
        ("count_sparse_output", "CategoryEncoding 'enc': SparseCountSparseOutput"),
        ("lambda", "Lambda 'enc': SparseReorder, its output a SparseTensor"),
    ],
)
def test_a_sparse_input_a_reader_cannot_take_dense_is_refused_naming_the_op_and_layer(
    tmp_path, reader, op
):
    import tpushim

    ids = tf.keras.Input((4,), sparse=True, dtype=tf.int64, name="ids")
    if reader == "lambda":  # its output sparse: the next layer would read it on the devices
        encoded = tf.keras.layers.Lambda(
            lambda s: tf.sparse.reorder(tf.cast(s, tf.float32)), name="enc"
        )(ids)
        encoded = tf.keras.layers.Lambda(lambda s: tf.reshape(tf.sparse.to_dense(s), [-1, 4]))(
            encoded
        )
    else:
        encoded = tf.keras.layers.CategoryEncoding(5, output_mode="count", sparse=True, name="enc")(
            ids
        )
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="y")(encoded))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    rows = np.array([[0, 3, 1, 0], [2, 2, 4, 1]] * 4, np.int64)

    def input_fn():
        features = {"ids": tf.sparse.from_dense(tf.constant(rows))}
        return tf.data.Dataset.from_tensor_slices((features, np.ones([8, 1], np.float32))).batch(4)

    model_dir = str(tmp_path / reader)
    patched = tpushim.patched(quiet=True, mode="cpu", engine="jax")
    with pytest.raises(ConversionError) as refused, patched:
        estimator = tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=model_dir)
        estimator.train(input_fn)
    said = str(refused.value)
    assert "'ids' is a SparseTensor" in said and op in said, said
    assert "Nothing was written" in said
    assert tf.train.latest_checkpoint(model_dir) is None


CODE = """
import json, os, sys
import contextlib
sys.path.insert(0, os.path.join(sys.argv[3], "tests"))
import tpushim; tpushim.patch()
import numpy as np, tensorflow as tf
import sparse_program
feats, y = sparse_program.features()
input_fn = sparse_program.input_fn()
out = {}
for run, scope in (("engine", dict(mode="cpu", engine="jax")), ("stock", None))[int(sys.argv[2]):]:
    model = sparse_program.model()
    config = tf.estimator.RunConfig(model_dir=os.path.join(sys.argv[1], run), tf_random_seed=1)
"""
CODE += jax_scripts.TRAINED_AS_STOCKS.replace("FEATURES", "feats()")


def test_sparse_inputs_into_category_encoding_dense_and_a_lambda_train_evaluate_predict_as_stock(
    tmp_path,
):
    got = jax_scripts.program_result(CODE, tmp_path, "0", jax_scripts.ROOT)
    jax_scripts.trained_as_stock(
        got, 6, 27, sparse_program.STOCK_2_15, sparse_program.STOCK_2_15_PREDICTIONS
    )


class SparseReader(tf.keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.out = tf.keras.layers.Dense(1)

    def call(self, features):
        return self.out(tf.sparse.to_dense(features["x"]) + features["z"])


def test_a_subclassed_model_on_a_sparse_feature_is_refused_naming_it_before_anything_is_written(
    tmp_path,
):
    """The subclassed model's call is one layer: the engine cannot make its sparse input dense
    on the host for it (stock trains it; the engine refuses it at the first batch, naming the
    feature)."""
    import tpushim

    model = SparseReader()
    model.compile(tf.keras.optimizers.SGD(0.1), "mse")
    x = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]] * 4, np.float32)

    def input_fn():
        features = {"x": tf.sparse.from_dense(x), "z": x}
        return tf.data.Dataset.from_tensor_slices((features, np.ones([8, 1], np.float32))).batch(4)

    model_dir = tmp_path / "subclassed"
    with tpushim.patched(quiet=True, mode="cpu", engine="jax"):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=model, model_dir=str(model_dir), checkpoint_format="saver"
        )
    with pytest.raises(ConversionError) as refused:
        estimator.train(input_fn)
    said = str(refused.value)
    assert "subclassed model on a SparseTensor feature ('x')" in said, said
    assert "Nothing was written" in said
    assert not model_dir.exists() or not list(model_dir.iterdir())
