"""The model's host part on the JAX engine: what a functional model does with strings and
lookups (a ``StringLookup``, hashing, feature columns' lookups in a ``DenseFeatures`` layer, a key
passed through to an output), computed in TensorFlow on the host for each batch read, before the
batch goes to the devices; the step in JAX then runs the model from those tensors (the
frontier) to its outputs, the feature columns' embedding weights training in it.

The split is the strategy engine's (:mod:`tpushim._host_part`: which layers, what the host feeds,
how the model runs from it): here the host's function is applied to each numpy batch instead of
in a ``Dataset.map``, and the model the step traces is the user's, run from the fed tensors only
while it is traced (:func:`tpushim._host_part.running_from_host`).
"""

import numpy as np
import tensorflow as tf

from tpushim import _feature_columns, _host_part, _tfprivate

#: How the JAX engine's refusals of a host part name it.
ENGINE = "tpushim's JAX engine"


def plan(keras_model, custom_objects):
    """The model's :class:`HostFeed`, or None where nothing runs on the host. Raises the host
    part's refusals (a lookup reading a trainable layer's output, a key output's loss that
    weighs something), naming the layer."""
    part = _host_part.plan(keras_model, custom_objects, engine=ENGINE)
    return None if part is None else HostFeed(keras_model, part)


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

    def __init__(self, keras_model, part):
        self.part = part
        self.names = None  # the fed features' keys, in the order the step takes them
        self._dtypes = {
            _tfprivate.keras.input_tensor_name(t): t.dtype.as_numpy_dtype
            for t in keras_model.inputs
        }
        self._functions = {}  # mode -> the host's tf.function (its own copy of the layers)

    def describe(self):
        return self.part.describe()

    def apply(self, batch, mode):
        """``batch`` (an input_fn's element as numpy: features, or (features, labels)) with the
        host's tensors computed (:func:`tpushim._host_part.element_function`), as numpy."""
        if mode not in self._functions:
            with _tfprivate.keras.keras_random_state_kept():  # a copy stock does not make
                function = _host_part.element_function(self.part, mode)
            self._functions[mode] = tf.function(function, reduce_retracing=True)
        made = self._functions[mode](batch)
        return tf.nest.map_structure(lambda t: t.numpy(), made)

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
            dtype = self._dtypes.get(name) if name not in self.part.host_inputs else None
            fed.append(
                a.astype(dtype) if dtype is not None and a.dtype != dtype else _as_32_bits(a)
            )
        return fed, outputs

    def inputs(self, features):
        """The traced function's features (a list in ``names`` order) as the model takes them."""
        return dict(zip(self.names, features))

    def calling(self, keras_model):
        """While active, ``keras_model`` runs from the fed tensors (the step's trace)."""
        return _host_part.running_from_host(self.part, keras_model)
