"""Which layers of a functional Keras model run on the host, in the input pipeline: one decision
every engine takes (the TPUEstimator path through :mod:`tpushim._feature_columns`, the strategy
and JAX engines through :mod:`tpushim._host_part`), and the copy of them each pipeline runs.

A layer runs on the host when

* it lies between the model's inputs and a ``DenseFeatures`` layer (its columns read that
  layer's output: a ``Lambda`` computing a distance from raw coordinates, scaling a value). The
  columns' lookups run on the host, so the layers they read must too. Such a layer must hold no
  weight (trainable or not: the TPU trains and keeps the weights), read no training mode and draw
  no random numbers (the host computes it once per batch, as stock does);
* or, where the engine runs them there (``strings=True``: the strategy and JAX engines), it takes or
  makes strings, or looks up or hashes (no TPU computes them); it must read only the model's
  inputs or other host layers and hold no trainable weight.

What cannot run there is refused at conversion, naming the layer and what to do.
"""

import tensorflow as tf

from tpushim import _tfprivate
from tpushim._errors import ConversionError

#: Prefix of a host layer's tensor fed to the model (or to a ``DenseFeatures`` layer's columns).
HOST_PREFIX = "tpushim_host/"


def node_keys(keras_model):
    """KerasTensor id -> a key naming it by layer name, the node's rank among that layer's
    nodes in the model, and the output's index: the same in the model and in a clone of it."""
    nodes = _tfprivate.keras.functional_nodes(keras_model)
    ours = {id(node) for _, _, _, node in nodes}
    keys = {}
    for layer, _, outputs, node in nodes:
        rank = [id(n) for n in layer.inbound_nodes if id(n) in ours].index(id(node))
        for i, tensor in enumerate(outputs):
            keys[id(tensor)] = f"{HOST_PREFIX}{layer.name}/{rank}/{i}"
    return keys


def refuse_columns(layer, why):
    """The refusal of a ``DenseFeatures`` layer whose features cannot be computed on the host."""
    return ConversionError(
        f"tpushim cannot run layer {layer.name!r} on a TPU: {why}. Its lookups have no TPU "
        f"kernel, so they run in the input pipeline, and so must the layers between them and "
        f"the model's inputs: only weight-free ones can (no weight trains there; a random draw "
        f"or the training mode there would not be stock's). Compute those features in the "
        f"input_fn (dataset.map) and feed the model their ids or values."
    )


def refuse_strings(layer, why, engine="the strategy engine"):
    """An engine's refusal of a layer of strings or lookups it cannot run on the host."""
    return ConversionError(
        f"{engine} cannot run layer {layer.name!r} ({type(layer).__name__}) on a "
        f"TPU: {why}. No TPU computes strings or looks up a vocabulary (XLA has no kernel "
        "for them), so the engine runs such layers on the host, in the input pipeline; that "
        "needs them to read only the model's inputs (or other such layers) and to hold no "
        "trainable weight. Do that work in the input_fn (dataset.map) and feed the model its "
        "numbers, or train without tpushim (TPUSHIM_MODE=off)."
    )


def _not_weight_free(layer):
    """Why ``layer`` cannot be computed once per batch on the host, or None."""
    if layer.weights:
        names = ", ".join(repr(w.name) for w in layer.weights[:3])
        return f"holds weights ({names})"
    if isinstance(layer, _tfprivate.keras.random_layer_class()):
        return "draws random numbers"
    if _tfprivate.keras.reads_training_mode(layer):
        return "depends on the training mode"
    return None


def layers(keras_model, strings=False, custom_objects=None, engine="the strategy engine"):
    """Names of the layers of ``keras_model`` (a functional model) that run on the host (see the
    module's docstring): those between its inputs and its ``DenseFeatures`` layers, and with
    ``strings`` those of strings, lookups and hashing. ``custom_objects``: as given to
    ``model_to_estimator``; ``engine``: the engine as a refusal names it.

    Raises:
      ConversionError: such a layer cannot run on the host, naming it and why.
    """
    dense_features = _tfprivate.keras.dense_features_class()
    lookups = _tfprivate.keras.lookup_layer_classes()
    nodes = _tfprivate.keras.functional_nodes(keras_model)
    feeding = {}
    for layer, inputs, _, _ in reversed(nodes):
        if isinstance(layer, dense_features):
            via = {id(t): (layer, t._keras_history.layer) for t in inputs}
        elif layer.name in feeding:
            via = {id(t): feeding[layer.name] for t in inputs}
        else:
            continue
        for tensor in inputs:
            producer = tensor._keras_history.layer
            if not isinstance(producer, tf.keras.layers.InputLayer):
                feeding.setdefault(producer.name, via[id(tensor)])
    drawing = _drawing_random_numbers(keras_model, set(feeding), custom_objects)
    host = set()
    for layer, inputs, outputs, _ in nodes:
        if isinstance(layer, dense_features):
            continue
        if layer.name in feeding:
            df, read = feeding[layer.name]
            why = _not_weight_free(layer)
            if why is None and layer.name in drawing:
                why = "draws random numbers"
            if why is not None:
                where = (
                    f"which {why}"
                    if read is layer
                    else f"computed from layer {layer.name!r}, which {why}"
                )
                raise refuse_columns(df, f"it reads the output of layer {read.name!r}, {where}")
            host.add(layer.name)
            continue
        if not strings:
            continue
        takes = any(t.dtype == tf.string for t in inputs)
        makes = any(t.dtype == tf.string for t in outputs)
        if not (takes or makes or isinstance(layer, lookups)):
            continue
        does = "takes strings" if takes else "makes strings" if makes else "looks up"
        for tensor in inputs:
            producer = tensor._keras_history.layer
            if not isinstance(producer, tf.keras.layers.InputLayer) and producer.name not in host:
                raise refuse_strings(
                    layer,
                    f"it {does} from the output of layer {producer.name!r}, which runs on the TPU",
                    engine,
                )
        if layer.trainable_weights:
            raise refuse_strings(layer, "it has trainable weights", engine)
        host.add(layer.name)
    return frozenset(host)


def _random_op(op_type):
    """True for an op that draws random numbers from a state (a seed alone does not fix it)."""
    if op_type.startswith("Stateless"):
        return False
    return "Random" in op_type or op_type.startswith("Stateful") or op_type in _RANDOM_OPS


_RANDOM_OPS = {"TruncatedNormal", "ParameterizedTruncatedNormal", "Multinomial"}


def _drawing_random_numbers(keras_model, names, custom_objects):
    """Names among ``names`` (layers of ``keras_model``) whose call draws random numbers: their
    ops, traced once by a copy of them in a graph of its own (a ``Lambda``'s function can draw
    them without saying so)."""
    if not names:
        return set()
    outputs = {
        f"{layer.name}/{i}": tensor
        for layer, _, made, _ in _tfprivate.keras.functional_nodes(keras_model)
        if layer.name in names
        for i, tensor in enumerate(made)
    }
    # A copy of them, made and traced in the mode of the model's tensors (whatever graph the
    # caller is in: Keras calls a layer made in one mode badly in the other), in a graph of its
    # own; the user's own layers stay uncalled.
    model = template(keras_model, names, outputs)
    with _tfprivate.keras.keras_tensors_mode(keras_model, graph=True):
        with tf.keras.utils.custom_object_scope(custom_objects or {}):
            made = tf.keras.models.clone_model(model)
        specs = {n: tf.TensorSpec(t.shape, t.dtype) for n, t in zip(made.input_names, made.inputs)}
        call = tf.function(lambda features: made(features, training=False))
        graph = call.get_concrete_function(specs).graph
    found = set()
    for op in graph.get_operations():
        if _random_op(op.type):
            found |= names & set(op.name.split("/"))
    return found


def template(keras_model, host, outputs):
    """The host layers as a model: the model inputs they read -> ``outputs`` (key -> a
    KerasTensor of ``keras_model`` a host layer makes)."""
    read = {id(t): _tfprivate.keras.input_tensor_name(t) for t in keras_model.inputs}
    used = {
        read[id(t)]: t
        for layer, inputs, _, _ in _tfprivate.keras.functional_nodes(keras_model)
        if layer.name in host
        for t in inputs
        if id(t) in read
    }
    with _tfprivate.keras.keras_tensors_mode(keras_model):  # of the classes of the model's mode
        return tf.keras.Model(inputs=used, outputs=dict(outputs))


def copy(model, custom_objects):
    """A pipeline's own copy of a host template (its layers' tables made where it runs)."""

    def clone_layer(layer):
        made = layer.__class__.from_config(layer.get_config())
        if isinstance(layer, tf.keras.layers.Lambda):
            # its own function: one loaded from its config has lost the globals of a script
            # not run as __main__ (the preflight's run of it)
            made.function = layer.function
        return made

    with tf.keras.utils.custom_object_scope(custom_objects or {}):
        clone = tf.keras.models.clone_model(model, clone_function=clone_layer)
    lookups = _tfprivate.keras.lookup_layer_classes()
    for own, made in zip(model.layers, clone.layers):
        # An adapted vocabulary is not in a lookup layer's config: given to the copy.
        if isinstance(own, lookups[:1]) and not own.get_config().get("vocabulary"):
            made.set_vocabulary(own.get_vocabulary())
    return clone
