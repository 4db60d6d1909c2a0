"""TrainSpec, EvalSpec, train_and_evaluate (one local process), exporters and add_metrics.

As tf.estimator's local path: train to ``max_steps`` with a checkpoint listener that evaluates on
each new checkpoint (throttled by ``throttle_secs``) and once at the end, and exports after each
evaluation.
"""

import collections
import logging
import os

import tensorflow as tf


class TrainSpec(
    collections.namedtuple("TrainSpec", ["input_fn", "max_steps", "hooks", "saving_listeners"])
):
    """tf.estimator.TrainSpec."""

    def __new__(cls, input_fn, max_steps=None, hooks=None, saving_listeners=None):
        if not callable(input_fn):
            raise TypeError(f"`input_fn` must be callable, given: {input_fn}")
        if max_steps is not None and max_steps <= 0:
            raise ValueError(f"Must specify max_steps > 0, given: {max_steps}")
        return super().__new__(
            cls, input_fn, max_steps, tuple(hooks or ()), tuple(saving_listeners or ())
        )


class EvalSpec(
    collections.namedtuple(
        "EvalSpec",
        ["input_fn", "steps", "name", "hooks", "exporters", "start_delay_secs", "throttle_secs"],
    )
):
    """tf.estimator.EvalSpec."""

    def __new__(
        cls,
        input_fn,
        steps=100,
        name=None,
        hooks=None,
        exporters=None,
        start_delay_secs=120,
        throttle_secs=600,
    ):
        if not callable(input_fn):
            raise TypeError(f"`input_fn` must be callable, given: {input_fn}")
        if steps is not None and steps <= 0:
            raise ValueError(f"Must specify steps > 0, given: {steps}")
        if exporters is None:
            exporters = ()
        elif not isinstance(exporters, (list, tuple)):
            exporters = (exporters,)
        return super().__new__(
            cls,
            input_fn,
            steps,
            name,
            tuple(hooks or ()),
            tuple(exporters),
            start_delay_secs,
            throttle_secs,
        )


class Exporter:
    """tf.estimator.Exporter: ``name`` and ``export(estimator, export_path, checkpoint_path,
    eval_result, is_the_final_export)``."""

    @property
    def name(self):
        raise NotImplementedError

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        raise NotImplementedError


class _SavedModelExporter(Exporter):
    def __init__(self, name, serving_input_receiver_fn, assets_extra=None, as_text=False):
        self._name = name
        self._serving_input_receiver_fn = serving_input_receiver_fn
        self._assets_extra = assets_extra
        self._as_text = as_text

    @property
    def name(self):
        return self._name

    def _export(self, estimator, export_path, checkpoint_path):
        return estimator.export_saved_model(
            export_path,
            self._serving_input_receiver_fn,
            assets_extra=self._assets_extra,
            as_text=self._as_text,
            checkpoint_path=checkpoint_path,
        )


class FinalExporter(_SavedModelExporter):
    """Exports once, at the end of training (tf.estimator.FinalExporter)."""

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        if not is_the_final_export:
            return None
        tf.compat.v1.logging.info("Performing the final export in the end of training.")
        return self._export(estimator, export_path, checkpoint_path)


def _garbage_collect_exports(export_path, exports_to_keep):
    """Deletes all but the newest ``exports_to_keep`` exports in ``export_path``: only the folders
    an export makes (a 10-digit timestamp), as stock's exporters delete them."""
    if exports_to_keep is None or not tf.io.gfile.exists(export_path):
        return
    exports = sorted(
        int(name)
        for name in (n.rstrip("/") for n in tf.io.gfile.listdir(export_path))
        if len(name) == 10 and name.isdigit()
    )
    for version in exports[:-exports_to_keep]:
        path = os.path.join(export_path, str(version))
        try:
            tf.io.gfile.rmtree(path)
        except tf.errors.NotFoundError as e:
            tf.compat.v1.logging.warn("Can not delete %s recursively: %s", path, e)


class LatestExporter(_SavedModelExporter):
    """Exports after every evaluation, keeping the newest ``exports_to_keep``
    (tf.estimator.LatestExporter)."""

    def __init__(
        self, name, serving_input_receiver_fn, assets_extra=None, as_text=False, exports_to_keep=5
    ):
        super().__init__(name, serving_input_receiver_fn, assets_extra, as_text)
        if exports_to_keep is not None and exports_to_keep <= 0:
            raise ValueError("`exports_to_keep`, if provided, must be positive number")
        self._exports_to_keep = exports_to_keep

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        path = self._export(estimator, export_path, checkpoint_path)
        _garbage_collect_exports(export_path, self._exports_to_keep)
        return path


def _loss_smaller(best_eval_result, current_eval_result):
    """BestExporter's default compare_fn: True if ``current_eval_result``'s loss is smaller."""
    for name, result in (
        ("best_eval_result", best_eval_result),
        ("current_eval_result", current_eval_result),
    ):
        if not result or "loss" not in result:
            raise ValueError(f"{name} cannot be empty or no loss is found in it.")
    return best_eval_result["loss"] > current_eval_result["loss"]


class BestExporter(Exporter):
    """Exports whenever an evaluation is better than the best so far (tf.estimator.BestExporter).

    The best so far starts from the evaluations already in ``model_dir``'s event files
    (``event_file_pattern``), so a restarted job does not export a worse model; the first export
    of this exporter happens regardless, as stock's does.
    """

    def __init__(
        self,
        name="best_exporter",
        serving_input_receiver_fn=None,
        event_file_pattern="eval/*.tfevents.*",
        compare_fn=_loss_smaller,
        assets_extra=None,
        as_text=False,
        exports_to_keep=5,
    ):
        import inspect

        if compare_fn is None:
            raise ValueError("`compare_fn` must not be None.")
        args = set(inspect.signature(compare_fn).parameters)
        for required in ("best_eval_result", "current_eval_result"):
            if required not in args:
                raise ValueError(f"compare_fn ({compare_fn}) must include {required} argument.")
        unexpected = list(args - {"best_eval_result", "current_eval_result"})
        if unexpected:
            raise ValueError(
                f"compare_fn ({compare_fn}) has following not expected args: {unexpected}"
            )
        if exports_to_keep is not None and exports_to_keep <= 0:
            raise ValueError(
                f"`exports_to_keep`, if provided, must be a positive number. Got {exports_to_keep}"
            )
        self._compare_fn = compare_fn
        self._exporter = _SavedModelExporter(name, serving_input_receiver_fn, assets_extra, as_text)
        self._event_file_pattern = event_file_pattern
        self._exports_to_keep = exports_to_keep
        self._model_dir, self._best_eval_result, self._has_exported = None, None, False

    @property
    def name(self):
        return self._exporter.name

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        if self._model_dir != estimator.model_dir and self._event_file_pattern:
            tf.compat.v1.logging.info("Loading best metric from event files.")
            self._model_dir = estimator.model_dir
            self._best_eval_result = self._best_in_event_files(
                os.path.join(self._model_dir, self._event_file_pattern)
            )
        if (
            self._best_eval_result is None
            or not self._has_exported
            or self._compare_fn(
                best_eval_result=self._best_eval_result, current_eval_result=eval_result
            )
        ):
            tf.compat.v1.logging.info("Performing best model export.")
            self._best_eval_result = eval_result
            path = self._exporter._export(estimator, export_path, checkpoint_path)
            _garbage_collect_exports(export_path, self._exports_to_keep)
            self._has_exported = True
            return path
        return None

    def _best_in_event_files(self, pattern):
        best = None
        for event_file in tf.io.gfile.glob(pattern):
            for event in tf.compat.v1.train.summary_iterator(event_file):
                if not event.HasField("summary"):
                    continue
                result = {
                    value.tag: value.simple_value
                    for value in event.summary.value
                    if value.HasField("simple_value")
                }
                if result and (best is None or self._compare_fn(best, result)):
                    best = result
        return best


class _EvaluateOnCheckpoints(tf.compat.v1.train.CheckpointSaverListener):
    """Evaluates (and exports) on each new checkpoint, throttled, and at the end."""

    def __init__(self, estimator, eval_spec, max_steps):
        self._estimator, self._eval_spec, self._max_steps = estimator, eval_spec, max_steps
        self.eval_result, self.export_results, self._previous = None, [], None

    def begin(self):
        self._timer = tf.compat.v1.train.SecondOrStepTimer(every_secs=self._eval_spec.throttle_secs)
        self._first = True

    def after_save(self, session, global_step_value):
        del session
        if self._first:  # the checkpoint written at the start: nothing trained yet
            self._first = False
            return
        if self._timer.should_trigger_for_step(global_step_value):
            self._evaluate(global_step_value)

    def end(self, session, global_step_value):
        del session
        if global_step_value != self._timer.last_triggered_step():
            self._evaluate(global_step_value)

    def _evaluate(self, global_step_value):
        self._timer.update_last_triggered_step(global_step_value)
        checkpoint = self._estimator.latest_checkpoint()
        if not checkpoint or checkpoint == self._previous:
            return
        spec = self._eval_spec
        result = self._estimator.evaluate(
            spec.input_fn,
            steps=spec.steps,
            name=spec.name,
            checkpoint_path=checkpoint,
            hooks=spec.hooks,
        )
        step = result[tf.compat.v1.GraphKeys.GLOBAL_STEP]
        final = self._max_steps is not None and step >= self._max_steps
        base = os.path.join(self._estimator.model_dir, "export")
        self.export_results = [
            exporter.export(
                self._estimator, os.path.join(base, exporter.name), checkpoint, result, final
            )
            for exporter in spec.exporters
        ]
        self.eval_result, self._previous = result, checkpoint


def train_and_evaluate(estimator, train_spec, eval_spec):
    """Trains and evaluates on one machine, as tf.estimator's local path does.

    Returns:
      ``(the last evaluation's metrics, the export paths)``; None for the chief of a TF_CONFIG
      cluster, as stock's distributed path returns.
    """
    if not isinstance(train_spec, TrainSpec) or not isinstance(eval_spec, EvalSpec):
        raise TypeError("train_and_evaluate takes a TrainSpec and an EvalSpec.")
    if estimator.config.cluster_spec:
        # A cluster of one chief (RunConfig refuses any other): stock's distributed path, whose
        # chief trains while evaluation is an evaluator task's (this cluster has none).
        logging.getLogger("tpushim").warning(
            "tpushim: TF_CONFIG makes this process the chief of a cluster without an "
            "evaluator: train_and_evaluate trains and neither evaluates nor exports, as "
            "tf.estimator's does (unset TF_CONFIG to evaluate here)."
        )
        tf.compat.v1.logging.info(
            "Skip starting Tensorflow server as there is only one node in the cluster."
        )
        estimator.train(
            train_spec.input_fn,
            max_steps=train_spec.max_steps,
            hooks=list(train_spec.hooks),
            saving_listeners=list(train_spec.saving_listeners),
        )
        return None
    listener = _EvaluateOnCheckpoints(estimator, eval_spec, train_spec.max_steps)
    estimator.train(
        train_spec.input_fn,
        max_steps=train_spec.max_steps,
        hooks=list(train_spec.hooks),
        saving_listeners=list(train_spec.saving_listeners) + [listener],
    )
    return listener.eval_result, listener.export_results


def add_metrics(estimator, metric_fn):
    """An Estimator like ``estimator`` whose evaluation adds ``metric_fn``'s metrics."""
    import inspect

    from tpushim._estimator_api._config import ModeKeys
    from tpushim._estimator_api._estimator import Estimator

    allowed = {"predictions", "features", "labels", "config"}
    names = set(inspect.signature(metric_fn).parameters)
    if "predictions" not in names:
        raise ValueError(f"metric_fn ({metric_fn}) must include predictions argument.")
    if names - allowed:
        raise ValueError(
            f"metric_fn ({metric_fn}) has following not expected args: {sorted(names - allowed)}"
        )

    def new_model_fn(features, labels, mode, config):
        spec = estimator.model_fn(features, labels, mode, config)
        if mode != ModeKeys.EVAL:
            return spec
        available = {
            "predictions": spec.predictions,
            "features": features,
            "labels": labels,
            "config": config,
        }
        added = metric_fn(**{k: v for k, v in available.items() if k in names})
        return spec._replace(eval_metric_ops=dict(spec.eval_metric_ops or {}, **added))

    engine_add_metrics = getattr(estimator, "_tpushim_add_metrics", None)
    if engine_add_metrics is not None:  # an engine's estimator: it keeps the engine
        return engine_add_metrics(metric_fn, new_model_fn)

    derived = Estimator(
        model_fn=new_model_fn,
        model_dir=estimator.model_dir,
        config=estimator.config,
        warm_start_from=estimator._warm_start_settings,
    )
    from tpushim import _observe

    _observe.derived(derived, estimator, new_model_fn)  # its calls are the source's (summary)
    return derived


def make_stop_at_checkpoint_step_hook(estimator, last_step, wait_after_file_check_secs=30):
    """tf.estimator.experimental.make_stop_at_checkpoint_step_hook: in one local process (the
    chief, as stock's chief) a StopAtStepHook at ``last_step``."""
    del estimator, wait_after_file_check_secs  # a non-chief worker's waiting: no such worker here
    return tf.compat.v1.train.StopAtStepHook(last_step=last_step)
