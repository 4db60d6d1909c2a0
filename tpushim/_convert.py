"""One ``model_to_estimator`` call, converted: the one pipeline both TensorFlow eras run.

    decide -> prepare (validate, the engine's refusals, the model_dir, the TPU answering)
           -> build (the engine: warm start, the estimator) -> announce (its line, observers)

:func:`convert` is what the wrapper :mod:`tpushim._patch` puts on ``model_to_estimator`` runs
once it has found the settings in force. The decision (:mod:`tpushim._decision`) names the engine
once; the conversion asks the registry (:mod:`tpushim._engines`) for that engine and nothing
chooses again.

Where the two TensorFlow eras differ -- stock ``keras_lib``'s ``model_to_estimator`` on
TensorFlow <= 2.15, tpushim's own estimator API (:mod:`tpushim._estimator_api`) on >= 2.16 -- one
function says so: :func:`era`. Each era validates the model as its own ``model_to_estimator``
does, builds a Keras model_fn and writes the warm-start checkpoint with its own functions
(:class:`StockKeras`), and makes the stock estimator where no TPU path applies.

TensorFlow-free at import: the wrapper imports it at the first call.
"""

import collections
import logging

logger = logging.getLogger("tpushim")

#: An era's stock Keras conversion: ``model_fn(keras_model, custom_objects, save_object_ckpt,
#: metric_names_map, export_outputs)`` makes stock's Keras model_fn;
#: ``save_first_checkpoint(keras_model, custom_objects, config, save_object_ckpt, on_graph=None)``
#: writes stock's warm-start checkpoint of the Keras weights and returns its path.
StockKeras = collections.namedtuple("StockKeras", "model_fn save_first_checkpoint")


def convert(wrapped, args, kwargs, settings):
    """``(estimator, converted)`` for a call of ``wrapped`` (``model_to_estimator``) with
    ``args``/``kwargs`` under ``settings``: ``converted`` is True for an estimator an engine made
    (the TPU path), False for the stock estimator.

    Raises:
      tpushim.NoTPUError: mode ``tpu`` and no TPU configured.
      tpushim.ConversionError, ValueError: what the conversion refuses, before anything is written.
    """
    from tpushim import _decision, _detect, _engines, _observe  # not at start-up

    arguments = arguments_by_name(wrapped, args, kwargs)
    tpu = _detect.find_tpu(settings, arguments.get("config")) if settings.mode != "off" else None
    decision = _decision.decide(settings, tpu)
    logger.debug(
        "model_to_estimator called with %s; TPU found: %s; decision: %s (%s)",
        settings,
        tpu.describe() if tpu else "none",
        decision.action,
        decision.why,
    )
    current = era()
    if decision.action == _decision.STOCK:
        return current.stock(wrapped, args, kwargs, arguments, settings, decision), False
    if decision.action == _decision.NO_TPU:
        from tpushim._errors import NoTPUError

        raise NoTPUError(decision.why)
    engine = _engines.get(decision.engine)
    engine.refuse_here(settings)
    with _observe.converting(arguments) as arguments:  # observers may replace the arguments
        prepared = current.prepare(engine, arguments, settings, decision)
        built = engine.build(prepared, arguments, settings, decision)
        announce(built, arguments, settings)
    return built.estimator, True


def announce(built, arguments, settings):
    """The conversion's line (on stderr too when logging is not configured), and observers told."""
    from tpushim import _log, _observe

    _log.conversion(built.description, settings.quiet)
    _observe.converted(
        _observe.Conversion(
            built.estimator,
            built.keras_model,
            arguments,
            settings,
            built.model_fn,
            built.description,
        )
    )


def arguments_by_name(wrapped, args, kwargs):
    """The call's arguments by parameter name, defaults filled in: what the conversion takes."""
    import inspect

    bound = inspect.signature(wrapped).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def era():
    """This TensorFlow's era: :data:`STOCK_ESTIMATOR` (TensorFlow <= 2.15, tensorflow_estimator)
    or :data:`OWN_ESTIMATOR` (>= 2.16, tpushim's estimator API)."""
    from tpushim import _versions

    return OWN_ESTIMATOR if _versions.uses_own_estimator() else STOCK_ESTIMATOR


class _StockEstimatorEra:
    """TensorFlow <= 2.15: stock ``keras_lib``'s model_to_estimator, tensorflow_estimator."""

    def stock(self, wrapped, args, kwargs, arguments, settings, decision):
        """The stock estimator, as without tpushim."""
        del settings
        logger.info(
            "model_to_estimator -> stock %s (%s)",
            "EstimatorV2" if arguments["use_v2_estimator"] else "Estimator",
            decision.why,
        )
        return wrapped(*args, **kwargs)

    def keras(self):
        from tpushim import _tfprivate

        return StockKeras(
            _tfprivate.estimator.create_keras_model_fn, _tfprivate.estimator.save_first_checkpoint
        )

    def prepare(self, engine, arguments, settings, decision):
        """The conversion's first half: every check that needs no network first, then the TPU
        (a bare TPU name is looked up through the metadata server); nothing is written before
        all of them pass. A :class:`tpushim._engines.Prepared`."""
        from tpushim import _decision, _engines, _loss_kinds, _tfprivate, _validation

        tpu = decision.tpu
        keras_model = _load_model(arguments)
        custom_objects = arguments["custom_objects"]
        save_object_ckpt = _validation.saves_object_checkpoints(
            keras_model, arguments["checkpoint_format"]
        )
        optimizer = _validation.validate(keras_model, custom_objects)
        _validation.check_cluster(arguments["config"])
        check_replicas(arguments["config"], decision.action == _decision.CPU)
        loss_plan = _loss_kinds.plan(keras_model, custom_objects)  # validate() made it: cached
        # The engine's own refusals, before anything is written (the TPU resolved below).
        plan = engine.plan(keras_model, optimizer, custom_objects, settings, tpu, lambda: cluster)
        config, model_dir_checked = arguments["config"], False
        if arguments["model_dir"] or getattr(config, "model_dir", None):
            config = _tfprivate.estimator.maybe_overwrite_model_dir_and_session_config(
                config, arguments["model_dir"]
            )
            _validation.check_model_dir(keras_model, config.model_dir)
            model_dir_checked = True
        cluster = tpu_resolver(engine, tpu)
        check_tpu_answers(cluster, tpu)
        # With no model_dir given, stock makes a temporary one: only now, once nothing can fail.
        config = _tfprivate.estimator.maybe_overwrite_model_dir_and_session_config(config, None)
        if not model_dir_checked:  # a mocked tempfile may hand out a folder holding a checkpoint
            _validation.check_model_dir(keras_model, config.model_dir)
        run_config = engine.run_config(config, settings, cluster)
        _use_optimizer(keras_model, optimizer)
        return _engines.Prepared(
            keras_model,
            custom_objects,
            save_object_ckpt,
            config,
            cluster=cluster,
            loss_plan=loss_plan,
            plan=plan,
            run_config=run_config,
            keras=self.keras(),
        )


class _OwnEstimatorEra:
    """TensorFlow >= 2.16: no tensorflow_estimator; tpushim's estimator API
    (:mod:`tpushim._estimator_api`), whose Keras conversion is stock 2.15's."""

    def stock(self, wrapped, args, kwargs, arguments, settings, decision):
        """tpushim's estimator API's model_to_estimator: stock 2.15's path (no TPU path)."""
        del args, kwargs
        from tpushim import _log, _observe
        from tpushim._estimator_api import _keras

        v2 = getattr(wrapped, "__name__", "") == "model_to_estimator_v2"
        # Said as a TPU path's line is (not only logged): stock's estimator is gone, this is tpushim's.
        _log.conversion(
            f"tpushim's {'EstimatorV2' if v2 else 'Estimator'} on TensorFlow >= 2.16 ("
            + ("no TPU configured; stock 2.15's path" if settings.mode == "auto" else decision.why)
            + ")",
            settings.quiet,
        )
        # Observers (the run summary, the preflight) hear of it, as of a TPU path conversion.
        with _observe.converting(arguments) as arguments:
            estimator = _keras.model_to_estimator(use_v2_estimator=v2, **arguments)
        _observe.converted(_keras.conversion(estimator, arguments, settings, v2))
        return estimator

    def keras(self):
        from tpushim._estimator_api import _keras

        return StockKeras(_keras._model_fn_for, _keras._save_first_checkpoint)

    def prepare(self, engine, arguments, settings, decision):
        """The conversion's first half, as stock 2.15's model_to_estimator validates (tpushim's
        estimator API's), with the engine's refusals and the TPU answering; nothing is written.
        A :class:`tpushim._engines.Prepared`."""
        import tensorflow as tf

        from tpushim import _decision, _engines, _tfprivate
        from tpushim._errors import ConversionError
        from tpushim._estimator_api import _keras as api_keras

        tpu = decision.tpu
        keras_model = arguments["keras_model"]
        if keras_model is not None and arguments["keras_model_path"]:
            raise ValueError(
                "Please specity either `keras_model` or `keras_model_path`, but not both."
            )
        if keras_model is None:
            path = arguments["keras_model_path"]
            if not path:
                raise ValueError("Either `keras_model` or `keras_model_path` needs to be provided.")
            if path.startswith("gs://") or "storage.googleapis.com" in path:
                raise ConversionError(
                    f"tpushim loads keras_model_path from local or mounted paths; copy {path} "
                    "locally first (gsutil cp) and pass that path."
                )
            keras_model = tf.keras.models.load_model(
                path, custom_objects=arguments["custom_objects"]
            )
        custom_objects = arguments["custom_objects"]
        api_keras._assert_valid_model(keras_model, custom_objects)
        checkpoint_format = arguments["checkpoint_format"]
        if checkpoint_format not in (None, "checkpoint", "saver"):
            raise ValueError(
                f'Checkpoint format must be one of "checkpoint" or "saver". Got {checkpoint_format}'
            )
        if checkpoint_format != "saver" and _tfprivate.keras.is_subclassed(keras_model):
            raise ValueError(
                "Object-based checkpoints are currently not supported with "
                "subclassed models."  # stock's text, then how to get past it
                " Pass checkpoint_format='saver' to model_to_estimator."
            )
        if not getattr(keras_model, "optimizer", None):
            raise ValueError(
                "The given keras model has not been compiled yet. Please compile the model with "
                "`model.compile()` before calling `model_to_estimator()`."
            )
        optimizer = keras_model.optimizer
        if not isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer) and isinstance(
            optimizer, tf.keras.optimizers.Optimizer
        ):  # as stock: a new-style optimizer becomes its legacy twin (estimators need one)
            optimizer = tf.keras.__internal__.optimizers.convert_to_legacy_optimizer(optimizer)
        check_replicas(arguments["config"], decision.action == _decision.CPU)
        cluster = tpu_resolver(engine, tpu)
        plan = engine.plan(keras_model, optimizer, custom_objects, settings, tpu, lambda: cluster)
        check_tpu_answers(cluster, tpu)
        config = _tfprivate.estimator.maybe_overwrite_model_dir_and_session_config(
            arguments["config"], arguments["model_dir"]
        )
        run_config = engine.run_config(config, settings, cluster)
        _use_optimizer(keras_model, optimizer)
        return _engines.Prepared(
            keras_model,
            custom_objects,
            checkpoint_format != "saver",
            config,
            cluster=cluster,
            plan=plan,
            run_config=run_config,
            keras=self.keras(),
        )


STOCK_ESTIMATOR = _StockEstimatorEra()
OWN_ESTIMATOR = _OwnEstimatorEra()


def tpu_resolver(engine, tpu):
    """TensorFlow's TPUClusterResolver of ``tpu`` (a :class:`tpushim._detect.TPUSpec`, or None)
    for an engine that drives the TPU through TensorFlow; None for the JAX engine, whose devices
    JAX finds (TensorFlow may see no TPU there: its resolver and TPU check would refuse it)."""
    from tpushim import _detect

    if tpu is None or not engine.tpu_through_tensorflow:
        return None
    return _detect.cluster_resolver(tpu)


def check_tpu_answers(cluster, tpu):
    """A TPU that does not answer fails now, before anything is written (``cluster``: from
    :func:`tpu_resolver`; nothing to ask where it is None)."""
    from tpushim import _detect

    if cluster is not None:
        _detect.check_tpu_answers(cluster, tpu.source)


def _use_optimizer(keras_model, optimizer):
    """The model trains with ``optimizer`` (its legacy twin, as stock), said where it changed."""
    if optimizer is not keras_model.optimizer:
        logger.warning(
            "converting optimizer %s to tf.keras.optimizers.legacy, as the stock "
            "model_to_estimator does.",
            type(keras_model.optimizer).__name__,
        )
        keras_model.optimizer = optimizer


def _load_model(arguments):
    """The Keras model the call names: given, or loaded from a local path (TensorFlow <= 2.15)."""
    import tensorflow as tf

    from tpushim._errors import ConversionError

    keras_model, keras_model_path = arguments["keras_model"], arguments["keras_model_path"]
    if not (keras_model or keras_model_path):
        raise ValueError("Either `keras_model` or `keras_model_path` needs to be provided.")
    if keras_model and keras_model_path:
        raise ValueError("Please specity either `keras_model` or `keras_model_path`, but not both.")
    if keras_model is not None:
        return keras_model
    if keras_model_path.startswith("gs://") or "storage.googleapis.com" in keras_model_path:
        raise ConversionError(
            "tpushim loads keras_model_path from local or mounted paths; copy "
            f"{keras_model_path} locally first (gsutil cp) and pass that path."
        )
    logger.info("loading model from %s", keras_model_path)
    return tf.keras.models.load_model(keras_model_path, custom_objects=arguments["custom_objects"])


def check_replicas(config, cpu_mode):
    """Refuses, before anything is written, cpu mode for a RunConfig whose strategy has several
    replicas. Stock's MirroredStrategy gives each replica a batch of its own from the input_fn
    (a step reads replicas x its batch); cpu mode runs a TPU's path, where the input_fn's batch
    is the global batch, split over the cores: its numbers cannot be stock's. (On a TPU the
    strategy is not the TPU's, and is ignored, with a warning.)"""
    if not cpu_mode:
        return
    for key in ("train_distribute", "eval_distribute"):
        strategy = getattr(config, key, None)
        replicas = getattr(strategy, "num_replicas_in_sync", 1) if strategy is not None else 1
        if replicas > 1:
            from tpushim._errors import ConversionError

            raise ConversionError(
                f"RunConfig({key}={type(strategy).__name__}) over {replicas} replicas gives "
                f"each replica a batch of its own from the input_fn ({replicas} x its batch a "
                "step), as stock trains it; tpushim's mode 'cpu' runs a TPU's path, where the "
                "input_fn's batch is the global batch split over the cores, so it cannot give "
                "stock's numbers. To train over the replicas as stock does, run without mode "
                "'cpu' (with no TPU, mode 'auto' trains as stock); to preview the TPU run, leave "
                f"{key} out of RunConfig and give the input_fn the global batch ({replicas} x "
                "its batch)."
            )
