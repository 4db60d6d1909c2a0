"""Legacy script as siamese / transfer-learning projects write it: JPEG files decoded without a
channel count (``decode_jpeg(x)``) and resized to 224x224 -- a static shape of (224, 224, ?) --
for a model whose Input declares (224, 224, 3) and whose convolutional base is a nested model
(as a Keras application is). A global batch of 10, evaluation on 24 images (a short last batch).

Usage: python jpeg_pairs_224.py WORKDIR
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

workdir = sys.argv[1]
images = os.path.join(workdir, "images")
os.makedirs(images, exist_ok=True)
rng = np.random.RandomState(0)


def write_jpegs(n, prefix):
    paths, labels = [], []
    for i in range(n):
        label = i % 2
        size = rng.randint(40, 90, 2)
        pixels = rng.randint(0, 120, (*size, 3)) + 100 * label  # brighter: class 1
        path = os.path.join(images, f"{prefix}{i}.jpg")
        tf.io.write_file(path, tf.io.encode_jpeg(pixels.astype("uint8")))
        paths.append(path)
        labels.append(float(label))
    return paths, np.array(labels, np.float32)


train_paths, train_labels = write_jpegs(30, "train")
eval_paths, eval_labels = write_jpegs(24, "eval")


def load(path, label):
    image = tf.image.decode_jpeg(tf.io.read_file(path))  # channels unknown until decoded
    image = tf.image.resize(image, [224, 224]) / 255.0
    return {"image": image}, label


def train_input_fn():
    dataset = tf.data.Dataset.from_tensor_slices((train_paths, train_labels))
    return dataset.shuffle(30, seed=2).map(load).repeat().batch(10)


def eval_input_fn():
    return tf.data.Dataset.from_tensor_slices((eval_paths, eval_labels)).map(load).batch(10)


def base_network():
    """A small stand-in for MobileNetV2(include_top=False, weights=None)."""
    image = tf.keras.Input((224, 224, 3))
    x = tf.keras.layers.Conv2D(4, 8, strides=8, activation="tanh")(image)
    x = tf.keras.layers.Conv2D(4, 3, strides=2, activation="tanh")(x)
    return tf.keras.Model(image, tf.keras.layers.GlobalAveragePooling2D()(x), name="base")


tf.keras.utils.set_random_seed(4)
image = tf.keras.Input((224, 224, 3), name="image")
score = tf.keras.layers.Dense(1, activation="sigmoid", name="score")(base_network()(image))
model = tf.keras.Model(image, score)
model.compile(tf.keras.optimizers.legacy.Adam(0.05), "binary_crossentropy", metrics=["accuracy"])

estimator = tf.keras.estimator.model_to_estimator(
    keras_model=model,
    model_dir=os.path.join(workdir, "model"),
    config=tf.estimator.RunConfig(tf_random_seed=5),
)
estimator.train(train_input_fn, steps=6)
result = {k: float(v) for k, v in estimator.evaluate(eval_input_fn).items()}
predictions = list(estimator.predict(lambda: eval_input_fn().map(lambda x, y: x)))
result.update(
    predicted=len(predictions),
    score_mean=float(np.mean([p["score"][0] for p in predictions])),
)
print("RESULT " + json.dumps(result))
