"""``tf.estimator.add_metrics`` on the strategy engine, run as its own process (the logical devices
must be made before TensorFlow initialises): ``python strategy_metrics_proof.py DIR`` prints one
JSON object.

A binary classifier with a compiled ``accuracy``, 45 examples in global batches of 10 (a short
last batch of 5; every batch padded to 16 for 8 replicas), dict features; three metric_fns added
one after another, the signatures stock takes: ``(labels, predictions)`` returning
``tf.compat.v1.metrics`` pairs, ``(labels, predictions, features)`` returning Keras ``Metric``
objects (one weighted by a feature) and a pair, and ``(config, predictions, features, labels)``
returning an ``accuracy`` that replaces the compiled one. Trained 5 steps and evaluated, by stock's
estimator and by the strategy engine on 8 logical CPU devices; reported: the metrics' keys and the
largest difference to stock. On TensorFlow 2.15 also stock's add_metrics estimator evaluating the
engine's checkpoint (the same checkpoint: the same numbers). Negative control: the engine with the
padding rows kept in the added metrics' rows.

``metric_names_map`` (a model_to_estimator argument): a model compiled with two metrics converted
with a map renaming both, trained and evaluated by both (the keys and numbers); and two wrong maps
(a compiled name missing, a key no metric has): stock's errors at train(), the engine's, and
whether the engine's train() wrote anything before raising.

A ridge regression as public feature-column scripts write it (numeric columns through
``DenseFeatures``, ``Dense(1)`` with an L2 kernel regularizer, ``metrics=["mae", "mse",
MeanAbsoluteError()]``, float64 labels of shape [batch] as a DataFrame's column gives them),
trained and evaluated over the same 45 rows in batches of 10 (the last of 5): the compiled
metrics by the engine against stock's. Stock's graph averages a [batch] label's ``mae`` and
``mse`` over the batches (one value per batch), not over the rows. Negative control: the labels
handed to the metrics as [batch, 1] (per-row averages).

On TensorFlow >= 2.16 (no stock estimator) stock is stock TF 2.15's numbers, recorded by
``python strategy_metrics_proof.py --record tests/reference/strategy_metrics_tf215.json DIR`` in
a TF 2.15 venv.

A helper run by tests/proofs/test_strategy_metrics.py, not a test module.
"""

import json
import os
import sys

import eight_devices  # first: 8 logical CPU devices, before TensorFlow initialises
import numpy as np
import tensorflow as tf

import tpushim
from tpushim import _added_metrics, _compiled_metrics, _padding
from tpushim._strategy import estimator as _strategy_estimator

ROWS, BATCH, STEPS = 45, 10, 5
rng = np.random.RandomState(0)
X = rng.randn(ROWS, 4).astype(np.float32)
Y = ((X[:, :1] - X[:, 1:2] + 0.5 * rng.randn(ROWS, 1)) > 0).astype(np.float32)

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "reference", "strategy_metrics_tf215.json")
NO_STOCK = eight_devices.NO_STOCK


def model(metrics=("accuracy",)):
    tf.keras.utils.set_random_seed(1)
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(5, activation="tanh", name="hidden")(x)
    m = tf.keras.Model(x, tf.keras.layers.Dense(1, activation="sigmoid", name="out")(h))
    m.compile(
        tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9),
        loss="binary_crossentropy",
        metrics=list(metrics),
    )
    return m


MAPPED_METRICS = ("accuracy", "mae")
NAMES_MAP = {"accuracy": "my_accuracy", "mae": "my_mae"}
WRONG_MAPS = {
    "missing": {"accuracy": "my_accuracy"},
    "extra": {**NAMES_MAP, "auc": "my_auc"},
}


def mapped(root, name, names_map=None, **patch):
    """metric_names_map: the evaluation's {key: value} after training, or the train() error as
    {"error": its text, "wrote": the files train() added to model_dir before raising}."""
    model_dir = os.path.join(root, name)
    with tpushim.patched(quiet=True, **patch):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=model(MAPPED_METRICS),
            model_dir=model_dir,
            metric_names_map=names_map or NAMES_MAP,
        )
    before = {os.path.join(d, f) for d, _, fs in os.walk(model_dir) for f in fs}
    try:
        estimator.train(input_fn, steps=STEPS)
    except ValueError as error:
        after = {os.path.join(d, f) for d, _, fs in os.walk(model_dir) for f in fs}
        return {"error": str(error), "wrote": sorted(after - before)}
    return evaluate(estimator)


def names_map_cases(root, **patch):
    which = "stock" if patch.get("mode") == "off" else "engine"
    out = {"mapped": mapped(root, f"mapped_{which}", **patch)}
    for case, names_map in WRONG_MAPS.items():
        out[case] = mapped(root, f"{case}_{which}", names_map, **patch)
    return out


def input_fn():
    return tf.data.Dataset.from_tensor_slices(({"x": X}, Y)).batch(BATCH)


# The ridge regression: two float64 feature columns of shape [rows] (``dict(df)``) and a
# float64 label of shape [rows] (``df["y"].values``).
RIDGE_FEATURES = {"a": X[:, 2].astype(np.float64), "b": X[:, 3].astype(np.float64)}
RIDGE_Y = 4.0 + 3.0 * X[:, 2] - 2.0 * X[:, 3] + rng.randn(ROWS)


def ridge_model(seeded=True):
    if seeded:
        tf.keras.utils.set_random_seed(2)
    inputs = {c: tf.keras.Input((1,), name=c) for c in RIDGE_FEATURES}
    columns = [tf.feature_column.numeric_column(c) for c in RIDGE_FEATURES]
    x = tf.keras.layers.DenseFeatures(columns)(inputs)
    l2 = tf.keras.regularizers.l2(0.01)
    m = tf.keras.Model(inputs, tf.keras.layers.Dense(1, kernel_regularizer=l2)(x))
    m.compile(
        tf.keras.optimizers.legacy.Adam(0.1),
        loss="mse",
        metrics=["mae", "mse", tf.keras.metrics.MeanAbsoluteError(name="mae_object")],
    )
    return m


def ridge_input_fn():
    return tf.data.Dataset.from_tensor_slices((RIDGE_FEATURES, RIDGE_Y)).batch(BATCH)


def ridge(root, **patch):
    """The ridge regression trained and evaluated: the estimator, its evaluation, and the initial
    weights of a second ridge regression built after it from the program's random state (not
    seeded again), as a script comparing two models builds its second."""
    which = "stock" if patch.get("mode") == "off" else "engine"
    with tpushim.patched(quiet=True, **patch):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=ridge_model(), model_dir=os.path.join(root, f"ridge_{which}")
        )
    estimator.train(ridge_input_fn, steps=STEPS)
    evaluation = evaluate(estimator, ridge_input_fn)
    return estimator, evaluation, initial_weights(ridge_model(seeded=False))


def initial_weights(built):
    return [float(v) for weights in built.get_weights() for v in np.ravel(weights)]


def v1_metrics(labels, predictions):
    p = predictions["out"]
    return {
        "auc": tf.compat.v1.metrics.auc(labels, p),
        "precision": tf.compat.v1.metrics.precision(labels, p > 0.5),
        "mean_abs": tf.compat.v1.metrics.mean_absolute_error(labels, p),
    }


def keras_metrics(labels, predictions, features):
    auc = tf.keras.metrics.AUC(name="keras_auc")
    auc.update_state(labels, predictions["out"], sample_weight=tf.abs(features["x"][:, :1]))
    recall = tf.keras.metrics.Recall(name="keras_recall")
    recall.update_state(labels, predictions["out"])
    return {
        "keras_auc": auc,
        "keras_recall": recall,
        "mean_feature": tf.compat.v1.metrics.mean(features["x"][:, 0]),
    }


def with_config(config, predictions, features, labels):
    assert config.model_dir and features["x"] is not None and labels is not None
    return {"accuracy": tf.compat.v1.metrics.mean(predictions["out"])}  # replaces the compiled


def added(estimator):
    add = estimator_api().add_metrics
    for metric_fn in (v1_metrics, keras_metrics, with_config):
        estimator = add(estimator, metric_fn)
    return estimator


def estimator_api():
    """tf.estimator (on TensorFlow >= 2.16 it exists while tpushim is patched: tpushim's own)."""
    if NO_STOCK:
        from tpushim._estimator_api import _api

        return _api.build("tf.estimator")
    return tf.estimator


def convert(model_dir, **patch):
    with tpushim.patched(quiet=True, **patch):
        converted = tf.keras.estimator.model_to_estimator(keras_model=model(), model_dir=model_dir)
        return added(converted)


def evaluate(estimator, given_input_fn=input_fn):
    return {k: float(v) for k, v in estimator.evaluate(given_input_fn).items()}


def stock(root, part="metrics"):
    if NO_STOCK:
        with open(RECORD) as f:
            recorded = json.load(f)
        if part == "ridge":
            return {k: recorded[k] for k in ("ridge", "ridge_second")}
        return recorded[part]
    if part == "names_map":
        return names_map_cases(root, mode="off")
    if part == "ridge":
        return dict(zip(("ridge", "ridge_second"), ridge(root, mode="off")[1:]))
    estimator = convert(os.path.join(root, "stock"), mode="off")
    estimator.train(input_fn, steps=STEPS)
    return evaluate(estimator)


def difference(ours, theirs):
    return max(abs(ours[k] - v) / max(1.0, abs(v)) for k, v in theirs.items() if k in ours)


def main(root):
    expected = stock(root)
    engine_dir = os.path.join(root, "engine")
    engine = convert(engine_dir, mode="cpu", engine="strategy")
    engine.train(input_fn, steps=STEPS)
    ours = evaluate(engine)
    out = {
        "tensorflow": tf.__version__,
        "stock_from": RECORD if NO_STOCK else "live",
        "engine": type(engine).__name__,
        "replicas": engine.strategy.num_replicas_in_sync,
        "keys": sorted(ours),
        "stock_keys": sorted(expected),
        "difference": difference(ours, expected),
    }
    if not NO_STOCK:  # stock's add_metrics estimator on the engine's checkpoint
        reader = convert(engine_dir, mode="off")
        out["same_checkpoint"] = difference(ours, evaluate(reader))
    real_rows = _added_metrics.real_rows
    _added_metrics.real_rows = lambda structure, real: structure  # padding rows kept
    try:
        out["control"] = difference(evaluate(engine), expected)
    finally:
        _added_metrics.real_rows = real_rows
    assert isinstance(engine, _strategy_estimator.StrategyEstimator)
    out["names_map"] = {
        "stock": stock(root, "names_map"),
        "engine": names_map_cases(root, mode="cpu", engine="strategy"),
    }
    out["ridge"] = ridge_cases(root)
    print("RESULT " + json.dumps(out))


def ridge_cases(root):
    """The ridge regression's evaluation by stock and the engine, their largest difference, and
    the control's (the [batch] labels handed to the metrics as [batch, 1]); the second ridge
    regression's initial weights after each, and the control's (the first built, not trained,
    then one Keras seed drawn, as the engine's copies of a model for its checks once drew)."""
    expected = stock(root, "ridge")
    engine, ours, second = ridge(root, mode="cpu", engine="strategy")
    ridge_model()
    tf.keras.initializers.GlorotUniform()((1, 1))  # one Keras seed drawn
    drawn = initial_weights(ridge_model(seeded=False))
    as_in_stocks_graph = _compiled_metrics.as_in_stocks_graph
    _compiled_metrics.as_in_stocks_graph = _padding.row_labels  # per-row averages
    try:
        control = difference(evaluate(engine, ridge_input_fn), expected["ridge"])
    finally:
        _compiled_metrics.as_in_stocks_graph = as_in_stocks_graph
    stock_second = dict(enumerate(expected["ridge_second"]))
    return {
        "replicas": engine.strategy.num_replicas_in_sync,
        "engine": ours,
        "stock": expected["ridge"],
        "difference": difference(ours, expected["ridge"]),
        "control": control,
        "second": {
            "engine": second,
            "stock": expected["ridge_second"],
            "difference": difference(dict(enumerate(second)), stock_second),
            "control": difference(dict(enumerate(drawn)), stock_second),
        },
    }


def record(path, root):
    """Stock's numbers, as JSON (run on TensorFlow 2.15)."""
    with open(path, "w") as f:
        json.dump(
            {
                "tensorflow": tf.__version__,
                "metrics": stock(root),
                "names_map": stock(root, "names_map"),
                **stock(root, "ridge"),
            },
            f,
            indent=1,
            sort_keys=True,
        )
        f.write("\n")


if __name__ == "__main__":
    if sys.argv[1] == "--record":
        record(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1])
