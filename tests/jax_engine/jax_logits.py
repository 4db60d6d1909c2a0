"""A model whose crossentropies (metrics and losses) read its outputs' logits, and stock's numbers
for it: a helper of tests/jax_engine/test_jax_metric_logits.py, not a test module.

Keras's crossentropies (``backend.binary_crossentropy``, ``categorical_crossentropy``,
``sparse_categorical_crossentropy``) compute from an output's ``_keras_logits`` (a Keras
activation's input) whatever the activation, and from a Sigmoid's or Softmax's input where the
output is made by that op in a graph. Stock's evaluation graph hands Keras's metrics the model's
own outputs, so they read those logits: a softmax output's ``binary_crossentropy`` is the
sigmoid crossentropy of the softmax's logits, a sigmoid output's ``categorical_crossentropy`` the
softmax crossentropy of the sigmoid's. Four outputs of one model:

* ``soft``: a softmax Dense trained on ``binary_crossentropy`` (the loss reads the logits too);
* ``sig``: a sigmoid Dense trained on ``mse``;
* ``lam``: ``tf.nn.softmax`` in a Lambda (no ``_keras_logits``: the op's input), its logits
  large enough that probabilities clip (Keras's epsilon), so logits and probabilities differ;
* ``sp``: a softmax Dense with integer labels, ``sparse_categorical_crossentropy``, as large.

Each has its crossentropy metrics: binary and categorical, the Lambda's categorical (its
binary one reads the clipped probabilities, as ill-conditioned as they are saturated), the
sparse output's sparse one. Stock is the stock estimator
on TensorFlow 2.15, recorded by

    python tests/jax_engine/jax_logits.py --record tests/reference/jax_logits_tf215.json

in a TF 2.15 venv: evaluate's results after 5 training steps of 8 rows, on 20 rows in batches
of 8 (a short last batch of 4).
"""

import json
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(os.path.dirname(HERE), "reference", "jax_logits_tf215.json")
BATCH, TRAIN, EVAL = 8, 40, 20

rng = np.random.RandomState(5)
X = rng.randn(TRAIN + EVAL, 4).astype(np.float32)
CLASSES = rng.randint(0, 3, TRAIN + EVAL)
ONEHOT = np.eye(3, dtype=np.float32)[CLASSES]
MULTI = (rng.uniform(size=(TRAIN + EVAL, 3)) < 0.4).astype(np.float32)


def model():
    """The compiled model, its weights set from a fixed numpy draw (the same on every version)."""
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(6, activation="tanh", name="hidden")(x)
    soft = tf.keras.layers.Dense(3, activation="softmax", name="soft")(h)
    sig = tf.keras.layers.Dense(3, activation="sigmoid", name="sig")(h)
    lam = tf.keras.layers.Lambda(tf.nn.softmax, name="lam")(tf.keras.layers.Dense(3, name="z")(h))
    sp = tf.keras.layers.Dense(3, activation="softmax", name="sp")(h)
    m = tf.keras.Model(x, [soft, sig, lam, sp])
    draw = np.random.RandomState(9)
    scale = {"z": 12.0, "sp": 12.0}  # saturated: probabilities clip at Keras's epsilon
    m.set_weights(
        [
            draw.randn(*w.shape).astype(np.float32) * scale.get(w.name.split("/")[0], 0.7)
            for w in m.weights
        ]
    )
    crossentropies = ["binary_crossentropy", "categorical_crossentropy"]
    m.compile(
        tf.keras.optimizers.legacy.SGD(0.05),
        loss={
            "soft": "binary_crossentropy",
            "sig": "mse",
            "lam": "categorical_crossentropy",
            "sp": "sparse_categorical_crossentropy",
        },
        metrics={
            "soft": crossentropies,
            "sig": crossentropies,
            "lam": ["categorical_crossentropy"],
            "sp": ["sparse_categorical_crossentropy"],
        },
    )
    return m


def input_fn(rows):
    labels = {
        "soft": ONEHOT[rows],
        "sig": MULTI[rows],
        "lam": ONEHOT[rows],
        "sp": CLASSES[rows].astype(np.int64),
    }
    return tf.data.Dataset.from_tensor_slices(({"x": X[rows]}, labels)).batch(BATCH)


def train_input_fn():
    return input_fn(np.arange(TRAIN))


def eval_input_fn():
    return input_fn(np.arange(TRAIN, TRAIN + EVAL))


def run(model_dir):
    """evaluate's results (floats) after training the estimator ``model_to_estimator`` gives."""
    estimator = tf.keras.estimator.model_to_estimator(keras_model=model(), model_dir=model_dir)
    estimator.train(train_input_fn, steps=5)
    return {k: float(v) for k, v in estimator.evaluate(eval_input_fn).items()}


if __name__ == "__main__":
    if sys.argv[1:2] != ["--record"]:
        sys.exit("usage: jax_logits.py --record PATH (in a TF 2.15 venv: stock's numbers)")
    with tempfile.TemporaryDirectory() as root:
        out = {"tensorflow": tf.__version__, "results": run(os.path.join(root, "model"))}
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
