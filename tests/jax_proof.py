"""The JAX engine's proof matrix, run as a process of its own (JAX's device count is fixed at its
first import, by ``XLA_FLAGS=--xla_force_host_platform_device_count=N``):
``python jax_proof.py DIR [--controls[=NAME,...]] [CASE ...]`` prints one ``RESULT {json}`` line:
for each case named (default: every case of :data:`CASES`), the engine's (``mode="cpu",
engine="jax"``) ``{"metrics", "predictions", "values"}`` after ``train`` / ``evaluate`` /
``predict`` and its ``cpu_seconds``; with ``--controls``, under ``"controls"``, the base case's
with each negative control of ``tpushim._jax._step.CONTROLS`` (``--controls=NAME,...``: those
named) put in the engine's step.

One small model (Dense -> BatchNormalization -> Dense) and 45 rows in global batches of 16, so
every epoch ends on a short batch of 13 rows padded to 16 (on 8 devices three of them hold
padding): training reads two epochs, evaluation and prediction one.

Stock is stock TensorFlow 2.15's estimator, recorded by
``python jax_proof.py --record tests/reference/jax_proof_tf215.json DIR`` in a TF 2.15 venv
(the same cases, ``mode="off"``).

A case is one line of :data:`CASES`: a loss (:data:`LOSSES`), an optimizer (:data:`OPTIMIZERS`)
and an input style (:data:`STYLES`). A new loss kind or optimizer the engine trains is one line
in its table and one in :data:`CASES`, then a new recording.

A helper run by tests/jax_engine/test_jax_proof.py, not a test module.
"""

import collections
import importlib.util
import itertools
import json
import os
import sys
import time

if importlib.util.find_spec("tensorflow_estimator") is None:  # TensorFlow >= 2.16
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import pandas as pd
import tensorflow as tf

import tpushim

ROWS, BATCH, SEED = 45, 16, 7
rng = np.random.RandomState(0)
X = rng.randn(ROWS, 4).astype(np.float32)
Y = (X[:, :1] * 2 - X[:, 1:2] + 0.1 * rng.randn(ROWS, 1)).astype(np.float32)
COLUMNS = "abcd"
FRAME = pd.DataFrame({k: X[:, i] for i, k in enumerate(COLUMNS)}, index=np.arange(100, 100 + ROWS))
HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "reference", "jax_proof_tf215.json")

Loss = collections.namedtuple("Loss", "loss activation labels metrics regularizer")
#: name -> Loss: the compiled loss, the output's activation, the labels made from Y, the
#: compiled metrics, a kernel regularizer of the hidden layer (None: none).
LOSSES = {
    "mse": Loss("mse", None, lambda y: y, ["mae"], None),
    "binary_crossentropy": Loss(
        "binary_crossentropy",
        "sigmoid",
        lambda y: (y > 0).astype(np.float32),
        ["accuracy"],
        None,
    ),
    "weight_regularizer": Loss(
        "mse", None, lambda y: y, ["mae"], lambda: tf.keras.regularizers.L2(0.01)
    ),
}

k, v1 = tf.keras.optimizers, tf.compat.v1.train
#: name -> what ``compile(optimizer=...)`` is given (one per optimizer family the engine trains)
OPTIMIZERS = {
    "sgd_momentum": lambda: k.legacy.SGD(0.05, momentum=0.9),
    "sgd_nesterov_v2": lambda: k.SGD(0.05, momentum=0.9, nesterov=True),
    "adam_amsgrad": lambda: k.legacy.Adam(0.01, amsgrad=True),
    "adam_v2": lambda: k.Adam(0.01),  # (AdamW: stock 2.15's model_to_estimator cannot clone it)
    "rmsprop_centered": lambda: k.legacy.RMSprop(0.01, momentum=0.5, centered=True, epsilon=0.1),
    "adagrad": lambda: k.legacy.Adagrad(0.1, epsilon=0.1),
    "adadelta": lambda: k.legacy.Adadelta(1.0, epsilon=1e-3),
    "adamax": lambda: k.legacy.Adamax(0.01, epsilon=1e-3),
    "ftrl": lambda: k.legacy.Ftrl(
        0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.01
    ),
    "tf1_gradient_descent": lambda: v1.GradientDescentOptimizer(0.1),
    "tf1_momentum": lambda: v1.MomentumOptimizer(0.05, 0.9, use_nesterov=True),
    "tf1_adam": lambda: v1.AdamOptimizer(0.01),
}


def _inputs():
    # tf.estimator's names exist on TensorFlow >= 2.16 only while tpushim is on.
    with tpushim.patched(mode="off", quiet=True):
        return tf.compat.v1.estimator.inputs


def _dataset(loss, labelled, epochs):
    x = {"x": X}
    data = (x, LOSSES[loss].labels(Y)) if labelled else x
    return tf.data.Dataset.from_tensor_slices(data).batch(BATCH).repeat(epochs)


def _dataset_input(loss, labelled, epochs):
    return lambda: _dataset(loss, labelled, epochs)


def _one_shot(loss, labelled, epochs):
    return lambda: tf.compat.v1.data.make_one_shot_iterator(
        _dataset(loss, labelled, epochs)
    ).get_next()


def _tensors(loss, labelled, epochs):  # the same batch every step, as stock feeds constants
    del epochs

    def input_fn():
        x = {"x": tf.constant(X[:BATCH])}
        return (x, tf.constant(LOSSES[loss].labels(Y[:BATCH]))) if labelled else x

    return input_fn


def _numpy(loss, labelled, epochs):
    y = LOSSES[loss].labels(Y) if labelled else None

    def input_fn():  # made at call time, as scripts do
        return _inputs().numpy_input_fn(
            {"x": X.astype(np.float64)}, y, batch_size=BATCH, num_epochs=epochs, shuffle=False
        )()

    return input_fn


def _pandas(loss, labelled, epochs):
    y = pd.Series(LOSSES[loss].labels(Y)[:, 0], index=FRAME.index) if labelled else None

    def input_fn():
        return _inputs().pandas_input_fn(
            FRAME, y, batch_size=BATCH, num_epochs=epochs, shuffle=False
        )()

    return input_fn


def _feature_columns(loss, labelled, epochs):
    """A dict of scalar columns, as a CSV or pandas script has, into the model's DenseFeatures."""
    frame = {c: X[:, i] for i, c in enumerate(COLUMNS)}
    data = (frame, LOSSES[loss].labels(Y)) if labelled else frame
    return lambda: tf.data.Dataset.from_tensor_slices(data).batch(BATCH).repeat(epochs)


Style = collections.namedtuple("Style", "model make train_steps eval_steps predictions_taken")
#: name -> Style: the model's inputs ("x": one (4,) input; "columns": the columns a-d through
#: DenseFeatures), ``make(loss, labelled, epochs)`` giving the input_fn, the steps of train and
#: evaluate (None: to the input's end), the predictions taken (None: all; constants never end).
STYLES = {
    "dataset": Style("x", _dataset_input, None, None, None),
    "tensors": Style("x", _tensors, 3, 1, BATCH),
    "one_shot": Style("x", _one_shot, None, None, None),
    "numpy_input_fn": Style("x", _numpy, None, None, None),
    "pandas_input_fn": Style("columns", _pandas, None, None, None),
    "feature_columns": Style("columns", _feature_columns, None, None, None),
}

Case = collections.namedtuple("Case", "loss optimizer style")
BASE = Case("mse", "sgd_momentum", "dataset")
#: The proof's matrix: name -> Case. One line per loss, optimizer and input style the engine
#: trains, each varying the base case along one axis.
CASES = {
    "base": BASE,
    **{f"loss-{n}": BASE._replace(loss=n) for n in LOSSES if n != BASE.loss},
    **{f"optimizer-{n}": BASE._replace(optimizer=n) for n in OPTIMIZERS if n != BASE.optimizer},
    **{f"input-{n}": BASE._replace(style=n) for n in STYLES if n != BASE.style},
}


def model(case):
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(1)
    loss = LOSSES[case.loss]
    regularizer = loss.regularizer() if loss.regularizer else None
    if STYLES[case.style].model == "columns":
        inputs = {c: tf.keras.Input((), name=c) for c in COLUMNS}
        columns = [tf.feature_column.numeric_column(c) for c in COLUMNS]
        x = tf.keras.layers.DenseFeatures(columns, name="features")(inputs)
    else:
        inputs = x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(5, activation="tanh", kernel_regularizer=regularizer, name="hidden")(
        x
    )
    h = tf.keras.layers.BatchNormalization(momentum=0.8, name="bn")(h)
    out = tf.keras.layers.Dense(1, activation=loss.activation, name="out")(h)
    m = tf.keras.Model(inputs, out)
    m.compile(OPTIMIZERS[case.optimizer](), loss=loss.loss, metrics=loss.metrics)
    return m


def convert(case, model_dir, patch):
    with tpushim.patched(quiet=True, **patch):
        config = tf.estimator.RunConfig(tf_random_seed=SEED, model_dir=model_dir)
        return tf.keras.estimator.model_to_estimator(keras_model=model(case), config=config)


def run(estimator, case):
    style = STYLES[case.style]
    make = style.make
    estimator.train(make(case.loss, True, 2), steps=style.train_steps)
    metrics = estimator.evaluate(make(case.loss, True, 1), steps=style.eval_steps)
    predictions = estimator.predict(make(case.loss, False, 1))
    predictions = [p["out"] for p in itertools.islice(predictions, style.predictions_taken)]
    return {
        "metrics": {k: float(v) for k, v in metrics.items()},
        "predictions": np.asarray(predictions, np.float64).tolist(),
        "values": {
            n: np.asarray(estimator.get_variable_value(n), np.float64).tolist()
            for n in estimator.get_variable_names()
            if n != "_CHECKPOINTABLE_OBJECT_GRAPH"
        },
    }


def _attempt(fn):
    try:
        return fn()
    except Exception as e:  # reported, so that every case is tried
        return {"error": f"{type(e).__name__}: {e}"[:3000]}


def record(path, root):
    """Stock's numbers of every case, as JSON (run on TensorFlow 2.15)."""
    out = {"tensorflow": tf.__version__}
    for name, case in CASES.items():
        out[name] = run(convert(case, os.path.join(root, name), {"mode": "off"}), case)
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


def _with_control(control):
    """The engine's conversions made while inside give their Trainers this negative control."""
    from tpushim._jax import _build, _step

    made = _build.JaxConversion.trainer

    def trainer(self, global_batch, seeds=None):
        return _step.Trainer(
            self.keras_model,
            global_batch,
            self.devices,
            self.custom_objects,
            control=control,
            seeds=seeds,
        )

    _build.JaxConversion.trainer = trainer
    return lambda: setattr(_build.JaxConversion, "trainer", made)


def main(root, names, controls):
    import jax

    engine = {"mode": "cpu", "engine": "jax"}
    out = {"tensorflow": tf.__version__, "devices": jax.local_device_count(), "controls": {}}
    out["cpu_seconds"] = {}
    for name in names:
        case = CASES[name]
        started = time.process_time()
        out[name] = _attempt(lambda: run(convert(case, os.path.join(root, name), engine), case))
        out["cpu_seconds"][name] = round(time.process_time() - started, 2)
    if controls is not None:
        from tpushim._jax import _step

        unknown = set(controls) - set(_step.CONTROLS)
        assert not unknown, f"no such control: {sorted(unknown)}"
        for control in controls or _step.CONTROLS:
            undo = _with_control(control)
            try:
                model_dir = os.path.join(root, f"control-{control}")
                out["controls"][control] = _attempt(
                    lambda: run(convert(BASE, model_dir, engine), BASE)
                )
            finally:
                undo()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--record":
        record(sys.argv[2], sys.argv[3])
    else:
        names = [a for a in sys.argv[2:] if not a.startswith("--controls")]
        asked = [a.partition("=")[2] for a in sys.argv[2:] if a.startswith("--controls")]
        controls = [c for c in asked[-1].split(",") if c] if asked else None  # []: every one
        main(sys.argv[1], names or list(CASES), controls)
