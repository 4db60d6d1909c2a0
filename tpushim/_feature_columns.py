"""Feature columns inside the model, on a TPU: the weight-free part of a ``DenseFeatures`` layer
moved into the input pipeline (the host), its embedding weights left in the model (the TPU).

A Keras model may start with ``tf.keras.layers.DenseFeatures`` over the raw features: vocabulary
lookups, hashing, crosses and bucketizing have no XLA kernel (``LookupTableFindV2``,
``SparseCross``...), and strings cannot be fed to a TPU. None of that holds a trainable weight, so
it can run where the input pipeline runs. :func:`plan` reads the model once, at conversion; the
input pipeline then gives every batch, per column (in the layer's order):

* a column without weights (numeric, bucketized, indicator): its dense output, as the layer
  computes it;
* an embedding column: the ids of its categorical column (vocabulary list or file, hash bucket,
  identity, crossed, bucketized, weighted) as a static ``[batch, K]`` block, K the most ids a row
  can hold, read from the features' static shapes, with their weights (0 where there is no id) --
  what ``safe_embedding_lookup_sparse`` keeps of the sparse ids.

The model keeps the layer and its variables (names, checkpoints and warm start are stock's); only
its call changes, while tpushim builds the clone: it gathers the embedding rows and combines them
with the column's combiner (sum, mean, sqrtn; ``max_norm`` clips each row first), and reads the
dense blocks. The raw features it consumed are not fed to the TPU. An exported model takes the raw
features: where they arrive unmoved (serving, tensors tpushim cannot trace to a Dataset), the model
function computes the same blocks itself.

The weight-free layers between the model's inputs and a ``DenseFeatures`` layer (a ``Lambda``
computing a distance from raw coordinates; which ones: :mod:`tpushim._host_side`) run in the input
pipeline with it, by a copy of them made for that pipeline: the columns read their outputs there.

What cannot move (a column of a kind listed nowhere above, a layer reading a layer that holds a
weight, a shared embedding) refuses conversion with the layer and the column named, before any
checkpoint is written.

One concern, both halves of one split: what the host computes and what the model reads of it
must agree column by column, so they live together.
"""

import contextlib
import dataclasses
import math

import tensorflow as tf

from tpushim import _host_side, _padding, _tfprivate
from tpushim._errors import ConversionError

#: Prefix of the features the input pipeline adds: ``tpushim_fc/<layer>/<column>[/ids|/weights]``.
PREFIX = "tpushim_fc/"


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a moved layer: ``kind`` is ``"dense"`` (weight-free) or ``"embedding"``."""

    column: object
    kind: str
    key: str


@dataclasses.dataclass(frozen=True)
class Layer:
    """A ``DenseFeatures`` layer whose weight-free part runs in the input pipeline; ``sources``:
    (key of the features it reads, the model input's name or the host layer tensor's key)."""

    name: str
    columns: tuple
    sources: tuple

    def describe(self):
        embedded = [c.column.name for c in self.columns if c.kind == "embedding"]
        text = f"layer {self.name!r}: {len(self.columns)} columns' lookups, hashing, crosses "
        text += "and bucketizing moved to the input pipeline"
        if embedded:
            text += f" (embedding weights of {', '.join(embedded)} on the TPU)"
        return text


@dataclasses.dataclass(frozen=True)
class Split:
    """What :func:`plan` found to move, and the raw features that the TPU then does not need.

    ``host_layers``: the weight-free layers between the model's inputs and the moved layers;
    ``host_tensors``: (key, KerasTensor) of their outputs the moved layers read; ``template``:
    those layers as a model (the inputs they read -> {key: tensor}), or None."""

    layers: tuple
    raw_keys: frozenset  # features only the moved layers read: not fed to the TPU
    stand_ins: tuple  # the model inputs among them: given a placeholder value in the model
    host_layers: frozenset = frozenset()
    host_tensors: tuple = ()
    template: object = None
    custom_objects: dict = dataclasses.field(default_factory=dict)
    #: the host layers only the moved layers (or other such ones) read: the model's clone on
    #: the device does not compute them (:func:`device_layers`)
    host_only: frozenset = frozenset()

    def describe(self, with_host=True):
        """One line: what moved, for the conversion line and the preflight (``with_host``: the
        host layers named too)."""
        text = "; ".join(layer.describe() for layer in self.layers)
        if self.host_layers and with_host:
            text += f" (with layers {', '.join(sorted(self.host_layers))}, which they read)"
        return text

    def host_function(self):
        """``host`` with this pipeline's own copy of the host layers (made here, outside the
        ``Dataset.map`` function: a lookup layer's table is made where the pipeline runs)."""
        copy = _host_side.copy(self.template, self.custom_objects) if self.template else None

        def host(features):
            values = None
            if copy is not None:
                values = copy({n: features[n] for n in copy.input_names}, training=False)
            return self.host(features, values)

        return host

    def host(self, features, host_values=None):
        """The features with the moved layers' blocks added and the raw features only they read
        removed (see the module's docstring). ``host_values``: the host layers' tensors by key
        (computed here by a copy of them when not given)."""
        if self.template is not None and host_values is None:
            return self.host_function()(features)
        out = {k: v for k, v in features.items() if k not in self.raw_keys}
        for layer in self.layers:
            read = {
                key: host_values[source]
                if source.startswith(_host_side.HOST_PREFIX)
                else features[source]
                for key, source in layer.sources
            }
            cache = _tfprivate.keras.feature_transformation_cache(read)
            for col in layer.columns:
                with tf.name_scope(col.key.replace("/", "_").replace(":", "_")):
                    if col.kind == "dense":
                        out[col.key] = _dense_block(col.column, cache, read)
                    else:
                        out[col.key + "/ids"], out[col.key + "/weights"] = _id_block(
                            col.column, cache, read
                        )
        return out

    def model_features(self, features):
        """(features for Keras's clone, the blocks): the raw model inputs the moved layers read get
        a zero placeholder (their layer reads the blocks instead)."""
        if set(features) == {"features", "sample_weights"}:
            kept, blocks = self.model_features(features["features"])
            return dict(features, features=kept), blocks
        if not any(k.startswith(PREFIX) for k in features):
            features = self.host(features)  # serving, or tensors fed as they are on CPU
        blocks = {k: v for k, v in features.items() if k.startswith(PREFIX)}
        kept = {k: v for k, v in features.items() if not k.startswith(PREFIX)}
        batch = tf.shape(next(iter(blocks.values())))[0]
        for name in self.stand_ins:
            kept[name] = tf.zeros([batch, 1], tf.float32)
        return kept, blocks


def on_element(host, element):
    """A ``Dataset.map`` function: ``host`` (a :meth:`Split.host_function`) applied to an
    element's features, inside tpushim's padding and sample weight wrappers (see
    :mod:`tpushim._padding`)."""
    element = element[0] if len(element) == 1 else element
    if isinstance(element, tuple) and len(element) == 2:
        return _apply(host, element[0]), element[1]
    return _apply(host, element)


def _apply(host, features):
    if not isinstance(features, dict):
        return features
    if _padding.FEATURES_KEY in features:
        return dict(
            features, **{_padding.FEATURES_KEY: _apply(host, features[_padding.FEATURES_KEY])}
        )
    if set(features) == {"features", "sample_weights"}:
        return dict(features, features=_apply(host, features["features"]))
    return host(features)


def _rows(tensor, features):
    """The batch size of the features, static where known."""
    for value in features.values():
        if isinstance(value, tf.Tensor) and value.shape.rank:
            static = tf.compat.dimension_value(value.shape[0])
            if static is not None:
                return static
    return tf.shape(tensor)[0]


def _dense_block(column, cache, features):
    tensor = column.get_dense_tensor(cache, None)
    width = column.variable_shape.num_elements()
    return tf.reshape(tensor, [_rows(tensor, features), width])


def _max_ids(column, features):
    """The most ids a row of ``column``'s sparse ids can hold, from the features' static shapes,
    or None when they do not say."""
    fc = _tfprivate.keras.feature_column_classes()
    if isinstance(column, str):
        value = features.get(column)
        if not isinstance(value, tf.Tensor):  # a SparseTensor: no static bound
            return None
        dims = value.shape.as_list()[1:]
        return math.prod(dims) if all(d is not None for d in dims) else None
    if isinstance(column, fc.CrossedColumn):
        counts = [_max_ids(key, features) for key in column.keys]
        return None if None in counts else math.prod(counts)
    if isinstance(column, fc.WeightedCategoricalColumn):
        return _max_ids(column.categorical_column, features)
    if isinstance(column, fc.BucketizedColumn):
        return _max_ids(column.source_column.key, features)
    if isinstance(column, fc.SINGLE_KEY_CATEGORICAL):
        return _max_ids(column.key, features)
    return None


def _id_block(column, cache, features):
    """``(ids, weights)`` [batch, K] of an embedding column's categorical column: what
    ``safe_embedding_lookup_sparse`` keeps (ids >= 0; weights > 0 unless it sums), in row order,
    the rest id 0 with weight 0."""
    categorical = column.categorical_column
    pair = categorical.get_sparse_tensors(cache, None)
    ids, weights = pair.id_tensor, pair.weight_tensor
    width = _max_ids(categorical, features)
    if width is None:
        raise ConversionError(
            f"tpushim cannot give the ids of feature column {column.name!r} a fixed shape: "
            f"the features it reads ({', '.join(sorted(categorical.parse_example_spec))}) have "
            f"no static shape beyond the batch (a SparseTensor, or unknown dimensions), and a "
            f"TPU needs one. Give them one in the input pipeline (e.g. tf.sparse.to_dense and "
            f"tf.ensure_shape in dataset.map), or declare it in the model's Input."
        )
    rows = _rows(ids.values, features)
    if weights is None:
        weights = tf.SparseTensor(
            ids.indices, tf.ones_like(ids.values, tf.float32), ids.dense_shape
        )
    keep = tf.greater_equal(ids.values, 0)
    if column.use_safe_embedding_lookup and column.combiner != "sum":  # as stock prunes them
        keep = tf.logical_and(keep, tf.greater(weights.values, 0))
    ids = tf.sparse.retain(ids, keep)
    weights = tf.sparse.retain(
        tf.SparseTensor(weights.indices, weights.values, ids.dense_shape), keep
    )
    shape = tf.stack([tf.cast(rows, tf.int64), tf.constant(width, tf.int64)])
    dense_ids = tf.scatter_nd(ids.indices, ids.values, shape)
    dense_weights = tf.scatter_nd(weights.indices, tf.cast(weights.values, tf.float32), shape)
    dense_ids = tf.reshape(dense_ids, [rows, width])
    dense_weights = tf.reshape(dense_weights, [rows, width])
    return dense_ids, dense_weights


def _embedded(column, table, ids, weights):
    """The embedding column's output from its ids block: stock's combiner over the kept ids."""
    rows = tf.gather(table, ids)  # [batch, K, dimension]; its gradient a sparse one, as stock's
    if column.max_norm is not None:
        rows = tf.clip_by_norm(rows, column.max_norm, axes=[2])
    total = tf.reduce_sum(rows * weights[:, :, None], axis=1)
    if column.combiner == "sum":
        return total
    if column.combiner == "mean":
        scale = tf.reduce_sum(weights, axis=1, keepdims=True)
    else:  # sqrtn
        scale = tf.sqrt(tf.reduce_sum(tf.square(weights), axis=1, keepdims=True))
    return tf.math.divide_no_nan(total, scale)


def _key(layer_name, column):
    return f"{PREFIX}{layer_name}/{column.name}"


def _refuse(layer, column, why):
    column_text = f", column {column.name!r}" if column is not None else ""
    return ConversionError(
        f"tpushim cannot run layer {layer.name!r}{column_text} on a TPU: {why}. Its lookups "
        f"have no TPU kernel and a trainable weight depends on them, so they can neither stay "
        f"in the model nor move to the input pipeline. Compute those features in the input_fn "
        f"(dataset.map) and feed the model their ids or values."
    )


def _column_kind(layer, column):
    fc = _tfprivate.keras.feature_column_classes()
    if isinstance(column, fc.WEIGHT_FREE_DENSE):
        return "dense"
    if isinstance(column, fc.EmbeddingColumn):
        categorical = column.categorical_column
        if isinstance(categorical, fc.SequenceCategoricalColumn):
            raise _refuse(layer, column, "a sequence column's embedding")
        if not _known_categorical(categorical):
            raise _refuse(
                layer,
                column,
                f"its categorical column is a {type(categorical).__name__}, which tpushim does "
                f"not know how many ids a row holds of",
            )
        return "embedding"
    raise _refuse(
        layer,
        column,
        f"a {type(column).__name__} (tpushim moves numeric, bucketized, indicator and "
        f"embedding columns)",
    )


def _known_categorical(column):
    fc = _tfprivate.keras.feature_column_classes()
    if isinstance(column, fc.CrossedColumn):
        return all(isinstance(k, str) or _known_categorical(k) for k in column.keys)
    if isinstance(column, fc.WeightedCategoricalColumn):
        return _known_categorical(column.categorical_column)
    return isinstance(column, (fc.BucketizedColumn, *fc.SINGLE_KEY_CATEGORICAL))


def _keys_read(column):
    """The raw feature keys a column reads."""
    return set(column.parse_example_spec)


def plan(keras_model, custom_objects=None):
    """The :class:`Split` of ``keras_model``, or None when it has no ``DenseFeatures`` layer.

    Raises:
      ConversionError: a ``DenseFeatures`` layer tpushim cannot split (see the module's
        docstring), naming the layer and the column, or the layer holding the weight it reads.
    """
    dense_features = _tfprivate.keras.dense_features_class()
    layers = [
        layer for layer in getattr(keras_model, "layers", []) if isinstance(layer, dense_features)
    ]
    # Only a functional model's layers read its inputs by name (stock cannot convert a Sequential
    # model starting with DenseFeatures: Keras clones it on a list of tensors).
    if not layers or not _tfprivate.keras.is_graph_network(keras_model):
        return None
    host = _host_side.layers(keras_model, custom_objects=custom_objects)
    node_keys = _host_side.node_keys(keras_model)
    input_names = set(keras_model.input_names)
    by_layer = {}
    for layer, _, _, node in _tfprivate.keras.functional_nodes(keras_model):
        if isinstance(layer, dense_features):
            by_layer.setdefault(layer.name, []).append(node)
    moved, keys, host_tensors = [], set(), {}
    for layer in layers:
        sources = set()
        for node in by_layer.get(layer.name, ()):
            read = _tfprivate.keras.node_features_argument(node)
            pairs = []
            for key, tensor in read.items() if isinstance(read, dict) else ():
                producer = tensor._keras_history.layer
                if isinstance(producer, tf.keras.layers.InputLayer):
                    pairs.append((key, _tfprivate.keras.input_tensor_name(tensor)))
                elif producer.name in host:
                    pairs.append((key, node_keys[id(tensor)]))
                    host_tensors[node_keys[id(tensor)]] = tensor
                else:
                    raise _refuse(
                        layer,
                        None,
                        f"it reads the output of layer {producer.name!r}, not the model's raw "
                        f"inputs",
                    )
            sources.add(tuple(sorted(pairs)))
        if len(sources) > 1:
            raise _refuse(layer, None, "it is called on different features at different places")
        columns = []
        for column in _tfprivate.keras.dense_features_columns(layer):
            columns.append(Column(column, _column_kind(layer, column), _key(layer.name, column)))
            keys |= _keys_read(column)
        moved.append(Layer(layer.name, tuple(columns), next(iter(sources), ())))
    # Model inputs only the moved layers take, and host layers whose outputs only they read, are
    # not fed (whether a column reads them or not); a raw input some other layer reads too stays
    # fed (the model computes a host layer another layer reads again from it).
    only_moved = _read_only_by(keras_model, host, {layer.name for layer in layers})
    read_elsewhere = set()
    for input_layer in _tfprivate.keras.input_layers(keras_model):
        consumers = [node.outbound_layer for node in input_layer.outbound_nodes]
        if all(layer.name in only_moved for layer in consumers):
            keys.add(input_layer.name)
        else:
            read_elsewhere.add(input_layer.name)
    raw = frozenset(keys - read_elsewhere)
    stand_ins = tuple(sorted(name for name in input_names if name in raw))
    template = _host_side.template(keras_model, host, host_tensors) if host_tensors else None
    return Split(
        tuple(moved),
        raw,
        stand_ins,
        host,
        tuple(host_tensors.items()),
        template,
        dict(custom_objects or {}),
        frozenset(only_moved & host),
    )


def _read_only_by(keras_model, host, moved):
    """``moved`` and the ``host`` layers whose outputs only those read (no other layer, no
    model output)."""
    nodes = _tfprivate.keras.functional_nodes(keras_model)
    readers = {}
    for layer, inputs, _, _ in nodes:
        for tensor in inputs:
            readers.setdefault(tensor._keras_history.layer.name, set()).add(layer.name)
    outputs = {tensor._keras_history.layer.name for tensor in keras_model.outputs}
    found = set(moved)
    for layer, _, _, _ in reversed(nodes):  # a layer's readers before it
        only = readers.get(layer.name, set()) <= found
        if layer.name in host and layer.name not in outputs and only:
            found.add(layer.name)
    return found


# --- the layer's call while tpushim builds a clone ------------------------------------------


def _device_call(split, blocks):
    by_name = {layer.name: layer for layer in split.layers}

    def call(layer, own_call, features, cols_to_output_tensors, training):
        moved = by_name.get(layer.name)
        if moved is None:
            return own_call(features, cols_to_output_tensors, training)
        outputs = []
        # The clone's own column objects (rebuilt from the layer's config) hold its variables.
        own = {column.name: column for column in _tfprivate.keras.dense_features_columns(layer)}
        for col in moved.columns:
            with tf.name_scope(col.column.name):
                if col.kind == "dense":
                    outputs.append(blocks[col.key])
                else:
                    table = _tfprivate.keras.dense_features_variable(
                        layer, own[col.column.name], "embedding_weights"
                    )
                    outputs.append(
                        _embedded(
                            col.column,
                            table,
                            blocks[col.key + "/ids"],
                            blocks[col.key + "/weights"],
                        )
                    )
        return _tied_to_inputs(tf.concat(outputs, -1), features)

    return call


def _tied_to_inputs(output, features):
    """``output`` (read from the blocks) as a function of the layer's own inputs, as stock's is.

    Keras 1-style graph models keep a layer's update or loss only where it is reachable from the
    model's inputs (``get_updates_for(model.inputs)``, ``get_losses_for``): the train function
    collects them so, and so does tpushim's loss. Read from the blocks alone, the moved layer's
    output hangs off no model input, and every update and loss after it would be dropped -- a
    BatchNormalization's moving mean and variance never moved, an activity regularizer never
    added. One ``IdentityN`` over the output and the inputs makes that path again (no
    arithmetic: its first output is ``output`` itself).
    """
    inputs = [t for t in tf.nest.flatten(features, expand_composites=True) if tf.is_tensor(t)]
    if not inputs:  # layer_output (the strategy engine's replicas: their functions run them all)
        return output
    return tf.identity_n([output, *inputs], name="tied_to_inputs")[0]


def layer_output(split, blocks, layer, training=None):
    """A moved layer's output computed from ``blocks`` (the features the input pipeline made),
    with ``layer``'s own embedding variables: what its call gives under :func:`device_layers`."""
    return _device_call(split, blocks)(layer, None, None, None, training)


@contextlib.contextmanager
def device_layers(split, blocks):
    """While active, the moved ``DenseFeatures`` layers of a clone read ``blocks`` (the features
    the input pipeline made) instead of transforming raw features, and the host layers only they
    read (``split.host_only``) compute nothing: the host computed them, and their copy on the
    device would run on the zero stand-ins of the raw inputs, for nothing, or fail (a ``Lambda``
    taking strings; an op no TPU runs)."""
    with (
        _tfprivate.keras.dense_features_call_replaced(_device_call(split, blocks)),
        _tfprivate.keras.cloned_layers_call_replaced(split.host_only, _not_computed),
    ):
        yield


def _not_computed(layer, inputs, *args, **kwargs):
    """A host layer's call in the device's clone: a [batch, 1] stand-in for each of its outputs
    (``layer``'s, the user's: no moved layer reads their values, :func:`_device_call`), tied to
    its inputs as :func:`_tied_to_inputs` ties a moved layer's output, so what follows stays
    reachable from the model's inputs."""
    tensors = [
        t
        for t in tf.nest.flatten((inputs, args, kwargs), expand_composites=True)
        if tf.is_tensor(t)
    ]
    rows = tf.shape(tensors[0])[0] if tensors and tensors[0].shape.rank else 1
    return tf.nest.map_structure(
        lambda _: _tied_to_inputs(tf.zeros([rows, 1]), tensors), layer.get_output_at(0)
    )


@contextlib.contextmanager
def shapes_only(split):
    """While active, the moved layers return zeros of their output's shape: a clone made on
    placeholder inputs (the preflight's) builds them, variables included, without the raw
    features."""
    by_name = {layer.name: layer for layer in split.layers}

    def call(layer, own_call, features, cols_to_output_tensors, training):
        if layer.name not in by_name:
            return own_call(features, cols_to_output_tensors, training)
        first = tf.nest.flatten(features)[0]
        width = sum(
            column.variable_shape.num_elements()
            for column in _tfprivate.keras.dense_features_columns(layer)
        )
        return tf.zeros([tf.shape(first)[0], width])

    with _tfprivate.keras.dense_features_call_replaced(call):
        yield
