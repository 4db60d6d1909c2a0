"""A functional model's ``SparseTensor`` inputs (``Input(sparse=True)``), which no TPU is fed:
which layers reading them run on the host, and which inputs the host makes dense at their
static width, on every engine (the strategy engine and the TPUEstimator path through
:mod:`tpushim._host_part`, the JAX engine through its host feed).

A ``CategoryEncoding`` (multi_hot, count; dense output) and a ``Lambda`` of weight-free sparse
ops with a dense output, reading only the model's inputs, run on the host, stock's own layer on
stock's ``SparseTensor``: their outputs are fed. A ``Dense`` reading one gets it dense (its
matmul is the sum ``embedding_lookup_sparse`` makes of the same rows), where the optimizer
updates its kernel from a dense gradient as stock's does from its sparse one. Any other reader
is refused by name, before anything is written.
"""

import tensorflow as tf

from tpushim import _tfprivate
from tpushim._errors import ConversionError


def refuse(engine, name, layer, what):
    """The refusal of a model whose sparse input ``name`` ``layer`` reads (``what``: why)."""
    raise ConversionError(
        f"{engine} does not run a model whose input {name!r} is a SparseTensor read by "
        f"{type(layer).__name__} {layer.name!r}: {what}. It makes a sparse input dense on the "
        "host for a CategoryEncoding (dense output), a Dense or a Lambda of weight-free sparse "
        "ops with a dense output reading only the model's inputs; give the model a "
        "dense Input and make the values dense in the input_fn (tf.sparse.to_dense). Nothing "
        "was written."
    )


def refuse_fed(dataset, engine):
    """``dataset``, where no ``SparseTensor`` is left among its features once the host ran its
    part: one left would reach the devices (a subclassed model's call reads it there, or no
    ``Input(sparse=True)`` of a functional model's takes it), and no TPU is fed one.

    Raises:
      ConversionError: naming the first such feature, before anything is written (the input
        is built before the first checkpoint).
    """
    spec = dataset.element_spec
    features = spec[0] if isinstance(spec, tuple) and len(spec) == 2 else spec
    if isinstance(features, dict) and set(features) == {"features", "sample_weights"}:
        features = features["features"]
    for key, value in _named_leaves(features, "features"):
        if isinstance(value, tf.SparseTensorSpec):
            raise ConversionError(
                f"{engine} does not feed the SparseTensor feature {key!r} to the TPU: no TPU "
                "is fed a SparseTensor, and nothing of the model reads it on the host (a "
                "subclassed model's call reads its features on the devices). The engine makes "
                "a sparse input dense on the host for a functional model's Input(sparse=True) "
                "read by a CategoryEncoding, a Dense or a Lambda of weight-free sparse ops; "
                "build the model functional, or make the feature dense in the input_fn "
                "(tf.sparse.to_dense). Nothing was written."
            )
    return dataset


def _named_leaves(structure, name):
    """(name, leaf) of a features structure: a dict's by key, a list's by index."""
    if isinstance(structure, dict):
        items = [(str(k), v) for k, v in structure.items()]
    elif isinstance(structure, (list, tuple)) and not hasattr(structure, "_fields"):
        items = [(f"{name}[{i}]", v) for i, v in enumerate(structure)]
    else:
        return [(name, structure)]
    return [leaf for key, value in items for leaf in _named_leaves(value, key)]


def sparse_ops(layer, spec):
    """The sparse ops ``layer`` runs on a ``SparseTensor`` of ``spec`` (their types)."""
    try:
        graph = tf.function(layer).get_concrete_function(spec).graph
    except Exception:  # only naming what it runs
        return []
    return sorted({op.type for op in graph.get_operations() if "Sparse" in op.type})


def plan(keras_model, engine, dense_update_differs=lambda layer: None):
    """(names of the layers run on the host, {name: static width} of the inputs made dense)
    of a functional model's ``SparseTensor`` inputs. ``dense_update_differs(layer)``: why the
    optimizer would update a ``Dense`` reader's kernel otherwise from a dense gradient than
    from stock's sparse one, or None.

    Raises:
      ConversionError: another reader (naming it and the sparse op it runs), a sparse output
        (``CategoryEncoding(sparse=True)``), a width not known statically, or a ``Dense``
        whose kernel the optimizer updates otherwise.
    """
    if not _tfprivate.keras.is_graph_network(keras_model):
        return frozenset(), {}
    sparse = {
        id(t): _tfprivate.keras.input_tensor_name(t)
        for t in keras_model.inputs
        if isinstance(getattr(t, "type_spec", None), tf.SparseTensorSpec)
    }
    encoders, densified = set(), {}
    if not sparse:
        return frozenset(), {}
    for layer, inputs, outputs, _ in _tfprivate.keras.functional_nodes(keras_model):
        read = [t for t in inputs if id(t) in sparse]
        if not read:
            continue
        name, tensor = sparse[id(read[0])], read[0]
        kind = type(layer).__name__
        others = [
            t._keras_history.layer.name
            for t in inputs
            if not isinstance(t._keras_history.layer, tf.keras.layers.InputLayer)
        ]
        if kind == "CategoryEncoding":
            if getattr(layer, "sparse", False):
                refuse(engine, name, layer, "SparseCountSparseOutput, a sparse output")
            if others:
                refuse(engine, name, layer, f"it reads layer {others[0]!r} beside the input")
            encoders.add(layer.name)
            continue
        if isinstance(layer, tf.keras.layers.Lambda):
            _lambda_on_host(engine, name, layer, tensor, others, outputs)
            encoders.add(layer.name)
            continue
        if kind == "Dense" and isinstance(layer, tf.keras.layers.Dense):
            width = tensor.shape[-1] if tensor.shape.rank == 2 else None
            if width is None:
                refuse(
                    engine, name, layer, f"its dense_shape {tensor.shape} is not known statically"
                )
            why = dense_update_differs(layer)
            if why:
                refuse(engine, name, layer, why)
            densified[name] = int(width)
            continue
        ops = sparse_ops(layer, tensor.type_spec) or ["a sparse op"]
        refuse(engine, name, layer, ", ".join(ops))
    return frozenset(encoders), densified


def _lambda_on_host(engine, name, layer, tensor, others, outputs):
    """Refuses a ``Lambda`` reading a sparse input that cannot run on the host, as stock's own
    layer on stock's ``SparseTensor`` (its sparse ops weight-free, reading only the model's
    inputs, its output dense: what the devices are fed), naming the sparse ops it runs."""
    ops = ", ".join(sparse_ops(layer, tensor.type_spec) or ["a sparse op"])
    if others:
        refuse(engine, name, layer, f"{ops}, reading layer {others[0]!r} beside the input")
    if layer.weights:
        refuse(engine, name, layer, f"{ops} beside its weight {layer.weights[0].name!r}")
    if any(isinstance(getattr(t, "type_spec", None), tf.SparseTensorSpec) for t in outputs):
        refuse(engine, name, layer, f"{ops}, its output a SparseTensor")


#: Optimizers (class names) whose update of a weight from a sparse gradient is their update
#: from the same gradient made dense (zero rows leave a row and its slots as they were, or
#: move them as the sparse kernel does): Keras's and tf.compat.v1's.
_DENSE_EQUAL = {"SGD", "Adam", "Adagrad", "GradientDescentOptimizer", "AdagradOptimizer"}


def tf_dense_update_differs(keras_optimizer):
    """For a TensorFlow engine (the strategy engine, the TPUEstimator path): a function of a
    ``Dense`` reader giving why ``keras_optimizer`` updates its kernel from the dense input's
    gradient otherwise than stock's step from the sparse one (``embedding_lookup_sparse``:
    ``ResourceGather``), or None."""
    optimizer = getattr(keras_optimizer, "optimizer", keras_optimizer)  # a Keras TFOptimizer
    name = type(optimizer).__name__
    config = {}
    try:
        config = optimizer.get_config()
    except (NotImplementedError, AttributeError):
        pass
    differs = name not in _DENSE_EQUAL
    momentum = config.get("momentum") or getattr(optimizer, "_momentum", 0)
    if name == "SGD" and momentum and "legacy" in type(optimizer).__module__:
        differs = True  # ResourceSparseApplyKerasMomentum moves only the rows given
    if config.get("amsgrad"):
        differs = True
    clipping = any(config.get(k) is not None for k in ("clipnorm", "clipvalue", "global_clipnorm"))

    def why(layer):
        if not differs and not clipping:
            return None
        settings = "its gradient clipping" if clipping else "these settings"
        return (
            "ResourceGather (embedding_lookup_sparse): its kernel's sparse gradient, which "
            f"{name} with {settings} applies otherwise than a dense one (an optimizer whose "
            "sparse update is its dense one: Adam, Adagrad, SGD without momentum)"
        )

    return why
