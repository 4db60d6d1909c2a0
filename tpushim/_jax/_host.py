"""The model's host part on the JAX engine: what a functional model does with strings and
lookups (a ``StringLookup``, hashing, feature columns' lookups in a ``DenseFeatures`` layer, a key
passed through to an output), computed in TensorFlow on the host for each batch read, before the
batch goes to the devices; the step in JAX then runs the model from those tensors (the
frontier) to its outputs, the feature columns' embedding weights training in it.

The split is the strategy engine's (:mod:`tpushim._host_part`: which layers, what the host feeds,
how the model runs from it): here the host's function is applied to each numpy batch instead of
in a ``Dataset.map``, and the model the step traces is the user's, run from the fed tensors only
while it is traced (:func:`tpushim._host_part.running_from_host`).

A ``SparseTensor`` input (``Input(sparse=True)``) is read on the host as the batch's
components (indices, values, dense_shape) and made dense there, at a size known statically,
so that its rows split over the devices and pad as a dense input's do (:func:`sparse_plan`):
a ``CategoryEncoding`` (dense output) reading it runs on the host, stock's own layer on
stock's ``SparseTensor``; a ``Dense`` reading it gets it dense (its matmul is the sum
``embedding_lookup_sparse`` makes of the same rows); a ``Lambda`` of weight-free sparse ops
(``tf.sparse.to_dense``, ``sparse_dense_matmul`` by a constant, ``tf.sparse.reduce_sum``) reading
only the model's inputs, its output dense, runs on the host as a ``CategoryEncoding`` does. Any
other reader is refused by name.
"""

import contextlib

import numpy as np
import tensorflow as tf

from tpushim import _feature_columns, _host_part, _sparse_inputs, _tfprivate
from tpushim._errors import ConversionError

#: How the JAX engine's refusals of a host part name it.
ENGINE = "tpushim's JAX engine"


def plan(keras_model, custom_objects, optimizer=None):
    """The model's :class:`HostFeed`, or None where nothing runs on the host. Raises the host
    part's refusals (a lookup reading a trainable layer's output, a key output's loss that
    weighs something) and a sparse input's (:func:`sparse_plan`; ``optimizer``: the step's,
    :mod:`._optimizers`), naming the layer."""
    encoders, densified = sparse_plan(keras_model, optimizer)
    part = _host_part.plan(keras_model, custom_objects, engine=ENGINE, also=encoders)
    _refuse_inner_strings(keras_model, part.layers if part is not None else ())
    if part is None and not densified:
        return None
    return HostFeed(keras_model, part, densified)


def _inner_string_ops(layer, node):
    """The types of the ops of ``layer``'s call at ``node`` that take or make strings, sorted
    (none: it could not be traced here, which only naming needs)."""

    def spec(a):
        return a.type_spec if hasattr(a, "type_spec") else a

    args = tf.nest.map_structure(spec, list(node.call_args))
    kwargs = tf.nest.map_structure(spec, dict(node.call_kwargs))
    try:
        graph = tf.function(lambda a, k: layer(*a, **k)).get_concrete_function(args, kwargs).graph
    except Exception:  # only naming what it runs
        return []

    def computed(t):  # a string the call computes (an assertion's constant message is not)
        return t.dtype == tf.string and t.op.type not in ("Const", "Placeholder")

    return sorted(
        {
            op.type
            for op in graph.get_operations()
            if op.type not in ("Identity", "Placeholder")
            and any(computed(t) for t in (*op.inputs, *op.outputs))
        }
    )


def _refuse_inner_strings(keras_model, host):
    """Raises where a layer the devices run (not in ``host``, the host part's layers) makes or
    reads strings inside its call, its inputs and outputs numbers (a debugging ``Lambda``
    formatting numbers as text): no TPU computes strings, and the host part takes only layers
    whose inputs or outputs are strings. Only ``Lambda`` layers are traced (a layer class's
    call traced outside the model could record losses or state on the layer; tf2jax names the
    ops of those at ``train()``)."""
    if not _tfprivate.keras.is_graph_network(keras_model):
        return
    for layer, inputs, _, node in _tfprivate.keras.functional_nodes(keras_model):
        if layer.name in host or not isinstance(layer, tf.keras.layers.Lambda):
            continue
        ops = _inner_string_ops(layer, node)
        if not ops:
            continue
        read = sorted(
            {
                t._keras_history.layer.name
                for t in inputs
                if not isinstance(t._keras_history.layer, tf.keras.layers.InputLayer)
            }
        )
        reads = (
            f"it reads what the devices compute (the output of layer {read[0]!r}), so the "
            "engine cannot run it on the host either"
            if read
            else "its inputs and outputs are numbers, and the engine runs on the host only "
            "layers that take or make strings"
        )
        raise ConversionError(
            f"{ENGINE} cannot run layer {layer.name!r} ({type(layer).__name__}): its call runs "
            f"the string ops {', '.join(repr(o) for o in ops)} ({layer.name}/...), which no "
            f"TPU computes (XLA has no kernel for them, nor JAX), and {reads}. Move that work "
            "out of the model (a debugging Lambda can go; make text in the input_fn or from "
            "predict()'s outputs), or train without tpushim (TPUSHIM_MODE=off). Nothing was "
            "written."
        )


def sparse_plan(keras_model, optimizer=None):
    """(names of the layers run on the host, {name: static width} of the inputs made dense for
    the step) of a functional model's ``SparseTensor`` inputs (:func:`tpushim._sparse_inputs.plan`;
    a ``Dense`` reader refused where ``optimizer``, the step's, updates its kernel otherwise
    from stock's sparse gradient)."""

    def dense_update_differs(layer):
        if optimizer is None or not (optimizer.sparse_differs or optimizer.clipping):
            return None
        return (
            "ResourceGather (embedding_lookup_sparse): its kernel's sparse gradient, "
            f"which {type(optimizer).__name__} with these settings applies otherwise "
            "than a dense one"
        )

    return _sparse_inputs.plan(keras_model, ENGINE, dense_update_differs)


def _as_32_bits(a):
    if a.dtype == np.float64:
        return a.astype(np.float32)
    if a.dtype == np.int64:
        return a.astype(np.int32)
    return a


class HostFeed:
    """The host part of one model (:class:`tpushim._host_part.HostPart`) as the JAX engine feeds
    it: :meth:`apply` computes it on a batch, :meth:`arrays` orders the result for the step
    (``names``, fixed at the first batch), :meth:`calling` runs the model from it."""

    def __init__(self, keras_model, part, densified=None):
        self.part = part  # None: only sparse inputs made dense
        self.densified = dict(densified or {})  # sparse input -> its static width
        self.names = None  # the fed features' keys, in the order the step takes them
        self._dtypes = {
            _tfprivate.keras.input_tensor_name(t): t.dtype.as_numpy_dtype
            for t in keras_model.inputs
        }
        self._functions = {}  # mode -> the host's tf.function (its own copy of the layers)

    def describe(self):
        said = [] if self.part is None else [self.part.describe()]
        if self.densified:
            said.append(f"sparse inputs {', '.join(sorted(self.densified))} made dense on the host")
        return "; ".join(said)

    def apply(self, batch, mode):
        """``batch`` (an input_fn's element as numpy: features, or (features, labels)) with the
        host's tensors computed (:func:`tpushim._host_part.element_function`), as numpy; its
        sparse inputs' values (``SparseTensorValue``) made dense."""
        batch = _sparse_values(batch)
        if self.part is None:
            return _dense(batch, self.densified)
        if mode not in self._functions:
            with _tfprivate.keras.keras_random_state_kept():  # a copy stock does not make
                function = _host_part.element_function(self.part, mode)
            self._functions[mode] = tf.function(function, reduce_retracing=True)
        made = self._functions[mode](batch)
        return _dense(made, self.densified)

    def arrays(self, features):
        """(the fed features as a list in ``names`` order, cast as the step takes them; the
        outputs the host made, by output name: predict's)."""
        kept, outputs = _host_part.carried(features)
        if self.names is None:
            self.names = tuple(
                sorted(
                    k
                    for k in kept
                    if k in self._dtypes
                    or k.startswith(_host_part.HOST_PREFIX)
                    or k.startswith(_feature_columns.PREFIX)
                )
            )
        fed = []
        for name in self.names:
            a = np.asarray(kept[name])
            host_only = self.part is not None and name in self.part.host_inputs
            dtype = None if host_only else self._dtypes.get(name)
            fed.append(
                a.astype(dtype) if dtype is not None and a.dtype != dtype else _as_32_bits(a)
            )
        return fed, outputs

    def inputs(self, features):
        """The traced function's features (a list in ``names`` order) as the model takes them."""
        return dict(zip(self.names, features))

    def calling(self, keras_model):
        """While active, ``keras_model`` runs from the fed tensors (the step's trace)."""
        if self.part is None:
            return contextlib.nullcontext()
        return _host_part.running_from_host(self.part, keras_model)


def _sparse_values(structure):
    """``structure`` with each ``SparseTensorValue`` (a session's reading of a SparseTensor) a
    ``tf.SparseTensor``."""
    if isinstance(structure, tf.compat.v1.SparseTensorValue):
        return tf.SparseTensor(*structure)
    if isinstance(structure, dict):
        return {k: _sparse_values(v) for k, v in structure.items()}
    if isinstance(structure, (list, tuple)) and not hasattr(structure, "_fields"):
        return type(structure)(_sparse_values(v) for v in structure)
    return structure


def _dense(structure, widths):
    """``structure`` as numpy, each ``SparseTensor`` made dense (``widths``: an input's static
    width, by name; rows as many as its dense_shape says)."""

    def dense(value, width=None):
        if isinstance(value, tf.SparseTensor):
            shape = value.dense_shape.numpy()
            if width is not None:
                shape = np.array([shape[0], width], np.int64)
            value = tf.sparse.to_dense(
                tf.sparse.reorder(tf.SparseTensor(value.indices, value.values, shape))
            )
        return value.numpy() if isinstance(value, tf.Tensor) else value

    def walk(value, name=None):
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(walk(v) for v in value)
        return dense(value, widths.get(name))

    return walk(structure)
