"""Legacy script: Boston-housing regression with BatchNormalization, as the cookbooks write it.

A pandas DataFrame of 13 float64 columns (405 training rows, 101 for evaluation) fed as
`dict(df)` through `from_tensor_slices`, one Keras Input per column, `batch(256).repeat(20)`: each
epoch ends in a batch of 149 rows. Dense + BatchNormalization layers, 'adam' as a string, mse
with an mae metric; trained until the input ends. Usage: SCRIPT WORKDIR
"""

import json
import os
import random
import sys

import numpy as np
import pandas as pd
import tensorflow as tf

random.seed(0)  # reproducible Keras initial weights, as scripts seed them
np.random.seed(0)
tf.random.set_seed(0)

workdir = sys.argv[1]
COLUMNS = [
    "CRIM", "ZN", "INDUS", "CHAS", "NOX", "RM", "AGE", "DIS", "RAD", "TAX", "PTRATIO", "B", "LSTAT"
]  # fmt: skip
rng = np.random.RandomState(7)
data = pd.DataFrame(rng.normal(size=(506, len(COLUMNS))), columns=COLUMNS)
# median value in $100,000s
data["MEDV"] = 2.25 + 0.3 * data["RM"] - 0.4 * data["LSTAT"] + rng.normal(0, 0.2, size=506)
train, test = data.iloc[:405], data.iloc[405:]

inputs = [tf.keras.layers.Input(shape=(1,), name=c) for c in COLUMNS]
x = tf.keras.layers.Concatenate()(inputs)
x = tf.keras.layers.Dense(64, activation="relu")(x)
x = tf.keras.layers.BatchNormalization()(x)
x = tf.keras.layers.Dense(32, activation="relu")(x)
x = tf.keras.layers.BatchNormalization()(x)
output = tf.keras.layers.Dense(1)(x)
model = tf.keras.Model(inputs=inputs, outputs=output)
model.compile(optimizer="adam", loss="mse", metrics=["mae"])

config = tf.estimator.RunConfig(tf_random_seed=1, model_dir=os.path.join(workdir, "model"))
estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)


def input_fn(df, epochs, batch_size=256):
    features = {c: df[c].values[:, None] for c in COLUMNS}
    dataset = tf.data.Dataset.from_tensor_slices((features, df["MEDV"].values[:, None]))
    return dataset.batch(batch_size).repeat(epochs)


estimator.train(input_fn=lambda: input_fn(train, 20))
metrics = estimator.evaluate(input_fn=lambda: input_fn(test, 1))
predictions = list(estimator.predict(input_fn=lambda: input_fn(test, 1)))
result = {k: float(v) for k, v in metrics.items()}
for name in estimator.get_variable_names():  # the BatchNormalization statistics it learnt
    if "moving_" in name and "ATTRIBUTES" in name:
        result[name.split("/")[0] + "/" + name.split("/")[1]] = float(
            np.sum(estimator.get_variable_value(name))
        )
result.update(
    predictions=len(predictions),
    first=float(next(iter(predictions[0].values()))[0]),
    last=float(next(iter(predictions[-1].values()))[0]),
)
print("RESULT " + json.dumps(result))
