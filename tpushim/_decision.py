"""What one ``model_to_estimator`` call returns, and why: the mode decision's one home.

Pure: it takes the resolved settings and the TPU the environment names (or None) and returns a
:class:`Decision`. The conversion (:mod:`tpushim._convert`) acts on it; :func:`tpushim.status` carries
it, so the console says what the wrapper would do from the same decision rather than restating it.
"""

# Imported where _detect (a dataclass too) is: no start-up cost of its own.
import dataclasses

from tpushim import _engines

#: ``Decision.action`` values.
STOCK = "stock"  # the stock estimator, as without tpushim
TPU = "tpu"  # TPUEstimator on the TPU found
CPU = "cpu"  # TPUEstimator(use_tpu=False): the TPU code path on CPU/GPU
NO_TPU = "no-tpu"  # tpushim.NoTPUError: mode tpu and no TPU configured


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome of :func:`decide`.

    Attributes:
      action: one of ``STOCK``, ``TPU``, ``CPU``, ``NO_TPU``.
      why: the reason, in the words of the log line a conversion writes.
      returns: what ``model_to_estimator`` returns and why, as one line for people (the console).
      tpu: the TPU to run on (a :class:`tpushim._detect.TPUSpec`) when ``action == TPU``, else None.
      engine: for ``TPU`` and ``CPU``, what runs it (:mod:`tpushim._engines`): ``tpuestimator``
        or ``strategy``; else None. Decided here, once per conversion: the conversion builds on
        this engine (:mod:`tpushim._convert`) and asks no one again.
      engine_why: why that engine (:func:`tpushim._engines.choose`), or None.
    """

    action: str
    why: str
    returns: str
    tpu: object = None
    engine: str = None
    engine_why: str = None

    def __repr__(self):
        return f"Decision({self.action!r}, why={self.why!r})"

    def as_dict(self):
        """``{"action", "why", "returns"}``: JSON-friendly, for :func:`tpushim.status`."""
        return {"action": self.action, "why": self.why, "returns": self.returns}


def no_tpu_message(mode_source):
    """The text of the ``NoTPUError`` a mode-``tpu`` call without a TPU raises: what to do."""
    return (
        f"tpushim mode 'tpu' (from {mode_source}) needs a TPU, and none is configured. Name one with "
        "tpushim.patch(tpu=...) or TPUSHIM_TPU (a TPU name, 'grpc://IP:8470' or 'local' on a "
        "TPU VM), set TPU_NAME, pass a tpu_config.RunConfig with a cluster, or use "
        "TPUSHIM_MODE=cpu to run the TPU code path on CPU."
    )


def decide(settings, tpu):
    """What a ``model_to_estimator`` call made under ``settings`` returns.

    Precedence: mode ``off`` (the kill switch included) -> stock; mode ``cpu`` -> the TPU code path
    on CPU, whether or not a TPU is found; a TPU found -> TPUEstimator on it; mode ``tpu`` without
    one -> ``NoTPUError``; otherwise (``auto``, no TPU) -> stock.

    Args:
      settings: the resolved :class:`tpushim._settings.Settings`.
      tpu: what :func:`tpushim._detect.find_tpu` found (anything with ``describe()`` and
        ``source``), or None.

    Returns:
      a :class:`Decision`.
    """
    mode, mode_source = settings.mode, settings.sources.get("mode")
    if mode == "off":
        return Decision(
            STOCK,
            f"tpushim mode off, from {mode_source}",
            f"the stock estimator (mode off, from {mode_source})",
        )
    if mode == "cpu":
        engine, engine_why = _engines.choose(settings)
        if engine == _engines.JAX:
            return Decision(
                CPU,
                f"mode cpu from {mode_source}: the TPU code path on CPU; {engine_why}",
                "the JAX engine (the Keras model's step in JAX over this machine's devices): "
                f"the TPU code path on CPU ({engine_why})",
                engine=engine,
                engine_why=engine_why,
            )
        if engine == _engines.STRATEGY:
            return Decision(
                CPU,
                f"mode cpu from {mode_source}: the TPU code path on CPU; {engine_why}",
                "the strategy engine (tf.distribute.MirroredStrategy over this machine's "
                f"devices): the TPU code path on CPU/GPU ({engine_why})",
                engine=engine,
                engine_why=engine_why,
            )
        return Decision(
            CPU,
            f"mode cpu from {mode_source}: the TPU code path on CPU",
            "TPUEstimator(use_tpu=False): the TPU code path on CPU/GPU",
            engine=engine,
            engine_why=engine_why,
        )
    if tpu is not None:
        where = f"{tpu.describe()} (from {tpu.source})"
        engine, engine_why = _engines.choose(settings)
        if engine == _engines.JAX:
            return Decision(
                TPU,
                f"TPU {where}; {engine_why}",
                f"the JAX engine (the Keras model's step in JAX) on TPU {where} ({engine_why})",
                tpu=tpu,
                engine=engine,
                engine_why=engine_why,
            )
        if engine == _engines.STRATEGY:
            return Decision(
                TPU,
                f"TPU {where}; {engine_why}",
                f"the strategy engine (tf.distribute.TPUStrategy) on TPU {where} ({engine_why})",
                tpu=tpu,
                engine=engine,
                engine_why=engine_why,
            )
        return Decision(
            TPU,
            f"TPU {where}",
            f"TPUEstimator on TPU {where}",
            tpu=tpu,
            engine=engine,
            engine_why=engine_why,
        )
    if mode == "tpu":
        return Decision(
            NO_TPU,
            no_tpu_message(mode_source),
            "an error, tpushim.NoTPUError: mode tpu needs a TPU and none is configured",
        )
    return Decision(
        STOCK,
        "no TPU configured; TPUSHIM_MODE=cpu runs the TPU path on CPU",
        "the stock estimator (no TPU configured; --mode cpu runs the TPU code path on CPU)",
    )
