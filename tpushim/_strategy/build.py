"""The conversion on the strategy engine: :func:`build_on_engine` on TensorFlow >= 2.16 (stock's
``model_to_estimator`` checks, the plan, the warm-start checkpoint, on tpushim's own Estimator),
and :func:`made`, its last step on either TensorFlow (the plan completed, the
:class:`tpushim._strategy.estimator.StrategyEstimator`, its line, the observers told)."""

import dataclasses
import functools
import logging

import tensorflow as tf

from tpushim import _observe, _tfprivate
from tpushim._errors import ConversionError
from tpushim._strategy import checkpoint as _strategy_checkpoint
from tpushim._strategy.estimator import StrategyEstimator
from tpushim._strategy.plan import make_plan
from tpushim._strategy.runtime import cpu_strategy, tpu_strategy

logger = logging.getLogger("tpushim")


def warm_from_first_checkpoint(plan, path):
    """A program that disabled v2 behaviour and never initialised its model's variables: stock
    warm-starts from the clone its first checkpoint (``path``) initialised, seeded with the
    config's ``tf_random_seed``; the engine starts from those values too."""
    if plan.graph_mode and plan.warm_start is None and path is not None:
        plan.warm_start = _tfprivate.first_checkpoint_values(
            plan.keras_model, plan.custom_objects, path
        )


def describe(plan, settings, tpu, why):
    """The conversion line's description of this engine's estimator: where it runs and why."""
    return (
        "the strategy engine: "
        + (
            f"tf.distribute.TPUStrategy on TPU {tpu.describe()} [TPU from {tpu.source}]"
            if tpu is not None
            else "tf.distribute.MirroredStrategy over this machine's devices "
            f"[mode cpu from {settings.sources.get('mode')}]"
        )
        + f", global batch {settings.batch_size or 'from input'}"
        + f", steps_per_execution {plan.steps_per_execution} [engine: {why}]"
    )


def build_on_engine(arguments, settings, tpu, why):
    """The strategy engine's estimator on TensorFlow >= 2.16 (no tensorflow_estimator): built on
    tpushim's own Estimator (:mod:`tpushim._legacy`) as on 2.12-2.15 it is built on stock's, with
    that engine's Keras model_fn (export) and warm-start checkpoint, which are stock 2.15's.

    Args:
      arguments: the ``model_to_estimator`` call's arguments by name.
      settings: the resolved :class:`tpushim._settings.Settings`.
      tpu: the :class:`tpushim._detect.TPUSpec` to run on, or None (cpu mode).
      why: why the strategy engine runs (:func:`tpushim._engines.choose`).
    """
    from tpushim import _detect
    from tpushim._legacy import _keras as engine_keras

    with _observe.converting(arguments) as arguments:
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
        engine_keras._assert_valid_model(keras_model, custom_objects)
        checkpoint_format = arguments["checkpoint_format"]
        if checkpoint_format not in (None, "checkpoint", "saver"):
            raise ValueError(
                f'Checkpoint format must be one of "checkpoint" or "saver". Got {checkpoint_format}'
            )
        if checkpoint_format != "saver" and _tfprivate.is_subclassed(keras_model):
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
        cluster = _detect.cluster_resolver(tpu) if tpu is not None else None
        plan = make_plan(
            keras_model,
            optimizer,
            custom_objects,
            settings,
            lambda: tpu_strategy(cluster) if cluster is not None else cpu_strategy(),
        )
        if cluster is not None:  # a TPU that does not answer fails now, before anything is written
            _detect.check_tpu_answers(cluster, tpu.source)
        config = _tfprivate.maybe_overwrite_model_dir_and_session_config(
            arguments["config"], arguments["model_dir"]
        )
        if optimizer is not keras_model.optimizer:
            logger.warning(
                "converting optimizer %s to tf.keras.optimizers.legacy, as the stock "
                "model_to_estimator does.",
                type(keras_model.optimizer).__name__,
            )
            keras_model.optimizer = optimizer
        save_object_ckpt = checkpoint_format != "saver"
        model_fn = engine_keras._model_fn_for(
            keras_model,
            custom_objects,
            save_object_ckpt,
            arguments["metric_names_map"],
            arguments["export_outputs"],
        )
        warm_start_path = None
        if _tfprivate.is_graph_network(keras_model) and config.is_chief:  # as stock
            warm_start_path = engine_keras._save_first_checkpoint(
                keras_model,
                custom_objects,
                config,
                save_object_ckpt,
                on_graph=functools.partial(
                    _strategy_checkpoint.remember, plan, object_based=save_object_ckpt
                ),
            )
        built = (model_fn, config, warm_start_path, save_object_ckpt)
        return made(keras_model, plan, arguments, settings, (tpu, why), built)


def made(keras_model, plan, arguments, settings, tpu_why, built):
    """The conversion's last step on either TensorFlow: the plan completed (its TPU, its
    warm-start checkpoint, read into its weights), the :class:`StrategyEstimator`, its line,
    and the observers told. ``tpu_why``: the TPU (or None) and why this engine; ``built``:
    ``(model_fn, config, warm-start checkpoint, object-based checkpoints?)``."""
    from tpushim import _log

    tpu, why = tpu_why
    model_fn, config, warm_start_path, save_object_ckpt = built
    plan.conversion = dataclasses.replace(plan.conversion, tpu=tpu, warm_start=warm_start_path)
    plan.metric_names_map = arguments["metric_names_map"]
    warm_from_first_checkpoint(plan, warm_start_path)
    estimator = StrategyEstimator(
        model_fn,
        config,
        warm_start_path,
        plan,
        object_checkpoints=save_object_ckpt,
        # (on TF >= 2.16 one Estimator class: its export_savedmodel exports either way)
        v1_api=not arguments.get("use_v2_estimator", True),
    )
    description = describe(plan, settings, tpu, why)
    _log.conversion(description, settings.quiet)
    _observe.converted(
        _observe.Conversion(estimator, keras_model, arguments, settings, model_fn, description)
    )
    return estimator
