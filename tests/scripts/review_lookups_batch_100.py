"""Legacy script: product reviews classified from words looked up in the input_fn's own graph,
outside any Dataset.map -- a vocabulary file (StaticVocabularyTable over tf.string_split), a
StaticHashTable for the product category, a vocabulary-list feature column through input_layer
-- then ``Dataset.from_tensor_slices`` of the looked-up ids. Global batches of 100 (training),
50 (evaluation, 120 reviews) and 20 (prediction), none a multiple of a TPU's 8 cores.
disable_v2_behavior(); train_and_evaluate with an EvalSpec, then predict. Counts the input_fn
calls and prints them with the metrics.

Usage: python review_lookups_batch_100.py WORKDIR
"""

import json
import os
import random
import sys

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()
random.seed(0)  # reproducible Keras initial weights, as scripts seed them
np.random.seed(0)
tf.set_random_seed(0)

workdir = sys.argv[1]
os.makedirs(workdir, exist_ok=True)
WORDS = ["good", "great", "fine", "bad", "awful", "poor", "phone", "battery", "screen", "the"]
CATEGORIES = ["phones", "laptops", "cameras"]
COLORS = ["black", "white", "red"]
MAX_LEN = 6
VOCAB = os.path.join(workdir, "vocab.txt")
with open(VOCAB, "w") as f:
    f.write("\n".join(WORDS) + "\n")
CALLS = {"train": 0, "eval": 0, "predict": 0}


def reviews(n, seed):
    rng = np.random.RandomState(seed)
    texts, labels = [], []
    for _ in range(n):
        words = list(rng.choice(WORDS + ["meh"], size=rng.randint(2, MAX_LEN + 1)))
        texts.append(" ".join(words))
        good = sum(w in ("good", "great", "fine") for w in words)
        labels.append(float(good > sum(w in ("bad", "awful", "poor") for w in words)))
    categories = list(rng.choice(CATEGORIES, n))
    colors = list(rng.choice(COLORS, n))
    return texts, categories, colors, np.array(labels, np.float32).reshape(n, 1)


def features(texts, categories, colors):
    """Ids and one-hot columns computed in the input_fn's graph, before any Dataset exists."""
    words = tf.lookup.StaticVocabularyTable(
        tf.lookup.TextFileInitializer(
            VOCAB,
            tf.string,
            tf.lookup.TextFileIndex.WHOLE_LINE,
            tf.int64,
            tf.lookup.TextFileIndex.LINE_NUMBER,
        ),
        num_oov_buckets=1,
    )
    split = tf.string_split(tf.constant(texts))
    ids = tf.sparse.to_dense(
        tf.sparse.reset_shape(words.lookup(split), [len(texts), MAX_LEN]), default_value=-1
    )
    category = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(CATEGORIES, list(range(len(CATEGORIES))), tf.string),
        default_value=0,
    ).lookup(tf.constant(categories))
    color = tf.feature_column.input_layer(
        {"color": tf.constant(colors)},
        [
            tf.feature_column.indicator_column(
                tf.feature_column.categorical_column_with_vocabulary_list("color", COLORS)
            )
        ],
    )
    return {"words": ids + 1, "category": category[:, None], "color": color}  # 0: padding


def make_input_fn(data, batch_size, kind):
    def input_fn():
        CALLS[kind] += 1
        texts, categories, colors, labels = data
        x = features(texts, categories, colors)
        if kind == "predict":
            return tf.data.Dataset.from_tensor_slices(x).batch(batch_size)
        dataset = tf.data.Dataset.from_tensor_slices((x, labels))
        if kind == "train":
            dataset = dataset.shuffle(len(texts), seed=1).repeat()
        return dataset.batch(batch_size)

    return input_fn


words_in = tf.keras.layers.Input(shape=(MAX_LEN,), name="words", dtype="int64")
category_in = tf.keras.layers.Input(shape=(1,), name="category", dtype="int32")
color_in = tf.keras.layers.Input(shape=(len(COLORS),), name="color")
pooled = tf.keras.layers.GlobalAveragePooling1D()(
    tf.keras.layers.Embedding(len(WORDS) + 2, 8)(words_in)
)
category_vec = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(len(CATEGORIES), 2)(category_in))
hidden = tf.keras.layers.Concatenate()([pooled, category_vec, color_in])
score = tf.keras.layers.Dense(1, activation="sigmoid", name="score")(hidden)
model = tf.keras.Model([words_in, category_in, color_in], score)
model.compile(
    optimizer=tf.keras.optimizers.legacy.Adam(0.05),
    loss="binary_crossentropy",
    metrics=["accuracy"],
)

config = tf.estimator.RunConfig(tf_random_seed=9, model_dir=os.path.join(workdir, "model"))
estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
train = reviews(400, 1)
test = reviews(120, 2)  # batches of 50: 50, 50, 20
metrics, _ = tf.estimator.train_and_evaluate(
    estimator,
    tf.estimator.TrainSpec(make_input_fn(train, 100, "train"), max_steps=8),
    tf.estimator.EvalSpec(make_input_fn(test, 50, "eval"), steps=None, throttle_secs=0),
)
predictions = list(estimator.predict(make_input_fn(test, 20, "predict")))
result = {k: float(v) for k, v in metrics.items()}
result.update(
    predicted=len(predictions),
    score_mean=float(np.mean([p["score"][0] for p in predictions])),
    score_last=float(predictions[-1]["score"][0]),
)
result.update({f"calls_{k}": v for k, v in CALLS.items()})
print("RESULT " + json.dumps(result))
