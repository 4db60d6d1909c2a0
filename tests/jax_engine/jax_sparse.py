"""An Embedding's table trained by every optimizer whose sparse update differs from its dense
one (and Adam, whose does not; and SGD's momentum on a table a regularizer reads whole, whose
gradient stock makes dense), and stock's numbers for them: a helper of
tests/jax_engine/test_jax_sparse.py, not a test module.

``Embedding(20, 4)`` over 3 ids a row -> ``Flatten`` -> ``Dense(1)``, 27 rows in global batches
of 8: 3 full batches and a short one of 3 rows, which the engine pads to 8 with rows of zeros
(ids 0). Each batch looks up some of the 20 rows; row 0 is looked up by the first batch alone,
so a padding row counted as a lookup would move its momentum.

Stock is the stock estimator on TensorFlow 2.15 (``model_to_estimator``, ``saver`` checkpoints,
one epoch of the input): recorded by

    python tests/jax_engine/jax_sparse.py --record tests/reference/jax_sparse_tf215.json

in a TF 2.15 venv: every weight's starting and final value by its Keras name.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

ROWS, BATCH, VOCAB = 27, 8, 20
HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(os.path.dirname(HERE), "reference", "jax_sparse_tf215.json")

rng = np.random.RandomState(0)
IDS = rng.randint(1, VOCAB, (ROWS, 3)).astype(np.int64)
IDS[0, 0] = 0  # row 0 of the table: looked up by the first batch alone
Y = rng.randn(ROWS, 1).astype(np.float32)

k = tf.keras.optimizers.legacy
OPTIMIZERS = {
    "sgd_momentum": lambda: k.SGD(0.1, momentum=0.9),
    "sgd_nesterov": lambda: k.SGD(0.1, momentum=0.9, nesterov=True),
    "rmsprop_momentum": lambda: k.RMSprop(0.01, momentum=0.5, centered=True),
    "adamax": lambda: k.Adamax(0.05),
    "adadelta": lambda: k.Adadelta(5.0),
    "ftrl": lambda: k.Ftrl(0.5, l1_regularization_strength=0.001),
    "v1_momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    "adam": lambda: k.Adam(0.05),  # its sparse update is its dense one
    # a regularizer reads the whole table: stock's gradient is dense, every row's momentum moves
    "sgd_momentum_regularized": lambda: k.SGD(0.1, momentum=0.9),
}
NAMES = tuple(OPTIMIZERS)


def model(name):
    """The compiled model, its weights from seed 1."""
    tf.keras.utils.set_random_seed(1)
    x = tf.keras.Input((3,), dtype="int64", name="x")
    regularizer = tf.keras.regularizers.l2(0.01) if name.endswith("_regularized") else None
    h = tf.keras.layers.Embedding(VOCAB, 4, embeddings_regularizer=regularizer, name="emb")(x)
    h = tf.keras.layers.Flatten(name="flat")(h)
    m = tf.keras.Model(x, tf.keras.layers.Dense(1, name="out")(h))
    m.compile(OPTIMIZERS[name](), "mse")
    return m


def batches():
    """The Trainer's batches: ``([features], [labels], None)`` per global batch, the short last."""
    return [([IDS[i : i + BATCH]], [Y[i : i + BATCH]], None) for i in range(0, ROWS, BATCH)]


def input_fn():
    return tf.data.Dataset.from_tensor_slices((IDS, Y)).batch(BATCH)


def weights(keras_model):
    return {v.name.split(":")[0]: v.numpy().tolist() for v in keras_model.weights}


def stock(name, model_dir):
    keras_model = model(name)
    start = weights(keras_model)
    estimator = tf.keras.estimator.model_to_estimator(
        keras_model=keras_model, model_dir=model_dir, checkpoint_format="saver"
    )
    estimator.train(input_fn)
    return {
        "start": start,
        "final": {n: estimator.get_variable_value(n).tolist() for n in start},
        "global_step": int(estimator.get_variable_value("global_step")),
    }


if __name__ == "__main__":  # --record PATH: stock's numbers (TensorFlow 2.15)
    import tempfile

    assert sys.argv[1] == "--record", "usage: jax_sparse.py --record PATH"
    out = {"tensorflow": tf.__version__}
    with tempfile.TemporaryDirectory() as root:
        for name in NAMES:
            out[name] = stock(name, os.path.join(root, name))
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
