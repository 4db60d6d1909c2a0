"""A ``SparseTensor`` model input on the JAX engine (``Input(sparse=True)`` into a
``CategoryEncoding``, multi_hot or count, its output dense or ``sparse=True``): refused when the
model is converted, before anything is written, naming the input, the layer and the op it would
run (``SparseBincount`` / ``SparseCountSparseOutput``); it failed on the first batch with numpy's
"inhomogeneous shape" before."""

import numpy as np
import pytest
from jax_scripts import eight_devices, scripts_started  # noqa: F401 (scripts_started: the scripts' run, in the background)

pytestmark = pytest.mark.jax

jax = eight_devices()

import tensorflow as tf

from tpushim import ConversionError


@pytest.mark.parametrize(
    "mode, sparse, op",
    [("multi_hot", False, "SparseBincount"), ("count", True, "SparseCountSparseOutput")],
)
def test_a_sparse_input_into_category_encoding_is_refused_naming_the_op_and_layer(
    tmp_path, mode, sparse, op
):
    import tpushim

    ids = tf.keras.Input((4,), sparse=True, dtype=tf.int64, name="ids")
    encoded = tf.keras.layers.CategoryEncoding(5, output_mode=mode, sparse=sparse, name="enc")(ids)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, name="y")(encoded))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    rows = np.array([[0, 3, 1, 0], [2, 2, 4, 1]] * 4, np.int64)

    def input_fn():
        features = {"ids": tf.sparse.from_dense(tf.constant(rows))}
        return tf.data.Dataset.from_tensor_slices((features, np.ones([8, 1], np.float32))).batch(4)

    model_dir = str(tmp_path / mode)
    patched = tpushim.patched(quiet=True, mode="cpu", engine="jax")
    with pytest.raises(ConversionError) as refused, patched:
        estimator = tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=model_dir)
        estimator.train(input_fn)
    said = str(refused.value)
    assert "'ids' is a SparseTensor" in said and f"CategoryEncoding 'enc': {op}" in said, said
    assert "Nothing was written" in said
    assert tf.train.latest_checkpoint(model_dir) is None
