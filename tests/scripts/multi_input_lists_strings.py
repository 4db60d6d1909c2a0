"""Legacy script: a multi-input, multi-output Keras model fed features and labels as Python lists,
``([a, b, text, city, size], [price, sold])`` as Keras's fit() takes them, one of the features a
string tensor the model parses itself (a Lambda calling tf.strings.to_number), one a city name it
looks up with no out-of-vocabulary bucket, one a size it takes the log of. Lists from a one-shot
iterator (training, ``batch(16).repeat()`` over 60 rows: short batches), from numpy_input_fn
queues (evaluation, 40 rows in batches of 16) and as numpy values; a second estimator evaluates
too. Counts the input_fn calls and prints them with the metrics.

Usage: python multi_input_lists_strings.py WORKDIR
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

CITIES = ["oslo", "lima", "pune", "kobe"]
CALLS = {"train": 0, "eval_queue": 0, "eval_numpy": 0, "predict": 0}


def table(n, seed):
    rng = np.random.RandomState(seed)
    columns = {
        "a": rng.rand(n, 3).astype("float32"),
        "b": rng.rand(n, 2),  # float64, as numpy hands it over
        "text": np.array([[f"{v:.3f}"] for v in rng.uniform(1, 5, n)]),  # numbers as read from CSV
        "city": np.array([[c] for c in rng.choice(CITIES, n)]),
        "size": rng.uniform(1.5, 3.0, (n, 1)).astype("float32"),
    }
    price = (columns["a"].sum(1, keepdims=True) + np.log(columns["size"])) / 10
    sold = (columns["b"][:, 0] > 0.5).astype("float32")
    return columns, {"price": price.astype("float32"), "sold": sold}


NAMES = ["a", "b", "text", "city", "size"]
train_x, train_y = table(60, 0)
eval_x, eval_y = table(40, 1)


# Python functions around TF's: Keras cannot clone a Lambda of tf.math.log itself.
def parse_number(text):
    return tf.strings.to_number(text)


def log(x):
    return tf.math.log(x)


def build_model():
    tf.keras.utils.set_random_seed(1)
    inputs = [
        tf.keras.Input((3,), name="a"),
        tf.keras.Input((2,), name="b"),
        tf.keras.Input((1,), dtype=tf.string, name="text"),
        tf.keras.Input((1,), dtype=tf.string, name="city"),
        tf.keras.Input((1,), name="size"),
    ]
    a, b, text, city, size = inputs
    number = tf.keras.layers.Lambda(parse_number, name="parse")(text)
    city_id = tf.keras.layers.StringLookup(vocabulary=CITIES, num_oov_indices=0, name="city_id")(
        city
    )
    city_vec = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(len(CITIES), 2)(city_id))
    log_size = tf.keras.layers.Lambda(log, name="log_size")(size)
    hidden = tf.keras.layers.Dense(8, activation="relu")(
        tf.keras.layers.Concatenate()([a, b, number, city_vec, log_size])
    )
    price = tf.keras.layers.Dense(1, name="price")(hidden)
    sold = tf.keras.layers.Dense(1, activation="sigmoid", name="sold")(hidden)
    model = tf.keras.Model(inputs, [price, sold])
    model.compile(
        optimizer=tf.keras.optimizers.legacy.Adam(0.01),
        loss=["mse", "binary_crossentropy"],
        metrics=[["mae"], ["accuracy"]],
    )
    return model


def train_input_fn():
    CALLS["train"] += 1
    columns = tuple(train_x[k] for k in NAMES)
    dataset = tf.data.Dataset.from_tensor_slices((columns, (train_y["price"], train_y["sold"])))
    features, labels = tf.compat.v1.data.make_one_shot_iterator(
        dataset.batch(16).repeat()
    ).get_next()
    return list(features), list(labels)


def eval_queue_input_fn():
    CALLS["eval_queue"] += 1
    features, labels = tf.compat.v1.estimator.inputs.numpy_input_fn(
        eval_x, eval_y, batch_size=16, num_epochs=1, shuffle=False
    )()
    return [features[k] for k in NAMES], [labels["price"], labels["sold"]]


def eval_numpy_input_fn():
    CALLS["eval_numpy"] += 1
    return [eval_x[k][:8] for k in NAMES], [eval_y["price"][:8], eval_y["sold"][:8]]


def predict_input_fn():
    CALLS["predict"] += 1
    return tf.data.Dataset.from_tensor_slices(dict(eval_x)).batch(16)


workdir = sys.argv[1]
config = tf.estimator.RunConfig(tf_random_seed=3)
estimator = tf.keras.estimator.model_to_estimator(
    keras_model=build_model(), model_dir=os.path.join(workdir, "model"), config=config
)
estimator.train(train_input_fn, steps=9)
result = {f"queue_{k}": float(v) for k, v in estimator.evaluate(eval_queue_input_fn).items()}
numpy_metrics = estimator.evaluate(eval_numpy_input_fn, steps=2)
result.update({f"numpy_{k}": float(v) for k, v in numpy_metrics.items()})
predictions = list(estimator.predict(predict_input_fn))
result.update(
    predicted=len(predictions),
    price_mean=float(np.mean([p["price"][0] for p in predictions])),
    sold_last=float(predictions[-1]["sold"][0]),
)
# A second estimator: the run's first conversion is not the only one.
fresh = tf.keras.estimator.model_to_estimator(
    keras_model=build_model(), model_dir=os.path.join(workdir, "fresh"), config=config
)
result.update({f"fresh_{k}": float(v) for k, v in fresh.evaluate(eval_queue_input_fn).items()})
result.update({f"calls_{k}": v for k, v in CALLS.items()})
print("RESULT " + json.dumps(result))
