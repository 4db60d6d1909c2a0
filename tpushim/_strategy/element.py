"""A replica's padded element as the strategy engine reads it (features, labels, the padding
weight, sample weights, the global batch's real rows: :mod:`tpushim._padding`'s structure), and a
model call's outputs and labels as lists in the model's output order."""

import tensorflow as tf

from tpushim import _padding, _tfprivate


def features_spec(element_spec):
    """The features of a replica's element (:func:`_unpack`'s), as specs."""
    features = element_spec[0] if isinstance(element_spec, tuple) else element_spec
    features = features[_padding.FEATURES_KEY]
    if isinstance(features, dict) and set(features) == {"features", "sample_weights"}:
        features = features["features"]
    return features


@_tfprivate.graph.not_converted
def known_rows(element):
    """The global batch's real rows a replica's element carries (:func:`tpushim._padding.
    pad_batch`'s ``counted``: every input the engine makes), or None: then an all-reduce."""
    return _padding.global_rows(element[0] if isinstance(element, tuple) else element)


@_tfprivate.graph.not_converted
def _unpack(element, names):
    """(features, labels or None, padding weight, per output sample weights or None) of a
    padded element: ``{"features", "sample_weights"}`` features as keras_lib splits them."""
    features, labels = element if isinstance(element, tuple) else (element, None)
    pad, features = features[_padding.PADDING_KEY], features[_padding.FEATURES_KEY]
    weights = None
    if isinstance(features, dict) and set(features) == {"features", "sample_weights"}:
        features, weights = features["features"], features["sample_weights"]
        weights = _tfprivate.keras_compile.standardize_sample_weights(weights, names)
    return features, labels, pad, weights


@_tfprivate.graph.not_converted
def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


@_tfprivate.graph.not_converted
def _outputs_list(outputs):
    """A model call's outputs as a list in ``model.outputs`` order: a dict of outputs (a
    functional model built with ``outputs={...}``) flattened as Keras flattens it (sorted keys)."""
    return tf.nest.flatten(outputs) if isinstance(outputs, dict) else _as_list(outputs)


@_tfprivate.graph.not_converted
def _labels_list(labels, names):
    if isinstance(labels, dict):
        return [labels[n] for n in names]
    return _as_list(labels)


def given_parts(element):
    """{"features", "labels"} of a padded element (or its spec) as the input_fn gave them
    (stock's ``{"features", "sample_weights"}`` features too), without the padding weight."""
    features, labels = element if isinstance(element, tuple) else (element, None)
    return {"features": features[_padding.FEATURES_KEY], "labels": labels}
