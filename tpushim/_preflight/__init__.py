"""TPU preflight: what would break or crawl on a TPU, found on CPU before TPU time is spent.

``tpushim.check(keras_model, input_fn)`` returns a :class:`Report`; ``python -m tpushim check
script.py`` runs a script in cpu mode for a few steps under :func:`recording`, which records every
conversion and input_fn it makes, and reports on each. Every finding says where it came from
(layer, input feature, setting) and the fix. Severity ``error`` means it would fail on a TPU (exit
code 1), ``warning`` that it would run slowly.

Modules: ``report`` (findings and how they are shown), ``model_checks`` and ``input_checks`` (what
``check`` runs), ``checks`` (``check`` itself), ``faketpu`` and ``graph_checks`` (TPUEstimator's
TPU graphs built for a faked TPU system), ``recorder`` (the script's conversions and calls). The
core knows none of them: the recorder is an observer (:mod:`tpushim._observe`, the core's one
extension point).
"""

from tpushim._preflight.report import Finding, Report, last_frame, summary
from tpushim._settings import DEFAULT_CORES

#: Imported when first asked for (PEP 562): they import the TPUEstimator path (tensorflow_estimator,
#: absent on TensorFlow >= 2.16), which the report and progress modules do not need.
_LAZY = {"check": "checks", "Recorder": "recorder", "recording": "recorder"}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


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
