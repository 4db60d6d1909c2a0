"""The loss of one replica on the strategy engine, ``L_r``: the sum over replicas of these is
stock's training loss on the global batch.

Gradients: replica r differentiates ``L_r``, its rows' share of stock's loss on the global
batch (a mean's sum over its rows divided by the global batch's real rows; a sum as it is; a
custom one-number term per row, scaled by its degree: :mod:`tpushim._loss_kinds`); the Keras
optimizer sums the replicas' gradients (``all_reduce_sum_gradients``), so the applied gradient
is stock's on the global batch. Padding rows (a short batch padded to the global batch,
:mod:`tpushim._padding`) weigh 0 everywhere.
"""

import contextlib
import threading
import types

import tensorflow as tf

from tpushim import _loss_kinds, _losses, _padding, _tfprivate
from tpushim._strategy.element import _labels_list, _outputs_list
from tpushim._strategy.refusals import _weighted_row_labels

SUM = tf.distribute.ReduceOp.SUM


def _loss_objects(keras_model, custom_objects, names=None, host_outputs=None):
    """Per output (``names``: the model's), the Loss object stock's clone compiles (None: no
    loss), and its weight."""
    args = _tfprivate.keras.compile_args(keras_model)
    names = names or keras_model.output_names
    with tf.keras.utils.custom_object_scope(custom_objects):
        losses = _tfprivate.keras_compile.prepare_loss_functions(args.get("loss"), names)
    weights = args.get("loss_weights")
    if weights is None:
        weights = [1.0] * len(names)
    elif isinstance(weights, dict):
        weights = [weights.get(name, 1.0) for name in names]
    if _tfprivate.graph.for_graph_program():  # its shape[-1].value, as the program's graph sees
        losses = [
            None if x is None else _tfprivate.keras_compile.loss_in_programs_shapes(x)
            for x in losses
        ]
    host = host_outputs or ()  # computed on the host, weighing 0 (_host_part)
    return [(n, None if n in host else loss, w) for n, loss, w in zip(names, losses, weights)]


class _Endpoint:
    """One output's loss as :func:`tpushim._losses.shard_loss` reads a Keras training endpoint:
    the TPU path's arithmetic, on the strategy engine's eager tensors."""

    def __init__(self, name, loss_fn, loss_weight, y_true, y_pred, sample_weight):
        self.output_name, self.loss_fn, self.loss_weight = name, loss_fn, loss_weight
        self.output, self.sample_weight = y_pred, sample_weight
        self.training_target = types.SimpleNamespace(target=y_true)


@_tfprivate.graph.not_converted
def all_reduce_sum(value):
    """``value`` summed over the replicas (the replica context's all-reduce)."""
    return tf.distribute.get_replica_context().all_reduce(SUM, value)


@_tfprivate.graph.not_converted
def replica_loss(
    terms,
    kinds,
    outputs,
    labels,
    pad,
    replicas,
    model_losses,
    sample_weights=None,
    input_losses=(),
    sum_replicas=all_reduce_sum,
    known_rows=None,
):
    """``L_r``: the sum over replicas of these is stock's training loss on the global batch.

    The outputs' terms are the TPU path's ``L_s`` (:func:`tpushim._losses.shard_loss`: padding
    rows weigh 0, a mean divides by the global batch's real rows or unmasked elements, a sample
    weight and a mask weigh as Keras weighs them, a custom one-number loss is evaluated per row
    and scaled by its degree), whose mean over the replicas is stock's: ``L_r = L_s / S``.

    Args:
      terms: ``(output name, Loss object or None, weight)`` per output (:func:`_loss_objects`).
      kinds: output name -> :class:`tpushim._loss_kinds.LossKind` (:class:`Plan`).
      outputs, labels: the replica's model outputs and labels (lists, in output order); an
        output's Keras mask is its ``_keras_mask``.
      pad: the replica's [rows] padding weights.
      replicas: replicas in sync.
      model_losses: the model's weight regularizers (stock adds them once).
      sample_weights: per output, the replica's sample weights or None.
      input_losses: ``(Degree, [rows] values)`` per loss a layer adds from its inputs, each row's
        value that of a batch of that row alone (:meth:`_Run.input_losses`).
      sum_replicas: sums a tensor over the replicas (the identity on one replica alone).
      known_rows: the global batch's real rows where the input carries them
        (:func:`known_rows`), else None: counted by ``sum_replicas``.
    """
    sample_weights = sample_weights or [None] * len(terms)
    endpoints, term_kinds, masks = [], [], []
    for (name, loss_obj, weight), y_pred, y_true, sample_weight in zip(
        terms, outputs, labels, sample_weights
    ):
        if loss_obj is None:
            continue
        kind = kinds.get(name, _loss_kinds.ROWS)
        y_true, kind = row_label_term(name, loss_obj, kind, y_true, y_pred, sample_weight)
        endpoints.append(_Endpoint(name, loss_obj, weight, y_true, y_pred, sample_weight))
        term_kinds.append(kind)
        masks.append(getattr(y_pred, "_keras_mask", None))
    # The rows' count and the terms' counts: one collective, none where the input says them all.
    totals = _losses.Totals(known_rows)
    real_rows = totals.add(tf.reduce_sum(pad), known_rows)
    total = _losses.shard_loss(
        endpoints, term_kinds, masks, [], {}, pad, replicas, sum_replicas, totals
    ) / float(replicas)
    total = tf.cast(total, tf.float32)
    for added in model_losses:
        total += tf.cast(added, tf.float32) / replicas
    rows = real_rows(tf.float32)
    # The loss reads the counts' collective even where no term needs it (a SUM loss): every
    # step's collectives, in one chain, issued in the same order on every device.
    with tf.control_dependencies([rows]):
        total = tf.identity(total)
    if input_losses:  # T(n rows) = n**(degree - 1) * the sum of its rows' values, n global
        for degree, values in input_losses:
            total += degree.of_rows(tf.reduce_sum(tf.cast(values, tf.float32) * pad), rows)
    return total


@_tfprivate.graph.not_converted
def row_label_term(name, loss_obj, kind, y_true, y_pred, sample_weight):
    """(labels, kind) of an output's loss term as stock's graph computes it, for [batch] labels
    of a [batch, 1] output: Keras squeezes the output to [batch] before the loss function.

    A loss giving one value per row there (``lambda t, p: tf.abs(t - p)``) reads the labels as
    [batch, 1] (the same rows; padding weighs them out). One that reduces the last axis
    (``mse``, ``binary_crossentropy``, a SUM loss) gives one number for the batch: a term of
    the degree its value has on [batch] labels (:func:`tpushim._loss_kinds.row_label_kind`),
    evaluated per real row; a SUM loss is then the rows' mean, as stock's. Such a number times
    per-example sample weights is refused, as stock fails on it.
    """
    if _padding.row_labels(y_true, y_pred) is y_true or not kind.reads_rows():
        return _padding.row_labels(y_true, y_pred), kind
    if (
        _tfprivate.graph.user_code(loss_obj.call)(y_true, y_pred).shape.rank != 0
    ):  # one value per row
        return _padding.row_labels(y_true, y_pred), kind
    if sample_weight is not None:  # refused before the trace: check_row_labels
        raise _weighted_row_labels(name, loss_obj)
    shape = [None, *y_pred.shape.as_list()[1:]]
    where = f"loss of output {name!r} ({getattr(loss_obj, 'name', type(loss_obj).__name__)})"
    return y_true, _loss_kinds.row_label_kind(where, loss_obj, shape, y_pred.dtype)


@_tfprivate.graph.not_converted
def global_rows(pad):
    """Real rows of the global batch, summed over the replicas (each replica holds a slice)."""
    return all_reduce_sum(tf.reduce_sum(pad))


class _ActivityRecorder:
    """A layer's activity regularizer that also notes each output it is called on, with the
    index the loss Keras then adds from it takes among the layer's call losses: the engine
    reads those outputs, from the model's own forward pass, to evaluate the loss per row.

    Per thread: a MirroredStrategy runs each replica's function in a thread of its own, and
    they take turns at every all-reduce (a SyncBatchNormalization's among them)."""

    def __init__(self, layer, regularizer):
        self.layer, self.regularizer, self._local = layer, regularizer, threading.local()

    @property
    def outputs(self):
        if not hasattr(self._local, "outputs"):
            self._local.outputs = []
        return self._local.outputs

    def __call__(self, output):
        self.outputs.append((len(_tfprivate.keras_compile.layer_call_losses(self.layer)), output))
        return self.regularizer(output)


@_tfprivate.graph.not_converted
def _recorders(model):
    """The :class:`_ActivityRecorder` of every layer of ``model`` with an activity regularizer
    (installed on the engine's own clone at the first call)."""
    found = []
    for layer in _tfprivate.keras.all_layers(model):
        regularizer = getattr(layer, "activity_regularizer", None)
        if regularizer is None:
            continue
        if not isinstance(regularizer, _ActivityRecorder):
            regularizer = _ActivityRecorder(layer, regularizer)
            layer.activity_regularizer = regularizer
        found.append(regularizer)
    return found


@_tfprivate.graph.not_converted
def _called(model, features, training):
    """The model's outputs (a list), its weight regularizers, whether its layers added losses
    from their inputs in this call, and (layer name, index) -> (activity regularizer, the
    output it regularized) for those an activity regularizer added."""
    recorders = _recorders(model)
    for recorder in recorders:
        recorder.outputs.clear()
    outputs = _outputs_list(_tfprivate.keras.call_as_stock(model, features, training))
    adds = any(
        _tfprivate.keras_compile.layer_call_losses(layer)
        for layer in _tfprivate.keras.all_layers(model)
    )
    activity = {
        (recorder.layer.name, index): (recorder.regularizer, output)
        for recorder in recorders
        for index, output in recorder.outputs
    }
    return outputs, _tfprivate.keras_compile.weight_regularizers(model), adds, activity


class _NormalizedOutputs:
    """While a replica's step calls the model (inside
    :func:`tpushim._tfprivate.keras.batchnorm_call_hooked`), each BatchNormalization layer's
    output of that call, in call order; then, while :func:`input_losses` runs the model on one
    row, each layer's call gives back that row of its recorded output. So a loss a layer adds
    from its inputs after a BatchNormalization sees, row by row, what the batch's own call gave
    it -- the batch's moments, as stock's one call -- and the rows' calls neither normalise by
    one row nor move the moving statistics again (the gradient reaches the moments through the
    recorded output). Where the layer is not hooked (evaluation: Keras's own call on its moving
    statistics, the same on a row as in the batch), nothing is recorded."""

    def __init__(self):
        self.outputs, self._taken, self.row = {}, {}, None

    @contextlib.contextmanager
    def recording(self):
        own = _tfprivate.keras.batchnorm_call_active()

        def call(layer, bound, inputs, training, mask):
            if own is None:
                output = bound(inputs, training=training, mask=mask)
            else:
                output = own(layer, bound, inputs, training, mask)
            self.outputs.setdefault(id(layer), []).append(output)
            return output

        with _tfprivate.keras.batchnorm_call_using(call):
            yield

    @contextlib.contextmanager
    def replaying(self, row):
        self._taken, self.row = {}, row

        def call(layer, bound, inputs, training, mask):
            recorded = self.outputs.get(id(layer), ())
            k = self._taken.get(id(layer), 0)
            if k >= len(recorded):  # a call the batch's pass did not make
                return bound(inputs, training=training, mask=mask)
            self._taken[id(layer)] = k + 1
            return tf.gather(recorded[k], self.row[None])

        with _tfprivate.keras.batchnorm_call_using(call):
            yield


@_tfprivate.graph.not_converted
def input_losses(model, features, training, degrees, activity=None, normalized=None):
    """``(Degree, [rows] values)`` per loss a layer of ``model`` adds from its inputs (right after
    a call of ``model``): each row's value that of the model called on that row alone, so
    padding rows weigh 0 and a replica's rows add up to the global batch's term whatever their
    number (Keras's own value is a mean over the replica's rows, padding included).

    An activity regularizer's term is read from ``activity`` (:func:`_called`): the regularizer
    applied to each row of the output the call itself regularized, so BatchNormalization before
    it keeps the call's batch moments and no second forward pass is run. Any other term
    (``add_loss`` in a call) comes from running the model on each row alone, each
    BatchNormalization layer giving that row of its output in the call (``normalized``, a
    :class:`_NormalizedOutputs` that recorded them)."""
    activity = activity or {}
    keys = [
        (layer.name, i)
        for layer in _tfprivate.keras.all_layers(model)
        for i, _ in enumerate(_tfprivate.keras_compile.layer_call_losses(layer))
    ]
    values = {key: _losses.per_row_activity(*activity[key]) for key in keys if key in activity}
    rest = [key for key in keys if key not in values]
    if rest:
        normalized = normalized or _NormalizedOutputs()

        def per_row(element):
            row, index = element
            # One row alone: BatchNormalization gives that row of the batch's call.
            with normalized.replaying(index):
                _tfprivate.keras.call_as_stock(
                    model, tf.nest.map_structure(lambda x: x[None], row), training
                )
            return [
                tf.reshape(tf.cast(t, tf.float32), [])
                for layer in _tfprivate.keras.all_layers(model)
                for i, t in enumerate(_tfprivate.keras_compile.layer_call_losses(layer))
                if (layer.name, i) in rest
            ]

        # tf.map_fn, not tf.vectorized_map: regularizers use ops pfor cannot vectorise
        # (L2Loss), and its while-loop fallback does not compile with XLA; map_fn's static row
        # count does.
        count = tf.shape(tf.nest.flatten(features)[0], out_type=tf.int32)[0]
        rows = tf.map_fn(
            per_row,
            (features, tf.range(count)),
            fn_output_signature=[tf.float32] * len(rest),
        )
        values.update(zip(rest, rows))
    return [(degrees.get(key, _loss_kinds.MEAN), values[key]) for key in keys]


@_tfprivate.graph.not_converted
def _loss_of(
    plan, terms, model, features, labels, pad, weights, training, replicas, summed, rows=None
):
    """(the replica's ``L_r``, its outputs): :func:`replica_loss` of a call of ``model``
    (``rows``: the global batch's real rows the element carries, :func:`known_rows`)."""
    normalized = _NormalizedOutputs()
    with normalized.recording():
        outputs, regularizers, adds, activity = _called(model, features, training)
    added = (
        input_losses(model, features, training, plan.added_degrees, activity, normalized)
        if adds
        else ()
    )
    loss = replica_loss(
        terms,
        plan.loss_kinds,
        outputs,
        _labels_list(labels, model.output_names),
        pad,
        replicas,
        regularizers,
        weights,
        added,
        summed,
        rows,
    )
    return loss, outputs


def _outs(plan):
    return plan.host.outputs if plan.host is not None else ()
