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

from __future__ import annotations  # annotations stay strings: typing is not imported at start-up

from tpushim._errors import ConfigurationError, ConversionError, NoTPUError, TPUShimError
from tpushim._patch import is_patched, patch, patched, unpatch
from tpushim._settings import DEFAULT_CORES as _DEFAULT_CORES
from tpushim._status import status
from tpushim.version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Callable

    from tpushim._preflight.report import Report
    from tpushim._types import Mode, PodInput, Status


def __getattr__(name: str) -> object:
    # tpushim.Status (a TypedDict), Mode and PodInput import typing: on first use, not at start-up.
    if name in ("Mode", "PodInput", "Status"):
        from tpushim import _types

        return getattr(_types, name)
    raise AttributeError(f"module 'tpushim' has no attribute {name!r}")


__all__ = [
    "ConfigurationError",
    "ConversionError",
    "Mode",
    "NoTPUError",
    "PodInput",
    "Status",
    "TPUShimError",
    "__version__",
    "check",
    "is_patched",
    "patch",
    "patched",
    "status",
    "unpatch",
]


def load_ipython_extension(ipython):
    """``%load_ext tpushim``: patches (honouring ``TPUSHIM_*``) and adds the ``%tpushim`` magic."""
    from tpushim._ipython import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    """``%unload_ext tpushim``: unpatches."""
    from tpushim._ipython import unload_ipython_extension as unload

    unload(ipython)


def check(
    keras_model: object,
    input_fn: Callable[..., object] | None = None,
    *,
    batch_size: int | None = None,
    num_cores: int = _DEFAULT_CORES,
    steps: int | None = None,
    iterations_per_loop: int | None = None,
    custom_objects: dict[str, object] | None = None,
) -> Report:
    """TPU preflight on CPU: what would break or crawl on a TPU, before you pay for one.

    Imports TensorFlow (it needs the model); ``import tpushim`` alone does not.

    Args:
      keras_model: the compiled Keras model the script passes to ``model_to_estimator``.
      input_fn: the script's training input_fn (optional): its shapes, dtypes and batch size
        are checked too.
      batch_size: the global batch size, when you set one (else it is read from the input).
      num_cores: TPU cores the batch is split over (8: a v2-8, v3-8, v5litepod-8 or v6e-8;
        4 on a v4-8 or v5p-8, whose chips are megacores).
      steps: training steps the script runs, checked against ``iterations_per_loop``.
      iterations_per_loop: steps per TPU loop (tpushim's default when None).
      custom_objects: as ``model_to_estimator`` takes them, for cloning the model.

    Returns:
      a report: ``report.ok``, ``report.findings``, ``print(report)``, ``report.to_json()``,
      ``report.exit_code``; it renders as a table in a notebook.
    """
    from tpushim._preflight import check as run_check  # on TF >= 2.16: the strategy checks

    return run_check(
        keras_model,
        input_fn,
        batch_size=batch_size,
        num_cores=num_cores,
        steps=steps,
        iterations_per_loop=iterations_per_loop,
        custom_objects=custom_objects,
    )
