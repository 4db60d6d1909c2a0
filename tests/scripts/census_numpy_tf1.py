"""Legacy script: TF1 style, numpy_input_fn with a dict of float64 features, Keras -> Estimator.

As found in Cloud ML Engine samples and course notebooks: `import tensorflow.compat.v1 as tf`,
`disable_v2_behavior()`, `optimizer='adam'` as a string, labels of shape [batch] for a [batch, 1]
sigmoid output, a float max_steps. Usage: census_numpy_tf1.py WORKDIR
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
rng = np.random.RandomState(42)
n_train, n_eval = 200, 70
age = rng.uniform(18, 90, size=n_train + n_eval)  # float64, straight from a dataframe
hours = rng.uniform(1, 80, size=n_train + n_eval)
income = ((age / 90.0 + hours / 80.0 + rng.normal(0, 0.2, size=age.shape)) > 1.0).astype(np.float32)
x = {"age": (age - 50.0) / 20.0, "hours": (hours - 40.0) / 20.0}

inputs = {k: tf.keras.layers.Input(shape=(), name=k) for k in ("age", "hours")}
stacked = tf.keras.layers.Lambda(lambda d: tf.stack([d["age"], d["hours"]], axis=1))(inputs)
hidden = tf.keras.layers.Dense(16, activation="relu")(stacked)
output = tf.keras.layers.Dense(1, activation="sigmoid")(hidden)
model = tf.keras.models.Model(inputs=inputs, outputs=output)
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])

config = tf.estimator.RunConfig(tf_random_seed=1, model_dir=os.path.join(workdir, "model"))
estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)

train_x = {k: v[:n_train] for k, v in x.items()}
eval_x = {k: v[n_train:] for k, v in x.items()}
train_input_fn = tf.estimator.inputs.numpy_input_fn(
    x=train_x, y=income[:n_train], batch_size=32, num_epochs=None, shuffle=False
)
eval_input_fn = tf.estimator.inputs.numpy_input_fn(
    x=eval_x, y=income[n_train:], batch_size=32, num_epochs=1, shuffle=False
)

estimator.train(input_fn=train_input_fn, max_steps=2e1)  # float, as scripts compute it
metrics = estimator.evaluate(input_fn=eval_input_fn)
predictions = [
    p
    for p in estimator.predict(
        tf.estimator.inputs.numpy_input_fn(x=eval_x, batch_size=32, num_epochs=1, shuffle=False)
    )
]
result = {k: float(v) for k, v in metrics.items()}
result.update(
    predictions=len(predictions),
    first=float(next(iter(predictions[0].values()))[0]),
    last=float(next(iter(predictions[-1].values()))[0]),
)
print("RESULT " + json.dumps(result))
