"""Subclassed Keras models on the strategy engine, run as its own process (the logical devices
must be made before TensorFlow initialises): ``python strategy_subclassed_proof.py DIR`` prints
one JSON object.

Stock's ``model_to_estimator`` takes a subclassed model with ``checkpoint_format='saver'`` and
clones it from its config (``cls.from_config(model.get_config())``) in each call's graph: the
estimator starts from fresh weights (no warm start, a built model's weights dropped with a
warning), names its outputs ``output_1``, ``output_2``, ... and its variables
``<model>/<layer>/...``, and never calls the model's own ``train_step``. For each model below
(45 examples in global batches of 10, a short last batch of 5, every batch padded to 16 on 8
replicas), the stock estimator and the strategy engine on 8 logical CPU devices and on 1 each
train 5 steps, evaluate and predict; reported: the largest difference to stock of every model
variable (the engine's object-based checkpoint read by each variable's full name, as stock's
name-based Saver reads it), eval metric and prediction, and whether the user's model kept its
weights. The models: ``plain`` (no build of its own, never called before conversion),
``built`` (the same, called before conversion and its weights moved: neither starts from
them), ``multi`` (dict features as legacy scripts feed them, two outputs, dict labels
``output_1`` / ``output_2``), ``bn`` (BatchNormalization and a training-flag branch; 40 rows,
4 full batches, 1 replica only: see ``ONE``), ``stepped`` (a custom ``train_step`` stock never
calls), ``rows`` ([batch] labels of its [batch, 1] output and a SUM mse: Keras squeezes the
output, so the loss is one number for the batch, the rows' mean). Variables are compared by
their path below the model's own name (Keras numbers a
model's name by the models made before it in the process). Negative control: the engine
warm-started from the built model's weights (``built`` against stock must then differ).

On TensorFlow >= 2.16 stock is stock TF 2.15's numbers, recorded by ``python
strategy_subclassed_proof.py --record tests/reference/strategy_subclassed_tf215.json DIR`` in a
TF 2.15 venv.

A helper run by tests/proofs/test_strategy_subclassed.py, not a test module.
"""

import json
import os
import sys

import eight_devices  # first: 8 logical CPU devices, before TensorFlow initialises
import numpy as np
import tensorflow as tf
from tensorflow.python.training import saver as saver_lib

import tpushim
from tpushim import _padding
from tpushim._strategy import loss as _strategy_loss
from tpushim._strategy import plan as _strategy_plan

ROWS, BATCH, STEPS = 45, 10, 5
rng = np.random.RandomState(0)
X = rng.randn(ROWS, 4).astype(np.float32)
Y = (X[:, :1] * 2 - X[:, 1:2] + 0.1 * rng.randn(ROWS, 1)).astype(np.float32)
C = (X[:, 2:3] > 0).astype(np.int64)
KINDS = ("plain", "built", "multi", "bn", "stepped", "rows")
EIGHT = ("plain", "built", "multi", "stepped", "rows")  # run on 8 replicas
# Run on 1 replica. bn is not run on 8: each replica normalises by its own rows' moments
# (Keras's BatchNormalization under a MirroredStrategy), stock by the global batch's.
ONE = ("plain", "multi", "bn", "rows")


def _init(seed):  # seeded: stock's fresh graph and the engine draw the same start
    return tf.keras.initializers.GlorotUniform(seed=seed)


class Plain(tf.keras.Model):
    """No build of its own; Keras derives its config from its (absent) __init__ arguments."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = tf.keras.layers.Dense(5, activation="tanh", kernel_initializer=_init(1))
        self.out = tf.keras.layers.Dense(1, kernel_initializer=_init(2))

    def call(self, x):
        return self.out(self.hidden(x))


class Multi(tf.keras.Model):
    """Dict features {"u", "v"}, two outputs (a regression, a 2-class softmax)."""

    def __init__(self, units=6, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = tf.keras.layers.Dense(units, activation="tanh", kernel_initializer=_init(3))
        self.reg = tf.keras.layers.Dense(1, kernel_initializer=_init(4))
        self.cls = tf.keras.layers.Dense(2, activation="softmax", kernel_initializer=_init(5))

    def call(self, inputs):
        h = self.hidden(tf.concat([inputs["u"], inputs["v"]], axis=1))
        return self.reg(h), self.cls(h)

    def get_config(self):
        return {"units": self.units}


class Normalized(tf.keras.Model):
    """BatchNormalization (batch moments in training, moving ones otherwise) and a branch on
    the training flag (noise in training only: dropout's shape, without its random masks)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = tf.keras.layers.Dense(5, kernel_initializer=_init(6))
        self.bn = tf.keras.layers.BatchNormalization(momentum=0.5)
        self.out = tf.keras.layers.Dense(1, kernel_initializer=_init(7))

    def call(self, x, training=None):
        h = tf.nn.relu(self.bn(self.hidden(x), training=training))
        if training:  # a fixed "dropout" of one unit in training only
            h = h * tf.constant([0.0, 1.25, 1.25, 1.25, 1.25])
        return self.out(h)


class Stepped(Plain):
    """A custom train_step, as Keras's fit would call it: stock's estimator never does."""

    def train_step(self, data):
        raise RuntimeError("train_step called")


def model(kind):
    tf.keras.utils.set_random_seed(1)
    sgd = tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9)
    if kind == "multi":
        m = Multi()
        m.compile(
            tf.keras.optimizers.legacy.Adam(0.02),
            ["mse", "sparse_categorical_crossentropy"],
            metrics=[["mae"], ["accuracy"]],
        )
        return m
    m = {"bn": Normalized, "stepped": Stepped}.get(kind, Plain)()
    if kind == "rows":  # [batch] labels: the squeezed output's SUM mse is one number, a mean
        m.compile(sgd, loss=tf.keras.losses.MeanSquaredError(reduction="sum"), metrics=["mae"])
        return m
    m.compile(sgd, loss="mse", metrics=["mae"])
    if kind == "built":
        m(X[:2])
        # Weights of its own (as if fitted): neither stock nor the engine starts from them.
        m.set_weights([w + 0.5 for w in m.get_weights()])
    return m


def inputs(kind):
    """(train/eval input_fn, predict input_fn); ``bn``: the first 40 rows (4 full batches: the
    engine's padding rows would enter BatchNormalization's batch moments)."""
    if kind == "bn":
        return (
            lambda: tf.data.Dataset.from_tensor_slices((X[:40], Y[:40])).batch(BATCH),
            lambda: tf.data.Dataset.from_tensor_slices(X[:40]).batch(BATCH),
        )
    if kind == "multi":
        features = {"u": X[:, :2], "v": X[:, 2:]}
        labels = {"output_1": Y, "output_2": C}
        return (
            lambda: tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH),
            lambda: tf.data.Dataset.from_tensor_slices(features).batch(BATCH),
        )
    labels = Y[:, 0] if kind == "rows" else Y  # rows: [batch] labels, a [batch, 1] output
    return (
        lambda: tf.data.Dataset.from_tensor_slices((X, labels)).batch(BATCH),
        lambda: tf.data.Dataset.from_tensor_slices(X).batch(BATCH),
    )


def run(estimator, kind, train_only=False):
    """(metrics, predictions, model values); ``train_only``: (None, None, model values), what a
    negative control's assertion (its weights) reads."""
    train_fn, predict_fn = inputs(kind)
    estimator.train(train_fn, steps=STEPS if kind != "bn" else 4)
    if train_only:
        return None, None, model_values(estimator.model_dir)
    metrics = {k: float(v) for k, v in estimator.evaluate(train_fn).items()}
    outputs = ("output_1", "output_2") if kind == "multi" else ("output_1",)
    predictions = [
        np.concatenate([np.ravel(p[o]) for o in outputs]) for p in estimator.predict(predict_fn)
    ]
    return metrics, np.array(predictions, np.float64), model_values(estimator.model_dir)


def model_values(model_dir):
    """{variable name: value} of the model's variables in the latest checkpoint, by the names
    stock's name-based Saver gives them (an object-based checkpoint read by full name, as that
    Saver reads one); the optimizer's and the global step left out."""
    path = tf.train.latest_checkpoint(model_dir)
    reader = tf.train.load_checkpoint(path)
    names = {n for n, _ in tf.train.list_variables(path)}
    if "_CHECKPOINTABLE_OBJECT_GRAPH" in names:
        keys = saver_lib.object_graph_key_mapping(path)
    else:
        keys = {n: n for n in names}
    # By the path below the model's own name: Keras numbers a model's name by the models made
    # before it in the process (stock's clone's too), which differs between these runs.
    return {
        n.split("/", 1)[1]: np.asarray(reader.get_tensor(k), np.float64)
        for n, k in keys.items()
        if n.count("/") >= 2 and not n.startswith("training/") and "OPTIMIZER_SLOT" not in k
    }


HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "reference", "strategy_subclassed_tf215.json")
NO_STOCK = eight_devices.NO_STOCK
CONFIG = dict(checkpoint_format="saver")


def stock_run(kind, root):
    if NO_STOCK:
        return eight_devices.recorded(RECORD, kind)
    with tpushim.patched(mode="off", quiet=True):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=model(kind), model_dir=os.path.join(root, kind, "stock"), **CONFIG
        )
    return run(estimator, kind)


def record(path, root):
    out = {"tensorflow": tf.__version__}
    for kind in KINDS:
        metrics, predictions, values = stock_run(kind, root)
        out[kind] = {
            "metrics": metrics,
            "predictions": predictions.tolist(),
            "values": {n: v.tolist() for n, v in values.items()},
        }
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


def engine(keras_model, model_dir, replicas=8):
    with tpushim.patched(mode="cpu", engine="strategy", quiet=True):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=keras_model, model_dir=model_dir, **CONFIG
        )
    if replicas == 1:
        estimator._tpushim_strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    return estimator


def differences(ours, stock):
    def rel(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))

    (m1, p1, v1), (m2, p2, v2) = ours, stock
    out = {
        "names_equal": sorted(v1) == sorted(v2),
        "names": sorted(v1),
        "weights": max(rel(v1[n], v2[n]) for n in v2 if n in v1) if set(v1) & set(v2) else 1.0,
    }
    if m1 is None:  # trained only
        return out
    return {
        **out,
        "metrics": max(rel(m1[k], m2[k]) for k in m2),
        "metric_keys_equal": sorted(m1) == sorted(m2),
        "predictions": rel(p1, p2) if p1.shape == p2.shape else float("inf"),
        "rows": int(p1.shape[0]),
    }


def main(root):
    out = {"tensorflow": tf.__version__, "stock_from": RECORD if NO_STOCK else "live"}
    stocks = {}
    for kind in KINDS:
        stock = stocks[kind] = stock_run(kind, root)
        out[kind] = {}
        for name, replicas in (("eight", 8), ("one", 1)):
            if (name == "eight" and kind not in EIGHT) or (name == "one" and kind not in ONE):
                continue
            keras_model = model(kind)
            before = [w.numpy() for w in keras_model.weights]
            estimator = engine(keras_model, os.path.join(root, kind, name), replicas)
            out["replicas"] = max(out.get("replicas", 0), estimator.strategy.num_replicas_in_sync)
            out[kind][name] = differences(run(estimator, kind), stock)
            out[kind]["user_model_unchanged"] = len(before) == len(keras_model.weights) and all(
                np.array_equal(a, w.numpy()) for a, w in zip(before, keras_model.weights)
            )
    # Negative control: warm-started from the built model's weights, the engine leaves stock.
    original = _strategy_plan.Plan.__init__

    def warm(self, **fields):  # the frozen Plan is made with its fields by name
        fields["warm_start"] = [w.numpy() for w in fields["keras_model"].trainable_weights]
        original(self, **fields)

    _strategy_plan.Plan.__init__ = warm
    try:
        control = engine(model("built"), os.path.join(root, "built", "control"))
        out["built"]["control"] = differences(run(control, "built", True), stocks["built"])
    finally:
        _strategy_plan.Plan.__init__ = original
    # Negative control: [batch] labels read per row (as [batch, 1]), the SUM loss then a sum.
    term = _strategy_loss.row_label_term
    _strategy_loss.row_label_term = lambda name, loss, kind, y_true, y_pred, weight: (
        _padding.row_labels(y_true, y_pred),
        kind,
    )
    try:
        control = engine(model("rows"), os.path.join(root, "rows", "control"))
        out["rows"]["control"] = differences(run(control, "rows"), stocks["rows"])
    finally:
        _strategy_loss.row_label_term = term
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--record":
        record(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1])
