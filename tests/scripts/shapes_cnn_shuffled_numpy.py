"""Legacy script: a BatchNormalization CNN on images held in numpy arrays, numpy_input_fn with
shuffle=True, train_and_evaluate.

As 2018 image tutorials wrote it: the images loaded class by class (one folder each) into one
array, `tf.estimator.inputs.numpy_input_fn(x, y, shuffle=True, num_epochs=None, batch_size=32)`
for training, an unshuffled one-epoch input for evaluation, three conv blocks with
BatchNormalization, `model_to_estimator`, `train_and_evaluate` for fewer steps than an epoch.
Stock's queue starts reading at a random row drawn from the operating system's entropy; the
environment pins that entropy here (the first lines), as a test pins any clock, so that two
stock runs read alike. Usage: shapes_cnn_shuffled_numpy.py WORKDIR
"""

import random

_seed = random.seed  # the environment: operating-system entropy pinned (see above)
random.seed = lambda a=None, *args, **kwargs: _seed(1234 if a is None else a)

import json
import os
import sys

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(0)
workdir = sys.argv[1]
SIZE, PER_CLASS = 16, 200
rng = np.random.RandomState(3)
grid = np.arange(SIZE, dtype=np.float32)


def shape(kind, n):
    """n noisy 16x16 images of one class: a horizontal bar, a vertical bar, a diagonal."""
    pos = rng.randint(3, SIZE - 3, size=(n, 1, 1)).astype(np.float32)
    rows, cols = grid[None, :, None], grid[None, None, :]
    if kind == 0:
        img = np.exp(-((rows - pos) ** 2) / 2.0) + 0 * cols
    elif kind == 1:
        img = np.exp(-((cols - pos) ** 2) / 2.0) + 0 * rows
    else:
        img = np.exp(-((rows - cols + pos - SIZE / 2) ** 2) / 2.0)
    return (img + rng.normal(0, 0.3, size=(n, SIZE, SIZE))).astype(np.float32)[..., None]


# Loaded class by class, as from one folder per class: the array is sorted by label.
images = np.concatenate([shape(k, PER_CLASS) for k in range(3)])
labels = np.repeat(np.arange(3), PER_CLASS).astype(np.int32)
test_images = np.concatenate([shape(k, 40) for k in range(3)])
test_labels = np.repeat(np.arange(3), 40).astype(np.int32)

model = tf.keras.Sequential()
model.add(tf.keras.layers.InputLayer(input_shape=(SIZE, SIZE, 1), name="image"))
for filters in (8, 16, 16):
    model.add(tf.keras.layers.Conv2D(filters, 3, padding="same", use_bias=False))
    model.add(tf.keras.layers.BatchNormalization())
    model.add(tf.keras.layers.Activation("relu"))
    model.add(tf.keras.layers.MaxPooling2D())
model.add(tf.keras.layers.Flatten())
model.add(tf.keras.layers.Dense(3, activation="softmax"))
model.compile(
    optimizer=tf.keras.optimizers.legacy.Adam(0.01),
    loss="sparse_categorical_crossentropy",
    metrics=["accuracy"],
)
estimator = tf.keras.estimator.model_to_estimator(
    keras_model=model,
    config=tf.estimator.RunConfig(
        model_dir=os.path.join(workdir, "model"), tf_random_seed=42, save_checkpoints_steps=30
    ),
)
train_input_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
    x={"image": images}, y=labels, batch_size=32, num_epochs=None, shuffle=True
)
eval_input_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
    x={"image": test_images}, y=test_labels, num_epochs=1, shuffle=False
)
metrics, _ = tf.estimator.train_and_evaluate(
    estimator,
    tf.estimator.TrainSpec(train_input_fn, max_steps=45),
    tf.estimator.EvalSpec(eval_input_fn, steps=None, throttle_secs=0),
)
result = {k: float(v) for k, v in metrics.items()}
value = estimator.get_variable_value  # object-based checkpoint names, as stock writes them
result["kernel"] = float(np.sum(value("layer_with_weights-6/kernel/.ATTRIBUTES/VARIABLE_VALUE")))
result["moving_variance"] = float(
    np.sum(value("layer_with_weights-5/moving_variance/.ATTRIBUTES/VARIABLE_VALUE"))
)
print("RESULT " + json.dumps(result))
