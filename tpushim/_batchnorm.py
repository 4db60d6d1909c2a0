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


def real_rows_call(padding_weight, cross_replica, replica_sum=None):
    """The call of a TRAIN clone's BatchNormalization layers (for
    :func:`tpushim._tfprivate.clone_and_build_model`), or None where Keras's own is right.

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
            _tfprivate.batchnorm_training_value(layer, training) is not True
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

    What the fused layers of a step share (:meth:`step`, :meth:`per_row`) is made once, by the
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
        key = (key, graph, _tfprivate.control_flow_context(graph))
        if key not in self._made:
            with tf.name_scope("tpushim_real_rows"):
                self._made[key] = make()
        return self._made[key]

    def _weighed(self, dtype):
        """``(weight, n, batch, fraction, c, 1 / c)``: ``weight`` [batch] 1 for a real row and 0
        for padding, ``n`` its sum (1 on a shard of padding only: its mean is 0, the kernel's
        input all 0, every number finite, and its decay 0), ``fraction`` ``n / batch``, ``c``
        ``sqrt(batch / n)``."""

        def make():
            weight = tf.cast(self.rows, dtype)
            n = tf.maximum(tf.cast(self.n, dtype), 1.0)
            batch = tf.compat.dimension_value(weight.shape[0])  # static on a TPU
            if batch is None:
                batch = tf.cast(tf.size(weight), dtype)
            fraction = n / batch
            return weight, n, batch, fraction, tf.math.rsqrt(fraction), tf.sqrt(fraction)

        return self._once(("weighed", dtype), make)

    def step(self, dtype, ndims):
        """``(real, is_real, scaled, fraction, 1 / c)`` of the step's rows (see
        :meth:`_weighed`) for ``ndims``-D inputs, the first three shaped to broadcast over a row:
        the weight, whether it is 1 (a bool), and ``c`` times the weight."""

        def make():
            weight, _, _, fraction, c, inverse_c = self._weighed(dtype)
            real = tf.reshape(weight, [-1] + [1] * (ndims - 1))
            return real, tf.greater(real, 0), c * real, fraction, inverse_c

        return self._once(("step", dtype, ndims), make)

    def per_row(self, dtype, per_row):
        """``(weights, variance factor)`` for layers with ``per_row`` elements of a channel per
        row: each row's weight in the real elements' mean, and what turns the fused kernel's
        variance into stock's on the real rows (see :func:`_fused`)."""

        def make():
            weight, n, batch, _, _, _ = self._weighed(dtype)
            count = n * per_row  # the real elements of each channel
            elements = batch * per_row
            # The kernel's Bessel correction is over all rows' elements: undone, then made over
            # the real ones (the same float on both sides where every row is real: 1).
            factor = ((elements - 1.0) * count) / (elements * tf.maximum(count - 1.0, 1.0))
            return weight / count, factor

        return self._once(("per_row", dtype, per_row), make)

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
        if _tfprivate.batchnorm_training_value(layer, training) is not True:
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
    that its statistics over all rows are those of the real rows, with a gradient of its own.

    With ``n`` real rows of ``N`` and ``m`` the real rows' mean (one weighted sum), the kernel gets
    ``c * (x - m)`` for a real row and 0 for a padding row, ``c = sqrt(N / n)``, and ``gamma / c``:
    its mean is 0, its variance the real rows' (``c**2 * n / N`` of it), so its output on a real
    row is ``gamma * (x - m) / sqrt(variance + epsilon) + beta``. Its gradient
    (:func:`_fused_gradient`) is the real rows' normalisation's, by Keras's gradient kernel; a
    padding row gets none. The moving mean moves towards ``m``, the moving variance towards the
    variance with Bessel's correction over the real elements, as the kernel reports it for
    stock's short batch. A full batch's numbers are Keras's within rounding.

    Per layer this adds to Keras's own ops one weighted sum, a centring and a scaling (and
    ``gamma / c``) forward, and a weighted sum, a select and three scalings backward; what the
    layers share (the rows' weights, the scale, the decay) is made once per step.
    """
    dtype = x.dtype
    ndims = x.shape.rank
    first = layer.axis[0] in (1, -ndims + 1)
    spatial = "DHW"[-(ndims - 2) :]
    per_row = 1
    for i in axes[1:]:
        per_row *= x.shape[i]
    real, is_real, scaled, fraction, inverse_c = shard.step(dtype, ndims)
    weights, factor = shard.per_row(dtype, per_row)
    gamma = tf.convert_to_tensor(
        layer.gamma if layer.gamma is not None else tf.ones(layer.moving_mean.shape, dtype)
    )
    beta = tf.convert_to_tensor(
        layer.beta if layer.beta is not None else tf.zeros(layer.moving_mean.shape, dtype)
    )
    mean = tf.einsum(_channel_sum(ndims, first), weights, x)  # [channels]
    centred = x - (tf.reshape(mean, [-1] + [1] * (ndims - 2)) if first else mean)
    outputs, _, kernel_variance = tf.compat.v1.nn.fused_batch_norm(
        centred * scaled,
        gamma * inverse_c,
        beta,
        epsilon=layer.epsilon,
        is_training=True,
        data_format=("NC" + spatial) if first else ("N" + spatial + "C"),
    )
    graph = tf.compat.v1.get_default_graph()
    with graph.gradient_override_map({"IdentityN": _FUSED_GRADIENT}):
        outputs = tf.identity_n(
            [
                outputs,
                x,
                gamma,
                beta,
                weights,
                real,
                is_real,
                fraction,
                inverse_c,
            ]
        )[0]
    outputs = tf.cast(outputs, inputs.dtype)
    outputs.set_shape(inputs.shape)
    decay = shard.decay(layer.momentum, layer.moving_mean.dtype.base_dtype)
    layer.add_update(_gated_moving_average(layer.moving_mean, mean, decay))
    layer.add_update(_gated_moving_average(layer.moving_variance, kernel_variance * factor, decay))
    return outputs


_FUSED_GRADIENT = "TpushimRealRowsFusedBatchNorm"


def _channel_sum(ndims, first):
    """The einsum of a weighted sum over rows and positions: ``[batch] x [batch, ...] ->
    [channels]``."""
    dims = "abcd"[: ndims - 1]
    return f"n,n{dims}->{dims[0] if first else dims[-1]}"


def _fused_gradient(op, dy, *unused):
    """The gradient of :func:`_fused`'s output: ``(x, gamma, beta)``'s, by Keras's gradient kernel.

    With ``mu`` the real rows' mean of ``dy``, the kernel gets ``dy`` on the real rows and ``mu``
    on the padding rows (selected: whatever a padding row's ``dy`` holds), so its means
    over all rows are the real rows' means (``mu``; and, the padding rows' normalised values being
    0, ``mean(dy * normalised) / c``), and ``gamma`` for the scale: its ``x`` gradient is then
    that of the real rows' normalisation, ``gamma / sigma * (dy - mu - xhat * mean(dy * xhat))``
    (kept on the real rows only); its scale and offset gradients are ``c`` and ``N / n`` times
    the real rows'.
    """
    del unused
    kernel = op.inputs[0].op
    _, x, gamma, _, weights, real, is_real, fraction, inverse_c = op.inputs
    nones = [None] * 5
    if dy is None:
        return [None, None, None, None] + nones
    data_format = kernel.get_attr("data_format").decode()
    ndims = x.shape.rank
    first = data_format.startswith("NC")
    mu = tf.einsum(_channel_sum(ndims, first), weights, dy)
    if first:
        mu = tf.reshape(mu, [-1] + [1] * (ndims - 2))
    dx, dscale, doffset, _, _ = tf.raw_ops.FusedBatchNormGradV3(
        y_backprop=tf.where(is_real, dy, mu),
        x=kernel.inputs[0],
        scale=gamma,
        reserve_space_1=kernel.outputs[3],
        reserve_space_2=kernel.outputs[4],
        reserve_space_3=kernel.outputs[5],
        epsilon=kernel.get_attr("epsilon"),
        data_format=data_format,
        is_training=True,
    )
    return [None, dx * real, dscale * inverse_c, doffset * fraction] + nones


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
