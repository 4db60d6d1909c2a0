"""A model's host part: what a functional Keras model does with strings and lookups, run on the
host (on each TPU host's CPU) so that the replicated step sees numbers only. Shared by the
strategy engine (in its input pipeline, a ``Dataset.map``) and the JAX engine (per batch read,
before the batch goes to the devices).

A legacy model may take strings: a key passed through to an output, a number parsed from text, a
city looked up by a ``StringLookup``, feature columns in a ``DenseFeatures`` layer. No TPU
computes strings, and lookups and hashing have no XLA kernel. None of that holds a trainable
weight, so it can run where the input pipeline runs, as the TPUEstimator path runs feature
columns (:mod:`tpushim._feature_columns`). :func:`plan` reads the model once, at conversion:

* a **host layer** reads or makes strings, or is a lookup or hashing layer; it must read only
  the model's inputs or other host layers, and hold no trainable weight; the weight-free layers
  between the model's inputs and a ``DenseFeatures`` layer are host layers too (which layers:
  :mod:`tpushim._host_side`, the decision the TPUEstimator path takes);
* the tensors of host layers that other layers read (the **frontier**) are computed per batch in
  the input pipeline by a copy of the host layers made for that pipeline (one per host on a
  pod), and fed to the replicas as features; the model inputs only host layers read are not fed;
* a ``DenseFeatures`` layer's weight-free part is computed there too, from the model inputs and
  host layers it reads (its embedding weights stay on the replicas), as
  :mod:`tpushim._feature_columns` splits it;
* a model output a host layer makes (a key passed through) is not computed by the replicas:
  its loss must weigh 0, and ``predict()`` gives it from the input pipeline, row by row.

On the replicas the engine's model (the strategy engine's clone, the model the JAX engine traces)
runs its graph from the fed frontier (the host layers'
nodes are skipped): the clone keeps every layer, so its variables, names and checkpoints are
stock's. What cannot move (a lookup that reads a trainable layer's output, a host layer with
trainable weights) is refused at conversion, naming the layer and the fix.

One concern, both halves of one split (as :mod:`tpushim._feature_columns`): what the host feeds
and what the replicas read of it must agree tensor by tensor, so they live together.
"""

import dataclasses

import tensorflow as tf

from tpushim import _feature_columns, _host_side, _sparse_inputs, _tfprivate
from tpushim._errors import ConversionError

HOST_PREFIX = _host_side.HOST_PREFIX  # a frontier tensor fed to the replicas
OUT_PREFIX = "tpushim_out/"  # a model output the host computes (predict only)


@dataclasses.dataclass(frozen=True)
class HostPart:
    """What runs on the host (see the module's docstring).

    Attributes:
      layers: names of the host layers.
      frontier: (key, user model KerasTensor) per host tensor another layer reads.
      outputs: names of the model outputs the host computes.
      host_inputs: input name -> declared shape, of the inputs only the host reads.
      input_names: the model's input names, in order.
      feature_split: the :class:`tpushim._feature_columns.Split` of its DenseFeatures layers.
      template: the host layers as a model (host inputs -> {key: tensor}), or None.
      custom_objects: as given to ``model_to_estimator`` (a copy of the template needs them).
      densified: ``SparseTensor`` input name -> its static width, made dense on the host for
        the layers the devices run (:mod:`tpushim._sparse_inputs`).
    """

    layers: frozenset
    frontier: tuple
    outputs: tuple
    host_inputs: dict
    input_names: tuple
    feature_split: object
    template: object
    custom_objects: dict
    densified: dict = dataclasses.field(default_factory=dict)

    def describe(self):
        parts = []
        if self.layers:
            parts.append(f"layers {', '.join(sorted(self.layers))} run on the host")
        if self.feature_split is not None:
            parts.append(self.feature_split.describe(with_host=False))
        if self.densified:
            parts.append(f"sparse inputs {', '.join(sorted(self.densified))} made dense there")
        return "; ".join(parts)


_node_keys = _host_side.node_keys


def plan(
    keras_model,
    custom_objects=None,
    engine="the strategy engine",
    also=(),
    densified=None,
    only_also=False,
):
    """The :class:`HostPart` of ``keras_model``, or None when nothing needs the host (or it is
    not a functional model: a subclassed model's strings stay refused). ``engine``: the engine
    as its refusals name it; ``also``: names of more weight-free layers, reading only the
    model's inputs, that the engine runs on the host (sparse inputs' readers,
    :mod:`tpushim._sparse_inputs`); ``densified``: the sparse inputs the host makes dense (by
    name: their static width); ``only_also``: the host runs those alone (the TPUEstimator path,
    which splits its feature columns and strings its own way).

    Raises:
      ConversionError: a layer that must run on the host and cannot (see the module's
        docstring), or a loss on an output the host computes that does not weigh 0.
    """
    if not _tfprivate.keras.is_graph_network(keras_model):
        return None
    split = None if only_also else _feature_columns.plan(keras_model, custom_objects)
    nodes = _tfprivate.keras.functional_nodes(keras_model)
    host = set(also)
    if not only_also:
        host |= set(
            _host_side.layers(
                keras_model, strings=True, custom_objects=custom_objects, engine=engine
            )
        )
    if not host and split is None and not densified:
        return None
    keys = _node_keys(keras_model)
    moved = {layer.name for layer in split.layers} if split is not None else set()
    frontier, seen, read_by = [], set(), {}
    for layer, inputs, _, _ in nodes:
        for tensor in inputs:
            read_by.setdefault(id(tensor), set()).add(layer.name)
        if layer.name in host or layer.name in moved:  # a moved layer reads the host's blocks
            continue
        for tensor in inputs:
            producer = tensor._keras_history.layer
            if producer.name in host and id(tensor) not in seen:
                seen.add(id(tensor))
                frontier.append((keys[id(tensor)], tensor))
    host_inputs = {}
    for tensor in keras_model.inputs:
        readers = read_by.get(id(tensor), set())
        if readers and readers <= host | moved:
            host_inputs[_tfprivate.keras.input_tensor_name(tensor)] = tensor.shape.as_list()
    outputs = tuple(
        name
        for name, tensor in zip(keras_model.output_names, keras_model.outputs)
        if tensor._keras_history.layer.name in host
    )
    _check_output_losses(keras_model, outputs, engine)
    template = None
    if host:
        out = {key: tensor for key, tensor in frontier}
        if split is not None:  # what the moved layers' columns read
            out.update(split.host_tensors)
        for name, tensor in zip(keras_model.output_names, keras_model.outputs):
            if name in outputs:
                out[OUT_PREFIX + name] = tensor
        template = _host_side.template(keras_model, host, out)
    return HostPart(
        frozenset(host),
        tuple(frontier),
        outputs,
        host_inputs,
        tuple(keras_model.input_names),
        split,
        template,
        dict(custom_objects or {}),
        dict(densified or {}),
    )


def sparse_only(keras_model, custom_objects=None, engine="tpushim"):
    """The :class:`HostPart` of ``keras_model``'s ``SparseTensor`` inputs alone
    (:mod:`tpushim._sparse_inputs`: their readers run on the host, or they are made dense
    there), or None where it has none: the TPUEstimator path's, whose strings and feature
    columns are split their own way. Each host layer feeds one tensor (:func:`fed_key`).

    Raises:
      ConversionError: what :func:`tpushim._sparse_inputs.plan` refuses, or a host layer
        called more than once.
    """
    why = _sparse_inputs.tf_dense_update_differs(getattr(keras_model, "optimizer", None))
    encoders, densified = _sparse_inputs.plan(keras_model, engine, why)
    if not encoders and not densified:
        return None
    part = plan(keras_model, custom_objects, engine, encoders, densified, only_also=True)
    layers = [tensor._keras_history.layer for _, tensor in part.frontier]
    for layer in layers:
        if [other.name for other in layers].count(layer.name) > 1:
            raise ConversionError(
                f"{engine} runs layer {layer.name!r} on the host (it reads a SparseTensor "
                "input), and it is called more than once in the model, which the engine does "
                "not run yet: give each call a layer of its own, or use engine='strategy'."
            )
    return part


def fed_key(part, layer_name):
    """The key of the tensor the host feeds for host layer ``layer_name``'s output."""
    for key, tensor in part.frontier:
        if tensor._keras_history.layer.name == layer_name:
            return key
    return None


def _check_output_losses(keras_model, outputs, engine):
    """Refuses a loss that weighs anything on an output the host computes (the replicas do
    not compute it, and no gradient reaches it: it holds no trainable weight)."""
    if not outputs:
        return
    args = _tfprivate.keras.compile_args(keras_model)
    names = keras_model.output_names
    losses = args.get("loss")
    weights = args.get("loss_weights")
    for name in outputs:
        i = names.index(name)
        loss = losses.get(name) if isinstance(losses, dict) else losses
        if isinstance(losses, (list, tuple)):
            loss = losses[i]
        if loss is None:
            continue
        weight = 1.0
        if isinstance(weights, dict):
            weight = weights.get(name, 1.0)
        elif isinstance(weights, (list, tuple)):
            weight = weights[i]
        if weight != 0:
            raise ConversionError(
                f"{engine} computes output {name!r} on the host (it is made from "
                f"strings), so it cannot weigh its loss into training ({weight}): give it a "
                "loss_weights of 0 (a key passed through needs no loss), or train without "
                "tpushim (TPUSHIM_MODE=off)."
            )


# --- the host: in the input pipeline -----------------------------------------------------------


def _by_name(part, features):
    """The features by model input name (a list or tuple by position, one tensor to a model of
    one input), as keras_lib matches them."""
    if isinstance(features, dict):
        return dict(features)
    if isinstance(features, (list, tuple)):
        return dict(zip(part.input_names, features))
    return {part.input_names[0]: features}


def _copy(part):
    """This pipeline's own copy of the host layers (their tables made where it runs)."""
    if part.template is None:
        return None
    return _host_side.copy(part.template, part.custom_objects)


def element_function(part, mode):
    """A ``Dataset.map`` function (applied to each global batch before padding): the features
    with the host's tensors added (``predict``: the outputs it makes too), the inputs only the
    host reads given a zero stand-in, and labels of those outputs a zero per row."""
    model = _copy(part)
    predict = mode == _tfprivate.estimator.ModeKeys.PREDICT
    fed = {key for key, _ in part.frontier}

    def features_of(features):
        if isinstance(features, dict) and set(features) == {"features", "sample_weights"}:
            return dict(features, features=features_of(features["features"]))
        named = _by_name(part, features)
        # A string feature no input takes is not fed (Keras ignores it; no TPU takes it).
        out = {
            k: v
            for k, v in named.items()
            if k not in part.host_inputs and (k in part.input_names or v.dtype != tf.string)
        }
        rows = tf.shape(tf.nest.flatten(features)[0])[0]
        given = {}
        if model is not None:
            given = model({n: named[n] for n in model.input_names}, training=False)
            for key, value in given.items():
                if key in fed or (predict and key.startswith(OUT_PREFIX)):
                    out[key] = value
        if part.feature_split is not None:
            blocks = part.feature_split.host(named, given)
            out.update({k: v for k, v in blocks.items() if k.startswith(_feature_columns.PREFIX)})
        for name, shape in part.host_inputs.items():  # the model's input check wants them
            out[name] = tf.zeros([rows, *[d or 1 for d in shape[1:]]], tf.float32)
        for name, width in part.densified.items():  # no TPU is fed a SparseTensor
            if isinstance(out.get(name), tf.SparseTensor):
                out[name] = _dense(out[name], width)
        return out

    def labels_of(labels):
        if not part.outputs or labels is None:
            return labels
        rows = tf.shape(tf.nest.flatten(labels)[0])[0]
        if isinstance(labels, dict):
            return {k: tf.zeros([rows]) if k in part.outputs else v for k, v in labels.items()}
        return labels

    def host(*element):
        element = element[0] if len(element) == 1 else element
        if isinstance(element, tuple) and len(element) == 2:
            return features_of(element[0]), labels_of(element[1])
        return features_of(element)

    return host


def _dense(value, width):
    """A ``SparseTensor`` of rows made dense, ``width`` wide (its static width)."""
    shape = tf.stack([value.dense_shape[0], tf.constant(width, value.dense_shape.dtype)])
    dense = tf.sparse.to_dense(
        tf.sparse.reorder(tf.SparseTensor(value.indices, value.values, shape))
    )
    return tf.ensure_shape(dense, [None, width])


def carried(features):
    """(features without the host's outputs, the host's outputs by output name)."""
    kept = {k: v for k, v in features.items() if not k.startswith(OUT_PREFIX)}
    outs = {k[len(OUT_PREFIX) :]: v for k, v in features.items() if k.startswith(OUT_PREFIX)}
    return kept, outs


# --- the replicas: the clone's graph from the fed tensors -------------------------------------


def _from_host(part, inputs):
    """True for features the host made (:func:`element_function`), not raw ones."""
    if not isinstance(inputs, dict) or any(key not in inputs for key, _ in part.frontier):
        return False
    return all(
        name in inputs and inputs[name].dtype != tf.string for name in part.host_inputs
    ) and (part.feature_split is None or any(k.startswith(_feature_columns.PREFIX) for k in inputs))


def _run(part, clone):
    """``clone``'s ``run(inputs, training, mask, own)`` from the host's tensors (see
    :func:`install`)."""
    keys = _node_keys(clone)
    by_key = {}
    for _layer, _, outputs, _ in _tfprivate.keras.functional_nodes(clone):
        for tensor in outputs:
            by_key[keys[id(tensor)]] = tensor
    fed_keys = [key for key, _ in part.frontier]
    split = part.feature_split
    moved = {layer.name for layer in split.layers} if split is not None else set()

    def run(inputs, training, mask, own):
        if not _from_host(part, inputs):
            return own(inputs, training, mask)
        fed = {k: v for k, v in inputs.items() if k not in part.host_inputs}
        seeded = [(by_key[key], inputs[key]) for key in fed_keys]
        blocks = {k: v for k, v in inputs.items() if k.startswith(_feature_columns.PREFIX)}
        rows = tf.shape(tf.nest.flatten(inputs)[0])[0]

        def replace(node):
            if node.layer.name not in moved:
                return None
            return lambda: _feature_columns.layer_output(split, blocks, node.layer, training)

        return _tfprivate.keras.run_functional_from(
            clone,
            fed,
            seeded,
            lambda layer: layer.name in part.layers,
            replace,
            lambda tensor: tf.zeros([rows]),
        )

    return run


def install(part, clone):
    """Makes ``clone`` (the engine's own copy of the model) run its graph from the host's
    tensors when its features carry them, skipping the host layers."""
    _tfprivate.keras.replace_functional_run(clone, _run(part, clone))
    return clone


def running_from_host(part, keras_model):
    """While active, ``keras_model`` (the user's own: the JAX engine traces it) runs its graph
    from the host's tensors when its features carry them, as :func:`install` makes a clone."""
    return _tfprivate.keras.functional_run_replaced(keras_model, _run(part, keras_model))


def padded_outputs(outs):
    """The host's outputs of a split global batch ([replicas, piece, ...]) as rows in replica
    order (the gathered outputs' order)."""
    return {k: tf.reshape(v, tf.concat([[-1], tf.shape(v)[2:]], 0)) for k, v in outs.items()}
