"""The engines that run a conversion's TPU path, found through one registry: the protocol every
engine implements (:class:`Engine`), the registry in order of preference (:data:`ENGINES`), and
which engine runs a conversion, and why (:func:`choose`).

As tf-keras finds the data adapter for an input (``ALL_ADAPTER_CLS``, ``can_handle``,
``select_data_adapter``), tpushim asks its engines in turn: the first that can run here takes
the conversion (``engine=auto``), unless the settings name one. The engines:

* ``tpuestimator`` (:mod:`tpushim._engines.tpuestimator`): TPUEstimator, TF1 sessions on the
  StreamExecutor TPU runtime (:mod:`tpushim._estimator`).
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

import dataclasses

from tpushim import _tpus, version

# The engines' names, and what tells a PJRT TPU runtime, are the TPU generations table's.
TPUESTIMATOR = _tpus.TPUESTIMATOR
STRATEGY = _tpus.STRATEGY
PJRT_VARS = _tpus.PJRT_VARS
pjrt_runtime = _tpus.pjrt_runtime

#: The first TensorFlow (major, minor) without TPUEstimator: the first with tpushim's estimator API.
NO_ESTIMATOR_FROM = version.estimator_api_tf()


def _major_minor(text):
    parts = str(text or "").split(".")[:2]
    try:
        return tuple(int(p) for p in parts) if len(parts) == 2 else None
    except ValueError:
        return None


@dataclasses.dataclass
class Prepared:
    """What a conversion's first half (validation, the engine's refusals, the model_dir, the TPU
    answering: :func:`tpushim._convert.prepare`) hands the engine that builds the estimator.
    Nothing has been written when it is made.

    Attributes:
      keras_model: the Keras model (given, or loaded from ``keras_model_path``), its optimizer
        the one stock trains with.
      custom_objects: as given to ``model_to_estimator``.
      save_object_ckpt: object-based checkpoints (``checkpoint_format``)?
      config: the RunConfig with its model_dir.
      cluster: the TPU's cluster resolver, or None (on this machine's CPU).
      loss_plan: the model's :class:`tpushim._loss_kinds.LossPlan`, or None.
      plan: the engine's own plan (:meth:`Engine.plan`), or None.
      run_config: the engine's run config (:meth:`Engine.run_config`), or None.
      keras: this TensorFlow's stock Keras conversion (:func:`tpushim._convert.stock_keras`):
        its model_fn factory and warm-start checkpoint writer.
    """

    keras_model: object
    custom_objects: object
    save_object_ckpt: bool
    config: object
    cluster: object = None
    loss_plan: object = None
    plan: object = None
    run_config: object = None
    keras: object = None


@dataclasses.dataclass(frozen=True)
class Built:
    """What an engine's :meth:`Engine.build` returns: the estimator, and what the conversion
    announces of it (its line, and what observers hear: :class:`tpushim._observe.Conversion`)."""

    estimator: object
    keras_model: object
    model_fn: object
    description: str


class Engine:
    """What an engine is to the rest of tpushim. Each engine is one subclass, registered in
    :data:`ENGINES`; tpushim asks it in the order of the conversion
    (:mod:`tpushim._convert`: decide -> prepare -> build -> announce).

    Attributes:
      name: the ``engine`` setting that names it (``TPUSHIM_ENGINE``).
      compiles_own_step: see below.
      chosen_why: why it runs, when ``engine=auto`` chose it and no engine before it refused.
    """

    name = None
    chosen_why = None

    # -- the choice -----------------------------------------------------------------------------
    def unavailable(self, tf_version, environ):
        """Why this engine cannot run here (one phrase), or None where it can (``can_handle``)."""
        del tf_version, environ
        return None

    def refuse_here(self, settings):
        """Raises :class:`tpushim.ConversionError` where the settings name this engine and this
        TensorFlow cannot build it (before anything is asked of the model)."""
        del settings

    # -- the conversion -------------------------------------------------------------------------
    def plan(self, keras_model, optimizer, custom_objects, settings, tpu, cluster):
        """The engine's own plan of the model, or None: its refusals, raised before anything is
        written. ``cluster``: a function returning the TPU's cluster resolver (resolved later:
        a bare TPU name is looked up on the network once every other check passed)."""
        del keras_model, optimizer, custom_objects, settings, tpu, cluster
        return None

    def run_config(self, config, settings, cluster):
        """The engine's own RunConfig for ``config``, or None (the user's serves)."""
        del config, settings, cluster
        return None

    def build(self, prepared, arguments, settings, decision):
        """The estimator, from the conversion's :class:`Prepared` first half: writes the
        warm-start checkpoint, makes the estimator; returns a :class:`Built`."""
        raise NotImplementedError

    # -- estimators made from a converted one ---------------------------------------------------
    def owns(self, estimator):
        """Whether ``estimator`` is one this engine made."""
        del estimator
        return False

    def add_metrics(self, estimator, metric_fn, model_fn):
        """What ``tf.estimator.add_metrics(estimator, metric_fn)`` returns for an estimator this
        engine made (``model_fn``: the one stock's add_metrics made), or None: stock's."""
        del estimator, metric_fn, model_fn
        return None

    def rewrap(self, cls, args, kwargs, found):
        """What ``cls(*args, **kwargs)`` returns where its model_fn is an estimator's this engine
        made (``found``: :func:`tpushim._tfprivate.estimator_of_model_fn`'s answer), or None:
        stock's."""
        del cls, args, kwargs, found
        return None

    # -- the preflight --------------------------------------------------------------------------
    #: The preflight compiles this engine's own training step (its plan: :meth:`refusals`)
    #: rather than the Keras model's.
    compiles_own_step = False

    def refusals(self, keras_model, custom_objects, settings):
        """What the conversion's :meth:`plan` refuses, asked on this machine's CPU (the
        preflight): the plan, or None where the engine has no plan of its own; raises
        :class:`tpushim.ConversionError` where the engine would refuse the model."""
        del keras_model, custom_objects, settings
        return None

    def __repr__(self):
        return f"<engine {self.name}>"


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
            return engine, "; ".join(refused) or engine.chosen_why
        refused.append(why)
    raise RuntimeError(
        f"no tpushim engine runs here: {'; '.join(refused)}"
    )  # the last never refuses


def choose(settings, environ=None, tf_version=None):
    """``(engine name, why)`` for a conversion under ``settings`` (:func:`select`)."""
    engine, why = select(settings, environ, tf_version)
    return engine.name, why


from tpushim._engines.strategy import StrategyEngine  # noqa: E402  (they subclass Engine)
from tpushim._engines.tpuestimator import TPUEstimatorEngine  # noqa: E402

#: Every engine, in order of preference: ``engine=auto`` takes the first that can run here. The
#: strategy engine runs wherever TensorFlow does, so it comes last.
ENGINES = (TPUEstimatorEngine(), StrategyEngine())
