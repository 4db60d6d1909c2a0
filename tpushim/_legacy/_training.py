"""TrainSpec, EvalSpec, train_and_evaluate (one local process), exporters and add_metrics.

As tf.estimator's local path: train to ``max_steps`` with a checkpoint listener that evaluates on
each new checkpoint (throttled by ``throttle_secs``) and once at the end, and exports after each
evaluation.
"""

import collections
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
        return self._export(estimator, export_path, checkpoint_path)


class LatestExporter(_SavedModelExporter):
    """Exports after every evaluation, keeping the newest ``exports_to_keep``."""

    def __init__(
        self, name, serving_input_receiver_fn, assets_extra=None, as_text=False, exports_to_keep=5
    ):
        super().__init__(name, serving_input_receiver_fn, assets_extra, as_text)
        if exports_to_keep is not None and exports_to_keep <= 0:
            raise ValueError("`exports_to_keep`, if provided, must be a positive number.")
        self._exports_to_keep = exports_to_keep

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        path = self._export(estimator, export_path, checkpoint_path)
        self._garbage_collect(export_path)
        return path

    def _garbage_collect(self, export_path):
        # Only the timestamped folders tf.estimator's exports make (digits), newest kept.
        if not self._exports_to_keep or not tf.io.gfile.exists(export_path):
            return
        exports = sorted(
            name for name in tf.io.gfile.listdir(export_path) if name.strip("/").isdigit()
        )
        for name in exports[: -self._exports_to_keep]:
            tf.io.gfile.rmtree(os.path.join(export_path, name))


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
      ``(the last evaluation's metrics, the export paths)``.
    """
    if os.environ.get("TF_CONFIG", "").strip() not in ("", "{}"):
        raise NotImplementedError(
            "train_and_evaluate with TF_CONFIG (a cluster) is not supported by tpushim on "
            "TensorFlow >= 2.16: run it in one process."
        )
    if not isinstance(train_spec, TrainSpec) or not isinstance(eval_spec, EvalSpec):
        raise TypeError("train_and_evaluate takes a TrainSpec and an EvalSpec.")
    listener = _EvaluateOnCheckpoints(estimator, eval_spec, train_spec.max_steps)
    estimator.train(
        train_spec.input_fn,
        max_steps=train_spec.max_steps,
        hooks=list(train_spec.hooks),
        saving_listeners=list(train_spec.saving_listeners) + [listener],
    )
    return listener.eval_result, listener.export_results


def stop_if_no_decrease_hook(*args, **kwargs):
    raise NotImplementedError(
        "tf.estimator.experimental.stop_if_no_decrease_hook is not provided by tpushim on "
        "TensorFlow >= 2.16 yet: drop it (train for max_steps) or use TensorFlow <= 2.15."
    )


def add_metrics(estimator, metric_fn):
    """An Estimator like ``estimator`` whose evaluation adds ``metric_fn``'s metrics."""
    import inspect

    from tpushim._legacy._config import ModeKeys
    from tpushim._legacy._estimator import Estimator

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

    derived = Estimator(
        model_fn=new_model_fn,
        model_dir=estimator.model_dir,
        config=estimator.config,
        warm_start_from=estimator._warm_start_settings,
    )
    from tpushim import _observe

    _observe.derived(derived, estimator, new_model_fn)  # its calls are the source's (summary)
    return derived
