"""``python -m tpushim check script.py``: while the script runs in cpu mode, a :class:`Recorder`
observes (:mod:`tpushim._observe`) every conversion and train/evaluate/predict call tpushim's
estimators make, caps their steps so the script finishes quickly, keeps what each input_fn call
built, and afterwards reports on each conversion. It never calls an input_fn itself: the script's
own calls are all there are, as with stock. Each conversion's model_dir (and each export) is
moved to a scratch copy first (:mod:`~tpushim._preflight.model_dirs`): nothing of the user's is
written. A conversion tpushim refuses is reported as :func:`tpushim.check` reports it."""

import contextlib
import dataclasses

import tensorflow as tf

from tpushim import _engines, _input_fn, _observe, _settings, _shapes
from tpushim._errors import TPUShimError
from tpushim._preflight import (
    graph_checks,
    input_checks,
    model_checks,
    pod_checks,
    progress,
    script_recorder,
    strategy_checks,
)
from tpushim._preflight.checks import check_model
from tpushim._preflight.report import Report, failure_as_finding, script_frame, summary

_UNKNOWN = tf.data.UNKNOWN_CARDINALITY


@dataclasses.dataclass
class _Recorded:
    """One conversion and what its estimator was asked to do, in order.

    ``calls``: ``(call as the script made it, the InputCall its input_fn made or None)``;
    ``pod_inputs``: ``{index in calls: the pipeline as a pod would read it}``
    (:func:`tpushim._pods.analyse`).
    """

    conversion: _observe.Conversion
    calls: list = dataclasses.field(default_factory=list)
    # Estimators made from it (tf.estimator.add_metrics): their calls are its calls.
    derived: list = dataclasses.field(default_factory=list)
    pod_inputs: dict = dataclasses.field(default_factory=dict)

    def first(self, event):
        """The first ``(call, input_call)`` of ``event``, or None."""
        return next(((c, i) for c, i in self.calls if c.event == event), None)


class Recorder(script_recorder.ScriptRecorder):
    """Records conversions and input_fn calls while a script runs in cpu mode; caps its steps
    (:class:`tpushim._preflight.script_recorder.ScriptRecorder`)."""

    def __init__(self):
        super().__init__()
        self._conversions: list[_Recorded] = []
        self._refusal_settings: dict = {}  # id(error) -> the settings its conversion ran with

    def graph_text_left_out(self):
        """:meth:`~tpushim._preflight.model_dirs.ScratchDirs.graph_text_left_out` of the scratch
        model_dirs."""
        return self._dirs.graph_text_left_out()

    # -- observing (see tpushim._observe) ---------------------------------------------------------
    def converting(self, arguments):
        """Before each conversion: its model_dir replaced by a scratch copy (the same one for
        every conversion naming it), in both places a call may name it."""
        # Stock refuses any other config, and two model_dirs, before writing anything.
        return self._dirs.conversion_arguments(arguments, tf.estimator.RunConfig)

    def refused(self, arguments, error):
        """Told of a conversion that raised: reported as :func:`tpushim.check` reports it (under
        the settings the conversion ran with: they choose the engine)."""
        from tpushim import _patch

        self._refusals.append((arguments, error))
        self._refusal_settings[id(error)] = _patch.current_settings()

    def converted(self, conversion):
        """Told of each conversion."""
        self._dirs.redirect_exports(conversion.estimator)
        if _on_strategy_engine(conversion):
            # The engine compiles its step with XLA before it trains off a TPU, and an op XLA
            # cannot compile would end the script there: the report compiles that step for the
            # cores checked (naming the layer) and the script runs on to its other calls.
            estimator = conversion.estimator  # its plan is frozen: replaced by a changed copy
            estimator._tpushim_plan = dataclasses.replace(
                estimator._tpushim_plan, jit_compile=False
            )
        self._conversions.append(_Recorded(conversion))

    def derived(self, estimator, source, model_fn):
        """Told of an estimator made from another (``tf.estimator.add_metrics``): its calls are
        recorded and capped as ``source``'s, and the TPU graphs are built with its model_fn
        (which wraps the conversion's: the added metrics included)."""
        owner = self._owner(source)
        if owner is not None:
            self._dirs.redirect_exports(estimator)
            owner.derived.append(estimator)
            owner.conversion = dataclasses.replace(owner.conversion, model_fn=model_fn)

    def input_called(self, input_call):
        """Keeps what the input_fn of a recorded call built (its first call per estimator call).

        An evaluation's input is measured now, while its graph can still take the ops that
        measure it (the estimator finalizes it next), from the graph alone: a TPU evaluation
        needs its length, and the replay of it in the TPU graph check reproduces that length."""
        owner = self._owner(input_call.call.estimator) if input_call.call else None
        if owner is None:
            return
        if _on_strategy_engine(owner.conversion):  # read when reported (strategy_checks)
            for i, (call, recorded) in enumerate(owner.calls):
                if recorded is None and call.input_fn is input_call.call.input_fn:
                    owner.calls[i] = (call, input_call)
                    return
            return
        if input_call.mode == "eval" and input_call.facts.examples is None:
            with contextlib.suppress(Exception):  # its input checks report what went wrong
                facts = _input_fn.read_facts(input_call.result, count=True, count_unknown=False)
                if facts.examples is None and _input_fn.cardinality(input_call.result) == _UNKNOWN:
                    # Ends, at a length only reading it would tell (text files, filter): a TPU
                    # would count it so; the replay holds one global batch.
                    size = input_call.global_batch
                    facts = dataclasses.replace(facts, batches=1, examples=size)
                input_call = dataclasses.replace(input_call, facts=facts)
        for i, (call, recorded) in enumerate(owner.calls):
            if recorded is None and call.input_fn is input_call.call.input_fn:
                owner.calls[i] = (call, input_call)
                # Read now too: how a pod's hosts would read it (reading adds ops to the graph).
                with contextlib.suppress(Exception):  # its input checks report what went wrong
                    owner.pod_inputs[i] = pod_checks.analyse(
                        input_call, owner.conversion.settings.pod_input
                    )
                return

    # -- the report -----------------------------------------------------------------------------
    def report(self, num_cores=_settings.DEFAULT_CORES, tpu_graphs=True):
        """The findings for every recorded conversion; ``tpu_graphs`` also builds TPUEstimator's
        TPU graphs for its calls on a faked system of ``num_cores`` cores."""
        report = Report(notes=list(self._dirs.notes))
        for arguments, error in self._refusals:
            self._report_refusal(report, arguments, error)
        self.add_no_conversion(report)
        for recorded in self._conversions:
            self._report_one(report, recorded, num_cores, tpu_graphs)
        return report

    def _report_refusal(self, report, arguments, error):
        """A refused conversion: the finding :func:`tpushim.check` gives the model (the same
        checks, run again), else the error itself; either says what went unchecked."""
        unchecked = (
            " Not checked, as tpushim {} this model_to_estimator call: the script's input "
            "pipeline, the XLA compile of its training step and its TPU graphs."
        )

        def and_unchecked(message, refused="refused"):
            return message.rstrip(".") + "." + unchecked.format(refused)

        keras_model = arguments.get("keras_model")
        before = len(report.findings)
        if keras_model is not None:
            with failure_as_finding(report):
                model_checks.check_conversion(report, keras_model, arguments.get("custom_objects"))
        found = [f for f in report.findings[before:] if f.code.startswith("unconvertible-")]
        settings = self._refusal_settings.get(id(error))
        if (
            not found
            and keras_model is not None
            and settings is not None
            and _engines.select(settings)[0].compiles_own_step
        ):  # what that engine refuses, as tpushim.check says it
            with failure_as_finding(report):
                strategy_checks.strategy_plan(
                    report, keras_model, arguments.get("custom_objects"), settings
                )
            found = [f for f in report.findings[before:] if f.code == "strategy-engine-refuses"]
        if found:
            report.findings[report.findings.index(found[0])] = dataclasses.replace(
                found[0], message=and_unchecked(found[0].message)
            )
            return
        del report.findings[before:]  # the checks passed: the refusal came from elsewhere
        report.note_checked("conversion")
        where = f"model_to_estimator call at {script_frame(error)}"
        if isinstance(error, (TPUShimError, ValueError)):
            report.add(
                "conversion-refused",
                "error",
                where,
                and_unchecked(
                    f"tpushim refused the conversion: {type(error).__name__}: "
                    f"{self._dirs.as_the_users(str(error))}"
                ),
                "see the message",
            )
        else:
            report.add(
                "conversion-failed",
                "error",
                where,
                and_unchecked(
                    f"model_to_estimator raised {self._dirs.as_the_users(summary(error, None))} "
                    f"while tpushim converted the model",
                    "could not convert",
                ),
                "run the script with --mode cpu to reproduce it, with its traceback",
            )

    @staticmethod
    def _report_one(report, recorded, num_cores, tpu_graphs):
        conversion = recorded.conversion
        settings = conversion.settings
        script_recorder.add_distribute_findings(report, conversion, num_cores)
        if _on_strategy_engine(conversion):
            _report_strategy(report, recorded, num_cores)
            return
        model_inputs = _shapes.ModelInputs.of(conversion.keras_model)
        train = recorded.first("train")
        batch = None
        # The host-only-ops check reads the ops the TPU train graph's model_fn makes, where that
        # graph is built: one build of the model_fn for training instead of two.
        host_only_later = []
        with failure_as_finding(report):
            if train is not None and train[1] is not None:
                with progress.phase("input pipeline of train()", report):
                    batch = input_checks.check_recorded(
                        report,
                        train[0].input_fn,
                        train[1],
                        settings.batch_size,
                        num_cores,
                        model_inputs,
                    )
                input_checks.check_sparse_features(
                    report,
                    conversion.keras_model,
                    input_checks._element_spec(train[1].result),
                    "tpuestimator",
                )
            check_model(
                report,
                conversion.keras_model,
                batch,
                settings.batch_size,
                num_cores,
                train[0].steps if train else None,
                settings.iterations_per_loop,
                conversion.arguments.get("custom_objects"),
                host_only_later=host_only_later if tpu_graphs else None,
            )
        for call, input_call in recorded.calls:
            if input_call is not None and (train is None or call.input_fn is not train[0].input_fn):
                with (
                    progress.phase(f"input pipeline of {call.event}()", report),
                    failure_as_finding(report),
                ):
                    input_checks.check_recorded(
                        report,
                        call.input_fn,
                        input_call,
                        settings.batch_size,
                        num_cores,
                        model_inputs,
                    )
        pod_checks.check_pod_inputs(report, recorded, num_cores)
        train_ops = []
        # train() is refused before its graph is built (the finding says why): nothing to build
        if tpu_graphs and "sparse-feature-refused" not in report.codes():
            first_calls = {}
            for call, input_call in recorded.calls:
                if input_call is not None:
                    first_calls.setdefault(call.event, (call, input_call))
            with failure_as_finding(report):
                graph_checks.check_tpu_graphs(
                    report,
                    conversion,
                    first_calls,
                    num_cores,
                    getattr(conversion.keras_model, "name", "model"),
                    train_ops=train_ops if host_only_later else None,
                )
        for host_only in host_only_later:  # built here where the TPU train graph did not build it
            with failure_as_finding(report):
                host_only(train_ops[0] if train_ops else None)


def _report_strategy(report, recorded, num_cores):
    """A conversion to the strategy engine: the checks :func:`tpushim.check` runs on its model
    and input, on what the script's input_fns built -- each call's input (dtypes, static shapes,
    pipeline ops, the batch against the cores), the model's conversion, host-only ops and the
    engine's training step compiled with XLA for ``num_cores`` replicas on the first training
    input. TPUEstimator's TPU graphs are not this engine's TPU path: a note says so."""
    conversion = recorded.conversion
    settings = conversion.settings
    keras_model = conversion.keras_model
    name = getattr(keras_model, "name", "model")
    report.notes.append(
        f"model {name!r} was converted to the strategy engine "
        f"({_engines.choose(settings)[1]}): its input and its training step are checked as "
        f"tpushim.check(model, input_fn) checks them; TPUEstimator's TPU graphs (not that "
        f"engine's TPU path) and how a pod's hosts would read the input were not checked"
    )
    model_inputs = _shapes.ModelInputs.of(keras_model)
    train, train_batch = recorded.first("train"), None
    for call, input_call in recorded.calls:
        if input_call is None:
            continue
        with (
            progress.phase(f"input pipeline of {call.event}()", report),
            failure_as_finding(report),
        ):
            read = strategy_checks.read_strategy_input(input_call)
            batch = strategy_checks._check_input(
                report, call, read, settings.batch_size, num_cores, model_inputs
            )
            if train is not None and call is train[0]:
                train_batch = batch
                input_checks.check_sparse_features(
                    report, keras_model, strategy_checks._element_spec(read.result), "strategy"
                )
    with failure_as_finding(report):
        check_model(
            report,
            keras_model,
            train_batch,
            settings.batch_size,
            num_cores,
            train[0].steps if train else None,
            settings.iterations_per_loop,
            conversion.arguments.get("custom_objects"),
            settings=settings,
        )


def _on_strategy_engine(conversion):
    """True when the conversion made the strategy engine's estimator (``engine='strategy'``)."""
    from tpushim._strategy import estimator as _strategy_estimator

    return isinstance(conversion.estimator, _strategy_estimator.StrategyEstimator)


@contextlib.contextmanager
def recording():
    """While active, tpushim's estimators report to (and are capped by) a new :class:`Recorder`,
    which it yields."""
    with (
        _observe.observing(Recorder()) as recorder,
        contextlib.closing(recorder),
        recorder.graph_text_left_out(),
    ):
        yield recorder
