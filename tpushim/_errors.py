"""tpushim's exception types: each message says what was wrong and how to fix it."""


class TPUShimError(Exception):
    """Base class of every error tpushim raises on purpose."""


class ConfigurationError(TPUShimError, ValueError):
    """A tpushim setting (argument or ``TPUSHIM_*`` variable) has a value it cannot use."""


class NoTPUError(TPUShimError, RuntimeError):
    """``mode="tpu"`` was asked for but no TPU is configured, or the named TPU cannot be reached."""


class ConversionError(TPUShimError, ValueError):
    """The Keras model (or its optimizer, loss or metrics) cannot be converted for a TPU."""
