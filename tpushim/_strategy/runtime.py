"""Where the strategy engine runs: its ``tf.distribute`` strategy, one per process and TPU
(``TPUStrategy``) or device set (``MirroredStrategy``), and the eager runtime its calls run on,
also for a program that disabled it."""

import contextlib

import tensorflow as tf

from tpushim import _tfprivate

_TPU_STRATEGIES = {}  # master -> TPUStrategy: a TPU system is initialised once per process
_CPU_STRATEGIES = {}  # device names -> MirroredStrategy (see cpu_strategy)


def cpu_strategy():
    """TPUStrategy's data-parallel semantics here: a MirroredStrategy over every GPU, else every
    logical CPU device (8 of them where ``tf.config.set_logical_device_configuration`` made 8).

    One per process and device set, as the TPU's: each strategy numbers its collective ops from
    1, and TensorFlow keeps the shape of each (group, instance) it has run, so a second strategy
    whose calls trace in another order (train twice, where the first evaluated) reuses a number
    with another shape and fails ("Shape mismatch in the collective instance")."""
    names = tuple(
        d.name
        for d in tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
    )
    if names not in _CPU_STRATEGIES:
        _CPU_STRATEGIES[names] = tf.distribute.MirroredStrategy(list(names))
    return _CPU_STRATEGIES[names]


def tpu_strategy(resolver):
    """``tf.distribute.TPUStrategy`` on ``resolver``'s TPU, set up as TensorFlow's migration
    guide (guide/migrate/tpu_estimator) does; once per TPU in a process."""
    key = resolver.master()
    if key not in _TPU_STRATEGIES:
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        _TPU_STRATEGIES[key] = tf.distribute.TPUStrategy(resolver)
    return _TPU_STRATEGIES[key]


def runtime(plan):
    """Where the engine runs ``plan``'s calls: on the eager runtime, also for a program that
    disabled it (:func:`tpushim._tfprivate.graph.eager_runtime`; its graph mode back after a call)."""
    if plan.graph_mode:
        return _eager_runtime(plan.keras_model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _eager_runtime(keras_model):
    """The eager runtime for a program that disabled it, left as that program had it: its
    graph mode back, and its model's v1 classes (the eager clones swapped them to v2)."""
    try:
        with _tfprivate.graph.eager_runtime():
            yield
    finally:
        _tfprivate.keras.restore_v2_classes(keras_model, v1=True)
