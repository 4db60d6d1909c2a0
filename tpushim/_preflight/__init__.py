"""TPU preflight: what would break or crawl on a TPU, found on CPU before TPU time is spent.

``tpushim.check(keras_model, input_fn)`` returns a :class:`Report`; ``python -m tpushim check
script.py`` runs a script in cpu mode for a few steps under :func:`recording`, which records every
conversion and input_fn it makes, and reports on each. Every finding says where it came from
(layer, input feature, setting) and the fix. Severity ``error`` means it would fail on a TPU (exit
code 1), ``warning`` that it would run slowly.

Modules: ``report`` (findings and how they are shown), ``model_checks`` and ``input_checks`` (what
``check`` runs), ``checks`` (``check`` itself), ``faketpu`` and ``graph_checks`` (TPUEstimator's
TPU graphs built for a faked TPU system), ``recorder`` (the script's conversions and calls),
``strategy_checks`` (the strategy engine's checks, and the same script run on tpushim's estimator
API, TensorFlow >= 2.16: the checks that need no TPUEstimator). The core knows none of them: the recorder is an observer (:mod:`tpushim._observe`, the core's one
extension point).
"""

from tpushim._settings import DEFAULT_CORES

__all__ = [
    "DEFAULT_CORES",
    "Finding",
    "Recorder",
    "Report",
    "check",
    "last_frame",
    "recording",
    "summary",
]

#: Where each name lives. Imported on first use: the TPU path's checks and recorder import
#: tensorflow_estimator, which TensorFlow >= 2.16 lacks, where ``strategy_checks`` runs instead.
_HOMES = {
    "check": "checks",
    "Recorder": "recorder",
    "recording": "recorder",
    "Finding": "report",
    "Report": "report",
    "last_frame": "report",
    "summary": "report",
}


def __getattr__(name):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
