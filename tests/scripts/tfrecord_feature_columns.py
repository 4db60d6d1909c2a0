"""Legacy script: TFRecords parsed in Dataset.map, feature columns turned into a dense tensor with
tf.feature_column.input_layer inside the map (numeric and one-hot identity columns), a one-shot
iterator, a custom metric function, and a tf.train optimizer (tf-estimator-tutorials style).
Usage: SCRIPT WORKDIR
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
os.makedirs(workdir, exist_ok=True)
COLORS = ["red", "green", "blue"]
rng = np.random.RandomState(11)


def write_records(path, rows):
    with tf.io.TFRecordWriter(path) as writer:
        for _ in range(rows):
            size = float(rng.uniform(0, 1))
            color = rng.randint(0, 3)
            label = int(size > 0.5 or color == 0)
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "size": tf.train.Feature(float_list=tf.train.FloatList(value=[size])),
                        "color": tf.train.Feature(int64_list=tf.train.Int64List(value=[color])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                    }
                )
            )
            writer.write(example.SerializeToString())


write_records(os.path.join(workdir, "train.tfrecord"), 120)
write_records(os.path.join(workdir, "eval.tfrecord"), 50)

FEATURE_COLUMNS = [
    tf.feature_column.numeric_column("size"),
    tf.feature_column.indicator_column(
        tf.feature_column.categorical_column_with_identity("color", len(COLORS))
    ),
]
SPEC = {
    "size": tf.FixedLenFeature([1], tf.float32),
    "color": tf.FixedLenFeature([1], tf.int64),
    "label": tf.FixedLenFeature([1], tf.int64),
}


def make_input_fn(path, epochs, batch_size=16):
    def input_fn():
        def parse(serialized):
            parsed = tf.parse_example(serialized, SPEC)
            label = tf.cast(parsed.pop("label"), tf.float32)
            return {"encoded": tf.feature_column.input_layer(parsed, FEATURE_COLUMNS)}, label

        dataset = tf.data.TFRecordDataset(path).repeat(epochs).batch(batch_size).map(parse)
        return tf.data.make_one_shot_iterator(dataset).get_next()

    return input_fn


def true_positive_rate(y_true, y_pred):
    positives = tf.keras.backend.cast(y_true > 0.5, "float32")
    hits = positives * tf.keras.backend.cast(y_pred > 0.5, "float32")
    return tf.keras.backend.sum(hits) / (tf.keras.backend.sum(positives) + 1e-7)


dense = tf.keras.layers.Input(shape=(4,), name="encoded")
hidden = tf.keras.layers.Dense(8, activation="tanh")(dense)
out = tf.keras.layers.Dense(1, activation="sigmoid")(hidden)
model = tf.keras.Model(dense, out)
model.compile(
    optimizer=tf.train.AdamOptimizer(0.05),
    loss="binary_crossentropy",
    metrics=["accuracy", true_positive_rate],
)

config = tf.estimator.RunConfig(tf_random_seed=5, model_dir=os.path.join(workdir, "model"))
estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
estimator.train(make_input_fn(os.path.join(workdir, "train.tfrecord"), None), steps=15)
metrics = estimator.evaluate(make_input_fn(os.path.join(workdir, "eval.tfrecord"), 1))
print("RESULT " + json.dumps({k: float(v) for k, v in metrics.items()}))
