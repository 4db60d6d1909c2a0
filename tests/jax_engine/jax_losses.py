"""The JAX engine's loss kinds on one small model, and stock's numbers for them: a helper of
tests/jax_engine/test_jax_losses.py, not a test module.

Every kind trains the same small model (Dense(5, tanh) -> Dense(1), or its sequence form for
the masks) with legacy SGD + momentum on 27 rows in global batches of 8: 3 full batches and a
short one of 3 rows, which the engine pads to 8 (on 8 devices, 5 hold padding only). Kinds:
a mean (``mse``), a SUM reduction, a one-number custom loss (a mean and a sum over the rows),
an activity regularizer (built-in and custom, with a weight regularizer), a layer's ``add_loss``
of a sum over its inputs, ``model.add_loss`` of a function (stock's clone of the model drops
it: stock trains as without it), a ``Masking`` layer's mask and an
``Embedding(mask_zero=True)``'s reaching the loss. ``model.add_loss`` of a tensor is not among
them: stock cannot clone such a model (Keras 2 fails to clone its ``TFOpLambda`` layers).

Stock is the stock estimator on TensorFlow 2.15 (``model_to_estimator``, ``saver``
checkpoints, one epoch of the input): recorded by

    python tests/jax_engine/jax_losses.py --record tests/reference/jax_losses_tf215.json

in a TF 2.15 venv: every weight's starting and final value by its Keras name, and the loss
``evaluate`` reports on the same input after training.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

ROWS, BATCH = 27, 8
HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(os.path.dirname(HERE), "reference", "jax_losses_tf215.json")

rng = np.random.RandomState(0)
X = rng.randn(ROWS, 4).astype(np.float32)
Y = (X[:, :1] * 2 - X[:, 1:2] + 0.1 * rng.randn(ROWS, 1)).astype(np.float32)
SEQ = rng.randn(ROWS, 3, 2).astype(np.float32)
SEQ[rng.uniform(size=(ROWS, 3)) < 0.35] = 0.0  # masked time steps (Masking(0.0))
SEQ[1] = 0.0  # a row wholly masked
SEQ_Y = (SEQ[..., :1] * 1.5 - SEQ[..., 1:] + 0.1 * rng.randn(ROWS, 3, 1)).astype(np.float32)
IDS = rng.randint(0, 6, (ROWS, 3)).astype(np.int64)  # 0: masked (mask_zero)
IDS_Y = rng.randn(ROWS, 3, 1).astype(np.float32)


def mean_of_errors(y_true, y_pred):  # one number for the batch: a mean tpushim cannot read by name
    return tf.reduce_mean(tf.abs(y_true - y_pred)) + tf.reduce_mean(tf.square(y_true - y_pred))


def sum_of_errors(y_true, y_pred):  # one number for the batch: a sum over the rows
    return 0.05 * tf.reduce_sum(tf.square(y_true - y_pred))


class AbsoluteActivity(tf.keras.regularizers.Regularizer):
    """A custom activity regularizer (Keras divides its value by the batch size)."""

    def __init__(self, rate):
        self.rate = rate

    def __call__(self, x):
        return self.rate * tf.reduce_sum(tf.abs(x))

    def get_config(self):
        return {"rate": self.rate}


class Penalty(tf.keras.layers.Layer):
    """A layer adding a loss computed from its inputs (``self.add_loss``): a sum over the batch."""

    def __init__(self, rate, **kwargs):
        super().__init__(**kwargs)
        self.rate = rate

    def call(self, x):
        self.add_loss(self.rate * tf.reduce_sum(tf.abs(x)))
        return tf.identity(x)  # Keras 2 cannot clone a layer returning its input tensor itself

    def get_config(self):
        return dict(super().get_config(), rate=self.rate)


CUSTOM_OBJECTS = {
    "AbsoluteActivity": AbsoluteActivity,
    "Penalty": Penalty,
    "mean_of_errors": mean_of_errors,
    "sum_of_errors": sum_of_errors,
}

#: kind -> the loss it compiles (the dense kinds), or None (a model of its own below)
LOSSES = {
    "mean": "mse",
    "sum": lambda: tf.keras.losses.MeanSquaredError(reduction="sum"),
    "custom_mean": lambda: mean_of_errors,
    "custom_sum": lambda: sum_of_errors,
    "activity": None,
    "add_loss": None,
    "model_add_loss": None,
    "masking": None,
    "embedding": None,
}
KINDS = tuple(LOSSES)


def _sgd():
    return tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9)


def model(kind):
    """The kind's compiled model, its weights from seed 1."""
    tf.keras.utils.set_random_seed(1)
    if kind == "masking":
        x = tf.keras.Input((3, 2), name="x")
        h = tf.keras.layers.Masking(0.0, name="masking")(x)
        h = tf.keras.layers.Dense(5, activation="tanh", name="hidden")(h)
        y = tf.keras.layers.Dense(1, name="out")(h)
    elif kind == "embedding":
        x = tf.keras.Input((3,), dtype="int64", name="x")
        h = tf.keras.layers.Embedding(6, 4, mask_zero=True, name="emb")(x)
        y = tf.keras.layers.Dense(1, name="out")(h)
    else:
        x = tf.keras.Input((4,), name="x")
        regularized = kind == "activity"
        h = tf.keras.layers.Dense(
            5,
            activation="tanh",
            activity_regularizer=tf.keras.regularizers.l2(0.05) if regularized else None,
            kernel_regularizer=tf.keras.regularizers.l2(0.01) if regularized else None,
            name="hidden",
        )(x)
        if kind == "activity":
            h = tf.keras.layers.Dense(
                3, activity_regularizer=AbsoluteActivity(0.01), name="custom"
            )(h)
        if kind == "add_loss":
            h = Penalty(0.02, name="penalty")(h)
        y = tf.keras.layers.Dense(1, name="out")(h)
    m = tf.keras.Model(x, y)
    if kind == "model_add_loss":  # a function of the weights: stock's clone drops it
        hidden = m.get_layer("hidden")
        m.add_loss(lambda: 0.5 * tf.reduce_sum(tf.square(hidden.kernel)))
    loss = LOSSES[kind]
    # The embedding without momentum: stock's sparse gradient moves only the looked-up rows'
    # momentum (the engine's dense one decays every row's: an optimizer matter, not the loss's).
    optimizer = tf.keras.optimizers.legacy.SGD(0.1) if kind == "embedding" else _sgd()
    m.compile(optimizer, loss=(loss() if callable(loss) else loss) or "mse")
    return m


def data(kind):
    """(features, labels) of every row."""
    if kind == "masking":
        return SEQ, SEQ_Y
    if kind == "embedding":
        return IDS, IDS_Y
    return X, Y


def batches(kind):
    """The Trainer's batches: ``([features], [labels], None)`` per global batch, the short last."""
    x, y = data(kind)
    return [([x[i : i + BATCH]], [y[i : i + BATCH]], None) for i in range(0, ROWS, BATCH)]


def weights(keras_model):
    return {v.name.split(":")[0]: v.numpy().tolist() for v in keras_model.weights}


def stock(kind, model_dir):
    """Stock's estimator trained one epoch: every weight's final value by its Keras name."""
    keras_model = model(kind)
    start = weights(keras_model)
    with tf.keras.utils.custom_object_scope(CUSTOM_OBJECTS):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=keras_model,
            model_dir=model_dir,
            checkpoint_format="saver",
            custom_objects=CUSTOM_OBJECTS,
        )
        estimator.train(lambda: input_fn(kind))
        evaluated = estimator.evaluate(lambda: input_fn(kind))
    return {
        "start": start,
        "final": {n: estimator.get_variable_value(n).tolist() for n in start},
        "global_step": int(estimator.get_variable_value("global_step")),
        "loss": float(evaluated["loss"]),
    }


def input_fn(kind):
    """Every row once, in global batches of 8 (the last of 3 rows)."""
    return tf.data.Dataset.from_tensor_slices(data(kind)).batch(BATCH)


def record(path, root):
    out = {"tensorflow": tf.__version__}
    for kind in KINDS:
        out[kind] = stock(kind, os.path.join(root, kind))
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":  # --record PATH: stock's numbers (TensorFlow 2.15)
    import tempfile

    assert sys.argv[1] == "--record", "usage: jax_losses.py --record PATH"
    with tempfile.TemporaryDirectory() as root:
        record(sys.argv[2], root)
