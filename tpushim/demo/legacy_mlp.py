"""A legacy Keras -> Estimator training script, as its owner wrote it (no tpushim in here).

A 2-layer MLP classifier on synthetic, seeded data (three Gaussian blobs), compiled with the legacy
SGD optimizer with momentum, converted with ``tf.keras.estimator.model_to_estimator``, trained for a
few hundred steps, evaluated, and used to predict. Run it as it is (``python legacy_mlp.py``), or
with tpushim: ``python -m tpushim -m tpushim.demo.legacy_mlp``.
"""

import tempfile

import numpy as np
import tensorflow as tf

SEED = 1234
NUM_FEATURES = 20
NUM_CLASSES = 3
BATCH_SIZE = 64  # 8 per core on an 8-core TPU: the smallest batch that keeps its matrix units busy
TRAIN_STEPS = 300


def make_data(num_examples, seed):
    """Three Gaussian blobs in NUM_FEATURES dimensions; labels one-hot."""
    rng = np.random.RandomState(seed)
    centers = np.random.RandomState(SEED).normal(0.0, 1.0, (NUM_CLASSES, NUM_FEATURES))
    labels = rng.randint(0, NUM_CLASSES, num_examples)
    features = centers[labels] + rng.normal(0.0, 1.5, (num_examples, NUM_FEATURES))
    return features.astype(np.float32), np.eye(NUM_CLASSES, dtype=np.float32)[labels]


def build_model():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(
                32, activation="relu", input_shape=(NUM_FEATURES,), name="hidden"
            ),
            tf.keras.layers.Dense(NUM_CLASSES, activation="softmax", name="probabilities"),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.legacy.SGD(learning_rate=0.05, momentum=0.9),
        loss="categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def train_input_fn(features, labels):
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    return dataset.shuffle(1000, seed=SEED).repeat().batch(BATCH_SIZE)


def eval_input_fn(features, labels=None):
    inputs = features if labels is None else (features, labels)
    return tf.data.Dataset.from_tensor_slices(inputs).batch(BATCH_SIZE)


def train_and_evaluate(model_dir):
    """Trains, evaluates and predicts; returns (evaluate() results, predicted probabilities)."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(SEED)  # same initial weights every run
    x_train, y_train = make_data(1000, seed=1)
    x_eval, y_eval = make_data(200, seed=2)

    model = build_model()
    config = tf.estimator.RunConfig(
        model_dir=model_dir, tf_random_seed=SEED, log_step_count_steps=TRAIN_STEPS
    )
    estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)

    estimator.train(input_fn=lambda: train_input_fn(x_train, y_train), steps=TRAIN_STEPS)
    results = estimator.evaluate(input_fn=lambda: eval_input_fn(x_eval, y_eval))
    predictions = np.stack(
        [p["probabilities"] for p in estimator.predict(input_fn=lambda: eval_input_fn(x_eval))]
    )
    return results, predictions


def main():
    with tempfile.TemporaryDirectory(prefix="legacy_mlp_") as model_dir:
        results, predictions = train_and_evaluate(model_dir)
    print("evaluate():", {k: float(v) for k, v in sorted(results.items())})
    print("predict(): %d examples, first: %s" % (len(predictions), np.round(predictions[0], 4)))


if __name__ == "__main__":
    main()
