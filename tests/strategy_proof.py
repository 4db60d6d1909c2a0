"""Rung 2b for the strategy engine, run as its own process (the logical devices must be made
before TensorFlow initialises): ``python strategy_proof.py DIR`` prints one JSON object.

For a mean loss, a SUM loss, a custom one-number loss, sample weights (``{"features",
"sample_weights"}`` features), a masked output (a ``Masking`` layer's mask reaching a
[batch, 3, 1] output, a wholly masked row copied into every padding row) and losses layers add
from their inputs (an activity regularizer, a layer's ``add_loss`` of a sum over the batch, with
a weight regularizer), 45 examples in global batches of 10
(a short last batch of 5; 10 does not divide among 8 replicas, so every batch is padded to 16):
the stock estimator, the strategy engine on 8 logical CPU devices and on 1, each trained 5 steps
(every example once, the short batch last), evaluated and asked to predict. Reported: the largest
difference to stock of every checkpoint value, eval metric and prediction (relative to the
values' scale), for the engine as it is, and of every checkpoint value (trained alone: what
their assertions read) for two broken engines (negative controls): ``summed`` -- each replica's gradient that of its own slice's mean, summed over the replicas
(for a SUM loss, ``averaged``: its sum divided by the replicas), and for the last three
``local`` -- each replica's loss its own (its rows', weights', unmasked elements' mean: no sum
over the replicas). Activity regularizers beside SyncBatchNormalization and BatchNormalization
("synced", "normalized": 48 rows in full global batches of 16; "normalized" is stock's on 1
replica, so it runs on 1 replica only, ``ONE_ONLY``), with two more controls: each
input loss from the model run on each row alone (BatchNormalization on one row: ``per_row``),
and the input losses counted on the padding rows (``unmasked``, kind "activity"). Also: stock's
estimator reading
the engine's model_dir, a model XLA cannot compile (the step is compiled with XLA), and a
program in graph mode (``in_a_graph``: as ``disable_v2_behavior()`` makes it) on 8 replicas.
[batch] labels for the [batch, 1] output (``ROW_LABELS``, 8 replicas and 1): a SUM loss (one
number for the batch, the rows' mean) and a per-example custom loss with sample weights.

On TensorFlow >= 2.16 (no stock estimator) stock is stock TF 2.15's numbers, recorded by
``python strategy_proof.py --record tests/reference/strategy_tf215.json`` in a TF 2.15 venv, and
tpushim's own estimator API (stock 2.15's path) reads the engine's checkpoints.

A helper run by tests/proofs/test_strategy_replicas.py, not a test module.
"""

import json
import os
import sys

import eight_devices  # first: 8 logical CPU devices, before TensorFlow initialises
import numpy as np
import tensorflow as tf

import tpushim
from tpushim import _padding, _tfprivate
from tpushim._strategy import loss as _strategy_loss
from tpushim._strategy import step as _strategy_step

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


# Sample weights, masked outputs and losses a layer adds from its inputs, on the same 45 rows in
# batches of 10: each replica's share of stock's global loss (weights, unmasked elements and
# input losses counted over the global batch's real rows, whatever each replica holds).
W = rng.uniform(0.0, 2.0, ROWS).astype(np.float32)
SEQ = rng.randn(ROWS, 3, 2).astype(np.float32)
SEQ[rng.uniform(size=(ROWS, 3)) < 0.35] = 0.0  # masked time steps (Masking(0.0))
SEQ[0] = 0.0  # a row wholly masked: the first row, copied into padding rows
SEQ_Y = (SEQ[..., :1] * 1.5 - SEQ[..., 1:] + 0.1 * rng.randn(ROWS, 3, 1)).astype(np.float32)
# Activity regularizers in models with BatchNormalization, on 48 rows in full global batches of
# 16 (2 rows a replica): before and after the normalisation, built-in and custom (a function
# Keras calls on the layer's output). "synced" normalises with SyncBatchNormalization (the
# global batch's moments on every replica: stock's on 8 replicas too), "normalized" with
# BatchNormalization (each replica its own rows' moments: stock's on 1 replica).
NORMAL_ROWS, NORMAL_BATCH = 48, 16
NX = rng.randn(NORMAL_ROWS, 4).astype(np.float32)
NY = (NX[:, :1] * 2 - NX[:, 1:2] + 0.1 * rng.randn(NORMAL_ROWS, 1)).astype(np.float32)
NORMALIZED = ("synced", "normalized")
#: run on 1 replica only (with its negative control there): "normalized" is stock's on 1 replica
ONE_ONLY = ("normalized",)
MORE = ("weighted", "masked", "activity", *NORMALIZED)
#: [batch] labels for the [batch, 1] output: Keras squeezes the output, so a SUM mse is one number
#: for the batch (the rows' mean); a per-example loss with sample weights weighs each row.
ROW_LABELS = ("row_sum", "row_weighted")


def absolute_error(y_true, y_pred):  # one value per example
    return tf.abs(y_true - y_pred)


@tf.keras.utils.register_keras_serializable(package="tpushim_strategy_proof")
class AbsoluteActivity(tf.keras.regularizers.Regularizer):
    """A custom activity regularizer (Keras divides its value by the batch size). (A plain
    function is not one stock trains: its v1 clone gets the function's name, not the function.)"""

    def __init__(self, rate):
        self.rate = rate

    def __call__(self, x):
        return self.rate * tf.reduce_sum(tf.abs(x))

    def get_config(self):
        return {"rate": self.rate}


def _normalized_model(kind):
    normalization = (
        tf.keras.layers.experimental.SyncBatchNormalization
        if kind == "synced"
        else tf.keras.layers.BatchNormalization
    )
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(
        5,
        activation="tanh",
        activity_regularizer=tf.keras.regularizers.l2(0.05),
        kernel_regularizer=tf.keras.regularizers.l2(0.01),
        name="hidden",
    )(x)
    h = normalization(name="bn")(h)
    h = tf.keras.layers.Dense(
        3,
        activation="tanh",
        activity_regularizer=tf.keras.regularizers.l1_l2(0.02, 0.03),
        name="after",
    )(h)
    h = tf.keras.layers.Dense(3, activity_regularizer=AbsoluteActivity(0.01), name="custom")(h)
    m = tf.keras.Model(x, tf.keras.layers.Dense(1, name="out")(h))
    m.compile(tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9), loss="mse", metrics=["mae"])
    return m


def _more_model(kind):
    if kind in NORMALIZED:
        return _normalized_model(kind)
    sgd = tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9)
    if kind == "weighted":  # stock's {"features", "sample_weights"} features
        m = tf.keras.Sequential(
            [
                tf.keras.layers.Dense(5, input_shape=(4,), activation="tanh", name="hidden"),
                tf.keras.layers.Dense(1, name="out"),
            ]
        )
        m.compile(sgd, loss="mse", metrics=["mae"], weighted_metrics=["mse"])
        return m
    if kind == "masked":  # a Masking layer's mask reaches the [batch, 3, 1] output
        m = tf.keras.Sequential(
            [
                tf.keras.layers.Masking(0.0, input_shape=(3, 2), name="masking"),
                tf.keras.layers.Dense(5, activation="tanh", name="hidden"),
                tf.keras.layers.Dense(1, name="out"),
            ]
        )
        m.compile(sgd, loss="mse", metrics=["mae"])
        return m
    # Losses added from the inputs: a built-in activity regularizer (a mean over the batch) and
    # a layer's add_loss of a sum over the batch; with a weight regularizer (batch-free). (Stock
    # cannot clone a functional model given model.add_loss(tensor): Keras 2 fails to clone its
    # TFOpLambda layers; a layer's add_loss is the form stock trains.)
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(
        5,
        activation="tanh",
        activity_regularizer=tf.keras.regularizers.l2(0.05),
        kernel_regularizer=tf.keras.regularizers.l2(0.01),
        name="hidden",
    )(x)
    h = Penalty(0.02, name="penalty")(h)
    m = tf.keras.Model(x, tf.keras.layers.Dense(1, name="out")(h))
    m.compile(sgd, loss="mse", metrics=["mae"])
    return m


@tf.keras.utils.register_keras_serializable(package="tpushim_strategy_proof")
class Penalty(tf.keras.layers.Layer):
    """A layer adding a loss computed from its inputs (``self.add_loss``): a sum over the batch."""

    def __init__(self, rate, **kwargs):
        super().__init__(**kwargs)
        self.rate = rate

    def call(self, x):
        self.add_loss(self.rate * tf.reduce_sum(tf.abs(x)))
        return tf.identity(x)  # Keras 2 cannot clone a layer returning its input tensor itself

    def get_config(self):
        return dict(super().get_config(), rate=self.rate)


def _more_inputs(kind):
    if kind == "row_sum":
        train = ((X, Y[:, 0]), X)
    elif kind == "row_weighted":
        train = (({"features": X, "sample_weights": W}, Y[:, 0]), X)
    elif kind == "weighted":
        train = (({"features": X, "sample_weights": W}, Y), X)
    elif kind == "masked":
        train = ((SEQ, SEQ_Y), SEQ)
    elif kind in NORMALIZED:
        train = ((NX, NY), NX)
    else:
        train = ((X, Y), X)
    batch = NORMAL_BATCH if kind in NORMALIZED else BATCH
    return (
        lambda: tf.data.Dataset.from_tensor_slices(train[0]).batch(batch),
        lambda: tf.data.Dataset.from_tensor_slices(train[1]).batch(batch),
    )


def model(kind):
    tf.keras.utils.set_random_seed(1)
    if kind in MORE:
        return _more_model(kind)
    loss, rate = {"row_sum": LOSSES["sum"], "row_weighted": (absolute_error, 0.1)}.get(
        kind, LOSSES.get(kind)
    )
    m = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(5, input_shape=(4,), activation="tanh", name="hidden"),
            tf.keras.layers.Dense(1, name="out"),
        ]
    )
    weighted = ["mse"] if kind == "row_weighted" else None
    m.compile(
        tf.keras.optimizers.legacy.SGD(rate, momentum=0.9),
        loss=loss,
        metrics=["mae"],
        weighted_metrics=weighted,
    )
    return m


def train_input():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(BATCH)


def predict_input():
    return tf.data.Dataset.from_tensor_slices(X).batch(BATCH)


def _features_dataset():
    return tf.data.Dataset.from_tensor_slices(({"hidden_input": X}, Y)).batch(BATCH)


def _queue_input():
    x, y = tf.compat.v1.train.slice_input_producer([X, Y], shuffle=False)
    return tf.compat.v1.train.batch([x, y], BATCH)  # one thread: stock's order


def numpy_input_fn():
    # tf.estimator's names exist on TensorFlow >= 2.16 only while tpushim is on.
    with tpushim.patched(mode="off", quiet=True):
        inputs = tf.compat.v1.estimator.inputs
    return inputs.numpy_input_fn(
        {"hidden_input": X}, Y, batch_size=BATCH, num_epochs=1, shuffle=False
    )


#: Every legacy input_fn style, run by the engine without rewrite (each trains STEPS steps).
INPUT_STYLES = {
    "tensors": lambda: ({"hidden_input": tf.constant(X[:BATCH])}, tf.constant(Y[:BATCH])),
    "one_shot": lambda: tf.compat.v1.data.make_one_shot_iterator(_features_dataset()).get_next(),
    "queue": _queue_input,
    "numpy": lambda: numpy_input_fn()(),  # noqa: PLW0108  (made at call time, as scripts do)
}


def _inputs(kind):
    more = kind in MORE or kind in ROW_LABELS
    return _more_inputs(kind) if more else (train_input, predict_input)


def run(estimator, train=None, kind=None):
    train_fn, predict_fn = _inputs(kind)
    estimator.train(train or train_fn, steps=STEPS)
    metrics = {k: float(v) for k, v in estimator.evaluate(train_fn).items()}
    predictions = np.array([p["out"] for p in estimator.predict(predict_fn)])
    return metrics, predictions, variable_values(estimator)


def trained(estimator, train=None, kind=None):
    """``(None, None, checkpoint values)`` after :func:`run`'s training alone: what a negative
    control's assertion (its weights) and an input style's (weights and slots) read."""
    estimator.train(train or _inputs(kind)[0], steps=STEPS)
    return None, None, variable_values(estimator)


def variable_values(estimator):
    return {
        n: np.asarray(estimator.get_variable_value(n), np.float64)
        for n in estimator.get_variable_names()
        if n != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }


HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "reference", "strategy_tf215.json")
NO_STOCK = eight_devices.NO_STOCK


def stock_estimator(keras_model, model_dir):
    """Stock's estimator (on TensorFlow >= 2.16: tpushim's estimator API, stock 2.15's path)."""
    with tpushim.patched(mode="off", quiet=True):
        return tf.keras.estimator.model_to_estimator(keras_model=keras_model, model_dir=model_dir)


def in_a_graph(make_estimator, model_dir):
    """The "mean" model as a program that disabled v2 behaviour has it: built, converted,
    trained, evaluated and asked to predict in a graph of its own, its weights initialised in
    its Keras session (where stock starts, and the engine too); the graph its own after."""
    graph = tf.Graph()
    with graph.as_default():
        keras_model = model("mean")
        keras_model.get_weights()  # initialised in the program's Keras session
        result = run(make_estimator(keras_model, model_dir))
        assert not tf.executing_eagerly() and tf.compat.v1.get_default_graph() is graph
    return result


def stock_run(kind, root, style=None, train_only=False):
    if NO_STOCK:
        return eight_devices.recorded(RECORD, style or kind)
    if kind == "graph":
        return in_a_graph(stock_estimator, os.path.join(root, "graph", "stock"))
    if style is not None:
        estimator = stock_estimator(model(kind), os.path.join(root, style, "stock"))
        return (trained if train_only else run)(estimator, INPUT_STYLES[style])
    return run(stock_estimator(model(kind), os.path.join(root, kind, "stock")), kind=kind)


def record(path, root):
    """Stock's numbers for every kind, as JSON (run on TensorFlow 2.15)."""
    out = {"tensorflow": tf.__version__}
    for kind in [*LOSSES, *MORE, *ROW_LABELS, *INPUT_STYLES, "graph"]:
        if kind in LOSSES or kind in MORE or kind in ROW_LABELS or kind == "graph":
            metrics, predictions, values = stock_run(kind, root)
        else:
            metrics, predictions, values = stock_run("mean", root, kind)
        out[kind] = {
            "metrics": metrics,
            "predictions": predictions.tolist(),
            "values": {n: v.tolist() for n, v in values.items()},
        }
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


def _weighted_mse(predictions):
    """Keras's model.evaluate value of the weighted_metrics "mse" of kind "weighted" (and
    "row_weighted", its [batch] labels read per row as model.evaluate reads them) on stock's
    predictions: stock's estimator reports weighted_metrics unweighted, and tpushim weighs them
    (as its TPUEstimator path does), so that key is compared with this."""
    errors = (np.asarray(predictions, np.float64).reshape(-1) - Y.reshape(-1)) ** 2
    return float(np.sum(errors * W) / np.sum(W))


def differences(ours, stock, kind=None):
    def rel(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))

    (m1, p1, v1), (m2, p2, v2) = ours, stock
    out = {
        "names_equal": sorted(v1) == sorted(v2),
        "weights": max(rel(v1[n], v2[n]) for n in v2 if n in v1),
    }
    if m1 is None:  # trained only
        return out
    weighted = {"mse": _weighted_mse(p2)} if kind in ("weighted", "row_weighted") else {}
    return {
        **out,
        "metrics": max(rel(m1[k], weighted.get(k, m2[k])) for k in m2),
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
    original = _strategy_loss.replica_loss

    def wrong(*args):
        replicas = args[5]
        loss = original(*args)
        return loss / replicas if kind == "sum" else loss * replicas

    return original, wrong


def _per_row_forward(model, features, training):
    """``_strategy.loss._called`` as before activity regularizers were read from the forward pass:
    every input loss from the model run on each row alone."""
    outputs, regularizers, adds, _ = _CALLED(model, features, training)
    return outputs, regularizers, adds, {}


def _one_rows_moments(self, row):
    """``_strategy.loss._NormalizedOutputs.replaying`` as before the batch's normalised rows
    were replayed: BatchNormalization on each row alone."""
    return _tfprivate.keras.batchnorm_call_using(None)  # Keras's own call, on the one row


_CALLED = _strategy_loss._called
_REPLAYING = _strategy_loss._NormalizedOutputs.replaying


def _unmasked(kind, root, stock):
    """The input losses evaluated on every row of the padded batch, padding rows included."""
    original = _strategy_loss.replica_loss

    def wrong(*args):
        args = list(args)
        added, pad = args[8], args[4]
        args[8] = ()
        loss = original(*args)
        rows = _strategy_loss.global_rows(pad)
        for degree, values in added:  # (a tpushim._loss_kinds.Degree)
            loss += degree.of_rows(tf.reduce_sum(tf.cast(values, tf.float32)), rows)
        return loss

    _strategy_loss.replica_loss = wrong
    try:
        control = trained(engine(model(kind), os.path.join(root, kind, "unmasked")), kind=kind)
    finally:
        _strategy_loss.replica_loss = original
    return differences(control, stock, kind)


def main(root):
    out = {
        "replicas": None,
        "tensorflow": tf.__version__,
        "stock_from": RECORD if NO_STOCK else "live",
        "inputs": {},
    }
    for kind in [*LOSSES, *MORE]:
        stock = stock_run(kind, root)
        eight_dir = os.path.join(root, kind, "eight")
        out[kind] = {}
        if kind not in ONE_ONLY:
            eight = engine(model(kind), eight_dir)
            out["replicas"] = eight.strategy.num_replicas_in_sync
            out[kind]["eight"] = differences(run(eight, kind=kind), stock, kind)
        one_dir = os.path.join(root, kind, "one")
        out[kind]["one"] = differences(run(engine(model(kind), one_dir, 1), kind=kind), stock, kind)
        if kind in ONE_ONLY:  # each input loss from a forward pass on each row alone
            _strategy_loss._called = _per_row_forward
            _strategy_loss._NormalizedOutputs.replaying = _one_rows_moments
            try:
                per_row = engine(model(kind), os.path.join(root, kind, "per_row"), 1)
                out[kind]["per_row"] = differences(trained(per_row, kind=kind), stock, kind)
            finally:
                _strategy_loss._called = _CALLED
                _strategy_loss._NormalizedOutputs.replaying = _REPLAYING
            continue
        # Stock's estimator reads the engine's checkpoints: the same evaluation.
        reader = stock_estimator(model(kind), eight_dir)
        evaluate_input = _more_inputs(kind)[0] if kind in MORE else train_input
        read = {k: float(v) for k, v in reader.evaluate(evaluate_input).items()}
        out[kind]["stock_reads_engine"] = max(
            abs(read[k] - v) / max(1.0, abs(v)) for k, v in stock[0].items()
        )
        original, wrong = broken(kind)
        _strategy_loss.replica_loss = wrong
        try:
            control = trained(engine(model(kind), os.path.join(root, kind, "control")), kind=kind)
        finally:
            _strategy_loss.replica_loss = original
        out[kind]["control"] = differences(control, stock, kind)
        if kind == "activity":  # the input losses' padding rows counted
            out[kind]["unmasked"] = _unmasked(kind, root, stock)
        if kind in MORE:  # each replica's own mean: its rows', weights', unmasked elements' count
            # (nor the global batch's real rows the input carries: each replica counts its own)
            summed, _strategy_step.all_reduce_sum = _strategy_step.all_reduce_sum, lambda x: x
            carried, _padding.global_rows = _padding.global_rows, lambda features: None
            try:
                local = trained(engine(model(kind), os.path.join(root, kind, "local")), kind=kind)
                out[kind]["local"] = differences(local, stock, kind)
            except tf.compat.v1.train.NanLossDuringTrainingError:  # a replica of padding alone
                out[kind]["local"] = {"weights": float("inf"), "nan": True}
            finally:
                _strategy_step.all_reduce_sum, _padding.global_rows = summed, carried

    for kind in ROW_LABELS:  # [batch] labels: the engine on 8 replicas and 1 (no controls)
        stock = stock_run(kind, root)
        eight = engine(model(kind), os.path.join(root, kind, "eight"))
        one = engine(model(kind), os.path.join(root, kind, "one"), 1)
        out[kind] = {
            "eight": differences(run(eight, kind=kind), stock, kind),
            "one": differences(run(one, kind=kind), stock, kind),
        }

    # Every legacy input_fn style, on 8 replicas, against stock (a mean loss): the weights and
    # slots it trains (evaluation and prediction read Datasets, proven above).
    for style, input_fn in INPUT_STYLES.items():
        eight = engine(model("mean"), os.path.join(root, style, "eight"))
        eight.train(input_fn, steps=STEPS)
        out["inputs"][style] = differences(
            (None, None, variable_values(eight)), stock_run("mean", root, style, train_only=True)
        )

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

    # A program in graph mode (disable_v2_behavior), last: the engine's calls on the eager
    # runtime, its model's Keras classes left v1 for the program after them.
    out["graph"] = differences(
        in_a_graph(engine, os.path.join(root, "graph", "eight")), stock_run("graph", root)
    )
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--record":
        record(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1])
