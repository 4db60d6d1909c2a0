"""``tpushim.status()``: what tpushim would do now, as one dict (the console and %tpushim print it)."""

from __future__ import annotations  # annotations stay strings: typing is not imported at start-up

from tpushim import _patch, _settings, _versions

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from tpushim._types import Status


def status() -> Status:
    """What tpushim would do now, as a dict (typed as :class:`tpushim.Status`).

    Keys: ``patched``, ``mode`` and ``mode_source``, ``tpu`` and ``tpu_source`` (the TPU a call
    would use now and where it came from), ``batch_size``, ``iterations_per_loop``, ``quiet``,
    ``applied`` (whether the wrapper is on ``keras_lib`` yet, or pending TensorFlow's import),
    ``decision`` (what a ``model_to_estimator`` call made now returns: ``action`` -- ``stock``,
    ``tpu``, ``cpu`` or ``no-tpu`` --, ``why``, and ``returns``, one line for people),
    ``unsupported`` (the version guard's message), ``versions`` (tensorflow, keras,
    tensorflow_estimator, tf_keras, tpushim), ``estimator_api`` (``provider``:
    ``tensorflow_estimator`` or ``tpushim``, ``tpu_path``, ``says``) and ``platform`` (where this
    runs, from the environment: ``key``, ``where``, ``tpu_generation``, ``evidence``). Imports no
    TensorFlow.
    """
    from tpushim import _decision, _detect  # not at start-up

    with _patch.STATE.lock:  # one consistent picture while another thread patches
        settings = _patch.current_settings() or _settings.resolve()
        tpu = _detect.find_tpu(settings)
        decision = _decision.decide(settings, tpu)
        return {
            "patched": _patch.is_patched(),
            "mode": settings.mode,
            "mode_source": settings.sources.get("mode"),
            "tpu": tpu.describe() if tpu else None,
            "tpu_source": tpu.source if tpu else None,
            "batch_size": settings.batch_size,
            "iterations_per_loop": settings.iterations_per_loop,
            "quiet": settings.quiet,
            "applied": _patch.applied(),
            "decision": _engine_decision(decision.as_dict(), decision.engine),
            "unsupported": _patch.version_problem(),
            "versions": _versions.installed(),
            "estimator_api": estimator_api(),
            "platform": _detect.platform().as_dict(),
        }


def estimator_api():
    """Who provides the estimator API here and whether a TPU path exists (``estimator_api``)."""
    if not _versions.uses_own_estimator():
        return {
            "provider": "tensorflow_estimator",
            "tpu_path": True,
            "says": "stock tf.estimator (tensorflow_estimator); TPU path: TPUEstimator",
        }
    return {
        "provider": "tpushim",
        "tpu_path": True,
        "says": "tpushim's estimator API (TensorFlow >= 2.16 has no tf.estimator: "
        "tf.compat.v1 graphs and sessions, on CPU/GPU); TPU path: the tf.distribute strategy "
        "engine (TPUStrategy)",
    }


def _engine_decision(decision, engine):
    """On TensorFlow >= 2.16 a call takes tpushim's estimator API, the strategy engine (the
    TPU path), or stops (``engine=tpuestimator``: there is no TPUEstimator there)."""
    if not _versions.uses_own_estimator():
        return decision
    if decision["action"] == "stock":
        returns = "tpushim's estimator (TensorFlow >= 2.16 has none; stock 2.15's path and numbers)"
    elif engine == "strategy":
        return decision
    else:
        returns = (
            "an error, tpushim.ConversionError: engine=tpuestimator, and TensorFlow >= 2.16 has "
            "no TPUEstimator (use engine strategy or auto)"
        )
    return dict(decision, returns=returns)
