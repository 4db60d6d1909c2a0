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

Every loss kind the other engines train (:mod:`tpushim._loss_kinds`), with stock's arithmetic
over the real rows (:func:`tpushim._losses.shard_loss`): means and SUM reductions of per-example
losses, with or without sample weights; one-number custom losses (evaluated per row, combined
as their degree says); Keras masks weighing an output's loss (Masking, ``mask_zero``); weight
regularizers, once; losses layers add from their inputs, each row's value that of the model on
that row alone (an activity regularizer's from the output the forward pass regularized, an
``add_loss`` in a call from the model run on each row, vectorised), padding rows weighing 0.
Refused by name: reduction NONE (stock's own failure), an ``add_loss`` in a call beside
BatchNormalization, [batch] labels for a [batch, 1] output with a loss other than a mean of
per-example values, subclassed models.
"""

import contextlib
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
    """(per output (name, Loss object or None, loss weight, kind), the model's
    :class:`tpushim._loss_kinds.LossPlan`); refuses what this step cannot train."""
    if _tfprivate.keras.is_subclassed(keras_model) or not keras_model.outputs:
        _refuse(
            "subclassed models",
            "the step calls the model in a traced function and reads its outputs, masks and "
            "added losses by the graph network's layers; a subclassed model has none until "
            "it is called",
        )
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
            terms.append((name, None, weights[name], None))
            continue
        # reduction NONE: refused with stock's own reason (stock fails at its first step)
        _losses._check_reduction(_endpoint(name, loss_obj, weights[name], None, None, None))
        terms.append((name, loss_obj, weights[name], kind))
    _input_losses_checked(keras_model)
    return terms, plan


def _input_losses_checked(keras_model):
    """Refuses a loss a layer adds in its call (not an activity regularizer's) in a model with
    BatchNormalization: the step evaluates such a loss on each example alone, where
    BatchNormalization would normalise by that example alone (as the other engines refuse it)."""
    adding, normalizing = _loss_kinds.input_losses_beside_batchnorm(keras_model)
    if adding and normalizing:
        _refuse(
            f"a loss a layer adds in its call from its inputs (add_loss: {', '.join(adding)}) "
            f"in a model with BatchNormalization ({', '.join(normalizing)})",
            "it evaluates such a loss on each example alone, where BatchNormalization would "
            "normalise by that example alone; an activity_regularizer of the layer whose output "
            "it reads is taken from the model's own forward pass",
        )


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


class _ActivityRecorder:
    """A layer's activity regularizer that also notes each output it is called on, with the
    index the loss Keras then adds from it takes among the layer's call losses: the step reads
    those outputs, from the model's own forward pass, to evaluate the term per row. Set on the
    user's layer only while the step is traced (:func:`_activity_recorded`)."""

    def __init__(self, layer, regularizer):
        self.layer, self.regularizer, self.outputs = layer, regularizer, []

    def __call__(self, output):
        self.outputs.append((len(_tfprivate.keras_compile.layer_call_losses(self.layer)), output))
        return self.regularizer(output)


@contextlib.contextmanager
def _activity_recorded(keras_model):
    """(layer name, index among its call losses) -> (regularizer, the output it regularized),
    filled by the model's call inside the block; the layers' regularizers restored after."""
    recorders = [
        _ActivityRecorder(layer, layer.activity_regularizer)
        for layer in _tfprivate.keras.all_layers(keras_model)
        if getattr(layer, "activity_regularizer", None) is not None
    ]
    found = {}
    for recorder in recorders:
        recorder.layer.activity_regularizer = recorder
    try:
        yield found
    finally:
        for recorder in recorders:
            recorder.layer.activity_regularizer = recorder.regularizer
            found.update(
                {(recorder.layer.name, i): (recorder.regularizer, o) for i, o in recorder.outputs}
            )


def _per_row_activity(regularizer, output):
    """[rows] values of an activity regularizer's term, each row's that of a batch of that row
    alone (:func:`tpushim._losses.per_row_activity`); a custom regularizer vectorised over the
    rows, not in a loop (JAX cannot differentiate a while loop backwards)."""
    if type(regularizer) in _losses._BUILTIN_ACTIVITY:
        return _losses.per_row_activity(regularizer, output)
    output = tf.cast(output, tf.float32)
    return tf.vectorized_map(
        lambda row: tf.reshape(tf.cast(regularizer(row[None]), tf.float32), []),
        output,
        fallback_to_while_loop=False,
    )


def _call_losses(keras_model):
    """(layer name, index) -> the loss each layer added from its inputs in the latest call."""
    return {
        (layer.name, i): loss
        for layer in _tfprivate.keras.all_layers(keras_model)
        for i, loss in enumerate(_tfprivate.keras_compile.layer_call_losses(layer))
    }


def _input_losses(keras_model, inputs, activity, training):
    """(layer name, index) -> [rows] values of every loss a layer added from its inputs in the
    call just made, each row's that of the model called on that row alone: an activity
    regularizer's from the output the call regularized, any other (``add_loss`` in a call) from
    the model run on each row alone, vectorised over the rows (as tf-keras's own call: no
    BatchNormalization, refused beside such a loss)."""
    keys = list(_call_losses(keras_model))
    values = {key: _per_row_activity(*activity[key]) for key in keys if key in activity}
    rest = [key for key in keys if key not in values]
    if rest:

        def per_row(row):
            _tfprivate.keras.call_as_stock(
                keras_model, tf.nest.map_structure(lambda x: x[None], row), training
            )
            losses = _call_losses(keras_model)
            return [tf.reshape(tf.cast(losses[key], tf.float32), []) for key in rest]

        rows = tf.vectorized_map(per_row, inputs, fallback_to_while_loop=False)
        values.update(zip(rest, rows))
    return [(key, values[key]) for key in keys]


def _labels_for(name, loss_obj, kind, y_true, y_pred):
    """[batch] labels of a [batch, 1] output read as [batch, 1] (Keras squeezes the output
    instead: the same per-example values for a mean), refused where that would change the
    term (a SUM reduction's or a one-number loss's: stock's squeezed output makes it another)."""
    if not (y_true.shape.rank == 1 and y_pred.shape.rank == 2):
        return y_true
    if kind != _loss_kinds.ROWS or _losses._reduction(loss_obj) != Reduction.SUM_OVER_BATCH_SIZE:
        _refuse(
            f"[batch] labels for the [batch, 1] output {name!r} with a loss that is not a mean "
            "of per-example values",
            "stock squeezes the output first, which changes such a loss; give the labels the "
            "output's shape, labels[:, None] in the input_fn",
        )
    return tf.expand_dims(y_true, -1)


def _model_inputs(keras_model, features, fed):
    """The traced function's features (a list) as the model takes them: in its inputs'
    structure, or the host's fed tensors by key (``fed``: a :class:`tpushim._jax._host.HostFeed`)."""
    if fed is not None:
        return fed.inputs(features)
    return tf.nest.pack_sequence_as(keras_model.input, list(features))


def _from_host(keras_model, fed):
    """While tracing: the model run from the host's tensors where ``fed`` gives them."""
    return fed.calling(keras_model) if fed is not None else contextlib.nullcontext()


def training_function(
    keras_model,
    custom_objects=None,
    training=True,
    weighted=True,
    seeds=None,
    global_batch=None,
    fed=None,
    logits=False,
    full=False,
):
    """The model's training step as a ``tf.function`` of ``(features, labels, sample_weights,
    pad, draws=None)`` returning ``(loss, outputs)`` (see the module). Refuses what it cannot
    train. ``full``: for a batch without padding rows, ``pad`` unread: the loss Keras's plain
    mean, BatchNormalization the padded step's arithmetic on a constant weight of ones, which
    XLA folds into the batch's plain moments (the padded step's numbers on such a batch,
    without its padding-weight multiplies and the all-reduce of its real rows' count; Keras's
    own call instead converted to more bytes accessed than the padded step's). ``training=False``: the same loss on the model's inference outputs (an evaluation
    step: BatchNormalization on its moving statistics, no dropout). ``weighted=False``: the
    input has no sample weights (those given are ones, unread): Keras's unweighted loss, whose
    one-number terms are not multiplied by a mean weight. ``fed``: the model's host part
    (:class:`tpushim._jax._host.HostFeed`): ``features`` are its fed tensors, the model run
    from them. ``logits``: it returns ``(loss, outputs, logits)``, per output what Keras's
    crossentropies read from it besides its values (its ``_keras_logits``, or a Sigmoid's or
    Softmax's input: :func:`tpushim._tfprivate.keras_compile.output_logits`; an empty tensor
    where none), how each is read (or None) in the function's ``tpushim_logits_how`` once
    traced: the metrics on the host compute from them as stock's graph does.

    Training, its random draws are stock's (:mod:`._draws`): ``seeds`` the ``(graph seed,
    op-seed counter)`` stock's graph calls the model with (None: the trace's own); traced
    without ``draws``, each stateful random op is kept and recorded (:func:`convert` reads the
    records), traced with ``draws`` (tensors, one per record) the step takes them as inputs."""
    terms, plan = _loss_terms(keras_model, custom_objects)
    recorded = {}  # the trace's graph -> its draws (a trace without ``draws``)
    logits_how = []  # per output, how Keras's crossentropies read its logits (at the trace)

    def identity(t):  # the whole global batch is one shard: its sums are the global ones
        return t

    @tf.function(autograph=False)
    def train(features, labels, sample_weights, pad, draws=None):
        with _from_host(keras_model, fed):
            return _train(features, labels, sample_weights, pad, draws)

    def _train(features, labels, sample_weights, pad, draws):
        inputs = _model_inputs(keras_model, features, fed)
        record = recorded.setdefault(tf.compat.v1.get_default_graph(), [])
        with _activity_recorded(keras_model) as activity:
            if not training:
                with _draws.taken(keras_model, global_batch, seeds, _inference_feed(draws), record):
                    outputs = _outputs_list(
                        keras_model, _tfprivate.keras.call_as_stock(keras_model, inputs, False)
                    )
            else:
                with (
                    _draws.taken(keras_model, global_batch, seeds, draws, record),
                    _tfprivate.keras.batchnorm_call_hooked(),
                    _tfprivate.keras.batchnorm_call_using(
                        _batchnorm.real_rows_call(_ones(pad) if full else pad, True, identity)
                    ),
                ):
                    outputs = _outputs_list(
                        keras_model, _tfprivate.keras.call_as_stock(keras_model, inputs, True)
                    )
        masks = [getattr(o, "_keras_mask", None) for o in outputs]
        # as stock's clone has them: without a model's own add_loss of a function (dropped)
        regularizers = _tfprivate.keras_compile.weight_regularizers(keras_model, models_own=False)
        added = _input_losses(keras_model, inputs, activity, training)
        endpoints, kinds, endpoint_masks = [], [], []
        for (name, loss_obj, weight, kind), y_pred, y_true, sw, mask in zip(
            terms, outputs, labels, sample_weights, masks
        ):
            if loss_obj is None:
                continue
            y_true = _labels_for(name, loss_obj, kind, y_true, y_pred)
            sw = sw if weighted else None
            endpoints.append(_endpoint(name, loss_obj, weight, y_true, y_pred, sw))
            kinds.append(kind)
            endpoint_masks.append(mask)
        if full:  # every row real: the loss a plain mean, the terms below on a constant
            pad = _ones(pad)
        loss = _losses.shard_loss(
            endpoints, kinds, endpoint_masks, [], {}, None if full else pad, 1, False
        )
        read = [_tfprivate.keras_compile.output_logits(o) for o in outputs] if logits else []
        logits_how[:] = [how for how, _ in read]
        loss = tf.cast(loss, tf.float32)
        for regularizer in regularizers:  # weight regularizers: once, as stock adds them
            loss += tf.cast(regularizer, tf.float32)
        rows = tf.reduce_sum(tf.cast(pad, tf.float32))
        for key, values in added:  # T(n rows) = n**(p - 1) * the sum of its rows' values
            degree = (plan.added or {}).get(key, _loss_kinds.MEAN)
            total = tf.reduce_sum(values * tf.cast(pad, tf.float32))
            if degree.p >= 1:  # (a power of no rows is 0; 1 / no rows is taken as 0)
                loss += degree.of_rows(total, rows)
            else:
                loss += degree.of_rows_inverse(total, tf.math.divide_no_nan(1.0, rows))
        if logits:
            return loss, outputs, [tf.zeros([0]) if how is None else lg for how, lg in read]
        return loss, outputs

    train.tpushim_recorded = recorded
    train.tpushim_logits_how = logits_how
    return train


def _ones(pad):
    """A padding weight of ones at ``pad``'s static shape (its values unread): a constant, which
    XLA folds out of the arithmetic that reads it."""
    return tf.ones(pad.shape, tf.float32)


def _inference_feed(draws):
    """``_draws.taken``'s feed of an inference trace by its ``draws`` argument: None, each draw
    made zeros (:data:`._draws.UNUSED`); ``[]``, each kept and recorded; tensors, taken."""
    if draws is None:
        return _draws.UNUSED
    return list(draws) or None


def predict_function(keras_model, fed=None, seeds=None, global_batch=None):
    """The model's inference outputs as a ``tf.function`` of ``features`` (a list in the
    model's input order, or ``fed``'s: :func:`training_function`) and ``draws`` (see
    :func:`convert_inference`): a list in its output order. ``seeds``, ``global_batch``: as
    :func:`training_function`'s, for draws the outputs read (stock's prediction graph's)."""

    recorded = {}  # the trace's graph -> its draws (made zeros or kept: see convert_inference)

    @tf.function(autograph=False)
    def predict(features, draws=None):
        with _from_host(keras_model, fed):
            inputs = _model_inputs(keras_model, features, fed)
            record = recorded.setdefault(tf.compat.v1.get_default_graph(), [])
            with _draws.taken(keras_model, global_batch, seeds, _inference_feed(draws), record):
                return _outputs_list(
                    keras_model, _tfprivate.keras.call_as_stock(keras_model, inputs, False)
                )

    predict.tpushim_recorded = recorded
    return predict


def convert_inference(keras_model, fn, *arrays, with_draws=False):
    """``fn`` (an evaluation :func:`training_function` or :func:`predict_function`) converted
    with ``tf2jax`` at the shapes of ``arrays``: ``(jax function, its params' names)``; the
    function is ``f(params, *arrays) -> (result, params)``.

    A draw no output reads (a ``Lambda`` that draws whatever the mode) is made zeros. One an
    output reads: refused, or (``with_draws``: the caller makes stock's draws on the host, as
    :class:`._draws.HostDraws`) taken as the function's last argument, ``(jax function, its
    params' names, the draws)``."""
    import tf2jax

    from tpushim._jax import _ops  # (registers the ops tf2jax lacks)

    def spec(a):
        a = np.asarray(a)
        return tf.TensorSpec(a.shape, tf.as_dtype(a.dtype))

    args = tf.nest.map_structure(spec, arrays)
    concrete = fn.get_concrete_function(*args)
    zeros = fn.tpushim_recorded.get(concrete.graph, [])
    outputs = concrete.graph.outputs
    draws = ()
    if zeros and any(t in _tfprivate.graph.reachable_from(zeros, outputs) for t in outputs):
        if not with_draws:
            _refuse(
                "random draws in evaluation or prediction (a Lambda that draws whatever the mode)",
                "; ".join(sorted({z.op.name.rsplit("/", 1)[0] for z in zeros}))[:300],
            )
        # traced keeping them (stock's seeds recorded), then taking them as inputs
        kept = fn.get_concrete_function(*args, []).graph
        draws = _draws.with_trips(fn.tpushim_recorded.get(kept, ()), kept)
        args = (*args, [tf.TensorSpec(d.fed_shape, tf.as_dtype(d.dtype)) for d in draws])
        concrete = fn.get_concrete_function(*args)
    _refuse_random(concrete.graph, "in evaluation or prediction")
    _refuse_value_shapes(concrete.graph)
    try:
        with (
            tf2jax.override_config("convert_custom_gradient", False),
            _ops.static_bins(concrete.graph),
        ):
            jax_fn, params = tf2jax.convert(fn, *args)
    except Exception as e:  # an op tf2jax has no JAX for: named
        raise ConversionError(
            f"tpushim cannot convert this model's inference to JAX: {type(e).__name__}: "
            f"{' '.join(str(e).split())[:300]}. Train it with engine=strategy."
        ) from e
    if with_draws:
        return jax_fn, tuple(params), draws
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


#: Ops whose output's shape depends on their input's values (``tf.boolean_mask``'s and
#: ``tf.where(condition)``'s ``Where``, ``tf.unique``, ...): XLA compiles static shapes only.
_VALUE_SHAPED_OPS = (
    "Where",
    "Unique",
    "UniqueV2",
    "UniqueWithCounts",
    "UniqueWithCountsV2",
    "DynamicPartition",
    "ListDiff",
)


def _refuse_value_shapes(graph):
    """Refuses a step whose shapes depend on the batch's values (traced at static shapes, an op
    of :data:`_VALUE_SHAPED_OPS` whose output's shape TensorFlow does not know), naming the ops:
    JAX would fail compiling it, with no word of which op or layer."""
    found = sorted(
        {
            f"{op.type} in {op.name.rsplit('/', 1)[0] or op.name}"
            for op in graph.get_operations()
            if op.type in _VALUE_SHAPED_OPS
            and not all(o.shape.is_fully_defined() for o in op.outputs)
        }
    )
    if found:
        _refuse(
            "a step whose shapes depend on the batch's values (XLA compiles static shapes only)",
            "; ".join(found[:4]),
        )


def _loops(graph):
    """The names of ``graph``'s loops (``While``/``StatelessWhile``, in its functions too)."""
    graph_def = graph.as_graph_def()
    named = [("", node) for node in graph_def.node]
    for function in graph_def.library.function:
        named += [(function.signature.name + "/", node) for node in function.node_def]
    return sorted({f"{where}{n.name}" for where, n in named if n.op in ("While", "StatelessWhile")})


def _refuse_unbounded_loops(keras_model, loops, fn, params, args):
    """Refuses a training step with a loop whose number of iterations its values decide (a
    ``tf.while_loop`` on the data): :mod:`_ops` runs a loop (a recurrent layer's over its time
    steps) as ``lax.scan`` over the trip count its counters fix before it runs, which JAX
    differentiates backwards; such a loop has none. Found tracing the step at its shapes, named
    here (the op, the recurrent layers) rather than at the first step."""
    import jax

    from tpushim._jax import _ops

    def spec(a):
        return jax.ShapeDtypeStruct(
            tuple(a.shape),
            jax.dtypes.canonicalize_dtype(getattr(a.dtype, "as_numpy_dtype", a.dtype)),
        )

    shapes = {k: spec(np.asarray(v)) for k, v in params.items()}
    try:
        with _ops.loops_bounded():
            jax.eval_shape(fn, shapes, *tf.nest.map_structure(spec, args))
    except _ops.UnboundedLoop as e:
        recurrent = [
            layer.name
            for layer in _tfprivate.keras.all_layers(keras_model)
            if isinstance(layer, tf.keras.layers.RNN)
            or type(layer).__name__ in ("LSTM", "GRU", "SimpleRNN", "Bidirectional")
        ]
        layers = f" of layers {', '.join(recurrent)}" if recurrent else ""
        _refuse(
            f"a while loop{layers} (While {e}; the loops: {', '.join(loops[:3])})",
            "JAX cannot differentiate a loop backwards unless its number of iterations is known "
            "before it runs",
        )


def convert(keras_model, train, features, labels, sample_weights, pad):
    """``train`` (:func:`training_function`) converted with ``tf2jax`` at the shapes of the
    example arrays given: a :class:`Traced`."""
    import tf2jax

    from tpushim._jax import _ops  # (registers the ops tf2jax lacks)

    def spec(a):
        a = np.asarray(a)
        return tf.TensorSpec(a.shape, tf.as_dtype(a.dtype))

    args = tf.nest.map_structure(spec, (list(features), list(labels), list(sample_weights), pad))
    graph = train.get_concrete_function(*args).graph
    draws = tuple(getattr(train, "tpushim_recorded", {}).get(graph, ()))
    if draws:  # traced again taking them as inputs (stock's, drawn on the host)
        draws = _draws.with_trips(draws, graph)
        args = (*args, [tf.TensorSpec(d.fed_shape, tf.as_dtype(d.dtype)) for d in draws])
        graph = train.get_concrete_function(*args).graph
    _refuse_random(graph)
    _refuse_value_shapes(graph)
    loops = _loops(graph)
    try:
        # JAX differentiates every op itself: a TensorFlow gradient registered for an op (the
        # core's fused BatchNormalization over real rows) reads the op, which tf2jax has not.
        with tf2jax.override_config("convert_custom_gradient", False), _ops.static_bins(graph):
            fn, params = tf2jax.convert(train, *args)
    except Exception as e:  # an op tf2jax has no JAX for: named
        raise ConversionError(
            f"tpushim cannot convert this model's training step to JAX: {type(e).__name__}: "
            f"{' '.join(str(e).split())[:300]}. Train it with engine=strategy."
        ) from e
    if loops:
        _refuse_unbounded_loops(keras_model, loops, fn, params, args)
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
