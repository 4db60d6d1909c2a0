"""Subclassed Keras models on the JAX engine, and stock's numbers for them: a helper of
tests/jax_engine/test_jax_subclassed.py, not a test module.

Stock's ``model_to_estimator`` takes a subclassed model with ``checkpoint_format='saver'``: it
rebuilds it from its config in each call's graph (fresh weights: no warm start), calls it on the
features, names its outputs ``output_1``, ``output_2``, ... and never calls the model's own
``train_step``. Models (27 rows in global batches of 8: three full batches and a short one of 3,
padded to 8 by the engine; ``tf_random_seed=7``):

- ``multi``: dict features ``{"u", "v"}``, two outputs (a regression, a 2-class softmax), dict
  labels ``output_1`` / ``output_2``, an ``add_loss`` in its ``call`` (a mean over the rows of
  the hidden activations' squares), a custom ``train_step`` stock never calls; called before
  conversion and its weights moved (stock starts from fresh ones all the same). Legacy Adam.
- ``noisy``: BatchNormalization (batch moments over the real rows in training), an unseeded
  ``Dropout`` drawn from ``tf_random_seed`` and a Python branch on the training flag, all in
  ``call``. Legacy SGD with momentum.

Each trains one epoch (4 steps), evaluates and predicts on the same input. Stock is the stock
estimator on TensorFlow 2.15, recorded by

    python tests/jax_engine/jax_subclassed.py --record tests/reference/jax_subclassed_tf215.json

in a TF 2.15 venv: its evaluate() results, predictions and final weights (by the path below the
model's own name: Keras numbers a model's name by the models made before it in the process).
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

ROWS, BATCH = 27, 8
KINDS = ("multi", "noisy")
HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(os.path.dirname(HERE), "reference", "jax_subclassed_tf215.json")

rng = np.random.RandomState(0)
X = rng.randn(ROWS, 4).astype(np.float32)
Y = (X[:, :1] * 2 - X[:, 1:2] + 0.1 * rng.randn(ROWS, 1)).astype(np.float32)
C = (X[:, 2:3] > 0).astype(np.int64)


def _init(seed):  # seeded: stock's fresh graph and the engine start from the same weights
    return tf.keras.initializers.GlorotUniform(seed=seed)


class Multi(tf.keras.Model):
    def __init__(self, units=6, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = tf.keras.layers.Dense(units, activation="tanh", kernel_initializer=_init(3))
        self.reg = tf.keras.layers.Dense(1, kernel_initializer=_init(4))
        self.cls = tf.keras.layers.Dense(2, activation="softmax", kernel_initializer=_init(5))

    def call(self, inputs):
        h = self.hidden(tf.concat([inputs["u"], inputs["v"]], axis=1))
        self.add_loss(0.1 * tf.reduce_mean(tf.square(h)))
        return self.reg(h), self.cls(h)

    def train_step(self, data):  # as fit() would call it: stock's estimator never does
        raise RuntimeError("train_step called")

    def get_config(self):
        return {"units": self.units}


class Noisy(tf.keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = tf.keras.layers.Dense(6, kernel_initializer=_init(6))
        self.bn = tf.keras.layers.BatchNormalization(momentum=0.5)
        self.drop = tf.keras.layers.Dropout(0.3)
        self.out = tf.keras.layers.Dense(1, kernel_initializer=_init(7))

    def call(self, x, training=None):
        h = tf.nn.relu(self.bn(self.hidden(x), training=training))
        if training:  # a branch on the training flag
            h = h * 1.1
        return self.out(self.drop(h, training=training))


def model(kind):
    tf.keras.utils.set_random_seed(1)
    if kind == "multi":
        m = Multi()
        m.compile(
            tf.keras.optimizers.legacy.Adam(0.02),
            ["mse", "sparse_categorical_crossentropy"],
            metrics=[["mae"], ["accuracy"]],
        )
        m({"u": X[:2, :2], "v": X[:2, 2:]})
        m.set_weights([w + 0.5 for w in m.get_weights()])  # neither starts from these
        return m
    m = Noisy()
    m.compile(tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9), "mse", metrics=["mae"])
    return m


def input_fn(kind, labels=True):
    def make():
        if kind == "multi":
            features = {"u": X[:, :2], "v": X[:, 2:]}
            given = {"output_1": Y, "output_2": C}
        else:
            features, given = X, Y
        data = (features, given) if labels else features
        return tf.data.Dataset.from_tensor_slices(data).batch(BATCH)

    return make


def run(estimator, kind):
    """(evaluate()'s results, predictions (rows x outputs), {variable: value})."""
    estimator.train(input_fn(kind))
    metrics = {k: float(v) for k, v in estimator.evaluate(input_fn(kind)).items()}
    outputs = ("output_1", "output_2") if kind == "multi" else ("output_1",)
    predictions = [
        np.concatenate([np.ravel(p[o]) for o in outputs])
        for p in estimator.predict(input_fn(kind, labels=False))
    ]
    return metrics, np.array(predictions, np.float64), values(estimator.model_dir)


def values(model_dir):
    """The latest checkpoint's model variables by their path below the model's own name."""
    path = tf.train.latest_checkpoint(model_dir)
    reader = tf.train.load_checkpoint(path)
    return {
        n.split("/", 1)[1]: np.asarray(reader.get_tensor(n), np.float64)
        for n, _ in tf.train.list_variables(path)
        if n.count("/") >= 2 and not n.startswith("training/")
    }


def converted(keras_model, model_dir, **scope):
    """``model_to_estimator`` of ``keras_model`` as a legacy script calls it, in
    ``tpushim.patched(**scope)`` (none: stock's)."""
    import tpushim

    with tpushim.patched(quiet=True, **(scope or {"mode": "off"})):
        config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=7)
        return tf.keras.estimator.model_to_estimator(
            keras_model=keras_model, config=config, checkpoint_format="saver"
        )


def record(path, root):
    out = {"tensorflow": tf.__version__}
    for kind in KINDS:
        metrics, predictions, weights = run(converted(model(kind), os.path.join(root, kind)), kind)
        out[kind] = {
            "metrics": metrics,
            "predictions": predictions.tolist(),
            "values": {n: v.tolist() for n, v in weights.items()},
        }
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":  # --record PATH: stock's numbers (TensorFlow 2.15)
    import tempfile

    assert sys.argv[1] == "--record", "usage: jax_subclassed.py --record PATH"
    with tempfile.TemporaryDirectory() as root:
        record(sys.argv[2], root)
