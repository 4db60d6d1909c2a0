"""The typed shapes of what tpushim returns as plain data: :class:`Status`, :func:`tpushim.status`'s
dict. Imported for type checkers and documentation only (``typing`` is not imported at start-up);
``tpushim.Status`` loads it on first use."""

from typing import Literal, Optional, TypedDict, Union

Mode = Literal["auto", "cpu", "tpu", "off"]
"""``patch(mode=...)``: ``auto`` (a TPUEstimator when a TPU is configured, else stock), ``cpu``
(the TPU code path on CPU/GPU), ``tpu`` (require a TPU) or ``off``. The choices of
``tpushim._settings.MODES`` (a test keeps them equal)."""
PodInput = Literal["auto", "exact", "files"]
"""``patch(pod_input=...)``: how a pod's hosts read the input. The choices of
``tpushim._settings.POD_INPUTS``."""


class Decision(TypedDict):
    """What a ``model_to_estimator`` call made now returns, and why."""

    action: Literal["stock", "tpu", "cpu", "no-tpu"]
    """``stock``: the stock estimator; ``tpu``: a TPUEstimator on the TPU; ``cpu``: a
    TPUEstimator(use_tpu=False), the TPU code path on CPU; ``no-tpu``: mode ``tpu`` without a TPU
    (the call raises ``tpushim.NoTPUError``)."""
    why: str
    """Where the decision came from, in words (e.g. ``no TPU configured; ...``)."""
    returns: str
    """One line for people: what the call returns."""


class Versions(TypedDict):
    """Installed versions (None: not installed), read without importing TensorFlow."""

    tpushim: str
    tensorflow: Optional[str]
    keras: Optional[str]
    tensorflow_estimator: Optional[str]
    tf_keras: Optional[str]
    """tf-keras (Keras 2 for TensorFlow >= 2.16, where tpushim runs legacy scripts on it)."""


class EstimatorAPI(TypedDict):
    """Who provides the estimator API here, and whether a TPU path exists."""

    provider: str
    """``tensorflow_estimator`` (TensorFlow <= 2.15: stock's) or ``tpushim`` (TensorFlow >= 2.16:
    tpushim's estimator API, tf.compat.v1 graphs and sessions)."""
    tpu_path: bool
    """Whether a conversion can run on a TPU here (False on TensorFlow >= 2.16 for now)."""
    says: str
    """The two, as one line for people."""


class Platform(TypedDict):
    """The platform tpushim sees here, from the environment alone (docs/how-to/platforms.md)."""

    key: str
    """``laptop``, ``laptop-py312``, ``colab``, ``kaggle``, ``colab-tpu``, ``kaggle-tpu``,
    ``tpu-vm``, ``tpu-vm-pjrt`` or ``tpu-node``."""
    where: str
    """The platform, as the docs name it."""
    tpu_generation: Optional[str]
    """The TPU generation seen (``v4``, ``v5e``, ...), or None."""
    evidence: list[str]
    """What told it: variable names, a TPU device file."""


class Status(TypedDict):
    """:func:`tpushim.status`: what tpushim would do now. Every key is always present."""

    patched: bool
    """``patch()`` is in effect (or takes effect when TensorFlow is imported)."""
    mode: Mode
    mode_source: str
    """``argument``, a variable name (``TPUSHIM_MODE``), ``default``, or the kill switch
    ``TPUSHIM_MODE=off``."""
    tpu: Optional[str]
    """The TPU a call would use now (``local``, ``grpc://host:port``, a name), or None."""
    tpu_source: Optional[str]
    """Where it was found (``TPUSHIM_TPU``, ``TPU_NAME``, ``TPU VM device files``, ...)."""
    batch_size: Optional[int]
    """The global batch size set, or None (taken from the input)."""
    iterations_per_loop: Optional[int]
    """Steps per TPU loop set, or None (tpushim's default, 100)."""
    quiet: bool
    """The conversion line is hidden (``patch(quiet=True)``, ``TPUSHIM_QUIET``)."""
    applied: dict[str, Union[bool, str]]
    """One key per function tpushim wraps (``<keras_lib>.model_to_estimator`` and
    ``<extenders>.estimator_lib``), each ``True``, ``False`` or ``"pending import"``: whether the
    wrapper is on TensorFlow's function yet."""
    decision: Decision
    unsupported: Optional[str]
    """The version guard's message when this TensorFlow / Keras is not supported, else None."""
    versions: Versions
    estimator_api: EstimatorAPI
    platform: Platform
