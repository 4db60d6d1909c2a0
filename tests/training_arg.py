"""A model whose layers read the training mode as stock's estimator graph gives it, and stock's
numbers for it: a helper of tests/jax_engine/test_jax_training_arg.py, not a test module.

Stock's model_fn clones the model in a graph after ``tf.keras.backend.set_learning_phase(mode ==
TRAIN)``: a layer's ``training`` argument left to Keras, ``K.learning_phase()`` and
``K.in_train_phase`` read True in training and False in evaluation and prediction. Four
branches of one model, each its own hidden layer and output, each layer's two modes scaling its
input differently:

* ``lam``: a ``Lambda(lambda x, training=None: ...)`` branching on ``training`` in Python;
* ``phase``: a layer calling ``K.in_train_phase(x * 3, x)`` (no ``training`` argument);
* ``learning``: a layer multiplying by ``1 + K.learning_phase()``;
* ``passed``: a layer whose call takes ``training`` and hands it to ``K.in_train_phase``.

Stock is the stock estimator on TensorFlow 2.15, recorded by

    python tests/training_arg.py --record tests/reference/training_arg_tf215.json

in a TF 2.15 venv: the weights after 5 training steps, evaluate's results and the first
predictions.
"""

import json
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

K = tf.keras.backend
HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "reference", "training_arg_tf215.json")
BATCH, TRAIN, EVAL = 8, 40, 16
OUTPUTS = ("lam", "phase", "learning", "passed")

rng = np.random.RandomState(4)
X = rng.randn(TRAIN + EVAL, 3).astype(np.float32)
Y = (X @ rng.randn(3, 1) + 0.1 * rng.randn(TRAIN + EVAL, 1)).astype(np.float32)


def scaled(x, training=None):
    return x * (3.0 if training else 0.5)


class Phase(tf.keras.layers.Layer):
    def call(self, x):
        return K.in_train_phase(x * 3.0, x * 0.5)


class Learning(tf.keras.layers.Layer):
    def call(self, x):
        return x * (0.5 + 2.5 * tf.cast(K.learning_phase(), tf.float32))


class Passed(tf.keras.layers.Layer):
    def call(self, x, training=None):
        return K.in_train_phase(x * 3.0, x * 0.5, training=training)


CUSTOM_OBJECTS = {"Phase": Phase, "Learning": Learning, "Passed": Passed, "scaled": scaled}


def model():
    """The compiled model, its weights set from a fixed numpy draw (the same on every version)."""
    x = tf.keras.Input((3,), name="x")
    layers = {
        "lam": tf.keras.layers.Lambda(scaled, name="lam_layer"),
        "phase": Phase(name="phase_layer"),
        "learning": Learning(name="learning_layer"),
        "passed": Passed(name="passed_layer"),
    }
    outputs = [  # each from its own hidden layer: one branch's mode moves no other's weights
        tf.keras.layers.Dense(1, name=n)(
            layers[n](tf.keras.layers.Dense(4, activation="tanh", name=f"hidden_{n}")(x))
        )
        for n in OUTPUTS
    ]
    m = tf.keras.Model(x, outputs)
    draw = np.random.RandomState(2)
    m.set_weights([(0.5 * draw.randn(*w.shape)).astype(np.float32) for w in m.weights])
    m.compile(tf.keras.optimizers.legacy.SGD(0.05), loss="mse", metrics=["mae"])
    return m


def input_fn(rows):
    labels = {n: Y[rows] for n in OUTPUTS}
    return tf.data.Dataset.from_tensor_slices(({"x": X[rows]}, labels)).batch(BATCH)


def run(model_dir):
    """(evaluate's results, the weights by name, the predictions of the evaluation rows) after
    training the estimator ``model_to_estimator`` gives, all as floats or lists."""
    with tf.keras.utils.custom_object_scope(CUSTOM_OBJECTS):
        keras_model = model()
        names = [v.name.split(":")[0] for v in keras_model.weights]
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=keras_model,
            model_dir=model_dir,
            custom_objects=CUSTOM_OBJECTS,
            checkpoint_format="saver",
        )
    estimator.train(lambda: input_fn(np.arange(TRAIN)), steps=5)
    rows = np.arange(TRAIN, TRAIN + EVAL)
    results = {k: float(v) for k, v in estimator.evaluate(lambda: input_fn(rows)).items()}
    weights = {n: estimator.get_variable_value(n).tolist() for n in names}
    predicted = list(estimator.predict(lambda: input_fn(rows)))
    predictions = {n: [float(p[n][0]) for p in predicted] for n in OUTPUTS}
    return results, weights, predictions


def differences(got, tol=1e-5):
    """What of ``got`` (:func:`run`'s) differs from stock's recorded numbers beyond ``tol``
    (relative, at least 1): {what: (largest difference, its scale)}."""
    with open(RECORD, encoding="utf-8") as f:
        stock = json.load(f)
    out = {}
    for part, got_part in zip(("results", "weights", "predictions"), got):
        stock_part = stock[part]
        assert set(got_part) == set(stock_part), (part, sorted(got_part), sorted(stock_part))
        for key, want in stock_part.items():
            want = np.asarray(want, np.float64)
            scale = max(1.0, float(np.max(np.abs(want))))
            gap = float(np.max(np.abs(np.asarray(got_part[key], np.float64) - want)))
            if not gap <= tol * scale:
                out[f"{part}/{key}"] = (gap, scale)
    return out


if __name__ == "__main__":
    if sys.argv[1:2] != ["--record"]:
        sys.exit("usage: training_arg.py --record PATH (in a TF 2.15 venv: stock's numbers)")
    with tempfile.TemporaryDirectory() as root:
        results, weights, predictions = run(os.path.join(root, "model"))
    out = {
        "tensorflow": tf.__version__,
        "results": results,
        "weights": weights,
        "predictions": predictions,
    }
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
