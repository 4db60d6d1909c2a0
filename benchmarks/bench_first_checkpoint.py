"""Time to the first checkpoint (issue 48): how long after ``train()`` is called each engine
writes ``model.ckpt-0``, against stock. A crash before it loses everything; the strategy engine
took 5x stock's on an MLP (TF 2.21), most of it AutoGraph converting tpushim's own functions in
its ``tf.function``s (the XLA check's trace of the step, the input pipeline's maps).

Models: an MLP 784-256-10 (512 rows) and MobileNetV2 96x96x3 (``weights=None``, 10 classes, 64
rows), Keras SGD(0.01) and ``sparse_categorical_crossentropy``, ``model_to_estimator(model,
model_dir)`` then ``train(from_tensor_slices(...).batch(32).repeat(), steps=2)``. Each run a
fresh process (benchlib.drive), contenders interleaved, the order rotating:

* ``stock``: on TensorFlow <= 2.15 the stock estimator (tpushim not patched); on >= 2.16, where
  no stock estimator exists, tpushim's estimator API (``mode="off"``, the stock engine);
* ``stock again``: the noise (the stock-against-stock row);
* ``TPUEstimator path``: ``mode="cpu", engine="tpuestimator"`` (TensorFlow <= 2.15 only);
* ``strategy engine, tpushim's code converted (before)``: the strategy engine with AutoGraph
  converting tpushim's functions again, as before they were marked
  (``_tfprivate.graph.not_converted``): emulated by the driver, which makes AutoGraph ignore the mark
  on tpushim's functions (and only theirs);
* ``strategy engine``: ``mode="cpu", engine="strategy"``;
* ``JAX engine``: ``mode="cpu", engine="jax"`` (TensorFlow >= 2.16 with the jax extra), its
  step on the machine's one CPU device: its first checkpoint comes after tf2jax's conversion
  and XLA's compile of the step, which stock's graph has no counterpart of.

Measured: seconds from ``train()`` called to ``model_dir/model.ckpt-0.index`` existing (a thread
polls it every 5 ms). Not timed: the interpreter's start, importing TensorFlow and tpushim,
building the model, ``model_to_estimator`` (reported beside, as ``convert``), nor the steps after
the checkpoint (the whole ``train()`` is reported beside too). Goal (issue 48): every engine <=
1.5x stock's time to the first checkpoint, per model.
"""

import json
import os
import sys
import threading
import time

import benchlib

GOAL = 1.5
ROWS, BATCH, STEPS, CLASSES = {"MLP": 512, "MobileNetV2": 64}, 32, 2, 10
CASES = {
    "MLP": "MLP 784-256-10, 512 rows by 32",
    "MobileNetV2": "MobileNetV2 96x96 (weights=None), 64 rows by 32",
}
STOCK, STOCK_AGAIN, TPUESTIMATOR, BEFORE, ENGINE, JAX = (
    "stock",
    "stock again",
    "TPUEstimator path",
    "strategy engine, tpushim's code converted (before)",
    "strategy engine",
    "JAX engine",
)
#: contender -> (driver kind); the TPUEstimator path only where tf.estimator exists
KINDS = {
    STOCK: "stock",
    STOCK_AGAIN: "stock",
    TPUESTIMATOR: "tpuestimator",
    BEFORE: "strategy-before",
    ENGINE: "strategy",
    JAX: "jax",
}


def _tf_version():
    """This interpreter's TensorFlow version as (major, minor), read without importing it."""
    import importlib.metadata

    for dist in ("tensorflow", "tensorflow-cpu"):
        try:
            return tuple(int(p) for p in importlib.metadata.version(dist).split(".")[:2])
        except importlib.metadata.PackageNotFoundError:
            pass
    return (0, 0)


def _has_jax():
    """Whether jax and tf2jax are installed (the JAX engine's extra), read without importing."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("jax", "tf2jax"))


def contenders(tf_version, has_jax=False):
    """The contenders on this TensorFlow: no TPUEstimator path from 2.16; the JAX engine from
    2.16 where its extra is installed (its step on this machine's one CPU device)."""
    return [
        c
        for c in KINDS
        if not (c == TPUESTIMATOR and tf_version >= (2, 16))
        and not (c == JAX and (tf_version < (2, 16) or not has_jax))
    ]


def _median(runs, key):
    return benchlib.median([r[key] for r in runs])


def run(table, opts, report):
    """The ``first-checkpoint`` section."""
    reps = benchlib.rounds(opts, full=5, quick=1)
    models = ["MLP"] if opts.quick else list(CASES)
    version = _tf_version()
    names = contenders(version, _has_jax())
    for model in models:
        runs = benchlib.interleaved(
            [(c, c) for c in names], reps, lambda c: benchlib.drive(__file__, KINDS[c], model)
        )
        report[f"first-checkpoint {model}"] = runs
        first = benchlib.Paired({c: [r["first"] for r in v] for c, v in runs.items()}, STOCK)
        noise = first.ratios(STOCK_AGAIN)
        noise = (min(noise), max(noise)) if noise else None
        case = f"{CASES[model]}: train() to model.ckpt-0, s"
        for contender in names:
            goal = contender in (TPUESTIMATOR, ENGINE, JAX)
            ratio = first.ratio(contender)
            table.add(
                "first-checkpoint",
                case,
                contender,
                f"{benchlib.median(first.values[contender]):.2f} "
                f"(convert {_median(runs[contender], 'convert'):.2f}, "
                f"train(steps={STEPS}) {_median(runs[contender], 'train'):.2f})",
                f"{ratio:.2f}x" if contender != STOCK else "",
                goal=f"<= {GOAL}x" if goal else "",
                ok=(ratio <= GOAL) if goal else None,
                spread=first.spread(contender),
                noise=noise,
            )
    table.notes.append(
        f"first-checkpoint: {reps} round(s), each contender a fresh process per round, order "
        "rotating; medians of the per-round ratios against stock. Timed: train() called to "
        "model.ckpt-0.index written (import, model building and model_to_estimator not timed; "
        f"convert and the whole train(steps={STEPS}) shown beside). TensorFlow "
        f"{'.'.join(map(str, version))}: stock is "
        + (
            "tpushim's estimator API (mode off), no stock estimator existing"
            if version >= (2, 16)
            else "the stock estimator"
        )
        + "."
    )


# -- the driver: one run, in its own process --------------------------------------------------


def _convert_tpushims_code_again():
    """The engine as it was before tpushim's functions were marked: AutoGraph converts them (the
    mark ignored on tpushim's functions only; TensorFlow's own artifacts keep theirs)."""
    from tensorflow.python.autograph.impl import api

    marked = api.is_autograph_artifact

    def is_autograph_artifact(entity):
        module = getattr(entity, "__module__", None) or ""
        return marked(entity) and not module.startswith("tpushim")

    api.is_autograph_artifact = is_autograph_artifact


def _drive(workdir, kind, model_name):
    import tpushim

    if kind == "stock":
        # TF >= 2.16: tpushim's estimator API (mode off) is the only estimator; <= 2.15: stock's.
        if _tf_version() >= (2, 16):
            tpushim.patch(mode="off", quiet=True)
    else:
        engine = kind if kind in ("tpuestimator", "jax") else "strategy"
        tpushim.patch(mode="cpu", engine=engine, quiet=True)
    import numpy as np

    tf = benchlib.tf()
    if kind == "strategy-before":
        _convert_tpushims_code_again()
    tf.keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    rows = ROWS[model_name]
    if model_name == "MLP":
        model = tf.keras.Sequential(
            [
                tf.keras.Input((784,)),
                tf.keras.layers.Dense(256, activation="relu"),
                tf.keras.layers.Dense(CLASSES, activation="softmax"),
            ]
        )
        x = rng.rand(rows, 784).astype("float32")
    else:
        model = tf.keras.applications.MobileNetV2(
            weights=None, input_shape=(96, 96, 3), classes=CLASSES
        )
        x = rng.rand(rows, 96, 96, 3).astype("float32")
    y = rng.randint(0, CLASSES, rows)
    model.compile(tf.keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    model_dir = os.path.join(workdir, "model")
    began = time.perf_counter()
    estimator = tf.keras.estimator.model_to_estimator(model, model_dir=model_dir)
    converted = time.perf_counter()
    index = os.path.join(model_dir, "model.ckpt-0.index")
    seen, stop = {}, threading.Event()

    def watch():
        while not stop.is_set():
            if os.path.exists(index):
                seen["at"] = time.perf_counter()
                return
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    called = time.perf_counter()
    estimator.train(
        lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(), steps=STEPS
    )
    done = time.perf_counter()
    watcher.join(1.0)
    stop.set()
    if "at" not in seen:
        raise RuntimeError(f"{index} was not written")
    result = {"first": seen["at"] - called, "convert": converted - began, "train": done - called}
    print("BENCH " + json.dumps(result), flush=True)


if __name__ == "__main__":
    _drive(*sys.argv[1:4])
