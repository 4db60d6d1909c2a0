"""tpushim's settings: one value object, strict parsing, one precedence rule.

Precedence, highest first:

1. ``TPUSHIM_MODE=off`` in the environment -- the kill switch, flipped without editing code;
2. explicit arguments (``patch(...)``, ``patched(...)``; the innermost scope wins);
3. ``TPUSHIM_*`` environment variables;
4. defaults.

Parsing is strict: a value tpushim cannot use raises :class:`ConfigurationError` naming the variable
(or argument), the value and the valid choices -- before anything is patched.
"""

import os

from tpushim import _tpus
from tpushim._errors import ConfigurationError

MODES = ("auto", "cpu", "tpu", "off")

#: How a pod (several TPU hosts) reads its input: see :mod:`tpushim._pods`.
POD_INPUTS = ("auto", "exact", "files")

#: The engine a TPU conversion runs on: see :mod:`tpushim._engines`.
ENGINES = ("auto", "tpuestimator", "jax", "strategy")

#: setting name -> environment variable; also the order settings are listed in.
ENV_VARS = {
    "mode": "TPUSHIM_MODE",
    "tpu": "TPUSHIM_TPU",
    "batch_size": "TPUSHIM_BATCH_SIZE",
    "iterations_per_loop": "TPUSHIM_ITERATIONS_PER_LOOP",
    "quiet": "TPUSHIM_QUIET",
    "pod_input": "TPUSHIM_POD_INPUT",
    "engine": "TPUSHIM_ENGINE",
}

DEFAULTS = {
    "mode": "auto",
    "tpu": None,
    "batch_size": None,
    "iterations_per_loop": None,
    "quiet": False,
    "pod_input": "auto",
    "engine": "auto",
}

KILL_SWITCH = "TPUSHIM_MODE=off"

#: tpushim's log level, for the whole process (not a per-conversion setting): DEBUG shows how each
#: input was adapted. Read by :mod:`tpushim._log` at ``patch()`` and by the command line's ``-v``.
LOG_LEVEL_VAR = "TPUSHIM_LOG_LEVEL"
LOG_LEVELS = ("debug", "info", "warning", "error")

#: Spellings of a yes/no variable (any case), as ``TPUSHIM_AUTOPATCH`` reads them.
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")

#: Steps per TPU loop when none is given. TPUEstimator's default of 2 leaves a TPU mostly idle
#: waiting for the host; 100 amortises the host round trip. Bounded by save_checkpoints_steps: a
#: TPU loop can only checkpoint at its end.
DEFAULT_ITERATIONS_PER_LOOP = 100

#: TPU cores a batch size is checked against when no TPU says: a v2-8 or v3-8 (the TPU
#: generations table, :mod:`tpushim._tpus`).
DEFAULT_CORES = _tpus.DEFAULT_CORES


class Settings:
    """The settings one ``model_to_estimator`` call is converted with (immutable).

    A plain class rather than a dataclass: ``patch()`` imports it, and ``dataclasses`` would add
    about 9 ms to an ``import tpushim`` of about 11 ms.

    Attributes:
      mode: ``auto``, ``cpu``, ``tpu`` or ``off``.
      tpu: a TPU name, ``grpc://host:port``, ``local``, a ``TPUClusterResolver``, or None.
      batch_size: global batch size for train, eval and predict, or None (taken from the input).
      iterations_per_loop: steps per TPU loop, or None (tpushim's default).
      quiet: True hides the line a conversion prints on stderr when logging is not configured.
      pod_input: how a pod's hosts read the input: ``auto``, ``exact`` or ``files``.
      engine: what runs a conversion: ``auto``, ``tpuestimator`` or ``strategy``.
      sources: setting name -> where its value came from (``argument``, a variable name,
        ``default`` or the kill switch). Not part of equality.
    """

    __slots__ = (
        "batch_size",
        "engine",
        "iterations_per_loop",
        "mode",
        "pod_input",
        "quiet",
        "sources",
        "tpu",
    )

    def __init__(
        self,
        mode="auto",
        tpu=None,
        batch_size=None,
        iterations_per_loop=None,
        quiet=False,
        pod_input="auto",
        sources=None,
        engine="auto",
    ):
        for name, value in (
            ("mode", mode),
            ("tpu", tpu),
            ("batch_size", batch_size),
            ("iterations_per_loop", iterations_per_loop),
            ("quiet", quiet),
            ("pod_input", pod_input),
            ("engine", engine),
            ("sources", dict(sources or {})),
        ):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError("Settings are immutable")

    def _key(self):
        return (
            self.mode,
            self.tpu,
            self.batch_size,
            self.iterations_per_loop,
            self.quiet,
            self.pod_input,
            self.engine,
        )

    def __eq__(self, other):
        return isinstance(other, Settings) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return (
            "Settings(mode={!r}, tpu={!r}, batch_size={!r}, iterations_per_loop={!r}, "
            "quiet={!r}, pod_input={!r}, engine={!r})".format(*self._key())
        )


def _choices_error(where, value, choices):
    return ConfigurationError(
        f"{where}={value!r} is not a valid tpushim mode; choose one of {', '.join(choices)} "
        f"(auto: TPU when one is configured, else the stock estimator; cpu: the TPU code path "
        f"on CPU/GPU; tpu: require a TPU; off: never convert)."
    )


def parse_mode(value, where="mode"):
    if not isinstance(value, str):
        raise ConfigurationError(
            f"{where} must be a string, one of {', '.join(MODES)}; got {value!r}."
        )
    mode = value.strip().lower()
    if mode not in MODES:
        raise _choices_error(where, value, MODES)
    return mode


def parse_pod_input(value, where="pod_input"):
    if isinstance(value, str) and value.strip().lower() in POD_INPUTS:
        return value.strip().lower()
    raise ConfigurationError(
        f"{where}={value!r} is not a pod input path; choose one of {', '.join(POD_INPUTS)} "
        f"(auto: each host reads its own files where the training input is shuffled, endless "
        f"and read from files, else exact; exact: every host reads the whole input and keeps "
        f"its share, stock's batches exactly; files: each host reads its own files wherever "
        f"the input allows it)."
    )


def parse_engine(value, where="engine"):
    if isinstance(value, str) and value.strip().lower() in ENGINES:
        return value.strip().lower()
    raise ConfigurationError(
        f"{where}={value!r} is not a tpushim engine; choose one of {', '.join(ENGINES)} "
        f"(auto: TPUEstimator where it runs, the tf.distribute strategy engine on a PJRT TPU "
        f"runtime and on TensorFlow >= 2.16, the JAX engine where JAX sees a TPU TensorFlow cannot "
        f"use; tpuestimator; strategy: the Keras model under tf.distribute.TPUStrategy, "
        f"MirroredStrategy on CPU; jax: the Keras model's step in JAX on every local device)."
    )


#: The largest batch size or loop length tpushim takes: TensorFlow holds both in 32-bit integers
#: (a TPU loop's counter, TPUEstimator's per-core batch), so a larger one overflows inside it.
MAX_INT = 2**31 - 1


def parse_positive_int(value, where):
    """A positive integer from an int, a numpy integer (``operator.index``) or its ASCII digits."""
    if isinstance(value, str):
        text = value.strip()
        # ASCII digits only: str.isdigit() takes '²', which int() then refuses.
        if not (text.isascii() and text.isdigit()):
            raise ConfigurationError(
                f"{where}={value!r} is not a positive integer; set it to e.g. 128, or unset it."
            )
        number = int(text)
    elif isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise ConfigurationError(f"{where} must be a positive integer (e.g. 128); got {value!r}.")
    else:
        import operator  # not at start-up: patch() with no arguments never gets here

        number = operator.index(value)  # int, numpy.int64 & co.; not float
    if number <= 0:
        raise ConfigurationError(f"{where} must be a positive integer (e.g. 128); got {number}.")
    if number > MAX_INT:
        raise ConfigurationError(
            f"{where}={value!r} is too large: TensorFlow holds it in a 32-bit integer, so it must "
            f"be at most {MAX_INT}."
        )
    return number


def parse_tpu(value, where="tpu"):
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ConfigurationError(
                f"{where} is empty; give a TPU name, 'grpc://host:port' or 'local', or unset it."
            )
        if "://" in text and not text.startswith("grpc://"):
            raise ConfigurationError(
                f"{where}={value!r}: a TPU address must start with grpc:// (e.g. grpc://10.0.0.2:8470); "
                f"or give a TPU name or 'local'."
            )
        if text.startswith("grpc://"):
            _check_address(text, value, where)
        return text
    # A TPUClusterResolver (or anything shaped like one) is taken as it is.
    if hasattr(value, "master") and hasattr(value, "cluster_spec"):
        return value
    raise ConfigurationError(
        f"{where} must be a TPU name, 'grpc://host:port', 'local' or a TPUClusterResolver; got {value!r}."
    )


def _check_address(text, value, where):
    """``grpc://host:port``: a host and a port number, or a clear error now, not at ``train()``."""
    host, colon, port = text[len("grpc://") :].rpartition(":")
    if (
        not colon
        or not host.strip("[]")
        or not (port.isascii() and port.isdigit())
        or not 0 < int(port) < 65536
    ):
        raise ConfigurationError(
            f"{where}={value!r} is not a TPU address: give grpc://HOST:PORT with a port number "
            f"from 1 to 65535 (a Cloud TPU node's is 8470, e.g. grpc://10.0.0.2:8470), a TPU "
            f"name, or 'local'."
        )


def parse_bool(value, where):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    raise ConfigurationError(
        f"{where}={value!r} is not a yes/no value; use 1, true, yes or on (0, false, no, off or "
        f"unset: no)."
    )


def parse_log_level(value, where=LOG_LEVEL_VAR):
    """``"debug"`` & co. (any case) -> the ``logging`` level name, e.g. ``"DEBUG"``."""
    if isinstance(value, str) and value.strip().lower() in LOG_LEVELS:
        return value.strip().upper()
    raise ConfigurationError(
        f"{where}={value!r} is not a log level; choose one of {', '.join(LOG_LEVELS)}."
    )


def log_level_from_environment(environ=None):
    """``TPUSHIM_LOG_LEVEL`` as a ``logging`` level name, or None when unset (strict)."""
    raw = (os.environ if environ is None else environ).get(LOG_LEVEL_VAR, "")
    return parse_log_level(raw) if raw.strip() else None


_PARSERS = {
    "mode": parse_mode,
    "tpu": parse_tpu,
    "batch_size": parse_positive_int,
    "iterations_per_loop": parse_positive_int,
    "quiet": parse_bool,
    "pod_input": parse_pod_input,
    "engine": parse_engine,
}


def kill_switch(environ=None):
    """True when ``TPUSHIM_MODE=off`` (any case) is in the environment: then no other setting is
    parsed, and nothing tpushim reads can raise -- the switch works whatever else is set."""
    environ = os.environ if environ is None else environ
    return environ.get(ENV_VARS["mode"], "").strip().lower() == "off"


def parse_arguments(**kwargs):
    """Validates explicit arguments; returns a dict of the ones given (not None).

    Under the kill switch an invalid argument is left out instead of raising: the switch is
    flipped to run a script as it runs without tpushim, without editing its code.
    """
    off = kill_switch()
    out = {}
    for name, value in kwargs.items():
        if name not in _PARSERS:
            raise TypeError(f"unknown tpushim setting {name!r}; known: {', '.join(ENV_VARS)}")
        if value is not None:
            try:
                out[name] = _PARSERS[name](value, name)
            except ConfigurationError:
                if not off:
                    raise
    return out


def parse_environment(environ=None):
    """Reads and validates the ``TPUSHIM_*`` variables; returns a dict of those set (non-empty).

    Under the kill switch (``TPUSHIM_MODE=off``) only ``{"mode": "off"}``: nothing else is read.
    """
    environ = os.environ if environ is None else environ
    if kill_switch(environ):
        return {"mode": "off"}
    out = {}
    for name, var in ENV_VARS.items():
        raw = environ.get(var)
        if raw is not None and raw.strip():
            out[name] = _PARSERS[name](raw, var)
    return out


def check_environment(environ=None):
    """Raises :class:`ConfigurationError` for an invalid ``TPUSHIM_*`` variable (the settings and
    ``TPUSHIM_LOG_LEVEL``); returns ``TPUSHIM_LOG_LEVEL`` as a level name, or None. Under the kill
    switch nothing raises, and an invalid log level is ignored."""
    environ = os.environ if environ is None else environ
    parse_environment(environ)
    try:
        return log_level_from_environment(environ)
    except ConfigurationError:
        if not kill_switch(environ):
            raise
        return None


def resolve(layers=(), environ=None):
    """Combines explicit argument layers (outermost first) with the environment and defaults."""
    env = parse_environment(environ)
    values, sources = {}, {}
    for name in ENV_VARS:
        explicit = [layer[name] for layer in layers if layer.get(name) is not None]
        if explicit:
            values[name], sources[name] = explicit[-1], "argument"
        elif name in env:
            values[name], sources[name] = env[name], ENV_VARS[name]
        else:
            values[name], sources[name] = DEFAULTS[name], "default"
    if env.get("mode") == "off":
        values["mode"], sources["mode"] = "off", KILL_SWITCH
    return Settings(sources=sources, **values)


def _option(name, metavar, what, default):
    return (
        "--" + name.replace("_", "-"),
        {
            "dest": name,
            "metavar": metavar,
            "help": f"{what} Default: ${ENV_VARS[name]}, else {default}.",
        },
    )


def _flag(name, what):
    # store_true with default None: "not given" leaves the variable, then the default, to decide.
    return (
        "--" + name.replace("_", "-"),
        {
            "dest": name,
            "action": "store_true",
            "default": None,
            "help": f"{what} Default: ${ENV_VARS[name]}, else no.",
        },
    )


#: The settings as command-line options, ``(flag, argparse keywords)``: ``python -m tpushim`` and
#: ``%tpushim`` both add exactly these, so their options and help cannot drift apart. No
#: ``choices`` or ``type``: the values are checked by the parsers above, one rule for every way in.
#: A flag (``action``) takes no value; the others take one.
OPTIONS = (
    _option(
        "mode",
        "MODE",
        "auto, cpu (the TPU code path on CPU/GPU), tpu (require a TPU) or off.",
        DEFAULTS["mode"],
    ),
    _option(
        "tpu",
        "TPU",
        "a TPU name, grpc://host:port, or 'local' on a TPU VM or Colab TPU runtime.",
        "found from the RunConfig, TPU_NAME & co., COLAB_TPU_ADDR or the TPU VM's device files",
    ),
    _option(
        "batch_size",
        "N",
        "global batch size for train, eval and predict.",
        "taken from the input_fn",
    ),
    _option(
        "iterations_per_loop", "N", "training steps per TPU loop.", DEFAULT_ITERATIONS_PER_LOOP
    ),
    _flag("quiet", "do not print the line each conversion prints on stderr."),
    _option(
        "pod_input",
        "PATH",
        "how a pod's hosts read the input: auto, exact (every host reads the whole input and "
        "keeps its share) or files (each host reads its own files).",
        DEFAULTS["pod_input"],
    ),
    _option(
        "engine",
        "ENGINE",
        "what runs the TPU path: auto (TPUEstimator where it runs; the strategy engine on a PJRT "
        "TPU runtime or TensorFlow >= 2.16; the JAX engine where JAX sees a TPU TensorFlow cannot use), "
        "tpuestimator, strategy (the Keras model under tf.distribute.TPUStrategy) or jax (its "
        "step in JAX on every local device).",
        DEFAULTS["engine"],
    ),
)

#: The runner's run summary, for the whole process (not a per-conversion setting, as the log level):
#: yes adds a table with one row per train/evaluate/predict call (``--summary`` on the runner).
#: Read strictly, as every ``TPUSHIM_*`` variable is.
SUMMARY_VAR = "TPUSHIM_SUMMARY"


def summary_table_from_environment(environ=None):
    """``TPUSHIM_SUMMARY`` as True or False; None when unset (strict: a typo raises)."""
    raw = (os.environ if environ is None else environ).get(SUMMARY_VAR, "")
    return parse_bool(raw, SUMMARY_VAR) if raw.strip() else None
