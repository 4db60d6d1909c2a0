"""The engine protocol: what an engine is to the rest of tpushim (:class:`Engine`), what a
conversion hands it (:class:`Prepared`) and what it returns (:class:`Built`), and the facts the
engines' choice reads (their names, a PJRT runtime, the first TensorFlow without TPUEstimator).
The registry that orders the engines is the package's (:mod:`tpushim._engines`); each engine's
module imports this one, never the registry. TensorFlow-free."""

import dataclasses

from tpushim import _tpus, version

# The engines' names, and what tells a PJRT TPU runtime, are the TPU generations table's.
TPUESTIMATOR = _tpus.TPUESTIMATOR
STRATEGY = _tpus.STRATEGY
JAX = "jax"
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

    def stock_model_fn(self, arguments):
        """Stock's Keras model_fn of this model (what the base class exports with), made by
        this TensorFlow's stock conversion from ``model_to_estimator``'s ``arguments``."""
        return self.keras.model_fn(
            self.keras_model,
            self.custom_objects,
            self.save_object_ckpt,
            arguments["metric_names_map"],
            arguments["export_outputs"],
        )


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
    #: Whether ``engine=auto``'s reason for the engine it chose says why this one could not run
    #: (an engine for a few machines only says nothing where it does not apply).
    said_when_passed = True
    #: Whether the engine drives the TPU through TensorFlow: the conversion then builds
    #: TensorFlow's TPUClusterResolver and asks the TPU to answer before anything is written.
    #: The JAX engine runs on the devices JAX finds, where TensorFlow may see no TPU at all.
    tpu_through_tensorflow = True

    # -- the choice -----------------------------------------------------------------------------
    def unavailable(self, tf_version, environ):
        """Why this engine cannot run here (one phrase), or None where it can (``can_handle``)."""
        del tf_version, environ
        return None

    def why_chosen(self, refused):
        """Why ``engine=auto`` chose it, given why each engine before it cannot run here."""
        return "; ".join(refused) or self.chosen_why

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

    def said_around(self, cls, model_fn):
        """For ``cls(model_fn=model_fn)`` whose model_fn no converted estimator owns: say (and
        tell observers) where it still reaches an estimator this engine made; else nothing."""
        del cls, model_fn

    def rewrap(self, cls, args, kwargs, found):
        """What ``cls(*args, **kwargs)`` returns where its model_fn is an estimator's this engine
        made (``found``: :func:`tpushim._tfprivate.estimator.estimator_of_model_fn`'s answer), or None:
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
