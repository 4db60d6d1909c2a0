"""A legacy Keras -> Estimator script as found in the wild (used by the preflight tests and docs).

Float64 numpy features straight from a dataframe, a batch of 100, a Lambda layer that formats
numbers as strings for debugging, and iterations_per_loop left at TPUEstimator's habit of 2.
"""

import sys

import numpy as np
import tensorflow as tf

rng = np.random.RandomState(0)
features = rng.rand(400, 16)  # float64, as pandas hands it over
labels = rng.randint(0, 2, size=(400, 1))

model = tf.keras.Sequential(
    [
        tf.keras.layers.Dense(32, activation="relu", input_shape=(16,), name="dense"),
        tf.keras.layers.Lambda(
            lambda x: x + 0.0 * tf.strings.to_number(tf.strings.as_string(x)), name="debug_strings"
        ),
        tf.keras.layers.Dense(1, activation="sigmoid", name="score"),
    ]
)
model.compile(
    optimizer=tf.keras.optimizers.legacy.Adam(1e-3),
    loss="binary_crossentropy",
    metrics=["accuracy"],
)
estimator = tf.keras.estimator.model_to_estimator(keras_model=model)


def train_input_fn():
    return tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(400).repeat().batch(100)


estimator.train(train_input_fn, steps=int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
print(estimator.evaluate(lambda: tf.data.Dataset.from_tensor_slices((features, labels)).batch(100)))
