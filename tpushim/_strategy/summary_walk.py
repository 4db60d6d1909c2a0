"""A model's own ``tf.compat.v1.summary`` on the strategy engine: its tensor walked back, side by
side with the same tensor in stock's graph, to what the host is given (:func:`summary_feeds`):
tensors of one row per example whose every row is that example's own, gathered from the
replicas; a training BatchNormalization's output, which the engine computes with ops of its
own, gathered as the replicas computed it; weights; constants. The host's copy of stock's
graph computes the rest over the global batch, as stock's graph does. Which ops keep an
example's rows its own is this module's allowlist (:func:`keeps_rows`); any other op mixes
them, and the walk goes on past it."""

import re

import tensorflow as tf

from tpushim import _padding, _tfprivate

#: How the engine feeds one tensor of stock's graph that a model's summary is computed from: the
#: global batch's real rows gathered from the replicas; the first replica's value (the same on
#: every one: a weight read before its update); a value known when the step is traced.
ROWS, FIXED, CONST = "rows", "fixed", "const"


def _walked(tensor, sources, memo, decide):
    """``memo[tensor.ref()]``, deciding each tensor after the inputs it asks for: a tensor of
    ``sources`` (refs) is True; any other gets ``decide(t)``, which returns the inputs it still
    needs (a non-empty list: decided first, then ``t`` asked again) or its value."""
    stack = [tensor]
    while stack:
        t = stack[-1]
        key = t.ref()
        if key not in memo:
            value = True if key in sources else decide(t)
            if isinstance(value, list) and value:
                stack.extend(value)
                continue
            memo[key] = value
        stack.pop()
    return memo[tensor.ref()]


def _reads(tensor, sources, memo):
    """Whether ``tensor`` is computed from one of ``sources`` (refs); ``memo``: refs -> bool."""

    def decide(t):
        pending = [i for i in t.op.inputs if i.ref() not in memo]
        return pending or any(memo[i.ref()] for i in t.op.inputs)

    return _walked(tensor, sources, memo, decide)


#: Ops of which each output row is computed from the same row of each input that carries rows
#: (an elementwise op broadcasting a weight over the rows, a layer's kernel): a per-row tensor
#: computed by them alone from the step's inputs is each example's own value, the same in a
#: replica as in stock's global batch. Any other op (a reduction over the rows, a cumulative
#: sum, a training BatchNormalization's statistics, an unknown op) mixes rows until shown not
#: to (:func:`_carried`).
_ELEMENTWISE = frozenset(
    [
        "Abs",
        "Acos",
        "Acosh",
        "Add",
        "AddN",
        "AddV2",
        "Asin",
        "Asinh",
        "Atan",
        "Atan2",
        "Atanh",
        "BiasAdd",
        "Cast",
        "Ceil",
        "CheckNumerics",
        "ClipByValue",
        "Cos",
        "Cosh",
        "Digamma",
        "Div",
        "DivNoNan",
        "Elu",
        "Equal",
        "Erf",
        "Erfc",
        "Exp",
        "Expm1",
        "Floor",
        "FloorDiv",
        "FloorMod",
        "Greater",
        "GreaterEqual",
        "Identity",
        "Inv",
        "IsFinite",
        "IsInf",
        "IsNan",
        "LeakyRelu",
        "Less",
        "LessEqual",
        "Lgamma",
        "Log",
        "Log1p",
        "LogicalAnd",
        "LogicalNot",
        "LogicalOr",
        "Maximum",
        "Minimum",
        "Mod",
        "Mul",
        "MulNoNan",
        "Neg",
        "NotEqual",
        "OnesLike",
        "Pow",
        "PreventGradient",
        "RealDiv",
        "Reciprocal",
        "Relu",
        "Relu6",
        "Rint",
        "Round",
        "Rsqrt",
        "Select",
        "SelectV2",
        "Selu",
        "Sigmoid",
        "Sign",
        "Sin",
        "Sinh",
        "Snapshot",
        "Softplus",
        "Softsign",
        "Sqrt",
        "Square",
        "SquaredDifference",
        "StopGradient",
        "Sub",
        "Tan",
        "Tanh",
        "TruncateDiv",
        "Xdivy",
        "Xlogy",
        "ZerosLike",
    ]
)
#: Ops over each example's own rows of a batch-first tensor (the rows axis is not touched).
_PER_EXAMPLE = frozenset(
    [
        "AvgPool",
        "AvgPool3D",
        "Conv2D",
        "Conv3D",
        "DepthwiseConv2dNative",
        "MaxPool",
        "MaxPool3D",
        "MaxPoolV2",
    ]
)
_RESHAPES = frozenset(("Reshape", "ExpandDims", "Squeeze"))
_REDUCTIONS = frozenset(("Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "ArgMax", "ArgMin"))


def _axes(op, index, rank):
    """The axes (non-negative) an op's constant input ``index`` names, or None if not known."""
    value = tf.get_static_value(op.inputs[index])
    if value is None or rank is None:
        return None
    return {int(a) % max(rank, 1) for a in tf.nest.flatten(value.tolist())}


def _carried(tensor):
    """Which inputs of ``tensor``'s op carry its rows (each output row computed from the same
    row of each of them and from inputs that do not read the batch), as indices; the other
    inputs then must not read the batch, except those it lists as only shaping (a reshape's
    shape: a row-major reshape keeping the rows first and their count keeps each row's values
    together), as (carried, shaping). None where the op mixes rows or is not known not to."""
    op, rank = tensor.op, tensor.shape.rank
    kind = op.type
    everything = tuple(range(len(op.inputs)))
    if kind in _ELEMENTWISE:
        return everything, ()
    if kind in _PER_EXAMPLE:
        return (0,), ()
    if kind in _RESHAPES:
        return (0,), everything[1:]
    if kind in ("Softmax", "LogSoftmax"):
        return ((0,), ()) if rank and rank >= 2 else None  # over the last axis, not the rows
    if kind == "MatMul":
        return None if op.get_attr("transpose_a") else ((0,), ())
    if kind in _REDUCTIONS:
        axes = _axes(op, 1, op.inputs[0].shape.rank)
        return ((0,), ()) if axes is not None and 0 not in axes else None
    if kind == "Transpose":
        perm = tf.get_static_value(op.inputs[1])
        return ((0,), ()) if perm is not None and int(perm[0]) == 0 else None
    if kind == "ConcatV2":
        axes = _axes(op, len(op.inputs) - 1, rank)
        return (everything[:-1], ()) if axes is not None and 0 not in axes else None
    if kind == "Pack":
        return (everything, ()) if op.get_attr("axis") % (rank or 1) != 0 else None
    if kind == "GatherV2":
        axes = _axes(op, 2, op.inputs[0].shape.rank)
        if axes is None or op.get_attr("batch_dims"):
            return None
        return ((1,), ()) if 0 in axes else ((0,), ())  # looked up by each row's ids; columns
    if kind == "ResourceGather":
        return ((1,), ())
    if kind == "OneHot":
        return (0,), ()
    if kind in ("Slice", "StridedSlice"):  # all of the rows (their count is checked), in order
        if kind == "StridedSlice":
            strides = tf.get_static_value(op.inputs[3])
            masks = op.get_attr("new_axis_mask") | op.get_attr("shrink_axis_mask")
            if strides is None or int(strides[0]) != 1 or masks & 1:
                return None
        return (0,), everything[1:]
    return None


def keeps_rows(tensor, rows, sources, reads, memo):
    """Whether ``tensor`` (of one row per example: ``rows`` of them) is computed from the step's
    inputs (``sources``, refs) with each of its rows from the same example's rows alone: then
    a replica's value of it is stock's over the global batch, row for row. ``reads``: the memo
    of :func:`_reads`; ``memo``: refs -> bool."""

    def decide(t):
        how = _carried(t) if t.shape.rank and t.shape[0] == rows else None
        if how is None:
            return False
        carried, shaping = how
        pending = []
        for index, given in enumerate(t.op.inputs):
            if index in shaping or not _reads(given, sources, reads):
                continue  # a weight, a constant, a draw not of the batch: the same role
            if index not in carried or not given.shape.rank or given.shape[0] != rows:
                return False  # reads the batch, not row for row: rows were mixed
            if t.op.type in _ELEMENTWISE and given.shape.rank != t.shape.rank:
                return False  # broadcast along another axis than the rows
            if given.ref() not in memo:
                pending.append(given)
            elif not memo[given.ref()]:
                return False
        return pending or True

    return _walked(tensor, sources, memo, decide)


#: Stateful ops that read a weight: the same value on every replica and in stock's graph.
_READS = frozenset(("ReadVariableOp", "ResourceGather", "VarHandleOp"))


def _drawn(tensor):
    """The first random or other stateful op (not a weight's read) ``tensor`` is computed from,
    or None: the host cannot compute such a value as stock's graph drew it, and a replica's
    is not every replica's."""
    seen, stack = set(), [tensor.op]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.op_def.is_stateful and op.type not in _READS:
            return op
        stack.extend(i.op for i in op.inputs)
    return None


def _drawn_reason(op):
    return (
        f"computed across the batch's rows from a random draw or another stateful op, "
        f"{op.type} ({op.name}), which the host cannot draw again as stock's graph drew it"
    )


def _layer_scope(name, layer):
    """The name scope of ``layer`` (its name, or the name and a call's ``_N``) in an op's
    ``name``, the innermost one, or None."""
    parts = name.split("/")[:-1]
    for part in reversed(parts):
        if part == layer or re.fullmatch(re.escape(layer) + r"_\d+", part):
            return part
    return None


def _same_layer(mine, theirs, layer):
    """Whether stock's ``theirs`` is computed in the same call of ``layer`` as the engine's
    ``mine`` (the walk paired them): the same name scope of the layer, and no op of stock's
    after the layer's but an Identity (Keras's around a layer's output)."""
    scope = _layer_scope(mine.op.name, layer)
    while theirs.op.type == "Identity" and _layer_scope(theirs.op.name, layer) is None:
        theirs = theirs.op.inputs[0]
    return scope is not None and _layer_scope(theirs.op.name, layer) == scope


@_tfprivate.graph.not_converted
def summary_feeds(tensor, element, stock, normalized=None):
    """How a replica's summarized ``tensor`` reaches stock's value on the host, where ``stock``
    (the same tensor in stock's graph: its summary op's input) is computed in a copy of stock's
    graph: the frontier of tensors it is computed from that the host is given, as
    [(stock's tensor, :data:`ROWS` or :data:`FIXED`, the replica's tensor), or (stock's tensor,
    :data:`CONST`, its value)], the rest computed on the host as stock's graph computes it over
    the global batch (a column mean, a batch statistic, strings). Or why it cannot (a sentence).

    ``normalized`` (refs -> a layer's name): the outputs of the step's training
    BatchNormalization layers, which the engine computes with ops of its own over a replica's
    real rows (:mod:`tpushim._batchnorm`) where stock's graph has Keras's: each is gathered as
    the replicas computed it, fed as the same layer's output in stock's graph. On one replica,
    and for a synchronized layer, that is stock's value; on several, each replica normalised
    its own rows, as training does."""
    normalized = normalized or {}
    if tensor is None:
        return "no tensor"
    if not tf.is_tensor(tensor):
        return []  # a Python value: stock's op holds it as a constant
    features = element[0] if isinstance(element, tuple) else element
    rows = features[_padding.PADDING_KEY].shape[0]
    sources = {t.ref() for t in tf.nest.flatten(element) if tf.is_tensor(t)}
    memo, kept, fed, seen = {}, {}, [], set()
    stack = [(tensor, stock)]
    while stack:
        mine, theirs = stack.pop()
        if theirs.ref() in seen:
            continue
        seen.add(theirs.ref())
        if not _reads(mine, sources, memo):
            known = tf.get_static_value(mine)
            if known is None:
                drawn = _drawn(mine)
                if drawn is not None:
                    return _drawn_reason(drawn)
                fed.append((theirs, FIXED, mine))  # a weight, read before its update
            elif theirs.op.type != "Const":
                fed.append((theirs, CONST, known))
            continue
        per_row = mine.shape.rank and mine.shape[0] == rows
        if theirs.shape.rank and theirs.shape[0] is not None:
            per_row = False  # stock's batch is unknown: a tensor it knows is not one row each
        layer = normalized.get(mine.ref())
        if per_row and layer is not None and _same_layer(mine, theirs, layer):
            fed.append((theirs, ROWS, mine))
            continue
        # Only where no op before it mixed the rows (a replica's column mean, a cumulative
        # sum over its rows) is a replica's row stock's row: else walked back to such rows.
        if per_row and mine.dtype != tf.string and keeps_rows(mine, rows, sources, memo, kept):
            fed.append((theirs, ROWS, mine))
            continue
        if mine.op.op_def.is_stateful:
            return _drawn_reason(mine.op)
        ops = mine.op, theirs.op
        if (
            not ops[0].inputs
            or ops[0].type != ops[1].type
            or len(ops[0].inputs) != len(ops[1].inputs)
        ):
            what = "strings" if mine.dtype == tf.string else f"shape {mine.shape}"
            return (
                f"a tensor of {what} computed from the batch by {ops[0].type} "
                f"({ops[0].name}), which stock's graph computes otherwise ({ops[1].type})"
            )
        stack.extend(zip(ops[0].inputs, ops[1].inputs))
    return fed
