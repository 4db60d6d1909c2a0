"""What both recorders of a checked script share (:class:`tpushim._preflight.recorder.Recorder`
on the TPUEstimator path, :class:`tpushim._preflight.strategy_checks.StrategyRecorder` on
tpushim's estimator API): the steps a call is capped at, the scratch model_dirs, the errors the
report explains (a refused conversion, a read of a folder left as it was), and which recorded
conversion owns an estimator's calls. One home for the caps: both report on the same short run."""

import dataclasses

import tensorflow as tf

from tpushim._preflight import model_dirs
from tpushim._preflight.report import script_frame, summary


class ScriptRecorder:
    """The part of a recorder every engine's preflight shares (an observer's
    :meth:`calling`, its scratch model_dirs); a subclass records its conversions, as
    ``_Recorded`` values holding ``conversion``, ``calls`` and ``derived``, in
    ``self._conversions``, and the conversions that raised in ``self._refusals``."""

    #: Training steps a checked call runs at most (from wherever its model_dir stands).
    MAX_TRAIN_STEPS = 3
    #: Evaluation steps a checked call runs at most.
    MAX_EVAL_STEPS = 2

    def __init__(self):
        self._conversions = []
        self._refusals = []  # (the conversion's arguments, the error it raised)
        self._dirs = model_dirs.ScratchDirs()

    def close(self):
        """Removes the scratch copies of the script's model_dirs (the report needs none)."""
        self._dirs.close()

    # -- what ended the script -------------------------------------------------------------------
    def explains(self, error):
        """True when ``error``, which ended the script, is one the preflight accounts for: a
        conversion's (:meth:`conversion_error`), or a read of a folder the check left as it
        was (:meth:`add_explained`), or a refusal of a call by tpushim (:meth:`call_refusal`).
        Its traceback is not needed."""
        return (
            self.conversion_error(error)
            or self._left_path_read(error) is not None
            or self.call_refusal(error)
        )

    def call_refusal(self, error):
        """True when ``error`` is tpushim's refusal of a train/evaluate/predict call (a
        ``ConversionError`` no conversion raised): its message says what, why and what to do,
        and that nothing was written; it would be refused on a TPU too."""
        from tpushim._errors import ConversionError

        return isinstance(error, ConversionError) and not self.conversion_error(error)

    def conversion_error(self, error):
        """True when ``error`` is one a conversion raised: the report has the one finding for it
        (what was refused or failed, why, what went unchecked); no traceback through tpushim."""
        return any(e is error for _, e in self._refusals)

    def _left_path_read(self, error):
        """The user's folder (model_dir, export) named by a file-not-found ``error``, or None."""
        if not isinstance(error, (OSError, tf.errors.NotFoundError)):
            return None
        text = str(error)
        return next((path for path in self._dirs.left if path in text), None)

    def add_explained(self, report, error):
        """Adds the finding for an :meth:`explains` error that ended the script (a conversion's
        has its own already): a read of what the checked run wrote to its scratch copy instead."""
        if self.call_refusal(error):
            # A check may have found it already, in the engine's words (sparse-feature-refused).
            if not any(str(error) in f.message for f in report.findings):
                report.add(
                    "call-refused",
                    "error",
                    script_frame(error),
                    f"tpushim refused the script's call: {summary(error, None)}",
                    "see the message",
                )
            return
        path = self._left_path_read(error)
        if path is None or self.conversion_error(error):
            return
        report.add(
            "model-dir-read",
            "warning",
            script_frame(error),
            f"the script then raised {summary(error)}: it reads {path}, which the check "
            f"leaves as it is (the checked run wrote to a scratch copy), so what the run wrote "
            f"is not there; on a real run it would be. The script's later steps were not checked",
            "nothing to change for a TPU; the other findings cover what ran before",
        )

    def add_no_conversion(self, report):
        """The finding for a script that made no ``model_to_estimator`` call at all."""
        if not self._conversions and not self._refusals:
            report.add(
                "no-conversion",
                "error",
                "script",
                "the script made no model_to_estimator call, so there was nothing to check",
                "run the script that builds the estimator",
            )

    # -- observing (see tpushim._observe) --------------------------------------------------------
    def _owner(self, estimator):
        """The recorded conversion whose estimator (or one made from it) is ``estimator``."""
        return next(
            (
                c
                for c in self._conversions
                if c.conversion.estimator is estimator or any(d is estimator for d in c.derived)
            ),
            None,
        )

    def calling(self, call):
        """Told of each train/evaluate/predict call; returns the call to run.

        Calls of an estimator converted while recording are recorded and capped: training to at
        most :attr:`MAX_TRAIN_STEPS` steps from wherever its model_dir stands (a ``max_steps``
        gives way to those steps: it counts from step 0 and could ask for the whole run, or for
        none when the model_dir is past it), evaluation to :attr:`MAX_EVAL_STEPS`. Any other
        estimator's calls run as asked.
        """
        owner = self._owner(call.estimator)
        if owner is None:
            return None
        owner.calls.append((call, None))
        if call.event == "train":
            steps = min(call.steps or self.MAX_TRAIN_STEPS, self.MAX_TRAIN_STEPS)
            return dataclasses.replace(call, steps=steps, max_steps=None)
        if call.event == "evaluate":
            return dataclasses.replace(
                call, steps=min(call.steps or self.MAX_EVAL_STEPS, self.MAX_EVAL_STEPS)
            )
        return None

    def bypassed(self, source, why):
        """A stock estimator built around a recorded one's model_fn: its calls are not tpushim's
        (nothing to cap or record; the conversion's line said it)."""

    def adapted(self, call, kind, text):
        """What tpushim adapted: the report reads the recorded input itself, not these notes."""

    def input_waited(self, call, seconds):
        """An input's wait: the preflight times the input itself (its pipeline check)."""

    def finished(self, call, seconds, steps, first_step_seconds):
        """A call returned: the report needs only what its input_fn built."""


def add_distribute_findings(report, conversion, num_cores):
    """A ``distribute-batch`` warning for each ``train_distribute`` / ``eval_distribute``
    strategy of the conversion's RunConfig: a TPU does not use it, and the batch arithmetic
    changes (:func:`tpushim._batch_math.distributed_batch`), on every engine."""
    from tpushim import _batch_math

    config = (conversion.arguments or {}).get("config")
    for key, name, replicas in _batch_math.distribute_strategies(config):
        problem, fix = _batch_math.distributed_batch(key, name, replicas, num_cores)
        report.add("distribute-batch", "warning", f"RunConfig({key}={name})", problem, fix)
