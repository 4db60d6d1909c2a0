"""Input wait: how long a train/evaluate/predict call waited for its input pipeline.

Measured where the estimator's session reads the next batch on the host (cpu mode, the TPU code
path run on CPU): each session run's read of the batch (``IteratorGetNext``) is bracketed by two
``tf.timestamp`` ops, one that the read waits for and one that waits for the read; their
difference is the time that run waited for its batch. A hook sums it over the call's runs.

Why the timestamps are added when the session starts (``SessionRunHook.begin``), to a read made
earlier, and not around it when it is made: ops made before the model_fn move the op seeds of the
model's unseeded random ops (dropout) by the graph's op count, and observing must not change what
a call computes. Only while an observer listens (:mod:`tpushim._observe`): otherwise nothing is
added.

On a TPU the batch is read by TPUEstimator's infeed threads, concurrently with the TPU's loop, and
what the TPU waits for is in its infeed queue: that wait is the Cloud TPU profiler's to show
(its input pipeline analysis), not measured here.

The strategy engine (:mod:`tpushim._strategy`) reads its input inside the training loop's
``tf.function``, on the host, one step at a time: each step's read of the distributed iterator
(``next``, or ``get_next_as_optional`` where the input's length is unknown) is bracketed by two
``tf.timestamp`` ops there (:func:`next_input`), and their difference summed into a host
variable -- the time the loop waited for the step's batch before it could run the step (the
previous step has returned: the loop's body runs once its last iteration's results are in).
Those ops are added whether or not anyone observes, so the function observed is the one run
unobserved (an op seed follows the graph's op count). Evaluation and prediction iterate the
input in Python: each ``next()`` is timed (:func:`timed`).
"""

import contextlib
import threading
import time

import tensorflow as tf

from tpushim import _tfprivate

#: The graph collection holding the batch reads to time (IteratorGetNext ops).
READS = "tpushim_input_reads"

_READ_OPS = ("IteratorGetNext", "IteratorGetNextSync")


def mark(*structures):
    """Notes the batch reads that produced ``structures`` (features, labels) for timing."""
    graph = tf.compat.v1.get_default_graph()
    known = graph.get_collection(READS)
    for tensor in tf.nest.flatten(structures):
        op = getattr(tensor, "op", None)
        if op is not None and op.type in _READ_OPS and op not in known:
            graph.add_to_collection(READS, op)
            known.append(op)


class InputWaitHook(tf.compat.v1.train.SessionRunHook):
    """Sums the time each session run waited for its batch (:func:`mark`'s reads).

    ``seconds`` is None when the graph had no read to time (a TPU's infeed), else the sum over
    the runs that returned (the run that finds the input exhausted is not counted).
    """

    def __init__(self):
        self.seconds = None
        self._wait = None

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        reads = graph.get_collection(READS)
        if not reads:
            return
        with tf.name_scope("tpushim_input_wait"):
            before = tf.timestamp()
            for read in reads:
                _tfprivate.graph.add_control_input(read, before.op)
            with tf.control_dependencies(reads):
                after = tf.timestamp()
            self._wait = after - before
        self.seconds = 0.0

    def before_run(self, run_context):
        del run_context
        if self._wait is None:
            return None
        return tf.compat.v1.train.SessionRunArgs(self._wait)

    def after_run(self, run_context, run_values):
        del run_context
        if self._wait is not None:
            self.seconds += float(run_values.results)


# --- the strategy engine ------------------------------------------------------------------------

_local = threading.local()  # the StrategyWait of the call this thread is in


class StrategyWait:
    """The input wait of one strategy engine call: a host variable the training loop adds each
    step's wait to, and the seconds Python waited for evaluation and prediction batches."""

    def __init__(self):
        with tf.init_scope():  # eager, on the host: not one of the strategy's variables
            self.variable = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.eager = 0.0

    @property
    def seconds(self):
        """The seconds the call waited for its input."""
        return float(self.variable.numpy()) + self.eager


@contextlib.contextmanager
def strategy_timing():
    """Within it, this thread's strategy engine call adds its input wait to the yielded
    :class:`StrategyWait`."""
    outer = getattr(_local, "wait", None)
    _local.wait = wait = StrategyWait()
    try:
        yield wait
    finally:
        _local.wait = outer


@_tfprivate.graph.not_converted
def next_input(iterator, checked=True):
    """``iterator.get_next_as_optional()`` inside a ``tf.function`` (``checked`` False: the
    element itself, ``next(iterator)``, where the caller knows one is left), its wait added to
    the active :class:`StrategyWait` (the same ops without one: the function is the same)."""
    wait = getattr(_local, "wait", None)
    with tf.name_scope("tpushim_input_wait"):
        before = tf.timestamp()
    with tf.control_dependencies([before]):
        read = iterator.get_next_as_optional() if checked else next(iterator)
    after = [read.has_value()] if checked else tf.nest.flatten(read, expand_composites=True)
    with tf.name_scope("tpushim_input_wait"), tf.control_dependencies(after):
        waited = tf.timestamp() - before
        if wait is not None:
            wait.variable.assign_add(waited)
        else:
            tf.identity(waited)
    return read


class _Timed:
    """A distributed dataset whose iteration times each ``next()`` into a :class:`StrategyWait`."""

    def __init__(self, dataset, wait):
        self._dataset, self._wait = dataset, wait

    def __iter__(self):
        iterator = iter(self._dataset)
        while True:
            began = time.monotonic()
            try:
                element = next(iterator)
            except StopIteration:
                return
            finally:
                self._wait.eager += time.monotonic() - began
            yield element

    def __getattr__(self, name):
        return getattr(self._dataset, name)


def timed(dataset):
    """``dataset`` (a distributed dataset iterated in Python), each ``next()`` timed into the
    active :class:`StrategyWait`; ``dataset`` itself where there is none."""
    wait = getattr(_local, "wait", None)
    return dataset if wait is None else _Timed(dataset, wait)
