"""The engines that run a conversion's TPU path, found through one registry: the protocol every
engine implements (:class:`Engine`), the registry in order of preference (:data:`ENGINES`), and
which engine runs a conversion, and why (:func:`choose`).

As tf-keras finds the data adapter for an input (``ALL_ADAPTER_CLS``, ``can_handle``,
``select_data_adapter``), tpushim asks its engines in turn: the first that can run here takes
the conversion (``engine=auto``), unless the settings name one. The engines:

* ``tpuestimator`` (:mod:`tpushim._engines.tpuestimator`): TPUEstimator, TF1 sessions on the
  StreamExecutor TPU runtime (:mod:`tpushim._estimator`).
* ``jax`` (:mod:`tpushim._engines.jax_engine`): the Keras model's step converted to JAX and run
  on every local device (:mod:`tpushim._jax`), where JAX sees a TPU TensorFlow cannot use.
* ``strategy`` (:mod:`tpushim._engines.strategy`): the ``tf.distribute`` strategy engine, TF2
  ``tf.function`` under a TPUStrategy (:mod:`tpushim._strategy`).

TPUEstimator drives a TPU through TF1 sessions on the StreamExecutor TPU runtime. TPU v5e, v5p
and v6e run TensorFlow only on the PJRT runtime (Cloud TPU software versions named
``tpu-vm-tf-X.Y.Z[-pod]-pjrt``, from TensorFlow 2.15), where tf.estimator fails
(tensorflow/tensorflow#90807); TensorFlow >= 2.16 has no TPUEstimator at all.

A PJRT runtime is told from the environment alone (no TPU call, no network, no hang): TensorFlow
loads the TPU's PJRT plugin through ``TF_PLUGGABLE_DEVICE_LIBRARY_PATH`` (the path of
``libtpu.so``) with ``NEXT_PLUGGABLE_DEVICE_USE_C_API=true``; ``PJRT_DEVICE=TPU`` names the
runtime for every framework on the VM. Those are the variables Google's own TensorFlow-on-PJRT
runs set (docs/reference/engines.md cites them).

Pure and TensorFlow-free at import, as each engine's module is: an engine imports its
TensorFlow code when it is asked to build, check or extend.
"""

from tpushim._engines.base import (  # the protocol, for the engines' callers
    JAX,
    NO_ESTIMATOR_FROM,
    PJRT_VARS,
    STRATEGY,
    TPUESTIMATOR,
    Built,
    Engine,
    Prepared,
    pjrt_runtime,
)
from tpushim._engines.jax_engine import JaxEngine
from tpushim._engines.strategy import StrategyEngine
from tpushim._engines.tpuestimator import TPUEstimatorEngine

__all__ = [
    "ENGINES",
    "JAX",
    "NO_ESTIMATOR_FROM",
    "PJRT_VARS",
    "STRATEGY",
    "TPUESTIMATOR",
    "Built",
    "Engine",
    "Prepared",
    "add_metrics_call",
    "choose",
    "get",
    "names",
    "owner",
    "pjrt_runtime",
    "rewrap_call",
    "select",
]

#: Every engine, in order of preference: ``engine=auto`` takes the first that can run here. The
#: strategy engine runs wherever TensorFlow does, so it comes last; the JAX engine only where JAX
#: sees a TPU that TensorFlow cannot use.
ENGINES = (TPUEstimatorEngine(), JaxEngine(), StrategyEngine())


def get(name):
    """The registered engine called ``name``."""
    for engine in ENGINES:
        if engine.name == name:
            return engine
    raise KeyError(f"no tpushim engine {name!r}; the engines: {', '.join(names())}")


def names():
    """The registered engines' names, in order of preference."""
    return tuple(engine.name for engine in ENGINES)


def owner(estimator):
    """The engine that made ``estimator``, or None."""
    return next((engine for engine in ENGINES if engine.owns(estimator)), None)


def add_metrics_call(args, kwargs):
    """For ``Estimator(*args, **kwargs)`` as ``tf.estimator.add_metrics`` calls it around an
    estimator tpushim converted: that estimator with the metrics added, by the engine that made
    it (:meth:`Engine.add_metrics`). None for any other call."""
    from tpushim import _tfprivate  # (TensorFlow: only once an estimator is being made)

    model_fn = kwargs.get("model_fn", args[0] if args else None)
    parts = _tfprivate.estimator.add_metrics_parts(model_fn)
    engine = owner(parts[0]) if parts is not None else None
    if engine is None:
        return None
    estimator, metric_fn = parts
    return engine.add_metrics(estimator, metric_fn, model_fn)


def rewrap_call(cls, args, kwargs):
    """For ``cls(*args, **kwargs)`` (an estimator class's constructor) whose ``model_fn`` is an
    estimator tpushim converted's own (``converted.model_fn``, ``converted._model_fn``, in a
    ``functools.partial`` or not): what the engine that made it answers (:meth:`Engine.rewrap`).
    None for any other call (each engine said what it must: :meth:`Engine.said_around`): then
    stock's estimator is built."""
    from tpushim import _tfprivate  # (TensorFlow: only once an estimator is being made)

    model_fn = kwargs.get("model_fn", args[0] if args else None)
    found = _tfprivate.estimator.estimator_of_model_fn(model_fn)
    engine = owner(found[0]) if found is not None else None
    if engine is None:
        for each in ENGINES:
            each.said_around(cls, model_fn)
        return None
    return engine.rewrap(cls, args, kwargs, found)


def select(settings, environ=None, tf_version=None):
    """``(engine, why)``: the :class:`Engine` that runs a conversion under ``settings``.

    The settings' engine where they name one; else (``auto``) the first engine of
    :data:`ENGINES` that can run here, and why: the reasons the engines before it cannot, or
    its own ``chosen_why``.

    Args:
      settings: the resolved :class:`tpushim._settings.Settings`.
      environ: the environment (default ``os.environ``).
      tf_version: TensorFlow's version string (default: the imported TensorFlow's, else the
        installed one's).
    """
    if settings.engine != "auto":
        return (
            get(settings.engine),
            f"engine {settings.engine} from {settings.sources.get('engine')}",
        )
    if tf_version is None:  # the imported TensorFlow's, else the installed one's (not imported)
        from tpushim import _versions

        tf_version = _versions._tf_version_cheaply()
    refused = []
    for engine in ENGINES:
        why = engine.unavailable(tf_version, environ)
        if why is None:
            return engine, engine.why_chosen(refused)
        if engine.said_when_passed:
            refused.append(why)
    raise RuntimeError(
        f"no tpushim engine runs here: {'; '.join(refused)}"
    )  # the last never refuses


def choose(settings, environ=None, tf_version=None):
    """``(engine name, why)`` for a conversion under ``settings`` (:func:`select`)."""
    engine, why = select(settings, environ, tf_version)
    return engine.name, why
