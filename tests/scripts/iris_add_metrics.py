"""Legacy script: an iris classifier as the TFX / cloud samples' trainers write it.

A dict of 4 float features, one-hot labels, a softmax output compiled with
`categorical_crossentropy` and a list of metric strings that includes the binary ones, converted
with `model_to_estimator`, then `tf.estimator.add_metrics` for an AUC (a Keras metric object),
a per-class precision and a feature mean (`tf.compat.v1.metrics` pairs). 120 training rows in
`batch(16).repeat()`, 30 evaluation rows (a short last batch). Usage: SCRIPT WORKDIR
"""

import json
import os
import random
import sys

import numpy as np
import tensorflow as tf

random.seed(0)  # reproducible Keras initial weights, as scripts seed them
np.random.seed(0)
tf.random.set_seed(0)

workdir = sys.argv[1]
FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
rng = np.random.RandomState(3)
centers = np.array([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.6, 2.0]])
species = rng.randint(0, 3, 150)
values = centers[species] + rng.normal(0, 0.35, size=(150, 4))
onehot = np.eye(3)[species]


def input_fn(rows, repeat):
    features = {name: values[rows, i : i + 1] for i, name in enumerate(FEATURES)}
    dataset = tf.data.Dataset.from_tensor_slices((features, onehot[rows]))
    dataset = dataset.batch(16)
    return dataset.repeat() if repeat else dataset


inputs = [tf.keras.layers.Input(shape=(1,), name=name) for name in FEATURES]
x = tf.keras.layers.Concatenate()(inputs)
x = tf.keras.layers.Dense(8, activation="relu")(x)
x = tf.keras.layers.Dense(8, activation="relu")(x)
output = tf.keras.layers.Dense(3, activation="softmax", name="species")(x)
model = tf.keras.Model(inputs=inputs, outputs=output)
model.compile(
    optimizer=tf.keras.optimizers.Adam(0.01),
    loss="categorical_crossentropy",
    metrics=[
        "binary_accuracy",
        "binary_crossentropy",
        "categorical_accuracy",
        "categorical_crossentropy",
        "hinge",
        "mean_squared_error",
    ],
)

config = tf.estimator.RunConfig(tf_random_seed=1, model_dir=os.path.join(workdir, "model"))
estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)


def more_metrics(labels, predictions, features):
    auc = tf.keras.metrics.AUC(name="auc")
    auc.update_state(labels, predictions["species"])
    predicted = tf.argmax(predictions["species"], axis=1)
    return {
        "auc": auc,
        "precision_setosa": tf.compat.v1.metrics.precision(
            tf.equal(tf.argmax(labels, axis=1), 0), tf.equal(predicted, 0)
        ),
        "mean_petal_length": tf.compat.v1.metrics.mean(features["petal_length"]),
    }


estimator = tf.estimator.add_metrics(estimator, more_metrics)
train, test = np.arange(120), np.arange(120, 150)
estimator.train(input_fn=lambda: input_fn(train, repeat=True), steps=40)
metrics = estimator.evaluate(input_fn=lambda: input_fn(test, repeat=False))
result = {k: float(v) for k, v in metrics.items()}
print("RESULT " + json.dumps(result))
