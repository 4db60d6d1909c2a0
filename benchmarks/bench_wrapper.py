"""Wrapper: ``model_to_estimator`` patched in auto mode with no TPU against the unpatched call
(same model, fresh model_dir per call), interleaved, with the unpatched call against itself as the
noise floor; then the wrapper alone around a no-op stand-in, which is the part of the difference
that is the wrapper's own. Goal: <= 1% added.
"""

import time

import benchlib
from benchlib import SEED, median

SECTION = "model_to_estimator"


def _call(tf, tpushim, case, scratch, mode):
    """Seconds of one ``model_to_estimator`` call, tpushim in ``mode`` (None: unpatched)."""
    if mode:
        tpushim.patch(mode=mode)
    else:
        tpushim.unpatch()
    try:
        # A fresh, identical model per call: keras_lib cannot convert one model object twice.
        model = case.keras_model()
        config = tf.estimator.RunConfig(tf_random_seed=SEED)
        start = time.perf_counter()
        est = tf.keras.estimator.model_to_estimator(
            keras_model=model, model_dir=scratch.new(), config=config
        )
        elapsed = time.perf_counter() - start
    finally:
        tpushim.unpatch()
    assert type(est).__name__ == "EstimatorV2", type(est)
    return elapsed


def _wrapper_alone(tpushim, keras_lib, model, n):
    """Seconds per call of keras_lib's function replaced by a no-op stand-in, bare and wrapped."""
    original = keras_lib.model_to_estimator

    def stand_in(*args, **kwargs):
        del args, kwargs

    stand_in.__wrapped__ = original  # same inspect.signature as the real one
    keras_lib.model_to_estimator = stand_in
    alone = {"stand-in": [], "wrapped": []}
    try:  # through the public patch()/unpatch(), which wrap whatever keras_lib holds
        for _ in range(5):
            for kind in ("stand-in", "wrapped"):
                if kind == "wrapped":
                    tpushim.patch(mode="auto")
                fn = keras_lib.model_to_estimator
                start = time.perf_counter()
                for _ in range(n):
                    fn(keras_model=model, model_dir="/nonexistent")
                alone[kind].append((time.perf_counter() - start) / n)
                tpushim.unpatch()
    finally:
        tpushim.unpatch()
        keras_lib.model_to_estimator = original
    return alone


def run(table, opts, report):
    """The ``wrapper`` section."""
    tf = benchlib.tf()
    from tensorflow_estimator.python.estimator import keras_lib

    import tpushim

    case = benchlib.mlp(opts.quick)
    reps = benchlib.rounds(opts, full=40, quick=6)
    contenders = [
        ("stock (unpatched)", None),
        ("stock again (unpatched)", None),
        ("tpushim auto, no TPU", "auto"),
    ]
    with benchlib.ScratchDir("tpushim-bench-wrapper-") as scratch:
        measure = lambda mode: _call(tf, tpushim, case, scratch, mode)
        measure(None), measure("auto")  # first calls import keras_lib and tpushim._detect
        times = benchlib.interleaved(contenders, reps, measure)
        n = 300 if opts.quick else 2000
        alone = _wrapper_alone(tpushim, keras_lib, case.keras_model(), n)
    paired = benchlib.Paired(times, contenders[0][0])
    stock = median(times[contenders[0][0]]) * 1e3
    added_pct = lambda v, b: (v - b) / b * 100  # each call against the stock call of its round
    label = f"{case.name}, {reps} interleaved rounds"
    noise = [paired.ratios(contenders[1][0], added_pct)]
    for name, mode in contenders:
        value = f"{median(times[name]) * 1e3:.1f} ms/call"
        if name == contenders[0][0]:
            table.add(SECTION, label, name, value)
            continue
        added = paired.ratio(name, added_pct)
        goal = mode is not None
        table.add(
            SECTION,
            label,
            name,
            value,
            f"{added:+.2f}%",
            "<= +1%" if goal else "",
            added <= 1.0 if goal else None,
            spread=paired.spread(name, added_pct, "{:+.1f}%"),
            noise=(min(noise[0]), max(noise[0])),
        )
    own_us = (median(alone["wrapped"]) - median(alone["stand-in"])) * 1e6
    table.add(
        SECTION,
        f"wrapper alone, {n} calls x5",
        "tpushim layer, auto, no TPU",
        f"{own_us:.1f} us/call",
        f"{own_us / 1e3 / stock * 100:+.3f}%",
        "<= 1%",
        own_us / 1e3 / stock <= 0.01,
    )
    report["wrapper"] = {"calls_s": times, "alone_s": alone}
