"""A legacy script as found in course repos: its input_fns draw fresh numpy data on every call
(np.random, seeded once at the top) and its prediction input is a one-shot generator feed over a
Python iterator, consumed by the first pass. Counts the input_fn calls and prints them with the
metrics.

Usage: python random_draws_one_shot_feed.py WORKDIR
"""

import json
import sys

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(42)  # python, numpy and the Keras weights, reproducibly
CALLS = {"train": 0, "eval": 0, "predict": 0}


def train_input_fn():
    CALLS["train"] += 1
    x = np.random.rand(96, 4).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 2).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=1).repeat().batch(16)


def eval_input_fn():
    CALLS["eval"] += 1
    x = np.random.rand(40, 4).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 2).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)


FEED = iter(
    np.random.rand(24, 4).astype("float32")
)  # one pass only, as a socket or a file would be


def predict_input_fn():
    CALLS["predict"] += 1
    return tf.data.Dataset.from_generator(
        lambda: FEED, output_types=tf.float32, output_shapes=(4,)
    ).batch(8)


model = tf.keras.Sequential(
    [
        tf.keras.layers.Dense(8, activation="relu", input_shape=(4,), name="hidden"),
        tf.keras.layers.Dense(1, activation="sigmoid", name="out"),
    ]
)
model.compile(tf.keras.optimizers.legacy.SGD(0.1), "binary_crossentropy", metrics=["accuracy"])
estimator = tf.keras.estimator.model_to_estimator(
    keras_model=model, model_dir=sys.argv[1], config=tf.estimator.RunConfig(tf_random_seed=3)
)
estimator.train(train_input_fn, steps=12)
metrics = estimator.evaluate(eval_input_fn)
predictions = list(estimator.predict(predict_input_fn))
result = {k: float(v) for k, v in metrics.items()}
result.update(predicted=len(predictions), first=float(predictions[0]["out"][0]))
result.update({f"calls_{k}": v for k, v in CALLS.items()})
print("RESULT " + json.dumps(result))
