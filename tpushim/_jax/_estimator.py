"""The JAX engine's estimator, :class:`JaxEstimator`: stock's Estimator whose ``train``,
``evaluate`` and ``predict`` run the Keras model's steps in JAX on every local device, the
input_fn running in TensorFlow on the host.

- Input: the input_fn is called once per call, in a graph of its own seeded as stock's
  (:func:`tpushim._stock_graphs.input_graph`: a shuffle gives stock's order), and its batches
  are read in a ``MonitoredSession`` (tables, queues, one-shot iterators as stock's) as numpy
  arrays; ``numpy_input_fn`` / ``pandas_input_fn``'s rows from the Dataset that feeds them in
  stock's order (:mod:`tpushim._shuffle_queue`); a short batch is padded to the global batch
  with rows weighted 0.
- Train: :class:`tpushim._jax._step.Trainer` (``iterations_per_loop`` steps per compiled call),
  starting from the model_dir's newest checkpoint (either format, stock's names) or else from
  stock's warm start (:mod:`tpushim._jax._warm_start`: the Keras weights saved at conversion),
  saving stock's checkpoints
  (:mod:`tpushim._jax._checkpoint`) at each call's first step, every ``save_checkpoints_steps`` and at the end;
  stock's ``loss = ..., step = N (x sec)`` lines (its LoggingTensorHook's: the call's first
  step, then every ``log_step_count_steps``), its NaN check (``NanLossDuringTrainingError``),
  its ``global_step/sec`` lines and TensorBoard events, the user's hooks and saving listeners
  at stock's steps (:mod:`tpushim._jax._hooks`).
- Evaluate: the inference outputs and each batch's loss over its real rows in JAX, the model's
  compiled metrics updated on the host (a copy of the model compiled as the user compiled it):
  stock's ``loss`` (the mean of the batches' losses), metric names and ``global_step``; its
  events in ``model_dir/eval``; the user's hooks.
- Predict: the inference outputs by output name, the real rows only; the user's hooks.
- Export: ``export_saved_model`` (and ``export_savedmodel``) are the base class's, unchanged:
  stock's Keras model_fn in PREDICT mode (model_to_estimator's ``export_outputs`` with it),
  restored from the engine's checkpoint, which is stock's (format, names): stock's SavedModel.

What it does not do yet is refused in words before anything runs; see the engine's page in the
docs.
"""

import logging
import math
import os
import queue
import threading
import time

import numpy as np
import tensorflow as tf

from tpushim import (
    _batch_math,
    _compiled_metrics,
    _generators,
    _metric_names,
    _observe,
    _stock_graphs,
    _stock_hooks,
    _tfprivate,
)
from tpushim._errors import ConversionError
from tpushim._jax import _draws, _hooks, _pod

logger = logging.getLogger("tpushim")
tf_logger = logging.getLogger("tensorflow")

ModeKeys = _tfprivate.estimator.ModeKeys


def _refuse(what):
    raise ConversionError(
        f"tpushim's JAX engine does not run {what} yet. Use engine='strategy' "
        "(TPUSHIM_ENGINE=strategy), which does."
    )


# --- the input, on the host ---------------------------------------------------------------------


def host_batches(input_fn, mode, config, seen=None):
    """The input_fn's batches as numpy structures, read as stock reads them (see the module);
    a numpy_input_fn / pandas_input_fn queue's rows in stock's order, batch by batch (read from
    the queue itself, a reader faster than stock's training would take another order).
    ``seen`` (a dict): given the input graph's ``seeds`` (graph seed, op-seed counter) once the
    input_fn is called: what stock's graph seeds the model's random ops from after it."""
    graph, result, session = _stock_graphs.input_session(
        input_fn, mode, config, queues_as_datasets=True
    )
    if seen is not None:
        seen["seeds"] = _tfprivate.graph.graph_seeds(graph)
    yield from _stock_graphs.read_batches(session, result)


class ReadAhead:
    """``batches`` (an iterator, :func:`host_batches`) read in a thread of their own, at most
    ``depth`` batches ahead and never more than ``limit`` in all (None: until the input ends):
    the host's TensorFlow session reads the next batches while the devices run the current
    ones, and nothing is read that stock would not read (an input drawing from a shared
    random state draws what stock draws). ``close()`` stops the thread and closes ``batches``
    there. Made with ``started=False``, it reads nothing until :meth:`start` (or the first
    batch asked of it): ``train()`` starts it once its first checkpoint is written, so that
    nothing competes with what comes before that checkpoint."""

    _END = object()

    def __init__(self, batches, limit=None, depth=20, started=True):
        self._batches, self._limit = batches, limit
        self._queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="tpushim-input", daemon=True)
        if started:
            self._thread.start()

    def start(self):
        """Starts reading ahead (once; again, nothing)."""
        if self._thread.ident is None and not self._stop.is_set():
            self._thread.start()

    def _put(self, item):
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _read(self):
        try:
            read = 0
            while self._limit is None or read < self._limit:
                try:
                    batch = next(self._batches)
                except StopIteration:
                    break
                read += 1
                if not self._put((batch, None)):
                    return
            self._put((self._END, None))
        except BaseException as e:  # handed to the reader, raised there
            self._put((self._END, e))
        finally:
            self._batches.close()

    def __iter__(self):
        return self

    def __next__(self):
        if self._stop.is_set():
            raise StopIteration
        self.start()
        item, error = self._queue.get()
        if item is self._END:
            self._stop.set()
            if error is not None:
                raise error
            raise StopIteration
        return item

    def close(self):
        self._stop.set()
        if self._thread.ident is None:  # never started: the input closed here
            self._batches.close()
        else:
            self._thread.join()


def _given_weights(features):
    """(features, sample weights or None) of stock's ``{"features", "sample_weights"}``
    features (keras_lib's spelling of sample weights in an input_fn); others as they are."""
    if isinstance(features, dict) and set(features) == {"features", "sample_weights"}:
        return features["features"], features["sample_weights"]
    return features, None


def _as_list(value, names, what):
    if isinstance(value, dict):
        missing = [n for n in names if n not in value]
        if missing:
            raise ValueError(f"the input's {what} have no key {missing[0]!r}; the model's: {names}")
        return [value[n] for n in names]
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


class Arrays:
    """How one model reads a batch: its features and labels as lists of arrays in the model's
    input and output order, of the dtypes the model's inputs take (Keras casts them so). With a
    host part (``host``: :class:`tpushim._jax._host.HostFeed`), the host's tensors computed
    first and fed instead (its order); ``host_outputs`` then holds the outputs it made of the
    last batch (predict's)."""

    def __init__(self, keras_model, host=None):
        self.inputs = list(keras_model.input_names)
        self.outputs = list(keras_model.output_names)
        self.dtypes = [t.dtype.as_numpy_dtype for t in keras_model.inputs]
        self.host, self.host_outputs = host, {}

    def split(self, batch, mode):
        """(features, labels or None) as Estimator splits an input_fn's element."""
        if self.host is not None:
            batch = self.host.apply(batch, mode)
        if isinstance(batch, tuple) and len(batch) == 2:
            features, labels = batch
        else:
            features, labels = batch, None
        if mode == ModeKeys.PREDICT:
            labels = None
        features, _ = _given_weights(features)
        if self.host is not None:
            features, self.host_outputs = self.host.arrays(features)
            if labels is None:
                return features, None
            labels = [_as_32_bits(y) for y in _as_list(labels, self.outputs, "labels")]
            return features, labels
        features = _as_list(features, self.inputs, "features")
        cast = []
        for name, x, dtype in zip(self.inputs, features, self.dtypes):
            x = np.asarray(x)
            if x.dtype.kind in "OSU":
                _refuse(
                    f"string features (input {name!r}) its model reads on the devices: it feeds "
                    "numbers to the devices (a model's layers that take strings or look up run "
                    "on the host)"
                )
            cast.append(x.astype(dtype) if x.dtype != dtype else x)
        if labels is None:
            return cast, None
        labels = [_as_32_bits(y) for y in _as_list(labels, self.outputs, "labels")]
        return cast, labels

    def sample_weights(self, batch):
        """Per output, the sample weights of stock's ``{"features", "sample_weights"}`` features
        (mapped to the outputs as keras_lib maps them; None: that output unweighted), or None."""
        features = batch[0] if isinstance(batch, tuple) and len(batch) == 2 else batch
        _, weights = _given_weights(features)
        if weights is None:
            return None
        mapped = _tfprivate.keras_compile.standardize_sample_weights(weights, self.outputs)
        return [None if w is None else np.asarray(w, np.float32) for w in mapped]


def _as_32_bits(y):
    y = np.asarray(y)
    if y.dtype == np.float64:
        return y.astype(np.float32)
    if y.dtype == np.int64:
        return y.astype(np.int32)
    return y


def _rows(arrays):
    return len(arrays[0])


def _padded(arrays, size):
    """Each array padded to ``size`` rows with copies of its first row (weighed 0)."""
    return [
        np.concatenate([a, np.repeat(a[:1], size - len(a), axis=0)]) if size > len(a) else a
        for a in arrays
    ]


# --- the estimator ------------------------------------------------------------------------------


class JaxEstimator(_tfprivate.estimator.EstimatorBase):
    """Stock's Estimator whose ``train``, ``evaluate`` and ``predict`` run in JAX (the module).

    Args:
      model_fn: stock's Keras model_fn (what the base class exports with).
      config: the RunConfig, its model_dir set.
      warm_start_from: stock's warm-start checkpoint of the Keras weights (or an estimator
        built around its model_fn: that call's ``warm_start_from``).
      conversion: the :class:`tpushim._jax._build.JaxConversion` of the model.
      params: an estimator built around its model_fn: that call's.
    """

    _tpushim_label = "the JAX engine's estimator"  # how stock's estimator around it says it
    #: The metric_fns ``tf.estimator.add_metrics`` added to its evaluation, in order.
    _tpushim_metric_fns = ()

    def __init__(
        self, model_fn, config=None, warm_start_from=None, conversion=None, *more, **params
    ):
        if getattr(self, "_tpushim_jax", None) is not None:
            # Rebuilt by Estimator(model_fn=<this>.model_fn, ...) (:meth:`_tpushim_rebuilt`),
            # whose class this is a subclass of: Python calls __init__ again with its arguments.
            return
        super().__init__(
            model_fn=model_fn,
            config=config,
            warm_start_from=warm_start_from,
            params=params.get("params"),
        )
        self._tpushim_jax = conversion

    def _assert_members_are_not_overridden(self):
        # Estimator forbids overriding train/evaluate/predict; this engine replaces exactly those.
        pass

    # What tpushim's estimator API (TF >= 2.16) asks of an engine's estimator.
    def _tpushim_add_metrics(self, metric_fn, model_fn):
        """``tf.estimator.add_metrics(self, metric_fn)``: the engine's estimator whose evaluation
        adds them, running ``model_fn`` (stock's add_metrics') where stock's runs it (export)."""
        from tpushim._jax import _derived

        return _derived.add_metrics(self, metric_fn, model_fn)

    def _tpushim_built_around(self, called):
        _refuse(
            f"{called} (an estimator built around its model_fn) from a subclass of "
            "tf.estimator.Estimator, or with a functools.partial binding its arguments; "
            "tf.estimator.Estimator(model_fn=<converted>.model_fn, model_dir=..., config=..., "
            "warm_start_from=...) itself runs on it"
        )

    def _tpushim_rebuilt(self, cls, args, kwargs):
        """``cls(*args, **kwargs)`` around this estimator's model_fn: the engine's estimator
        with that call's model_dir, config and warm start, or None (:mod:`tpushim._jax._derived`)."""
        from tpushim._jax import _derived

        return _derived.rebuilt(self, cls, args, kwargs)

    # -- state ------------------------------------------------------------------------------------
    def _latest(self, checkpoint_path=None):
        """(step, weights, slots, path) of the checkpoint to start from (None: the model's)."""
        path = checkpoint_path or tf.train.latest_checkpoint(self.model_dir)
        if path is None:
            return 0, {}, {}, None
        step, weights, slots = self._tpushim_jax.checkpoints.read(path)
        return step, weights, slots, path

    def _start(self, checkpoint_path=None):
        """(step, weights, slots, path) a call starts from: the checkpoint's (:meth:`_latest`),
        or where there is none, stock's warm start's (:mod:`tpushim._jax._warm_start`: the
        estimator's ``warm_start_from``, model_to_estimator's Keras weights by default; none,
        for an estimator built around its model_fn without one)."""
        step, weights, slots, path = self._latest(checkpoint_path)
        if path is None:  # (no warm start: every variable from its initializer, as stock's)
            from tpushim._jax import _warm_start

            step, weights, slots = _warm_start.warm_started(
                self._tpushim_jax.checkpoints, self._warm_start_settings
            )
        return step, weights, slots, path

    def _values(self, weights):
        """Every model weight's value: the checkpoint's, else the Keras model's."""
        values = {v.name.split(":")[0]: v for v in self._tpushim_jax.keras_model.weights}
        return {k: (weights[k] if k in weights else v.numpy()) for k, v in values.items()}

    # -- train ------------------------------------------------------------------------------------
    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        with _observe.calling(_observe.Call("train", self, input_fn, steps, max_steps)) as call:
            started = time.monotonic()
            with self._tpushim_jax.runtime():  # a graph program's: the eager runtime
                ran = self._train(input_fn, hooks, call.steps, call.max_steps, saving_listeners)
            _observe.finished(call, time.monotonic() - started, ran, None)
            return self

    def _train(self, input_fn, hooks, steps, max_steps, saving_listeners):
        from tpushim._estimator_api._estimator import check_train_steps, global_step_saved

        check_train_steps(steps, max_steps)
        _eager_classes(self._tpushim_jax.keras_model)
        listeners = list(saving_listeners or ())
        _hooks.check_listeners(listeners)
        conversion = self._tpushim_jax
        seen = {}
        early = self._built_on_input(lambda: self._batches(input_fn, ModeKeys.TRAIN, seen))
        try:
            start, weights, slots, _ = self._start()
            _pod.barrier("tpushim-train-read")  # every process read before process 0 writes
        except BaseException:
            if early is not None:
                early.close()
            raise
        last = math.ceil(max_steps) if max_steps is not None else None
        if last is not None and start >= last:
            if max_steps <= global_step_saved(self.model_dir):
                tf_logger.info("Skipping training since max_steps has already saved.")
                if early is not None:
                    early.close()
                return 0
            last = start + 1
        conversion.checkpoints.draw_stocks_seeds()  # as stock's model_fn: its clone's seeds
        stop = start + math.ceil(steps) if steps is not None else last
        arrays = Arrays(conversion.keras_model, conversion.host)
        batches = early if early is not None else self._batches(input_fn, ModeKeys.TRAIN, seen)
        try:
            # The input_fn called and its first batch read here, in the caller's thread; the
            # rest read ahead in a thread while the devices train (started once the first
            # checkpoint is written: :meth:`_train_steps`).
            first = next(batches, None)
            if first is not None and (stop is None or stop - start > 1):
                batches = ReadAhead(
                    batches, None if stop is None else stop - start - 1, started=False
                )
            if first is None:
                raise ConversionError("the input_fn gave no batch: the input is empty.")
            first_batch = getattr(first, "batch", first)
            features, labels = arrays.split(first_batch, ModeKeys.TRAIN)
            if labels is None:
                raise ValueError("the input_fn gave no labels: training needs them.")
            size = getattr(first, "global_batch", None)  # a pod's
            trainer = conversion.trainer(
                size or conversion.batch_size or _rows(features), seen.get("seeds")
            )
            stock = getattr(first, "stock_batch", 0) or trainer.stock_batch  # (a pod's: padded)
            _note_padding(conversion, stock, len(trainer.devices), ModeKeys.TRAIN)
            _note_input_dropout(conversion)
            trainer.restore(weights, slots, start)
            # its refusals before anything is written
            trainer.check((features, labels, arrays.sample_weights(first_batch)))
            # The user's hooks begin, and see their first step, before anything is written.
            user_hooks = _hooks.user_hooks(hooks, start, conversion, ModeKeys.TRAIN)
            try:
                return self._train_steps(
                    trainer,
                    arrays,
                    first,
                    batches,
                    (start, weights, slots),
                    stop,
                    user_hooks,
                    listeners,
                )
            finally:
                if user_hooks is not None:
                    user_hooks.close()
        finally:
            batches.close()

    def _batches(self, input_fn, mode, seen):
        """The input_fn's batches (:func:`host_batches`); on a pod, this process's rows of each
        global batch (padded to a multiple of the pod's devices, the step over every process's
        devices)."""
        conversion, pod = self._tpushim_jax, self._tpushim_jax.pod
        if pod is None:
            return host_batches(input_fn, mode, self.config, seen)
        training = mode == ModeKeys.TRAIN
        return _pod.host_batches(
            input_fn,
            mode,
            self.config,
            pod,
            conversion.batch_size if training else None,
            conversion.pod_input,
            seen,
            multiple=len(pod.devices),
        )

    def _built_on_input(self, make_batches):
        """A subclassed model is built on the input, as stock's model_fn builds its clone on
        the features (:mod:`tpushim._jax._subclassed`): ``make_batches()`` called and its first
        batch read before the checkpoint (whose names stock's graph of that clone gives); the
        batches returned with that one in front. None (nothing called) once it is built, or for
        a graph network."""
        conversion = self._tpushim_jax
        if not conversion.awaits_input:
            return None
        batches = make_batches()
        try:
            first = next(batches, None)
            if first is None:
                raise ConversionError("the input_fn gave no batch: the input is empty.")
            batch = getattr(first, "batch", first)
            features = batch[0] if isinstance(batch, tuple) and len(batch) == 2 else batch
            conversion.build_on(_given_weights(features)[0])
        except BaseException:
            batches.close()
            raise
        return _InFront(first, batches)

    def _train_steps(self, trainer, arrays, first, batches, started, stop, user_hooks, listeners):
        """The call's checkpoints, steps and hooks. ``started``: ``(step, weights, slots)`` the
        call starts from (:meth:`_start`'s, read once), what its first checkpoint holds before
        the step first runs (nothing compiled yet: XLA compiles the step at its first run)."""
        conversion, config = self._tpushim_jax, self.config
        start, start_weights, start_slots = started
        values = self._values({})
        tf.io.gfile.makedirs(self.model_dir)
        conversion.checkpoints.begin(config)  # stock's Saver for this call
        events = _hooks.train_events(conversion, config, self.model_dir)
        for listener in listeners:
            listener.begin()
        # CheckpointSaverHook's timer: the step and time of the last save (the next one falls
        # save_checkpoints_steps after it, or save_checkpoints_secs after it, at a call's end).
        saved = {"step": start, "at": time.monotonic()}

        def save(step):
            # CheckpointSaverListeners as stock's saver calls them (train_and_evaluate evaluates
            # in after_save); they get no session: the engine has none of the model.
            for listener in listeners:
                listener.before_save(None, step)
            if trainer.params is not None:
                values.update(trainer.weights())
                slots = {k: v for k, v in trainer.slots().items() if k != "iterations"}
            else:  # no step ran: what the call started from
                values.update(start_weights)
                slots = start_slots
            if _pod.is_chief():  # on a pod, process 0 writes (stock's chief)
                conversion.checkpoints.write(self.model_dir, step, values, slots)
            events.checkpoint(step)
            saved.update(step=step, at=time.monotonic())
            return any([listener.after_save(None, step) for listener in listeners])

        try:
            stopped = save(start)  # as stock's CheckpointSaverHook at every session's start
            if isinstance(batches, ReadAhead):
                batches.start()  # the input read ahead from here, beside the step's compile
            step = self._train_loop(
                trainer,
                arrays,
                first,
                batches,
                (start, stop, stopped),
                events,
                user_hooks,
                save,
                saved,
            )
            if tf.train.latest_checkpoint(self.model_dir) != os.path.join(
                self.model_dir, f"model.ckpt-{step}"
            ):
                save(step)
            _pod.barrier("tpushim-train-saved")  # process 0's last checkpoint is every process's
            if user_hooks is not None:
                user_hooks.end(step)  # after the last checkpoint, as stock's hooks' end()
        finally:
            events.close()
        if events.last_loss is None:  # (no step ran)
            tf_logger.info("Loss for final step: None.")
        events.end()
        for listener in listeners:
            listener.end(None, step)
        return step - start

    def _train_loop(self, trainer, arrays, first, batches, steps, events, user_hooks, save, saved):
        """The steps from ``start`` to ``stop`` (``steps``: those and whether a listener stopped
        at the first checkpoint), stock's hooks after each (``events``: the call's
        :class:`tpushim._stock_hooks.StepEvents`; ``save(step)``: a checkpoint, True where a
        listener stopped; ``saved``: the last one's step and time); returns the step it ended at."""
        conversion, config = self._tpushim_jax, self.config
        start, stop, stopped = steps
        every, every_secs = config.save_checkpoints_steps, config.save_checkpoints_secs
        step, pending = start, [first]
        while not stopped and (stop is None or step < stop):
            n = conversion.per_call if stop is None else min(conversion.per_call, stop - step)
            if every:  # a checkpoint falls at the end of a call
                n = min(n, max(saved["step"] + every - step, 1))
            if user_hooks is not None:  # a hook's stop falls at the end of a call
                n = user_hooks.per_call(step, n)
            chunk = pending[:n]
            pending = pending[n:]
            while len(chunk) < n:
                batch = next(batches, None)
                if batch is None:
                    break
                chunk.append(batch)
            if not chunk:
                if user_hooks is not None:  # stock's last session.run: before_run, then
                    user_hooks.before(step)  # OutOfRangeError
                break
            split = [_step_batch(arrays, b) for b in chunk]
            began = time.monotonic()
            losses = [np.float32(loss) for loss in trainer.train(split)]
            ended = time.monotonic()
            label, step = step, step + len(losses)
            # Stock's hooks after each step; at a save step the checkpoint comes first.
            times = _stock_hooks.step_times(began, ended, len(losses))
            for k, loss in enumerate(losses):
                if user_hooks is not None:
                    user_hooks.before(label + k)  # before the step's checkpoint, as stock's
                if k == len(losses) - 1 and (
                    (every and step >= saved["step"] + every)
                    or (every_secs and ended - saved["at"] >= every_secs)
                ):
                    stopped = save(step)
                stopped = events.step(loss, label + k, times[k], user_hooks) or stopped
            if len(chunk) < n:  # the input ran out
                if user_hooks is not None:
                    user_hooks.before(step)
                break
        return step

    # -- evaluate ---------------------------------------------------------------------------------
    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
        with _observe.calling(_observe.Call("evaluate", self, input_fn, steps)) as call:
            started = time.monotonic()
            with self._tpushim_jax.runtime():  # a graph program's: the eager runtime
                results = self._evaluate(input_fn, call.steps, hooks, checkpoint_path, name)
            _observe.finished(call, time.monotonic() - started)
            return results

    def _opened(self, input_fn, mode, checkpoint_path):
        """An evaluation's or prediction's start: a subclassed model built on the input
        (:meth:`_built_on_input`), then the checkpoint read (:meth:`_start`). ``(seen, early,
        step, weights, path)``."""
        _eager_classes(self._tpushim_jax.keras_model)
        seen = {}
        early = self._built_on_input(lambda: self._batches(input_fn, mode, seen))
        try:
            step, weights, _, path = self._start(checkpoint_path)
            self._tpushim_jax.checkpoints.draw_stocks_seeds()  # as stock's model_fn's clone
        except BaseException:
            if early is not None:
                early.close()
            raise
        return seen, early, step, weights, path

    def _evaluate(self, input_fn, steps, hooks, checkpoint_path, name):
        conversion = self._tpushim_jax
        seen, early, step, weights, path = self._opened(input_fn, ModeKeys.EVAL, checkpoint_path)
        user_hooks = _hooks.user_hooks(hooks, step, conversion, ModeKeys.EVAL)
        try:
            results = self._evaluate_batches(
                input_fn, steps, user_hooks, step, weights, early, seen
            )
        finally:
            if user_hooks is not None:
                user_hooks.close()
        if path is None and self._warm_start_settings is not None:
            path = self._warm_start_settings.ckpt_to_initialize_from  # the Keras weights'
        _hooks.write_evaluation(conversion, self.eval_dir(name), results, path)
        return results

    def _evaluate_batches(self, input_fn, steps, user_hooks, step, weights, early=None, seen=None):
        conversion = self._tpushim_jax
        values = self._values(weights)
        arrays = Arrays(conversion.keras_model, conversion.host)
        metrics = conversion.metrics_model()
        update = _metrics_update(metrics)
        losses, size, added = [], None, None
        ran_out = True
        pod, seen = conversion.pod, {} if seen is None else seen
        batches = early if early is not None else self._batches(input_fn, ModeKeys.EVAL, seen)
        call = None
        try:
            for i, batch in enumerate(batches):
                if steps is not None and i >= steps:
                    ran_out = False
                    break
                if user_hooks is not None:
                    user_hooks.before(step)
                share, batch = (batch, batch.batch) if pod is not None else (None, batch)
                features, labels = arrays.split(batch, ModeKeys.EVAL)
                given = arrays.sample_weights(batch) or [None] * len(labels)
                rows = _rows(features)
                if size is None:
                    _note_call_padding(conversion, share, rows, ModeKeys.EVAL)
                size = size or conversion.device_rows(rows)
                pad = np.zeros([size], np.float32)
                pad[:rows] = 1
                if share is not None:  # (its rows, padded already)
                    size, pad = rows, share.pad
                if call is None:  # the call's draws, seeded as stock's graph of this call
                    call = _draws.CallDraws(seen.get("seeds"))
                if share is None:
                    call.batch(rows, size)
                else:
                    call.batch(share.real, share.global_batch)
                weights = [
                    np.ones([size], np.float32) if w is None else _padded([w], size)[0]
                    for w in given
                ]
                loss, outputs, logits, hows = conversion.evaluate(
                    values,
                    _padded(features, size),
                    _padded(labels, size),
                    weights,
                    pad,
                    weighted=any(w is not None for w in given),
                    over_pod=share is not None,
                    call=call,
                )
                if share is not None:  # the metrics read the global batch's real rows
                    rows = share.real
                    labels, given = _pod.gathered((labels, given))
                    labels = [y[:rows] for y in labels]
                    given = [None if w is None else w[:rows] for w in given]
                    batch = _pod.gathered(batch) if self._tpushim_metric_fns else batch
                    batch = jax_tree_rows(batch, rows) if self._tpushim_metric_fns else batch
                if added is None and self._tpushim_metric_fns:
                    from tpushim._jax import _derived

                    added = _derived.Added(self, batch)
                losses.append(float(loss))
                outputs = [np.asarray(o)[:rows] for o in outputs]
                # Weighted metrics weighted by them, as on tpushim's other engines (stock's read
                # none of them: a documented difference)
                update(
                    [tf.constant(y) for y in labels],
                    [tf.constant(o) for o in outputs],
                    [None if w is None else tf.constant(w) for w in given],
                    [None if lg is None else tf.constant(lg[:rows]) for lg in logits],
                    tuple(hows),
                )
                if added is not None:
                    added.update(batch, outputs)
                if user_hooks is not None and user_hooks.after(step, False, losses[-1]):
                    ran_out = False
                    break  # a hook's request_stop(): stock's evaluation ends there too
        finally:
            batches.close()
            if call is not None:
                call.close()
        if user_hooks is not None:
            if ran_out:  # stock's last session.run: before_run, then OutOfRangeError
                user_hooks.before(step)
            user_hooks.end(step)
        results = {"loss": np.float32(np.mean(losses)) if losses else np.float32(np.nan)}
        compiled = [m for m in metrics.compiled_metrics.metrics if m.name != "loss"]
        names = conversion.checkpoints.metric_names
        if len(names) != len(compiled):
            names = [m.name for m in compiled]
        for stock_name, m in zip(
            _metric_names.mapped_metric_names(names, conversion.metric_names_map), compiled
        ):
            results[stock_name] = np.float32(m.result().numpy())
        if added is not None:  # (one of the same name replaces the model's, as stock's)
            results.update(added.results())
        results[tf.compat.v1.GraphKeys.GLOBAL_STEP] = step
        return results

    # -- predict ----------------------------------------------------------------------------------
    # predict(): the estimator API's (stock's signature, the call observed), its predictions
    # made here.
    def _predict(self, input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples):
        """Each prediction computed in the conversion's runtime (a graph program's eager one),
        the caller's code between two in its own."""
        return _generators.each_step_in(
            self._tpushim_jax.runtime,
            self._predictions(
                input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples
            ),
        )

    def _predictions(self, input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples):
        conversion = self._tpushim_jax
        seen, early, step, weights, _ = self._opened(input_fn, ModeKeys.PREDICT, checkpoint_path)
        user_hooks = _hooks.user_hooks(hooks, step, conversion, ModeKeys.PREDICT)
        yield from _stock_hooks.predicting(
            user_hooks,
            step,
            self._predict_batches(
                input_fn,
                predict_keys,
                user_hooks,
                (step, weights),
                yield_single_examples,
                early,
                seen,
            ),
        )

    def _predict_batches(
        self, input_fn, predict_keys, user_hooks, started, yield_single_examples, early, seen
    ):
        """Each prediction of the call (``started``: the ``(step, weights)`` it reads)."""
        step, weights = started
        conversion = self._tpushim_jax
        values = self._values(weights)
        arrays = Arrays(conversion.keras_model, conversion.host)
        size = None
        pod, seen, call = conversion.pod, {} if seen is None else seen, None
        batches = early if early is not None else self._batches(input_fn, ModeKeys.PREDICT, seen)
        try:
            for batch in batches:
                share, batch = (batch, batch.batch) if pod is not None else (None, batch)
                features, _ = arrays.split(batch, ModeKeys.PREDICT)
                if user_hooks is not None:
                    user_hooks.before(step)
                rows = _rows(features) if share is None else int(np.sum(share.pad))
                if size is None:
                    _note_call_padding(conversion, share, rows, ModeKeys.PREDICT)
                size = size or conversion.device_rows(_rows(features))
                if call is None:  # the call's draws, seeded as stock's graph of this call
                    call = _draws.CallDraws(seen.get("seeds"))
                if share is None:
                    call.batch(rows, size)
                else:  # stock's draws for the global batch, this process's rows of them
                    call.batch(share.real, share.global_batch, (pod.index, len(share.pad)))
                outputs = conversion.predict(values, _padded(features, size), call)
                out = {
                    n: np.asarray(o)[:rows]
                    for n, o in zip(conversion.keras_model.output_names, outputs)
                }
                # a key passed through: the host's (a pod's share: its real rows)
                out.update(
                    {k: v if np.ndim(v) == 0 else v[:rows] for k, v in arrays.host_outputs.items()}
                )
                stop = user_hooks is not None and user_hooks.after(step, False)
                yield from _stock_hooks.predictions(out, rows, predict_keys, yield_single_examples)
                if stop:  # stock's predict() ends after the batch a hook stopped at
                    return
        finally:
            batches.close()
            if call is not None:
                call.close()
        if user_hooks is not None:  # stock's last session.run: before_run, then OutOfRangeError
            user_hooks.before(step)


def _note_padding(conversion, size, shards, purpose):
    """Logs, once per conversion and ``purpose`` (training, evaluation, prediction), that a
    global batch of ``size`` rows is padded to the next multiple of ``shards`` devices
    (:func:`tpushim._batch_math.indivisible_batch`'s text, as the TPUEstimator path logs it)."""
    noted = conversion.__dict__.setdefault("_tpushim_padding_noted", set())
    if size % shards and (purpose, size, shards) not in noted:
        noted.add((purpose, size, shards))
        _observe.note("batch-padding", "%s; %s.", *_batch_math.indivisible_batch(size, shards))


def _note_input_dropout(conversion):
    """Logs, once per conversion, that the model's recurrent layers with ``dropout`` on their
    inputs train as stock's run whose loop over time steps took that mask's draws in time
    order: stock's own iterations take them in no fixed order (they run ahead of one another:
    the mask reads no state), so its numbers change from run to run."""
    if conversion.__dict__.get("_tpushim_input_dropout_noted"):
        return
    conversion._tpushim_input_dropout_noted = True
    named = _tfprivate.keras.input_dropout_loops(conversion.keras_model)
    if named:
        _observe.note(
            "recurrent-dropout",
            "recurrent layers %s draw their input dropout mask inside the loop over time steps, "
            "whose iterations take the draws in no fixed order in stock's run: stock's own "
            "numbers change from run to run. The JAX engine gives the run whose loop took them "
            "in time order (first step first).",
            ", ".join(named),
        )


def _note_call_padding(conversion, share, rows, purpose):
    """:func:`_note_padding` of an evaluation's or prediction's first batch: ``rows`` on one
    board's devices, or on a pod ``share``'s global batch over every process's devices."""
    if share is None:
        _note_padding(conversion, rows, len(conversion.devices), purpose)
    elif share.stock_batch:
        _note_padding(conversion, share.stock_batch, len(conversion.pod.devices), purpose)


class _InFront:
    """``batches`` (an iterator with ``close``) with ``first``, read from them, put back."""

    def __init__(self, first, batches):
        self._first, self._batches = [first], batches

    def __iter__(self):
        return self

    def __next__(self):
        if self._first:
            return self._first.pop()
        return next(self._batches)

    def close(self):
        self._batches.close()


def jax_tree_rows(tree, rows):
    """Each array of ``tree`` cut to its first ``rows`` rows (a ``SparseTensorValue``'s too)."""
    import jax

    def one(a):
        if isinstance(a, tf.compat.v1.SparseTensorValue):
            return _pod.sparse_rows(a, rows)
        return np.asarray(a)[:rows]

    return jax.tree_util.tree_map(
        one, tree, is_leaf=lambda a: isinstance(a, tf.compat.v1.SparseTensorValue)
    )


def _step_batch(arrays, item):
    """A training step's ``(features, labels, sample weights or None)`` of a batch, or on a pod
    ``(features, labels, sample weights or None, pad, the global batch's real rows)`` of this
    process's :class:`tpushim._jax._pod.Share`."""
    if isinstance(item, _pod.Share):
        features, labels = arrays.split(item.batch, ModeKeys.TRAIN)
        return features, labels, arrays.sample_weights(item.batch), item.pad, item.real
    features, labels = arrays.split(item, ModeKeys.TRAIN)
    return features, labels, arrays.sample_weights(item)


def _eager_classes(keras_model):
    """The model's classes made Keras's v2 ones again: the conversion cloned it in a graph
    (stock's warm-start checkpoint and training graph), which leaves them v1, and the engine
    traces the user's eager model."""
    _tfprivate.keras.restore_v2_classes(keras_model)


def _metrics_update(metrics_model):
    """A ``tf.function`` updating the model's compiled metrics with one batch's real labels and
    outputs (lists in its output order) as stock's graph does: its metrics picked as stock's,
    a [batch] label of a [batch, 1] output handed to them as stock's graph hands it, each
    output carrying its logits as stock's (``hows``: how each is read, or None; a softmax or
    sigmoid output's crossentropy metrics are computed from its logits in stock's graph)."""

    @tf.function(reduce_retracing=True)
    def update(labels, outputs, weights, logits, hows):
        given = [w is not None for w in weights]
        outputs = [
            o if how is None else _tfprivate.keras_compile.with_output_logits(o, how, lg)
            for o, lg, how in zip(outputs, logits, hows)
        ]
        _compiled_metrics.update(metrics_model, labels, outputs, weights, given)

    return update
