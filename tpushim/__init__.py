"""tpushim: legacy Keras -> Estimator scripts train on a Cloud TPU with one added line.

Usage::

    import tpushim; tpushim.patch()
    ...
    estimator = tf.keras.estimator.model_to_estimator(keras_model=model)  # a TPUEstimator on a TPU

With no TPU configured, ``model_to_estimator`` returns the stock estimator, exactly as without
tpushim. ``tpushim.patch(mode="cpu")`` (or ``TPUSHIM_MODE=cpu``) runs the TPU code path on CPU/GPU.
``TPUSHIM_MODE=off`` turns tpushim off without editing code. Other ways in:
``python -m tpushim script.py``, ``TPUSHIM_AUTOPATCH=1 python script.py``, ``%load_ext tpushim``.

Importing this package imports no TensorFlow.
"""

from tpushim._errors import ConfigurationError, ConversionError, NoTPUError, TPUShimError
from tpushim._patch import is_patched, patch, patched, status, unpatch
from tpushim.version import __version__

__all__ = ["patch", "unpatch", "is_patched", "status", "patched", "check", "__version__"]


def load_ipython_extension(ipython):
    """``%load_ext tpushim``: patches (honouring ``TPUSHIM_*``) and adds the ``%tpushim`` magic."""
    from tpushim._ipython import load_ipython_extension as load  # pylint: disable=import-outside-toplevel
    load(ipython)


def unload_ipython_extension(ipython):
    """``%unload_ext tpushim``: unpatches."""
    from tpushim._ipython import unload_ipython_extension as unload  # pylint: disable=import-outside-toplevel
    unload(ipython)


def check(keras_model, input_fn=None, **kwargs):
    """TPU preflight on CPU: what would break or crawl on a TPU. See :func:`tpushim._preflight.check`.

    Returns a report: ``report.ok``, ``report.findings``, ``print(report)``, ``report.to_json()``.
    Imports TensorFlow (it needs the model); ``import tpushim`` alone does not.
    """
    from tpushim._preflight import check as run_check  # pylint: disable=import-outside-toplevel
    return run_check(keras_model, input_fn, **kwargs)
