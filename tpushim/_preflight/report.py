"""What a preflight finds and how it is shown: :class:`Finding`, :class:`Report` (text, HTML, JSON),
and the one-line descriptions of an exception that findings quote. Imports no TensorFlow."""

import contextlib
import dataclasses
import json
import os
import traceback

_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}

#: The version of :meth:`Report.to_dict`'s layout (``--json``): raised when a key changes meaning or
#: goes away; new keys may appear without a new version.
SCHEMA_VERSION = 1

#: ``python -m tpushim check``'s exit statuses (2 stays argparse's: bad options, no script).
EXIT_OK = 0  # nothing blocks a TPU (warnings allowed)
EXIT_BLOCKED = 1  # a finding of severity error: it would fail on a TPU
EXIT_SCRIPT_RAISED = 3  # the script itself raised in cpu mode: fix that first

#: The finding a script's uncaught exception becomes.
SCRIPT_RAISED = "script-raised"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One finding. ``severity``: ``error`` (fails on a TPU), ``warning`` (runs slowly on a TPU) or
    ``info`` (tpushim already takes care of it on the TPU path)."""

    code: str
    severity: str
    where: str
    message: str
    fix: str


@dataclasses.dataclass
class Report:
    """The result of a preflight check: findings, what was checked, and the verdict."""

    findings: list[Finding] = dataclasses.field(default_factory=list)
    checked: list[str] = dataclasses.field(default_factory=list)
    #: How the check ran, one line each (e.g. the scratch copy a model_dir was checked on).
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing would fail on a TPU (warnings allowed)."""
        return not any(f.severity == "error" for f in self.findings)

    @property
    def exit_code(self) -> int:
        """The command line's exit status: 0 when :attr:`ok`, 1 when a finding blocks a TPU, 3
        when the script itself raised (:data:`EXIT_SCRIPT_RAISED`)."""
        if SCRIPT_RAISED in self.codes():
            return EXIT_SCRIPT_RAISED
        return EXIT_OK if self.ok else EXIT_BLOCKED

    def codes(self) -> list[str]:
        """The findings' codes, in the order found."""
        return [f.code for f in self.findings]

    def add(self, code, severity, where, message, fix):
        """Adds a finding, unless the same one is already there."""
        finding = Finding(code, severity, where, message, fix)
        if finding not in self.findings:
            self.findings.append(finding)

    def note_checked(self, what):
        """Records that ``what`` was checked (once, however often it is)."""
        if what not in self.checked:
            self.checked.append(what)

    def extend(self, other):
        """Adds another report's findings and checks that are not already here."""
        for finding in other.findings:
            if finding not in self.findings:
                self.findings.append(finding)
        for what in other.checked:
            self.note_checked(what)

    def sorted_findings(self) -> list[Finding]:
        """The findings, errors first, then warnings, then infos (each in the order found)."""
        return sorted(self.findings, key=lambda f: _SEVERITY_ORDER[f.severity])

    def to_dict(self) -> dict:
        """The report as plain data: ``schema_version``, ``ok``, ``exit_code``, ``checked``,
        ``notes`` and ``findings`` (in the order found)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "checked": self.checked,
            "notes": self.notes,
            "findings": [dataclasses.asdict(f) for f in self.findings],
        }

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON (what ``python -m tpushim check --json`` prints)."""
        return json.dumps(self.to_dict(), indent=2)

    def _verdict(self):
        return "OK - nothing blocks a TPU" if self.ok else "FAIL - would not run on a TPU"

    def __str__(self):
        errors = sum(f.severity == "error" for f in self.findings)
        warnings = sum(f.severity == "warning" for f in self.findings)
        lines = [
            f"tpushim check: {self._verdict()} ({errors} error{'s' * (errors != 1)}, "
            f"{warnings} warning{'s' * (warnings != 1)})",
            "checked: " + ", ".join(self.checked),
            *(f"note: {note}" for note in self.notes),
        ]
        for f in self.sorted_findings():
            lines.append(f"  [{f.severity.upper()}] {f.code} at {f.where}: {f.message}")
            lines.append(f"      fix: {f.fix}")
        return "\n".join(lines)

    def _repr_html_(self):
        import html

        rows = "".join(
            f"<tr><td>{f.severity}</td><td>{html.escape(f.code)}</td><td>{html.escape(f.where)}</td>"
            f"<td>{html.escape(f.message)}</td><td>{html.escape(f.fix)}</td></tr>"
            for f in self.sorted_findings()
        )
        return (
            f"<p><b>tpushim check: {self._verdict()}</b> "
            f"(checked: {html.escape(', '.join(self.checked))})</p>"
            f"<table><tr><th>severity</th><th>finding</th><th>where</th><th>what</th><th>fix</th></tr>"
            f"{rows}</table>"
        )


def summary(exc, limit=300):
    """One informative line of an exception's text (TensorFlow's start with 'Graph execution error:'
    and end with the op that failed; the line before that says what went wrong), cut at ``limit``
    characters (None: whole)."""
    noise = (
        "File ",
        "[[",
        "Detected at node",
        "Graph execution error",
        "defined at",
        "Traceback",
        "Node: ",
    )
    lines = [line_.strip() for line_ in str(exc).split("Original stack trace for")[0].splitlines()]
    lines = [line_ for line_ in lines if line_ and not line_.startswith(noise)]
    return f"{type(exc).__name__}: {lines[-1][:limit] if lines else ''}"


def last_frame(exc):
    """'file:line in function' of the innermost frame an exception went through."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown location"
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def script_frame(exc):
    """'file:line in function' of the innermost frame an exception went through outside tpushim
    and the installed packages and standard library (the script's call), else :func:`last_frame`."""
    import sysconfig

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the tpushim package
    paths = sysconfig.get_paths()
    libraries = {os.path.abspath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = os.path.abspath(frame.filename)
        if not any(path.startswith(folder + os.sep) for folder in (here, *libraries)):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return last_frame(exc)


@contextlib.contextmanager
def failure_as_finding(report):
    """A check that itself fails becomes an error finding naming where; the other checks go on."""
    try:
        yield
    except Exception as e:
        report.add(
            "preflight-failed",
            "error",
            last_frame(e),
            f"the preflight could not finish a check: {summary(e)}",
            "the findings above still hold; please report this with the script to tpushim",
        )
