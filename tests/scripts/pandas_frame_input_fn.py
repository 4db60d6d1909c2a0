"""Legacy script: a pandas DataFrame and Series through pandas_input_fn, Keras -> Estimator.

As course notebooks wrote it: `tf.compat.v1.estimator.inputs.pandas_input_fn` for training
(repeating, unshuffled), evaluation (one epoch, a short last batch) and prediction (features only),
a dict of named scalar inputs stacked in the model. Usage: pandas_frame_input_fn.py WORKDIR
"""

import json
import os
import sys

import numpy as np
import pandas as pd
import tensorflow as tf

tf.keras.utils.set_random_seed(0)
workdir = sys.argv[1]
rng = np.random.RandomState(0)
frame = pd.DataFrame(
    {"a": rng.normal(size=90).astype("float32"), "b": rng.normal(size=90).astype("float32")}
)
target = pd.Series((frame.a + frame.b > 0).astype("float32"))

inputs = {k: tf.keras.layers.Input(shape=(), name=k) for k in ("a", "b")}
stacked = tf.keras.layers.Lambda(lambda d: tf.stack([d["a"], d["b"]], axis=1))(inputs)
hidden = tf.keras.layers.Dense(8, activation="relu")(stacked)
model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, activation="sigmoid")(hidden))
model.compile(tf.keras.optimizers.legacy.Adam(0.01), "binary_crossentropy", metrics=["accuracy"])
estimator = tf.keras.estimator.model_to_estimator(
    keras_model=model,
    config=tf.estimator.RunConfig(tf_random_seed=1, model_dir=os.path.join(workdir, "model")),
)
pandas_input_fn = tf.compat.v1.estimator.inputs.pandas_input_fn
estimator.train(
    pandas_input_fn(frame, target, batch_size=16, num_epochs=None, shuffle=False), steps=30
)
metrics = estimator.evaluate(
    pandas_input_fn(frame, target, batch_size=16, num_epochs=1, shuffle=False)
)
predictions = list(estimator.predict(pandas_input_fn(frame, batch_size=16, shuffle=False)))
result = {k: float(v) for k, v in metrics.items()}
result.update(
    predictions=len(predictions),
    first=float(next(iter(predictions[0].values()))[0]),
    last=float(next(iter(predictions[-1].values()))[0]),
)
print("RESULT " + json.dumps(result))
