"""Rung 2b for the strategy engine, run as its own process (the logical devices must be made
before TensorFlow initialises): ``python strategy_proof.py DIR`` prints one JSON object.

For a mean loss, a SUM loss and a custom one-number loss, 45 examples in global batches of 10
(a short last batch of 5; 10 does not divide among 8 replicas, so every batch is padded to 16):
the stock estimator, the strategy engine on 8 logical CPU devices and on 1, each trained 5 steps
(every example once, the short batch last), evaluated and asked to predict. Reported: the largest
difference to stock of every checkpoint value, eval metric and prediction (relative to the
values' scale), for the engine as it is and for two broken engines (negative controls):
``summed`` -- each replica's gradient that of its own slice's mean, summed over the replicas
(for a SUM loss, ``averaged``: its sum divided by the replicas). Also: stock's estimator reading
the engine's model_dir, and a model XLA cannot compile (the step is compiled with XLA).

A helper run by tests/test_strategy_replicas.py, not a test module.
"""

import json
import os
import sys

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 8)
# Eight devices' ops run at once, some waiting on the others' (the replicas' sums): with the
# inter-op pool of a 2-core machine they can all be waiting and none running.
tf.config.threading.set_inter_op_parallelism_threads(32)

import numpy as np

import tpushim
from tpushim import _strategy

ROWS, BATCH, STEPS = 45, 10, 5
rng = np.random.RandomState(0)
X = rng.randn(ROWS, 4).astype(np.float32)
Y = (X[:, :1] * 2 - X[:, 1:2] + 0.1 * rng.randn(ROWS, 1)).astype(np.float32)


def custom_loss(y_true, y_pred):  # one number for the batch: a mean tpushim cannot read by name
    return tf.reduce_mean(tf.abs(y_true - y_pred)) + tf.reduce_mean(tf.square(y_true - y_pred))


LOSSES = {
    "mean": ("mse", 0.1),
    "sum": (tf.keras.losses.MeanSquaredError(reduction="sum"), 0.005),
    "custom": (custom_loss, 0.1),
}


def model(kind):
    tf.keras.utils.set_random_seed(1)
    loss, rate = LOSSES[kind]
    m = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(5, input_shape=(4,), activation="tanh", name="hidden"),
            tf.keras.layers.Dense(1, name="out"),
        ]
    )
    m.compile(tf.keras.optimizers.legacy.SGD(rate, momentum=0.9), loss=loss, metrics=["mae"])
    return m


def train_input():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(BATCH)


def predict_input():
    return tf.data.Dataset.from_tensor_slices(X).batch(BATCH)


def run(estimator):
    estimator.train(train_input, steps=STEPS)
    metrics = {k: float(v) for k, v in estimator.evaluate(train_input).items()}
    predictions = np.array([p["out"] for p in estimator.predict(predict_input)])
    values = {
        n: np.asarray(estimator.get_variable_value(n), np.float64)
        for n in estimator.get_variable_names()
        if n != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }
    return metrics, predictions, values


def differences(ours, stock):
    def rel(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))

    (m1, p1, v1), (m2, p2, v2) = ours, stock
    return {
        "names_equal": sorted(v1) == sorted(v2),
        "weights": max(rel(v1[n], v2[n]) for n in v2 if n in v1),
        "metrics": max(rel(m1[k], m2[k]) for k in m2),
        "metric_keys_equal": sorted(m1) == sorted(m2),
        "predictions": rel(p1, p2) if p1.shape == p2.shape else float("inf"),
        "rows": int(p1.shape[0]),
    }


def engine(keras_model, model_dir, replicas=8):
    with tpushim.patched(mode="cpu", engine="strategy", quiet=True):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=keras_model, model_dir=model_dir
        )
    if replicas == 1:  # the same engine on one device of this machine
        estimator._tpushim_strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    return estimator


def broken(kind):
    """The engine with the replicas' gradients combined wrongly (see the module docstring)."""
    original = _strategy.replica_loss

    def wrong(*args):
        replicas = args[6]
        loss = original(*args)
        return loss / replicas if kind == "sum" else loss * replicas

    return original, wrong


def main(root):
    out = {"replicas": None}
    for kind in LOSSES:
        stock = run(
            tf.keras.estimator.model_to_estimator(
                keras_model=model(kind), model_dir=os.path.join(root, kind, "stock")
            )
        )
        eight_dir = os.path.join(root, kind, "eight")
        eight = engine(model(kind), eight_dir)
        out["replicas"] = eight.strategy.num_replicas_in_sync
        out[kind] = {
            "eight": differences(run(eight), stock),
            "one": differences(run(engine(model(kind), os.path.join(root, kind, "one"), 1)), stock),
        }
        # Stock's estimator reads the engine's checkpoints: the same evaluation.
        reader = tf.keras.estimator.model_to_estimator(keras_model=model(kind), model_dir=eight_dir)
        read = {k: float(v) for k, v in reader.evaluate(train_input).items()}
        out[kind]["stock_reads_engine"] = max(
            abs(read[k] - v) / max(1.0, abs(v)) for k, v in stock[0].items()
        )
        original, wrong = broken(kind)
        _strategy.replica_loss = wrong
        try:
            control = run(engine(model(kind), os.path.join(root, kind, "control")))
        finally:
            _strategy.replica_loss = original
        out[kind]["control"] = differences(control, stock)

    # XLA: the step is compiled with jit_compile, so an op XLA cannot compile fails the step.
    keras_model = model("mean")
    host_only = tf.keras.Sequential(
        [
            tf.keras.layers.Lambda(
                lambda x: tf.reshape(tf.numpy_function(np.tanh, [x], tf.float32), [-1, 4]),
                input_shape=(4,),
            ),
            *keras_model.layers,
        ]
    )
    host_only.compile(tf.keras.optimizers.legacy.SGD(0.1), loss="mse")
    try:
        engine(host_only, os.path.join(root, "xla")).train(train_input, steps=1)
        out["xla_error"] = None
    except Exception as e:  # the error XLA gives for an op it cannot compile
        out["xla_error"] = f"{type(e).__name__}: {e}"[:2000]
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
