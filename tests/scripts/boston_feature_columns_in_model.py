"""Legacy script: Boston-housing regression with feature columns inside the Keras model.

A pandas DataFrame (`dict(df)` into `from_tensor_slices`: float64 and int64 columns, CHAS as
"Y"/"N" strings), one Keras Input per column, and a `DenseFeatures` layer first: numeric columns,
AGE bucketized, CHAS and RAD through vocabulary lists (indicator), their cross (indicator and a
summed embedding), and the town hashed into an embedding. 'adam' as a string, mse with an mae
metric; `batch(32).repeat()` for 60 steps, an evaluation set of 101 rows (a short last batch),
predictions. Usage: SCRIPT WORKDIR
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
rng = np.random.RandomState(7)
n = 506
data = pd.DataFrame(
    {
        "CRIM": rng.exponential(3.0, n),
        "RM": rng.normal(6.3, 0.7, n),
        "AGE": rng.uniform(2.0, 100.0, n),
        "LSTAT": rng.uniform(1.7, 38.0, n),
        "CHAS": rng.choice(["Y", "N"], n, p=[0.1, 0.9]),
        "RAD": rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 24], n).astype("int64"),
        "TOWN": rng.choice([f"town-{i}" for i in range(40)], n),
    }
)
data["MEDV"] = 22.0 + 5.0 * (data["RM"] - 6.3) - 0.5 * data["LSTAT"] + 3.0 * (data["CHAS"] == "Y")
train, test = data.iloc[:405], data.iloc[405:]
FEATURES = ["CRIM", "RM", "AGE", "LSTAT", "CHAS", "RAD", "TOWN"]

fc = tf.feature_column
age = fc.bucketized_column(fc.numeric_column("AGE"), boundaries=[20.0, 40.0, 60.0, 80.0])
chas = fc.categorical_column_with_vocabulary_list("CHAS", ["Y", "N"])
rad = fc.categorical_column_with_vocabulary_list(
    "RAD", [1, 2, 3, 4, 5, 6, 7, 8, 24], dtype=tf.int64
)
chas_x_rad = fc.crossed_column([chas, rad], hash_bucket_size=30)
feature_columns = [
    fc.numeric_column("CRIM"),
    fc.numeric_column("RM"),
    fc.numeric_column("LSTAT"),
    age,
    fc.indicator_column(chas),
    fc.indicator_column(rad),
    fc.indicator_column(chas_x_rad),
    fc.embedding_column(fc.crossed_column([age, chas], hash_bucket_size=12), 3, combiner="sum"),
    fc.embedding_column(fc.categorical_column_with_hash_bucket("TOWN", 50), 4),
]

inputs = {
    "CRIM": tf.keras.layers.Input(shape=(1,), name="CRIM"),
    "RM": tf.keras.layers.Input(shape=(1,), name="RM"),
    "AGE": tf.keras.layers.Input(shape=(1,), name="AGE"),
    "LSTAT": tf.keras.layers.Input(shape=(1,), name="LSTAT"),
    "CHAS": tf.keras.layers.Input(shape=(1,), name="CHAS", dtype=tf.string),
    "RAD": tf.keras.layers.Input(shape=(1,), name="RAD", dtype=tf.int64),
    "TOWN": tf.keras.layers.Input(shape=(1,), name="TOWN", dtype=tf.string),
}
x = tf.keras.layers.DenseFeatures(feature_columns)(inputs)
x = tf.keras.layers.Dense(32, activation="relu")(x)
x = tf.keras.layers.Dense(16, activation="relu")(x)
output = tf.keras.layers.Dense(1)(x)
model = tf.keras.Model(inputs=inputs, outputs=output)
model.compile(optimizer="adam", loss="mse", metrics=["mae"])

config = tf.estimator.RunConfig(tf_random_seed=1, model_dir=os.path.join(workdir, "model"))
estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)


def input_fn(df, repeat, batch_size=32):
    dataset = tf.data.Dataset.from_tensor_slices((dict(df[FEATURES]), df["MEDV"].values))
    dataset = dataset.batch(batch_size)
    return dataset.repeat() if repeat else dataset


estimator.train(input_fn=lambda: input_fn(train, True), steps=60)
metrics = estimator.evaluate(input_fn=lambda: input_fn(test, False))
predictions = list(estimator.predict(input_fn=lambda: input_fn(test, False)))
result = {k: float(v) for k, v in metrics.items()}
for name in estimator.get_variable_names():  # the embeddings it learnt
    if "embedding_weights" in name and name.endswith("VARIABLE_VALUE") and "OPTIMIZER" not in name:
        result[name.split("/")[1]] = float(np.sum(estimator.get_variable_value(name)))
result.update(
    predictions=len(predictions),
    first=float(next(iter(predictions[0].values()))[0]),
    last=float(next(iter(predictions[-1].values()))[0]),
)
print("RESULT " + json.dumps(result))
