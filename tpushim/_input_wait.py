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
"""

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
                _tfprivate.add_control_input(read, before.op)
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
