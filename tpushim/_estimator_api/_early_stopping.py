"""tf.estimator.experimental's early-stopping hooks (TensorFlow >= 2.16, tpushim's estimator API).

As stock 2.15: a hook checks, every ``run_every_secs`` seconds or ``run_every_steps`` steps, a
predicate over the evaluations written to the estimator's eval dir (its event files: what
``evaluate`` and ``train_and_evaluate`` write), and when it holds, sets the graph's
``signal_early_stopping/STOP`` variable (so it is in the checkpoint, as stock's) and stops training.
One local process is always the chief, so the chief's hook is the one made.
"""

import collections
import operator
import os

import tensorflow as tf

_EVENT_FILE_GLOB_PATTERN = "events.out.tfevents.*"


def read_eval_metrics(eval_dir):
    """``{global_step: {metric: value}}`` from the scalar summaries in ``eval_dir``, by step."""
    by_step = collections.defaultdict(dict)
    if tf.io.gfile.exists(eval_dir):
        for event_file in tf.io.gfile.glob(os.path.join(eval_dir, _EVENT_FILE_GLOB_PATTERN)):
            try:
                for event in tf.compat.v1.train.summary_iterator(event_file):
                    if not event.HasField("summary"):
                        continue
                    metrics = {
                        v.tag: v.simple_value
                        for v in event.summary.value
                        if v.HasField("simple_value")
                    }
                    if metrics:
                        by_step[event.step].update(metrics)
            except tf.errors.DataLossError as e:
                tf.compat.v1.logging.warning(
                    "Skipping rest of the file due to encountering data corruption error; file "
                    "path: %s; original error raised by `tf.train.summary_iterator`: %s",
                    event_file,
                    e,
                )
    return collections.OrderedDict(sorted(by_step.items()))


def _stop_variable():
    with tf.compat.v1.variable_scope(
        "signal_early_stopping", values=[], reuse=tf.compat.v1.AUTO_REUSE
    ):
        return tf.compat.v1.get_variable(
            name="STOP",
            shape=[],
            dtype=tf.bool,
            initializer=tf.compat.v1.initializers.constant(False),
            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES],
            trainable=False,
        )


class _StopOnPredicateHook(tf.compat.v1.train.SessionRunHook):
    """Stops training when ``should_stop_fn()`` holds, checked on a timer."""

    def __init__(self, should_stop_fn, run_every_secs=60, run_every_steps=None):
        if not callable(should_stop_fn):
            raise TypeError("`should_stop_fn` must be callable.")
        self._should_stop_fn = should_stop_fn
        self._timer = tf.compat.v1.train.SecondOrStepTimer(
            every_secs=run_every_secs, every_steps=run_every_steps
        )

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        self._stop_op = tf.compat.v1.assign(_stop_variable(), True)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        step = run_values.results
        if self._timer.should_trigger_for_step(step):
            self._timer.update_last_triggered_step(step)
            if self._should_stop_fn():
                tf.compat.v1.logging.info("Requesting early stopping at global step %d", step)
                run_context.session.run(self._stop_op)
                run_context.request_stop()


def make_early_stopping_hook(estimator, should_stop_fn, run_every_secs=60, run_every_steps=None):
    """A hook that stops ``estimator``'s training when ``should_stop_fn()`` returns True."""
    from tpushim._estimator_api._estimator import Estimator

    if not isinstance(estimator, Estimator):
        raise TypeError(
            f"`estimator` must have type `tf.estimator.Estimator`. Got: {type(estimator)}"
        )
    if run_every_secs is not None and run_every_steps is not None:
        raise ValueError("Only one of `run_every_secs` and `run_every_steps` must be set.")
    return _StopOnPredicateHook(should_stop_fn, run_every_secs, run_every_steps)


def _threshold_hook(estimator, metric_name, threshold, higher, eval_dir, min_steps, secs, steps):
    eval_dir = eval_dir or estimator.eval_dir()
    better = operator.gt if higher else operator.lt

    def crossed():
        for step, metrics in read_eval_metrics(eval_dir).items():
            if step < min_steps:
                continue
            value = metrics[metric_name]
            if better(value, threshold):
                tf.compat.v1.logging.info(
                    'At step %s, metric "%s" has value %s which is %s the configured threshold '
                    "(%s) for early stopping.",
                    step,
                    metric_name,
                    value,
                    "greater than" if higher else "less than",
                    threshold,
                )
                return True
        return False

    return make_early_stopping_hook(estimator, crossed, secs, steps)


def _no_improvement_hook(
    estimator, metric_name, max_steps, higher, eval_dir, min_steps, secs, steps
):
    eval_dir = eval_dir or estimator.eval_dir()
    better = operator.gt if higher else operator.lt

    def stalled():
        best, best_step = None, None
        for step, metrics in read_eval_metrics(eval_dir).items():
            if step < min_steps:
                continue
            value = metrics[metric_name]
            if best is None or better(value, best):
                best, best_step = value, step
            if step - best_step >= max_steps:
                tf.compat.v1.logging.info(
                    'No %s in metric "%s" for %s steps, which is greater than or equal to max '
                    "steps (%s) configured for early stopping.",
                    "increase" if higher else "decrease",
                    metric_name,
                    step - best_step,
                    max_steps,
                )
                return True
        return False

    return make_early_stopping_hook(estimator, stalled, secs, steps)


def stop_if_higher_hook(
    estimator,
    metric_name,
    threshold,
    eval_dir=None,
    min_steps=0,
    run_every_secs=60,
    run_every_steps=None,
):
    """Stops training once an evaluation's ``metric_name`` is above ``threshold``."""
    return _threshold_hook(
        estimator,
        metric_name,
        threshold,
        True,
        eval_dir,
        min_steps,
        run_every_secs,
        run_every_steps,
    )


def stop_if_lower_hook(
    estimator,
    metric_name,
    threshold,
    eval_dir=None,
    min_steps=0,
    run_every_secs=60,
    run_every_steps=None,
):
    """Stops training once an evaluation's ``metric_name`` is below ``threshold``."""
    return _threshold_hook(
        estimator,
        metric_name,
        threshold,
        False,
        eval_dir,
        min_steps,
        run_every_secs,
        run_every_steps,
    )


def stop_if_no_increase_hook(
    estimator,
    metric_name,
    max_steps_without_increase,
    eval_dir=None,
    min_steps=0,
    run_every_secs=60,
    run_every_steps=None,
):
    """Stops training once ``metric_name`` has not increased for that many steps."""
    return _no_improvement_hook(
        estimator,
        metric_name,
        max_steps_without_increase,
        True,
        eval_dir,
        min_steps,
        run_every_secs,
        run_every_steps,
    )


def stop_if_no_decrease_hook(
    estimator,
    metric_name,
    max_steps_without_decrease,
    eval_dir=None,
    min_steps=0,
    run_every_secs=60,
    run_every_steps=None,
):
    """Stops training once ``metric_name`` has not decreased for that many steps."""
    return _no_improvement_hook(
        estimator,
        metric_name,
        max_steps_without_decrease,
        False,
        eval_dir,
        min_steps,
        run_every_secs,
        run_every_steps,
    )
