"""What the user pages quote of tpushim's printed text is what the code prints: the command
line's usage and options, README's troubleshooting messages, ``info``'s TPU line on a TPU VM and
the walk-through's run (conversion line, adaptations, run summary, preflight). The demo's quotes
are compared where the demo runs (test_runner), the notebooks' where they run (test_notebooks,
test_tf216_tools)."""

import json
import re

import docquotes
import procs
import pytest

import tpushim
from tpushim import _cli, _console, _detect, _versions


def test_command_line_page_shows_the_runners_usage_and_every_option():
    page = docquotes.page("docs", "reference", "command-line.md")
    parser = _cli._parser()
    usage = parser.format_usage().replace(_cli._prog, "tpushim").replace("usage: ", "", 1)
    assert docquotes.words(docquotes.blocks(page)[0]) == docquotes.words(usage)
    rows = [line for line in page.split("## Options", 1)[1].split("\n## ", 1)[0].splitlines()]
    listed = set()
    for row in rows:
        if row.startswith("| `-"):
            listed |= set(re.findall(r"`(--?[\w-]+)", row.split(" | ")[0]))
    options = {flag for action in parser._actions for flag in action.option_strings if flag != "-h"}
    options.discard("--help")
    assert options == listed, (options - listed, listed - options)


def test_readmes_troubleshooting_quotes_the_messages_tpushim_raises(monkeypatch, tmp_path):
    readme = docquotes.page("README.md")
    # "tpushim does not support TensorFlow …": nothing patched, the fix at the end.
    assert '**"tpushim does not support TensorFlow …"**' in readme
    problem = _versions.version_problem("2.21.0", "3.10.0", False, None)
    assert re.fullmatch(docquotes.line_pattern("tpushim does not support TensorFlow …"), problem)
    assert "Nothing was patched" in problem
    assert problem.split("Fix: ")[1].startswith('pip install "tf-keras~=2.21.0"')
    assert '(`pip install "tf-keras~=2.21.0"`)' in readme
    # "TensorFlow … here cannot drive it": the install it names on each release.
    assert '**"TensorFlow … here cannot drive it"**' in readme
    monkeypatch.setattr(_detect, "DEVICE_GLOBS", ())
    for version, install in (
        ("2.15.1", "Cloud TPU VM image"),
        ("2.19.0", 'pip install "tensorflow-tpu==2.19.*"'),
    ):
        with pytest.raises(tpushim.NoTPUError) as raised:
            _detect.check_tpu_support("TPUSHIM_TPU", {}, version, lambda op: False)
        message = str(raised.value)
        assert re.search(r"TensorFlow \S+ here cannot drive it", message), message
        assert install.lower() in message.lower(), message
    said = "(on TF ≤ 2.15 a Cloud TPU VM image's, on 2.16 – 2.20 `tensorflow-tpu`)"
    assert said in docquotes.words(readme)


def test_tpu_vm_page_quotes_infos_tpu_line(monkeypatch, tmp_path):
    """``tpushim info`` on a TPU VM: the line tpu-vm.md says it should print."""
    quoted = re.search(
        r"It should say `(TPU: [^`]+)`", docquotes.page("docs", "how-to", "tpu-vm.md")
    )
    (tmp_path / "accel0").write_text("")
    libtpu = tmp_path / "libtpu.so"
    libtpu.write_text("")
    monkeypatch.setattr(_detect, "DEVICE_GLOBS", (str(tmp_path / "accel*"),))
    for var in _detect.TPU_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(libtpu))
    lines = _console.format_status(tpushim.status()).splitlines()
    tpu_line = next(line for line in lines if line.startswith("TPU:"))
    printed = tpu_line.replace(str(tmp_path / "accel0"), "/dev/accel0")
    assert docquotes.words(printed) == quoted.group(1), printed


# -- the walk-through: its script, run as the page runs it --------------------------------------


def _walkthrough_script(tmp_path):
    page = docquotes.page("docs", "walkthrough.md")
    script = tmp_path / "census.py"
    script.write_text(docquotes.blocks(page, lang="python")[0])
    return page


def _result(text):
    line = next(line for line in text.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def _close(quoted, printed, tolerance):
    assert quoted.keys() == printed.keys()
    for key, value in quoted.items():
        assert abs(value - printed[key]) <= tolerance, (key, value, printed[key])


def _run(tmp_path, *argv):
    return procs.python(list(argv), cwd=tmp_path, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=900)


def _any_release(text):
    return re.sub(r"TensorFlow \d+\.\d+\.\d+", "TensorFlow X.Y.Z", text)


@pytest.mark.slow  # three TensorFlow subprocesses that train
def test_walkthrough_shows_what_its_script_prints(tmp_path):
    page = _walkthrough_script(tmp_path)
    quotes = docquotes.blocks(page)
    results = [block for block in quotes if block.startswith("RESULT ")]
    stock_quote, converted_quote = _result(results[0]), _result(results[1])

    check = _run(tmp_path, "-m", "tpushim", "check", "census.py", "work")
    # On TensorFlow >= 2.16 a TF1 program's shapes once failed the engine's input check.
    assert check.returncode == 0, check.stdout + check.stderr[-3000:]
    progress = next(b for b in quotes if b.startswith("tpushim check: running census.py"))
    report = next(b for b in quotes if b.startswith('RESULT {"acc": 0.203125'))
    assert not (tmp_path / "work").exists()  # the check wrote nothing of the script's (first)
    if _versions.uses_own_estimator():
        # The same findings, without TPUEstimator's checks (named as not run there).
        findings = [line for line in report.splitlines() if line.startswith("  ")]
        assert docquotes.in_order("\n".join(findings), check.stdout)
        assert "not run on TensorFlow" in check.stdout
    else:
        assert docquotes.unmatched(report.split("\n", 1)[1], check.stdout) == []
        assert docquotes.in_order(progress, check.stderr, timings=True), check.stderr
        # preflight.md's progress (a terminal's: one line per phase) names these phases, in order.
        how_to = docquotes.blocks(docquotes.page("docs", "how-to", "preflight.md"))[1]
        phases = [re.match(r"tpushim check: (.*?) \.\.\.", line) for line in how_to.splitlines()]
        printed = [
            p.group(1)
            for p in map(
                re.compile(r"tpushim check: (.*) \.\.\.$").match, check.stderr.splitlines()
            )
            if p
        ]
        wanted = [p.group(1).replace("train.py", "census.py") for p in phases if p]
        wanted = [w.replace("'sequential'", "'model'") for w in wanted]
        assert docquotes.in_order("\n".join(wanted), "\n".join(printed)), (wanted, printed)
    _close(_result(report), _result(check.stdout), 1e-6)

    converted = _run(tmp_path, "-m", "tpushim", "--mode", "cpu", "--summary", "census.py", "work")
    assert converted.returncode == 0, converted.stderr[-3000:]
    if _versions.uses_own_estimator():  # the page's section for TensorFlow >= 2.16
        line = docquotes.blocks(page, "On TensorFlow 2.16 and later")[0].strip()
        assert _any_release(line) in _any_release(converted.stderr).splitlines()
        _close(stock_quote, _result(converted.stdout), 1e-6)
    else:
        stock = _run(tmp_path, "census.py", "stock")
        assert stock.returncode == 0, stock.stderr[-3000:]
        _close(stock_quote, _result(stock.stdout), 1e-6)
        _close(converted_quote, _result(converted.stdout), 1e-6)
        conversion, adaptations = quotes[1], quotes[2]
        assert docquotes.unmatched(conversion, converted.stderr) == []
        printed = [
            line
            for line in converted.stderr.splitlines()
            if line.startswith("tpushim: ") and "model_to_estimator ->" not in line
        ]
        assert printed == adaptations.strip("\n").splitlines()  # each one, once per call
        summary = next(block for block in quotes if block.startswith("tpushim run summary:"))
        assert docquotes.in_order(summary, converted.stderr, timings=True), converted.stderr
