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

__all__ = ["patch", "unpatch", "is_patched", "status", "patched", "__version__"]
