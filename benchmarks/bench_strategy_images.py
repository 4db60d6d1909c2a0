"""Image models on the strategy engine against the stock estimator (issues 33 and 36): the cost
of a conversion and a short ``train()``.

MobileNetV2 (96x96x3) and ResNet50 (64x64x3) from ``keras.applications`` (``weights=None``, 10
classes, Keras legacy Adam), converted by ``model_to_estimator`` and trained by
``train(steps=2)`` on ``from_tensor_slices(...).batch(8)`` over 12 rows (the second batch short:
the engine pads it). Each run a fresh process on this machine's one CPU device (the engine's
MirroredStrategy has one replica), contenders interleaved, the order rotating:

* ``stock estimator``, and ``stock estimator again`` (the noise);
* ``engine, names from a second graph (before)``: the strategy engine as it was before it read
  stock's checkpoint names from the graph the conversion builds for stock's warm-start
  checkpoint: a second clone of the model in a graph, with Keras's whole train function
  (forward, gradients and updates), at the first ``train()``;
* ``tpushim engine`` (``tpushim.patched(mode="cpu", engine="strategy")``).

Measured: the conversion plus ``train()`` wall time, with the engine's parts: building stock's
checkpoint names, the XLA check of the training step (``_strategy.xla_check.check_xla``), the first
``tf.function`` call (tracing the step, then its steps). Goal (issue 36): the engine <= 1.2x
stock's wall time.
"""

import json
import os
import sys
import time

import benchlib

GOAL = 1.2
MODELS = {"MobileNetV2": 96, "ResNet50": 64}
ROWS, BATCH, STEPS, CLASSES = 12, 8, 2, 10
STOCK, STOCK_AGAIN, BEFORE, ENGINE = (
    "stock estimator",
    "stock estimator again",
    "engine, names from a second graph (before)",
    "tpushim engine",
)
KINDS = {STOCK: "stock", STOCK_AGAIN: "stock", BEFORE: "engine-before", ENGINE: "engine"}
PARTS = (("names", "stock's names"), ("xla", "XLA check"), ("first", "first loop call"))


def _run(kind, name):
    """One driver run: ``{"total": s, "convert": s, "train": s, and the engine's parts}``."""
    return benchlib.drive(__file__, kind, name)


def run(table, opts, report):
    reps = benchlib.rounds(opts, full=3, quick=1)
    models = list(MODELS)[:1] if opts.quick else list(MODELS)
    for name in models:
        runs = benchlib.interleaved(
            [(c, c) for c in KINDS], reps, lambda contender: _run(KINDS[contender], name)
        )
        report[f"strategy-images {name}"] = runs
        total = benchlib.Paired({c: [r["total"] for r in v] for c, v in runs.items()}, STOCK)
        noise = total.ratios(STOCK_AGAIN)
        noise = (min(noise), max(noise)) if noise else None
        case = (
            f"{name} {MODELS[name]}x{MODELS[name]}, {ROWS} rows by {BATCH}: "
            f"model_to_estimator + train(steps={STEPS}) s"
        )
        for contender in KINDS:
            engine = contender in (BEFORE, ENGINE)
            parts = ""
            if engine:
                parts = (
                    " ("
                    + ", ".join(
                        f"{label} {benchlib.median([r[key] for r in runs[contender]]):.1f}"
                        for key, label in PARTS
                    )
                    + ")"
                )
            convert = benchlib.median([r["convert"] for r in runs[contender]])
            table.add(
                "strategy-images",
                case,
                contender,
                f"{benchlib.median(total.values[contender]):.1f} (convert {convert:.1f}){parts}",
                f"{total.ratio(contender):.2f}x" if contender != STOCK else "",
                goal=f"<= {GOAL}x" if contender == ENGINE else "",
                ok=(total.ratio(contender) <= GOAL) if contender == ENGINE else None,
                spread=total.spread(contender),
                noise=noise,
            )
    table.notes.append(
        f"strategy-images: {reps} round(s), each contender a fresh process per round (one CPU "
        "device), order rotating; medians of the per-round ratios against stock. The engine's "
        "parts are inside its total: stock's checkpoint names (0 once read from the "
        "conversion's graph), the XLA check of the step, the first loop call (tracing + steps)."
    )


# -- the driver: one run, in its own process --------------------------------------------------


def _before():
    """The engine as it was: no names kept from the conversion's graph; at the first need, a
    second graph with Keras's whole train function (forward, gradients, updates)."""
    from tpushim import _tfprivate
    from tpushim._strategy import checkpoint as _strategy_checkpoint

    _strategy_checkpoint.remember = lambda plan, model, step: None
    _tfprivate.checkpoint.make_train_variables = lambda model: model._make_train_function()


def _timed(module, attr, times, key):
    """Adds the seconds spent in ``module.attr`` to ``times[key]``."""
    original = getattr(module, attr)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            times[key] += time.perf_counter() - start

    setattr(module, attr, timed)


def _drive(workdir, kind, name):
    import numpy as np

    tf = benchlib.tf()
    tf.keras.utils.set_random_seed(0)
    size = MODELS[name]
    model = getattr(tf.keras.applications, name)(
        weights=None, input_shape=(size, size, 3), classes=CLASSES
    )
    model.compile(tf.keras.optimizers.legacy.Adam(1e-3), "sparse_categorical_crossentropy")
    rng = np.random.RandomState(0)
    x = rng.rand(ROWS, size, size, 3).astype("float32")
    y = rng.randint(0, CLASSES, (ROWS, 1)).astype("int64")

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)

    times = {"names": 0.0, "xla": 0.0, "first": 0.0}
    model_dir = os.path.join(workdir, "model")
    config = tf.estimator.RunConfig(tf_random_seed=benchlib.SEED)
    start = time.perf_counter()
    if kind == "stock":
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=model, model_dir=model_dir, config=config
        )
    else:
        import tpushim
        from tpushim import _tfprivate
        from tpushim._strategy import checkpoint as _strategy_checkpoint
        from tpushim._strategy import xla_check as _strategy_xla_check

        if kind == "engine-before":
            _before()
        _timed(_tfprivate.checkpoint, "stock_checkpoint_names", times, "names")
        _timed(_strategy_checkpoint, "remember", times, "names")
        _timed(_strategy_xla_check, "check_xla", times, "xla")

        def first_call(result, seconds):
            if not times.get("called"):
                times["first"], times["called"] = seconds, 1

        benchlib.time_engine_loop(first_call)
        with tpushim.patched(mode="cpu", engine="strategy", quiet=True):
            estimator = tf.keras.estimator.model_to_estimator(
                keras_model=model, model_dir=model_dir, config=config
            )
    converted = time.perf_counter()
    estimator.train(input_fn, steps=STEPS)
    done = time.perf_counter()
    times.pop("called", None)
    result = {"total": done - start, "convert": converted - start, "train": done - converted}
    print("BENCH " + json.dumps({**result, **times}), flush=True)


if __name__ == "__main__":
    _drive(*sys.argv[1:4])
