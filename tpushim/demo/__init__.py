"""The bundled demo: ``python -m tpushim demo``.

:mod:`tpushim.demo.legacy_mlp` is a legacy Keras -> Estimator script as its owner wrote it, with no
tpushim in it. :func:`run` runs it twice in one process -- once with the stock estimator, once
converted by tpushim (cpu mode when no TPU is configured, auto when one is) -- and prints the
conversion lines and both ``evaluate()`` results side by side. ``python -m tpushim -m
tpushim.demo.legacy_mlp`` runs the script once, patched, as any legacy script would be run.
"""

import contextlib
import logging
import os
import sys
import time
import warnings

from tpushim import _observe, _scratch, _versions
from tpushim._patch import patched
from tpushim._status import status

#: cpu mode runs the very computation the stock estimator runs: anything above this is a bug.
CPU_TOLERANCE = 1e-5


class _Lines(logging.Handler):
    """Collects tpushim's ``model_to_estimator -> ...`` lines."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("model_to_estimator ->"):
            self.lines.append(message)


@contextlib.contextmanager
def _conversion_lines():
    from tpushim import _log

    logger = logging.getLogger("tpushim")
    handler, level, propagate = _Lines(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    if not _log.configured():  # the table shows them: not again on stderr (absl's root handler)
        logger.propagate = False
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _quiet_tensorflow():
    """TensorFlow's start-up and deprecation chatter would bury the demo's dozen lines."""
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass


class _Engines(_observe.Observer):
    """An observer (:mod:`tpushim._observe`): which engine each conversion returned (every other
    event ignored)."""

    def __init__(self):
        self.engines = []

    def converted(self, conversion):
        self.engines.append(_engine(conversion.estimator))


def _engine(estimator):
    """``"tpuestimator"`` or ``"strategy"`` (the TPU path's engines), or ``"own"`` (tpushim's
    Estimator on TensorFlow >= 2.16, stock 2.15's path): what a conversion returned."""
    from tpushim import _engines
    from tpushim._strategy import estimator as _strategy_estimator

    if isinstance(estimator, _strategy_estimator.StrategyEstimator):
        return _engines.STRATEGY
    return "own" if _versions.uses_own_estimator() else _engines.TPUESTIMATOR


def _train_once(scope):
    from tpushim.demo import legacy_mlp

    start = time.perf_counter()
    engines = _Engines()
    with (
        _scratch.scratch_folder("tpushim_demo_", "tpushim_demo_model") as model_dir,
        _conversion_lines() as lines,
        _observe.observing(engines),
        scope,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # Keras 2's graph-mode deprecation warnings
        results, predictions = legacy_mlp.train_and_evaluate(model_dir)
    return {
        "line": lines[-1] if lines else "(no conversion line: model_to_estimator was not patched)",
        # What model_to_estimator returned: "stock", "own", "tpuestimator" or "strategy".
        "engine": engines.engines[-1] if engines.engines else "stock",
        "results": {k: float(v) for k, v in results.items()},
        "predictions": predictions,
        "seconds": time.perf_counter() - start,
    }


def _number(value):
    return f"{value:.0f}" if float(value).is_integer() and abs(value) >= 1 else f"{value:.6f}"


def report(stock, shim):
    """The side-by-side table as lines, and the largest difference in it."""
    import numpy as np

    out = [
        "1. stock    " + stock["line"],
        "2. tpushim  " + shim["line"],
        "",
        f"{'evaluate()':<14}{'stock':>12}{'tpushim':>12}{'|difference|':>15}",
    ]
    worst = 0.0
    for key in sorted(set(stock["results"]) | set(shim["results"])):
        a, b = stock["results"].get(key), shim["results"].get(key)
        if a is None or b is None:
            out.append(
                f"  {key:<12}{_number(a) if a is not None else '-':>12}"
                f"{_number(b) if b is not None else '-':>12}{'(only one has it)':>15}"
            )
            continue
        diff = abs(a - b)
        worst = max(worst, diff)
        out.append(f"  {key:<12}{_number(a):>12}{_number(b):>12}{diff:>15.2g}")
    pred_diff = float(np.max(np.abs(stock["predictions"] - shim["predictions"])))
    worst = max(worst, pred_diff)
    out.append(
        f"{'predict()':<14}{len(stock['predictions']):>12}{len(shim['predictions']):>12}"
        f"{pred_diff:>15.2g}   (examples; largest |difference| of a probability)"
    )
    out.append(f"{'seconds':<14}{stock['seconds']:>12.1f}{shim['seconds']:>12.1f}")
    return out, worst


def _verdict(stock, shim, mode, worst, batch_size):
    """(the closing line, whether the results are as they must be), from what each run's
    ``model_to_estimator`` returned."""
    from tpushim import _engines

    if shim["engine"] == "own":
        return (
            "TensorFlow >= 2.16 has no stock estimator: both runs took tpushim's estimator "
            "API, stock 2.15's path; its numbers equal stock TensorFlow 2.15's (tested).",
            True,
        )
    if shim["engine"] == "stock":
        return (
            "tpushim returned the stock estimator (its line says why): both runs are stock.",
            True,
        )
    if batch_size is not None:
        return (
            "A batch size was given: the tpushim run trains on other batches, so results differ.",
            True,
        )
    if mode == "cpu":
        equal = worst <= CPU_TOLERANCE
        path = (
            "cpu mode runs the TPU code path on CPU"
            if shim["engine"] == _engines.TPUESTIMATOR
            else "cpu mode runs the strategy engine (the TPU path on TensorFlow >= 2.16) on CPU"
        )
        against = (
            " Run 1 is tpushim's estimator API, stock 2.15's path: TensorFlow >= 2.16 has no "
            "stock estimator."
            if stock["engine"] == "own"
            else ""
        )
        return (
            f"{path}: results {'equal' if equal else 'DIFFERENT'} within {CPU_TOLERANCE:g} "
            f"(largest difference {worst:.2g}).{against}"
        ), equal
    return (
        "On a TPU, float32 matrix multiplies run in bfloat16 passes by default, so small "
        "differences are expected."
    ), True


def run(mode=None, tpu=None, batch_size=None, iterations_per_loop=None):
    """``python -m tpushim demo``: the legacy script, stock and converted; prints both results.

    Args:
      mode: tpushim's mode for the converted run; default ``auto`` when a TPU is configured or
        on TensorFlow >= 2.16 (tpushim's estimator API both times), else ``cpu``.
      tpu, batch_size, iterations_per_loop: as :func:`tpushim.patch`.

    Returns:
      0, or 1 when cpu mode's results differ from stock's by more than :data:`CPU_TOLERANCE`
      (a ``batch_size`` changes training, so then they are not compared).
    """
    settings = {
        k: v
        for k, v in dict(
            tpu=tpu, batch_size=batch_size, iterations_per_loop=iterations_per_loop
        ).items()
        if v is not None
    }
    # Before TensorFlow: on TensorFlow >= 2.16 the scope makes tf.keras Keras 2 and says so.
    with patched(**settings):
        if mode is None:
            # TensorFlow >= 2.16: both runs take tpushim's estimator API (no stock one there);
            # its TPU path there, the strategy engine, is proven in tests/proofs/test_strategy_replicas.py.
            mode = "auto" if status()["tpu"] or _versions.uses_own_estimator() else "cpu"
    _quiet_tensorflow()
    from tpushim.demo import legacy_mlp

    print(
        f"tpushim demo: {legacy_mlp.__file__}\n"
        f"  a legacy Keras -> Estimator script (no tpushim in it): 2-layer MLP, legacy SGD with "
        f"momentum, synthetic data, {legacy_mlp.TRAIN_STEPS} steps -- run twice in this process.\n",
        flush=True,
    )
    stock = _train_once(patched(mode="off"))
    shim = _train_once(patched(mode=mode, **settings))
    lines, worst = report(stock, shim)
    verdict, as_expected = _verdict(stock, shim, mode, worst, batch_size)
    print(
        "\n".join(
            lines
            + [
                "",
                verdict,
                "Same script, no code change. Yours: python -m tpushim "
                "your_script.py  (or TPUSHIM_AUTOPATCH=1 python your_script.py)",
            ]
        )
    )
    return 0 if as_expected else 1
