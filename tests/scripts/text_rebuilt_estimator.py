"""Legacy script: a text classifier trainer as public ones write it. Token ids padded to 20, an
Embedding, average pooling and a sigmoid, converted with `model_to_estimator`; the trainer then
rebuilds the estimator around the converted one's model_fn with its own model_dir and RunConfig
(`tf.estimator.Estimator(model_fn=estimator.model_fn, ...)`) and trains and evaluates that one.
240 training rows in `batch(32).repeat()`, 60 evaluation rows (a short last batch).
Usage: SCRIPT WORKDIR
"""

import json
import os
import random
import sys

import numpy as np
import tensorflow as tf

random.seed(0)
np.random.seed(0)
tf.random.set_seed(0)

workdir = sys.argv[1]
VOCAB, LENGTH = 50, 20
rng = np.random.RandomState(5)
lengths = rng.randint(3, LENGTH + 1, 300)
ids = np.zeros((300, LENGTH), "int64")
for i, n in enumerate(lengths):
    ids[i, :n] = rng.randint(1, VOCAB, n)
labels = ((ids >= VOCAB // 2).sum(1) > lengths / 2).astype("float32")[:, None]


def input_fn(rows, repeat):
    dataset = tf.data.Dataset.from_tensor_slices(({"tokens": ids[rows]}, labels[rows]))
    dataset = dataset.batch(32)
    return dataset.repeat() if repeat else dataset


tokens = tf.keras.Input((LENGTH,), dtype=tf.int64, name="tokens")
x = tf.keras.layers.Embedding(VOCAB, 8)(tokens)
x = tf.keras.layers.GlobalAveragePooling1D()(x)
output = tf.keras.layers.Dense(1, activation="sigmoid", name="positive")(x)
model = tf.keras.Model(tokens, output)
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])

keras_estimator = tf.keras.estimator.model_to_estimator(
    keras_model=model, model_dir=os.path.join(workdir, "keras")
)
run_config = tf.estimator.RunConfig(tf_random_seed=3, save_checkpoints_steps=20)
estimator = tf.estimator.Estimator(
    model_fn=keras_estimator.model_fn,
    model_dir=os.path.join(workdir, "model"),
    config=run_config,
)
estimator.train(input_fn=lambda: input_fn(np.arange(240), repeat=True), steps=40)
metrics = estimator.evaluate(input_fn=lambda: input_fn(np.arange(240, 300), repeat=False))
print("RESULT " + json.dumps({k: float(v) for k, v in metrics.items()}))
