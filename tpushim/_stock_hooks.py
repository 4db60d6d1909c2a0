"""What stock's training hooks do with each step, for the engines that run no TF1 session of the
model (the strategy engine: TF2; the JAX engine: steps in JAX): the loss line, the NaN check, ``global_step/sec``, the loss summary and the checkpoints it keeps, at
stock's steps and in stock's order; the evaluation's events in ``model_dir/eval``; and the user's
own SessionRunHooks (:class:`SessionHooks`), called at stock's steps.

Stock's Estimator runs one step per ``session.run``; after it its hooks run in this order
(``MonitoredTrainingSession`` puts the chief's first): ``CheckpointSaverHook`` (a checkpoint at a
save step: the NaN weights too), ``StepCounterHook`` (``global_step/sec`` every
``log_step_count_steps``), ``SummarySaverHook`` (the loss every ``save_summary_steps``, counted
from the call's first step), ``NanTensorHook`` (raises ``NanLossDuringTrainingError``), and
``LoggingTensorHook`` (``loss = L, step = S`` at the call's first step, then every
``log_step_count_steps``). An engine runs several steps per call (the strategy engine's
``steps_per_execution`` per ``tf.function`` call, the JAX engine's ``iterations_per_loop`` per
compiled call), which returns each step's global loss (a few floats): :class:`StepEvents`
then does, step by step, what those hooks did, the steps' times shared evenly in the call's time.
A call ends at each save step (``save_checkpoints_steps``), so a checkpoint falls where stock's
does, before its step's other hooks.

Events are written with the v1 ``FileWriter`` stock's hooks use (``FileWriterCache``: one file
per directory per process), as ``simple_value`` scalars under stock's tags: ``loss_1`` (stock's
``loss`` summary, made unique next to Keras's ``loss`` name scope), ``global_step/sec``, and
``SessionLog`` START / CHECKPOINT records; the graph and meta graph (and ``graph.pbtxt``) where
stock's CheckpointSaverHook writes them, of the engine's stock training graph (the strategy
engine's :func:`tpushim._strategy.checkpoint.stock_meta_graph`); a model's own one-number
``tf.compat.v1.summary.scalar`` values in the loss's record, under stock's tags. Not written: its
other v1 summaries (string ops a TPU step cannot compile: ``_strategy.model_summaries_left_out``).
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
GRAPH_FILE = "graph.pbtxt"  # CheckpointSaverHook's
#: The checkpoints stock's Keras estimator keeps: its object-based Saver's default max_to_keep
#: (keras_lib ignores ``keep_checkpoint_max`` there; a name-based one honours it).
OBJECT_CHECKPOINTS_KEPT = 5

_tf_log = logging.getLogger("tensorflow")


def writer(directory, graph=None):
    """Stock's summary writer for ``directory`` (``FileWriterCache``: shared in the process); made
    in ``graph`` (a tf.Graph), it records that graph first, as stock's records its own."""
    # The v1 writer refuses to be made in eager mode.
    with (graph if graph is not None else tf.Graph()).as_default():
        return tf.compat.v1.summary.FileWriterCache.get(directory)


def _every(value):
    return int(value) if value and value > 0 else None


class StepEvents:
    """Stock's training hooks over one ``train()`` call's steps (see the module docstring).

    Args:
      config: the estimator's RunConfig.
      model_dir: where the events go.
      graph: the tf.Graph a new writer records first, or None.
      meta: the MetaGraphDef recorded at the call's start (and its graph), or None.
      graph_text: ``graph.pbtxt``'s text (``meta``'s graph), or None: no file.
      writes: False where this process is not the one that writes (a pod's other processes, as
        stock's non-chief workers): the lines and hooks run, nothing is written.
    """

    def __init__(self, config, model_dir, graph=None, meta=None, graph_text=None, writes=True):
        self._log_every = config.log_step_count_steps  # None: no lines (stock's)
        self._count_every = _every(config.log_step_count_steps)
        self._summary_every = _every(config.save_summary_steps)
        self._model_dir = model_dir
        self._writer = writer(model_dir, graph) if writes else _NoWriter()
        if meta is not None and writes:  # CheckpointSaverHook's, at each call's start
            if graph_text is not None:
                with tf.io.gfile.GFile(os.path.join(model_dir, GRAPH_FILE), "w") as f:
                    f.write(graph_text)
            self._writer.add_graph(None, graph_def=meta.graph_def)
            self._writer.add_meta_graph(meta)
        self._iteration = 0  # LoggingTensorHook's count of this call's steps
        self._logged = self._logged_at = None
        self._counted = None  # StepCounterHook's timer: (step, time) last triggered
        self._summarized = None  # SummarySaverHook's timer: the step last written
        self.last_loss = None

    def next_summary(self, label):
        """The first global step after ``label`` whose step writes the summary record, or None
        (no summaries)."""
        if self._summary_every is None:
            return None
        if self._summarized is None:
            return label + 1
        return max(label + 1, self._summarized + self._summary_every)

    def checkpoint(self, step):
        """CheckpointSaverHook's record of a save (its path is the prefix, as stock's)."""
        self._writer.add_session_log(
            tf.compat.v1.SessionLog(
                status=tf.compat.v1.SessionLog.CHECKPOINT,
                checkpoint_path=os.path.join(self._model_dir, "model.ckpt"),
            ),
            step,
        )

    def step(self, loss, label, at, hooks=None, scalars=None):
        """One step's hooks: ``label`` is the global step before it (LoggingTensorHook's), ``at``
        when it ended (time.monotonic()); the user's (a :class:`SessionHooks`) run where stock
        runs them, after the summary; ``scalars``: the model's own summaries, [(tag, value)]
        of a scalar or a ``Summary.Value``, written before the loss in one record, as stock's
        merged summary. Raises
        stock's error at a NaN loss; returns whether a user's hook requested stop."""
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
            summary = tf.compat.v1.Summary()
            for given in [*(scalars or ()), (LOSS_TAG, loss)]:
                if isinstance(given, tf.compat.v1.Summary.Value):
                    summary.value.add().CopyFrom(given)
                else:
                    summary.value.add(tag=given[0], simple_value=given[1])
            self._writer.add_summary(summary, after)
            self._summarized = after
        stop = hooks.after(label, loss=loss) if hooks is not None else False
        if math.isnan(loss):
            self._writer.flush()
            tf.compat.v1.logging.error(_step_losses.NAN_MESSAGE)
            raise tf.compat.v1.train.NanLossDuringTrainingError
        iteration = self._iteration
        self._iteration += 1
        if self._log_every is None or (
            self._logged is not None and iteration < self._logged + self._log_every
        ):
            return stop
        _step_losses._log_line(loss, label, None if self._logged is None else at - self._logged_at)
        self._logged, self._logged_at = iteration, at
        return stop

    def end(self):
        """The call returned: stock's last line, and the events on disk."""
        if self.last_loss is not None:
            _tf_log.info("Loss for final step: %s.", self.last_loss)
        self._writer.flush()

    def close(self):
        self._writer.flush()


class _NoWriter:
    """A summary writer that writes nothing (see :class:`StepEvents`'s ``writes``)."""

    def _nothing(self, *args, **kwargs):
        return None

    add_summary = add_session_log = add_graph = add_meta_graph = flush = _nothing


def _scalar(tag, value):
    return tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=tag, simple_value=value)])


def step_times(started, ended, count):
    """When each of ``count`` steps of one call ended, the call's time shared evenly."""
    per = (ended - started) / max(count, 1)
    return [started + (k + 1) * per for k in range(count)]


class Kept:
    """The checkpoints a train() call keeps, as stock's Saver: the last ``max_to_keep`` of the
    checkpoint state's list (earlier calls' included) listed in ``model_dir/checkpoint``.

    A checkpoint that falls out of the list is deleted as stock's Saver deletes it (its index,
    data and ``.meta`` files), an earlier call's too: stock recovers the state's list when it
    restores, and the user asked for the rotation (``keep_checkpoint_max``); a preemptible TPU
    restarting often would otherwise add ``max_to_keep`` files at every restart. Only checkpoints
    the state lists are ever deleted, never another file.
    """

    def __init__(self, model_dir, max_to_keep):
        self._model_dir = model_dir
        self._max = max_to_keep if max_to_keep and max_to_keep > 0 else None

    def saved(self, path, relative=False):
        """Lists ``path`` (just written) as the latest checkpoint; drops the oldest. ``relative``:
        the list names checkpoints in model_dir relative to it, as a name-based Saver writes it
        (an object-based one writes them whole)."""
        state = tf.train.get_checkpoint_state(self._model_dir)
        paths = [p for p in (state.all_model_checkpoint_paths if state else []) if p != path]
        paths.append(path)
        dropped = paths[: -self._max] if self._max else []
        kept = paths[-self._max :] if self._max else paths
        # A relative model_dir's paths TensorFlow writes relative to it itself (stock's Saver
        # hands them on as they are): taking model_dir off them first listed them "../../".
        if relative and os.path.isabs(self._model_dir):
            inside = self._model_dir.rstrip("/") + "/"
            kept = [p[len(inside) :] if p.startswith(inside) else p for p in kept]
        tf.compat.v1.train.update_checkpoint_state(
            self._model_dir, kept[-1], all_model_checkpoint_paths=kept
        )
        for old in dropped:  # stock's Saver._MaybeDeleteOldCheckpoints
            tf.compat.v1.train.remove_checkpoint(old)


def write_evaluation(eval_dir, results, checkpoint_path, graph=None):
    """Stock's evaluation events in ``eval_dir`` (``model_dir/eval``): the metrics at the global
    step, and the evaluated checkpoint's path, with stock's lines. ``graph``: what a new writer
    records first, as stock's records its evaluation graph (the engine gives the graph of the
    training events: stock's model and global step, not stock's whole evaluation model_fn)."""
    step = int(results[tf.compat.v1.GraphKeys.GLOBAL_STEP])
    shown = ", ".join(
        f"{key} = {results[key]}" for key in sorted(results) if results[key] is not None
    )
    tf.compat.v1.logging.info("Saving dict for global step %d: %s", step, shown)
    summary = tf.compat.v1.Summary()
    # In stock's order: its evaluation's dict holds the metrics sorted by name.
    for key, value in sorted(results.items(), key=lambda item: item[0]):
        if key == tf.compat.v1.GraphKeys.GLOBAL_STEP or value is None:
            continue
        if isinstance(value, (np.floating, float, np.integer, int)):
            summary.value.add(tag=key, simple_value=float(value))
    out = writer(eval_dir, graph)
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


# --- the user's SessionRunHooks ------------------------------------------------------------------

#: Hooks that need the model's TF1 graph or session, with what does their work on this engine.
_REFUSED = {
    "ProfilerHook": "traces the ops of a session.run; profile the engine's steps with "
    "tf.profiler.experimental.start(logdir) / stop() around train() instead",
    "CheckpointSaverHook": "saves a session's variables; the engine saves on RunConfig's "
    "save_checkpoints_steps / save_checkpoints_secs: set those, and pass "
    "CheckpointSaverListeners as train(saving_listeners=...)",
    "SummarySaverHook": "writes summary ops of the model's graph; the engine writes the loss "
    "every save_summary_steps as stock",
    "NanTensorHook": "watches a tensor of the model's graph; the engine checks the loss for NaN "
    "at every step as stock",
    "FeedFnHook": "feeds placeholders of the model's graph",
    "FinalOpsHook": "runs ops of the model's graph",
}


def _hook_name(hook):
    name = type(hook).__name__
    return "the early-stopping hook" if name == "_StopOnPredicateHook" else name


#: The engines that run the user's hooks here: (their name in a refusal, the fix it names).
ENGINES = {
    "strategy": ("the strategy engine", "use engine='tpuestimator' where TPUEstimator runs"),
    "jax": ("tpushim's JAX engine", "fetch only those"),
}


def _refused(hook, why, error=None, engine="strategy", loss=None):
    from tpushim._errors import ConversionError

    detail = f" ({type(error).__name__}: {str(error)[:500]})" if error is not None else ""
    if isinstance(hook, tf.compat.v1.train.LoggingTensorHook) and loss is None:
        detail += "; the engine logs the loss every RunConfig(log_step_count_steps=...) as stock"
    name, fix = ENGINES[engine]
    holds = "only the global step (tf.compat.v1.train.get_global_step())"
    if loss is not None:
        holds = (
            "only the global step (tf.compat.v1.train.get_global_step()) and the step's loss "
            f"({loss!r}, stock's name for it)"
        )
    return ConversionError(
        f"{name} cannot run {_hook_name(hook)}: it {why}{detail}. The engine runs no TF1 "
        f"session of the model: a hook sees one holding {holds}. Remove the hook, or {fix}."
    )


def _overrides(hook, *names):
    base = tf.compat.v1.train.SessionRunHook
    return any(getattr(type(hook), n) is not getattr(base, n) for n in names)


def predicting(user_hooks, step, predictions):
    """``predictions`` (a generator of one ``predict()`` call's) yielded; the user's hooks (a
    :class:`SessionHooks` or None) ended at global ``step`` when it ends without an error, and
    closed whichever way it ends."""
    try:
        yield from predictions
        if user_hooks is not None:
            user_hooks.end(step)
    finally:
        if user_hooks is not None:
            user_hooks.close()


class SessionHooks:
    """The user's ``SessionRunHook``\\ s, run by stock's protocol at each step of the engine.

    They get a TF1 graph and session of their own holding the global step, set to the engine's
    step around each call (``before_run`` fetches read the step before it, ``after_run`` sees the
    step after it, as in stock's ``session.run``): stock's stop, early-stopping and counter hooks
    run unchanged, and so does a hook of the user's that fetches the global step. A hook that
    needs the model's graph or session fails in its ``begin``, ``after_create_session`` or first
    ``before_run``, which :meth:`start` calls before anything is written: that is a
    ConversionError naming the hook. See docs/reference/hooks.md for the schedule.

    With ``loss`` (stock's name of the model's loss tensor, ``loss/mul:0``), the graph holds that
    tensor too, under that name (and, in training, in the ``LOSSES`` collection, where stock's
    Estimator puts it then): a hook fetching it (a ``LoggingTensorHook`` on the loss) gets the step's loss, the
    fetches then read in :meth:`after`, given the step's loss, with the global step as
    ``before_run`` saw it.

    Args:
      hooks: the ``hooks=`` of train/evaluate/predict.
      step: the global step the call starts at.
      engine: which engine runs them (a key of :data:`ENGINES`: its refusals' words).
      loss: stock's name of the loss tensor, or None (no loss: the graph holds the step only).
      training: the hooks are train()'s (the loss in the ``LOSSES`` collection).
    """

    def __init__(self, hooks, step, engine="strategy", loss=None, training=False):
        hooks = list(hooks)
        self._engine, self._loss_name = engine, loss
        for hook in hooks:  # stock's check, verbatim
            if not isinstance(hook, tf.compat.v1.train.SessionRunHook):
                raise TypeError(f"All hooks must be SessionRunHook instances, given: {hook}")
        for hook in hooks:
            if type(hook).__name__ in _REFUSED:
                raise self._refused(hook, _REFUSED[type(hook).__name__])
        self._hooks = hooks
        self._graph = tf.Graph()
        with self._graph.as_default():
            self._step = tf.compat.v1.train.get_or_create_global_step()
            self._loss = None
            if loss is not None:
                self._loss = tf.compat.v1.placeholder_with_default(
                    np.float32("nan"), [], name=loss.split(":")[0]
                )
                if training:
                    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.LOSSES, self._loss)
            for hook in hooks:
                try:
                    hook.begin()
                except Exception as error:
                    raise self._refused(
                        hook, "needs the model's graph in begin()", error
                    ) from error
            self._value = tf.compat.v1.placeholder(tf.int64, [])
            self._assign = self._step.assign(self._value)
            init = [
                tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.local_variables_initializer(),
            ]
        self._graph.finalize()  # as stock's Scaffold, after begin()
        self._session = tf.compat.v1.Session(graph=self._graph)
        try:
            self._session.run(init)
            self._at = self._pending = None
            self._set(step)
            coordinator = tf.compat.v1.train.Coordinator()
            for hook in hooks:
                try:
                    hook.after_create_session(self._session, coordinator)
                except Exception as error:
                    raise self._refused(hook, "uses the model's session", error) from error
            self.before(step)  # the first step's fetches, checked before anything is written
            if self._loss is not None and self._pending[3]:
                self._fetched(self._pending[3])  # (read in after(): checked here)
        except BaseException:
            self._session.close()
            raise

    def _refused(self, hook, why, error=None):
        return _refused(hook, why, error, self._engine, self._loss_name)

    def _set(self, step):
        if self._at != step:
            self._session.run(self._assign, {self._value: step})
            self._at = step

    def per_call(self, step, n):
        """How many of the next ``n`` steps one ``tf.function`` call may run so that a hook's
        ``request_stop()`` falls at the call's last step: up to a StopAtStepHook's last step, or
        an early-stopping hook's next check; one step when a hook may stop at any step."""
        from tpushim import _tfprivate

        for hook in self._hooks:
            last = _tfprivate.estimator.stop_at_step_last(hook)
            timer, on_clock = _tfprivate.estimator.early_stopping_timer(hook)
            if last is not None:
                n = min(n, max(last - step, 1))
            elif timer is not None and not on_clock:
                # It checks after a step whose step before it triggers its timer.
                n = next((k + 1 for k in range(n) if timer.should_trigger_for_step(step + k)), n)
            elif isinstance(hook, tf.compat.v1.train.StepCounterHook):
                continue  # counts, never stops
            elif isinstance(hook, tf.compat.v1.train.LoggingTensorHook):
                continue
            elif _overrides(hook, "before_run", "after_run"):
                return 1  # a stop we cannot foresee: stock's step, one step per call
        return n

    def before(self, step):
        """Each hook's ``before_run`` for the step after ``step``, its fetches read."""
        if self._pending is not None:  # already called for this step
            return
        self._set(step)
        context = tf.compat.v1.train.SessionRunContext(
            tf.compat.v1.train.SessionRunArgs(None), self._session
        )
        fetches = {}  # hook position -> its fetches: one session.run for all, as stock's
        for i, hook in enumerate(self._hooks):
            try:
                args = hook.before_run(context)
                if args is not None and args.feed_dict:
                    raise ValueError(f"it feeds {list(args.feed_dict)[:3]}")
            except Exception as error:
                raise self._refused(hook, "fetches tensors of the model's graph", error) from error
            if args is not None and args.fetches is not None:
                fetches[i] = args.fetches
        values = None
        if self._loss is None:  # read now; with the loss, in after() (it is the step's)
            values = self._values(self._fetched(fetches) if fetches else {})
        self._pending = (step, context, values, fetches)

    def _values(self, results):
        return [
            tf.compat.v1.train.SessionRunValues(results.get(i), None, None)
            for i in range(len(self._hooks))
        ]

    def _fetched(self, fetches, feed=None):
        """{hook position: its fetches' values}, read in one ``session.run`` (stock's
        MonitoredSession merges the hooks' fetches so); where that fails, the hook whose
        fetches fail alone is named."""
        try:
            return self._session.run(fetches, feed)
        except Exception as error:
            for i, fetch in fetches.items():
                try:
                    self._session.run(fetch, feed)
                except Exception as own:
                    raise self._refused(
                        self._hooks[i], "fetches tensors of the model's graph", own
                    ) from own
            raise self._refused(
                self._hooks[next(iter(fetches))], "fetches tensors of the model's graph", error
            ) from error

    def after(self, step, advance=True, loss=None):
        """Each hook's ``after_run`` for the step after ``step`` (``advance``: a training step,
        the global step one more; ``loss``: the step's loss, what a fetch of the loss reads);
        True when one requested stop."""
        self.before(step)  # no-op when already called
        _, context, values, fetches = self._pending
        self._pending = None
        if values is None:
            self._set(step)
            feed = {self._loss: np.float32(loss)} if loss is not None else None
            values = self._values(self._fetched(fetches, feed) if fetches else {})
        self._set(step + 1 if advance else step)
        for hook, value in zip(self._hooks, values):
            hook.after_run(context, value)
        return context.stop_requested

    def end(self, step):
        """The training ended at ``step`` without an error: each hook's ``end``."""
        self._set(step)
        for hook in self._hooks:
            hook.end(self._session)

    def close(self):
        self._session.close()


def predictions(batch, rows, predict_keys, yield_single_examples):
    """A batch's predictions (``{name: rows...}``) as stock's ``predict()`` yields them: only
    ``predict_keys`` where given; the batch whole, or its first ``rows`` one by one."""
    if predict_keys:
        batch = {k: v for k, v in batch.items() if k in predict_keys}
    if not yield_single_examples:
        yield batch
    else:
        for i in range(rows):
            yield {k: v[i] for k, v in batch.items()}
