"""Legacy script: NYC taxi fare, feature engineering inside the Keras model (the Cloud training
samples' "feature engineering in Keras" notebook, converted with model_to_estimator).

CSV read by `tf.data.experimental.make_csv_dataset` (features of shape [batch], a [batch] label
for a [batch, 1] output), one Keras Input per numeric column, and weight-free Keras layers between
them and the feature columns: `Lambda`s scaling the longitudes and latitudes to [0, 1], and a
`Lambda` computing the Euclidean distance from the four raw coordinates. A `DenseFeatures` layer
then reads the transformed dict: numeric columns, the distance, and the pickup and dropoff grid
cells (bucketized, crossed, their pair crossed again) through an embedding. 'adam' as a string,
mse with an rmse metric function; 40 steps, evaluation and predictions. Usage: SCRIPT WORKDIR
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
CSV_COLUMNS = [
    "fare_amount",
    "pickup_longitude",
    "pickup_latitude",
    "dropoff_longitude",
    "dropoff_latitude",
    "passenger_count",
]
LABEL_COLUMN = "fare_amount"
DEFAULTS = [[0.0], [-74.0], [40.0], [-74.0], [40.7], [1.0]]
NUMERIC_COLS = [c for c in CSV_COLUMNS if c != LABEL_COLUMN]
NBUCKETS = 8

rng = np.random.RandomState(5)


def write_csv(path, rows):
    plon = rng.uniform(-74.05, -73.75, rows)
    plat = rng.uniform(40.60, 40.90, rows)
    dlon = plon + rng.normal(0, 0.04, rows)
    dlat = plat + rng.normal(0, 0.04, rows)
    passengers = rng.randint(1, 6, rows)
    distance = np.sqrt((dlon - plon) ** 2 + (dlat - plat) ** 2)
    fare = 2.5 + 180.0 * distance + 0.4 * passengers + rng.normal(0, 0.8, rows)
    with open(path, "w") as f:
        for row in zip(fare, plon, plat, dlon, dlat, passengers):
            f.write(",".join("%.5f" % v for v in row) + "\n")


os.makedirs(workdir, exist_ok=True)
write_csv(os.path.join(workdir, "taxi-train.csv"), 320)
write_csv(os.path.join(workdir, "taxi-valid.csv"), 96)


def load_dataset(pattern, batch_size, mode):
    dataset = tf.data.experimental.make_csv_dataset(
        pattern,
        batch_size,
        CSV_COLUMNS,
        DEFAULTS,
        label_name=LABEL_COLUMN,
        num_epochs=None if mode == tf.estimator.ModeKeys.TRAIN else 1,
        shuffle=False,
    )
    return dataset


def euclidean(params):
    lon1, lat1, lon2, lat2 = params
    londiff = lon2 - lon1
    latdiff = lat2 - lat1
    return tf.sqrt(londiff * londiff + latdiff * latdiff)


def scale_longitude(lon_col):
    return lambda x: (x + 78) / 8.0


def scale_latitude(lat_col):
    return lambda x: (x - 37) / 8.0


def transform(inputs, numeric_cols, nbuckets):
    transformed = inputs.copy()
    feature_columns = {
        colname: tf.feature_column.numeric_column(colname) for colname in numeric_cols
    }
    # Scale the longitudes and latitudes to be in [0, 1].
    for lon_col in ["pickup_longitude", "dropoff_longitude"]:
        transformed[lon_col] = tf.keras.layers.Lambda(
            scale_longitude(lon_col), name=f"scale_{lon_col}"
        )(inputs[lon_col])
    for lat_col in ["pickup_latitude", "dropoff_latitude"]:
        transformed[lat_col] = tf.keras.layers.Lambda(
            scale_latitude(lat_col), name=f"scale_{lat_col}"
        )(inputs[lat_col])
    # The distance between pickup and dropoff.
    transformed["euclidean"] = tf.keras.layers.Lambda(euclidean, name="euclidean")(
        [
            inputs["pickup_longitude"],
            inputs["pickup_latitude"],
            inputs["dropoff_longitude"],
            inputs["dropoff_latitude"],
        ]
    )
    feature_columns["euclidean"] = tf.feature_column.numeric_column("euclidean")
    # The grid cells: bucketized, crossed, and the pickup-dropoff pair crossed again.
    latbuckets = np.linspace(0, 1, nbuckets).tolist()
    lonbuckets = np.linspace(0, 1, nbuckets).tolist()
    b_plat = tf.feature_column.bucketized_column(feature_columns["pickup_latitude"], latbuckets)
    b_dlat = tf.feature_column.bucketized_column(feature_columns["dropoff_latitude"], latbuckets)
    b_plon = tf.feature_column.bucketized_column(feature_columns["pickup_longitude"], lonbuckets)
    b_dlon = tf.feature_column.bucketized_column(feature_columns["dropoff_longitude"], lonbuckets)
    ploc = tf.feature_column.crossed_column([b_plat, b_plon], nbuckets * nbuckets)
    dloc = tf.feature_column.crossed_column([b_dlat, b_dlon], nbuckets * nbuckets)
    pd_pair = tf.feature_column.crossed_column([ploc, dloc], nbuckets**4)
    feature_columns["pickup_and_dropoff"] = tf.feature_column.embedding_column(pd_pair, 10)
    return transformed, feature_columns


def rmse(y_true, y_pred):
    return tf.sqrt(tf.reduce_mean(tf.square(y_pred - y_true)))


def build_dnn_model():
    inputs = {
        colname: tf.keras.layers.Input(name=colname, shape=(), dtype="float32")
        for colname in NUMERIC_COLS
    }
    transformed, feature_columns = transform(inputs, NUMERIC_COLS, NBUCKETS)
    dnn_inputs = tf.keras.layers.DenseFeatures(feature_columns.values())(transformed)
    h1 = tf.keras.layers.Dense(32, activation="relu", name="h1")(dnn_inputs)
    h2 = tf.keras.layers.Dense(8, activation="relu", name="h2")(h1)
    output = tf.keras.layers.Dense(1, activation="linear", name="fare")(h2)
    model = tf.keras.models.Model(inputs, output)
    model.compile(optimizer="adam", loss="mse", metrics=[rmse, "mse"])
    return model


model = build_dnn_model()
config = tf.estimator.RunConfig(tf_random_seed=1, model_dir=os.path.join(workdir, "model"))
estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)

TRAIN_BATCH_SIZE = 32
train_path = os.path.join(workdir, "taxi-train.csv")
valid_path = os.path.join(workdir, "taxi-valid.csv")
estimator.train(
    input_fn=lambda: load_dataset(train_path, TRAIN_BATCH_SIZE, tf.estimator.ModeKeys.TRAIN),
    steps=40,
)
metrics = estimator.evaluate(
    input_fn=lambda: load_dataset(valid_path, 32, tf.estimator.ModeKeys.EVAL)
)
predictions = list(
    estimator.predict(input_fn=lambda: load_dataset(valid_path, 32, tf.estimator.ModeKeys.EVAL))
)
result = {k: float(v) for k, v in metrics.items()}
for name in estimator.get_variable_names():  # what it learnt: the grid embedding, the kernels
    if name.endswith("VARIABLE_VALUE") and "OPTIMIZER" not in name and "/kernel/" in name:
        result["kernel_" + name.split("/")[0]] = float(np.sum(estimator.get_variable_value(name)))
    if "embedding_weights" in name and name.endswith("VARIABLE_VALUE") and "OPTIMIZER" not in name:
        result["embedding"] = float(np.sum(estimator.get_variable_value(name)))
result.update(
    predictions=len(predictions),
    first=float(next(iter(predictions[0].values()))[0]),
    last=float(next(iter(predictions[-1].values()))[0]),
)
print("RESULT " + json.dumps(result))
