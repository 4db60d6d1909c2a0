"""The sparse-input program every engine's tests train (tests/jax_engine/test_jax_sparse_input.py,
tests/strategy/test_strategy_sparse_inputs.py, the JAX pod proof tests/jax_pod_proof.py): a
``SparseTensor`` of ids (absent entries left out) into ``CategoryEncoding`` multi_hot and count,
a ``SparseTensor`` of floats into a ``Dense`` and a ``Lambda`` of weight-free sparse ops, 27 rows
(in batches of 8: the last has 3), and stock 2.15's estimator's numbers on it (its weights in
tests/reference/sparse_program_tf215.json, recorded by ``python tests/sparse_program.py --record
FILE DIR`` in a TF 2.15 venv, DIR an empty model_dir). A helper, not a test module."""

import json
import os
import sys

import numpy as np

ROWS = 27
#: Stock 2.15's estimator on it: trained 4 steps in batches of 8 (``tf_random_seed=1``), evaluated
#: (its stock run alone, TensorFlow 2.15.1)
STOCK_2_15 = {"loss": 1.2350471019744873, "mae": 0.9590683579444885, "global_step": 4.0}
STOCK_2_15_PREDICTIONS = [
    0.6652833223342896,
    0.5243351459503174,
    1.330525279045105,
    1.1119109392166138,
    0.2781793177127838,
]  # its first five


#: Stock 2.15's weights after those 4 steps (every layer's kernel and bias)
RECORD = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "reference", "sparse_program_tf215.json"
)


def stock_weights():
    """{variable: value} of :data:`RECORD` (float64 arrays)."""
    with open(RECORD) as f:
        return {n: np.array(v, np.float64) for n, v in json.load(f)["weights"].items()}


def trained_weights(estimator):
    """Every layer's kernel and bias in ``estimator``'s last checkpoint."""
    return {
        n: np.asarray(estimator.get_variable_value(n), np.float64)
        for n in estimator.get_variable_names()
        if {"kernel", "bias"} & set(n.split("/")) and not n.startswith(("training", "optimizer"))
    }


def features(with_id=False):
    """``(make, labels)``: ``make()`` gives the features' dict of SparseTensors (``with_id``:
    each row's number beside them, as ``"id"``); labels [27, 1]."""
    import tensorflow as tf

    rng = np.random.RandomState(0)
    ids = rng.randint(0, 6, (ROWS, 4)).astype(np.int64)
    ids[rng.rand(ROWS, 4) < 0.4] = -1  # absent entries
    dense_x = (rng.rand(ROWS, 5) * (rng.rand(ROWS, 5) < 0.5)).astype(np.float32)
    y = rng.randn(ROWS, 1).astype(np.float32)

    def sparse(a, absent):
        return tf.SparseTensor(np.argwhere(a != absent), a[a != absent], a.shape)

    def make():
        made = {"ids": sparse(ids, -1), "x": sparse(dense_x, 0)}
        if with_id:
            made["id"] = np.arange(float(ROWS))
        return made

    return make, y


def input_fn(with_id=False):
    """The training and evaluation input_fn: the rows in batches of 8."""
    import tensorflow as tf

    make, y = features(with_id)
    return lambda: tf.data.Dataset.from_tensor_slices((make(), y)).batch(8)


def model(optimizer=None):
    """The model, seeded as the recording's, compiled with ``optimizer`` (SGD(0.1)), mse, mae."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(3)
    layers = tf.keras.layers
    i = tf.keras.Input((4,), name="ids", dtype="int64", sparse=True)
    x = tf.keras.Input((5,), name="x", sparse=True)
    table = np.linspace(-1.0, 1.0, 10, dtype=np.float32).reshape([5, 2])
    ops = layers.Lambda(
        lambda s: tf.concat(
            [
                tf.sparse.sparse_dense_matmul(s, table),
                tf.reshape(tf.sparse.reduce_sum(s, 1), [-1, 1]),
                tf.reshape(tf.sparse.to_dense(s), [-1, 5]),
            ],
            1,
        ),
        name="ops",
    )(x)
    h = layers.Concatenate()(
        [
            layers.CategoryEncoding(6, "multi_hot", name="multi")(i),
            layers.CategoryEncoding(6, "count", name="count")(i),
            layers.Dense(3, name="d")(x),
            ops,
        ]
    )
    h = layers.Dense(4, activation="tanh", name="h")(h)
    made = tf.keras.Model([i, x], layers.Dense(1, name="y")(h))
    made.compile(optimizer or tf.keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    return made


def subclassed_model():
    """A subclassed model whose call reads both sparse features (``tf.sparse.to_dense`` and a
    ``CategoryEncoding``), compiled with SGD(0.1) and mse; stock 2.15 trains it. Not seeded."""
    import tensorflow as tf

    class Subclassed(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.encode = tf.keras.layers.CategoryEncoding(6, "multi_hot")
            self.out = tf.keras.layers.Dense(1)

        def call(self, inputs):
            dense = tf.sparse.to_dense(inputs["x"])
            return self.out(tf.concat([self.encode(inputs["ids"]), dense], 1))

    made = Subclassed()
    made.compile(tf.keras.optimizers.SGD(0.1), "mse")
    return made


def record(path, model_dir):
    """Stock's estimator (TF 2.15) trained 4 steps: its weights into ``path``."""
    import tensorflow as tf

    config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=1)
    estimator = tf.keras.estimator.model_to_estimator(keras_model=model(), config=config)
    estimator.train(input_fn(), steps=4)
    weights = {n: v.tolist() for n, v in trained_weights(estimator).items()}
    with open(path, "w") as f:
        json.dump({"tensorflow": tf.__version__, "weights": weights}, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__" and sys.argv[1:2] == ["--record"]:
    record(sys.argv[2], sys.argv[3])
