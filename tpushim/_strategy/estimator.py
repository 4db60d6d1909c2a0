"""The strategy engine's estimator, :class:`StrategyEstimator`; the estimator
``tf.estimator.add_metrics`` makes of it (:func:`add_metrics`), and the line said where stock's
estimator is built around its model_fn (:func:`said_stock_around`).

Why it subclasses the stock ``tf.estimator.Estimator``: a script reads ``model_dir``,
``config``, ``latest_checkpoint()``, ``get_variable_value()``; ``train_and_evaluate`` calls
``train``/``evaluate``; ``export_saved_model`` builds stock's Keras model_fn and restores the
latest checkpoint. Those all come from the base class unchanged, because the checkpoints this
engine writes are the stock estimator's, in the format ``checkpoint_format`` asked for, with
stock's keys and names (:mod:`tpushim._strategy.checkpoint`). Only ``train``, ``evaluate`` and
``predict`` are replaced.
"""

import logging
import math
import os
import time
import types

import numpy as np
import tensorflow as tf

from tpushim import (
    _added_metrics,
    _compiled_metrics,
    _generators,
    _input_wait,
    _metric_names,
    _observe,
    _shapes,
    _tfprivate,
)
from tpushim import _stock_hooks as _step_events
from tpushim._strategy import checkpoint as _strategy_checkpoint
from tpushim._strategy import input as _strategy_input
from tpushim._strategy import summary_walk as _summary_walk
from tpushim._strategy.clone import _built_on_input
from tpushim._strategy.compiled_metrics import _metrics_model, _metrics_update
from tpushim._strategy.element import _unpack, features_spec, given_parts
from tpushim._strategy.input import distributed_input
from tpushim._strategy.refusals import check_input_keys, check_metric_names_map, check_row_labels
from tpushim._strategy.runtime import runtime
from tpushim._strategy.step import _SAID_SUMMARIES, _Run
from tpushim._strategy.xla_check import check_xla_once

logger = logging.getLogger("tpushim")

ModeKeys = _tfprivate.estimator.ModeKeys


class StrategyEstimator(_tfprivate.estimator.EstimatorBase):
    """The stock Estimator whose ``train``, ``evaluate`` and ``predict`` run the Keras model under
    a ``tf.distribute`` strategy (see the module's docstring for why it subclasses Estimator)."""

    _tpushim_label = "the strategy engine's estimator"  # how stock's estimator around it says it
    #: The metric_fns ``tf.estimator.add_metrics`` added to its evaluation, in order (:func:`add_metrics`).
    _tpushim_metric_fns = ()

    def __init__(self, model_fn, config, warm_start_from, plan, v1_api=False):
        super().__init__(model_fn=model_fn, config=config, warm_start_from=warm_start_from)
        self._tpushim_plan = plan  # frozen (:class:`tpushim._strategy.plan.Plan`)
        self._tpushim_v1_api = v1_api  # made through tf.compat.v1's model_to_estimator
        self._tpushim_strategy = None
        # The checkpoints stock keeps: its Keras estimator's object-based Saver keeps 5, whatever
        # keep_checkpoint_max says; a name-based one (the v1 spelling) keep_checkpoint_max.
        self._tpushim_keep = (
            self.config.keep_checkpoint_max
            if plan.name_based_checkpoints
            else _step_events.OBJECT_CHECKPOINTS_KEPT
        )

    def _assert_members_are_not_overridden(self):
        # Estimator forbids overriding train/evaluate/predict; this engine replaces exactly those.
        pass

    # What tpushim's estimator API (TF >= 2.16) asks of an engine's estimator (tpushim/_estimator_api).
    def _tpushim_add_metrics(self, metric_fn, model_fn):
        """``tf.estimator.add_metrics(self, metric_fn)``: this engine's, with ``model_fn``."""
        return add_metrics(self, metric_fn, model_fn)

    def _tpushim_built_around(self, called):
        """A stock estimator was built around this one's ``model_fn``: said."""
        return said_stock_around(self, called)

    def export_savedmodel(self, export_dir_base, serving_input_receiver_fn, **kwargs):
        """Through tf.compat.v1's model_to_estimator stock returns a v1 Estimator, whose
        deprecated ``export_savedmodel`` exports (a v1 script calls it); through the v2 one,
        stock's EstimatorV2 refuses it with its own error (2.12 - 2.15)."""
        base = _tfprivate.estimator.EstimatorBase
        if self._tpushim_v1_api and _tfprivate.modules.estimator_lib is not None:
            base = _tfprivate.modules.estimator_lib.Estimator  # the v1 class, EstimatorV2's base
        return base.export_savedmodel(self, export_dir_base, serving_input_receiver_fn, **kwargs)

    @property
    def strategy(self):
        """The ``tf.distribute`` strategy this estimator runs under (made at the first call)."""
        if self._tpushim_strategy is None:
            self._tpushim_strategy = self._tpushim_plan.make_strategy()
        return self._tpushim_strategy

    def _input(self, input_fn, mode):
        plan = self._tpushim_plan
        made = distributed_input(
            self.strategy,
            input_fn,
            mode,
            self.config,
            plan.batch_size,
            plan.pod_input,
            # Shape-from-model, as the TPU path's (a subclassed model declares no inputs).
            None
            if _tfprivate.keras.is_subclassed(plan.keras_model)
            else _shapes.ModelInputs.of(plan.keras_model, feature_split=False),
            plan.host,
        )
        # Evaluation and prediction read it in Python: each batch's wait timed (the run summary).
        if mode == ModeKeys.TRAIN or isinstance(made.dataset, _strategy_input.WithHostOutputs):
            return made
        return made._replace(dataset=_input_wait.timed(made.dataset))

    def _input_first(self, input_fn, mode):
        """A subclassed model's clone is built on the input's shapes, so its input is made
        before its :class:`_Run` (``input``: a :class:`tpushim._strategy.input.Made`,
        ``features``: a replica's feature specs); a graph network's after (both None)."""
        if not _built_on_input(self._tpushim_plan.keras_model):
            return types.SimpleNamespace(input=None, features=None)
        made = self._input(input_fn, mode)
        return types.SimpleNamespace(input=made, features=features_spec(made[1]))

    def _runtime(self):
        return runtime(self._tpushim_plan)

    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        # Observers (the run summary, the preflight) hear of the call and may cap its steps.
        with (
            self._runtime(),
            _observe.calling(_observe.Call("train", self, input_fn, steps, max_steps)) as call,
        ):
            started = time.monotonic()
            with _input_wait.strategy_timing() as wait:  # observed or not: the same function
                ran, first = self._train(
                    input_fn, hooks, call.steps, call.max_steps, saving_listeners
                )
            _observe.input_waited(call, wait.seconds)
            _observe.finished(call, time.monotonic() - started, ran, first)
            return self

    def _train(self, input_fn, hooks, steps, max_steps, saving_listeners):
        """Trains as stock; returns (steps run, the first tf.function call's seconds)."""
        # One check for both engines, and stock's read of the saved step.
        from tpushim._estimator_api._estimator import check_train_steps, global_step_saved

        check_train_steps(steps, max_steps)
        listeners = list(saving_listeners or ())
        early = self._input_first(input_fn, ModeKeys.TRAIN)
        run = _Run(
            self._tpushim_plan, self.strategy, ModeKeys.TRAIN, self.model_dir, None, early.features
        )
        start = int(run.step.numpy())
        # StopAtStepHook stops at the first global step >= max_steps (or start + steps): a float
        # from `epochs * rows / batch` runs to its ceiling, as stock's does.
        last = math.ceil(max_steps) if max_steps is not None else None
        if last is not None and start >= last:
            if max_steps <= global_step_saved(self.model_dir):
                logging.getLogger("tensorflow").info(
                    "Skipping training since max_steps has already saved."
                )
                return 0, None
            # Stock's skip reads 0 from an object-based checkpoint (no `global_step` name in
            # it): it trains, and its StopAtStepHook stops after the one step it runs.
            last = start + 1
        # The input first, as stock calls its input_fn first: an input refused (tensors on a
        # pod) refuses before anything is written (events, model.ckpt-0), hooks begun.
        made = early.input or self._input(input_fn, ModeKeys.TRAIN)
        check_input_keys(self._tpushim_plan, run.model, made.spec)
        check_row_labels(run.model, run.terms, made.spec)
        check_metric_names_map(self._tpushim_plan)  # stock's model_fn checks it at train() too
        # Stock's model_fn compiles a clone here, naming the user's metric objects once more.
        _tfprivate.keras_compile.name_metric_objects_as_a_compile(self._tpushim_plan.keras_model)
        strategy = self.strategy
        if self._tpushim_plan.jit_compile and not isinstance(strategy, tf.distribute.TPUStrategy):
            # What a TPU could not compile is refused before anything is written.
            check_xla_once(self._tpushim_plan, made[1], strategy.num_replicas_in_sync)
        # The user's hooks begin, and see their first step, before anything is written.
        user_hooks = _step_events.SessionHooks(hooks, start) if hooks else None
        try:
            return self._train_steps(run, made, user_hooks, start, steps, last, listeners)
        finally:
            if user_hooks is not None:
                user_hooks.close()

    def _train_steps(self, run, made, user_hooks, start, steps, last, listeners):
        config = self.config
        # Stock's graph in the events, and where RunConfig's checkpoint_save_graph_def says
        # (True by default) in graph.pbtxt and model.ckpt-N.meta: the one graph built per
        # conversion for the checkpoints' names (_strategy_checkpoint.stock_meta_graph).
        plan = self._tpushim_plan
        meta_bytes, graph_text = None, None
        if getattr(config, "checkpoint_save_graph_def", True):
            meta_bytes, graph_text = _strategy_checkpoint.stock_graph_files(plan)
        tags = _strategy_checkpoint.stock_scalar_tags(plan)  # the model's scalars' tags
        # The model's summaries: what they are computed from comes out of the step that writes
        # the summary record (one step a call); stock's graph computes them on the host.
        others = bool(_strategy_checkpoint.stock_summaries(plan))
        events = _step_events.StepEvents(
            config,
            self.model_dir,
            _strategy_checkpoint.stock_graph(plan),
            _strategy_checkpoint.stock_meta_graph(plan),
            graph_text,
        )
        kept = _step_events.Kept(self.model_dir, self._tpushim_keep)
        for listener in listeners:
            listener.begin()
        # CheckpointSaverHook's timer: the step and time of the last save (the next one falls
        # save_checkpoints_steps after it, or save_checkpoints_secs after it, at a call's end).
        saved = {"step": start, "at": time.monotonic()}

        def save():
            # CheckpointSaverListeners as stock's saver calls them (train_and_evaluate evaluates
            # in after_save); they get no session: this engine has none.
            step = int(run.step.numpy())
            for listener in listeners:
                listener.before_save(None, step)
            run.save(kept, meta_bytes)
            events.checkpoint(step)
            saved.update(step=step, at=time.monotonic())
            return any([listener.after_save(None, step) for listener in listeners])

        stopped = False
        if not run.restored:
            stopped = save()  # stock's model.ckpt-0
        else:  # stock saves the restored step again (the same values): said, not rewritten
            events.checkpoint(start)
        stop = start + math.ceil(steps) if steps is not None else last
        iterator = iter(made.dataset)
        left = made.steps  # the batches left where known: each call reads no further
        loop = run.train_function(checked=left is None)
        every = config.save_checkpoints_steps
        every_secs = config.save_checkpoints_secs
        per_call = self._tpushim_plan.steps_per_execution
        step, first = start, None
        try:
            while not stopped and (stop is None or step < stop):
                n = per_call if stop is None else min(per_call, stop - step)
                if every:  # a checkpoint falls at the end of a call
                    n = min(n, max(saved["step"] + every - step, 1))
                if user_hooks is not None:  # a hook's stop falls at the end of a call
                    n = user_hooks.per_call(step, n)
                summary = events.next_summary(step) if others else None
                alone = summary == step + 1 and (left is None or left > 0)
                if summary is not None:  # the summarized step runs alone, in its own call
                    n = 1 if alone else min(n, max(summary - 1 - step, 1))
                began = time.monotonic()
                reads = n if left is None else min(n, left)  # fewer: the input ends in this call
                summarized = None
                if alone:
                    ran, losses, scalars, summarized = run.summarized(iterator)
                else:
                    ran, losses, scalars = loop(iterator, tf.constant(reads, tf.int64))
                left = None if left is None else left - int(ran)
                ended = time.monotonic()
                first = ended - began if first is None else first
                ran, losses = int(ran), losses.numpy()
                scalars = scalars.numpy().reshape(ran, -1) if ran else None
                label, step = step, int(run.step.numpy())
                # Stock's hooks after each step; at a save step the checkpoint comes first.
                times = _step_events.step_times(began, ended, ran)
                for k in range(ran):
                    if user_hooks is not None:
                        user_hooks.before(label + k)  # before the step's checkpoint, as stock's
                    if k == ran - 1 and (
                        (every and step >= saved["step"] + every)
                        or (every_secs and ended - saved["at"] >= every_secs)
                    ):
                        stopped = save()
                    given = None
                    if scalars is not None and run.scalar_count == len(tags):
                        given = list(zip(tags, scalars[k].tolist()))
                    elif scalars is not None and (id(plan), "tags") not in _SAID_SUMMARIES:
                        _SAID_SUMMARIES.add((id(plan), "tags"))
                        logger.warning(
                            "tpushim: the model made %d tf.compat.v1.summary.scalar calls in "
                            "the engine's step and %d in stock's graph (%s): not written.",
                            run.scalar_count,
                            len(tags),
                            ", ".join(tags),
                        )
                    if summarized is not None and k == ran - 1:
                        given = _model_summaries(plan, run, given, summarized)
                    stopped = (
                        events.step(losses[k], label + k, times[k], user_hooks, given) or stopped
                    )
                if ran < n:  # the input ran out
                    if user_hooks is not None:  # stock's last session.run: before_run, then
                        user_hooks.before(step)  # OutOfRangeError
                    break
            if tf.train.latest_checkpoint(self.model_dir) != os.path.join(
                self.model_dir, f"model.ckpt-{step}"
            ):
                save()
            if user_hooks is not None:
                user_hooks.end(step)  # after the last checkpoint, as stock's hooks' end()
        finally:
            events.close()
        events.end()
        for listener in listeners:
            listener.end(None, step)
        return step - start, first

    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
        with (
            self._runtime(),
            _observe.calling(_observe.Call("evaluate", self, input_fn, steps)) as call,
        ):
            started = time.monotonic()
            with _input_wait.strategy_timing() as wait:
                results = self._evaluate(input_fn, call.steps, hooks, checkpoint_path, name)
            _observe.input_waited(call, wait.seconds)
            _observe.finished(call, time.monotonic() - started)
            return results

    def _evaluate(self, input_fn, steps, hooks, checkpoint_path, name):
        results = self._evaluate_named(input_fn, steps, hooks, checkpoint_path, name)
        # Stock's model_fn compiled a clone for this evaluation, naming the user's metric
        # objects once more (the engine's metrics model named its copies so: see _metrics_model).
        _tfprivate.keras_compile.name_metric_objects_as_a_compile(self._tpushim_plan.keras_model)
        return results

    def _evaluate_named(self, input_fn, steps, hooks, checkpoint_path, name):
        early = self._input_first(input_fn, ModeKeys.EVAL)
        check_metric_names_map(self._tpushim_plan)
        run = _Run(
            self._tpushim_plan,
            self.strategy,
            ModeKeys.EVAL,
            self.model_dir,
            checkpoint_path,
            early.features,
        )
        user_hooks = _step_events.SessionHooks(hooks, int(run.step.numpy())) if hooks else None
        try:
            return self._evaluate_batches(
                run, early, input_fn, steps, user_hooks, checkpoint_path, name
            )
        finally:
            if user_hooks is not None:
                user_hooks.close()

    def _evaluate_batches(self, run, early, input_fn, steps, user_hooks, checkpoint_path, name):
        dataset, element_spec, _ = early.input or self._input(input_fn, ModeKeys.EVAL)
        check_input_keys(self._tpushim_plan, run.model, element_spec)
        check_row_labels(run.model, run.terms, element_spec)
        names = run.model.output_names
        added = _added_metrics.added(
            self._tpushim_metric_fns,
            self.config,
            # (a subclassed model has no symbolic outputs: its metric_fns see no output specs)
            {n: tf.TensorSpec(o.shape, o.dtype) for n, o in zip(names, run.model.outputs or ())},
            given_parts(element_spec),
        )
        if added is None:
            forward = run.eval_function()
        else:  # only what the metrics read comes to the host
            forward = run.eval_function({p: u for p, u in added.used.items() if p != "predictions"})
        metrics_model = _metrics_model(self._tpushim_plan, early.features)
        update = None  # made at the first batch
        losses = []
        ran_out = True
        for i, element in enumerate(dataset):
            if steps is not None and i >= steps:
                ran_out = False
                break
            if user_hooks is not None:
                user_hooks.before(int(run.step.numpy()))
            loss, *per_replica = forward(element)
            losses.append(float(loss))
            given = run.gathered(per_replica.pop()) if added is not None else {}
            outputs, labels, pad, weights, masks, logits = run.gathered(tuple(per_replica))
            # Keras weighs only weighted_metrics by a sample weight: padding rows are left out
            # (by the update, which keeps the rows whose padding weight is not 0).
            if added is not None:  # stock's predictions: the outputs by name
                predictions = tf.nest.flatten(dict(zip(names, outputs)))
                given["predictions"] = [predictions[i] for i in added.used["predictions"]]
                added.update(_added_metrics.real_rows(given, pad.numpy() > 0))
            if update is None:
                has_mask = [bool(mask.shape[0]) for mask in masks]
                given = _unpack(element_spec, names)[3] or [None] * len(masks)
                has_weight = [w is not None for w in given]
                update = _metrics_update(metrics_model, run.logits_how, has_mask, has_weight)
            update(labels, outputs, logits, weights, masks, pad)
            if user_hooks is not None and user_hooks.after(int(run.step.numpy()), False):
                ran_out = False
                break  # a hook's request_stop(): stock's evaluation ends there too
        if user_hooks is not None:
            if ran_out:  # stock's last session.run: before_run, then OutOfRangeError
                user_hooks.before(int(run.step.numpy()))
            user_hooks.end(int(run.step.numpy()))
        # In stock's order: the loss, the metrics, the global step.
        results = {"loss": np.float32(np.mean(losses)) if losses else np.float32(np.nan)}
        compiled = metrics_model.compiled_metrics.metrics
        stock_names = self._tpushim_plan.metric_names
        if stock_names is None or len(stock_names) != len(compiled):
            stock_names = _compiled_metrics.stock_names(metrics_model)
        # model_to_estimator's metric_names_map, checked as stock before anything is written
        mapped = _metric_names.mapped_metric_names(stock_names, self._tpushim_plan.metric_names_map)
        for stock_name, m in zip(mapped, compiled):
            results[stock_name] = np.float32(m.result().numpy())
        if added is not None:  # stock's add_metrics: an added name replaces a compiled one
            results.update(added.results())
        results[tf.compat.v1.GraphKeys.GLOBAL_STEP] = int(run.step.numpy())
        evaluated = checkpoint_path or run.restored or self._tpushim_plan.conversion.warm_start
        _step_events.write_evaluation(
            self.eval_dir(name),
            results,
            evaluated,
            _strategy_checkpoint.stock_graph(self._tpushim_plan),
        )
        return results

    def predict(
        self,
        input_fn,
        predict_keys=None,
        hooks=None,
        checkpoint_path=None,
        yield_single_examples=True,
    ):
        # Each prediction computed in the engine's runtime, the caller's code between two in
        # its own (a program's graph mode).
        yield from _generators.each_step_in(
            self._runtime,
            self._predict_observed(
                input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples
            ),
        )

    def _predict_observed(
        self, input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples
    ):
        with _observe.calling(_observe.Call("predict", self, input_fn)) as call:
            started = time.monotonic()
            with _input_wait.strategy_timing() as wait:
                yield from self._predict(
                    input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples
                )
            _observe.input_waited(call, wait.seconds)
            _observe.finished(call, time.monotonic() - started)

    def _predict(self, input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples):
        early = self._input_first(input_fn, ModeKeys.PREDICT)
        run = _Run(
            self._tpushim_plan,
            self.strategy,
            ModeKeys.PREDICT,
            self.model_dir,
            checkpoint_path,
            early.features,
        )
        step = int(run.step.numpy())
        user_hooks = _step_events.SessionHooks(hooks, step) if hooks else None
        yield from _step_events.predicting(
            user_hooks,
            step,
            self._predict_batches(
                run, early, input_fn, predict_keys, user_hooks, yield_single_examples
            ),
        )

    def _predict_batches(
        self, run, early, input_fn, predict_keys, user_hooks, yield_single_examples
    ):
        made = early.input or self._input(input_fn, ModeKeys.PREDICT)
        check_input_keys(self._tpushim_plan, run.model, made.spec)
        dataset = made.dataset
        forward = run.predict_function()
        names = run.model.output_names
        step = int(run.step.numpy())
        for element in dataset:
            outs = {}
            if isinstance(dataset, _strategy_input.WithHostOutputs):
                element, outs = element  # the outputs the host made (a key passed through)
            if user_hooks is not None:
                user_hooks.before(step)
            outputs, pad = run.gathered(forward(element))
            real = pad.numpy() > 0
            batch = {n: outs.get(n, o).numpy()[real] for n, o in zip(names, outputs)}
            stop = user_hooks is not None and user_hooks.after(step, False)
            yield from _step_events.predictions(
                batch, int(real.sum()), predict_keys, yield_single_examples
            )
            if stop:  # stock's predict() ends after the batch a hook stopped at
                return
        if user_hooks is not None:  # stock's last session.run: before_run, then OutOfRangeError
            user_hooks.before(step)


def add_metrics(estimator, metric_fn, model_fn):
    """The strategy engine's estimator ``tf.estimator.add_metrics(estimator, metric_fn)`` returns:
    ``estimator`` (its conversion, config, model_dir, warm start) whose evaluation also computes
    ``metric_fn``'s metrics as stock's does (:mod:`tpushim._added_metrics`).

    Args:
      estimator: a :class:`StrategyEstimator` (one add_metrics made, too: the metrics add up).
      metric_fn: the user's, its arguments checked by ``add_metrics`` (stock's check).
      model_fn: the model_fn stock's ``add_metrics`` made (the estimator's, with the metrics in
        EVAL mode): the new estimator's, so that what a script builds from it is stock's.
    """
    added = StrategyEstimator(
        model_fn,
        estimator.config,
        _tfprivate.estimator.warm_start_settings(estimator),
        estimator._tpushim_plan,
    )
    added._tpushim_keep = estimator._tpushim_keep
    added._tpushim_v1_api = estimator._tpushim_v1_api
    added._tpushim_strategy = estimator._tpushim_strategy
    return _added_metrics.derived(added, estimator, model_fn, metric_fn, "the strategy engine")


def said_stock_around(estimator, called):
    """True, said in one line and told to observers, when ``estimator`` is the strategy engine's
    and ``called`` (an estimator constructor) builds stock's estimator around its model_fn: the
    engine does not take an estimator made from its model_fn (never silent)."""
    if not isinstance(estimator, StrategyEstimator):
        return False
    why = "the strategy engine does not take an estimator made from its model_fn"
    logger.warning(
        "%s -> stock Estimator, which runs stock's model_fn "
        "(on a TPU nothing would run on it): %s. To add metrics, use "
        "tf.estimator.add_metrics(<the converted estimator>, metric_fn), which keeps the engine; "
        "for another model_dir or config, give them to model_to_estimator; or use "
        "engine='tpuestimator' where TPUEstimator runs.",
        called,
        why,
    )
    _observe.bypassed(estimator, f"{called}: {why}")
    return True


def _model_summaries(plan, run, scalars, values):
    """The model's own summaries of one step, in stock's merged summary's order, each computed
    on the host from what ``run.summarized`` gathered (``values``, in the order of its feeds) in
    a copy of stock's graph, as stock's graph computes it over the global batch. A scalar the
    engine cannot compute so is the replicas' weighted mean (``scalars``: [(tag, value)], or
    None: not written); another is left out (said at the trace). Where the model's calls do not
    match stock's graph, the scalars alone."""
    ops = _strategy_checkpoint.stock_summaries(plan)
    hows = run.summary_hows or []
    kinds = [_tfprivate.checkpoint.SUMMARY_OPS[op.type] for op in ops]
    if kinds != [kind for kind, _ in hows]:
        if (id(plan), "others") not in _SAID_SUMMARIES:
            _SAID_SUMMARIES.add((id(plan), "others"))
            logger.warning(
                "tpushim: the model made the summaries %s in the engine's step and %s in "
                "stock's graph: not written.",
                [kind for kind, _ in hows],
                kinds,
            )
        return scalars
    by_scalar = iter(scalars or ())
    given = iter(values)
    made = []
    for op, (kind, how) in zip(ops, hows):
        scalar = next(by_scalar, None) if kind == "scalar" else None
        if isinstance(how, str):
            if scalar is not None:
                made.append(scalar)
            continue
        feeds = []
        for theirs, fed, value in how:
            feeds.append((theirs.name, value if fed == _summary_walk.CONST else next(given)))
        summarized = _strategy_checkpoint.summary_values(plan, op, feeds)
        if kind == "scalar":
            if scalars is not None:  # stock's tag, the value over the global batch
                made.extend((v.tag, v.simple_value) for v in summarized)
        else:
            made.extend(summarized)
    return made
