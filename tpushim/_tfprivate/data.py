"""tf.data and tf.nest: a Dataset's graph, its serialized form, the replicas each input pipeline
feeds, readable paths of a structure's leaves.
"""


def leaf_paths(structure):
    """A readable path ("features/age") for every leaf of ``structure``, in ``tf.nest.flatten``
    order (the public ``tf.nest`` has no paths)."""
    from tensorflow.python.util import nest

    return [path for path, _ in nest.flatten_with_joined_string_paths(structure)]


def dataset_variant_op(dataset):
    """The graph op that makes ``dataset`` (its last transformation), or None where there is none."""
    try:
        return dataset._variant_tensor.op
    except (AttributeError, ValueError):
        return None


def input_replicas(strategy, options):
    """Per input pipeline (one per TPU host), the replicas it feeds, as indices into the
    strategy's replica order: each input worker feeds the TPU devices of its host
    (``TPUExtended._get_input_workers``), and ``worker_devices`` lists every replica's device in
    replica order. None where this TensorFlow keeps neither."""
    extended = strategy.extended
    try:
        workers = extended._get_input_workers(options)
        devices = list(extended.worker_devices)
        return tuple(
            tuple(devices.index(d) for d in workers.compute_devices_for_worker(w))
            for w in range(workers.num_workers)
        )
    except (AttributeError, ValueError, TypeError):
        return None


def serialized_dataset(dataset):
    """The GraphDef (a string tensor, in ``dataset``'s graph) of a Dataset built in a graph: read
    by a session, ``tf.raw_ops.DatasetFromGraph`` makes the same Dataset eagerly (how tf.data
    moves a pipeline between hosts and to its service)."""
    return dataset._as_serialized_graph()
