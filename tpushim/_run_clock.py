"""The hook TPUShimEstimator and tpushim's own Estimator (TensorFlow >= 2.16) time a training call
with, for the run summary: the global steps the call ran and how long its first session run took."""

import time

import tensorflow as tf


class RunClock(tf.compat.v1.train.SessionRunHook):
    """The global steps a training call ran and how long its first session run took (on a TPU,
    the first loop of ``iterations_per_loop`` steps, compilation included)."""

    def __init__(self):
        self.steps = self.first_run = None
        self._step = self._start = self._first_step = None

    def begin(self):
        self._step = tf.compat.v1.train.get_global_step()

    def before_run(self, run_context):
        del run_context
        if self._first_step is not None:
            return None
        # The step is fetched with the first run, not read alone when the session starts: a
        # separate read there makes StepCounterHook warn that the global step stalled.
        self._start = time.monotonic()
        return tf.compat.v1.train.SessionRunArgs(self._step)

    def after_run(self, run_context, run_values):
        del run_context
        if self._first_step is None:
            self._first_step = int(run_values.results)
            self.first_run = time.monotonic() - self._start

    def end(self, session):
        if self._first_step is not None:
            self.steps = int(session.run(self._step)) - self._first_step
