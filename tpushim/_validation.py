"""What a conversion checks before anything is written; none of it needs a network.

:data:`VALIDATION_STEPS` check the model (stock's structure check, compiled, an optimizer whose
gradients can be averaged across shards, metrics that rebuild from their config); the checkpoint
format and an existing model_dir are checked against the model too. The preflight runs the same
steps and reports the first that fails.
"""

import logging
import os

import tensorflow as tf

from tpushim import _feature_columns, _loss_kinds, _model_fn, _tfprivate
from tpushim._errors import ConversionError

logger = logging.getLogger("tpushim")


def _validate_model(keras_model, custom_objects):
    """Structure checks that need no writing; raise before anything touches model_dir.

    Exactly stock's: a subclassed model must rebuild from ``get_config``/``from_config`` (Keras
    2.13+ derives a config from basic ``__init__`` arguments), as the model_fn clones it so.
    """
    _tfprivate.estimator.assert_valid_model(keras_model, custom_objects)


def _check_compiled(keras_model, custom_objects=None):
    del custom_objects
    if not getattr(keras_model, "optimizer", None):
        raise ValueError(
            "The given keras model has not been compiled yet. Please compile the model "
            "with `model.compile()` before calling `model_to_estimator()`."
        )


def _one_legacy_optimizer(optimizer):
    if isinstance(optimizer, tf.keras.optimizers.experimental.Optimizer):
        try:
            legacy = tf.keras.__internal__.optimizers.convert_to_legacy_optimizer(optimizer)
        except Exception as e:
            legacy, why = None, f"{type(e).__name__}: {e}"
        else:
            why = f"conversion gave {legacy!r}"
        if not isinstance(legacy, tf.keras.optimizers.legacy.Optimizer):
            raise ConversionError(
                f"optimizer {type(optimizer).__name__} has no tf.keras.optimizers.legacy equivalent "
                f"({why}); estimators, and so TPUEstimator, need one to average gradients across "
                f"TPU shards. Compile with a built-in Keras optimizer (e.g. "
                f"tf.keras.optimizers.legacy.Adam) or a tf.compat.v1.train optimizer."
            )
        optimizer = legacy
    _model_fn.optimizer_kind(optimizer)
    return optimizer


def _legacy_optimizer(keras_model, custom_objects=None):
    """The optimizer the model_fn will clone; validated, but not yet set on the user's model.

    As stock: a new-style Keras optimizer is converted to its legacy twin (estimators need one).
    A list (WideDeepModel: one optimizer per sub-model) is checked and converted item by item.
    """
    del custom_objects
    optimizer = keras_model.optimizer
    if isinstance(optimizer, (list, tuple)):
        converted = [_one_legacy_optimizer(o) for o in optimizer]
        if all(c is o for c, o in zip(converted, optimizer)):
            return optimizer
        return type(optimizer)(converted)
    return _one_legacy_optimizer(optimizer)


def _check_metrics(keras_model, custom_objects):
    """Every compiled metric must rebuild from its config: metric_fn recreates it on the host."""
    metrics = [
        m
        for m in tf.nest.flatten(_tfprivate.keras_compile.compiled_user_metrics(keras_model))
        if isinstance(m, tf.keras.metrics.Metric)
    ]
    for metric in metrics:
        try:
            with tf.keras.utils.custom_object_scope(custom_objects or {}):
                metric.__class__.from_config(metric.get_config())
        except Exception as e:
            raise ConversionError(
                f"tpushim cannot rebuild metric {metric.name!r} ({type(metric).__name__}) from its "
                f"config ({type(e).__name__}: {e}); a TPU computes metrics in a metric_fn that "
                f"recreates each metric. Implement get_config() on it, pass its class in "
                f"custom_objects, or compile the model without it."
            ) from e


#: What the conversion checks before anything is written, in order: (kind, check(model, custom_objects)).
#: ``_convert`` runs them; the preflight reports the first that fails as ``unconvertible-<kind>``.
VALIDATION_STEPS = (
    ("model", _validate_model),
    ("model", _check_compiled),
    ("optimizer", _legacy_optimizer),
    ("metric", _check_metrics),
    # Every loss term a sum or a mean over the examples: what TPU shards can split exactly.
    ("loss", _loss_kinds.check),
    # DenseFeatures layers: their weight-free part can move to the input pipeline (the host).
    ("feature-columns", lambda keras_model, custom_objects: _feature_columns.plan(keras_model)),
)


def validate(keras_model, custom_objects):
    """Runs :data:`VALIDATION_STEPS`; returns the optimizer the model_fn will clone."""
    results = {kind: check(keras_model, custom_objects) for kind, check in VALIDATION_STEPS}
    return results["optimizer"]


def check_cluster(config):
    """Refuses, before anything is written, a RunConfig that a ``train_distribute`` strategy and
    a cluster in TF_CONFIG put in tf.estimator's distribute-coordinator mode (TensorFlow <=
    2.15): that mode copies the estimator into every task and runs the strategy across them,
    which neither engine can honour (stock 2.15 itself fails there for a MirroredStrategy). On
    TensorFlow >= 2.16 tpushim's RunConfig refuses such a cluster itself, naming TF_CONFIG."""
    if not getattr(config, "_distribute_coordinator_mode", None):
        return
    strategy = getattr(config, "train_distribute", None) or getattr(config, "eval_distribute", None)
    jobs = config.cluster_spec.as_dict() if config.cluster_spec else {}
    shown = ", ".join(f"{len(tasks)} {job}" for job, tasks in sorted(jobs.items())) or "a cluster"
    raise ConversionError(
        f"RunConfig(train_distribute={type(strategy).__name__}) with a cluster in TF_CONFIG "
        f"({shown}) runs tf.estimator's distribute coordinator, which copies the estimator into "
        "every task: tpushim cannot convert for it (a TPU replicates the model over its cores "
        "itself, one process per TPU host, with no TF_CONFIG). Unset TF_CONFIG, or leave "
        "train_distribute out of RunConfig, to convert; or train without tpushim "
        "(TPUSHIM_MODE=off)."
    )


def saves_object_checkpoints(keras_model, checkpoint_format):
    """True for object-based (tf.train.Checkpoint) checkpoints, False for Saver ones; as stock."""
    if checkpoint_format in (None, "checkpoint"):
        if _tfprivate.keras.is_subclassed(keras_model):
            raise ValueError(
                "Object-based checkpoints are currently not supported with "
                "subclassed models."  # stock's text, then how to get past it
                " Pass checkpoint_format='saver' to model_to_estimator."
            )
        return True
    if checkpoint_format == "saver":
        return False
    raise ValueError(
        f'Checkpoint format must be one of "checkpoint" or "saver". Got {checkpoint_format}'
    )


def _expected_variables(keras_model):
    """The model's own weights as {checkpoint key: shape}, both ways a checkpoint may name them:
    (name-based keys, object-based keys). Computed in memory: nothing is written."""
    by_name = {w.name.split(":")[0]: w.shape.as_list() for w in keras_model.weights}
    return by_name, _tfprivate.checkpoint.object_checkpoint_keys(keras_model)


def check_model_dir(keras_model, model_dir):
    """A model_dir already holding a checkpoint of different variables is an error, not an overwrite.

    Read-only. Accepts any checkpoint stock would warm-start from or continue: name-based or
    object-based keys (either may be there, whichever format this call will save), in model_dir
    or model_dir/keras. Refuses only when a matching key has a different shape, or when none of
    this model's variables is in it under either naming.
    """
    if _tfprivate.keras.is_subclassed(keras_model):
        # Its variables are named when the model_fn builds it (an unbuilt model has none yet) and
        # stock writes no Keras checkpoint for it: nothing to compare before training.
        return
    expected_formats = None
    for folder in (model_dir, os.path.join(model_dir, "keras")):
        latest = tf.train.latest_checkpoint(folder)
        if not latest:
            continue
        found = dict(tf.train.list_variables(latest))
        if expected_formats is None:
            expected_formats = _expected_variables(keras_model)
        details, matched = [], False
        for expected in expected_formats:
            present = [k for k in expected if k in found]
            matched = matched or bool(present)
            details += [
                f"'{k}' has shape {list(found[k])} there but {expected[k]} in this model"
                for k in present
                if list(found[k]) != list(expected[k])
            ]
        if not matched:
            first = next(iter(expected_formats[0]), None)
            details.append(f"none of this model's variables are in it (e.g. '{first}')")
        if details:
            raise ConversionError(
                f"model_dir {model_dir} already holds a checkpoint of different variables ({latest}): "
                f"{'; '.join(details[:3])}. tpushim wrote nothing. Use a new model_dir for this model, "
                f"or delete that one to start over."
            )


def said_subclassed(keras_model):
    """What stock does with a subclassed model, said (by the strategy and JAX engines): its
    estimator starts from a freshly initialised copy (no first checkpoint of its weights, no
    warm start), and calls none of the model's own step methods."""
    if keras_model.built:
        logger.warning(
            "%s is a subclassed Keras model that already has weights; as the stock "
            "model_to_estimator, the estimator starts from a freshly initialised copy "
            "(its weights are not carried over). The model you passed is unchanged.",
            type(keras_model).__name__,
        )
    steps = _tfprivate.keras.overrides_step(keras_model)
    if steps:
        logger.warning(
            "%s overrides %s; as the stock model_to_estimator, the estimator trains, evaluates "
            "and predicts with the model's call, compiled loss, metrics and optimizer, and never "
            "calls %s.",
            type(keras_model).__name__,
            " and ".join(steps),
            "them" if len(steps) > 1 else "it",
        )
