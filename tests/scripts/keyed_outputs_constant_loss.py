"""Legacy script: a keyed prediction model as the cloud ML samples' trainers write it. A dict of
features with a string ``key`` per example, dict labels; the model passes the key through as a
second output, so batch predictions can be joined back to their rows. Keras wants a loss for
every output, so the key gets a constant one, weighted 0: ``lambda y_true, y_pred:
tf.constant(0.0)``. 200 training rows in ``batch(20).repeat()``, 50 evaluation rows (a short
last batch), predictions of 10 rows. Usage: SCRIPT WORKDIR
"""

import json
import os
import random
import sys

import numpy as np
import tensorflow as tf

random.seed(0)
np.random.seed(0)
tf.random.set_seed(0)

workdir = sys.argv[1]
rng = np.random.RandomState(7)
values = rng.rand(260, 5).astype("float32")
keys = np.array([[f"row-{i}"] for i in range(260)])
labels = (values[:, :1] + values[:, 1:2] > 1.0).astype("float32")


def input_fn(rows, repeat, with_labels=True):
    features = {"values": values[rows], "key": keys[rows]}
    if with_labels:
        dataset = tf.data.Dataset.from_tensor_slices(
            (features, {"prob": labels[rows], "key_out": keys[rows]})
        )
    else:
        dataset = tf.data.Dataset.from_tensor_slices(features)
    dataset = dataset.batch(20)
    return dataset.repeat() if repeat else dataset


def pass_through(key):
    return tf.identity(key)


values_in = tf.keras.Input((5,), name="values")
key_in = tf.keras.Input((1,), dtype=tf.string, name="key")
hidden = tf.keras.layers.Dense(8, activation="relu")(values_in)
prob = tf.keras.layers.Dense(1, activation="sigmoid", name="prob")(hidden)
key_out = tf.keras.layers.Lambda(pass_through, name="key_out")(key_in)
model = tf.keras.Model(inputs=[values_in, key_in], outputs={"prob": prob, "key_out": key_out})
model.compile(
    optimizer=tf.keras.optimizers.Adam(0.01),
    loss={"prob": "binary_crossentropy", "key_out": lambda y_true, y_pred: tf.constant(0.0)},
    loss_weights={"prob": 1.0, "key_out": 0.0},
    metrics={"prob": ["accuracy"]},
)

config = tf.estimator.RunConfig(tf_random_seed=1, model_dir=os.path.join(workdir, "model"))
estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
estimator.train(input_fn=lambda: input_fn(np.arange(200), repeat=True), steps=30)
metrics = estimator.evaluate(input_fn=lambda: input_fn(np.arange(200, 250), repeat=False))
result = {k: float(v) for k, v in metrics.items()}
predicted = estimator.predict(lambda: input_fn(np.arange(250, 260), False, with_labels=False))
for i, p in enumerate(predicted):
    assert p["key_out"][0].decode() == f"row-{250 + i}", p  # joined back to its row
    result[f"prob_{i}"] = float(p["prob"][0])
print("RESULT " + json.dumps(result))
