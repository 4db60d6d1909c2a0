"""The preflight's progress on stderr: each phase as it starts, then its time and what it found.

``python -m tpushim check`` runs for tens of seconds (the script, an XLA compile, three TPU graph
builds); a silent terminal looks hung. :func:`showing` turns the lines on for a ``with`` block;
:func:`phase` marks one step and costs nothing when they are off (``tpushim.check()`` from code).
On a terminal the line is completed in place, with colour unless ``NO_COLOR`` is set
(https://no-color.org); elsewhere (CI logs, pipes) a phase prints one line when it starts and one
when it ends.
"""

import contextlib
import contextvars
import os
import sys
import time

_CURRENT = contextvars.ContextVar("tpushim_preflight_progress", default=None)

_COLOURS = {"error": "\033[31m", "warning": "\033[33m", "ok": "\033[32m", "dim": "\033[2m"}
_RESET = "\033[0m"


class _Progress:
    def __init__(self, stream):
        self.stream = stream
        self.terminal = hasattr(stream, "isatty") and stream.isatty()
        self.colour = self.terminal and not os.environ.get("NO_COLOR")

    def paint(self, text, kind):
        return f"{_COLOURS[kind]}{text}{_RESET}" if self.colour else text

    def write(self, text):
        self.stream.write(text)
        self.stream.flush()


@contextlib.contextmanager
def showing(stream=None):
    """Shows the progress of the preflight phases run inside the block on ``stream`` (stderr)."""
    token = _CURRENT.set(_Progress(stream or sys.stderr))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _found(report, before):
    """'ok', or what the phase added to ``report``: '1 error, 2 warnings'; and its colour."""
    if report is None:
        return "done", "ok"
    added = report.findings[before:]
    counts = [
        (n, severity)
        for severity in ("error", "warning")
        if (n := sum(f.severity == severity for f in added))
    ]
    if not counts:
        return "ok", "ok"
    text = ", ".join(f"{n} {severity}{'s' * (n != 1)}" for n, severity in counts)
    return text, counts[0][1]


@contextlib.contextmanager
def phase(what, report=None, prints=False):
    """One preflight step: ``tpushim check: <what> ...`` then ``14 s, 1 error``.

    Args:
      what: the step, as people say it ("XLA compile of the training step").
      report: the report the step adds findings to, to say what it found.
      prints: the step writes output of its own (the script): its start and end get lines of
        their own, also on a terminal.
    """
    progress = _CURRENT.get()
    if progress is None:
        yield
        return
    inline = progress.terminal and not prints
    before = len(report.findings) if report is not None else 0
    progress.write(f"tpushim check: {what} ..." + ("" if inline else "\n"))
    start = time.perf_counter()
    outcome = "failed", "error"
    try:
        yield
        outcome = _found(report, before)
    finally:
        seconds = time.perf_counter() - start
        took = f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.1f} s"
        text, kind = outcome
        end = f"{progress.paint(took, 'dim')}, {progress.paint(text, kind)}"
        if inline:
            progress.write(f" {end}\n")
        else:
            progress.write(f"tpushim check: {what}: {end}\n")


def say(text):
    """One line ``tpushim check: <text>`` on the progress stream, when shown (else nothing)."""
    progress = _CURRENT.get()
    if progress is not None:
        progress.write(f"tpushim check: {text}\n")
