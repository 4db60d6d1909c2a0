"""Source recovery (tpushim/_source.py) from several threads at once."""

import threading

import numpy as np
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

feeding_functions = tpuestimator_import(
    "tensorflow_estimator.python.estimator.inputs.queues", "feeding_functions"
)
_source = tpuestimator_import("tpushim._source")
ModeKeys = tfcases.ModeKeys
#: Source recovery adapts an input_fn for the TPU path (cpu mode's TPUEstimator).
pytestmark = pytest.mark.tpuestimator


def _originals():
    return (
        tf.compat.v1.data.make_one_shot_iterator,
        tf.compat.v1.data.make_initializable_iterator,
        tf.compat.v1.data.Dataset.__dict__["make_one_shot_iterator"],
        tf.compat.v1.data.Dataset.__dict__["make_initializable_iterator"],
        feeding_functions._enqueue_data,
    )


def test_overlapping_input_fn_calls_from_two_threads_each_recover_their_own_source():
    """A enters, B enters, A exits, B exits: each input_fn's iterator is traced to its own
    Dataset, and TensorFlow's names are TensorFlow's own again afterwards."""
    before = _originals()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    results, errors = {}, []

    def input_fn(name, wait_for, signal, values):
        def fn():
            signal.set()
            assert wait_for.wait(30), f"{name} timed out"
            x = np.array(values, "float32")
            dataset = tf.compat.v1.data.Dataset.from_tensor_slices((x, 10 * x)).batch(2)
            return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()

        return fn

    def run(name, fn, after=None):
        try:
            with tf.Graph().as_default():
                dataset = _source.call_and_recover(fn, ModeKeys.TRAIN, {}, None)
                if isinstance(dataset, tf.data.Dataset):  # the first batch it feeds
                    get_next = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
                    with tf.compat.v1.Session() as session:
                        dataset = session.run(get_next)
                results[name] = dataset
        except Exception as e:  # reported by the main thread
            errors.append(e)
        finally:
            if after is not None:
                after.set()

    thread_a = threading.Thread(
        target=run, args=("A", input_fn("A", b_in, a_in, [1, 2, 3, 4]), a_out)
    )
    thread_b = threading.Thread(target=run, args=("B", input_fn("B", a_out, b_in, [5, 6])))
    thread_a.start()
    assert a_in.wait(30)
    thread_b.start()
    thread_a.join(60)
    thread_b.join(60)
    assert not errors, errors
    for name, first in (("A", [1, 2]), ("B", [5, 6])):
        assert isinstance(results[name], tuple) and not tf.is_tensor(results[name][0]), name
        np.testing.assert_array_equal(results[name][0], first)
        np.testing.assert_array_equal(results[name][1], np.multiply(first, 10))
    assert _originals() == before
