"""The first import of every strategy-engine proof process (tests/strategy_*_proof.py): the 8
logical CPU devices the engine's MirroredStrategy spreads its replicas over, made before
TensorFlow initialises (so a proof runs in a process of its own), and on TensorFlow >= 2.16
``tf.keras`` as tf_keras (set before TensorFlow is imported).

``import eight_devices`` before anything imports TensorFlow. Also: ``NO_STOCK`` (no stock
estimator: TensorFlow >= 2.16, where stock is stock 2.15's recorded numbers) and :func:`recorded`.

A helper module, not a test module.
"""

import importlib.util
import json
import os

if importlib.util.find_spec("tensorflow_estimator") is None:  # TensorFlow >= 2.16
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras is tf_keras there

import tensorflow as tf

REPLICAS = 8
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS
)
# Eight devices' ops run at once, some waiting on the others' (the replicas' sums): with the
# inter-op pool of a 2-core machine they can all be waiting and none running.
tf.config.threading.set_inter_op_parallelism_threads(32)

#: no stock estimator (TensorFlow >= 2.16): stock is stock TensorFlow 2.15's recorded numbers
NO_STOCK = tuple(int(p) for p in tf.__version__.split(".")[:2]) >= (2, 16)
#: tests/reference/, where those numbers are
REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference")


def recorded(path, key):
    """``(metrics, predictions, {variable: value})`` recorded under ``key`` in the JSON file
    ``path`` (numbers as float64 arrays)."""
    import numpy as np

    with open(path) as f:
        entry = json.load(f)[key]
    return (
        entry["metrics"],
        np.array(entry["predictions"], np.float64),
        {n: np.array(v, np.float64) for n, v in entry["values"].items()},
    )
