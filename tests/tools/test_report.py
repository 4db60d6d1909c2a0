"""The preflight's report and progress lines as people and machines read them (no TensorFlow)."""

import io
import json
import re

from tpushim._preflight import progress
from tpushim._preflight.report import Report


def report_of(*severities):
    report = Report()
    report.note_checked("conversion")
    for i, severity in enumerate(severities):
        report.add(f"code-{i}", severity, f"where {i}", f"message {i}", f"fix {i}")
    return report


def test_exit_codes_clean_blocked_and_script_raised():
    assert report_of().exit_code == 0
    assert report_of("warning", "info").exit_code == 0  # warnings do not block
    assert report_of("info", "error").exit_code == 1
    raised = report_of("warning")
    raised.add("script-raised", "error", "x.py:1 in <module>", "the script raised", "fix it")
    assert raised.exit_code == 3 and not raised.ok


def test_json_carries_its_schema_version_and_exit_code():
    data = json.loads(report_of("info", "error").to_json())
    assert data["schema_version"] == 1
    assert data["ok"] is False and data["exit_code"] == 1
    assert [f["code"] for f in data["findings"]] == ["code-0", "code-1"]  # in the order found
    assert set(data["findings"][0]) == {"code", "severity", "where", "message", "fix"}


def test_text_and_html_list_findings_by_severity():
    report = report_of("info", "warning", "error", "warning")
    text_order = re.findall(r"\] (code-\d)", str(report))
    html_order = re.findall(r"<td>(code-\d)</td>", report._repr_html_())
    assert text_order == html_order == ["code-2", "code-1", "code-3", "code-0"]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def run_phases(stream):
    report = Report()
    with progress.showing(stream):
        with progress.phase("quiet step", report):
            pass
        with progress.phase("XLA compile of the training step", report):
            report.add("xla-compile", "error", "layer 'x'", "no kernel", "replace it")
            report.add("batch-small", "warning", "input", "small", "bigger")
    with progress.phase("after the block", report):  # progress off again: nothing printed
        pass
    return stream.getvalue()


def test_progress_in_a_log_one_line_as_each_phase_starts_and_ends():
    lines = run_phases(io.StringIO()).splitlines()
    assert lines[0] == "tpushim check: quiet step ..."
    assert re.fullmatch(r"tpushim check: quiet step: \d\.\d s, ok", lines[1])
    assert lines[2] == "tpushim check: XLA compile of the training step ..."
    assert re.fullmatch(
        r"tpushim check: XLA compile of the training step: \d\.\d s, 1 error, 1 warning", lines[3]
    )
    assert len(lines) == 4 and "\033[" not in "".join(lines)


def test_progress_on_a_terminal_completes_the_line_in_colour(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = run_phases(Terminal())
    lines = out.splitlines()
    assert len(lines) == 2 and lines[1].startswith(
        "tpushim check: XLA compile of the training step ..."
    )
    assert "\033[31m1 error, 1 warning\033[0m" in lines[1] and "\033[32mok\033[0m" in lines[0]
    monkeypatch.setenv("NO_COLOR", "1")
    plain = run_phases(Terminal())
    assert "\033[" not in plain
    assert re.fullmatch(r"tpushim check: quiet step \.\.\. \d\.\d s, ok", plain.splitlines()[0])


def test_a_phase_that_raises_says_so_and_lets_the_error_through():
    stream = io.StringIO()
    try:
        with progress.showing(stream), progress.phase("graph", Report()):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert stream.getvalue().splitlines()[-1].endswith(", failed")


def test_notes_say_how_the_check_ran_in_text_and_json():
    report = report_of("warning")
    report.notes.append("model_dir /data/run1 is left as it is")
    lines = str(report).splitlines()
    assert lines[1:3] == ["checked: conversion", "note: model_dir /data/run1 is left as it is"]
    assert json.loads(report.to_json())["notes"] == ["model_dir /data/run1 is left as it is"]
    assert json.loads(report_of().to_json())["notes"] == []
