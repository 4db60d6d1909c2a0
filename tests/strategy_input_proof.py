"""Every legacy input_fn style on the strategy engine, as its own process (the 8 logical devices
must be made before TensorFlow initialises): ``python strategy_input_proof.py DIR`` prints one
JSON object.

Each style feeds the same 45 rows in global batches of 10 (indivisible among 8 replicas, a short
last batch of 5) to ``train``, ``evaluate`` and ``predict``, unchanged: (features, labels)
constants, a one-shot iterator's tensors, an initializable iterator's (its initializer in
``TABLE_INITIALIZERS``, as scripts register it), ``slice_input_producer`` + ``train.batch``,
``string_input_producer`` over CSV files + ``TextLineReader`` + ``train.batch``,
``shuffle_batch`` (seeded), ``numpy_input_fn`` and ``pandas_input_fn`` (a label Series for
training and evaluation, none for prediction; shuffled and not). For each, the stock estimator
and the strategy engine on 8 logical CPU devices, ``RunConfig(tf_random_seed=7)``: every
checkpoint value, eval metric and prediction. A shuffled ``numpy_input_fn`` / ``pandas_input_fn``
starts each epoch at a random row (``random.seed(None)``: stock's own order is not reproducible),
so those train one step on one whole epoch and their predictions are compared sorted: every row
once, whatever the order.

On TensorFlow >= 2.16 (no stock estimator, ``tf.compat.v1.estimator.inputs`` from tpushim's own
``tpushim/_estimator_api/_inputs.py``) stock is stock TF 2.15's numbers, recorded by
``python strategy_input_proof.py --record tests/reference/strategy_inputs_tf215.json DIR`` in a
TF 2.15 venv.

A helper run by tests/proofs/test_strategy_inputs.py, not a test module.
"""

import collections
import itertools
import json
import os
import sys

import eight_devices  # first: 8 logical CPU devices, before TensorFlow initialises
import numpy as np
import pandas as pd
import tensorflow as tf

import tpushim

ROWS, BATCH, STEPS, SEED = 45, 10, 5, 7
rng = np.random.RandomState(0)
X = rng.randn(ROWS, 4).astype(np.float32)
Y = (X[:, :1] * 2 - X[:, 1:2] + 0.1 * rng.randn(ROWS, 1)).astype(np.float32)
COLUMNS = "abcd"
FRAME = pd.DataFrame({k: X[:, i] for i, k in enumerate(COLUMNS)}, index=np.arange(100, 100 + ROWS))
TARGET = pd.Series(Y[:, 0], index=FRAME.index)


def model(kind):
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(1)
    sgd = tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9)
    if kind == "columns":  # one scalar feature per DataFrame column, as pandas_input_fn feeds
        inputs = {k: tf.keras.Input((), name=k) for k in COLUMNS}
        stacked = tf.keras.layers.Lambda(lambda d: tf.stack([d[k] for k in COLUMNS], axis=1))(
            inputs
        )
        hidden = tf.keras.layers.Dense(5, activation="tanh", name="hidden")(stacked)
        m = tf.keras.Model(inputs, tf.keras.layers.Dense(1, name="out")(hidden))
    else:
        m = tf.keras.Sequential(
            [
                tf.keras.layers.Dense(5, input_shape=(4,), activation="tanh", name="hidden"),
                tf.keras.layers.Dense(1, name="out"),
            ]
        )
    m.compile(sgd, loss="mse", metrics=["mae"])
    return m


def _inputs():
    # tf.estimator's names exist on TensorFlow >= 2.16 only while tpushim is on.
    with tpushim.patched(mode="off", quiet=True):
        return tf.compat.v1.estimator.inputs


def _features(x):
    return {"hidden_input": x}


def _dataset(labelled, epochs=1):
    data = (_features(X), Y) if labelled else _features(X)
    return tf.data.Dataset.from_tensor_slices(data).repeat(epochs).batch(BATCH)


def _one_shot(labelled, epochs):
    del epochs  # the Dataset ends after one
    return lambda: tf.compat.v1.data.make_one_shot_iterator(_dataset(labelled)).get_next()


def _initializable(labelled, epochs):
    del epochs

    def input_fn():
        iterator = tf.compat.v1.data.make_initializable_iterator(_dataset(labelled))
        tf.compat.v1.add_to_collection(
            tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, iterator.initializer
        )
        return iterator.get_next()

    return input_fn


def _sliced(labelled, epochs, shuffle_seed=None):
    """slice_input_producer + train.batch (or shuffle_batch: one thread, every row in the queue
    before the first dequeue, so stock's order is its seed's)."""

    def input_fn():
        rows = tf.compat.v1.train.slice_input_producer([X, Y], num_epochs=epochs, shuffle=False)
        if shuffle_seed is None:
            batch = tf.compat.v1.train.batch(rows, BATCH, allow_smaller_final_batch=True)
        else:
            batch = tf.compat.v1.train.shuffle_batch(
                rows,
                BATCH,
                capacity=2 * ROWS,
                min_after_dequeue=ROWS,
                seed=shuffle_seed,
                allow_smaller_final_batch=True,
            )
        return (_features(batch[0]), batch[1]) if labelled else _features(batch[0])

    return input_fn


def _csv_files(root):
    os.makedirs(root, exist_ok=True)
    files = []
    for part in range(3):  # 15 rows each
        path = os.path.join(root, f"part-{part}.csv")
        with open(path, "w") as f:
            for i in range(part * 15, (part + 1) * 15):
                f.write(",".join(f"{v:.9g}" for v in [*X[i], Y[i, 0]]) + "\n")
        files.append(path)
    return files


def _shuffle_batch(labelled, epochs):
    del epochs  # one epoch: every row in the queue before the first dequeue
    return _sliced(labelled, 1, shuffle_seed=3)


def _csv_input(root):
    files = _csv_files(os.path.join(root, "csv"))
    return lambda labelled, epochs: _csv(files, labelled, epochs)


def _csv(files, labelled, epochs):
    """string_input_producer over CSV files + TextLineReader + decode_csv + train.batch."""

    def input_fn():
        names = tf.compat.v1.train.string_input_producer(files, num_epochs=epochs, shuffle=False)
        _, line = tf.compat.v1.TextLineReader().read(names)
        fields = tf.io.decode_csv(line, [[0.0]] * 5)
        x, y = tf.stack(fields[:4]), tf.stack(fields[4:])
        batch = tf.compat.v1.train.batch([x, y], BATCH, allow_smaller_final_batch=True)
        return (_features(batch[0]), batch[1]) if labelled else _features(batch[0])

    return input_fn


def _numpy(shuffle):
    def make(labelled, epochs):
        def input_fn():  # made at call time, as scripts do
            return _inputs().numpy_input_fn(
                _features(X),
                Y if labelled else None,
                batch_size=ROWS if shuffle else BATCH,
                num_epochs=epochs,
                shuffle=shuffle,
            )()

        return input_fn

    return make


def _pandas(shuffle):
    def make(labelled, epochs):
        def input_fn():
            return _inputs().pandas_input_fn(
                FRAME,
                TARGET if labelled else None,
                batch_size=ROWS if shuffle else BATCH,
                num_epochs=epochs,
                shuffle=shuffle,
            )()

        return input_fn

    return make


def _constant(labelled, epochs):  # the same batch every step, as stock feeds constants
    del epochs
    if labelled:
        return lambda: (_features(tf.constant(X[:BATCH])), tf.constant(Y[:BATCH]))
    return lambda: _features(tf.constant(X[:BATCH]))


Style = collections.namedtuple(
    "Style", "model make train_steps eval_steps predictions_taken any_order"
)
#: name -> Style: its model, ``make(root)`` giving ``input_fn(labelled, epochs)``, the steps of
#: train and evaluate (None: to the input's end), the predictions taken (None: all), and whether
#: they are compared in any order (a shuffled numpy_input_fn / pandas_input_fn).
STYLES = {
    "tensors": Style("dense", lambda root: _constant, STEPS, 2, 2 * BATCH, False),
    "one_shot": Style("dense", lambda root: _one_shot, STEPS, None, None, False),
    "initializable": Style("dense", lambda root: _initializable, STEPS, None, None, False),
    "queue": Style("dense", lambda root: _sliced, STEPS, None, None, False),
    "shuffle_batch": Style("dense", lambda root: _shuffle_batch, STEPS, None, None, False),
    "string_input": Style("dense", _csv_input, STEPS, None, None, False),
    "numpy": Style("dense", lambda root: _numpy(False), STEPS, None, None, False),
    "numpy_shuffled": Style("dense", lambda root: _numpy(True), 1, None, None, True),
    "pandas": Style("columns", lambda root: _pandas(False), STEPS, None, None, False),
    "pandas_shuffled": Style("columns", lambda root: _pandas(True), 1, None, None, True),
}


def run(estimator, style, root):
    spec = STYLES[style]
    make = spec.make(root)
    # A shuffled numpy_input_fn / pandas_input_fn trains on one epoch (its one whole batch).
    estimator.train(make(True, 1 if spec.any_order else None), steps=spec.train_steps)
    metrics = estimator.evaluate(make(True, 1), steps=spec.eval_steps)
    metrics = {k: float(v) for k, v in metrics.items()}
    predictions = estimator.predict(make(False, 1))
    if spec.predictions_taken is not None:  # an input that never ends: its first rows
        predictions = itertools.islice(predictions, spec.predictions_taken)
    predictions = np.array([p["out"] for p in predictions], np.float64)
    return metrics, predictions, variable_values(estimator)


def variable_values(estimator):
    return {
        n: np.asarray(estimator.get_variable_value(n), np.float64)
        for n in estimator.get_variable_names()
        if n != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }


HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "reference", "strategy_inputs_tf215.json")
NO_STOCK = eight_devices.NO_STOCK


def convert(style, model_dir, patch):
    with tpushim.patched(quiet=True, **patch):
        config = tf.estimator.RunConfig(tf_random_seed=SEED)
        return tf.keras.estimator.model_to_estimator(
            keras_model=model(STYLES[style].model), model_dir=model_dir, config=config
        )


_STOCK = {}  # style -> stock's run (its model_dir is trained once)


def stock_run(style, root):
    if style not in _STOCK:
        _STOCK[style] = _stock_run(style, root)
    return _STOCK[style]


def _stock_run(style, root):
    if NO_STOCK:
        return eight_devices.recorded(RECORD, style)
    estimator = convert(style, os.path.join(root, style, "stock"), {"mode": "off"})
    return run(estimator, style, root)


def record(path, root):
    """Stock's numbers for every style, as JSON (run on TensorFlow 2.15)."""
    out = {"tensorflow": tf.__version__}
    for style in STYLES:
        metrics, predictions, values = stock_run(style, root)
        out[style] = {
            "metrics": metrics,
            "predictions": predictions.tolist(),
            "values": {n: v.tolist() for n, v in values.items()},
        }
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


def differences(ours, stock, in_any_order):
    def rel(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))

    (m1, p1, v1), (m2, p2, v2) = ours, stock
    if in_any_order:
        p1, p2 = np.sort(p1.reshape(-1)), np.sort(p2.reshape(-1))
    return {
        "names_equal": sorted(v1) == sorted(v2),
        "weights": max(rel(v1[n], v2[n]) for n in v2 if n in v1),
        "metrics": max(rel(m1[k], m2[k]) for k in m2),
        "metric_keys_equal": sorted(m1) == sorted(m2),
        "predictions": rel(p1, p2) if p1.shape == p2.shape else float("inf"),
        "rows": int(p1.shape[0]),
        "global_step": m1.get("global_step"),
    }


def main(root, styles):
    out = {"tensorflow": tf.__version__, "stock_from": RECORD if NO_STOCK else "live"}
    for style in styles:
        stock = stock_run(style, root)
        try:
            engine = convert(
                style, os.path.join(root, style, "engine"), {"mode": "cpu", "engine": "strategy"}
            )
            out["replicas"] = engine.strategy.num_replicas_in_sync
            out[style] = differences(run(engine, style, root), stock, STYLES[style].any_order)
        except Exception as e:  # reported, so that every style is tried
            out[style] = {"error": f"{type(e).__name__}: {e}"[:3000]}
    out["pods"] = pods(root, [s for s in POD_STYLES if s in styles])
    out["pod_refusals"] = pod_refusals(root)
    print("RESULT " + json.dumps(out))


#: Styles a pod's hosts can each build a pipeline of (traced back to a Dataset).
POD_STYLES = ("one_shot", "numpy", "numpy_shuffled", "pandas")


def pods(root, styles):
    """The styles above on 2 emulated hosts (4 replicas each), against stock."""
    from tpushim._strategy import input as _strategy_input

    out = {}
    for style in styles:
        stock = stock_run(style, root)
        try:
            model_dir = os.path.join(root, style, "pods")
            estimator = convert(style, model_dir, {"mode": "cpu", "engine": "strategy"})
            with _strategy_input.emulated_hosts(2):
                ours = run(estimator, style, root)
            out[style] = differences(ours, stock, STYLES[style].any_order)
        except Exception as e:
            out[style] = {"error": f"{type(e).__name__}: {e}"[:3000]}
    return out


def _listing(model_dir):
    return sorted(
        os.path.relpath(os.path.join(d, f), model_dir)
        for d, _, files in os.walk(model_dir)
        for f in files
    )


def pod_refusals(root):
    """Tensors on a pod of 2 (emulated) hosts: the refusal, and model_dir as it was before."""
    from tpushim._strategy import input as _strategy_input

    out = {}
    for style in ("queue", "tensors"):
        model_dir = os.path.join(root, style, "pod")
        estimator = convert(style, model_dir, {"mode": "cpu", "engine": "strategy"})
        before = _listing(model_dir)
        try:
            with _strategy_input.emulated_hosts(2):
                estimator.train(STYLES[style].make(root)(True, None), steps=STEPS)
            out[style] = {"error": None}
        except Exception as e:
            out[style] = {
                "error": f"{type(e).__name__}: {e}",
                "written": _listing(model_dir) != before,
            }
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--record":
        record(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1], sys.argv[2:] or list(STYLES))
