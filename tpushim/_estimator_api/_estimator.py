"""Estimator: train, evaluate, predict and export on tf.compat.v1 graphs and sessions.

Why this shape: stock tf.estimator (TensorFlow <= 2.15) runs a model_fn in a fresh graph per call,
under ``MonitoredTrainingSession`` with TensorFlow's own hooks and ``tf.compat.v1.train.Saver``
checkpoints. TensorFlow 2.16+ still ships all of those, so this class calls them in stock's order
-- graph seed, global step, its read, input_fn, model_fn, warm start, hooks -- and a script gets
stock's op seeds, graph-mode Keras step and checkpoint format, hence stock 2.15's numbers. It is
written from tf.estimator's documented behaviour, not copied from it; a module over ~300 lines
because train/evaluate/predict/export share the graph set-up.
"""

import os
import time
import types

import numpy as np
import tensorflow as tf

from tpushim import _observe, _run_clock
from tpushim._estimator_api import _tfprivate
from tpushim._estimator_api._config import (
    EstimatorSpec,
    ModeKeys,
    overwrite_model_dir_and_session_config,
)

_LOSS_KEY = "loss"


def _fn_args(fn):
    import functools
    import inspect

    if isinstance(fn, functools.partial):
        return tuple(a for a in _fn_args(fn.func) if a not in fn.keywords)
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


class _DatasetInitializerHook(tf.compat.v1.train.SessionRunHook):
    """Initialises a Dataset's iterator when the session is created."""

    def __init__(self, iterator):
        self._iterator = iterator

    def begin(self):
        self._initializer = self._iterator.initializer

    def after_create_session(self, session, coord):
        del coord
        session.run(self._initializer)


class _DistributedIteratorInitializerHook(tf.compat.v1.train.SessionRunHook):
    """Initialises a strategy's input iterator (every replica's) when the session is created."""

    def __init__(self, iterator):
        self._iterator = iterator

    def begin(self):
        self._initializer = self._iterator.initialize()

    def after_create_session(self, session, coord):
        del coord
        session.run(self._initializer)


#: The attribute an estimator's public ``model_fn`` carries: the estimator it calls, so that an
#: estimator built around it knows whose it is (no closure read, no engine imported).
MODEL_FN_OWNER = "_tpushim_estimator"


def _owner(model_fn):
    """The estimator whose public ``model_fn`` this is (alone or in a ``functools.partial``),
    or None."""
    import functools

    function = model_fn.func if isinstance(model_fn, functools.partial) else model_fn
    return getattr(function, MODEL_FN_OWNER, None)


def _say_if_around_an_engine(cls, model_fn):
    """An estimator built around an engine's estimator's ``model_fn`` (alone or in a
    ``functools.partial``) is stock's: the engine's estimator says so (its
    ``_tpushim_built_around(called)``, :func:`tpushim._strategy.estimator.said_stock_around`), unless the
    one being built is an engine's too."""
    owner = _owner(model_fn)
    said = getattr(owner, "_tpushim_built_around", None)
    if said is None or getattr(cls, "_tpushim_built_around", None) is not None:
        return
    label = getattr(owner, "_tpushim_label", "the converted estimator")
    said(f"tf.estimator.Estimator(model_fn=<{label}>.model_fn)")


def _rebuilt_by_engine(cls, args, kwargs):
    """``cls(*args, **kwargs)`` built around an engine's estimator's ``model_fn``, where that
    estimator rebuilds itself with the call's arguments (its ``_tpushim_rebuilt(cls, args,
    kwargs)``: the JAX engine's, :mod:`tpushim._jax._derived`); else None (stock's is built)."""
    model_fn = kwargs.get("model_fn", args[0] if args else None)
    rebuild = getattr(_owner(model_fn), "_tpushim_rebuilt", None)
    return None if rebuild is None else rebuild(cls, args, kwargs)


def parse_input_fn_result(result):
    """(features, labels, hooks) from what an input_fn returned: a Dataset or its elements."""
    hooks = []
    if isinstance(result, tf.data.Dataset):
        iterator = tf.compat.v1.data.make_initializable_iterator(result)
        hooks.append(_DatasetInitializerHook(iterator))
        result = iterator.get_next()
    if isinstance(result, (list, tuple)):
        if len(result) != 2:
            raise ValueError("input_fn should return (features, labels) as a len 2 tuple.")
        return result[0], result[1], hooks
    return result, None, hooks


class WarmStartSettings(tuple):
    """tf.estimator.WarmStartSettings: the arguments of ``tf.compat.v1.train.warm_start``."""

    def __new__(
        cls,
        ckpt_to_initialize_from,
        vars_to_warm_start=".*",
        var_name_to_vocab_info=None,
        var_name_to_prev_var_name=None,
    ):
        return super().__new__(
            cls,
            (
                ckpt_to_initialize_from,
                vars_to_warm_start,
                var_name_to_vocab_info or {},
                var_name_to_prev_var_name or {},
            ),
        )

    ckpt_to_initialize_from = property(lambda self: self[0])


def _warm_start_settings(warm_start_from):
    if warm_start_from is None or isinstance(warm_start_from, WarmStartSettings):
        return warm_start_from
    if isinstance(warm_start_from, (str, bytes, os.PathLike)):
        path = os.fsdecode(warm_start_from)
        saved_variables = os.path.join(path, "variables", "variables")
        if tf.io.gfile.exists(saved_variables + ".index"):
            path = saved_variables  # a SavedModel: its variables
        return WarmStartSettings(path)
    raise ValueError(
        f"warm_start_from must be a string or a WarmStartSettings, instead got {type(warm_start_from)}"
    )


def check_train_steps(steps, max_steps):
    """``train()``'s step arguments, checked as stock checks them (its texts); the strategy
    engine's ``train()`` (tpushim/_strategy/) checks them here too."""
    if steps is not None and max_steps is not None:
        raise ValueError("Can not provide both steps and max_steps.")
    if steps is not None and steps <= 0:
        raise ValueError(f"Must specify steps > 0, given: {steps}")
    if max_steps is not None and max_steps <= 0:
        raise ValueError(f"Must specify max_steps > 0, given: {max_steps}")


class Estimator:
    """tf.estimator.Estimator on TensorFlow >= 2.16 (tpushim's estimator API; one local process)."""

    def __new__(cls, *args, **kwargs):
        # Built around an engine's estimator's model_fn: that engine's estimator where it
        # rebuilds itself (Python then calls its __init__ with these arguments: it keeps itself).
        rebuilt = _rebuilt_by_engine(cls, args, kwargs)
        return rebuilt if rebuilt is not None else super().__new__(cls)

    def __init__(self, model_fn, model_dir=None, config=None, params=None, warm_start_from=None):
        _say_if_around_an_engine(type(self), model_fn)
        self._config = overwrite_model_dir_and_session_config(config, model_dir)
        self._model_dir = self._config.model_dir  # made by what first writes there, as stock
        self._model_fn = model_fn
        self._params = dict(params or {})
        self._warm_start_settings = _warm_start_settings(warm_start_from)

    model_dir = property(lambda self: self._model_dir)
    config = property(lambda self: self._config)
    params = property(lambda self: dict(self._params))

    @property
    def model_fn(self):
        """The model_fn, callable as ``model_fn(features, labels, mode, config)``."""

        def public_model_fn(features, labels, mode, config):
            return self._call_model_fn(features, labels, mode, config)

        setattr(public_model_fn, MODEL_FN_OWNER, self)
        return public_model_fn

    # --- checkpoints ---------------------------------------------------------------------------

    def latest_checkpoint(self):
        """The newest checkpoint in model_dir, or None."""
        return tf.train.latest_checkpoint(self._model_dir)

    def get_variable_names(self):
        """Names of the variables in the newest checkpoint."""
        return [name for name, _ in tf.train.list_variables(self._checkpoint_or_raise())]

    def get_variable_value(self, name):
        """The value of variable ``name`` in the newest checkpoint."""
        return tf.train.load_variable(self._checkpoint_or_raise(), name)

    def _checkpoint_or_raise(self):
        path = self.latest_checkpoint()
        if not path:
            raise ValueError(f"Could not find trained model in model_dir: {self._model_dir}.")
        return path

    def eval_dir(self, name=None):
        return os.path.join(self._model_dir, "eval" if not name else "eval_" + name)

    # --- calls ---------------------------------------------------------------------------------

    def _call_input_fn(self, input_fn, mode, input_context=None):
        args = _fn_args(input_fn)
        kwargs = {}
        if "mode" in args:
            kwargs["mode"] = mode
        if "params" in args:
            kwargs["params"] = self.params
        if "config" in args:
            kwargs["config"] = self.config
        if input_context is not None and "input_context" in args:
            tf.compat.v1.logging.info(
                "The `input_fn` accepts an `input_context` which will be given by "
                "DistributionStrategy"
            )
            kwargs["input_context"] = input_context
        with tf.compat.v1.device("/cpu:0"):
            return input_fn(**kwargs)

    def _call_model_fn(self, features, labels, mode, config=None):
        args = _fn_args(self._model_fn)
        kwargs = {}
        if "labels" in args:
            kwargs["labels"] = labels
        elif labels is not None:
            raise ValueError("model_fn does not take labels, but input_fn returns labels.")
        if "mode" in args:
            kwargs["mode"] = mode
        if "params" in args:
            kwargs["params"] = self.params
        if "config" in args:
            kwargs["config"] = config or self.config
        spec = self._model_fn(features=features, **kwargs)
        if not isinstance(spec, EstimatorSpec):
            raise ValueError("model_fn should return an EstimatorSpec.")
        return spec

    def _new_graph(self, mode, input_fn):
        """Seed, global step (and its read in TRAIN), input: stock's first ops, in stock's order."""
        tf.compat.v1.random.set_random_seed(self._config.tf_random_seed)
        graph = tf.compat.v1.get_default_graph()
        tf.compat.v1.train.create_global_step(graph)
        if mode == ModeKeys.TRAIN:
            _tfprivate.get_or_create_global_step_read(graph)
        result = self._call_input_fn(input_fn, mode)
        if _observe.has_observers():  # the preflight reads what the input_fn built (no batch)
            _observe.input_called(
                _observe.InputCall(_observe.current_call(), mode, result, None, 0)
            )
        return parse_input_fn_result(result)

    def _distributed_input(self, strategy, input_fn, mode):
        """Stock's input under a strategy of several replicas: the input_fn is called once per
        input pipeline (one on one machine) with its ``InputContext``, and each replica takes
        its own element of the Dataset in turn, so the input_fn's batch is each replica's and a
        step reads replicas x batch rows."""

        def call(input_context):
            result = self._call_input_fn(input_fn, mode, input_context)
            if _observe.has_observers():
                _observe.input_called(
                    _observe.InputCall(_observe.current_call(), mode, result, None, 0)
                )
            return result

        iterator = strategy.make_input_fn_iterator(call)
        features, labels, _ = parse_input_fn_result(iterator.get_next())
        return features, labels, [_DistributedIteratorInitializerHook(iterator)]

    def _maybe_warm_start(self, checkpoint_path):
        if not checkpoint_path and self._warm_start_settings:
            tf.compat.v1.train.warm_start(*self._warm_start_settings)

    # --- train ---------------------------------------------------------------------------------

    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        """Trains as tf.estimator does; returns self."""
        # Observers (the run summary, the preflight) hear of the call and may cap its steps.
        with _observe.calling(_observe.Call("train", self, input_fn, steps, max_steps)) as call:
            if not _observe.has_observers():
                return self._train(input_fn, hooks, call.steps, call.max_steps, saving_listeners)
            clock, start = _run_clock.RunClock(), time.monotonic()
            hooks = [*(hooks or ()), clock]
            self._train(input_fn, hooks, call.steps, call.max_steps, saving_listeners)
            _observe.finished(call, time.monotonic() - start, clock.steps, clock.first_run)
            return self

    def _train(self, input_fn, hooks, steps, max_steps, saving_listeners):
        check_train_steps(steps, max_steps)
        if max_steps is not None and max_steps <= global_step_saved(self._model_dir):
            tf.compat.v1.logging.info("Skipping training since max_steps has already saved.")
            return self
        hooks = list(hooks or [])
        if steps is not None or max_steps is not None:
            hooks.append(tf.compat.v1.train.StopAtStepHook(steps, max_steps))
        strategy = self._config.train_distribute
        if replicated(strategy):
            loss = self._train_distributed(strategy, input_fn, hooks, saving_listeners)
            tf.compat.v1.logging.info("Loss for final step: %s.", loss)
            return self
        with tf.Graph().as_default() as graph, graph.device(self._config.device_fn):
            features, labels, input_hooks = self._new_graph(ModeKeys.TRAIN, input_fn)
            spec = self._call_model_fn(features, labels, ModeKeys.TRAIN)
            loss = self._train_with_spec(spec, input_hooks, hooks, saving_listeners)
        tf.compat.v1.logging.info("Loss for final step: %s.", loss)
        return self

    def _train_distributed(self, strategy, input_fn, hooks, saving_listeners):
        """Trains over the strategy's replicas as stock 2.15 did: each replica runs the model_fn
        on its own batch, a v1 optimizer's loss is divided by the replicas, and the replicas'
        gradients are summed by the strategy; the reported loss is their sum."""
        strategy.configure(self._config.session_config)
        graph = tf.Graph()
        with graph.as_default(), strategy.scope(), _tfprivate.scale_loss_for_estimator(strategy):
            tf.compat.v1.random.set_random_seed(self._config.tf_random_seed)
            features, labels, input_hooks = self._distributed_input(
                strategy, input_fn, ModeKeys.TRAIN
            )
            global_step = tf.compat.v1.train.get_or_create_global_step(graph)
            tf.compat.v1.add_to_collection(
                _tfprivate.GLOBAL_STEP_READ_KEY, strategy.extended.read_var(global_step)
            )
            grouped = strategy.extended.call_for_each_replica(
                self._call_model_fn, args=(features, labels, ModeKeys.TRAIN, self.config)
            )
            loss = strategy.reduce(_loss_reduction(graph), grouped.loss, axis=None)
            spec = EstimatorSpec(
                mode=grouped.mode,
                loss=loss,
                train_op=strategy.group(grouped.train_op),
                training_hooks=_first_replicas(strategy, grouped.training_hooks),
                training_chief_hooks=_first_replicas(strategy, grouped.training_chief_hooks),
                scaffold=_combined_scaffold(grouped.scaffold, strategy),
            )
            return self._train_with_spec(spec, input_hooks, hooks, saving_listeners)

    def _train_with_spec(self, spec, worker_hooks, hooks, saving_listeners):
        config = self._config
        if self._warm_start_settings and not self.latest_checkpoint():
            tf.compat.v1.train.warm_start(*self._warm_start_settings)
        summaries = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
        if not any(s.op.name == "loss" for s in summaries):
            tf.compat.v1.summary.scalar("loss", spec.loss)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.LOSSES, spec.loss)
        global_step = tf.compat.v1.train.get_global_step()
        worker_hooks = list(worker_hooks) + list(hooks)
        worker_hooks.append(tf.compat.v1.train.NanTensorHook(spec.loss))
        if config.log_step_count_steps is not None:
            worker_hooks.append(
                tf.compat.v1.train.LoggingTensorHook(
                    {"loss": spec.loss, "step": global_step},
                    every_n_iter=config.log_step_count_steps,
                )
            )
        worker_hooks.extend(spec.training_hooks)
        if not (spec.scaffold.saver or tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS)):
            tf.compat.v1.add_to_collection(
                tf.compat.v1.GraphKeys.SAVERS,
                tf.compat.v1.train.Saver(
                    sharded=True,
                    max_to_keep=config.keep_checkpoint_max,
                    keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
                    defer_build=True,
                    save_relative_paths=True,
                ),
            )
        chief_hooks = []
        all_hooks = worker_hooks + list(spec.training_chief_hooks)
        saver_hooks = [
            h for h in all_hooks if isinstance(h, tf.compat.v1.train.CheckpointSaverHook)
        ]
        if (config.save_checkpoints_secs or config.save_checkpoints_steps) and not saver_hooks:
            chief_hooks = [
                tf.compat.v1.train.CheckpointSaverHook(
                    self._model_dir,
                    save_secs=config.save_checkpoints_secs,
                    save_steps=config.save_checkpoints_steps,
                    scaffold=spec.scaffold,
                    save_graph_def=config.checkpoint_save_graph_def,
                )
            ]
            saver_hooks = chief_hooks[:1]
        if saving_listeners:
            if not saver_hooks:
                raise ValueError(
                    "There should be a CheckpointSaverHook to use saving_listeners. Please set "
                    "one of the RunConfig.save_checkpoints_steps or "
                    "RunConfig.save_checkpoints_secs."
                )
            for listener in saving_listeners:
                if listener not in saver_hooks[0]._listeners:
                    saver_hooks[0]._listeners.append(listener)
        with tf.compat.v1.train.MonitoredTrainingSession(
            master=config.master,
            is_chief=True,
            checkpoint_dir=self._model_dir,
            scaffold=spec.scaffold,
            hooks=worker_hooks,
            chief_only_hooks=tuple(chief_hooks) + tuple(spec.training_chief_hooks),
            save_checkpoint_secs=0,  # the saver hook above saves
            save_summaries_steps=config.save_summary_steps,
            config=config.session_config,
            max_wait_secs=config.session_creation_timeout_secs,
            log_step_count_steps=config.log_step_count_steps,
            save_graph_def=config.checkpoint_save_graph_def,
        ) as session:
            loss, steps_run = None, 0
            while not session.should_stop():
                steps_run += 1
                _, loss = session.run([spec.train_op, spec.loss])
        if steps_run == 0:
            tf.compat.v1.logging.warning(
                "Training with estimator made no steps. Perhaps input is empty or misspecified."
            )
        return loss

    # --- evaluate ------------------------------------------------------------------------------

    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
        """Evaluates as tf.estimator does; returns the metrics, ``loss`` and ``global_step``."""
        with _observe.calling(_observe.Call("evaluate", self, input_fn, steps)) as call:
            start = time.monotonic()
            results = self._evaluate(input_fn, call.steps, hooks, checkpoint_path, name)
            _observe.finished(call, time.monotonic() - start)
            return results

    def _evaluate(self, input_fn, steps, hooks, checkpoint_path, name):
        hooks = list(hooks or [])
        if steps is not None:
            if steps <= 0:
                raise ValueError(f"Must specify steps > 0, given: {steps}")
            hooks.append(_tfprivate.StopAfterNEvalsHook(num_evals=steps))
        if not checkpoint_path:
            checkpoint_path = self.latest_checkpoint()
            if not checkpoint_path:
                tf.compat.v1.logging.info(
                    "Could not find trained model in model_dir: %s, running initialization to "
                    "evaluate.",
                    self._model_dir,
                )
        with tf.Graph().as_default():
            scaffold, update_op, eval_dict, all_hooks = self._evaluate_graph(
                input_fn, hooks, checkpoint_path
            )
            results = _tfprivate.evaluate_once(
                checkpoint_path=checkpoint_path,
                master=self._config.evaluation_master,
                scaffold=scaffold,
                eval_ops=update_op,
                final_ops=eval_dict,
                hooks=all_hooks,
                config=self._config.session_config,
            )
        step = results[tf.compat.v1.GraphKeys.GLOBAL_STEP]
        _write_dict_to_summary(self.eval_dir(name), results, step)
        if checkpoint_path:
            _write_checkpoint_path_to_summary(self.eval_dir(name), checkpoint_path, step)
        return results

    def _evaluate_graph(self, input_fn, hooks, checkpoint_path):
        strategy = self._config.eval_distribute
        if replicated(strategy):
            spec, update_op, eval_dict, input_hooks = self._evaluate_distributed(strategy, input_fn)
        else:
            features, labels, input_hooks = self._new_graph(ModeKeys.EVAL, input_fn)
            spec = self._call_model_fn(features, labels, ModeKeys.EVAL)
            metrics = _with_loss_metric(spec.eval_metric_ops, tf.compat.v1.metrics.mean(spec.loss))
            update_ops, eval_dict = [], {}
            for key, (value, update) in sorted(metrics.items()):  # the same graph every time
                eval_dict[key] = value
                update_ops.append(update)
            update_op = tf.group(*update_ops) if update_ops else None
        global_step = tf.compat.v1.train.get_global_step()
        self._maybe_warm_start(checkpoint_path)
        if tf.compat.v1.GraphKeys.GLOBAL_STEP in eval_dict:
            raise ValueError(
                "Metric with name `global_step` is not allowed, because Estimator already "
                "defines a default metric with the same name."
            )
        eval_dict[tf.compat.v1.GraphKeys.GLOBAL_STEP] = global_step
        all_hooks = list(input_hooks) + list(hooks) + list(spec.evaluation_hooks)
        scaffold = spec.scaffold
        if scaffold and scaffold.local_init_op:
            _tfprivate.get_or_create_eval_step()
            scaffold = tf.compat.v1.train.Scaffold(
                local_init_op=tf.group(
                    scaffold.local_init_op, tf.compat.v1.train.Scaffold.default_local_init_op()
                ),
                copy_from_scaffold=scaffold,
            )
        return scaffold, update_op, eval_dict, all_hooks

    def _evaluate_distributed(self, strategy, input_fn):
        """Evaluation's graph over the strategy's replicas, as stock 2.15 built it: each replica
        runs the model_fn on its own batch and updates the metrics (the loss's mean over the
        replicas' losses, each divided by the replicas as training divides it)."""
        graph = tf.compat.v1.get_default_graph()
        tf.compat.v1.random.set_random_seed(self._config.tf_random_seed)
        tf.compat.v1.train.create_global_step(graph)
        features, labels, input_hooks = self._distributed_input(strategy, input_fn, ModeKeys.EVAL)
        grouped = strategy.extended.call_for_each_replica(
            self._call_model_fn, args=(features, labels, ModeKeys.EVAL, self.config)
        )
        loss = strategy.extended.call_for_each_replica(
            tf.compat.v1.metrics.mean, args=(grouped.loss,)
        )
        metrics = _with_loss_metric(grouped.eval_metric_ops, loss)
        update_ops, eval_dict = [], {}
        for key, (value, update) in sorted(metrics.items()):
            eval_dict[key] = value
            update_ops.append(strategy.group(update))
        update_op = tf.group(*update_ops) if update_ops else None
        spec = types.SimpleNamespace(
            scaffold=_combined_scaffold(grouped.scaffold, strategy),
            evaluation_hooks=_first_replicas(strategy, grouped.evaluation_hooks),
        )
        return spec, update_op, eval_dict, input_hooks

    # --- predict -------------------------------------------------------------------------------

    def predict(
        self,
        input_fn,
        predict_keys=None,
        hooks=None,
        checkpoint_path=None,
        yield_single_examples=True,
    ):
        """Yields predictions as tf.estimator does (one example at a time by default)."""
        with _observe.calling(_observe.Call("predict", self, input_fn)) as call:
            start = time.monotonic()
            yield from self._predict(
                input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples
            )
            _observe.finished(call, time.monotonic() - start)

    def _predict(self, input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples):
        if not checkpoint_path:
            checkpoint_path = self.latest_checkpoint()
        with tf.Graph().as_default():
            features, _, input_hooks = self._new_graph(ModeKeys.PREDICT, input_fn)
            spec = self._call_model_fn(features, None, ModeKeys.PREDICT)
            self._maybe_warm_start(checkpoint_path)
            predictions = _extract_keys(spec.predictions, predict_keys)
            all_hooks = list(input_hooks) + list(hooks or []) + list(spec.prediction_hooks)
            with tf.compat.v1.train.MonitoredSession(
                session_creator=tf.compat.v1.train.ChiefSessionCreator(
                    checkpoint_filename_with_path=checkpoint_path,
                    master=self._config.master,
                    scaffold=spec.scaffold,
                    config=self._config.session_config,
                ),
                hooks=all_hooks,
            ) as session:
                while not session.should_stop():
                    values = session.run(predictions)
                    if not yield_single_examples:
                        yield values
                    elif not isinstance(predictions, dict):
                        yield from values
                    else:
                        for i in range(_batch_length(values)):
                            yield {key: value[i] for key, value in values.items()}

    # --- export --------------------------------------------------------------------------------

    def export_saved_model(
        self,
        export_dir_base,
        serving_input_receiver_fn,
        assets_extra=None,
        as_text=False,
        checkpoint_path=None,
        experimental_mode=ModeKeys.PREDICT,
    ):
        """Exports the PREDICT graph as a SavedModel under a timestamped folder; returns its path."""
        from tpushim._estimator_api import _export

        return _export.export_saved_model(
            self,
            export_dir_base,
            serving_input_receiver_fn,
            assets_extra=assets_extra,
            as_text=as_text,
            checkpoint_path=checkpoint_path,
            mode=experimental_mode,
        )

    def export_savedmodel(self, export_dir_base, serving_input_receiver_fn, **kwargs):
        """The deprecated spelling of :meth:`export_saved_model`."""
        kwargs.pop("strip_default_attrs", None)
        return self.export_saved_model(export_dir_base, serving_input_receiver_fn, **kwargs)


EstimatorV2 = Estimator


def replicated(strategy):
    """Whether RunConfig's strategy has several replicas (one replica trains in one graph, with
    the numbers the strategy gives)."""
    return strategy is not None and getattr(strategy, "num_replicas_in_sync", 1) > 1


def _with_loss_metric(eval_metric_ops, loss_metric):
    metrics = dict(eval_metric_ops)
    if _LOSS_KEY in metrics:
        raise ValueError(
            f'Metric with name "{_LOSS_KEY}" is not allowed, because Estimator already '
            "defines a default metric with the same name."
        )
    metrics[_LOSS_KEY] = loss_metric
    return metrics


def _loss_reduction(graph):
    """How the replicas' losses are reduced for the loss stock reports: the optimizer's loss
    reduction where a v1 optimizer scaled the loss, else their sum."""
    if _tfprivate.loss_scaled_by_optimizer(graph):
        return tf.compat.v1.distribute.get_loss_reduction()
    return tf.distribute.ReduceOp.SUM


def _first_replicas(strategy, per_replica_hooks):
    """The first replica's copy of each hook a model_fn returned on every replica."""
    return [strategy.experimental_local_results(hook)[0] for hook in per_replica_hooks]


def _combined_scaffold(grouped_scaffold, strategy):
    """One Scaffold from every replica's (stock's way: their init, ready and local-init ops
    grouped, the first replica's saver)."""
    scaffolds = strategy.experimental_local_results(grouped_scaffold)

    def grouped(values):
        values = [v for v in values if v is not None]
        return strategy.group(values) if values else None

    def concatenated(value):
        values = tf.nest.flatten(strategy.experimental_local_results(value))
        return values[0] if len(values) == 1 else tf.concat(values, 0)

    def ready_for_local_init(scaffold):
        if scaffold.ready_for_local_init_op:
            return scaffold.ready_for_local_init_op
        return tf.compat.v1.train.Scaffold.get_or_default(
            "ready_for_local_init_op",
            tf.compat.v1.GraphKeys.READY_FOR_LOCAL_INIT_OP,
            lambda: tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables()),
        )

    ready = strategy.extended.call_for_each_replica(
        lambda scaffold: scaffold.ready_op, args=(grouped_scaffold,)
    )
    ready_for_local = strategy.extended.call_for_each_replica(
        ready_for_local_init, args=(grouped_scaffold,)
    )
    init_fns = [f for f in map(_tfprivate.scaffold_init_fn, scaffolds) if f is not None]
    savers = [s.saver for s in scaffolds if s.saver is not None]
    return tf.compat.v1.train.Scaffold(
        init_op=grouped([s.init_op for s in scaffolds]),
        ready_op=None if ready is None else concatenated(ready),
        ready_for_local_init_op=None if ready_for_local is None else concatenated(ready_for_local),
        local_init_op=grouped([s.local_init_op for s in scaffolds]),
        summary_op=grouped([s.summary_op for s in scaffolds]),
        saver=savers[0] if savers else None,
        init_feed_dict=grouped([s.init_feed_dict for s in scaffolds]),
        init_fn=init_fns[0] if init_fns else None,
    )


def global_step_saved(model_dir):
    """The global step of model_dir's newest checkpoint; 0 where it has none or names it
    otherwise (an object-based checkpoint), as stock reads it."""
    try:
        reader = tf.compat.v1.train.NewCheckpointReader(tf.train.latest_checkpoint(model_dir))
        return reader.get_tensor(tf.compat.v1.GraphKeys.GLOBAL_STEP)
    except Exception:
        return 0


def _extract_keys(predictions, predict_keys):
    if not predict_keys:
        return predictions
    if not isinstance(predictions, dict):
        raise ValueError("predict_keys argument is not valid in case of non-dict predictions.")
    chosen = {k: v for k, v in predictions.items() if k in predict_keys}
    if not chosen:
        raise ValueError(
            f"Expected to run at least one output from {predictions.keys()}, provided "
            f"{predict_keys}."
        )
    return chosen


def _batch_length(values):
    length = None
    for key, value in values.items():
        length = length or value.shape[0]
        if value.shape[0] != length:
            raise ValueError(
                f"Batch length of predictions should be same. {key} has different batch "
                "length than others."
            )
    return length


def _write_dict_to_summary(output_dir, results, global_step):
    """Scalar results as one summary event in ``output_dir`` (model_dir/eval), as stock writes."""
    from tensorflow.core.framework import summary_pb2

    summary = summary_pb2.Summary()
    for key, value in results.items():
        if key == "global_step" or value is None:
            continue
        if isinstance(value, (np.floating, float, np.integer, int)):
            summary.value.add(tag=key, simple_value=float(value))
    with tf.Graph().as_default():  # the v1 writer refuses eager mode
        writer = tf.compat.v1.summary.FileWriterCache.get(output_dir)
        writer.add_summary(summary, global_step)
        writer.flush()


def _write_checkpoint_path_to_summary(output_dir, checkpoint_path, global_step):
    """The evaluated checkpoint's path as a string summary beside the metrics, as stock writes it
    (TensorBoard and tools reading model_dir/eval see which checkpoint each evaluation used)."""
    from tensorflow.core.framework import summary_pb2

    summary = summary_pb2.Summary()
    summary.value.add(
        tag="checkpoint_path", tensor=tf.make_tensor_proto(checkpoint_path, dtype=tf.string)
    )
    with tf.Graph().as_default():
        writer = tf.compat.v1.summary.FileWriterCache.get(output_dir)
        writer.add_summary(summary, global_step)
        writer.flush()
