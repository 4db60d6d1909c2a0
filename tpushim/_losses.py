"""The training loss of one TPU shard, and the global batch's loss the step reports.

Each of S shards computes the loss on its slice of the global batch, and the optimizer averages
the shards' gradients. The average is the global batch's gradient when shard s differentiates

    L_s = sum over terms of  S**p * (the term on shard s) * (the term's global factors)

where ``p`` is the term's degree (:mod:`tpushim._loss_kinds`: a mean 0, a sum 1) and the global
factors are what the term is divided or weighted by over the whole batch: the element count a
mean divides by (the real rows of a padded batch, the unmasked elements), or the mean sample
weight a custom scalar loss is multiplied by. Those are summed over the shards (one
``cross_replica_sum``, gradient stopped: they depend on the batch, not on the weights). The mean
of the L_s over the shards is then the global batch's loss, which the step reports as
``cross_replica_sum(L_s) / S``: stock's loss on that batch. With S = 1 (cpu mode) and no padding,
L is Keras's own total loss.

Padding rows of a short batch count for nothing: a per-example loss weighs them 0, a custom
scalar loss is evaluated per row (``tf.vectorized_map``) to leave them out, and a loss a layer
adds from its inputs, which cannot be computed without them, is refused with a clear error.
"""

import tensorflow as tf

from tpushim import _loss_kinds, _tfprivate
from tpushim._errors import ConversionError

Reduction = tf.keras.losses.Reduction
#: Names of the two cross-replica sums a TPU train step adds besides one per gradient.
REPORTED_SUM = "tpushim_reported_loss"  # the shards' losses, for the loss the step reports
TOTALS_SUM = "tpushim_loss_totals"  # counts and weight sums, where a term needs the global ones


class Totals:
    """Scalars summed over all shards in ONE cross_replica_sum: counts and weight sums, which
    depend on the batch only, so all are known before any term is combined.

    ``global_rows``: the global batch's real rows where the input already carries them (the
    strategy engine's, :mod:`tpushim._strategy.input`), else None. A count that is those rows
    times a static number is then known without the collective, and where every scalar is
    known so, the step issues none: one all-reduce (a rendezvous of every replica) fewer a step.
    """

    def __init__(self, global_rows=None):
        self.global_rows = global_rows
        self._parts, self._known, self._values = [], [], None

    @_tfprivate.graph.not_converted
    def add(self, value, known=None):
        """Registers a scalar (``known``: its sum over the shards, where that is known without
        summing); returns a function giving its sum over the shards."""
        self._parts.append(tf.cast(value, tf.float32))
        self._known.append(None if known is None else tf.cast(known, tf.float32))
        index = len(self._parts) - 1
        return lambda dtype: tf.cast(self._values[index], dtype)

    @_tfprivate.graph.not_converted
    def rows_times(self, elements):
        """The global real rows times ``elements`` (a static count), or None if not known."""
        if self.global_rows is None or elements is None:
            return None
        return self.global_rows * float(elements)

    @_tfprivate.graph.not_converted
    def resolve(self, cross_replica):
        """``cross_replica``: False (one shard), True (a TPU's ``cross_replica_sum``) or a
        function summing a tensor over the replicas (a ``tf.distribute`` replica context's)."""
        if not self._parts:
            return
        if cross_replica and all(k is not None for k in self._known):
            self._values = tf.stop_gradient(tf.stack(self._known))
            return
        stacked = tf.stack(self._parts)
        if callable(cross_replica):
            stacked = cross_replica(stacked)
        elif cross_replica:
            stacked = tf.compat.v1.tpu.cross_replica_sum(stacked, name=TOTALS_SUM)
        self._values = tf.stop_gradient(stacked)


@_tfprivate.graph.not_converted
def _weighted(values, weights):
    """``values`` times ``weights``, broadcast as Keras broadcasts sample weights (no reduction)."""
    losses_utils = _tfprivate.keras_compile.losses_utils()
    return losses_utils.compute_weighted_loss(
        values, sample_weight=weights, reduction=losses_utils.ReductionV2.NONE
    )


@_tfprivate.graph.not_converted
def _times(a, b):
    """The product of two optional weights (Keras's broadcasting), None if both are None."""
    if a is None or b is None:
        return b if a is None else a
    return _weighted(tf.cast(a, tf.float32), tf.cast(b, tf.float32))


@_tfprivate.graph.not_converted
def _rows(pad, like):
    """The [batch] padding weight with one axis per axis of ``like``: it multiplies rows."""
    return tf.reshape(tf.cast(pad, tf.float32), [-1] + [1] * max(like.shape.rank - 1, 0))


@_tfprivate.graph.not_converted
def _mask_weights(endpoint, mask):
    """Keras's weights of an output's loss elements before a mean's rescaling: sample weight
    times mask (training_v1 ``_prepare_total_loss``, losses_utils ``apply_mask``)."""
    weight = endpoint.sample_weight
    if mask is None:
        return weight
    mask = tf.cast(mask, tf.float32)
    if weight is None:
        return mask
    mask, _, weight = _tfprivate.keras_compile.losses_utils().squeeze_or_expand_dimensions(
        mask, sample_weight=tf.cast(weight, tf.float32)
    )
    return weight * mask


@_tfprivate.graph.not_converted
def _reduction(loss_fn):
    reduction = loss_fn.reduction
    return Reduction.SUM_OVER_BATCH_SIZE if reduction == Reduction.AUTO else reduction


def _check_reduction(endpoint):
    if _reduction(endpoint.loss_fn) == Reduction.NONE:
        # Stock hands the estimator Keras's unreduced loss and fails at its first step ("Input to
        # reshape is a tensor with <batch> values, but the requested shape has 1").
        raise ValueError(
            f"Loss must be scalar: the loss of output {endpoint.output_name!r} has reduction "
            f"NONE (one value per example), and an estimator trains on one number; the stock "
            f"estimator fails on it too. Compile the loss with reduction SUM_OVER_BATCH_SIZE "
            f"(the default) or SUM."
        )


@_tfprivate.graph.not_converted
def _output_term(endpoint, mask, kind, pad, totals, shards):
    """This output's part of L_s (before its loss weight), as a function of the resolved totals;
    None for a term that adds nothing (its ``kind`` says which)."""
    return kind.term(
        per_example=lambda: _per_example_term(endpoint, mask, pad, totals, shards),
        one_number=lambda degree, per_row: _one_number_term(
            endpoint, mask, degree, per_row, pad, totals, shards
        ),
    )


@_tfprivate.graph.not_converted
def _per_example_term(endpoint, mask, pad, totals, shards):
    """:func:`_output_term` of a loss giving one value per example."""
    y_true, y_pred = endpoint.training_target.target, endpoint.output
    loss_fn = endpoint.loss_fn
    mean = _reduction(loss_fn) == Reduction.SUM_OVER_BATCH_SIZE
    weights = _mask_weights(endpoint, mask)
    counted = None if mask is None else tf.cast(mask, tf.float32)  # what a mean counts
    values = _tfprivate.graph.user_code(loss_fn.call)(y_true, y_pred)  # the user's, converted
    if pad is not None:
        weights, counted = (
            _times(weights, _rows(pad, values)),
            _times(counted, _rows(pad, values)),
        )
    weighted = _weighted(values, weights)
    numerator = tf.reduce_sum(weighted)
    if not mean:
        return lambda: shards * numerator
    elements = weighted.shape[1:].num_elements() if mask is None else None
    known = totals.rows_times(elements) if pad is not None else None
    count = totals.add(tf.reduce_sum(_weighted(tf.ones_like(weighted), counted)), known)
    return lambda: shards * tf.math.divide_no_nan(numerator, count(numerator.dtype))


@_tfprivate.graph.not_converted
def _one_number_term(endpoint, mask, degree, per_row, pad, totals, shards):
    """:func:`_output_term` of a loss that is one number for the batch, of ``degree`` (a
    :class:`tpushim._loss_kinds.Degree`); ``per_row``: on a padded batch, evaluated on each real
    row alone (else on the whole batch: a constant, the same on the real rows)."""
    y_true, y_pred = endpoint.training_target.target, endpoint.output
    loss_fn = endpoint.loss_fn
    mean = _reduction(loss_fn) == Reduction.SUM_OVER_BATCH_SIZE
    weights = _mask_weights(endpoint, mask)
    counted = None if mask is None else tf.cast(mask, tf.float32)  # what a mean counts
    rows = None
    if pad is None or not per_row:
        value = _tfprivate.graph.user_code(loss_fn.call)(y_true, y_pred)
        if pad is not None and weights is not None:
            weights, counted = _times(weights, pad), _times(counted, pad)
    else:  # the real rows' value: one value per row (a batch of one), added up as its degree says
        # (vectorized_map converts its function by AutoGraph's status, the user's call in it too)
        values = tf.vectorized_map(
            lambda row: loss_fn.call(row[0][None], row[1][None]), (y_true, y_pred)
        )
        values = tf.reshape(values, [tf.shape(values)[0], -1])
        values = tf.reduce_mean(values, 1) if mean else tf.reduce_sum(values, 1)
        value = tf.reduce_sum(values * tf.cast(pad, values.dtype))
        rows = totals.add(tf.reduce_sum(tf.cast(pad, tf.float32)), totals.global_rows)
        if weights is not None:
            weights, counted = _times(weights, pad), _times(counted, pad)
    if weights is None:  # Keras reduces the value itself: a mean or sum of its elements
        value = tf.reduce_mean(value) if mean else tf.reduce_sum(value)
        weight = count = None
    else:
        if value.shape.num_elements() != 1:
            raise ConversionError(
                f"tpushim cannot weight the loss of output {endpoint.output_name!r} by examples "
                f"on a TPU: it returns shape {value.shape} for the batch (neither one value per "
                f"example nor one number). Return one value per example."
            )
        value = tf.reshape(value, [])
        # Keras multiplies the batch's value by the weights' mean (or sum): over the global batch.
        ones = tf.ones_like(_weighted(tf.ones([]), weights))
        weight = totals.add(tf.reduce_sum(_weighted(ones, weights)))
        count = totals.add(tf.reduce_sum(_weighted(ones, counted))) if mean else None

    def term():
        if rows is None:  # shards**degree * value: the shards' mean is the global batch's value
            out = value * degree.shard_factor(shards)
        else:  # the global real rows' term from this shard's sum of its rows' values
            out = degree.of_rows(value * float(shards), rows(value.dtype))
        if weight is not None:
            factor = tf.math.divide_no_nan(weight(out.dtype), count(out.dtype)) if mean else None
            out = out * (factor if mean else weight(out.dtype))
        return out

    return term


def _added_degrees(model, plan):
    """{id(tensor): :class:`tpushim._loss_kinds.Degree`} for the losses the clone's layers added
    from their inputs."""
    degrees = {}
    for layer in _tfprivate.keras.all_layers(model):
        for i, term in enumerate(_tfprivate.keras_compile.layer_input_losses(layer)):
            degrees[id(term)] = (plan.added or {}).get((layer.name, i), _loss_kinds.MEAN)
    return degrees


def training_loss(model, plan, padding_weight, shards, cross_replica):
    """(the loss shard s differentiates, the global batch's loss to report).

    Args:
      model: the compiled TRAIN clone (its sample weights settled, its train function not made).
      plan: the model's :class:`tpushim._loss_kinds.LossPlan`.
      padding_weight: [batch] 1 for a real row, 0 for padding; None for a full batch.
      shards: the number of shards S (1 in cpu mode).
      cross_replica: sum the totals and the reported loss over the shards (on a TPU).
    Raises:
      ConversionError: a loss added from the inputs on a padded batch.
      ValueError: a loss with reduction NONE (stock's reason).
    """
    endpoints = [
        e for e in _tfprivate.keras_compile.training_endpoints(model) if not e.should_skip_target()
    ]
    for endpoint in endpoints:
        _check_reduction(endpoint)
    added = _tfprivate.keras_compile.added_losses(model)
    degrees = _added_degrees(model, plan)
    from_inputs = _tfprivate.graph.reachable_from(model.inputs, added) if added else []
    if padding_weight is not None and any(t in from_inputs for t in added):
        raise ConversionError(
            "this training input has short batches, which a TPU pads to full size, or a global "
            "batch that does not divide among the TPU's cores, which it pads to the next multiple "
            "of them, and the model adds a loss computed from its inputs (an activity_regularizer "
            "or model.add_loss), which would count the padding rows. Make every training batch "
            "full: repeat the dataset before batching it (dataset.repeat().batch(B)) or batch it "
            "with drop_remainder=True, B a multiple of the TPU's cores."
        )
    kinds = [plan.outputs.get(e.output_name, _loss_kinds.ROWS) for e in endpoints]
    masks = dict(zip(model.output_names, _tfprivate.keras_compile.output_masks(model)))
    masks = [masks.get(e.output_name) for e in endpoints]
    if padding_weight is None and not (
        shards > 1 and _needs_global(endpoints, kinds, masks, added, degrees)
    ):
        loss = model.total_loss
    else:
        with tf.name_scope("tpushim_shard_loss"):  # not 'loss': stock's summary tag stays free
            loss = shard_loss(
                endpoints, kinds, masks, added, degrees, padding_weight, shards, cross_replica
            )
    if not cross_replica:
        return loss, loss
    reported = tf.compat.v1.tpu.cross_replica_sum(loss, name=REPORTED_SUM)  # never differentiated
    return loss, reported / float(shards)


def _needs_global(endpoints, kinds, masks, added, degrees):
    """Whether some term of Keras's own loss is wrong for the average over shards."""
    for endpoint, kind, mask in zip(endpoints, kinds, masks):
        if not kind.averages_over_shards(
            mean=_reduction(endpoint.loss_fn) == Reduction.SUM_OVER_BATCH_SIZE,
            masked=mask is not None,
            weighted=endpoint.sample_weight is not None,
        ):
            return True
    return not all(degrees.get(id(t), _loss_kinds.MEAN).averages_over_shards() for t in added)


@_tfprivate.graph.not_converted
def shard_loss(endpoints, kinds, masks, added, degrees, pad, shards, cross_replica, totals=None):
    """``L_s``: the terms of shard s's loss, whose mean over the ``shards`` is the global batch's
    (see the module's docstring); ``cross_replica`` as :meth:`Totals.resolve` takes it. The
    strategy engine calls it too, with its own endpoints and ``totals`` holding its own counts
    (:mod:`tpushim._strategy`): every count of the step summed in one collective."""
    totals = totals or Totals()
    terms = [
        (endpoint.loss_weight, _output_term(endpoint, mask, kind, pad, totals, shards))
        for endpoint, kind, mask in zip(endpoints, kinds, masks)
    ]
    totals.resolve(cross_replica)
    # (a term weighted 0 is None: nothing, and never computed)
    parts = [weight * term() for weight, term in terms if term is not None]
    parts += [t * degrees.get(id(t), _loss_kinds.MEAN).shard_factor(shards) for t in added]
    parts = _tfprivate.keras_compile.losses_utils().cast_losses_to_common_dtype(parts)
    return tf.add_n(parts) if parts else tf.constant(0.0)


def global_output_loss(endpoint, kind, padding_weight, cross_replica):
    """One output's loss on the real rows of the global batch, unweighted by its loss weight,
    for a term that is not one value per example (a custom scalar loss: its ``kind`` a
    :class:`tpushim._loss_kinds.Degree` or ``CONSTANT``): what stock's loss on that batch holds
    for it (evaluation).

    Args:
      endpoint: the output's training endpoint; padding_weight: as :func:`training_loss`.
      cross_replica: combine the shards' values over all TPU shards.
    """
    shards = (_tfprivate.tpu.num_shards_in_replica_context() or 1) if cross_replica else 1
    mask = getattr(endpoint.output, "_keras_mask", None)
    totals = Totals()
    term = _output_term(endpoint, mask, kind, padding_weight, totals, shards)
    totals.resolve(cross_replica)
    value = term()
    if cross_replica:
        value = tf.compat.v1.tpu.cross_replica_sum(value) / float(shards)
    return value


_BUILTIN_ACTIVITY = (tf.keras.regularizers.L1, tf.keras.regularizers.L2, tf.keras.regularizers.L1L2)


@_tfprivate.graph.not_converted
def per_row_activity(regularizer, output):
    """[rows] values of an activity regularizer's term on ``output``, each row's that of a batch
    of that row alone: ``regularizer(row) / 1``, as Keras divides by the batch size. A batch's
    term is then ``n**(degree - 1)`` times the sum over its n real rows (a built-in regularizer:
    degree 0, the mean), whatever padding rows the batch carries: the strategy engine's loss
    and the TPUEstimator path's evaluation loss (:func:`activity_term`) both read it."""
    output = tf.cast(output, tf.float32)
    if type(regularizer) in _BUILTIN_ACTIVITY:  # sums over a row's elements: no loop
        axes = list(range(1, output.shape.rank))
        value = tf.zeros(tf.shape(output)[:1])
        if getattr(regularizer, "l1", 0.0):
            value += float(regularizer.l1) * tf.reduce_sum(tf.abs(output), axes)
        if getattr(regularizer, "l2", 0.0):
            value += float(regularizer.l2) * tf.reduce_sum(tf.square(output), axes)
        return value
    return tf.map_fn(
        lambda row: tf.reshape(tf.cast(regularizer(row[None]), tf.float32), []),
        output,
        fn_output_signature=tf.float32,
    )


def activity_term(regularizer, output, degree, padding_weight, cross_replica):
    """An activity regularizer's term on the real rows of the global batch (evaluation on the
    TPUEstimator path): the rows' :func:`per_row_activity` values weighed by ``padding_weight``
    (None: every row real), summed with the real rows' count over the shards where
    ``cross_replica``, combined as the term's ``degree`` (a :class:`tpushim._loss_kinds.Degree`)
    says. Keras's own term is a mean over the shard's rows, padding included."""
    values = per_row_activity(regularizer, output)
    rows = tf.ones_like(values) if padding_weight is None else tf.cast(padding_weight, values.dtype)
    sums = tf.stack([tf.reduce_sum(values * rows), tf.reduce_sum(rows)])
    if cross_replica:
        sums = tf.compat.v1.tpu.cross_replica_sum(sums)
    return degree.of_rows_inverse(sums[0], tf.math.divide_no_nan(1.0, sums[1]))
