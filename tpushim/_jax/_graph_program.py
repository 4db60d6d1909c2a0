"""A program that disabled TensorFlow 2 behaviour (``tf.compat.v1.disable_v2_behavior()``, or
``disable_eager_execution()``) on the JAX engine.

Its Keras model is a TensorFlow 1 graph-mode model: its layers cannot be called in the
``tf.function`` the engine converts to JAX, nor its weights read eagerly. The engine runs each
of its calls (the conversion's JAX part, ``train``, ``evaluate``, ``predict``) on the eager
runtime (:func:`runtime`: :func:`tpushim._tfprivate.graph.eager_runtime`, the program's graph
mode and its model's v1 classes back after each call, as the strategy engine runs such a
program), on an eager copy of its model (:func:`eager_copy`): cloned from its config (a
``Lambda``'s function seeing the program's TensorShape), compiled as the program compiled it (a
fresh optimizer of the same config, its metrics cloned), its weights the ones stock starts
from (:func:`start_values`). Stock's own parts stay on the program's model, in its graph mode:
the model_fn (export), the first checkpoint, the training graph whose names and metric names
(``acc``) the checkpoints and evaluation take (:mod:`._checkpoint`)."""

import contextlib

import tensorflow as tf

from tpushim import _tfprivate
from tpushim._errors import ConversionError


def is_graph_program():
    """Whether the program disabled TensorFlow 2 behaviour (the engine is called in graph mode)."""
    return not tf.executing_eagerly()


@contextlib.contextmanager
def runtime(keras_model):
    """The eager runtime for one call of a graph program's estimator, left as the program had it
    after (its graph mode, its model's v1 classes: the eager copy swaps the shared classes to
    Keras's v2 ones while it runs)."""
    try:
        with _tfprivate.graph.eager_runtime():
            _tfprivate.keras.restore_v2_classes(keras_model)
            yield
    finally:
        _tfprivate.keras.restore_v2_classes(keras_model, v1=True)


def _optimizer_copy(optimizer):
    """A fresh optimizer of the program's one's config: a Keras optimizer from its config, a
    ``tf.compat.v1.train`` one (Keras's ``TFOptimizer``) with its hyperparameters."""
    if isinstance(optimizer, _tfprivate.keras.keras_v1_tf_optimizer_class()):
        return _tfprivate.keras_compile.fresh_tf1_optimizer(optimizer.optimizer)
    return type(optimizer).from_config(optimizer.get_config())


def eager_copy(keras_model, custom_objects, values=None):
    """The eager copy of a graph program's model (see the module), made on the eager runtime
    from the program's graph mode, Keras's random state left as it was (stock makes no such
    copy). ``values``: variable name -> the value it starts from (:func:`start_values`); the
    others keep their initializers' values."""
    args = _tfprivate.keras.compile_args(keras_model)  # (read by the program's v1 classes)
    optimizer = _optimizer_copy(keras_model.optimizer)
    with (
        runtime(keras_model),
        _tfprivate.keras.keras_random_state_kept(),
        tf.keras.utils.custom_object_scope(custom_objects or {}),
    ):
        copy = tf.keras.models.clone_model(
            keras_model, clone_function=_tfprivate.keras.clone_layer_in_programs_shapes
        )
        loss = args.get("loss")
        copy.compile(
            optimizer=optimizer,
            loss=tf.nest.map_structure(_in_programs_shapes, loss),
            metrics=_tfprivate.keras_compile.clone_metrics(args.get("metrics")),
            weighted_metrics=_tfprivate.keras_compile.clone_metrics(args.get("weighted_metrics")),
            loss_weights=args.get("loss_weights"),
        )
        for v in copy.weights:
            if values and _name(v) in values:
                v.assign(values[_name(v)])
        names = [_name(v) for v in copy.weights]
    if len(set(names)) != len(names):
        raise ConversionError(
            "tpushim's JAX engine cannot copy this model eagerly with the names stock's "
            f"checkpoints give its weights (two weights named alike: {sorted(names)[:6]}). Give "
            "its layers unique names, or use engine='strategy' (TPUSHIM_ENGINE=strategy)."
        )
    return copy


def _in_programs_shapes(loss):
    """A loss the program gave compile(), its own code run as the program built it (its
    ``shape[1].value``); a name as it is."""
    if isinstance(loss, tf.keras.losses.Loss):
        return _tfprivate.keras_compile.loss_in_programs_shapes(loss)
    if callable(loss):
        return _tfprivate.graph.in_programs_shapes(loss)
    return loss


def start_values(keras_model, custom_objects, warm_start_path):
    """Variable name -> the value stock's estimator starts the program's model from: its
    variables' values where the program initialised them (read in its session), else those of
    stock's first checkpoint (``warm_start_path``, the trainable weights: stock warm-starts
    from them), else {} (the copy's own initializers: stock's, where it warm-starts from none).
    In the program's graph mode."""
    if _tfprivate.estimator.any_weight_initialized(keras_model):
        weights = list(keras_model.weights)
        read = tf.compat.v1.keras.backend.batch_get_value(weights)
    elif warm_start_path is not None:
        weights = list(keras_model.trainable_weights)
        read = _tfprivate.estimator.first_checkpoint_values(
            keras_model, custom_objects, warm_start_path
        )
    else:
        return {}
    return {_name(v): value for v, value in zip(weights, read)}


def _name(variable):
    return variable.name.split(":")[0]
