"""BatchNormalization over the real rows of a padded batch, and across TPU shards when synchronized.

A short training batch padded to full size (:mod:`tpushim._padding`) carries a padding weight.
Keras's BatchNormalization would take its batch statistics -- the normalisation, and the moving
mean and variance it updates -- over the padding rows too. While tpushim builds a TRAIN clone of
a padded batch, every BatchNormalization layer training on batch statistics leaves them out:

* off a TPU (cpu mode, where shapes may vary): Keras's own call on the batch's real rows, its
  first ones -- stock's computation on its short batch, for every kind of layer (the padding
  rows pass through unnormalised); a full batch runs Keras's own graph on the whole batch (a
  slice and a concat around it, nothing else);
* on a TPU (static shapes, one shard of the batch): one set of moments over the real rows, for
  every batch, with the arithmetic stock uses for that layer on its short batch:

  - not fused (2-D inputs, ``fused=False``): mean and variance over the real rows, moving
    averages of both (``tf.nn.moments``' arithmetic);
  - fused (4-D / 5-D inputs by default): the normalisation Keras's fused kernel computes,
    written out over the real rows (see :func:`_fused`: what XLA compiles of it is the size of
    Keras's own step); the moving variance moves towards the variance with Bessel's correction
    over the real elements, as the fused kernel reports it;
  - synchronized (``SyncBatchNormalization``, ``synchronized=True``): ``E[x^2] - E[x]^2`` from
    sums, as Keras computes it, added across shards: every shard normalises over the global
    batch's real rows -- stock's statistics on its whole batch;
  - ``renorm=True``: Keras's own renorm correction, fed the real rows' moments;
  - ``virtual_batch_size``: ghost batches of the real rows, cut as Keras cuts stock's short batch.

  A full batch's numbers are Keras's within rounding (not bit for bit); every other layer
  normalises each shard over that shard's real rows, and a shard holding padding only leaves its
  moving statistics as they are.

A batch without padding takes Keras's own code, unchanged (but for a synchronized layer on a TPU).
"""

import tensorflow as tf

from tpushim import _tfprivate
from tpushim._errors import ConversionError


def real_rows_call(padding_weight, cross_replica, replica_sum=None):
    """The call of a TRAIN clone's BatchNormalization layers (for
    :func:`tpushim._tfprivate.keras.clone_and_build_model`), or None where Keras's own is right.

    Args:
      padding_weight: the batch's [batch] padding weight, or None for a batch without padding.
      cross_replica: the model_fn builds one shard of a TPU computation (or the strategy engine
        one replica's step: the same arithmetic, per replica).
      replica_sum: a tensor summed across the shards (a synchronized layer's sums); None for
        ``tf.compat.v1.tpu.cross_replica_sum`` (the strategy engine: its replica context's
        all-reduce).
    """
    if padding_weight is None and not cross_replica:
        return None
    if not cross_replica:
        return _first_rows_call(padding_weight)
    replica_sum = replica_sum or tf.compat.v1.tpu.cross_replica_sum
    # The shard's rows, made once for every layer of the step (and per fold: see _fold).
    shards = {} if padding_weight is None else {1: _ShardRows(padding_weight)}

    def shard_of(layer, inputs):
        if padding_weight is None:
            return None
        fold = _fold(layer, padding_weight, inputs)
        if not isinstance(fold, int):
            return _ShardRows(tf.repeat(padding_weight, fold))
        if fold not in shards:
            shards[fold] = _ShardRows(tf.repeat(padding_weight, fold))
        return shards[fold]

    def call(layer, own_call, inputs, training, mask):
        synced = getattr(layer, "synchronized", False)
        if (
            # moving statistics: padding plays no part
            _tfprivate.keras.batchnorm_training_value(layer, training) is not True
            or (padding_weight is None and not synced)
            # Keras reshapes the inputs for ghost batches, not the mask (it cannot combine them)
            or (mask is not None and layer.virtual_batch_size is not None)
        ):
            return own_call(inputs, training=training, mask=mask)
        # Fused, Keras ignores a mask (with a warning); not fused, it weighs rows by it.
        mask = None if layer.fused else mask
        shard = shard_of(layer, inputs)
        return _train_on_real_rows(layer, inputs, shard, mask, synced and replica_sum)

    return call


class _ShardRows:
    """A shard's real rows, as every layer of its step reads them: ``rows`` ([batch], 1 for a
    real row, 0 for padding), their number ``n`` and ``has_rows`` (not a shard of padding only).

    What the fused layers of a step share (:meth:`per_row`, :meth:`decay`) is made once, by the
    first layer that needs it, and read by the others: per layer, only what depends on the layer.
    """

    def __init__(self, padding_weight):
        # The weight itself (pad_batch makes it 1 or 0): XLA copies each elementwise op between
        # the weight and a layer into every fusion that reads it -- a compare and a cast here
        # were some 1,800 instructions of MobileNetV2's step.
        self.rows = tf.cast(padding_weight, tf.float32)
        self.n = tf.reduce_sum(self.rows)
        self.has_rows = tf.greater(self.n, 0)
        self._made = {}

    def _once(self, key, make):
        # Made in one graph (a function's) or control-flow context (a loop, a branch, the TPU
        # computation), a tensor is usable only inside it.
        graph = tf.compat.v1.get_default_graph()
        key = (key, graph, _tfprivate.graph.control_flow_context(graph))
        if key not in self._made:
            with tf.name_scope("tpushim_real_rows"):
                self._made[key] = make()
        return self._made[key]

    def per_row(self, dtype, ndims, per_row):
        """``(real, weights, 1 / count, bessel)`` for ``ndims``-D layers with ``per_row``
        elements of a channel per row, ``count`` the real elements of a channel (``n`` real rows
        times ``per_row``; ``n`` 1 on a shard of padding only: its mean is 0, its variance 0,
        every number finite, and its decay 0): ``real`` 1 for a real row and 0 for padding,
        ``weights`` each row's weight in the real elements' mean (``real / count``), both shaped
        to broadcast over a row, and ``bessel`` ``count / (count - 1)``, Bessel's correction
        over the real elements (as the fused kernel reports the variance of stock's short
        batch)."""

        def make():
            weight = tf.cast(self.rows, dtype)
            count = tf.maximum(tf.cast(self.n, dtype), 1.0) * per_row
            real = tf.reshape(weight, [-1] + [1] * (ndims - 1))
            bessel = count / tf.maximum(count - 1.0, 1.0)
            return real, real / count, 1.0 / count, bessel

        return self._once(("per_row", dtype, ndims, per_row), make)

    def decay(self, momentum, dtype):
        """Keras's decay of a fused layer (``1 - momentum`` computed on a tensor), 0 on a shard of
        padding only (its moving statistics stay)."""

        def make():
            decay = tf.cast(1.0 - tf.convert_to_tensor(momentum), dtype)
            return decay * tf.cast(self.has_rows, dtype)

        return self._once(("decay", momentum, dtype), make)


def _fold(layer, padding_weight, inputs):
    """How many of the layer's input rows each row of the batch makes: 1, or where a wrapper
    folded a dimension into the batch (``TimeDistributed`` reshapes ``[batch, T, ...]`` to
    ``[batch * T, ...]``, row by row) ``T``, each of a row's ``T`` rows real or padding as the
    row is. An int where both sizes are static, else a tensor."""
    batch = tf.compat.dimension_value(padding_weight.shape[0])
    rows = tf.compat.dimension_value(inputs.shape[0])
    if batch is None or rows is None:
        return tf.shape(inputs)[0] // tf.shape(padding_weight)[0]
    if rows % batch:
        raise ConversionError(
            f"BatchNormalization layer {layer.name!r} is called on {rows} rows, which a batch "
            f"of {batch} rows cannot make: tpushim cannot tell its padding rows from its real "
            "ones. Call it on the batch's rows (or a wrapper's TimeDistributed reshape of them)."
        )
    return rows // batch


def _first_rows_call(padding_weight):
    """Off a TPU (cpu mode: shapes may vary): Keras's own call on the batch's real rows -- its
    first ones, as :func:`tpushim._padding.pad_batch` packs them -- which is stock's computation on
    its short batch, for every kind of layer. The padding rows pass through as they came (values
    the model produced; no gradient flows back through them, and they count nowhere). A full
    batch takes the whole batch: Keras's own graph, with a slice and a concat around it."""
    real = tf.reduce_sum(tf.cast(tf.greater(padding_weight, 0), tf.int32))

    def call(layer, own_call, inputs, training, mask):
        if _tfprivate.keras.batchnorm_training_value(layer, training) is not True:
            return own_call(inputs, training=training, mask=mask)
        fold = _fold(layer, padding_weight, inputs)
        first = real if isinstance(fold, int) and fold == 1 else real * fold
        outputs = own_call(
            inputs[:first], training=training, mask=None if mask is None else mask[:first]
        )
        padding = tf.stop_gradient(tf.cast(inputs[first:], outputs.dtype))
        padded = tf.concat([outputs, padding], 0)
        padded.set_shape(inputs.shape)
        return padded

    return call


def _train_on_real_rows(layer, inputs, shard, mask, cross_replica):
    """The layer's training-mode output on one TPU shard, its statistics over the real rows (see
    the module): one set of moments, weighted by the rows, whether or not any row is padding."""
    inputs = tf.cast(inputs, layer.compute_dtype)
    param_dtype = layer.moving_mean.dtype.base_dtype
    # As Keras: statistics (and, not fused, the normalisation) of 16-bit inputs in float32.
    x = tf.cast(inputs, param_dtype)
    ndims = x.shape.rank
    if shard is None:  # a synchronized layer on a batch without padding
        shard = _ShardRows(tf.ones(tf.shape(x)[:1]))
    rows = tf.cast(shard.rows, param_dtype)
    vbs = layer.virtual_batch_size
    # The statistics' shape against x: 1 on every reduced axis (the axes of a layer with ghost
    # batches count the ghost dimension Keras inserts at 1).
    channels = [a - 1 for a in layer.axis] if vbs is not None else list(layer.axis)
    keep = [x.shape[i] if i in channels else 1 for i in range(ndims)]
    axes = [i for i in range(ndims) if i not in channels]
    if layer.fused:
        return _fused(layer, inputs, x, shard, axes)
    if vbs is None:
        weight = tf.reshape(rows, [-1] + [1] * (ndims - 1))
        if mask is not None:  # Keras's mask: a weight per position, broadcast over the last axis
            weight = weight * tf.expand_dims(tf.cast(mask, param_dtype), -1)
        mean, variance, count = _moments(layer, x, weight, axes, cross_replica)
        batch_mean, batch_variance = mean, variance
    else:
        mean, variance, count, batch_mean, batch_variance = _ghost_moments(
            layer, x, rows, vbs, channels, cross_replica
        )
    # The element count is the same for every channel; 0 when a shard holds padding only.
    has_rows = tf.greater(tf.reduce_max(count), 0)

    def as_param(t):
        return tf.reshape(t, layer.moving_mean.shape)

    def as_stat(t):
        return None if t is None else tf.reshape(t, keep)

    scale, offset = as_stat(layer.gamma), as_stat(layer.beta)
    if layer.adjustment is not None:  # as Keras: (scale, bias) applied before gamma and beta
        scale, offset = _compose(*layer.adjustment(tf.shape(inputs)), scale, offset)
    if layer.renorm:
        r, d, batch_mean, batch_variance = _tfprivate.keras.batchnorm_renorm(
            layer, as_param(batch_mean), as_param(batch_variance), tf.reduce_max(count)
        )
        # As Keras: the corrections are constants for the gradient.
        r, d = as_stat(tf.stop_gradient(r)), as_stat(tf.stop_gradient(d))
        scale, offset = _compose(r, d, scale, offset)

    # A shard holding padding only (on a TPU) normalises with the moving statistics: finite
    # values, which its zero weights then drop.
    outputs = tf.nn.batch_normalization(
        x,
        tf.where(has_rows, mean, as_stat(layer.moving_mean)),
        tf.where(has_rows, variance, as_stat(layer.moving_variance)),
        offset,
        scale,
        layer.epsilon,
    )
    outputs = tf.cast(outputs, inputs.dtype)
    outputs.set_shape(inputs.shape)
    # Keras's decay: 1 - momentum in Python, then a tensor.
    decay = tf.convert_to_tensor(1.0 - layer.momentum)
    mean_update = _moving_average(layer.moving_mean, as_param(batch_mean), decay, has_rows)
    layer.add_update(mean_update)
    if layer.renorm:  # as Keras: through the moving standard deviation
        stddev = _moving_average(
            layer.moving_stddev, as_param(tf.sqrt(batch_variance + layer.epsilon)), decay, has_rows
        )
        with tf.compat.v1.colocate_with(layer.moving_variance):
            layer.add_update(
                tf.compat.v1.assign(
                    layer.moving_variance,
                    tf.nn.relu(stddev * stddev - layer.epsilon),
                    name="AssignNewValue",
                )
            )
    else:
        layer.add_update(
            _moving_average(layer.moving_variance, as_param(batch_variance), decay, has_rows)
        )
    return outputs


def _fused(layer, inputs, x, shard, axes):
    """A fused layer (4-D / 5-D inputs) on a TPU shard: the normalisation Keras's fused kernel
    computes, written out over the shard's real rows, with the kernel's gradient written out too.

    With ``count`` the real elements of a channel and ``m`` their mean (a weighted sum), ``d`` is
    ``x - m`` on a real row and 0 on a padding row, the variance ``sum(d**2) / count`` and the
    output ``gamma * d / sqrt(variance + epsilon) + beta`` (``beta`` on a padding row, finite
    whatever the row held). Its gradient is the real rows' normalisation's; a padding row gets
    none. In a graph's ``tf.gradients`` (TPUEstimator's model_fn) it is :func:`_fused_gradient`,
    written out; a ``GradientTape`` (the strategy engine's step) does not read a graph's
    gradient override, and takes the same gradient by differentiating the ops above. The
    moving mean moves towards ``m``, the moving variance towards the variance with Bessel's
    correction over the real elements, as the kernel reports it for stock's short batch. A full
    batch's numbers are Keras's within rounding.

    Keras's kernel itself cannot take the padded batch: it reduces over every row, and a padding
    row holds whatever the layers before made of it. Fed a batch centred and rescaled so that
    its statistics were the real rows' (issue 36's second and third rounds), the step held fewer
    TensorFlow ops, but XLA expands the kernel and its gradient into reductions of their own and
    copied the centring into each: MobileNetV2's step compiled in 1.56x the hand-written's time.
    Written out, this is what XLA makes of the kernel, and the step compiles in about the
    hand-written's time (see docs/contributing/benchmarks.md).
    """
    dtype = x.dtype
    ndims = x.shape.rank
    per_row = 1
    for i in axes[1:]:
        per_row *= x.shape[i]
    real, weights, inverse_count, bessel = shard.per_row(dtype, ndims, per_row)
    # Channels last (Keras's default) broadcast as they are: statistics of shape [channels], no
    # reshapes; channels first keep their reduced dimensions.
    last = axes == list(range(ndims - 1))
    keep = [1 if i in axes else x.shape[i] for i in range(ndims)]
    gamma, beta = layer.gamma, layer.beta
    if not last:
        gamma = None if gamma is None else tf.reshape(gamma, keep)
        beta = None if beta is None else tf.reshape(beta, keep)
    axes = tf.constant(axes)  # one constant for the layer's four sums
    mean = tf.reduce_sum(x * weights, axes, keepdims=not last)
    centred = (x - mean) * real
    variance = tf.reduce_sum(tf.square(centred), axes, keepdims=not last) * inverse_count
    inverse = tf.math.rsqrt(variance + layer.epsilon)
    scale = inverse if gamma is None else inverse * gamma
    outputs = centred * scale
    if beta is not None:
        outputs = outputs + beta
    graph = tf.compat.v1.get_default_graph()
    with graph.gradient_override_map({"IdentityN": _FUSED_GRADIENT}):
        outputs = tf.identity_n(
            [
                outputs,
                x,
                # in place of a missing gamma or beta, a scalar: no gradient
                tf.zeros([]) if gamma is None else gamma,
                tf.zeros([]) if beta is None else beta,
                centred,
                inverse,
                scale,
                real,
                inverse_count,
            ]
        )[0]
    outputs = tf.cast(outputs, inputs.dtype)
    outputs.set_shape(inputs.shape)
    decay = shard.decay(layer.momentum, layer.moving_mean.dtype.base_dtype)
    variance = variance * bessel
    if not last:
        mean = tf.reshape(mean, layer.moving_mean.shape)
        variance = tf.reshape(variance, layer.moving_mean.shape)
    layer.add_update(_gated_moving_average(layer.moving_mean, mean, decay))
    layer.add_update(_gated_moving_average(layer.moving_variance, variance, decay))
    return outputs


_FUSED_GRADIENT = "TpushimRealRowsBatchNorm"


def _fused_gradient(op, dy, *unused):
    """The gradient of :func:`_fused`'s output: ``(x, gamma, beta)``'s, as Keras's gradient
    kernel computes them, over the real rows.

    With ``g`` the output's gradient on the real rows (0 on the padding rows), ``xhat = d / s``
    (``s = sqrt(variance + epsilon)``): beta's is ``sum(g)``, gamma's ``sum(g * xhat)``, and
    ``x``'s ``gamma / s * (g - sum(g) / count - xhat * sum(g * xhat) / count)`` on a real row,
    0 on a padding row (``d`` is 0 there). Sums over every axis but the channels'.
    """
    del unused
    _, x, gamma, beta, centred, inverse, scale, real, inverse_count = op.inputs
    if dy is None:
        return [None] * 9
    ndims = x.shape.rank
    if inverse.shape.rank == 1:  # channels last: [channels]
        axes, keep = tf.constant(list(range(ndims - 1))), False
    else:  # reduced dimensions kept (a channel of 1 summed over: the same)
        axes, keep = tf.constant([i for i in range(ndims) if inverse.shape[i] == 1]), True
    given = dy * real
    offset_grad = tf.reduce_sum(given, axes, keepdims=keep)
    dot = tf.reduce_sum(given * centred, axes, keepdims=keep)
    scale_grad = dot * inverse
    x_grad = scale * (
        given
        - real * (offset_grad * inverse_count)
        - centred * (scale_grad * inverse * inverse_count)
    )
    return [
        None,
        x_grad,
        None if gamma.shape.rank == 0 else scale_grad,
        None if beta.shape.rank == 0 else offset_grad,
    ] + [None] * 5


try:
    tf.RegisterGradient(_FUSED_GRADIENT)(_fused_gradient)
except KeyError:  # registered already (the module imported again)
    pass


def _gated_moving_average(variable, value, decay):
    """Keras's moving-average update (``_assign_moving_average``), ``decay`` 0 for none."""
    delta = (variable - tf.cast(value, variable.dtype.base_dtype)) * decay
    with tf.compat.v1.colocate_with(variable):
        return tf.compat.v1.assign_sub(variable, delta, name="AssignMovingAvg")


def _moving_average(variable, value, decay, has_rows):
    """Keras's moving-average update (``_assign_moving_average``), none where ``has_rows`` is
    false."""
    decay = tf.cast(decay, variable.dtype.base_dtype)
    delta = (variable - tf.cast(value, variable.dtype.base_dtype)) * decay
    delta = tf.where(has_rows, delta, tf.zeros_like(delta))
    with tf.compat.v1.colocate_with(variable):
        return tf.compat.v1.assign_sub(variable, delta, name="AssignMovingAvg")


def _compose(scale, offset, then_scale, then_offset):
    """Keras's composition of two affine transforms (x * scale + offset, then the other)."""
    if then_scale is not None:
        scale = scale * then_scale
        offset = offset * then_scale
    if then_offset is not None:
        offset = offset + then_offset
    return scale, offset


def _moments(layer, x, weight, axes, cross_replica):
    """(mean, variance, element count) over the rows of ``weight`` 1, with keepdims."""
    weight = tf.broadcast_to(weight, tf.shape(x))
    # Selected, not multiplied: whatever a padding row holds (even inf or NaN) counts for nothing.
    x = tf.where(weight > 0, x, tf.zeros_like(x))
    count = tf.reduce_sum(weight, axes, keepdims=True)
    if getattr(layer, "synchronized", False):
        # Keras's synchronized arithmetic: sums (across shards on a TPU), then E[x^2] - E[x]^2.
        y = x * weight
        sums = [
            tf.reduce_sum(y, axes, keepdims=True),
            tf.reduce_sum(tf.square(y), axes, keepdims=True),
            count,
        ]
        if cross_replica:  # the sum across shards
            sums = tf.unstack(cross_replica(tf.stack(sums)))
        total, squares, count = sums
        mean = tf.math.divide_no_nan(total, count)
        return mean, tf.math.divide_no_nan(squares, count) - tf.square(mean), count
    # tf.nn.moments' arithmetic, over the real rows.
    mean = tf.math.divide_no_nan(tf.reduce_sum(x * weight, axes, keepdims=True), count)
    squared = tf.math.squared_difference(x, tf.stop_gradient(mean)) * weight
    return mean, tf.math.divide_no_nan(tf.reduce_sum(squared, axes, keepdims=True), count), count


def _ghost_moments(layer, x, rows, vbs, channels, cross_replica):
    """Ghost batch statistics of the real rows, cut as Keras cuts a batch of that many rows.

    Keras reshapes a batch of n rows to ``[vbs, n / vbs, ...]`` and reduces over the first
    dimension: row i is in ghost batch ``i mod (n / vbs)``. The real rows of a padded batch are
    its first ones, so with ``real`` of them a row's ghost batch is ``i mod (real / vbs)``, one of
    at most ``batch / vbs``. Returns, with keepdims: each row's ghost mean and variance, the
    element count per ghost batch, and the mean over ghost batches of their means and variances
    (what Keras moves the moving statistics towards).
    """
    if cross_replica and getattr(layer, "synchronized", False):
        raise ConversionError(
            f"BatchNormalization layer {layer.name!r} is synchronized and has "
            f"virtual_batch_size={vbs}: tpushim cannot synchronise ghost batches across TPU "
            "shards. Use one or the other."
        )
    ndims = x.shape.rank
    static_batch = tf.compat.dimension_value(x.shape[0])
    if static_batch is None or static_batch % vbs:
        raise ConversionError(
            f"BatchNormalization layer {layer.name!r} has virtual_batch_size={vbs}, which must "
            f"divide the batch each core trains on ({static_batch} rows)."
        )
    most = static_batch // vbs
    real = tf.cast(tf.reduce_sum(rows), tf.int32)
    check = tf.debugging.assert_equal(
        real % vbs,
        0,
        message=f"BatchNormalization layer {layer.name!r}: its virtual_batch_size {vbs} must "
        "divide the number of rows of every batch (stock fails on this batch too)",
    )
    with tf.control_dependencies([check]):
        ghosts = tf.maximum(real // vbs, 1)
    of_row = tf.one_hot(tf.math.floormod(tf.range(static_batch), ghosts), most, dtype=x.dtype)
    members = of_row * rows[:, None]  # [batch, most]: the real rows of each ghost batch
    other = [i for i in range(1, ndims) if i not in channels]
    elements = 1.0
    for i in other:
        elements *= x.shape[i]

    def per_ghost(t):  # summed per ghost batch: [batch, ...] -> [most, ...]
        return tf.tensordot(tf.transpose(members), tf.reduce_sum(t, other, keepdims=True), 1)

    def per_row(t):  # each row's ghost batch's: [most, ...] -> [batch, ...]
        return tf.tensordot(of_row, t, 1)

    count = tf.reshape(tf.reduce_sum(members, 0) * elements, [most] + [1] * (ndims - 1))
    mean = tf.math.divide_no_nan(per_ghost(x), count)
    row_mean = per_row(mean)
    squared = tf.math.squared_difference(x, tf.stop_gradient(row_mean))
    variance = tf.math.divide_no_nan(per_ghost(squared), count)
    used = tf.reshape(tf.cast(tf.range(most) < ghosts, x.dtype), [most] + [1] * (ndims - 1))
    n = tf.cast(ghosts, x.dtype)
    batch_mean = tf.reduce_sum(mean * used, 0, keepdims=True) / n
    batch_variance = tf.reduce_sum(variance * used, 0, keepdims=True) / n
    return row_mean, per_row(variance), count, batch_mean, batch_variance
