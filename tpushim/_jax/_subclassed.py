"""A subclassed Keras model on the JAX engine, made as stock's model_fn makes its clone.

Stock's ``model_to_estimator`` takes a subclassed model with ``checkpoint_format='saver'``: its
model_fn rebuilds it from its config (``cls.from_config(model.get_config())``: fresh weights, no
warm start, its variables ``<model>/dense/kernel``, ...) and calls it on each call's features,
naming its outputs ``output_1``, ``output_2``, ...; the model's own ``train_step`` is never
called. A subclassed model has no inputs, outputs or added losses until it is called, so the
engine does the same once the input_fn's first batch is read (:class:`Conversion`): the model
rebuilt as stock rebuilds it (:func:`tpushim._tfprivate.keras.subclassed_clone`), called once
on Keras inputs of the features' specs, and wrapped in a functional model of those inputs and
outputs (the stand-in, its outputs named as stock names them, compiled as the user compiled the
model, with the user's optimizer). The engine's step then traces the stand-in as it traces a
graph network; stock's checkpoint names come from stock's training graph built on the same
specs, matched to the clone's weights by their object paths (``hidden/kernel``).

What the model's call cannot do in a functional call on symbolic inputs (a shape that depends
on the values, a Python branch on a tensor) is refused, naming the model and TensorFlow's error.
"""

import logging

import numpy as np
import tensorflow as tf

from tpushim import _tfprivate, _validation
from tpushim._errors import ConversionError
from tpushim._jax import _checkpoint, _host

logger = logging.getLogger("tpushim")


def _32_bits(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.float64:  # as the other engines feed it (no TPU infeed takes float64)
        return tf.float32
    if dtype == np.int64:
        return tf.int32
    return tf.as_dtype(dtype)


def _refuse_sparse(features):
    """Refuses a ``SparseTensor`` feature (a session's ``SparseTensorValue``), naming it: the
    engine makes sparse inputs dense on the host for a functional model's readers only
    (:mod:`._host`), and a subclassed model's call is one layer reading them on the devices."""
    if isinstance(features, dict):
        items = features.items()
    elif isinstance(features, (list, tuple)) and not hasattr(features, "_fields"):
        items = enumerate(features)
    else:
        items = [("features", features)]
    for key, value in items:
        if isinstance(value, (tf.compat.v1.SparseTensorValue, tf.SparseTensor)):
            raise ConversionError(
                f"tpushim's JAX engine does not run a subclassed model on a SparseTensor "
                f"feature ({key!r}): its call would read the sparse tensor on the devices. The "
                "engine makes a sparse input dense on the host for a functional model's "
                "Input(sparse=True) read by a CategoryEncoding, a Dense or a Lambda of sparse "
                "ops; build the model functional, or make the feature dense in the input_fn "
                "(tf.sparse.to_dense). Nothing was written."
            )


def features_spec(features):
    """The specs of the input's features (a batch's: an array, a dict or a list of arrays), any
    number of rows, 64-bit numbers as 32-bit ones (as the engine feeds them). A sparse feature
    is refused by name (:func:`_refuse_sparse`)."""
    _refuse_sparse(features)

    def spec(a):
        a = np.asarray(a)
        if a.dtype.kind in "OSU":
            raise ConversionError(
                "tpushim's JAX engine does not run a subclassed model on string features yet "
                "(its strings and lookups would run on the host, which needs a functional "
                "model). Use engine='strategy' (TPUSHIM_ENGINE=strategy), which does."
            )
        return tf.TensorSpec([None, *a.shape[1:]], _32_bits(a.dtype))

    return tf.nest.map_structure(spec, features)


def _inputs(spec):
    """Keras inputs of ``spec``'s structure, named (a dict's by its keys) so that no Keras name
    counter moves (the names of the layers a program makes next are stock's)."""
    if isinstance(spec, dict):
        return {k: tf.keras.Input(s.shape[1:], dtype=s.dtype, name=str(k)) for k, s in spec.items()}
    if isinstance(spec, (list, tuple)):
        return [
            tf.keras.Input(s.shape[1:], dtype=s.dtype, name=f"features_{i}")
            for i, s in enumerate(spec)
        ]
    return tf.keras.Input(spec.shape[1:], dtype=spec.dtype, name="features")


def stand_in(keras_model, custom_objects, spec):
    """``(stand-in, clone)``: the model rebuilt as stock rebuilds it (``clone``, its weights
    named as stock's) and a functional model around its call on inputs of ``spec``, its outputs
    named ``output_1``, ... and compiled as ``keras_model`` is (see the module)."""
    with (
        _tfprivate.keras.keras_random_state_kept(),  # stock's clone draws in its own graph
        tf.keras.utils.custom_object_scope(custom_objects or {}),
    ):
        clone = _tfprivate.keras.subclassed_clone(keras_model)
        inputs = _inputs(spec)
        try:
            outputs = clone(inputs)
        except Exception as e:  # what a functional call on symbolic inputs cannot run
            raise ConversionError(
                f"tpushim's JAX engine cannot build the subclassed model "
                f"{type(keras_model).__name__} on its input's shapes ({spec}): its call failed "
                f"on symbolic inputs ({type(e).__name__}: {' '.join(str(e).split())[:300]}): "
                "a shape that depends on the values, or a Python branch on a tensor, does not "
                "trace. Use engine='strategy' (TPUSHIM_ENGINE=strategy), which runs it."
            ) from e
        model = tf.keras.Model(inputs, outputs, name=f"{clone.name}_stand_in")
        if clone._expects_training_arg:  # given the mode, as stock gives the subclassed model
            setattr(model, _tfprivate.keras.PASSES_TRAINING, True)
        model.output_names = _tfprivate.keras.generic_output_names(tf.nest.flatten(outputs))
        args = _tfprivate.keras.compile_args(keras_model)
        model.compile(
            optimizer=keras_model.optimizer,
            loss=args.get("loss"),
            metrics=_tfprivate.keras_compile.clone_metrics(args.get("metrics")),
            weighted_metrics=_tfprivate.keras_compile.clone_metrics(args.get("weighted_metrics")),
            loss_weights=args.get("loss_weights"),
        )
    return model, clone


class BuiltOnInput:
    """What a :class:`tpushim._jax._build.JaxConversion` of a subclassed model adds (its
    ``SubclassedConversion`` mixes it in): :meth:`build_on` at the first call's first batch;
    until then ``keras_model`` is the user's model and ``checkpoints`` None."""

    awaits_input = True

    def __init__(self, keras_model, custom_objects, object_based, settings, *names_and_program):
        self.user_model, self._object_based, self.spec = keras_model, object_based, None
        super().__init__(keras_model, custom_objects, object_based, settings, *names_and_program)
        _validation.said_subclassed(keras_model)  # as the other engines say it

    def build_on(self, features):
        """Builds the stand-in on a batch's ``features`` (as the input_fn gave them), once."""
        if self.spec is not None:
            return
        spec = features_spec(features)
        model, clone = stand_in(self.user_model, self.custom_objects, spec)
        checkpoints = _checkpoint.StockCheckpoints(
            self.user_model, self.custom_objects, self._object_based, features=spec, built=clone
        )
        self.keras_model, self.checkpoints, self.spec = model, checkpoints, spec
        self.host = _host.plan(model, self.custom_objects)
        self.awaits_input = False
        _tfprivate.keras.restore_v2_classes(model)  # stock's graph clone left them v1

    def metrics_model(self):
        """A stand-in of its own (its compiled metrics fresh), as
        :meth:`tpushim._jax._build.JaxConversion.metrics_model` copies a graph network."""
        model, _ = stand_in(self.user_model, self.custom_objects, self.spec)
        return model
