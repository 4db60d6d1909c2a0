"""The rows of each gathered weight a batch looks up, for the optimizers whose sparse update
differs from their dense one (:attr:`tpushim._jax._optimizers.Optimizer.sparse_differs`).

Stock's graph differentiates a weight the model only gathers rows of (an ``Embedding``'s
table: ``ResourceGather``) into ``IndexedSlices``, and the optimizer applies them sparsely. The
step's gradient in JAX is dense; this module finds those weights in the training function's own
TensorFlow graph (every reader of the weight a gather: a regularizer or any other dense reader
makes stock's gradient dense too) and converts, with ``tf2jax``, a function of the batch giving
each one's looked-up rows: its gathers' indices, those of padding rows left out (a short batch's
padding is no row of stock's batch). A gather whose indices are not one row per batch row (the
padding could not be told apart) is refused by name.
"""

import numpy as np
import tensorflow as tf

from tpushim._errors import ConversionError


def _handles(graph, keras_model):
    """The function graph's captured resource placeholders -> the trainable weight's name."""
    by_handle = {id(v.handle): v.name.split(":")[0] for v in keras_model.trainable_weights}
    return {
        id(internal): by_handle[id(external)]
        for external, internal in graph.captures
        if id(external) in by_handle
    }


#: ops reading a weight in a function or a branch of their own: whether they gather it, and so
#: whether stock's gradient of it is sparse, cannot be read from the step's graph
_OPAQUE = ("PartitionedCall", "StatefulPartitionedCall", "While", "StatelessWhile", "If")
_OPAQUE += ("StatelessIf", "Case", "StatelessCase")


def _gathers(graph, keras_model):
    """weight name -> its gathers' indices tensors, for the weights only gathered; a weight
    read in a function call or a branch is refused (:data:`_OPAQUE`)."""
    names = _handles(graph, keras_model)
    found, dense = {}, set()
    for op in graph.get_operations():
        for i, tensor in enumerate(op.inputs):
            name = names.get(id(tensor))
            if name is None:
                continue
            if op.type in _OPAQUE:
                _refuse(
                    keras_model,
                    name,
                    f"it is read inside a {op.type} op ({op.name}), where the engine cannot see "
                    "whether the model gathers rows of it (stock's gradient is then sparse)",
                )
            if op.type == "ResourceGather" and i == 0:
                found.setdefault(name, []).append(op.inputs[1])
            else:
                dense.add(name)
    return {name: indices for name, indices in found.items() if name not in dense}


def _refuse(keras_model, name, why):
    raise ConversionError(
        f"tpushim's JAX engine cannot update the weight {name!r} of the layer "
        f"{_layer_of(keras_model, name)!r} as stock does with {_optimizer_name(keras_model)}, "
        f"whose sparse update of a gathered weight moves only the rows a batch looks up: {why}. "
        "Train it with engine=strategy, or compile the model with an optimizer whose sparse "
        "update is its dense one (Adam, Adagrad, SGD without momentum)."
    )


def _layer_of(keras_model, weight_name):
    from tpushim import _tfprivate

    for layer in _tfprivate.keras.all_layers(keras_model):
        if isinstance(layer, tf.keras.Model):  # the model, or a nested one: its layer is named
            continue
        if any(w.name.split(":")[0] == weight_name for w in layer.trainable_weights):
            return layer.name
    return weight_name.split("/")[0]


def _optimizer_name(keras_model):
    optimizer = keras_model.optimizer
    inner = getattr(optimizer, "optimizer", None)  # Keras's TFOptimizer wraps a tf.compat.v1 one
    if type(optimizer).__name__ == "TFOptimizer" and inner is not None:
        return f"tf.compat.v1.train.{type(inner).__name__}"
    legacy = ".legacy." in (type(optimizer).__module__ or "")
    return f"tf.keras.optimizers.{'legacy.' if legacy else ''}{type(optimizer).__name__}"


def lookups_function(keras_model, train):
    """``(tf.function of (features, labels, sample_weights, pad) -> [per weight: (indices,
    real)] flattened, the weights' names)``: ``train`` (:func:`tpushim._jax._trace.
    training_function`) traced again, its gathers' indices read off its graph."""
    names = []

    @tf.function(autograph=False)
    def lookups(features, labels, sample_weights, pad):
        train.python_function(features, labels, sample_weights, pad)
        graph = tf.compat.v1.get_default_graph()
        out = []
        names.clear()
        for name, all_indices in sorted(_gathers(graph, keras_model).items()):
            pieces, reals = [], []
            for indices in all_indices:
                if (
                    indices.shape.rank is None
                    or indices.shape.rank < 1
                    or (indices.shape[0] != pad.shape[0])
                ):
                    _refuse(
                        keras_model,
                        name,
                        f"its gather's indices (of shape {indices.shape}) are not one row per "
                        "row of the batch, so the engine cannot tell a padding row's lookups "
                        "from a real row's",
                    )
                real = tf.reshape(
                    tf.cast(pad > 0, tf.float32), [-1] + [1] * (indices.shape.rank - 1)
                )
                pieces.append(tf.reshape(tf.cast(indices, tf.int32), [-1]))
                reals.append(tf.reshape(real * tf.ones_like(indices, tf.float32), [-1]))
            out.append((tf.concat(pieces, 0), tf.concat(reals, 0)))
            names.append(name)
        return out

    return lookups, names


def convert(keras_model, train, features, labels, sample_weights, pad):
    """``None`` where no trainable weight is only gathered, else ``fn(params, features, labels,
    sample_weights, pad) -> {weight name: [rows] bool}``: the rows a batch's real rows look up."""
    import jax.numpy as jnp
    import tf2jax

    from tpushim._jax import _ops  # noqa: F401 (registers the ops tf2jax lacks)

    def spec(a):
        a = np.asarray(a)
        return tf.TensorSpec(a.shape, tf.as_dtype(a.dtype))

    args = tf.nest.map_structure(spec, (list(features), list(labels), list(sample_weights), pad))
    if not _gathers(train.get_concrete_function(*args).graph, keras_model):
        return None  # (the step's own trace, cached: no weight only gathered)
    lookups, names = lookups_function(keras_model, train)
    lookups.get_concrete_function(*args)
    if not names:
        return None
    rows = {
        name: int(v.shape[0])
        for v in keras_model.trainable_weights
        for name in [v.name.split(":")[0]]
        if name in names
    }
    with tf2jax.override_config("convert_custom_gradient", False):
        fn, params = tf2jax.convert(lookups, *args)
    wanted = tuple(params)

    def looked_up(weights, *batch):
        out, _ = fn({k: weights[k] for k in wanted}, *batch)
        return {
            name: jnp.zeros([rows[name]], jnp.float32).at[indices].add(real) > 0
            for name, (indices, real) in zip(names, out)
        }

    return looked_up
