"""The run summary: what ``python -m tpushim script.py`` prints on stderr when the script ends.

The question after "did it convert?" is "what did you change, and is it faster?" (cudf.pandas'
profiler and scikit-learn-intelex's verbose mode answer the same one). Per converted estimator:
what it became and why, every adaptation tpushim made to its input or run (float64 cast, queue or
iterator fed as a Dataset, padding, re-batching, the pod input path, ...), and each call's time;
for ``train()`` its steps, steps per second and the first session run's time (on a TPU the first
loop, compilation included). Gathered as an observer (:mod:`tpushim._observe`): the core knows
nothing of it. Imports no TensorFlow.
"""

import contextlib
import sys

from tpushim import _observe

_EVENTS = ("train", "evaluate", "predict")


class _Estimator:
    def __init__(self, number, conversion):
        self.number, self.conversion = number, conversion
        self.adaptations = {}  # text -> events it happened in (insertion order kept)
        self.calls = []  # (event, seconds, steps, first_run_seconds)


class Summary:
    """Observes conversions and calls; :meth:`format` is the summary."""

    def __init__(self):
        self._estimators = []

    def _of(self, estimator):
        return next((e for e in self._estimators if e.conversion.estimator is estimator), None)

    # -- observing ------------------------------------------------------------------------------
    def converted(self, conversion):
        self._estimators.append(_Estimator(len(self._estimators) + 1, conversion))

    def adapted(self, call, kind, text):
        del kind
        record = self._of(call.estimator) if call is not None else None
        if record is not None:
            events = record.adaptations.setdefault(text, [])
            if call.event not in events:
                events.append(call.event)

    def finished(self, call, seconds, steps, first_step_seconds):
        record = self._of(call.estimator)
        if record is not None:
            record.calls.append((call.event, seconds, steps, first_step_seconds))

    # -- the summary ----------------------------------------------------------------------------
    def format(self):
        """The summary as lines of text (no trailing newline)."""
        if not self._estimators:
            return (
                "tpushim: no model_to_estimator call was converted (each returned the stock "
                "estimator, or none was made)"
            )
        lines = ["tpushim run summary:"]
        for record in self._estimators:
            lines.append(
                f"  estimator {record.number}: model_to_estimator -> "
                f"{record.conversion.description}"
            )
            if record.adaptations:
                lines.append("    what tpushim changed:")
                for text, events in record.adaptations.items():
                    lines.append(f"      - {text} [{', '.join(events)}]")
            else:
                lines.append("    what tpushim changed: nothing in the input")
            for event, seconds, steps, first in record.calls:
                lines.append("    " + _call_line(event, seconds, steps, first))
            if not record.calls:
                lines.append("    no train/evaluate/predict call")
        return "\n".join(lines)


def _call_line(event, seconds, steps, first):
    text = f"{event + '()':<11} {seconds:7.2f} s"
    if steps:
        text += f"  {steps} steps, {steps / seconds:.1f} steps/s" if seconds > 0 else ""
    if first is not None:
        text += f"  (first session run {first:.2f} s)"
    return text


@contextlib.contextmanager
def summarizing(enabled=True, stream=None):
    """Observes the block and prints the summary on ``stream`` (stderr) when it ends, however it
    ends; does nothing when not ``enabled`` (``-q`` / ``TPUSHIM_QUIET``)."""
    if not enabled:
        yield None
        return
    summary = Summary()
    try:
        with _observe.observing(summary):
            yield summary
    finally:
        print(summary.format(), file=stream or sys.stderr, flush=True)
