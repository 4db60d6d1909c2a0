"""Which engine runs a conversion's TPU path, and why: TPUEstimator, or the ``tf.distribute``
strategy engine (:mod:`tpushim._strategy`). Pure and TensorFlow-free: it reads the settings, the
environment and TensorFlow's version string.

TPUEstimator drives a TPU through TF1 sessions on the StreamExecutor TPU runtime. TPU v5e, v5p
and v6e run TensorFlow only on the PJRT runtime (Cloud TPU software versions named
``tpu-vm-tf-X.Y.Z[-pod]-pjrt``, from TensorFlow 2.15), where tf.estimator fails
(tensorflow/tensorflow#90807); TensorFlow >= 2.16 has no TPUEstimator at all.

A PJRT runtime is told from the environment alone (no TPU call, no network, no hang): TensorFlow
loads the TPU's PJRT plugin through ``TF_PLUGGABLE_DEVICE_LIBRARY_PATH`` (the path of
``libtpu.so``) with ``NEXT_PLUGGABLE_DEVICE_USE_C_API=true``; ``PJRT_DEVICE=TPU`` names the
runtime for every framework on the VM. Those are the variables Google's own TensorFlow-on-PJRT
runs set (docs/reference/engines.md cites them).
"""

import os

TPUESTIMATOR = "tpuestimator"
STRATEGY = "strategy"

#: The variables :func:`pjrt_runtime` reads (tests unset them: a test machine runs no TPU).
PJRT_VARS = ("PJRT_DEVICE", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH")

#: The first TensorFlow (major, minor) without TPUEstimator.
NO_ESTIMATOR_FROM = (2, 16)


def pjrt_runtime(environ=None):
    """What says this is a PJRT TPU runtime, as one phrase, or None."""
    environ = os.environ if environ is None else environ
    if environ.get("PJRT_DEVICE", "").strip().upper() == "TPU":
        return "PJRT_DEVICE=TPU"
    library = environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "").strip()
    if library and "libtpu" in os.path.basename(library):
        return f"TF_PLUGGABLE_DEVICE_LIBRARY_PATH={library}"
    return None


def _major_minor(text):
    parts = str(text or "").split(".")[:2]
    try:
        return tuple(int(p) for p in parts) if len(parts) == 2 else None
    except ValueError:
        return None


def choose(settings, environ=None, tf_version=None):
    """``(engine, why)`` for a conversion under ``settings``.

    Args:
      settings: the resolved :class:`tpushim._settings.Settings`.
      environ: the environment (default ``os.environ``).
      tf_version: TensorFlow's version string (default: the imported TensorFlow's, else the
        installed one's).
    """
    if settings.engine != "auto":
        return settings.engine, f"engine {settings.engine} from {settings.sources.get('engine')}"
    if tf_version is None:  # the imported TensorFlow's, else the installed one's (not imported)
        from tpushim import _versions

        tf_version = _versions._tf_version_cheaply()
    version = _major_minor(tf_version)
    if version is not None and version >= NO_ESTIMATOR_FROM:
        return STRATEGY, f"TensorFlow {tf_version} has no TPUEstimator"
    pjrt = pjrt_runtime(environ)
    if pjrt is not None:
        return STRATEGY, f"a PJRT TPU runtime ({pjrt}), where TPUEstimator cannot run"
    return TPUESTIMATOR, "TPUEstimator runs here (engine auto)"
