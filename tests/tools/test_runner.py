"""``python -m tpushim``: scripts and modules run exactly as ``python`` runs them, in real subprocesses."""

import json
import logging
import os
import re
import sys
import textwrap

import docquotes
import procs
import pytest

import tpushim
from tpushim import _cli, _console, _log, _settings, _versions

PROBE = """\
import json, sys
import __main__
import tpushim
status = tpushim.status()
print(json.dumps({
    "argv": sys.argv, "name": __name__, "path0": sys.path[0], "file": __file__,
    "main_is_us": __main__.__dict__ is globals(), "patched": tpushim.is_patched(),
    "mode": [status["mode"], status["mode_source"]], "tf": "tensorflow" in sys.modules}))
"""


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def probe(proc):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_script_sees_what_python_shows_it(tmp_path):
    write(tmp_path / "sub" / "prog.py", PROBE)
    script_args = ["sub/prog.py", "a", "--mode", "x", "-m", "y", "--", "--help"]
    direct = probe(procs.python(script_args, cwd=tmp_path))
    shimmed = probe(procs.python(["-m", "tpushim", "--mode", "cpu", *script_args], cwd=tmp_path))
    for key in ("argv", "name", "path0", "file", "main_is_us"):
        assert shimmed[key] == direct[key], key
    assert shimmed["argv"] == script_args  # options after the script are the script's
    assert shimmed["name"] == "__main__" and shimmed["main_is_us"]
    assert shimmed["path0"] == str((tmp_path / "sub").resolve())
    assert shimmed["patched"] and not direct["patched"]
    assert shimmed["mode"] == ["cpu", "argument"]
    assert not shimmed["tf"]  # the runner imports no TensorFlow


@pytest.mark.parametrize(
    "body, code",
    [
        ("import sys; sys.exit(3)", 3),
        ("raise SystemExit('bye: a message')", 1),
        ("def inner():\n    raise ValueError('boom')\ninner()", 1),
        ("x = (\n", 1),  # a SyntaxError in the script
    ],
)
def test_exit_status_and_traceback_as_python_gives_them(tmp_path, body, code):
    write(tmp_path / "fails.py", body + "\n")
    direct = procs.python(["fails.py"], cwd=tmp_path)
    shimmed = procs.python(["-m", "tpushim", "fails.py"], cwd=tmp_path)
    assert direct.returncode == code
    assert shimmed.returncode == code
    assert shimmed.stderr == direct.stderr  # the same traceback: no runner or runpy frames
    # No frame of tpushim's own (its package folder, not the word: a venv may be named tpushim).
    assert os.path.dirname(tpushim.__file__) not in shimmed.stderr


def test_module_runs_as_python_dash_m_runs_it(tmp_path):
    write(tmp_path / "pkg" / "__init__.py", "")
    write(
        tmp_path / "pkg" / "mod.py",
        """\
        import json, sys
        print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0],
                          "spec": __spec__.name, "tf": "tensorflow" in sys.modules}))
        raise SystemExit(4)
        """,
    )
    direct = procs.python(["-m", "pkg.mod", "q", "-x"], cwd=tmp_path)
    shimmed = procs.python(
        ["-m", "tpushim", "--batch-size", "64", "-m", "pkg.mod", "q", "-x"], cwd=tmp_path
    )
    assert direct.returncode == shimmed.returncode == 4
    assert json.loads(shimmed.stdout) == json.loads(direct.stdout)
    assert json.loads(shimmed.stdout)["argv"] == [str(tmp_path / "pkg" / "mod.py"), "q", "-x"]


@pytest.mark.parametrize(
    "target, raises",
    [("lg.py", False), ("folder", False), ("-m lgmod", False), ("-m lgmod", True)],
    ids=["script", "folder", "module", "module-raises"],
)
def test_main_kept_leaves_the_scripts_globals_for_the_check(tmp_path, monkeypatch, target, raises):
    # The check's clone of a Lambda looks its globals up in sys.modules["__main__"] after the
    # script ended: the script's own namespace (runpy's temporary module's for -m and folders),
    # also where it raised; python's __main__ comes back after.
    from tpushim import _launcher

    body = "SCALE = 2.0\ndef scaled(t):\n    return t * SCALE\n"
    body += "raise RuntimeError('late')\n" if raises else ""
    for path in ("lg.py", "folder/__main__.py", "lgmod.py"):
        write(tmp_path / path, body)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.delitem(sys.modules, "lgmod", raising=False)
    main = sys.modules["__main__"]
    with _launcher.main_kept():
        if target.startswith("-m "):
            code, exc = _launcher.run_module(target[3:], [], reported=lambda e: True)
        else:
            code, exc = _launcher.run_script(target, [], reported=lambda e: True)
        assert (code, type(exc)) == ((1, RuntimeError) if raises else (0, type(None)))
        kept = sys.modules["__main__"]
        assert kept is not main and kept.__name__ == "__main__"
        assert kept.SCALE == 2.0 and kept.scaled(3.0) == 6.0
    assert sys.modules["__main__"] is main
    assert _launcher.run_script("lg.py", [], reported=lambda e: True)[0] == (1 if raises else 0)
    assert sys.modules["__main__"] is main  # outside main_kept, as python -m tpushim runs


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.py", "--flag"], "can't open file 'missing.py'"),
        (["-m", "no_such_module_tpushim"], "No module named 'no_such_module_tpushim'"),
        ([], "give a script, -m MODULE, or a command"),
        (["--mode", "sideways", "x.py"], "mode='sideways' is not a valid tpushim mode"),
        (["--batch-size", "0", "info"], "batch_size must be a positive integer"),
        (["-m"], "argument -m: expected one argument"),
        (["check"], "give the script (or -m MODULE) to check"),
        (["check", "--cores", "4", "missing.py"], "check: can't open file 'missing.py'"),
    ],
)
def test_usage_errors_exit_2_without_traceback(tmp_path, args, message):
    proc = procs.python(["-m", "tpushim", *args], cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_environment_stops_before_the_script_runs(tmp_path):
    write(tmp_path / "prog.py", "print('RAN')\n")
    proc = procs.python(
        ["-m", "tpushim", "prog.py"], cwd=tmp_path, env={"TPUSHIM_BATCH_SIZE": "abc"}
    )
    assert proc.returncode == 2
    assert "TPUSHIM_BATCH_SIZE='abc'" in proc.stderr and "Traceback" not in proc.stderr
    assert "RAN" not in proc.stdout


def test_help_explains_modes_variables_and_commands(tmp_path):
    proc = procs.python(["-m", "tpushim", "--help"], cwd=tmp_path)
    assert proc.returncode == 0
    for text in (
        "SCRIPT [ARGS...]",
        "-m MODULE",
        "info",
        "demo",
        "--mode",
        "--tpu",
        "--batch-size",
        "--iterations-per-loop",
        "auto",
        "cpu",
        "off",
        "TPUSHIM_MODE",
        "TPUSHIM_TPU",
        "TPUSHIM_BATCH_SIZE",
        "TPUSHIM_ITERATIONS_PER_LOOP",
        "TPUSHIM_AUTOPATCH",
        "kill switch",
        "belongs to it",
    ):
        assert text in proc.stdout, text
    # What cpu mode runs, true on every TensorFlow (--help imports none to find out).
    assert (
        "\n  cpu    the TPU code path on CPU/GPU, to try a conversion: TPUEstimator(use_tpu=False) "
        "on\n         TF <= 2.15, the strategy engine on TF >= 2.16\n"
    ) in proc.stdout, proc.stdout
    assert "configured (TPUEstimator on TensorFlow <= 2.15, the strategy engine on >= 2.16)" in (
        proc.stdout
    )
    light = procs.python(
        code="import sys\nfrom tpushim._cli import main\ntry:\n    main(['--help'])\n"
        "except SystemExit:\n    pass\nprint('imported', 'tensorflow' in sys.modules)",
        cwd=tmp_path,
    )
    assert light.stdout.endswith("imported False\n"), light.stdout[-300:] + light.stderr
    # Every variable of the settings table is listed (it once left TPUSHIM_POD_INPUT out).
    variables = proc.stdout.split("environment variables:")[1]
    for var in (*_settings.ENV_VARS.values(), _settings.LOG_LEVEL_VAR, _settings.SUMMARY_VAR):
        assert f"\n  {var} " in variables, var
    help_text = " ".join(proc.stdout.split())  # as one line: argparse wraps it
    for flag, kwargs in _settings.OPTIONS:  # the options %tpushim takes too, with the same help
        assert (f"{flag} {kwargs['metavar']}" if "metavar" in kwargs else flag) in help_text
        assert " ".join(kwargs["help"].split()) in help_text


def test_info_reports_without_importing_tensorflow(tmp_path):
    code = (
        "import sys\nfrom tpushim._cli import main\nrc = main(sys.argv[1:])\n"
        "assert 'tensorflow' not in sys.modules, 'info imported TensorFlow'\nsys.exit(rc)"
    )
    plain = procs.python(["info"], code=code, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    import tpushim

    versions = tpushim.status()["versions"]
    assert f"tpushim {versions['tpushim']}: TensorFlow {versions['tensorflow']}" in plain.stdout
    assert "patched:     no" in plain.stdout
    assert "mode:        auto (from default)" in plain.stdout
    assert "TPU:" in plain.stdout and "autopatch:" in plain.stdout
    preview = procs.python(
        ["--mode", "cpu", "--batch-size", "64", "info", "--json"], code=code, cwd=tmp_path
    )
    assert preview.returncode == 0, preview.stderr
    status = json.loads(preview.stdout)
    assert (status["mode"], status["mode_source"], status["batch_size"]) == ("cpu", "argument", 64)
    assert not status["patched"]  # info previews options, it patches nothing
    bad = procs.python(["-m", "tpushim", "info"], cwd=tmp_path, env={"TPUSHIM_MODE": "fast"})
    assert bad.returncode == 2 and "TPUSHIM_MODE='fast'" in bad.stderr


@pytest.mark.slow  # a TensorFlow subprocess that trains
def test_demo_prints_stock_and_tpushim_results_side_by_side(tmp_path):
    proc = procs.python(["-m", "tpushim", "demo"], cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    if (
        _versions.uses_own_estimator()
    ):  # no stock estimator there, no TPU: tpushim's estimator API twice
        assert (
            "1. stock    model_to_estimator -> tpushim's EstimatorV2 on TensorFlow >= 2.16 "
            "(tpushim mode off"
        ) in out
        assert (
            "2. tpushim  model_to_estimator -> tpushim's EstimatorV2 on TensorFlow >= 2.16" in out
        )
        assert "its numbers equal stock TensorFlow 2.15's (tested)" in out
    else:
        assert "1. stock    model_to_estimator -> stock EstimatorV2 (tpushim mode off" in out
        assert "2. tpushim  model_to_estimator -> TPUEstimator(" in out
    # What the quickstart quotes of it (the seconds apart).
    quickstart = docquotes.page("docs", "quickstart.md")
    if _versions.uses_own_estimator():
        said = re.search(r"the demo ends: `([^`]+)`", quickstart).group(1)
        assert docquotes.words(said) in out.splitlines(), out
    else:
        quote = docquotes.blocks(quickstart)[0]
        quote = "\n".join(line for line in quote.splitlines() if not line.startswith("seconds"))
        assert docquotes.unmatched(quote, out) == [], out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  ")}
    for metric in ("accuracy", "loss", "global_step"):
        stock, shim, diff = rows[metric][:3]
        assert abs(float(stock) - float(shim)) <= 1e-5 and float(diff) <= 1e-5, (
            metric,
            rows[metric],
        )
    assert rows["global_step"][0] == "300"
    if not _versions.uses_own_estimator():
        assert "results equal within 1e-05" in out
    # TensorFlow's noise is kept down. TensorFlow >= 2.16 prints absl's start-up line from C++
    # before anything reads TF_CPP_MIN_LOG_LEVEL: not that one.
    absl = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
    assert "WARNING" not in proc.stderr.replace(absl, "")


@pytest.mark.slow  # a TensorFlow subprocess that trains
def test_cpu_mode_demo_says_which_engine_ran(tmp_path):
    """``--mode cpu demo``: the closing line names the engine its conversion line names (on
    TensorFlow 2.21 it once said "tpushim returned the stock estimator ...: both runs are stock"
    under a strategy-engine line)."""
    proc = procs.python(["-m", "tpushim", "--mode", "cpu", "demo"], cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "both runs are stock" not in out
    verdict = next(line for line in out.splitlines() if line.startswith("cpu mode runs "))
    if _versions.uses_own_estimator():
        said = re.search(r"and says so:\s+`([^`]+)`", docquotes.page("docs", "quickstart.md"))
        quoted = docquotes.words(said.group(1)).replace("(...)", "(…)")
        assert re.fullmatch(docquotes.line_pattern(quoted), verdict), (quoted, verdict)
        assert "2. tpushim  model_to_estimator -> the strategy engine: " in out
        assert re.fullmatch(
            r"cpu mode runs the strategy engine \(the TPU path on TensorFlow >= 2\.16\) on CPU: "
            r"results equal within 1e-05 \(largest difference [0-9.e+-]+\)\. Run 1 is "
            r"tpushim's estimator API, stock 2\.15's path: TensorFlow >= 2\.16 has no stock "
            r"estimator\.",
            verdict,
        ), verdict
    else:
        assert "2. tpushim  model_to_estimator -> TPUEstimator(use_tpu=False" in out
        assert re.fullmatch(
            r"cpu mode runs the TPU code path on CPU: results equal within 1e-05 \(largest "
            r"difference [0-9.e+-]+\)\.",
            verdict,
        ), verdict
    # The conversion lines are the table's: not again on stderr, in absl's format or ours.
    assert "model_to_estimator ->" not in proc.stderr, proc.stderr[-3000:]


RUNNER, CHECK = _cli.RUNNER_VALUE_FLAGS, _cli.CHECK_VALUE_FLAGS


@pytest.mark.parametrize(
    "argv, value_flags, expected",
    [
        (["s.py", "--mode", "x"], RUNNER, ([], None, ["s.py", "--mode", "x"])),
        (
            ["--mode", "cpu", "-q", "s.py", "-m", "y"],
            RUNNER,
            (["--mode", "cpu", "-q"], None, ["s.py", "-m", "y"]),
        ),
        (
            ["--tpu", "local", "-m", "pkg.mod", "--tpu", "z"],
            RUNNER,
            (["--tpu", "local"], "pkg.mod", ["--tpu", "z"]),
        ),
        (["-mpkg.mod", "a"], RUNNER, ([], "pkg.mod", ["a"])),
        (["--batch-size=8", "--", "-odd.py"], RUNNER, (["--batch-size=8"], None, ["-odd.py"])),
        (
            ["--mode", "cpu", "info", "--json"],
            RUNNER,
            (["--mode", "cpu"], None, ["info", "--json"]),
        ),
        (["--help"], RUNNER, (["--help"], None, [])),
        # check's own arguments are split by the same rule
        (
            ["--cores", "4", "--json", "s.py", "--cores", "2"],
            CHECK,
            (["--cores", "4", "--json"], None, ["s.py", "--cores", "2"]),
        ),
        (["--json", "-m", "pkg.train", "--json"], CHECK, (["--json"], "pkg.train", ["--json"])),
    ],
)
def test_split_argv_gives_everything_after_the_target_to_it(argv, value_flags, expected):
    assert _cli.split_argv(argv, value_flags) == expected


def app_without_logging(monkeypatch):
    """Makes this in-process run an application that configured no logging (in the test's body:
    pytest adds its capture handlers to the root logger after the fixtures). Returns tpushim's
    logger."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    logger = logging.getLogger("tpushim")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    return logger


def test_conversion_lines_shown_unless_quiet_or_logging_configured(tmp_path, monkeypatch, capsys):
    script = write(
        tmp_path / "logs.py",
        "import logging\nlogging.getLogger('tpushim').info('model_to_estimator -> X')\n",
    )
    logger = app_without_logging(monkeypatch)
    try:
        assert _cli.main(["-q", str(script)]) == 0
        assert "model_to_estimator -> X" not in capsys.readouterr().err
        assert _cli.main([str(script)]) == 0
        assert "tpushim: model_to_estimator -> X" in capsys.readouterr().err
        # Once the application configures logging, the line goes there, and only there.
        monkeypatch.setattr(logging.getLogger(), "handlers", [logging.NullHandler()])
        assert _cli.main([str(script)]) == 0
        assert "model_to_estimator -> X" not in capsys.readouterr().err
    finally:
        _console.hide_conversions()
    assert not any(isinstance(h, _log.ConsoleHandler) for h in logger.handlers)


def test_verbose_and_log_level_show_debug_lines(tmp_path, monkeypatch, capsys):
    script = write(
        tmp_path / "debug.py",
        "import logging\nlogging.getLogger('tpushim').debug('how the call was decided')\n",
    )
    logger = app_without_logging(monkeypatch)
    try:
        assert _cli.main([str(script)]) == 0
        assert "how the call was decided" not in capsys.readouterr().err  # INFO by default
        assert _cli.main(["-v", str(script)]) == 0
        assert "tpushim: how the call was decided" in capsys.readouterr().err
        _console.hide_conversions()
        monkeypatch.setattr(logger, "level", logging.NOTSET)
        monkeypatch.setenv("TPUSHIM_LOG_LEVEL", "Debug")
        assert _cli.main([str(script)]) == 0
        assert "tpushim: how the call was decided" in capsys.readouterr().err
        monkeypatch.setenv("TPUSHIM_LOG_LEVEL", "loud")
        with pytest.raises(SystemExit) as stop:  # checked before anything runs, as options are
            _cli.main([str(script)])
        assert stop.value.code == 2
        assert "TPUSHIM_LOG_LEVEL='loud' is not a log level" in capsys.readouterr().err
    finally:
        _console.hide_conversions()
