"""Strings and feature-column lookups on the JAX engine, on two small models, and stock's numbers
for them: a helper of tests/jax_engine/test_jax_strings.py, not a test module.

* ``lookup``: a string ``city`` through ``StringLookup`` (its ids embedded) beside a numeric
  input, then ``Dense(1)``: the lookup runs on the host, the step from its ids.
* ``columns``: a ``DenseFeatures`` layer over an indicator of a vocabulary list, an embedding
  column (mean combiner) of another and a numeric column, then ``Dense(1)``: the lookups on the
  host, the embedding weights trained in the step.

Each trains 29 rows in batches of 8 (a short last batch of 5, padded on 8 devices) with legacy
SGD, weights set from a fixed draw, then evaluates and predicts the same rows. Stock is the stock
estimator on TensorFlow 2.15, recorded by

    python tests/jax_engine/jax_strings.py --record tests/reference/jax_strings_tf215.json

in a TF 2.15 venv: every checkpointed weight's sum, evaluate's metrics, each prediction. Run
as ``python jax_strings.py WORKDIR`` it prints ``RESULT {...}`` of the same.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS, BATCH = 29, 8
CITIES = ["oslo", "lima", "pune", "kobe"]
COLORS = ["red", "green", "blue"]
SHAPES = ["round", "square", "flat", "tall", "thin"]

rng = np.random.RandomState(3)
X = rng.rand(ROWS, 2).astype(np.float32)
CITY = rng.choice(CITIES + ["rome"], (ROWS, 1))  # "rome": out of vocabulary
COLOR = rng.choice(COLORS, (ROWS, 1))
SHAPE = rng.choice(SHAPES, (ROWS, 1))
Y = (X[:, :1] + (CITY == "lima") + 0.5 * (COLOR == "red") - 0.3 * (SHAPE == "flat")).astype(
    np.float32
)


def lookup_model():
    x = tf.keras.Input((2,), name="x")
    city = tf.keras.Input((1,), dtype=tf.string, name="city")
    ids = tf.keras.layers.StringLookup(vocabulary=CITIES, name="ids")(city)
    vectors = tf.keras.layers.Embedding(len(CITIES) + 1, 2, name="vectors")(ids)
    hot = tf.keras.layers.Flatten()(vectors)
    joined = tf.keras.layers.Concatenate()([x, hot])
    y = tf.keras.layers.Dense(1, name="y")(joined)
    return tf.keras.Model({"x": x, "city": city}, y)


def columns_model():
    fc = tf.feature_column
    columns = [
        fc.indicator_column(fc.categorical_column_with_vocabulary_list("color", COLORS)),
        fc.embedding_column(fc.categorical_column_with_vocabulary_list("shape", SHAPES), 2),
        fc.numeric_column("x", shape=(2,)),
    ]
    inputs = {
        "x": tf.keras.Input((2,), name="x"),
        "color": tf.keras.Input((1,), dtype=tf.string, name="color"),
        "shape": tf.keras.Input((1,), dtype=tf.string, name="shape"),
    }
    dense = tf.keras.layers.DenseFeatures(columns, name="features")(inputs)
    y = tf.keras.layers.Dense(1, name="y")(dense)
    return tf.keras.Model(inputs, y)


MODELS = {
    "lookup": (lookup_model, ["x", "city"]),
    "columns": (columns_model, ["x", "color", "shape"]),
}
FEATURES = {"x": X, "city": CITY, "color": COLOR, "shape": SHAPE}


def built(name):
    make, _ = MODELS[name]
    model = make()
    draw = np.random.RandomState(5)
    model.set_weights([draw.uniform(-0.5, 0.5, w.shape).astype(np.float32) for w in model.weights])
    model.compile(tf.keras.optimizers.legacy.SGD(0.2), "mse", metrics=["mae"])
    return model


def initial_sum(name, weight):
    """The sum of a weight's starting value (its Keras name without ``:0`` contains ``weight``)."""
    model = built(name)
    return float(sum(np.sum(w.numpy()) for w in model.weights if weight in w.name))


def input_fn(name, labels=True):
    features = {k: FEATURES[k] for k in MODELS[name][1]}
    data = (features, Y) if labels else features
    return tf.data.Dataset.from_tensor_slices(data).batch(BATCH)


def run(workdir):
    """Both models trained, evaluated and predicted: {key: number}."""
    result = {}
    for name in MODELS:
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=built(name), model_dir=os.path.join(workdir, name)
        )
        estimator.train(lambda name=name: input_fn(name).repeat(2), steps=7)
        metrics = estimator.evaluate(lambda name=name: input_fn(name))
        result.update({f"{name}_{k}": float(v) for k, v in metrics.items()})
        predictions = estimator.predict(lambda name=name: input_fn(name, labels=False))
        for i, p in enumerate(predictions):
            result[f"{name}_prediction_{i}"] = float(p["y"][0])
        for var in estimator.get_variable_names():  # the weights (not the lookups' tables)
            value = np.asarray(estimator.get_variable_value(var))
            if "OPTIMIZER" not in var and "global_step" not in var and value.dtype.kind == "f":
                result[f"{name}/{var}"] = float(np.sum(value))
    return result


if __name__ == "__main__":
    if sys.argv[1] == "--record":
        import tempfile

        with tempfile.TemporaryDirectory() as work:
            numbers = run(work)
        with open(sys.argv[2], "w", encoding="utf-8") as f:
            json.dump(
                {"tensorflow": tf.__version__, "results": numbers}, f, indent=1, sort_keys=True
            )
    else:
        print("RESULT " + json.dumps(run(sys.argv[1])))
