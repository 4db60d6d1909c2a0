"""What stock's training hooks do with each step, for the strategy engine (TF2: no session, no
hooks): the loss line, the NaN check, ``global_step/sec``, the loss summary and the checkpoints it
keeps, at stock's steps and in stock's order; and the evaluation's events in ``model_dir/eval``.

Stock's Estimator runs one step per ``session.run``; after it its hooks run in this order
(``MonitoredTrainingSession`` puts the chief's first): ``CheckpointSaverHook`` (a checkpoint at a
save step: the NaN weights too), ``StepCounterHook`` (``global_step/sec`` every
``log_step_count_steps``), ``SummarySaverHook`` (the loss every ``save_summary_steps``, counted
from the call's first step), ``NanTensorHook`` (raises ``NanLossDuringTrainingError``), and
``LoggingTensorHook`` (``loss = L, step = S`` at the call's first step, then every
``log_step_count_steps``). The strategy engine runs ``steps_per_execution`` steps per
``tf.function`` call, which returns each step's global loss (a few floats): :class:`StepEvents`
then does, step by step, what those hooks did, the steps' times shared evenly in the call's time.
A call ends at each save step (``save_checkpoints_steps``), so a checkpoint falls where stock's
does, before its step's other hooks.

Events are written with the v1 ``FileWriter`` stock's hooks use (``FileWriterCache``: one file
per directory per process), as ``simple_value`` scalars under stock's tags: ``loss_1`` (stock's
``loss`` summary, made unique next to Keras's ``loss`` name scope), ``global_step/sec``, and
``SessionLog`` START / CHECKPOINT records. Not written: stock's graph and meta graph (the engine
builds no TF1 graph) and summaries a model makes itself.
"""

import logging
import math
import os

import numpy as np
import tensorflow as tf

from tpushim import _step_losses

#: Stock's tag for the training loss of a Keras model's estimator (see the module docstring).
LOSS_TAG = "loss_1"
STEPS_PER_SEC_TAG = "global_step/sec"  # StepCounterHook's
#: The checkpoints stock's Keras estimator keeps: its object-based Saver's default max_to_keep
#: (keras_lib ignores ``keep_checkpoint_max`` there; a name-based one honours it).
OBJECT_CHECKPOINTS_KEPT = 5

_tf_log = logging.getLogger("tensorflow")


def writer(directory):
    """Stock's summary writer for ``directory`` (``FileWriterCache``: shared in the process)."""
    with tf.Graph().as_default():  # the v1 writer refuses to be made in eager mode
        return tf.compat.v1.summary.FileWriterCache.get(directory)


def _every(value):
    return int(value) if value and value > 0 else None


class StepEvents:
    """Stock's training hooks over one ``train()`` call's steps (see the module docstring).

    Args:
      config: the estimator's RunConfig.
      model_dir: where the events go.
    """

    def __init__(self, config, model_dir):
        self._log_every = config.log_step_count_steps  # None: no lines (stock's)
        self._count_every = _every(config.log_step_count_steps)
        self._summary_every = _every(config.save_summary_steps)
        self._model_dir = model_dir
        self._writer = writer(model_dir)
        self._iteration = 0  # LoggingTensorHook's count of this call's steps
        self._logged = self._logged_at = None
        self._counted = None  # StepCounterHook's timer: (step, time) last triggered
        self._summarized = None  # SummarySaverHook's timer: the step last written
        self.last_loss = None

    def checkpoint(self, step):
        """CheckpointSaverHook's record of a save (its path is the prefix, as stock's)."""
        self._writer.add_session_log(
            tf.compat.v1.SessionLog(
                status=tf.compat.v1.SessionLog.CHECKPOINT,
                checkpoint_path=os.path.join(self._model_dir, "model.ckpt"),
            ),
            step,
        )

    def step(self, loss, label, at):
        """One step's hooks: ``label`` is the global step before it (LoggingTensorHook's), ``at``
        when it ended (time.monotonic()). Raises stock's error at a NaN loss."""
        after = label + 1
        self.last_loss = loss
        if self._count_every is not None:
            if self._counted is None:
                self._counted = (after, at)
            elif after >= self._counted[0] + self._count_every:
                rate = (after - self._counted[0]) / max(at - self._counted[1], 1e-9)
                self._writer.add_summary(_scalar(STEPS_PER_SEC_TAG, rate), after)
                _tf_log.info("%s: %g", STEPS_PER_SEC_TAG, rate)
                self._counted = (after, at)
        if self._summary_every is not None and (
            self._summarized is None or after >= self._summarized + self._summary_every
        ):
            if self._summarized is None:
                self._writer.add_session_log(
                    tf.compat.v1.SessionLog(status=tf.compat.v1.SessionLog.START), after
                )
            self._writer.add_summary(_scalar(LOSS_TAG, loss), after)
            self._summarized = after
        if math.isnan(loss):
            self._writer.flush()
            tf.compat.v1.logging.error(_step_losses.NAN_MESSAGE)
            raise tf.compat.v1.train.NanLossDuringTrainingError
        iteration = self._iteration
        self._iteration += 1
        if self._log_every is None or (
            self._logged is not None and iteration < self._logged + self._log_every
        ):
            return
        _step_losses._log_line(loss, label, None if self._logged is None else at - self._logged_at)
        self._logged, self._logged_at = iteration, at

    def end(self):
        """The call returned: stock's last line, and the events on disk."""
        if self.last_loss is not None:
            _tf_log.info("Loss for final step: %s.", self.last_loss)
        self._writer.flush()

    def close(self):
        self._writer.flush()


def _scalar(tag, value):
    return tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=tag, simple_value=value)])


def step_times(started, ended, count):
    """When each of ``count`` steps of one call ended, the call's time shared evenly."""
    per = (ended - started) / max(count, 1)
    return [started + (k + 1) * per for k in range(count)]


class Kept:
    """The checkpoints a train() call keeps, as stock's Saver: the last ``max_to_keep`` of the
    checkpoint state's list (earlier calls' included) listed in ``model_dir/checkpoint``.

    Files of a checkpoint that falls out of the list are deleted only where this call wrote it
    (stock deletes earlier calls' too; tpushim never deletes what it did not make in the same
    call): an earlier call's stays on disk, no longer listed.
    """

    def __init__(self, model_dir, max_to_keep):
        self._model_dir = model_dir
        self._max = max_to_keep if max_to_keep and max_to_keep > 0 else None
        self._written = set()

    def saved(self, path, relative=False):
        """Lists ``path`` (just written) as the latest checkpoint; drops the oldest. ``relative``:
        the list names checkpoints in model_dir relative to it, as a name-based Saver writes it
        (an object-based one writes them whole)."""
        state = tf.train.get_checkpoint_state(self._model_dir)
        paths = [p for p in (state.all_model_checkpoint_paths if state else []) if p != path]
        paths.append(path)
        self._written.add(path)
        dropped = paths[: -self._max] if self._max else []
        kept = paths[-self._max :] if self._max else paths
        if relative:
            inside = self._model_dir.rstrip("/") + "/"
            kept = [p[len(inside) :] if p.startswith(inside) else p for p in kept]
        tf.compat.v1.train.update_checkpoint_state(
            self._model_dir, kept[-1], all_model_checkpoint_paths=kept
        )
        for old in dropped:
            if old in self._written:
                for name in tf.io.gfile.glob(old + ".*"):
                    tf.io.gfile.remove(name)


def write_evaluation(eval_dir, results, checkpoint_path):
    """Stock's evaluation events in ``eval_dir`` (``model_dir/eval``): the metrics at the global
    step, and the evaluated checkpoint's path, with stock's lines."""
    step = int(results[tf.compat.v1.GraphKeys.GLOBAL_STEP])
    shown = ", ".join(
        f"{key} = {results[key]}" for key in sorted(results) if results[key] is not None
    )
    tf.compat.v1.logging.info("Saving dict for global step %d: %s", step, shown)
    summary = tf.compat.v1.Summary()
    for key, value in results.items():
        if key == tf.compat.v1.GraphKeys.GLOBAL_STEP or value is None:
            continue
        if isinstance(value, (np.floating, float, np.integer, int)):
            summary.value.add(tag=key, simple_value=float(value))
    out = writer(eval_dir)
    out.add_summary(summary, step)
    tf.compat.v1.logging.info(
        "Saving 'checkpoint_path' summary for global step %d: %s", step, checkpoint_path
    )
    path_summary = tf.compat.v1.Summary()
    path_summary.value.add(
        tag="checkpoint_path", tensor=tf.make_tensor_proto(checkpoint_path, dtype=tf.string)
    )
    out.add_summary(path_summary, step)
    out.flush()
