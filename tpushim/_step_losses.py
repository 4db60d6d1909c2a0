"""The training loss of every step on a TPU: stock's log line and NaN check, at stock's steps.

Stock's Estimator fetches the loss with every step: ``NanTensorHook`` raises
``NanLossDuringTrainingError`` after the first step whose loss is NaN, and ``LoggingTensorHook``
logs ``loss = L, step = S`` at the first step of each ``train()`` call and then every
``log_step_count_steps`` steps. On a TPU one ``session.run`` is a loop of ``iterations_per_loop``
steps, and TPUEstimator reads the loss once per loop: its last step's, logged every
``ceil(log_step_count_steps / iterations_per_loop)`` loops.

tpushim's TPU training step records each step's global loss (the reported one,
:mod:`tpushim._losses`) and the global step before it (stock's label) in two local variables of
``iterations_per_loop`` entries, at entry ``n mod iterations_per_loop`` for the session's n-th
step (a third local variable counts them: the steps of one loop never share an entry, whatever
the global step advances by; every shard writes the same values). After each loop :class:`StepLossHook` reads
both (one small read per loop) and does, step by step, what stock's hooks did: it logs stock's line
at stock's steps and, at the first NaN step, logs and raises stock's error. It runs in the user's
process, so the lines reach the user's log on a TPU node too (a ``host_call`` runs on the TPU's
host, whose log the user does not see). The lines of one loop are logged when the loop ends; their
seconds share the loop's time evenly among its steps.

The hook is the first of the chief's hooks, so it runs before the ``CheckpointSaverHook``: a loop
with a NaN step raises before its weights can be saved. (Stock's saver runs before its NaN check:
it saves the NaN weights when the NaN step is a save step. On a TPU every loop's end can be one.)

With ``iterations_per_loop`` given in seconds (``"60s"``) the steps per loop are not known when the
graph is built: nothing is recorded and TPUEstimator's once-per-loop line and check stay.
"""

import time

import numpy as np
import tensorflow as tf

# The (losses, steps) variables, one of each per replica built, in two collections of variables:
# a collection of tuples cannot be serialized, and TensorFlow says so when it writes the graph.
COLLECTIONS = ("tpushim_step_losses", "tpushim_step_numbers")
NAN_MESSAGE = "Model diverged with loss = NaN."  # NanTensorHook's


def iterations_counted(config):
    """``iterations_per_loop`` as a number of steps, or None where it is given in seconds."""
    if config is None or getattr(config, "tpu_config", None) is None:
        return None
    value = config.tpu_config.iterations_per_loop
    if isinstance(value, str):
        value = value.strip()
        if not value.isdigit():  # "60s", "2m", "1h": TPUEstimator's time units
            return None
    return int(value)


def _local(initial_value, name):
    return tf.compat.v1.Variable(
        initial_value,
        trainable=False,
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],  # never in a checkpoint
        name=name,
        use_resource=True,
    )


def record(loss, step, iterations):
    """Records this step's ``loss`` under ``step`` (the global step before it, stock's label);
    returns the op to run with the step. Called inside the TPU computation."""
    with tf.init_scope():  # created (and initialised) outside the TPU loop, as Keras's weights
        losses = _local(tf.zeros([iterations], loss.dtype), "tpushim_step_losses")
        steps = _local(tf.fill([iterations], tf.constant(-1, tf.int64)), "tpushim_step_numbers")
        count = _local(tf.constant(0, tf.int64), "tpushim_step_count")
    for collection, variable in zip(COLLECTIONS, (losses, steps)):
        tf.compat.v1.add_to_collection(collection, variable)
    n = count.read_value()
    at = tf.equal(tf.range(iterations, dtype=tf.int64), tf.math.floormod(n, iterations))
    step = tf.cast(step, tf.int64)
    return tf.group(
        losses.assign(tf.where(at, tf.fill([iterations], loss), losses)),
        steps.assign(tf.where(at, tf.fill([iterations], step), steps)),
        count.assign(n + 1),
    )


def pairs(graph=None):
    """The ``(losses, steps)`` variables the graph's TPU training step records, one per replica."""
    graph = graph or tf.compat.v1.get_default_graph()
    return list(zip(*(graph.get_collection(c) for c in COLLECTIONS)))


def recorded(graph):
    """Whether the graph's TPU training step records its steps' losses."""
    return bool(pairs(graph))


class StepLossHook(tf.compat.v1.train.SessionRunHook):
    """After each loop: stock's NaN check and log line for each of the loop's steps, in order.

    Inert in a graph that records nothing (CPU, ``iterations_per_loop`` in seconds). ``every_n``
    is the user's ``log_step_count_steps`` (None: no lines, as stock).
    """

    def __init__(self, every_n):
        self._every_n = every_n
        self._variables = None

    def begin(self):
        recording = pairs()
        self._variables = recording[0] if recording else None
        self._seen = None  # the label of the last step checked
        self._iteration = 0  # the steps checked this session: the logging hook's iteration count
        self._logged = None  # the iteration last logged
        self._logged_at = None  # when (estimated) it ran

    def before_run(self, run_context):
        del run_context
        self._started = time.monotonic()

    def after_run(self, run_context, run_values):
        del run_values
        if self._variables is None:
            return
        ended = time.monotonic()
        losses, steps = run_context.session.run(self._variables)
        # this loop's entries: labels are increasing, and an entry not rewritten keeps an old one
        new = [i for i in np.argsort(steps, kind="stable") if self._is_new(steps[i])]
        per_step = (ended - self._started) / max(len(new), 1)
        for k, i in enumerate(new):
            self._step(losses[i], steps[i], self._started + (k + 1) * per_step)

    def _is_new(self, step):
        return step >= 0 and (self._seen is None or step > self._seen)

    def _step(self, loss, step, ran_at):
        self._seen, iteration = step, self._iteration
        self._iteration += 1
        if np.isnan(loss):  # NanTensorHook runs before LoggingTensorHook
            tf.compat.v1.logging.error(NAN_MESSAGE)
            raise tf.compat.v1.train.NanLossDuringTrainingError
        if self._every_n is None or (
            self._logged is not None and iteration < self._logged + self._every_n
        ):
            return
        _log_line(loss, step, None if self._logged is None else ran_at - self._logged_at)
        self._logged, self._logged_at = iteration, ran_at


def _log_line(loss, step, elapsed):
    """``LoggingTensorHook``'s line for ``{"loss": loss, "step": step}``."""
    original = np.get_printoptions()
    np.set_printoptions(suppress=True)
    try:
        # str(), as LoggingTensorHook's "%s" (format() prints a float32's float64 digits)
        stats = f"loss = {loss!s}, step = {step!s}"
        if elapsed is None:
            tf.compat.v1.logging.info("%s", stats)
        else:
            tf.compat.v1.logging.info("%s (%.3f sec)", stats, elapsed)
    finally:
        np.set_printoptions(**original)
