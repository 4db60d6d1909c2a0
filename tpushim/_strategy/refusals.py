"""What the strategy engine refuses before anything is written or traced, with its texts (stock's
where stock refuses it too): a ``tf.compat.v1.train`` optimizer it cannot train with as stock
does, a ``metric_names_map`` whose keys are not the compiled metrics' names, features or labels
that do not cover the model's inputs or outputs, sample weights stock's graph refuses. The model's
own refusals are :func:`tpushim._strategy.plan.make_plan`'s, the step's
:mod:`tpushim._strategy.xla_check`'s, the host part's :mod:`tpushim._host_part`'s."""

import tensorflow as tf

from tpushim import _metric_names, _padding, _tfprivate
from tpushim._errors import ConversionError
from tpushim._strategy import checkpoint as _strategy_checkpoint
from tpushim._strategy.clone import output_specs
from tpushim._strategy.element import _labels_list, _unpack


def check_metric_names_map(plan):
    """Stock's errors for a ``metric_names_map`` whose keys are not the names stock's model_fn
    gives the model's compiled metrics (raised by its train() and evaluate() calls alike)."""
    if plan.metric_names_map:
        _metric_names.mapped_metric_names(
            _strategy_checkpoint.stock_metric_names(plan), plan.metric_names_map
        )


def check_tf1_optimizer(optimizer):
    """Refuses, before anything is written, a ``tf.compat.v1.train`` optimizer the engine cannot
    train with exactly as stock does.

    Stock builds each call's graph and evaluates the optimizer's hyperparameters in it, with the
    estimator's global step as ``tf.compat.v1.train.get_global_step()``: a tensor or variable
    made eagerly before the conversion fails there ("Attempting to capture an EagerTensor"), a
    callable computing the rate from that global step trains (the engine binds its own step
    the same way: :func:`bind_global_step`). So each hyperparameter is evaluated here as stock
    would, in a fresh graph with a global step. An optimizer that replaces ``apply_gradients``
    (``SyncReplicasOptimizer``, ``CrossShardOptimizer``, a clipping wrapper) combines gradients
    across workers or TPU shards itself: under ``tf.distribute`` it would do so twice, or not.
    """
    name = f"tf.compat.v1.train optimizer {type(optimizer).__name__}"
    fix = (
        "Compile the model with a Keras optimizer (tf.keras.optimizers.legacy.SGD / Adam ...; "
        "a decaying rate as a tf.keras.optimizers.schedules.LearningRateSchedule, which steps "
        "with the estimator's global step), or use engine='tpuestimator' "
        "(TPUSHIM_ENGINE=tpuestimator) where TPUEstimator runs."
    )
    if type(optimizer).apply_gradients is not tf.compat.v1.train.Optimizer.apply_gradients:
        raise ConversionError(
            f"the strategy engine cannot train with {name}: it replaces apply_gradients, and "
            "tf.distribute sums the replicas' gradients in the base class's apply_gradients. " + fix
        )
    for hyper, value in _tfprivate.keras_compile.tf1_optimizer_hyperparameters(optimizer):
        with tf.Graph().as_default() as graph:
            tf.compat.v1.train.create_global_step()
            try:
                tf.convert_to_tensor(value() if callable(value) else value)
            except Exception as e:  # what stock's graph would raise, whatever it is
                raise ConversionError(
                    f"the strategy engine cannot train with {name}: its {hyper} "
                    f"({type(value).__name__}) cannot be evaluated in the estimator's graph, so "
                    f"the stock estimator cannot train with it either ({type(e).__name__}: "
                    f"{str(e)[:200]}); a tensor made before the conversion (a "
                    "tf.compat.v1.train.exponential_decay of a global step made eagerly) "
                    "is fixed at that value. " + fix
                ) from e
            made = [
                v.op.name for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
            ]
        if made != ["global_step"]:
            raise ConversionError(
                f"the strategy engine cannot train with {name}: its {hyper} makes variables "
                f"({', '.join(made[1:])}) each time it is evaluated. " + fix
            )


def _weighted_row_labels(name, loss_obj):
    # Stock's weighted_loss squeezes the [batch] weights to the loss's rank and fails at its
    # first step ("Can not squeeze dim[0], expected a dimension of 1, got 8").
    return ConversionError(
        f"output {name!r} has [batch] labels for its [batch, 1] output and sample weights: "
        f"Keras squeezes the output to [batch], so its loss "
        f"({getattr(loss_obj, 'name', type(loss_obj).__name__)}) is one number for the "
        "whole batch, which no per-example weight can weigh; the stock estimator fails on "
        'it too ("Can not squeeze dim[0], expected a dimension of 1"). Give the labels '
        "the output's shape, [batch, 1] (labels[:, None] in the input_fn)."
    )


def check_input_keys(plan, model, element_spec):
    """Refuses, before anything is written or traced, features (and labels) whose keys do not
    cover the model's inputs (outputs), with stock's error: keras_lib's
    ``_convert_estimator_io_to_keras``, run on placeholders of the input's specs (a trace of the
    step would bury it in its own error). A model fed by layers on the host takes their outputs:
    their check is the host's."""
    if plan.host is not None:
        return
    features, labels, _, _ = _unpack(element_spec, model.output_names)
    with tf.Graph().as_default():
        features, labels = (
            None
            if part is None
            else tf.nest.map_structure(
                lambda spec: tf.compat.v1.placeholder(spec.dtype, spec.shape), part
            )
            for part in (features, labels)
        )
        _tfprivate.estimator.convert_estimator_io_to_keras(model, features, labels)


def check_row_labels(model, terms, element_spec):
    """Refuses, before anything is written, sample weights stock's graph refuses (stock's error:
    :func:`tpushim._padding.check_sample_weight_shapes`), and sample weights on a loss that
    [batch] labels of a [batch, 1] output make one number for the batch
    (:func:`row_label_term`)."""
    _, labels, _, weights = _unpack(element_spec, model.output_names)
    if weights is not None:
        _padding.check_sample_weight_shapes(weights)
    outputs = output_specs(model)
    if labels is None or weights is None or not outputs:
        return
    labels = _labels_list(labels, model.output_names)
    for (name, loss_obj, _), output, label, weight in zip(terms, outputs, labels, weights):
        if loss_obj is None or weight is None or not isinstance(label, tf.TensorSpec):
            continue
        y_true = tf.zeros([2] + [d or 1 for d in label.shape.as_list()[1:]], label.dtype)
        y_pred = tf.zeros([2] + [d or 1 for d in output.shape.as_list()[1:]], output.dtype)
        if _padding.row_labels(y_true, y_pred) is y_true:
            continue
        if loss_obj.call(y_true, y_pred).shape.rank == 0:
            raise _weighted_row_labels(name, loss_obj)
