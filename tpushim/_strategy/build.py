"""The conversion's last step on the strategy engine, on either TensorFlow: :func:`made` (the
plan completed, the warm-start checkpoint, the
:class:`tpushim._strategy.estimator.StrategyEstimator`); :mod:`tpushim._convert` runs the steps
before it and announces it."""

import dataclasses
import functools
import logging

from tpushim import _batch_math, _tfprivate
from tpushim._strategy import checkpoint as _strategy_checkpoint
from tpushim._strategy.estimator import StrategyEstimator

logger = logging.getLogger("tpushim")


def warm_from_first_checkpoint(plan, path):
    """The warm-start weights of ``plan``'s model: its own (:func:`make_plan`), or for a program
    that disabled v2 behaviour and never initialised its model's variables, those of the clone
    stock's first checkpoint (``path``) initialised, seeded with the config's
    ``tf_random_seed``: stock warm-starts from them, and the engine starts from them too."""
    if plan.graph_mode and plan.warm_start is None and path is not None:
        return _tfprivate.estimator.first_checkpoint_values(
            plan.keras_model, plan.custom_objects, path
        )
    return plan.warm_start


def said_distribute(config, tpu):
    """On a TPU, the RunConfig's ``train_distribute`` / ``eval_distribute`` strategies, which the
    engine does not use (it makes its TPUStrategy), each said in a warning with the batch
    arithmetic (:func:`tpushim._batch_math.distributed_batch`); the conversion line's words for
    them ('' where there are none, or off a TPU: cpu mode refuses several replicas, and one
    trains as stock)."""
    if tpu is None:
        return ""
    found = _batch_math.distribute_strategies(config)
    for key, name, replicas in found:
        problem, fix = _batch_math.distributed_batch(key, name, replicas)
        logger.warning("%s; %s.", problem, fix)
    if not found:
        return ""
    keys = " and ".join(f"{key}={name}" for key, name, _ in found)
    return f", RunConfig's {keys} not used: the input_fn's batch is the global batch"


def describe(plan, settings, tpu, why, distribute=""):
    """The conversion line's description of this engine's estimator: where it runs and why
    (``distribute``: :func:`said_distribute`'s words)."""
    return (
        "the strategy engine: "
        + (
            f"tf.distribute.TPUStrategy on TPU {tpu.describe()} [TPU from {tpu.source}]"
            if tpu is not None
            else "tf.distribute.MirroredStrategy over this machine's devices "
            f"[mode cpu from {settings.sources.get('mode')}]"
        )
        + f", global batch {plan.batch_size or 'from input'}"
        + distribute
        + f", steps_per_execution {plan.steps_per_execution} [engine: {why}]"
    )


def made(prepared, arguments, settings, decision):
    """The strategy engine's estimator, on either TensorFlow, from the conversion's
    :class:`tpushim._engines.base.Prepared` first half (:mod:`tpushim._convert`; its ``plan`` is
    :func:`make_plan`'s): this TensorFlow's stock Keras model_fn (export) and warm-start
    checkpoint (stock's training graph, built there, gives the engine its checkpoint names), the
    plan completed (its TPU, its warm-start checkpoint, read into its weights), and the
    :class:`StrategyEstimator`. A :class:`tpushim._engines.base.Built`."""
    from tpushim._engines import base

    tpu, why = decision.tpu, decision.engine_why
    keras_model, custom_objects = prepared.keras_model, prepared.custom_objects
    plan, config, save_object_ckpt = prepared.plan, prepared.config, prepared.save_object_ckpt
    model_fn = prepared.stock_model_fn(arguments)
    warm_start_path = None
    if _tfprivate.keras.is_graph_network(keras_model) and config.is_chief:  # as stock
        warm_start_path = prepared.keras.save_first_checkpoint(
            keras_model,
            custom_objects,
            config,
            save_object_ckpt,
            on_graph=functools.partial(
                _strategy_checkpoint.remember, plan, object_based=save_object_ckpt
            ),
        )
    # The plan completed, once: a new frozen value (:class:`tpushim._strategy.plan.Plan`).
    plan = dataclasses.replace(
        plan,
        conversion=dataclasses.replace(plan.conversion, tpu=tpu, warm_start=warm_start_path),
        metric_names_map=arguments["metric_names_map"],
        name_based_checkpoints=not save_object_ckpt,  # stock's 'saver' format
    )
    plan = dataclasses.replace(plan, warm_start=warm_from_first_checkpoint(plan, warm_start_path))
    estimator = StrategyEstimator(
        model_fn,
        config,
        warm_start_path,
        plan,
        # (on TF >= 2.16 one Estimator class: its export_savedmodel exports either way)
        v1_api=not arguments.get("use_v2_estimator", True),
    )
    distribute = said_distribute(config, tpu)
    return base.Built(
        estimator, keras_model, model_fn, describe(plan, settings, tpu, why, distribute)
    )
