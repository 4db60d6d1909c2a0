"""The Keras model's training step in TensorFlow, as one traced function of the global batch,
converted to JAX with ``tf2jax``.

The function takes ``(features, labels, sample_weights, pad)``: lists in the model's input and
output order, the sample weights one per output (ones where the input has none), and ``pad``
the [batch] padding weight (1 for a real row, 0 for a row padding a short batch: as
:func:`tpushim._padding.pad_batch` makes it). It returns ``(loss, outputs)``: the loss stock
trains on for the batch's real rows (:func:`tpushim._losses.shard_loss` on the whole global
batch as one shard: a mean divides by the real rows, padding rows weigh 0) and the model's
outputs. BatchNormalization layers training on batch statistics take them over the real rows
(:func:`tpushim._batchnorm.real_rows_call`, the TPU arithmetic with the whole batch as one
shard), and their moving statistics' updates become the converted function's updated params.

This first step trains the terms the engine's proof covers, and refuses the others by name
before anything runs: every output's loss a mean of per-example values (``ROWS`` of
:mod:`tpushim._loss_kinds`, reduction ``SUM_OVER_BATCH_SIZE``), with or without sample weights;
weight regularizers. Refused for now: SUM reductions, one-number custom losses, losses a layer
adds from its inputs (``add_loss``, activity regularizers), Keras masks, subclassed models.
"""

import dataclasses
import types

import numpy as np
import tensorflow as tf

from tpushim import _batchnorm, _loss_kinds, _losses, _tfprivate
from tpushim._errors import ConversionError
from tpushim._jax import _draws

Reduction = tf.keras.losses.Reduction


def _refuse(what, why=None):
    raise ConversionError(
        f"tpushim's JAX engine does not train {what} yet"
        + (f" ({why})" if why else "")
        + ". Train this model with engine=strategy."
    )


@dataclasses.dataclass(frozen=True)
class Traced:
    """A model's training function converted to JAX at one batch shape.

    Attributes:
      fn: ``fn(params, features, labels, sample_weights, pad) -> ((loss, outputs), params)``.
      params: variable name -> its value when converted (a ``tf2jax`` Variable: ``trainable``).
      trainable: the names of the trainable params, in the model's ``trainable_weights`` order.
      state: the names of the other params the step updates (moving statistics), model order.
      draws: the step's random draws (:class:`._draws.Draw`), stock's; ``fn`` then takes them
        after ``pad`` (a list of arrays, one per draw).
    """

    fn: object
    params: dict
    trainable: tuple
    state: tuple
    draws: tuple = ()


def _loss_terms(keras_model, custom_objects):
    """Per output: (name, Loss object or None, loss weight); refuses what this step cannot train."""
    if _tfprivate.keras.is_subclassed(keras_model) or not keras_model.outputs:
        _refuse("subclassed models")
    plan = _loss_kinds.plan(keras_model, custom_objects)
    names = keras_model.output_names
    args = _tfprivate.keras.compile_args(keras_model)
    with tf.keras.utils.custom_object_scope(custom_objects or {}):
        losses = _tfprivate.keras_compile.prepare_loss_functions(args.get("loss"), names)
    weights = _loss_kinds.output_loss_weights(args.get("loss_weights"), names)
    terms = []
    for name, loss_obj in zip(names, losses):
        kind = plan.outputs.get(name)
        if loss_obj is None or kind == _loss_kinds.UNWEIGHTED:
            terms.append((name, None, weights[name]))
            continue
        what = f"the loss of output {name!r} ({getattr(loss_obj, 'name', type(loss_obj).__name__)})"
        if kind != _loss_kinds.ROWS:
            _refuse(what, "one number for the batch, not a mean of per-example values")
        if _losses._reduction(loss_obj) != Reduction.SUM_OVER_BATCH_SIZE:
            _refuse(what, f"reduction {loss_obj.reduction}, not a mean")
        terms.append((name, loss_obj, weights[name]))
    for layer in _tfprivate.keras.all_layers(keras_model):
        if _tfprivate.keras_compile.layer_input_losses(layer):
            _refuse(
                f"the loss layer {layer.name!r} adds from its inputs (add_loss, an activity regularizer)"
            )
    return terms


def _endpoint(name, loss_obj, weight, y_true, y_pred, sample_weight):
    """One output's loss as :func:`tpushim._losses.shard_loss` reads a Keras training endpoint."""
    return types.SimpleNamespace(
        output_name=name,
        loss_fn=loss_obj,
        loss_weight=weight,
        output=y_pred,
        sample_weight=sample_weight,
        training_target=types.SimpleNamespace(target=y_true),
    )


def _outputs_list(keras_model, outputs):
    if isinstance(outputs, dict):
        return [outputs[name] for name in keras_model.output_names]
    return tf.nest.flatten(outputs)


def training_function(
    keras_model, custom_objects=None, training=True, seeds=None, global_batch=None
):
    """The model's training step as a ``tf.function`` of ``(features, labels, sample_weights,
    pad, draws=None)`` returning ``(loss, outputs)`` (see the module). Refuses what it cannot
    train. ``training=False``: the same loss on the model's inference outputs (an evaluation
    step: BatchNormalization on its moving statistics, no dropout).

    Training, its random draws are stock's (:mod:`._draws`): ``seeds`` the ``(graph seed,
    op-seed counter)`` stock's graph calls the model with (None: the trace's own); traced
    without ``draws``, each stateful random op is kept and recorded (:func:`convert` reads the
    records), traced with ``draws`` (tensors, one per record) the step takes them as inputs."""
    terms = _loss_terms(keras_model, custom_objects)
    recorded = {}  # the trace's graph -> its draws (a trace without ``draws``)

    def identity(t):  # the whole global batch is one shard: its sums are the global ones
        return t

    @tf.function(autograph=False)
    def train(features, labels, sample_weights, pad, draws=None):
        inputs = tf.nest.pack_sequence_as(keras_model.input, list(features))
        record = recorded.setdefault(tf.compat.v1.get_default_graph(), [])
        if not training:
            with _draws.taken(keras_model, None, None, _draws.UNUSED, record):
                outputs = _outputs_list(keras_model, keras_model(inputs, training=False))
        else:
            with (
                _draws.taken(keras_model, global_batch, seeds, draws, record),
                _tfprivate.keras.batchnorm_call_hooked(),
                _tfprivate.keras.batchnorm_call_using(
                    _batchnorm.real_rows_call(pad, True, identity)
                ),
            ):
                outputs = _outputs_list(keras_model, keras_model(inputs, training=True))
        endpoints = []
        for (name, loss_obj, weight), y_pred, y_true, sw in zip(
            terms, outputs, labels, sample_weights
        ):
            if loss_obj is None:
                continue
            if getattr(y_pred, "_keras_mask", None) is not None:
                _refuse(f"the Keras mask of output {name!r}")
            if y_true.shape.rank == 1 and y_pred.shape.rank == 2:  # as Keras's LossesContainer
                y_true = tf.expand_dims(y_true, -1)
            endpoints.append(_endpoint(name, loss_obj, weight, y_true, y_pred, sw))
        kinds = [_loss_kinds.ROWS] * len(endpoints)
        loss = _losses.shard_loss(endpoints, kinds, [None] * len(endpoints), [], {}, pad, 1, False)
        loss = tf.cast(loss, tf.float32)
        for regularizer in keras_model.losses:  # weight regularizers: once, as stock adds them
            loss += tf.cast(regularizer, tf.float32)
        return loss, outputs

    train.tpushim_recorded = recorded
    return train


def predict_function(keras_model):
    """The model's inference outputs as a ``tf.function`` of ``features`` (a list in the
    model's input order): a list in its output order."""

    recorded = {}  # the trace's graph -> its draws, made zeros (see convert_inference)

    @tf.function(autograph=False)
    def predict(features):
        inputs = tf.nest.pack_sequence_as(keras_model.input, list(features))
        record = recorded.setdefault(tf.compat.v1.get_default_graph(), [])
        with _draws.taken(keras_model, None, None, _draws.UNUSED, record):
            return _outputs_list(keras_model, keras_model(inputs, training=False))

    predict.tpushim_recorded = recorded
    return predict


def convert_inference(keras_model, fn, *arrays):
    """``fn`` (an evaluation :func:`training_function` or :func:`predict_function`) converted
    with ``tf2jax`` at the shapes of ``arrays``: ``(jax function, its params' names)``; the
    function is ``f(params, *arrays) -> (result, params)``."""
    import tf2jax

    from tpushim._jax import _ops  # noqa: F401 (registers the ops tf2jax lacks)

    def spec(a):
        a = np.asarray(a)
        return tf.TensorSpec(a.shape, tf.as_dtype(a.dtype))

    args = tf.nest.map_structure(spec, arrays)
    concrete = fn.get_concrete_function(*args)
    zeros = fn.tpushim_recorded.get(concrete.graph, [])
    outputs = concrete.graph.outputs
    if zeros and any(t in _tfprivate.graph.reachable_from(zeros, outputs) for t in outputs):
        _refuse(
            "random draws in evaluation or prediction (a Lambda that draws whatever the mode)",
            "; ".join(sorted({z.op.name.rsplit("/", 1)[0] for z in zeros}))[:300],
        )
    _refuse_random(concrete.graph, "in evaluation or prediction")
    try:
        with tf2jax.override_config("convert_custom_gradient", False):
            jax_fn, params = tf2jax.convert(fn, *args)
    except Exception as e:  # an op tf2jax has no JAX for: named
        raise ConversionError(
            f"tpushim cannot convert this model's inference to JAX: {type(e).__name__}: "
            f"{' '.join(str(e).split())[:300]}. Train it with engine=strategy."
        ) from e
    return jax_fn, tuple(params)


_RANDOM_OPS = ("Random", "TruncatedNormal", "Multinomial", "RngReadAndSkip", "RngSkip")


def _refuse_random(graph, where="in training"):
    """Refuses a step that still draws random numbers after :mod:`._draws` took stock's
    stateful draws as inputs: stateless or ``tf.random.Generator`` draws, shuffles, multinomials
    in training; any draw in evaluation or prediction (a ``Lambda`` that draws whatever the
    mode). A draw that differs from stock's is refused, not made silently."""
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes += list(function.node_def)
    drawn = sorted(
        {
            f"{node.op} in {node.name.rsplit('/', 1)[0] or node.name}"
            for node in nodes
            if any(word in node.op for word in _RANDOM_OPS)
        }
    )
    if drawn:
        _refuse(
            f"these random draws {where} (only Keras's and tf.random's stateful draws in "
            "training are made as stock makes them)",
            "; ".join(drawn[:4]),
        )


def convert(keras_model, train, features, labels, sample_weights, pad):
    """``train`` (:func:`training_function`) converted with ``tf2jax`` at the shapes of the
    example arrays given: a :class:`Traced`."""
    import tf2jax

    from tpushim._jax import _ops  # noqa: F401 (registers the ops tf2jax lacks)

    def spec(a):
        a = np.asarray(a)
        return tf.TensorSpec(a.shape, tf.as_dtype(a.dtype))

    args = tf.nest.map_structure(spec, (list(features), list(labels), list(sample_weights), pad))
    graph = train.get_concrete_function(*args).graph
    draws = tuple(getattr(train, "tpushim_recorded", {}).get(graph, ()))
    if draws:  # traced again taking them as inputs (stock's, drawn on the host)
        args = (*args, [tf.TensorSpec(d.shape, tf.as_dtype(d.dtype)) for d in draws])
        graph = train.get_concrete_function(*args).graph
    _refuse_random(graph)
    try:
        # JAX differentiates every op itself: a TensorFlow gradient registered for an op (the
        # core's fused BatchNormalization over real rows) reads the op, which tf2jax has not.
        with tf2jax.override_config("convert_custom_gradient", False):
            fn, params = tf2jax.convert(train, *args)
    except Exception as e:  # an op tf2jax has no JAX for: named
        raise ConversionError(
            f"tpushim cannot convert this model's training step to JAX: {type(e).__name__}: "
            f"{' '.join(str(e).split())[:300]}. Train it with engine=strategy."
        ) from e
    by_name = {v.name.split(":")[0]: v for v in keras_model.weights}
    missing = [name for name in params if name not in by_name]
    if missing:
        raise ConversionError(
            f"tpushim cannot map the converted step's variables {missing} to the Keras model's "
            "weights (two weights of one name?). Give the model's layers unique names."
        )
    # The model's trainable weights, not the variables' own flag: a frozen layer's
    # (layer.trainable = False) variables keep trainable=True.
    trained = {v.name.split(":")[0] for v in keras_model.trainable_weights}
    order = [v.name.split(":")[0] for v in keras_model.weights]
    trainable = tuple(n for n in order if n in params and n in trained)
    state = tuple(n for n in order if n in params and n not in trained)
    return Traced(fn, params, trainable, state, draws)
