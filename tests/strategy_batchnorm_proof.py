"""BatchNormalization on the strategy engine's 8 replicas, run as its own process (the logical
devices must be made before TensorFlow initialises): ``python strategy_batchnorm_proof.py DIR``
prints one JSON object.

20 examples in global batches of 12 (padded to 16: 2 rows a replica), trained 4 steps (two
epochs; each ends on a batch of 8, whose last 4 replicas hold padding only):

* ``synchronized``: a model with ``BatchNormalization(synchronized=True)`` (statistics summed
  across the replicas: the global batch's real rows, as stock's): the largest difference to stock
  of every weight (the moving statistics included), eval metric and prediction;
* ``padding``, per layer kind (2-D ``dense``, 4-D ``conv``: fused): each replica normalises over
  its own real rows, so the padding rows' values change nothing: the largest weight difference
  between the engine on the input as padded and on padding rows of other values, for the engine
  as it is and (``keras``, the negative control) for Keras's own BatchNormalization call.

A helper run by tests/test_strategy_batchnorm.py, not a test module.
"""

import importlib.util
import json
import os
import sys

if importlib.util.find_spec("tensorflow_estimator") is None:  # TensorFlow >= 2.16
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras is tf_keras there

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 8)
tf.config.threading.set_inter_op_parallelism_threads(32)  # as strategy_proof.py: no starved pool

import numpy as np
import tfcases

from tpushim import _batchnorm, _padding

ROWS, BATCH, STEPS = 20, 12, 4
ENGINE = {"mode": "cpu", "engine": "strategy", "quiet": True}


def data(kind):
    rng = np.random.RandomState(0)
    shape = (ROWS, 4) if kind != "conv" else (ROWS, 4, 4, 2)
    x = (rng.randn(*shape) * 2 + 1).astype("float32")
    return x, rng.randint(0, 3, size=(ROWS, 1)).astype("int64")


def model(kind):
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    norm = tf.keras.layers.experimental.SyncBatchNormalization
    if kind == "conv":
        layers = [
            tf.keras.layers.Conv2D(3, 2, input_shape=(4, 4, 2), name="conv"),
            tf.keras.layers.BatchNormalization(momentum=0.5, name="norm"),
            tf.keras.layers.Flatten(),
        ]
    else:
        layers = [
            tf.keras.layers.Dense(6, input_shape=(4,), name="hidden"),
            # The class, not synchronized=True: Keras's get_config drops that (stock's clone too).
            (norm if kind == "synchronized" else tf.keras.layers.BatchNormalization)(
                momentum=0.5, name="norm"
            ),
        ]
    m = tf.keras.Sequential([*layers, tf.keras.layers.Dense(3, activation="softmax", name="probs")])
    m.compile(
        tf.keras.optimizers.legacy.SGD(0.1),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return m


def run(kind, model_dir, patch, evaluate=False):
    x, y = data(kind)

    def train():  # each epoch ends on a short batch
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()

    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
    estimator = tfcases.convert(model_dir, model(kind), patch=patch, config=config)
    estimator.train(train, steps=STEPS)
    if not evaluate:
        return None, None, None, tfcases.checkpoint_values(model_dir)
    once = tfcases.dataset_input_fn(x, y, batch=BATCH)
    predictions = list(estimator.predict(tfcases.dataset_input_fn(x, batch=BATCH)))
    return estimator, estimator.evaluate(once), predictions, tfcases.checkpoint_values(model_dir)


def largest(a, b):
    return max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in a)


def other_padding(pad_batch):
    """pad_batch whose padding rows hold other values (100 + 7 x: finite, far from the data)."""

    def make(batch_size):
        pad = pad_batch(batch_size)

        def padded(*element):
            features, labels = pad(*element)
            x = features[_padding.FEATURES_KEY]
            real = tf.reshape(features[_padding.PADDING_KEY] > 0, [-1] + [1] * (x.shape.rank - 1))
            features = dict(features)
            features[_padding.FEATURES_KEY] = tf.where(real, x, 100.0 + 7.0 * x)
            return features, labels

        return padded

    return make


def main(root):
    out = {"replicas": len(tf.config.list_logical_devices("CPU")), "tensorflow": tf.__version__}
    stock = run("synchronized", os.path.join(root, "sync-stock"), {"mode": "off"}, True)
    engine = run("synchronized", os.path.join(root, "sync-engine"), ENGINE, True)
    weights = largest(stock[3], engine[3])
    metrics = max(abs(float(stock[1][k]) - float(engine[1][k])) for k in stock[1])
    predictions = max(
        float(np.max(np.abs(a[k] - b[k]))) for a, b in zip(stock[2], engine[2]) for k in a
    )
    out["synchronized"] = {
        "weights": weights,
        "metrics": metrics,
        "predictions": predictions,
        "names_equal": set(stock[3]) == set(engine[3]),
        "moving": sorted(k for k in stock[3] if "moving_mean" in k),
    }
    out["padding"] = {}
    pad_batch, real_rows_call = _padding.pad_batch, _batchnorm.real_rows_call
    for kind in ("dense", "conv"):
        got = {}
        for variant in ("engine", "keras"):
            if variant == "keras":  # Keras's own call: the padding rows in the statistics
                _batchnorm.real_rows_call = lambda *args: None
            try:
                padded = run(kind, os.path.join(root, kind, variant, "a"), ENGINE)[3]
                _padding.pad_batch = other_padding(pad_batch)
                try:
                    other = run(kind, os.path.join(root, kind, variant, "b"), ENGINE)[3]
                finally:
                    _padding.pad_batch = pad_batch
            finally:
                _batchnorm.real_rows_call = real_rows_call
            got[variant] = largest(padded, other)
        out["padding"][kind] = got
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
