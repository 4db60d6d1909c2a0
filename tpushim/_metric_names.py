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


def stock_unique_names(per_output):
    """The names stock's model_fn gives a model's compiled metrics, from those Keras's (v2)
    metrics container gave them: ``per_output`` is one ``(output_name, names, weighted_names)``
    per output (``output_name`` None for a single-output model), in the container's order. Where a
    weighted metric's name repeats another's, the container prefixes ``weighted_``; stock compiles
    its clone in a graph (Keras's v1 training), which appends ``_1``, ``_2``, ... to any name
    already taken, the loss's names included (``metrics=["accuracy"]`` with
    ``weighted_metrics=["accuracy"]``: ``accuracy`` and ``accuracy_1``). Returns the names in that
    order (per output: its metrics, then its weighted metrics)."""
    taken = {"loss"} | {f"{out}_loss" for out, _, _ in per_output if out is not None}
    container = set()  # the container's names so far, to tell the prefix it added
    names = []

    def unique(name):
        base, j = name, 1
        while name in taken:
            name, j = f"{base}_{j}", j + 1
        taken.add(name)
        names.append(name)

    for out, plain, weighted in per_output:
        own = "" if out is None else f"{out}_"
        for name in plain:
            container.add(name)
            unique(name)
        for name in weighted:
            prefix = f"{own}weighted_"
            if name.startswith(prefix) and own + name[len(prefix) :] in container:
                name = own + name[len(prefix) :]  # the container's prefix undone
            container.add(name)
            unique(name)
    return names
