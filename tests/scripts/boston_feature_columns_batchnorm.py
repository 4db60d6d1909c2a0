"""Legacy script: Boston-housing linear and ridge regression, feature columns then BatchNormalization.

A pandas DataFrame (`dict(df)` into `from_tensor_slices`: float64 columns, CHAS as "Y"/"N"
strings, RAD as int64), one Keras Input per column, a `DenseFeatures` layer over numeric columns,
a vocabulary-list column and a crossed column (both through indicator columns), then
`BatchNormalization` right after it and a `Dense(1)`. Two estimators, as the tutorial compares
them: "linreg" with Ftrl, "ridge" with an L2-regularised kernel and 'adam'. `batch(64).repeat()`
for 8 steps (the seventh batch is the epoch's short one, 20 rows); evaluation and prediction in
batches of 256 over 101 rows (one short batch). Usage: SCRIPT WORKDIR
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
rng = np.random.RandomState(11)
n = 506
data = pd.DataFrame(
    {
        "CRIM": rng.exponential(3.0, n),
        "RM": rng.normal(6.3, 0.7, n),
        "AGE": rng.uniform(2.0, 100.0, n),
        "LSTAT": rng.uniform(1.7, 38.0, n),
        "PTRATIO": rng.uniform(12.6, 22.0, n),
        "CHAS": rng.choice(["Y", "N"], n, p=[0.1, 0.9]),
        "RAD": rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 24], n).astype("int64"),
    }
)
data["MEDV"] = (
    22.0 + 5.0 * (data["RM"] - 6.3) - 0.5 * data["LSTAT"] + 3.0 * (data["CHAS"] == "Y")
) + rng.normal(0.0, 2.0, n)
train, test = data.iloc[:404], data.iloc[404:]
NUMERIC = ["CRIM", "RM", "AGE", "LSTAT", "PTRATIO"]
FEATURES = NUMERIC + ["CHAS", "RAD"]

fc = tf.feature_column
chas = fc.categorical_column_with_vocabulary_list("CHAS", ["Y", "N"])
rad = fc.categorical_column_with_vocabulary_list(
    "RAD", [1, 2, 3, 4, 5, 6, 7, 8, 24], dtype=tf.int64
)
feature_columns = [fc.numeric_column(c) for c in NUMERIC] + [
    fc.indicator_column(chas),
    fc.indicator_column(fc.crossed_column([chas, rad], hash_bucket_size=20)),
]


def build(optimizer, regularizer=None):
    inputs = {c: tf.keras.layers.Input(shape=(1,), name=c) for c in NUMERIC}
    inputs["CHAS"] = tf.keras.layers.Input(shape=(1,), name="CHAS", dtype=tf.string)
    inputs["RAD"] = tf.keras.layers.Input(shape=(1,), name="RAD", dtype=tf.int64)
    x = tf.keras.layers.DenseFeatures(feature_columns)(inputs)
    x = tf.keras.layers.BatchNormalization()(x)
    output = tf.keras.layers.Dense(1, kernel_regularizer=regularizer)(x)
    model = tf.keras.Model(inputs=inputs, outputs=output)
    model.compile(optimizer=optimizer, loss="mse", metrics=["mse", "mae"])
    return model


def input_fn(df, training, batch_size):
    dataset = tf.data.Dataset.from_tensor_slices((dict(df[FEATURES]), df["MEDV"].values))
    dataset = dataset.batch(batch_size)
    return dataset.repeat() if training else dataset


result = {}
for name, optimizer, regularizer in (
    ("linreg", tf.keras.optimizers.Ftrl(learning_rate=0.5), None),
    ("ridge", "adam", tf.keras.regularizers.l2(0.01)),
):
    config = tf.estimator.RunConfig(tf_random_seed=1, model_dir=os.path.join(workdir, name))
    estimator = tf.keras.estimator.model_to_estimator(
        keras_model=build(optimizer, regularizer), config=config
    )
    estimator.train(input_fn=lambda: input_fn(train, True, 64), steps=8)
    metrics = estimator.evaluate(input_fn=lambda: input_fn(test, False, 256))
    predictions = list(estimator.predict(input_fn=lambda: input_fn(test, False, 256)))
    result.update({f"{name}_{k}": float(v) for k, v in metrics.items()})
    for var in estimator.get_variable_names():  # coefficients and BatchNormalization statistics
        if var.endswith("VARIABLE_VALUE") and "OPTIMIZER" not in var and "/" in var:
            result[f"{name}/{var.split('/')[0]}/{var.split('/')[1]}"] = float(
                np.sum(estimator.get_variable_value(var))
            )
    result.update(
        {
            f"{name}_predictions": len(predictions),
            f"{name}_first": float(next(iter(predictions[0].values()))[0]),
            f"{name}_last": float(next(iter(predictions[-1].values()))[0]),
        }
    )
print("RESULT " + json.dumps(result))
