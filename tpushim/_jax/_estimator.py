"""The JAX engine's estimator, :class:`JaxEstimator`: stock's Estimator whose ``train``,
``evaluate`` and ``predict`` run the Keras model's steps in JAX on every local device, the
input_fn running in TensorFlow on the host.

- Input: the input_fn is called once per call, in a graph of its own seeded as stock's
  (:func:`tpushim._stock_graphs.input_graph`: a shuffle gives stock's order), and its batches
  are read in a ``MonitoredSession`` (tables, queues, one-shot iterators as stock's) as numpy
  arrays; a short batch is padded to the global batch with rows weighted 0.
- Train: :class:`tpushim._jax._step.Trainer` (``iterations_per_loop`` steps per compiled call),
  starting from the model_dir's newest checkpoint (either format, stock's names) or else from
  the Keras model's weights (stock's warm start), saving stock's checkpoints
  (:mod:`tpushim._jax._checkpoint`) at each call's first step, every ``save_checkpoints_steps`` and at the end;
  stock's ``loss = ..., step = N (x sec)`` lines (its LoggingTensorHook's: the call's first
  step, then every ``log_step_count_steps``), its NaN check (``NanLossDuringTrainingError``).
- Evaluate: the inference outputs and each batch's loss over its real rows in JAX, the model's
  compiled metrics updated on the host (a copy of the model compiled as the user compiled it):
  stock's ``loss`` (the mean of the batches' losses), metric names and ``global_step``.
- Predict: the inference outputs by output name, the real rows only.

What it does not do yet is refused in words before anything runs (the user's hooks, saving
listeners); see the engine's page in the docs.
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
    _compiled_metrics,
    _metric_names,
    _observe,
    _step_losses,
    _stock_graphs,
    _tfprivate,
)
from tpushim._errors import ConversionError

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
    """The input_fn's batches as numpy structures, read as stock reads them (see the module).
    ``seen`` (a dict): given the input graph's ``seeds`` (graph seed, op-seed counter) once the
    input_fn is called: what stock's graph seeds the model's random ops from after it."""
    graph, result, session = _stock_graphs.input_session(input_fn, mode, config)
    if seen is not None:
        seen["seeds"] = _tfprivate.graph.graph_seeds(graph)
    try:
        while not session.should_stop():
            try:
                yield session.run(result)
            except tf.errors.OutOfRangeError:
                return
    finally:
        session.close()


class ReadAhead:
    """``batches`` (an iterator, :func:`host_batches`) read in a thread of their own, at most
    ``depth`` batches ahead and never more than ``limit`` in all (None: until the input ends):
    the host's TensorFlow session reads the next batches while the devices run the current
    ones, and nothing is read that stock would not read (an input drawing from a shared
    random state draws what stock draws). ``close()`` stops the thread and closes ``batches``
    there."""

    _END = object()

    def __init__(self, batches, limit=None, depth=20):
        self._batches, self._limit = batches, limit
        self._queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="tpushim-input", daemon=True)
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
        item, error = self._queue.get()
        if item is self._END:
            self._stop.set()
            if error is not None:
                raise error
            raise StopIteration
        return item

    def close(self):
        self._stop.set()
        self._thread.join()


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
    input and output order, of the dtypes the model's inputs take (Keras casts them so)."""

    def __init__(self, keras_model):
        self.inputs = list(keras_model.input_names)
        self.outputs = list(keras_model.output_names)
        self.dtypes = [t.dtype.as_numpy_dtype for t in keras_model.inputs]

    def split(self, batch, mode):
        """(features, labels or None) as Estimator splits an input_fn's element."""
        if isinstance(batch, tuple) and len(batch) == 2:
            features, labels = batch
        else:
            features, labels = batch, None
        if mode == ModeKeys.PREDICT:
            labels = None
        features = _as_list(features, self.inputs, "features")
        cast = []
        for name, x, dtype in zip(self.inputs, features, self.dtypes):
            x = np.asarray(x)
            if x.dtype.kind in "OSU":
                _refuse(
                    f"string features (input {name!r}): it feeds numbers to the devices, and "
                    "a model that takes strings runs its lookups on the host only on the "
                    "strategy engine"
                )
            cast.append(x.astype(dtype) if x.dtype != dtype else x)
        if labels is None:
            return cast, None
        labels = [_as_32_bits(y) for y in _as_list(labels, self.outputs, "labels")]
        return cast, labels


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
    out = []
    for a in arrays:
        extra = np.zeros((size - len(a), *a.shape[1:]), a.dtype)
        out.append(np.concatenate([a, extra]) if size > len(a) else a)
    return out


# --- the estimator ------------------------------------------------------------------------------


class JaxEstimator(_tfprivate.estimator.EstimatorBase):
    """Stock's Estimator whose ``train``, ``evaluate`` and ``predict`` run in JAX (the module).

    Args:
      model_fn: stock's Keras model_fn (what the base class exports with).
      config: the RunConfig, its model_dir set.
      warm_start_from: stock's warm-start checkpoint of the Keras weights.
      conversion: the :class:`tpushim._jax._build.JaxConversion` of the model.
    """

    _tpushim_label = "the JAX engine's estimator"  # how stock's estimator around it says it

    def __init__(self, model_fn, config, warm_start_from, conversion):
        super().__init__(model_fn=model_fn, config=config, warm_start_from=warm_start_from)
        self._tpushim_jax = conversion

    def _assert_members_are_not_overridden(self):
        # Estimator forbids overriding train/evaluate/predict; this engine replaces exactly those.
        pass

    # What tpushim's estimator API (TF >= 2.16) asks of an engine's estimator.
    def _tpushim_add_metrics(self, metric_fn, model_fn):
        del metric_fn, model_fn
        _refuse("tf.estimator.add_metrics")

    def _tpushim_built_around(self, called):
        _refuse(f"{called} (an estimator built around its model_fn)")

    def export_saved_model(self, *args, **kwargs):
        del args, kwargs
        _refuse("export_saved_model")

    def export_savedmodel(self, *args, **kwargs):
        del args, kwargs
        _refuse("export_savedmodel")

    # -- state ------------------------------------------------------------------------------------
    def _latest(self, checkpoint_path=None):
        """(step, weights, slots, path) of the checkpoint to start from (None: the model's)."""
        path = checkpoint_path or tf.train.latest_checkpoint(self.model_dir)
        if path is None:
            return 0, {}, {}, None
        step, weights, slots = self._tpushim_jax.checkpoints.read(path)
        return step, weights, slots, path

    def _values(self, weights):
        """Every model weight's value: the checkpoint's, else the Keras model's."""
        values = {v.name.split(":")[0]: v for v in self._tpushim_jax.keras_model.weights}
        return {k: (weights[k] if k in weights else v.numpy()) for k, v in values.items()}

    # -- train ------------------------------------------------------------------------------------
    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        with _observe.calling(_observe.Call("train", self, input_fn, steps, max_steps)) as call:
            started = time.monotonic()
            ran = self._train(input_fn, hooks, call.steps, call.max_steps, saving_listeners)
            _observe.finished(call, time.monotonic() - started, ran, None)
            return self

    def _train(self, input_fn, hooks, steps, max_steps, saving_listeners):
        from tpushim._estimator_api._estimator import check_train_steps, global_step_saved

        check_train_steps(steps, max_steps)
        _eager_classes(self._tpushim_jax.keras_model)
        if hooks:
            _refuse("the user's SessionRunHooks in train()")
        if saving_listeners:
            _refuse("CheckpointSaverListeners in train() (train_and_evaluate's evaluations)")
        conversion = self._tpushim_jax
        start, weights, slots, _ = self._latest()
        last = math.ceil(max_steps) if max_steps is not None else None
        if last is not None and start >= last:
            if max_steps <= global_step_saved(self.model_dir):
                tf_logger.info("Skipping training since max_steps has already saved.")
                return 0
            last = start + 1
        stop = start + math.ceil(steps) if steps is not None else last
        arrays = Arrays(conversion.keras_model)
        seen = {}
        batches = host_batches(input_fn, ModeKeys.TRAIN, self.config, seen)
        try:
            # The input_fn called and its first batch read here, in the caller's thread; the
            # rest read ahead in a thread while the devices train.
            first = next(batches, None)
            if first is not None and (stop is None or stop - start > 1):
                batches = ReadAhead(batches, None if stop is None else stop - start - 1)
            if first is None:
                raise ConversionError("the input_fn gave no batch: the input is empty.")
            features, labels = arrays.split(first, ModeKeys.TRAIN)
            if labels is None:
                raise ValueError("the input_fn gave no labels: training needs them.")
            trainer = conversion.trainer(conversion.batch_size or _rows(features), seen["seeds"])
            trainer.restore(weights, slots, start)
            trainer.check((features, labels, None))  # its refusals before anything is written
            return self._train_steps(trainer, arrays, first, batches, start, stop)
        finally:
            batches.close()

    def _train_steps(self, trainer, arrays, first, batches, start, stop):
        conversion, config = self._tpushim_jax, self.config
        values = self._values({})

        def save(step):
            if trainer.params is not None:
                values.update(trainer.weights())
                slots = {k: v for k, v in trainer.slots().items() if k != "iterations"}
            else:
                _, restored, slots, _ = self._latest()
                values.update(restored)
            conversion.checkpoints.write(self.model_dir, step, values, slots)

        tf.io.gfile.makedirs(self.model_dir)
        conversion.checkpoints.begin(config)  # stock's Saver for this call
        save(start)  # as stock's CheckpointSaverHook at every session's start (model.ckpt-0)
        every = config.save_checkpoints_steps
        log_every = config.log_step_count_steps
        step, pending = start, [first]
        saved, logged_at = start, None
        while stop is None or step < stop:
            n = conversion.per_call if stop is None else min(conversion.per_call, stop - step)
            if every:
                n = min(n, max(saved + every - step, 1))
            chunk = pending[:n]
            pending = pending[n:]
            while len(chunk) < n:
                batch = next(batches, None)
                if batch is None:
                    break
                chunk.append(batch)
            if not chunk:
                break
            split = [arrays.split(b, ModeKeys.TRAIN) for b in chunk]
            ran = time.monotonic()
            losses = [np.float32(loss) for loss in trainer.train([(f, y, None) for f, y in split])]
            took = (time.monotonic() - ran) / len(losses)  # each step's share of the call
            for k, loss in enumerate(losses):
                if np.isnan(loss):  # stock's NanTensorHook, before its LoggingTensorHook
                    tf.compat.v1.logging.error(_step_losses.NAN_MESSAGE)
                    raise tf.compat.v1.train.NanLossDuringTrainingError
                if log_every and (step + k - start) % log_every == 0:
                    at = ran + (k + 1) * took
                    elapsed = None if logged_at is None else at - logged_at
                    _step_losses._log_line(loss, step + k, elapsed)  # LoggingTensorHook's line
                    logged_at = at
            step += len(chunk)
            if every and step >= saved + every:
                save(step)
                saved = step
            if len(chunk) < n:
                break
        if tf.train.latest_checkpoint(self.model_dir) != os.path.join(
            self.model_dir, f"model.ckpt-{step}"
        ):
            save(step)
        tf_logger.info("Loss for final step: %s.", losses[-1] if step > start else None)
        return step - start

    # -- evaluate ---------------------------------------------------------------------------------
    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
        with _observe.calling(_observe.Call("evaluate", self, input_fn, steps)) as call:
            started = time.monotonic()
            results = self._evaluate(input_fn, call.steps, hooks, checkpoint_path)
            _observe.finished(call, time.monotonic() - started)
            return results

    def _evaluate(self, input_fn, steps, hooks, checkpoint_path):
        if hooks:
            _refuse("the user's SessionRunHooks in evaluate()")
        conversion = self._tpushim_jax
        _eager_classes(conversion.keras_model)
        step, weights, _, _ = self._latest(checkpoint_path)
        values = self._values(weights)
        arrays = Arrays(conversion.keras_model)
        metrics = conversion.metrics_model()
        update = _metrics_update(metrics)
        losses, size = [], None
        batches = host_batches(input_fn, ModeKeys.EVAL, self.config)
        try:
            for i, batch in enumerate(batches):
                if steps is not None and i >= steps:
                    break
                features, labels = arrays.split(batch, ModeKeys.EVAL)
                rows = _rows(features)
                size = size or conversion.device_rows(rows)
                pad = np.zeros([size], np.float32)
                pad[:rows] = 1
                ones = [np.ones([size], np.float32) for _ in labels]
                loss, outputs = conversion.evaluate(
                    values, _padded(features, size), _padded(labels, size), ones, pad
                )
                losses.append(float(loss))
                outputs = [np.asarray(o)[:rows] for o in outputs]
                update([tf.constant(y) for y in labels], [tf.constant(o) for o in outputs])
        finally:
            batches.close()
        results = {"loss": np.float32(np.mean(losses)) if losses else np.float32(np.nan)}
        compiled = [m for m in metrics.compiled_metrics.metrics if m.name != "loss"]
        names = conversion.checkpoints.metric_names
        if len(names) != len(compiled):
            names = [m.name for m in compiled]
        for stock_name, m in zip(
            _metric_names.mapped_metric_names(names, conversion.metric_names_map), compiled
        ):
            results[stock_name] = np.float32(m.result().numpy())
        results[tf.compat.v1.GraphKeys.GLOBAL_STEP] = step
        return results

    # -- predict ----------------------------------------------------------------------------------
    def predict(
        self,
        input_fn,
        predict_keys=None,
        hooks=None,
        checkpoint_path=None,
        yield_single_examples=True,
    ):
        if hooks:
            _refuse("the user's SessionRunHooks in predict()")
        with _observe.calling(_observe.Call("predict", self, input_fn)) as call:
            started = time.monotonic()
            yield from self._predict(input_fn, predict_keys, checkpoint_path, yield_single_examples)
            _observe.finished(call, time.monotonic() - started)

    def _predict(self, input_fn, predict_keys, checkpoint_path, yield_single_examples):
        conversion = self._tpushim_jax
        _eager_classes(conversion.keras_model)
        _, weights, _, _ = self._latest(checkpoint_path)
        values = self._values(weights)
        arrays = Arrays(conversion.keras_model)
        size = None
        batches = host_batches(input_fn, ModeKeys.PREDICT, self.config)
        try:
            for batch in batches:
                features, _ = arrays.split(batch, ModeKeys.PREDICT)
                rows = _rows(features)
                size = size or conversion.device_rows(rows)
                outputs = conversion.predict(values, _padded(features, size))
                out = {
                    n: np.asarray(o)[:rows]
                    for n, o in zip(conversion.keras_model.output_names, outputs)
                }
                if predict_keys:
                    out = {k: v for k, v in out.items() if k in predict_keys}
                if not yield_single_examples:
                    yield out
                else:
                    for i in range(rows):
                        yield {k: v[i] for k, v in out.items()}
        finally:
            batches.close()


def _eager_classes(keras_model):
    """The model's classes made Keras's v2 ones again: the conversion cloned it in a graph
    (stock's warm-start checkpoint and training graph), which leaves them v1, and the engine
    traces the user's eager model."""
    _tfprivate.keras.restore_v2_classes(keras_model)


def _metrics_update(metrics_model):
    """A ``tf.function`` updating the model's compiled metrics with one batch's real labels and
    outputs (lists in its output order) as stock's graph does: its metrics picked as stock's,
    a [batch] label of a [batch, 1] output handed to them as stock's graph hands it."""

    @tf.function(reduce_retracing=True)
    def update(labels, outputs):
        none = [None] * len(labels)  # the engine takes no sample weights from the input yet
        _compiled_metrics.update(metrics_model, labels, outputs, none, [False] * len(labels))

    return update
