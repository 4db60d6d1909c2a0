"""Static shapes the Keras model declares, given to the input features that lack them.

A TPU compiles for static shapes, and TPUEstimator refuses a feature whose shape is not fully
known. Legacy pipelines often leave unknown a dimension the model declares: ``decode_jpeg(x)``
without a channel count, resized to 224x224, is ``[224, 224, None]`` where the model's ``Input``
says ``(224, 224, 3)``. Where the model declares a feature's shape (its Input layers, matched to
the features as keras_lib matches them: a dict by input name, a list or tuple by position, one
tensor to a model of one input), the feature is given that shape, and every element is checked
to have it, with an error naming the feature where one does not.
"""

import dataclasses
from typing import Optional

import tensorflow as tf

from tpushim import _observe


@dataclasses.dataclass(frozen=True)
class ModelInputs:
    """The inputs a Keras model declares, in its order.

    Attributes:
      names: the model's input names (``keras_model.input_names``).
      shapes: each input's ``tf.TensorShape``, the batch dimension included.
      feature_split: the :class:`tpushim._feature_columns.Split` of its ``DenseFeatures``
        layers (what the input pipeline computes for them), or None.
      sparse_part: the :class:`tpushim._host_part.HostPart` of its ``SparseTensor`` inputs
        (made dense, or read, in the input pipeline), or None.
    """

    names: tuple
    shapes: tuple
    feature_split: object = None
    sparse_part: object = None

    @classmethod
    def of(cls, keras_model, feature_split=True, custom_objects=None) -> Optional["ModelInputs"]:
        """What ``keras_model`` declares; None for a model that declares no inputs (subclassed,
        or a Sequential given no input shape). ``feature_split=False``: the shapes only (the
        strategy engine, which splits no feature columns); ``custom_objects``: as given to
        ``model_to_estimator`` (the split's copy of host layers needs them)."""
        inputs = getattr(keras_model, "inputs", None)
        if not inputs:
            return None
        return cls(
            tuple(keras_model.input_names),
            tuple(tf.TensorShape(t.shape) for t in inputs),
            *(
                _tpuestimator_plan(name, keras_model, custom_objects) if feature_split else None
                for name in ("feature_split", "sparse_part")
            ),
        )


def _tpuestimator_plan(name, keras_model, custom_objects=None):
    """The TPUEstimator path's ``"feature_split"`` (:func:`tpushim._feature_columns.plan`) or
    ``"sparse_part"`` (:func:`tpushim._host_part.sparse_only`: the ``SparseTensor`` inputs' host
    part); None where the model has none or it cannot be made (the conversion refuses that
    model, saying why), and on tpushim's estimator API (TensorFlow >= 2.16): nothing is split
    there (it takes SparseTensors as stock), and _feature_columns needs tensorflow_estimator."""
    from tpushim import _versions

    if _versions.uses_own_estimator():
        return None
    from tpushim import _feature_columns, _host_part
    from tpushim._errors import ConversionError

    plan = {"feature_split": _feature_columns.plan, "sparse_part": _host_part.sparse_only}[name]
    try:
        return plan(keras_model, custom_objects)
    except ConversionError:
        return None


def _sparse_part(keras_model, custom_objects=None):
    """:func:`_tpuestimator_plan`'s ``"sparse_part"`` (the preflight's too)."""
    return _tpuestimator_plan("sparse_part", keras_model, custom_objects)


def _features_of(spec):
    """(features, labels or None) of an element (spec), as Estimator reads it."""
    if isinstance(spec, tuple) and len(spec) == 2:
        return spec
    return spec, None


def _leaves_declared(features, inputs):
    """[(path, input name, declared shape)] per flat leaf of ``features`` (None where the model
    declares nothing for it), matched as keras_lib's ``_convert_estimator_io_to_keras`` does."""
    flat = tf.nest.flatten(features)
    nothing = [None] * len(flat)
    if inputs is None:
        return nothing
    if isinstance(features, dict) and set(features) == {"features", "sample_weights"}:
        inner = _leaves_declared(features["features"], inputs)
        weights = [None] * len(tf.nest.flatten(features["sample_weights"]))
        # tf.nest flattens a dict in sorted key order: 'features' before 'sample_weights'.
        return inner + weights
    by_name = dict(zip(inputs.names, zip(inputs.names, inputs.shapes)))
    if isinstance(features, dict):
        out = []
        for key in sorted(features):  # tf.nest's order
            value = features[key]
            leaves = tf.nest.flatten(value)
            if len(leaves) == 1 and leaves[0] is value and key in by_name:
                name, shape = by_name[key]
                out.append((f"feature {key!r}", name, shape))
            else:
                out += [None] * len(leaves)
        return out
    if isinstance(features, (list, tuple)):
        if len(features) != len(inputs.shapes) or len(flat) != len(features):
            return nothing
        return [
            (f"feature [{i}]", name, shape)
            for i, (name, shape) in enumerate(zip(inputs.names, inputs.shapes))
        ]
    if len(flat) == 1 and len(inputs.shapes) == 1:
        return [("features (a single tensor)", inputs.names[0], inputs.shapes[0])]
    return nothing


def _completed(spec, declared):
    """The shape ``spec`` (a TensorSpec) takes from ``declared``: None when the model adds
    nothing to it, or disagrees with it (the model then fails on it as it would in stock)."""
    if not isinstance(spec, tf.TensorSpec) or declared.rank is None:
        return None
    if spec.shape.rank is not None and spec.shape.rank != declared.rank:
        return None
    batch = tf.TensorShape([None]).concatenate(declared[1:])
    try:
        merged = spec.shape.merge_with(batch)
    except ValueError:
        return None
    if spec.shape.rank is not None and merged.as_list()[1:] == spec.shape.as_list()[1:]:
        return None
    return merged


@dataclasses.dataclass(frozen=True)
class Completion:
    """A feature whose shape the model declares more fully than the input does.

    Attributes:
      index: its place among the flattened features.
      where: how errors and findings name it (``feature 'image'``, ``feature [0]``,
        ``features (a single tensor)``).
      input_name: the model input it feeds.
      declared: the shape that input declares.
      found: the feature's shape in the input.
      completed: the shape tpushim gives it (``found`` merged with ``declared``).
    """

    index: int
    where: str
    input_name: str
    declared: tf.TensorShape
    found: tf.TensorShape
    completed: tf.TensorShape


def completions(spec, inputs):
    """A :class:`Completion` for each feature of the element ``spec`` whose shape the model
    declares more fully."""
    features, _ = _features_of(spec)
    found = []
    for i, (leaf, declared) in enumerate(
        zip(tf.nest.flatten(features), _leaves_declared(features, inputs))
    ):
        if declared is None:
            continue
        where, name, shape = declared
        completed = _completed(leaf, shape)
        if completed is not None:
            found.append(Completion(i, where, name, shape, leaf.shape, completed))
    return found


def declared_spec(spec, inputs):
    """The element spec with the shapes :func:`with_declared_shapes` gives the features."""
    found = completions(spec, inputs)
    if not found:
        return spec
    features, labels = _features_of(spec)
    flat = tf.nest.flatten(features)
    for c in found:
        flat[c.index] = tf.TensorSpec(c.completed, flat[c.index].dtype, flat[c.index].name)
    features = tf.nest.pack_sequence_as(features, flat)
    return (features, labels) if isinstance(spec, tuple) and len(spec) == 2 else features


def _given(x, completion):
    """``x`` with the static shape the :class:`Completion` gives it, after checking it has it."""
    completed, declared = completion.completed, completion.declared
    dims = [i for i, d in enumerate(completed.as_list()) if i > 0 and d is not None]
    want = tf.constant([completed.as_list()[i] for i in dims], tf.int32)
    shape = tf.shape(x, out_type=tf.int32)
    ok = tf.cond(
        tf.equal(tf.size(shape), completed.rank),
        lambda: tf.reduce_all(tf.equal(tf.gather(shape, dims), want)),
        lambda: tf.constant(False),
    )
    where = completion.where.replace("'", "")  # TensorFlow escapes quotes when it prints this
    message = (
        f"tpushim: {where} has another shape than "
        f"{tuple(declared.as_list())}, which the model input {completion.input_name} declares "
        f"and tpushim gives it (a TPU needs static shapes); make every element that shape in the "
        f"input pipeline (e.g. decode_jpeg(..., channels=3), tf.image.resize). This batch has "
        f"shape"
    )
    with tf.control_dependencies([tf.debugging.Assert(ok, [message, shape], summarize=16)]):
        return tf.ensure_shape(x, completed)


def with_declared_shapes(dataset, inputs):
    """``dataset`` with each feature whose shape the model declares more fully given that
    static shape, every element checked (see the module's docstring)."""
    found = completions(dataset.element_spec, inputs)
    if not found:
        return dataset
    _observe.note(
        "shapes",
        "input shapes completed from the model's inputs: %s",
        ", ".join(f"{c.where} {tuple(c.completed.as_list())}" for c in found),
    )

    def give(*element):
        element = element[0] if len(element) == 1 else element
        features, labels = _features_of(element)
        flat = tf.nest.flatten(features)
        for c in found:
            flat[c.index] = _given(flat[c.index], c)
        features = tf.nest.pack_sequence_as(features, flat)
        return (features, labels) if isinstance(element, tuple) and len(element) == 2 else features

    return dataset.map(give)
