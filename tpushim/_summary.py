"""The run summary: what ``python -m tpushim script.py`` prints on stderr when the script ends.

The question after "did it convert?" is "what did you change, and is it faster?" (cudf.pandas'
profiler and scikit-learn-intelex's verbose mode answer the same one). Per converted estimator:
what it became and why, every adaptation tpushim made to its input or run (float64 cast, queue or
iterator fed as a Dataset, padding, re-batching, the pod input path, ...), and each call's time;
for ``train()`` its steps, steps per second and the first session run's time (on a TPU the first
loop, compilation included); a call that never returned, and what ended the run when the script
raised or exited with an error. On request (``--summary``, ``TPUSHIM_SUMMARY=1``) a table with one
row per call: the path it ran on, seconds, steps, steps/s, whether short batches were padded,
and its input wait (the seconds its session runs waited for their batches, and their share of the
call: :mod:`tpushim._input_wait`).
Gathered as an observer (:mod:`tpushim._observe`): the core knows nothing of it. Imports no
TensorFlow.
"""

import contextlib
import re
import sys
import time

from tpushim import _observe

_EVENTS = ("train", "evaluate", "predict")
#: Where calls on TensorFlow >= 2.16's estimator API run (tpushim/_estimator_api/_keras.py's
#: RUNS_ON; this module imports no TensorFlow).
ESTIMATOR_API_PATH = "CPU/GPU (tpushim's estimator API)"


class _Estimator:
    def __init__(self, number, conversion):
        self.number, self.conversion = number, conversion
        self.adaptations = {}  # text -> events it happened in (insertion order kept)
        # (event, seconds, steps, first_run_seconds, {adaptation kind: text}, input wait seconds)
        self.calls = []
        self.derived = []  # estimators made from it (tf.estimator.add_metrics): its calls too
        self.started = {}  # id(call) -> (event, start time, {kind: text}): not returned yet
        self.waits = {}  # id(call) -> seconds its input took (None: not measured), until finished

    def on_tpu(self):
        """The path its calls ran on, as the conversion line says it."""
        description = self.conversion.description
        if description.startswith("tpushim's"):  # TensorFlow >= 2.16: tpushim's estimator API
            return ESTIMATOR_API_PATH
        if "use_tpu=True" in description or "TPUStrategy" in description:
            return "TPU"
        return "TPU path on CPU"


class Summary:
    """Observes conversions and calls; :meth:`format` is the summary."""

    def __init__(self, table=False):
        self._estimators = []
        self.table = table
        self._ending = None  # (exit status, uncaught exception or None), from ended()

    def _of(self, estimator):
        return next(
            (
                e
                for e in self._estimators
                if e.conversion.estimator is estimator or any(d is estimator for d in e.derived)
            ),
            None,
        )

    # -- observing (every event of tpushim._observe) ----------------------------------------------
    def converting(self, arguments):
        """A conversion starts: it is summed up once made (:meth:`converted`)."""
        return None

    def refused(self, arguments, error):
        """A conversion raised: the error itself reaches the script (and its traceback)."""

    def bypassed(self, source, why):
        """A stock estimator around a converted one's model_fn: its calls are stock's, not in
        the summary (the conversion's line said it)."""

    def input_called(self, input_call):
        """The input_fn ran: its wait is summed by :meth:`input_waited`."""

    def converted(self, conversion):
        self._estimators.append(_Estimator(len(self._estimators) + 1, conversion))

    def derived(self, estimator, source, model_fn):
        del model_fn
        record = self._of(source)
        if record is not None:
            record.derived.append(estimator)

    def calling(self, call):
        record = self._of(call.estimator)
        if record is not None:
            record.started[id(call)] = (call.event, time.monotonic(), {})
        return None  # the call runs as it is

    def adapted(self, call, kind, text):
        record = self._of(call.estimator) if call is not None else None
        if record is not None:
            events = record.adaptations.setdefault(text, [])
            if call.event not in events:
                events.append(call.event)
            if id(call) in record.started:
                record.started[id(call)][2].setdefault(kind, text)

    def input_waited(self, call, seconds):
        record = self._of(call.estimator)
        if record is not None:
            record.waits[id(call)] = seconds

    def finished(self, call, seconds, steps, first_step_seconds):
        record = self._of(call.estimator)
        if record is not None:
            _, _, kinds = record.started.pop(id(call), (None, None, {}))
            wait = record.waits.pop(id(call), None)
            record.calls.append((call.event, seconds, steps, first_step_seconds, kinds, wait))

    def ended(self, code, uncaught=None):
        """The script ended with exit status ``code``; ``uncaught``: the exception it raised."""
        self._ending = (code, uncaught)

    # -- the summary ----------------------------------------------------------------------------
    def format(self):
        """The summary as lines of text (no trailing newline); empty when nothing was converted
        (the stock path stays silent, as the conversion lines do)."""
        if not self._estimators:
            return ""
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
            for event, seconds, steps, first, _, _ in record.calls:
                lines.append("    " + _call_line(event, seconds, steps, first))
            for event, start, _ in record.started.values():
                lines.append(f"    {event + '()':<11} {self._unfinished(time.monotonic() - start)}")
            if not record.calls and not record.started:
                lines.append("    no train/evaluate/predict call")
            if self.table and record.calls:
                lines += _table(record)
        code, uncaught = self._ending or (0, None)
        if uncaught is not None:
            lines.append(
                f"  the run ended: the script raised {type(uncaught).__name__} "
                f"(its traceback is above)"
            )
        elif code:
            lines.append(f"  the run ended: the script exited with status {code}")
        return "\n".join(lines)

    def _unfinished(self, seconds):
        """What a call that never returned says: what stopped it, as far as is known."""
        code, uncaught = self._ending or (0, None)
        if uncaught is not None:
            return f"raised {type(uncaught).__name__} after {seconds:.2f} s: the run ended there"
        if code:
            return f"did not return: the script exited with status {code} after {seconds:.2f} s"
        return f"did not return ({seconds:.2f} s): it raised, or its predictions were not all read"


#: Adaptation kinds that add padding rows: short batches, or a batch the cores do not divide.
_PADDING = {"padding": "short batches", "batch-padding": "uneven batch"}


def _padding_cell(kind, text):
    """``short batches``, or ``uneven batch 20.0%``: the share of every step the padding of a
    batch the cores do not divide wastes, as its note says it (a short batch's share depends on
    how many batches are short, which is not known)."""
    share = _SHARE.search(text) if kind == "batch-padding" else None
    return _PADDING[kind] + (f" {share.group(1)}" if share else "")


#: The wasted share in the note of a batch the cores do not divide (_batch_math.indivisible_batch).
_SHARE = re.compile(r"(\d+(?:\.\d+)?%) of every step")


def _table(record):
    """The per-call rows of ``--summary``."""
    rows = [
        ("call", "ran on", "seconds", "steps", "steps/s", "first run s", "padding", "input wait")
    ]
    for event, seconds, steps, first, kinds, wait in record.calls:
        padded = ", ".join(_padding_cell(kind, kinds[kind]) for kind in _PADDING if kind in kinds)
        rows.append(
            (
                event + "()",
                record.on_tpu(),
                f"{seconds:.2f}",
                str(steps) if steps else "-",
                f"{steps / seconds:.1f}" if steps and seconds > 0 else "-",
                f"{first:.2f}" if first is not None else "-",
                padded or "none",
                _wait_cell(wait, seconds),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "    " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows
    ]


def _wait_cell(wait, seconds):
    """``0.52 s 31%``: the seconds the call waited for its input and their share of the call;
    ``-`` where not measured (on a TPU its infeed is the TPU profiler's to show)."""
    if wait is None:
        return "-"
    share = f" {100 * wait / seconds:.0f}%" if seconds > 0 else ""
    return f"{wait:.2f} s{share}"


def _call_line(event, seconds, steps, first):
    text = f"{event + '()':<11} {seconds:7.2f} s"
    if steps:
        text += f"  {steps} steps, {steps / seconds:.1f} steps/s" if seconds > 0 else ""
    if first is not None:
        text += f"  (first session run {first:.2f} s)"
    return text


@contextlib.contextmanager
def summarizing(enabled=True, stream=None, table=False):
    """Observes the block and prints the summary on ``stream`` (stderr) when it ends, however it
    ends; does nothing when not ``enabled`` (``-q`` / ``TPUSHIM_QUIET``). ``table``: add the
    per-call table."""
    if not enabled:
        yield None
        return
    summary = Summary(table=table)
    try:
        with _observe.observing(summary):
            yield summary
    finally:
        text = summary.format()
        if text:
            print(text, file=stream or sys.stderr, flush=True)
