"""Legacy script: text classification with a vocabulary file looked up in the input_fn, an
initializable iterator registered as legacy scripts do (its initializer in TABLE_INITIALIZERS),
disable_v2_behavior(), an eval set smaller than its batch size. Usage: SCRIPT WORKDIR
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
WORDS = ["good", "great", "fine", "bad", "awful", "poor", "movie", "plot", "actors", "the"]
with open(os.path.join(workdir, "vocab.txt"), "w") as f:
    f.write("\n".join(WORDS) + "\n")
rng = np.random.RandomState(5)


def sentences(n):
    lines, labels = [], []
    for _ in range(n):
        words = list(rng.choice(WORDS, size=rng.randint(2, 7)))
        lines.append(" ".join(words))
        labels.append(
            float(
                sum(w in ("good", "great", "fine") for w in words)
                > sum(w in ("bad", "awful", "poor") for w in words)
            )
        )
    return lines, np.array(labels, np.float32)


train_lines, train_labels = sentences(160)
eval_lines, eval_labels = sentences(40)
MAX_LEN = 8


def make_input_fn(lines, labels, batch_size, repeat):
    def input_fn():
        table = tf.lookup.StaticVocabularyTable(
            tf.lookup.TextFileInitializer(
                os.path.join(workdir, "vocab.txt"),
                tf.string,
                tf.lookup.TextFileIndex.WHOLE_LINE,
                tf.int64,
                tf.lookup.TextFileIndex.LINE_NUMBER,
            ),
            num_oov_buckets=1,
        )

        def encode(line, label):
            words = tf.string_split([line]).values[:MAX_LEN]
            ids = table.lookup(words) + 1  # 0 is padding
            ids = tf.pad(ids, [[0, MAX_LEN - tf.shape(ids)[0]]])
            ids.set_shape([MAX_LEN])
            return {"words": ids}, label

        dataset = tf.data.Dataset.from_tensor_slices((lines, labels)).map(encode)
        if repeat:
            dataset = dataset.repeat()
        iterator = tf.data.make_initializable_iterator(dataset.batch(batch_size))
        tf.add_to_collection(tf.GraphKeys.TABLE_INITIALIZERS, iterator.initializer)
        return iterator.get_next()

    return input_fn


words = tf.keras.layers.Input(shape=(MAX_LEN,), name="words", dtype="int64")
embedded = tf.keras.layers.Embedding(len(WORDS) + 2, 8)(words)
pooled = tf.keras.layers.GlobalAveragePooling1D()(embedded)
score = tf.keras.layers.Dense(1, activation="sigmoid")(pooled)
model = tf.keras.Model(words, score)
model.compile(
    optimizer=tf.keras.optimizers.legacy.Adam(0.05),
    loss="binary_crossentropy",
    metrics=["accuracy"],
)

config = tf.estimator.RunConfig(tf_random_seed=9, model_dir=os.path.join(workdir, "model"))
estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
estimator.train(make_input_fn(train_lines, train_labels, 32, True), steps=12)
metrics = estimator.evaluate(make_input_fn(eval_lines, eval_labels, 64, False))  # 40 < 64
print("RESULT " + json.dumps({k: float(v) for k, v in metrics.items()}))
