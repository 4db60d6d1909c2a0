"""``python -m tpushim check script.py``: while the script runs in cpu mode, a :class:`Recorder`
hears of every conversion and train/evaluate/predict call tpushim's estimators make (through the
one hook the core offers, :func:`tpushim._estimator.recording_to`), caps their steps so the script
finishes quickly, and afterwards reports on each conversion."""

import contextlib
import dataclasses
from typing import Optional

from tpushim import _estimator, _settings
from tpushim._preflight import graph_checks, input_checks
from tpushim._preflight.checks import check
from tpushim._preflight.report import Report, failure_as_finding


@dataclasses.dataclass
class _Recorded:
    """One conversion and the calls its estimator was given, in order."""

    estimator: object
    keras_model: object
    custom_objects: Optional[dict]
    settings: object
    calls: list = dataclasses.field(
        default_factory=list
    )  # (event, input_fn, steps the script asked)
    # Estimators made from it (tf.estimator.add_metrics): their calls are its calls.
    derived: list = dataclasses.field(default_factory=list)
    graphs_from: object = None  # the estimator whose TPU graphs are built: the last one called


class Recorder:
    """Records conversions and input_fns while a script runs in cpu mode; caps its steps."""

    MAX_TRAIN_STEPS = 3
    MAX_EVAL_STEPS = 2

    def __init__(self):
        self._conversions: list[_Recorded] = []

    # -- the hook (see tpushim._estimator.recording_to) -------------------------------------------
    def converted(self, estimator, keras_model, custom_objects, settings):
        """Told of each conversion."""
        self._conversions.append(_Recorded(estimator, keras_model, custom_objects, settings))

    def derived(self, estimator, source):
        """Told of an estimator made from another (``tf.estimator.add_metrics``): its calls are
        recorded as ``source``'s, and its TPU graphs (the added metrics included) are built."""
        owner = self._owner(source)
        if owner is not None:
            owner.derived.append(estimator)

    def _owner(self, estimator):
        return next(
            (c for c in self._conversions if c.estimator is estimator or estimator in c.derived),
            None,
        )

    def calling(self, event, estimator, input_fn, steps, max_steps):
        """Told of each train/evaluate/predict call; returns the ``(steps, max_steps)`` to run.

        Calls of an estimator converted while recording are recorded and capped: training to at
        most :attr:`MAX_TRAIN_STEPS` steps from wherever its model_dir stands (a ``max_steps``
        gives way to those steps: it counts from step 0 and could ask for the whole run, or for
        none when the model_dir is past it), evaluation to :attr:`MAX_EVAL_STEPS`. Any other
        estimator's calls run as asked.
        """
        owner = self._owner(estimator)
        if owner is None:
            return steps, max_steps
        owner.graphs_from = estimator  # add_metrics' estimator: the graphs with the added metrics
        owner.calls.append((event, input_fn, steps))
        if event == "train":
            return min(steps or self.MAX_TRAIN_STEPS, self.MAX_TRAIN_STEPS), None
        if event == "evaluate":
            return min(steps or self.MAX_EVAL_STEPS, self.MAX_EVAL_STEPS), max_steps
        return steps, max_steps

    # -- the report -----------------------------------------------------------------------------
    def report(self, num_cores=_settings.DEFAULT_CORES, tpu_graphs=True):
        """The findings for every recorded conversion; ``tpu_graphs`` also builds TPUEstimator's
        TPU graphs for its calls on a faked system of ``num_cores`` cores."""
        report = Report()
        if not self._conversions:
            report.add(
                "no-conversion",
                "error",
                "script",
                "the script made no model_to_estimator call, so there was nothing to check",
                "run the script that builds the estimator",
            )
        for recorded in self._conversions:
            self._report_one(report, recorded, num_cores, tpu_graphs)
        return report

    @staticmethod
    def _report_one(report, recorded, num_cores, tpu_graphs):
        settings = recorded.settings
        trains = [(fn, steps) for event, fn, steps in recorded.calls if event == "train"]
        train_fn, steps = trains[0] if trains else (None, None)
        with failure_as_finding(report):
            report.extend(
                check(
                    recorded.keras_model,
                    train_fn,
                    batch_size=settings.batch_size,
                    num_cores=num_cores,
                    steps=steps,
                    iterations_per_loop=settings.iterations_per_loop,
                    custom_objects=recorded.custom_objects,
                )
            )
        for event, fn, _ in recorded.calls:
            if event != "train" and fn is not train_fn:
                with failure_as_finding(report):
                    input_checks.check_input(report, fn, settings.batch_size, num_cores)
        estimator = recorded.graphs_from or recorded.estimator
        if tpu_graphs and getattr(estimator, "_tpushim_model_fn", None) is not None:
            first_calls = {}
            for event, fn, steps in recorded.calls:
                first_calls.setdefault(event, (fn, steps))
            with failure_as_finding(report):
                graph_checks.check_tpu_graphs(
                    report,
                    estimator,
                    first_calls,
                    num_cores,
                    getattr(recorded.keras_model, "name", "model"),
                )


@contextlib.contextmanager
def recording():
    """While active, tpushim's estimators report to (and are capped by) a new :class:`Recorder`,
    which it yields."""
    with _estimator.recording_to(Recorder()) as recorder:
        yield recorder
