"""The ops tf2jax has no JAX for, as tpushim/_jax/_ops.py writes them, against TensorFlow's own
kernels; and ``CategoryEncoding`` (``DenseBincount``) through the estimator: multi_hot, one_hot
and count with ``count_weights``, on 8 XLA CPU devices with a short padded batch, trained,
evaluated and predicting as stock's estimator (the stock path of the same TensorFlow, in the
same process, and stock 2.15's recorded numbers)."""

import jax_scripts
import numpy as np
import pytest
from jax_scripts import ROOT, eight_devices, scripts_started  # noqa: F401 (scripts_started: the scripts' run, in the background)

pytestmark = pytest.mark.jax

jax = eight_devices()

import tensorflow as tf
import tf2jax

from tpushim._jax import _ops

VALUES = np.array([[0, 3, 3, 5], [1, 1, 1, 1], [2, 7, 0, 4]], np.int64)  # 7: beyond 6 bins
WEIGHTS = np.array([[0.5, 1.0, 2.0, 0.25], [1, 2, 3, 4], [0.1, 9, 0.3, 0.7]], np.float32)


@pytest.mark.parametrize(
    "name, fn",
    [
        (
            "multi_hot",
            lambda v, w: tf.math.bincount(
                v, minlength=6, maxlength=6, axis=-1, binary_output=True, dtype=tf.float32
            ),
        ),
        (
            "count",
            lambda v, w: tf.math.bincount(v, minlength=6, maxlength=6, axis=-1, dtype=tf.float32),
        ),
        ("count_weights", lambda v, w: tf.math.bincount(v, w, 6, 6, axis=-1)),
        ("flat", lambda v, w: tf.math.bincount(v, w, 6, 6, axis=0)),
        (
            "raw_bincount",
            lambda v, w: tf.raw_ops.Bincount(arr=tf.cast(v, tf.int32), size=8, weights=w),
        ),
    ],
)
def test_bincount_equals_tensorflows(name, fn):
    traced = tf.function(fn)
    want = traced(VALUES, WEIGHTS).numpy()
    graph = traced.get_concrete_function(VALUES, WEIGHTS).graph
    with _ops.static_bins(graph):
        jax_fn, params = tf2jax.convert(traced, VALUES, WEIGHTS)
    got, _ = jax.jit(jax_fn)(params, VALUES, WEIGHTS)
    assert got.shape == want.shape and want.any()
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)


def test_bincount_whose_bins_the_values_decide_is_refused_naming_it():
    traced = tf.function(lambda v: tf.math.bincount(v, minlength=6, axis=-1))
    graph = traced.get_concrete_function(VALUES).graph
    with _ops.static_bins(graph):
        jax_fn, params = tf2jax.convert(traced, VALUES)
    with pytest.raises(NotImplementedError, match="DenseBincount 'bincount/DenseBincount'"):
        jax.jit(jax_fn)(params, VALUES)  # (eagerly, numpy values give a number)


# Stock 2.15's estimator on CODE (its stock run alone, TensorFlow 2.15.1)
STOCK_2_15 = {"loss": 0.8208001852035522, "mae": 0.8578327298164368, "global_step": 4.0}
STOCK_2_15_PREDICTIONS = [
    -0.45979407,
    -0.03863475,
    0.21199664,
    0.02067003,
    -0.16036633,
]  # its first five

CODE = """
import json, os, sys
import contextlib
import tpushim; tpushim.patch()
import numpy as np, tensorflow as tf
rng = np.random.RandomState(0)
feats = {"ids": rng.randint(0, 6, (27, 4)).astype(np.int64), "w": rng.rand(27, 4).astype(np.float32),
         "one": rng.randint(0, 6, (27, 1)).astype(np.int64)}
y = rng.randn(27, 1).astype(np.float32)  # 27 rows in batches of 8: the last has 3
def input_fn():
    return tf.data.Dataset.from_tensor_slices((feats, y)).batch(8)
out = {}
for run, scope in (("engine", dict(mode="cpu", engine="jax")), ("stock", None))[int(sys.argv[2]):]:
    tf.keras.utils.set_random_seed(3)
    L = tf.keras.layers
    ids = tf.keras.Input((4,), name="ids", dtype="int64")
    w = tf.keras.Input((4,), name="w")
    one = tf.keras.Input((1,), name="one", dtype="int64")
    h = L.Concatenate()([L.CategoryEncoding(6, "multi_hot", name="multi")(ids),
                         L.CategoryEncoding(6, "count", name="count")(ids, count_weights=w),
                         L.CategoryEncoding(6, "one_hot", name="onehot")(one)])
    model = tf.keras.Model([ids, w, one], L.Dense(1, name="y")(L.Dense(4, activation="tanh", name="h")(h)))
    model.compile(tf.keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    config = tf.estimator.RunConfig(model_dir=os.path.join(sys.argv[1], run), tf_random_seed=1)
"""
CODE += jax_scripts.TRAINED_AS_STOCKS.replace("FEATURES", "feats")


def test_category_encoding_trains_evaluates_and_predicts_as_stock(tmp_path):
    got = jax_scripts.program_result(CODE, tmp_path, "0")
    jax_scripts.trained_as_stock(got, 4, 27, STOCK_2_15, STOCK_2_15_PREDICTIONS)
