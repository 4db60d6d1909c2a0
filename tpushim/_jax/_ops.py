"""TensorFlow ops that Keras's training graphs use and ``tf2jax`` has no JAX for, registered
with ``tf2jax`` as TensorFlow's kernels compute them (their values and their gradients).

* ``SoftmaxCrossEntropyWithLogits``: Keras's ``categorical_crossentropy`` on a softmax output
  reads the softmax's logits and calls ``tf.nn.softmax_cross_entropy_with_logits``. Its kernel
  returns (loss, backprop): ``-sum(labels * log_softmax(logits))`` and ``softmax(logits) -
  labels``; TensorFlow's gradient of the loss is ``backprop`` times the upstream gradient (for
  the logits) and ``-log_softmax(logits)`` times it (for the labels), whatever the labels sum
  to: so is this one's.

* ``PlaceholderWithDefault``: ``tf.vectorized_map`` (the step's per-row losses) feeds its
  loop's index through one, fed nothing: its value is its input's.

* ``DivNoNan`` (replacing ``tf2jax``'s): its gradient does not sum over the dimensions the
  division broadcast, so JAX rejects it where the divisor broadcasts (an embedding column's
  ``mean`` combiner divides [batch, dimension] by [batch, 1]). This one is ``x / y`` with 0
  where ``y`` is 0, differentiated by JAX: ``dx = g / y`` and ``dy = -g x / y**2`` where ``y``
  is not 0 and 0 where it is, TensorFlow's gradient, summed over what broadcast.

* ``DenseBincount`` and ``Bincount`` (``tf.math.bincount``: ``CategoryEncoding``'s multi_hot,
  one_hot and count modes, ``count_weights`` its weights): each value's one-hot row over the
  bins, summed (times its weight) or, with ``binary_output``, 1 where any; a value outside the
  bins counts nowhere, as TensorFlow's kernel skips it (``CategoryEncoding`` asserts the range
  before). Its bins are a tensor TensorFlow computes from the values (``min(maxlength,
  max(minlength, max(values) + 1))``), which JAX cannot take as a shape: :func:`static_bins`
  reads each op's static output shape from the traced graph, as Keras set it (or its equal
  ``minlength`` and ``maxlength``), for the conversion. An op whose bins the graph does not fix
  is refused, naming it.

* ``Conv3D`` and ``Conv3DBackpropInputV2`` (``Conv3D`` and ``Conv3DTranspose`` layers): the
  convolution as ``jax.lax.conv_general_dilated`` computes it with the op's strides, padding,
  dilations and data format; the transpose the convolution's vector-Jacobian product with
  respect to its input (what TensorFlow's op computes: the gradient of ``Conv3D``'s input).

* ``MaxPool3D`` and ``AvgPool3D`` (``MaxPooling3D``, ``AveragePooling3D``): windows reduced by
  ``jax.lax.reduce_window``; an average divides by the window's elements inside the input, as
  TensorFlow's kernel does with SAME padding.

* ``Bucketize`` (``Discretization``, a bucketized feature column): the index of the first
  boundary above each value (``searchsorted`` on the right), as an int32.

Registered (DivNoNan replaced) once, at the first import (``tf2jax``'s op table is the process's).
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
from tf2jax._src import ops as _tf2jax_ops  # its own registry (tf2jax.experimental's way)


@jax.custom_vjp
def softmax_cross_entropy(logits, labels):
    return -jnp.sum(labels * jax.nn.log_softmax(logits, axis=-1), axis=-1)


def _forward(logits, labels):
    log_softmax = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(labels * log_softmax, axis=-1), (log_softmax, labels)


def _backward(saved, g):
    log_softmax, labels = saved
    g = g[..., None]
    return g * (jnp.exp(log_softmax) - labels), g * -log_softmax


softmax_cross_entropy.defvjp(_forward, _backward)


def _softmax_cross_entropy_with_logits(proto):
    del proto  # attrs: T

    def kernel(features, labels):
        loss = softmax_cross_entropy(features, labels)
        return loss, jax.nn.softmax(features, axis=-1) - labels

    return kernel


if "SoftmaxCrossEntropyWithLogits" not in _tf2jax_ops._jax_ops:
    _tf2jax_ops.register_operation("SoftmaxCrossEntropyWithLogits")(
        _softmax_cross_entropy_with_logits
    )


def _placeholder_with_default(proto):
    del proto  # attrs: dtype, shape
    return lambda value: value


if "PlaceholderWithDefault" not in _tf2jax_ops._jax_ops:
    _tf2jax_ops.register_operation("PlaceholderWithDefault")(_placeholder_with_default)


def div_no_nan(x, y):
    zero = y == 0
    safe = jnp.where(zero, jnp.ones_like(y), y)
    return jnp.where(zero, jnp.zeros_like(x / safe), x / safe)


def _div_no_nan(proto):
    del proto  # attrs: T
    return div_no_nan


_tf2jax_ops._jax_ops["DivNoNan"] = _div_no_nan


#: a bincount op's name -> its number of bins, from the graph being converted (static_bins)
_BINS = {}


@contextlib.contextmanager
def static_bins(graph):
    """Within: each ``DenseBincount`` / ``Bincount`` of ``graph`` (a traced function's) has its
    number of bins, the last dimension of its output's static shape where the graph fixes it."""
    found = {}
    for op in graph.get_operations():
        if op.type in ("DenseBincount", "Bincount"):
            shape = op.outputs[0].shape
            if shape.rank and shape[-1] is not None:
                found[op.name] = int(shape[-1])
            elif _equal_bounds(op.inputs[1]) is not None:
                found[op.name] = _equal_bounds(op.inputs[1])
    _BINS.update(found)
    try:
        yield
    finally:
        for name in found:
            _BINS.pop(name, None)


def _equal_bounds(size):
    """``tf.math.bincount``'s size where its ``minlength`` equals its ``maxlength`` (constants):
    ``min(maxlength, max(minlength, ...))``, that number whatever the values; else None."""
    import tensorflow as tf

    if size.op.type != "Minimum" or size.op.inputs[1].op.type != "Maximum":
        return None
    upper = tf.get_static_value(size.op.inputs[0])
    lower = tf.get_static_value(size.op.inputs[1].op.inputs[0])
    if upper is None or lower is None or np.ndim(upper) or int(upper) != int(lower):
        return None
    return int(upper)


def bincount(values, bins, weights, binary_output, dtype):
    """``tf.raw_ops.DenseBincount``'s value: [..., bins] over the last axis of ``values``
    (all of them when rank 1), ``weights`` empty or like ``values``."""
    one_hot = jax.nn.one_hot(values, bins, dtype=dtype)  # a value outside the bins: a 0 row
    if binary_output:
        return (jnp.sum(one_hot, axis=-2) > 0).astype(dtype)
    if jnp.size(weights):
        one_hot = one_hot * jnp.asarray(weights, dtype)[..., None]
    return jnp.sum(one_hot, axis=-2)


def _bins(proto):
    """The op's bins as the graph converting fixes them (read when ``tf2jax`` builds the op's
    kernel, during the conversion), or a function of its ``size`` input where it is a number."""
    fixed = _BINS.get(proto.name)

    def bins(size):
        if isinstance(size, (np.ndarray, int, np.integer)):
            return int(size)
        if fixed is None:
            raise NotImplementedError(
                f"{proto.op} {proto.name!r}: its number of bins is computed from its values "
                "and its output's shape does not fix it"
            )
        return fixed

    return bins


def _dtype(proto):
    import tensorflow as tf

    return tf.as_dtype(proto.attr["T"].type).as_numpy_dtype


def _dense_bincount(proto):
    binary, dtype, bins = proto.attr["binary_output"].b, _dtype(proto), _bins(proto)
    return lambda values, size, weights: bincount(values, bins(size), weights, binary, dtype)


def _bincount(proto):  # flattened values, [bins] out
    dtype, bins = _dtype(proto), _bins(proto)
    return lambda values, size, weights: bincount(
        jnp.ravel(values), bins(size), jnp.ravel(weights), False, dtype
    )


for _name, _kernel in (("DenseBincount", _dense_bincount), ("Bincount", _bincount)):
    if _name not in _tf2jax_ops._jax_ops:
        _tf2jax_ops.register_operation(_name)(_kernel)


def _conv3d_of(proto):
    """``conv(x, filters)`` with the op's strides, padding, dilations and data format."""
    layout = proto.attr["data_format"].s.decode() or "NDHWC"
    spatial = slice(1, 4) if layout == "NDHWC" else slice(2, 5)
    strides = list(proto.attr["strides"].list.i)[spatial]
    dilations = list(proto.attr["dilations"].list.i)[spatial] or [1, 1, 1]
    padding = proto.attr["padding"].s.decode()
    if padding not in ("SAME", "VALID"):
        raise NotImplementedError(f"{proto.op} {proto.name!r}: padding {padding}")

    def conv(x, filters):
        return jax.lax.conv_general_dilated(
            x,
            filters,
            window_strides=strides,
            padding=padding,
            rhs_dilation=dilations,
            dimension_numbers=(layout, "DHWIO", layout),
        )

    return conv


def _conv3d(proto):
    return _conv3d_of(proto)


def _conv3d_backprop_input(proto):
    conv = _conv3d_of(proto)

    def kernel(input_sizes, filters, out_backprop):
        shape = tuple(int(d) for d in np.asarray(input_sizes))
        zeros = jnp.zeros(shape, out_backprop.dtype)
        _, vjp = jax.vjp(lambda x: conv(x, filters), zeros)
        return vjp(out_backprop)[0]

    return kernel


for _name, _kernel in (("Conv3D", _conv3d), ("Conv3DBackpropInputV2", _conv3d_backprop_input)):
    if _name not in _tf2jax_ops._jax_ops:
        _tf2jax_ops.register_operation(_name)(_kernel)


def _pool3d(proto, average):
    ksize, strides = list(proto.attr["ksize"].list.i), list(proto.attr["strides"].list.i)
    padding = proto.attr["padding"].s.decode()

    def kernel(x):
        if not average:
            return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, ksize, strides, padding)
        total = jax.lax.reduce_window(x, 0.0, jax.lax.add, ksize, strides, padding)
        ones = jnp.ones(x.shape, x.dtype)
        count = jax.lax.reduce_window(ones, 0.0, jax.lax.add, ksize, strides, padding)
        return total / count

    return kernel


for _name, _average in (("MaxPool3D", False), ("AvgPool3D", True)):
    if _name not in _tf2jax_ops._jax_ops:
        _tf2jax_ops.register_operation(_name)(lambda proto, a=_average: _pool3d(proto, a))


def _bucketize(proto):
    boundaries = np.asarray(list(proto.attr["boundaries"].list.f), np.float32)
    return lambda x: jnp.searchsorted(boundaries, x, side="right").astype(jnp.int32)


if "Bucketize" not in _tf2jax_ops._jax_ops:
    _tf2jax_ops.register_operation("Bucketize")(_bucketize)


class UnboundedLoop(NotImplementedError):
    """A ``While`` whose trip count the loop's own values do not fix before it runs."""


#: the trip count of a loop no cond will stop sooner: past it, no static bound is found
_MOST_TRIPS = 1_000_000

#: whether a loop with no trip count raises :class:`UnboundedLoop` (else: ``lax.while_loop``)
_BOUNDED = []


@contextlib.contextmanager
def loops_bounded():
    """Within: a loop whose values decide its iterations raises :class:`UnboundedLoop` (a
    training step's, which JAX cannot differentiate); outside, it runs as ``lax.while_loop``
    (evaluation's and prediction's forward pass)."""
    _BOUNDED.append(True)
    try:
        yield
    finally:
        _BOUNDED.pop()


def _depends(jaxpr, outputs):
    """Which of ``jaxpr``'s inputs the ``outputs`` (booleans) read."""
    from jax._src.interpreters import partial_eval as pe

    return pe.dce_jaxpr(jaxpr, list(outputs))[1]


def _trip_count(cond, body, args):
    """How many times the loop ``cond``/``body`` runs from ``args``, where what its condition reads
    (and what that reads in the body, closed over the iterations) is known before the loop runs
    (a recurrent layer's time counter against its static number of time steps); else None."""
    from jax._src.interpreters import partial_eval as pe

    cond_j, body_j = jax.make_jaxpr(cond)(args), jax.make_jaxpr(body)(args)
    read = list(_depends(cond_j.jaxpr, [True]))
    while True:  # the inputs the condition reads, through the body, closed
        wider = [a or b for a, b in zip(read, _depends(body_j.jaxpr, read))]
        if wider == read:
            break
        read = wider
    if any(r and isinstance(a, jax.core.Tracer) for r, a in zip(read, args)):
        return None
    counter, _ = pe.dce_jaxpr(body_j.jaxpr, read, instantiate=read)
    test, _ = pe.dce_jaxpr(cond_j.jaxpr, [True], instantiate=read)
    values = [np.asarray(a) for r, a in zip(read, args) if r]
    with jax.ensure_compile_time_eval():
        for trips in range(_MOST_TRIPS + 1):
            (go,) = jax.core.eval_jaxpr(test, cond_j.consts, *values)
            if not bool(go):
                return trips
            values = jax.core.eval_jaxpr(counter, body_j.consts, *values)
    return None


class _StaticWhile(_tf2jax_ops._StatelessWhile):
    """``While``/``StatelessWhile`` (a recurrent layer's loop over its time steps, a
    ``tf.while_loop``) as ``jax.lax.scan`` over the loop's trip count, found before it runs
    (:func:`_trip_count`), which JAX differentiates backwards (its ``lax.while_loop`` it cannot).
    A loop whose trip count its values decide (a condition on the data) is ``tf2jax``'s
    ``lax.while_loop`` (a forward pass), or :class:`UnboundedLoop` naming it where a training step
    is checked (:func:`loops_bounded`)."""

    def __call__(self, *all_args, cond_fun, body_fun, rng=None):
        split, merge = _tf2jax_ops._split_args, _tf2jax_ops._merge_args
        consts, traced = split(all_args, body_fun.output_is_input)
        idxs, trace_args = zip(*traced)

        def cond(args):
            return cond_fun(*merge(consts, tuple(zip(idxs, args))), rng=None)[0]

        def body(args):
            out = body_fun(*merge(consts, tuple(zip(idxs, args))), rng=None)
            return tuple(out[i] for i in idxs)

        specs = jax.eval_shape(body, tuple(trace_args))
        trace_args = tuple(  # a TensorList not yet written: zeros of what the body writes
            jnp.zeros(s.shape, s.dtype) if getattr(a, "size", 1) == 0 and s.shape else a
            for a, s in zip(trace_args, specs)
        )
        trips = None if rng is not None else _trip_count(cond, body, trace_args)
        if trips is None and not _BOUNDED:
            return super().__call__(*all_args, cond_fun=cond_fun, body_fun=body_fun, rng=rng)
        if trips is None:
            raise UnboundedLoop(
                f"{self.name!r}: its number of iterations is decided by its values"
                + (" (and it draws random numbers)" if rng is not None else "")
            )
        init = tuple(jnp.asarray(a, s.dtype) for a, s in zip(trace_args, specs))
        out, _ = jax.lax.scan(lambda c, _: (body(c), None), init, None, length=trips)
        return merge(consts, tuple(zip(idxs, out)))


def _static_while(proto):
    loop = _tf2jax_ops._stateless_while(proto)
    static = _StaticWhile(loop.inner_fn_names)
    static.name = proto.name
    return static


for _name in ("While", "StatelessWhile"):
    _tf2jax_ops._jax_ops[_name] = _static_while
