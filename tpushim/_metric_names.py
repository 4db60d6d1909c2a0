"""``model_to_estimator``'s ``metric_names_map``: stock keras_lib's checks and its renaming of a
model's compiled metrics, which both engines' evaluation reports. Pure Python."""


def mapped_metric_names(names, metric_names_map):
    """``names`` (a model's compiled metrics' names, as stock's model_fn names them) renamed by
    model_to_estimator's ``metric_names_map``, with stock keras_lib's checks and texts: its keys
    must be exactly those names. A model without compiled metrics ignores it, as stock's. Both
    engines' (the core's: importable where TensorFlow has no tf.estimator)."""
    if not metric_names_map or not names:
        return list(names)
    # Stock keras_lib's checks and texts, verbatim.
    custom_map_keys = set(metric_names_map.keys())
    expected_keys = set(names)
    unknown = expected_keys.difference(custom_map_keys)
    if unknown:
        raise ValueError(
            "Invalid `metric_names_map`. "
            f'The following keras model metric names:"{list(unknown)}" do not exist in '
            "the `metric_names_map` dictionary"
        )
    extra = custom_map_keys.difference(expected_keys)
    if extra:
        raise ValueError(
            "Invalid `metric_names_map`. "
            "There are unexpected keys in the `metric_names_map` "
            f"dictionary. Expected keys: {list(expected_keys)}, Received: {list(extra)}"
        )
    return [metric_names_map[name] for name in names]
