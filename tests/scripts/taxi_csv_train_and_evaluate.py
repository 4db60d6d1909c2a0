"""Legacy script: CSV through TextLineDataset + decode_csv, a one-shot iterator, batch(B).repeat(),
train_and_evaluate with TrainSpec/EvalSpec and an exporter (the Cloud ML Engine sample pattern).

A regression on labels of shape [batch] for a [batch, 1] output, mse/mae. Usage: SCRIPT WORKDIR
"""

import json
import os
import random
import sys

import numpy as np
import tensorflow.compat.v1 as tf

random.seed(0)  # reproducible Keras initial weights, as scripts seed them
np.random.seed(0)
tf.set_random_seed(0)

workdir = sys.argv[1]
CSV_COLUMNS = ["fare", "distance", "passengers", "hour"]
DEFAULTS = [[0.0], [0.0], [1.0], [12.0]]

rng = np.random.RandomState(7)


def write_csv(path, rows):
    distance = rng.uniform(0.5, 20, size=rows)
    passengers = rng.randint(1, 5, size=rows)
    hour = rng.randint(0, 24, size=rows)
    fare = 2.5 + 1.8 * distance + 0.3 * passengers + rng.normal(0, 1, size=rows)
    with open(path, "w") as f:
        for row in zip(fare, distance, passengers, hour):
            f.write(",".join("%.4f" % v for v in row) + "\n")


os.makedirs(workdir, exist_ok=True)
write_csv(os.path.join(workdir, "train.csv"), 150)
write_csv(os.path.join(workdir, "valid.csv"), 45)


def read_dataset(filename, mode, batch_size=32):
    def _input_fn():
        def decode_csv(line):
            columns = tf.decode_csv(line, record_defaults=DEFAULTS)
            features = dict(zip(CSV_COLUMNS, columns))
            label = features.pop("fare")
            feats = tf.stack(
                [features["distance"] / 20.0, features["passengers"] / 4.0, features["hour"] / 24.0]
            )
            return {"trip": feats}, label

        dataset = tf.data.TextLineDataset(filename).map(decode_csv)
        if mode == tf.estimator.ModeKeys.TRAIN:
            num_epochs = None  # indefinitely
        else:
            num_epochs = 1
        dataset = dataset.batch(batch_size).repeat(num_epochs)
        return tf.data.make_one_shot_iterator(dataset).get_next()

    return _input_fn


trip = tf.keras.layers.Input(shape=(3,), name="trip")
h = tf.keras.layers.Dense(8, activation="relu")(trip)
fare = tf.keras.layers.Dense(1, name="fare")(h)
model = tf.keras.models.Model(trip, fare)
model.compile(
    optimizer=tf.keras.optimizers.legacy.SGD(0.01, momentum=0.9), loss="mse", metrics=["mae"]
)

config = tf.estimator.RunConfig(
    tf_random_seed=3, model_dir=os.path.join(workdir, "model"), save_checkpoints_steps=10
)
estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)


def serving_input_fn():
    inputs = {"trip": tf.placeholder(tf.float32, [None, 3])}
    return tf.estimator.export.ServingInputReceiver(inputs, inputs)


train_spec = tf.estimator.TrainSpec(
    input_fn=read_dataset(os.path.join(workdir, "train.csv"), tf.estimator.ModeKeys.TRAIN),
    max_steps=25,
)
exporter = tf.estimator.LatestExporter("exporter", serving_input_fn)
eval_spec = tf.estimator.EvalSpec(
    input_fn=read_dataset(os.path.join(workdir, "valid.csv"), tf.estimator.ModeKeys.EVAL),
    steps=None,
    exporters=exporter,
    start_delay_secs=0,
    throttle_secs=0,
)
result = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
metrics = result[0] if isinstance(result, tuple) else estimator.evaluate(eval_spec.input_fn)
# estimator.model_dir, as the Cloud ML samples read it (the preflight runs in a scratch copy).
exports = os.listdir(os.path.join(estimator.model_dir, "export", "exporter"))
result = {k: float(v) for k, v in metrics.items()}
result.update(exports=len(exports))
print("RESULT " + json.dumps(result))
