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
  - fused (4-D / 5-D inputs by default): the same normalisation, by Keras's fused kernel fed a
    batch centred and rescaled so that its variance is the real rows' (see :func:`_fused`); the moving
    variance moves towards the variance with Bessel's correction over the real elements, as the
    fused kernel reports it;
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


def real_rows_call(padding_weight, cross_replica):
    """The call of a TRAIN clone's BatchNormalization layers (for
    :func:`tpushim._tfprivate.clone_and_build_model`), or None where Keras's own is right.

    Args:
      padding_weight: the batch's [batch] padding weight, or None for a batch without padding.
      cross_replica: the model_fn builds one shard of a TPU computation.
    """
    if padding_weight is None and not cross_replica:
        return None
    if not cross_replica:
        return _first_rows_call(padding_weight)
    # The shard's rows, made once for every layer of the step.
    shard = None if padding_weight is None else _ShardRows(padding_weight)

    def call(layer, own_call, inputs, training, mask):
        synced = getattr(layer, "synchronized", False)
        if (
            # moving statistics: padding plays no part
            _tfprivate.batchnorm_training_value(layer, training) is not True
            or (padding_weight is None and not synced)
            # Keras reshapes the inputs for ghost batches, not the mask (it cannot combine them)
            or (mask is not None and layer.virtual_batch_size is not None)
        ):
            return own_call(inputs, training=training, mask=mask)
        # Fused, Keras ignores a mask (with a warning); not fused, it weighs rows by it.
        mask = None if layer.fused else mask
        return _train_on_real_rows(layer, inputs, shard, mask, synced)

    return call


class _ShardRows:
    """A shard's real rows, as every layer of its step reads them: ``rows`` ([batch], 1 for a
    real row, 0 for padding), their number ``n``, ``has_rows`` (not a shard of padding only),
    and ``scale``: ``sqrt(batch / n)``, 1 where ``n`` is 0 (see :func:`_fused`)."""

    def __init__(self, padding_weight):
        self.rows = tf.cast(tf.greater(padding_weight, 0), tf.float32)
        self.n = tf.reduce_sum(self.rows)
        self.has_rows = tf.greater(self.n, 0)
        batch = tf.cast(tf.size(self.rows), tf.float32)
        self.scale = tf.where(self.has_rows, tf.sqrt(batch / tf.maximum(self.n, 1.0)), 1.0)


def _first_rows_call(padding_weight):
    """Off a TPU (cpu mode: shapes may vary): Keras's own call on the batch's real rows -- its
    first ones, as :func:`tpushim._padding.pad_batch` packs them -- which is stock's computation on
    its short batch, for every kind of layer. The padding rows pass through as they came (values
    the model produced; no gradient flows back through them, and they count nowhere). A full
    batch takes the whole batch: Keras's own graph, with a slice and a concat around it."""
    real = tf.reduce_sum(tf.cast(tf.greater(padding_weight, 0), tf.int32))

    def call(layer, own_call, inputs, training, mask):
        if _tfprivate.batchnorm_training_value(layer, training) is not True:
            return own_call(inputs, training=training, mask=mask)
        outputs = own_call(
            inputs[:real], training=training, mask=None if mask is None else mask[:real]
        )
        padding = tf.stop_gradient(tf.cast(inputs[real:], outputs.dtype))
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
        r, d, batch_mean, batch_variance = _tfprivate.batchnorm_renorm(
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
    """A fused layer (4-D / 5-D inputs) on a TPU shard: Keras's fused kernel, fed the batch so
    that its statistics over all rows are those of the real rows.

    With ``n`` real rows of ``N`` and ``m`` the real rows' mean, the kernel gets ``c * (x - m)``
    for a real row and 0 for a padding row, ``c = sqrt(N / n)``, and ``gamma / c``: its mean is
    0, its variance the real rows' (``c**2 * n / N`` of it), so its output on a real row is
    ``gamma * (x - m) / sqrt(variance + epsilon) + beta`` -- for every ``x``, so the gradient
    (through ``m`` too) is that of the real rows' normalisation. (Centred, the kernel's variance
    loses nothing to a large mean: XLA computes it as ``E[x^2] - E[x]^2``.) The moving mean
    moves towards ``m`` plus the kernel's mean (0 but for rounding), the moving variance towards
    the variance with Bessel's correction over the real elements, as the kernel reports it for
    stock's short batch. A full batch's numbers are Keras's within rounding.
    """
    gamma = layer.gamma if layer.gamma is not None else tf.ones(layer.moving_mean.shape)
    beta = layer.beta if layer.beta is not None else tf.zeros(layer.moving_mean.shape)
    ndims = x.shape.rank
    spatial = "DHW"[-(ndims - 2) :]
    first = layer.axis[0] in (1, -ndims + 1)
    real = tf.reshape(shard.rows > 0, [-1] + [1] * (ndims - 1))
    n, has_rows = tf.cast(shard.n, x.dtype), shard.has_rows  # (no rows: the moving statistics stay)
    c = tf.cast(shard.scale, x.dtype)
    per_row = 1.0
    for i in axes[1:]:
        per_row *= x.shape[i]
    count = n * per_row  # the real elements of each channel
    # Selected, not multiplied: whatever a padding row holds (even inf or NaN) counts for nothing.
    mean = tf.math.divide_no_nan(tf.reduce_sum(tf.where(real, x, 0.0), axes, keepdims=True), count)
    outputs, kernel_mean, kernel_variance = tf.compat.v1.nn.fused_batch_norm(
        tf.where(real, x - mean, 0.0) * c,
        gamma / c,
        beta,
        epsilon=layer.epsilon,
        is_training=True,
        data_format=("NC" + spatial) if first else ("N" + spatial + "C"),
    )
    outputs = tf.cast(outputs, inputs.dtype)
    outputs.set_shape(inputs.shape)
    # The kernel's Bessel correction is over all N rows' elements: undone, then made over the
    # real ones. (Both products are the same float where every row is real: a factor of 1.)
    elements = tf.cast(tf.shape(x)[0], x.dtype) * per_row
    factor = tf.math.divide_no_nan(
        (elements - 1.0) * count, elements * tf.maximum(count - 1.0, 1.0)
    )
    # Keras's decay for a fused layer, in graph mode: 1 - momentum computed on a tensor.
    decay = 1.0 - tf.convert_to_tensor(layer.momentum)
    batch_mean = tf.reshape(mean, layer.moving_mean.shape) + kernel_mean / c
    layer.add_update(_moving_average(layer.moving_mean, batch_mean, decay, has_rows))
    layer.add_update(
        _moving_average(layer.moving_variance, kernel_variance * factor, decay, has_rows)
    )
    return outputs


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
        if cross_replica:
            sums = tf.unstack(tf.compat.v1.tpu.cross_replica_sum(tf.stack(sums)))
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
