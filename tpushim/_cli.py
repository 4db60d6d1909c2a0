"""``python -m tpushim``: the command line -- options, commands, and which target to launch.

The command line is split once, at the first word that is not one of our options (the script, a
command such as ``info``, or what follows ``-m``): everything after it belongs to the script, so
``python -m tpushim train.py --mode x`` passes ``--mode x`` to ``train.py``. argparse then parses
only our own options; ``check`` splits its arguments with the same function. The settings options
come from :data:`tpushim._settings.OPTIONS` (``%tpushim`` adds the same ones), and their values are
checked by the settings' own parsers. A new command is one more entry in :data:`COMMANDS`.

The console command ``tpushim`` (``[project.scripts]``) is :func:`console_main`: the same command
line, named ``tpushim`` in its messages.
"""

import argparse
import collections
import contextlib
import difflib
import json
import os
import sys
import textwrap

from tpushim import _console, _launcher, _settings, _summary, _tpus, _versions
from tpushim._errors import ConfigurationError, TPUShimError
from tpushim._patch import patch, patched
from tpushim._status import status
from tpushim._versions import guard_warning_silenced, installed_version_problem

PROG = "python -m tpushim"
#: The name the console command prints in usage and errors (``tpushim`` for the console script).
_prog = PROG

#: The runner's options that take a value (the split must skip the value too); flags do not.
RUNNER_VALUE_FLAGS = tuple(flag for flag, kwargs in _settings.OPTIONS if "action" not in kwargs)
#: Short spellings of settings options on the runner.
SHORT_FLAGS = {"--quiet": ("-q",)}
CHECK_VALUE_FLAGS = ("--cores", "--engine")

#: A subcommand: ``run(options, argv) -> exit code``; ``help`` is one line for ``--help``.
Command = collections.namedtuple("Command", "run help")


def split_argv(argv, value_flags):
    """Splits argv into (our options, module or None, the target's argv).

    The target's argv starts with the script or command name; for ``-m`` it is the module's
    arguments. ``value_flags``: our options that take a value as the next word.
    """
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[:i], None, argv[i + 1 :]
        if arg == "-m":
            if i + 1 == len(argv):
                return argv[: i + 1], None, []  # argparse reports the missing MODULE
            return argv[:i], argv[i + 1], argv[i + 2 :]
        if arg.startswith("-m") and not arg.startswith("--"):
            return argv[:i], arg[2:], argv[i + 1 :]  # -mMODULE, as python accepts it
        if arg.startswith("-") and arg != "-":
            i += 2 if arg in value_flags else 1
            continue
        return argv[:i], None, argv[i:]
    return argv, None, []


def _stop(message, code=2):
    """Prints ``message`` as the command's error; returns ``code``, the exit status."""
    print(f"{_prog}: {message}", file=sys.stderr)
    return code


def _patch_before_running(options, module, target, command="", **overrides):
    """Checks the target and the installation, patches, shows conversion lines. Returns an exit
    code when it stopped (the problem printed), else None."""
    problem = (
        _launcher.module_problem(module)
        if module is not None
        else _launcher.script_problem(target[0])
    )
    if problem:
        return _stop(command + problem)
    # The version guard before TensorFlow is imported: a clean stop, not a traceback from inside it.
    problem = installed_version_problem()
    if problem:
        return _stop(command + problem)
    try:
        # Lines shown first: patch() itself may say one (tpushim set TF_USE_LEGACY_KERAS=1).
        quiet = _settings.resolve((options.settings,)).quiet  # -q, else TPUSHIM_QUIET
        _console.show_conversions(quiet=quiet, level="DEBUG" if options.verbose else None)
        patch(**dict(options.settings, **overrides))
    except ConfigurationError as e:  # a bad TPUSHIM_* variable
        return _stop(f"{command}error: {e}")
    return None


def _launch(module, target, reported=None):
    if module is not None:
        return _launcher.run_module(module, target, reported)
    return _launcher.run_script(target[0], target[1:], reported)


def _unknown_command(word):
    """The error for ``word`` when it is neither a file nor a command but close to a command
    (``demoo``); None otherwise (a file of that name is a script, whatever its name)."""
    if os.path.exists(word) or word.startswith(("-", ".")) or os.sep in word:
        return None
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.75)
    if not close:
        return None
    return (
        f"{word!r} is not a command, nor a file here; did you mean `{_prog} {close[0]}`? "
        f"(commands: {', '.join(COMMANDS)}; a script is given by its path)"
    )


def _info(options, argv):
    parser = argparse.ArgumentParser(prog=f"{_prog} info", description=COMMANDS["info"].help)
    parser.add_argument("--json", action="store_true", help="print tpushim.status() as JSON")
    args = parser.parse_args(argv)
    try:
        # A scope, not patch(): info reports this interpreter as it is, previewing the options.
        # The guard's message is one of info's lines: not a warning as well.
        with guard_warning_silenced(), patched(**options.settings):
            state = status()
    except ConfigurationError as e:
        return _stop(f"info: error: {e}")
    if args.json:
        print(json.dumps(state, indent=2, sort_keys=True, default=str))
    else:
        text = _console.format_status(state, previewing=bool(options.settings))
        print(text.replace(PROG, _prog))  # its hint names the command as it was called
    return 0


def _demo(options, argv):
    parser = argparse.ArgumentParser(prog=f"{_prog} demo", description=COMMANDS["demo"].help)
    parser.parse_args(argv)
    problem = installed_version_problem()
    if problem:
        return _stop(f"demo: {problem}")
    from tpushim import demo  # imports TensorFlow

    try:
        return demo.run(**options.settings)
    except ConfigurationError as e:
        return _stop(f"demo: error: {e}")
    except TPUShimError as e:  # e.g. --mode tpu without a TPU: the message says what to do
        return _stop(f"demo: {type(e).__name__}: {e}", code=1)


def _check(options, argv):
    parser = argparse.ArgumentParser(
        prog=f"{_prog} check",
        description=COMMANDS["check"].help,
        usage=f"{_prog} [options] check [--json] [--cores N] [--engine ENGINE] "
        "(SCRIPT | -m MODULE) [ARGS...]",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON on stdout (the script's own output then goes to stderr)",
    )
    parser.add_argument(
        "--cores",
        type=int,
        default=_settings.DEFAULT_CORES,
        metavar="N",
        help=f"TPU cores to check the batch size against (default "
        f"{_settings.DEFAULT_CORES}: a {_tpus.in_words(_tpus.boards_with(_settings.DEFAULT_CORES))})",
    )
    parser.add_argument(
        "--engine",
        choices=("strategy", "jax"),
        help="the engine whose step to check (as tpushim's --engine): jax converts and "
        "compiles the JAX engine's step on this machine's CPU devices (--cores of them)",
    )
    parser.add_argument(
        "-m", dest="module", metavar="MODULE", help="check a module, as python -m runs it"
    )
    own, module, target = split_argv(argv, CHECK_VALUE_FLAGS)
    args = parser.parse_args(own + (["-m", module] if module is not None else []))
    if module is None and not target:
        return _stop("check: give the script (or -m MODULE) to check")
    if args.engine:
        options.settings = dict(options.settings, engine=args.engine)
    try:
        jax_engine = _settings.resolve((options.settings,)).engine == "jax"
    except ConfigurationError:
        jax_engine = False  # said by the patch below
    if (
        jax_engine
        and "jax" not in sys.modules
        and "device_count" not in os.environ.get("XLA_FLAGS", "")
    ):  # the JAX step compiled for the TPU's cores: as many XLA devices on this CPU
        os.environ["XLA_FLAGS"] = (
            f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.cores}"
        ).strip()
    engine = _versions.uses_own_estimator()
    # TensorFlow >= 2.16: tpushim's estimator API (mode off: no TPU is looked for, nothing
    # reaches one); else cpu mode: the TPU code path, run on CPU.
    stopped = _patch_before_running(
        options, module, target, "check: ", mode="off" if engine else "cpu"
    )
    if stopped is not None:
        return stopped
    from tpushim import _preflight  # imports TensorFlow
    from tpushim._preflight import progress

    if engine:
        from tpushim._preflight import strategy_checks

        recording = strategy_checks.recording
        how = "on tpushim's estimator API (TensorFlow >= 2.16 has no TPU code path to run)"
    else:
        recording, how = _preflight.recording, "in cpu mode (the TPU code path on CPU)"
    uncaught = exit_message = None
    what = f"-m {module}" if module is not None else target[0]
    # The script's __main__ kept while the report is made: its checks clone the model, which
    # rebuilds a Lambda with the globals of the module it was defined in (see main_kept).
    with progress.showing(), _launcher.main_kept():
        with (
            recording() as recorder,
            progress.phase(
                f"running {what} {how.split(' (')[0]} (training capped at "
                f"{recorder.MAX_TRAIN_STEPS} steps)",
                prints=True,
            ),
            contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout),
        ):
            try:
                # What the preflight explains is a finding, not a traceback (see _check_report).
                code, uncaught = _launch(module, target, recorder.explains)
            except SystemExit as e:
                code, exit_message = _exit_status(e)
                if exit_message is not None:
                    print(exit_message, file=sys.stderr)  # as python prints it
        report = _check_report(_preflight, recorder, args.cores, code, uncaught, exit_message, how)
    print(report.to_json() if args.json else report)
    return report.exit_code


def _exit_status(exc):
    """``(status, message or None)`` of a ``SystemExit``, as python turns it into both."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0, None
    return 1, str(exc.code)


def _check_report(
    preflight,
    recorder,
    cores,
    code,
    uncaught,
    exit_message=None,
    how="in cpu mode (the TPU code path on CPU)",
):
    """The recorder's report, plus what the script's exit said (``how``: how it was run)."""
    try:
        report = recorder.report(num_cores=cores)
    except Exception as e:  # --json must still print a report
        report = preflight.Report()
        report.add(
            "preflight-failed",
            "error",
            preflight.last_frame(e),
            f"the preflight failed: {preflight.summary(e)}",
            "please report this to tpushim",
        )
    if uncaught is not None and recorder.explains(uncaught):
        # A refused conversion (its finding says what and why), or a read of a model_dir the
        # check left as it was (the checked run wrote to a scratch copy).
        recorder.add_explained(report, uncaught)
    elif uncaught is not None:
        report.add(
            "script-raised",
            "error",
            preflight.last_frame(uncaught),
            f"the script raised {preflight.summary(uncaught)} while checked {how}: it would "
            f"fail on a TPU too",
            "see the traceback above; run the script with "
            + ("python -m tpushim" if "engine" in how else "--mode cpu")
            + " to reproduce it uncapped",
        )
    elif code:
        report.add(
            "script-exit",
            "warning",
            "script",
            f"the script exited with status {code}"
            + (f" ({exit_message!r})" if exit_message else "")
            + f" while checked {how.split(' (')[0]} (its training was capped at "
            f"{recorder.MAX_TRAIN_STEPS} steps, evaluation at {recorder.MAX_EVAL_STEPS})",
            "see its output above; run it with "
            + ("python -m tpushim" if "engine" in how else "--mode cpu")
            + " to see it uncapped",
        )
    return report


#: Subcommands, by name.
COMMANDS = {
    "info": Command(
        _info,
        "print what tpushim would do here: versions, patched or not, mode, "
        "the TPU found and where from (imports no TensorFlow).",
    ),
    "demo": Command(
        _demo,
        "run a bundled legacy Keras -> Estimator script twice, stock and "
        "converted by tpushim, and print both results side by side.",
    ),
    "check": Command(
        _check,
        "TPU preflight: run SCRIPT in cpu mode for a few steps and report "
        "what would break or crawl on a TPU (exit 0: nothing blocks; 1: something would "
        "fail; 3: the script itself raised; --json for machines).",
    ),
}

_DESCRIPTION = """\
Patches tf.keras.estimator.model_to_estimator (every spelling of it), then runs SCRIPT as
`python SCRIPT ARGS...` would: same sys.argv, sys.path[0] is the script's folder, __name__ is
'__main__', and its exit code and exceptions come through unchanged. `-m MODULE` runs a module as
`python -m MODULE` would. Everything after SCRIPT or MODULE belongs to it.

The converted model_to_estimator returns an estimator that trains on the TPU when one is
configured (TPUEstimator on TensorFlow <= 2.15, the strategy engine on >= 2.16), and the stock
estimator otherwise (tpushim's own on TensorFlow >= 2.16, which has none); each conversion prints
one line on stderr saying what it returned and why."""

_EPILOG = """\
commands:
{commands}
  (a script named like a command: give its path, e.g. ./info)

modes (--mode, TPUSHIM_MODE):
  auto   the TPU path when a TPU is configured, else the stock estimator (default)
  cpu    the TPU code path on CPU/GPU, to try a conversion: TPUEstimator(use_tpu=False) on
         TF <= 2.15, the strategy engine on TF >= 2.16
  tpu    require a TPU; model_to_estimator raises tpushim.NoTPUError when none is configured
  off    never convert

environment variables:
{variables}
  precedence: TPUSHIM_MODE=off, then options, then TPUSHIM_* variables, then defaults.

examples:
  {prog} demo
  {prog} info
  {prog} check train.py --epochs 3
  {prog} train.py --epochs 3
  {prog} --mode cpu --summary -m mypackage.train --epochs 3
  TPUSHIM_TPU=local {prog} train.py"""

#: What a settings variable adds to "as --flag" in ``--help`` (the list itself is the settings
#: table, :data:`tpushim._settings.ENV_VARS`, so a new setting cannot be left out).
_VARIABLE_NOTES = {
    "mode": "TPUSHIM_MODE=off is a kill switch that beats every option",
    "quiet": "1: hide the conversion lines and the run summary",
}


def _variables():
    """The ``environment variables`` lines of ``--help``: every setting's variable, then the
    process-wide ones."""
    rows = []
    for name, var in _settings.ENV_VARS.items():
        flag = "-q" if name == "quiet" else "--" + name.replace("_", "-")
        note = _VARIABLE_NOTES.get(name)
        rows.append((var, f"as {flag}" + (f"; {note}" if note else "")))
    rows += [
        (
            _settings.LOG_LEVEL_VAR,
            "debug, info, warning or error: tpushim's log level (debug: as -v)",
        ),
        (_settings.SUMMARY_VAR, "1: the run summary's per-call table (as --summary)"),
        ("TPUSHIM_AUTOPATCH", "1: patch every Python process at start, without this runner"),
    ]
    return "\n".join(f"  {var:<28} {text}" for var, text in rows)


def _parser():
    """The runner's argparse parser (our options only: :func:`split_argv` cut the rest off)."""
    commands = "\n".join(
        textwrap.fill(command.help, 96, initial_indent=f"  {name:<7}", subsequent_indent=" " * 9)
        for name, command in COMMANDS.items()
    )
    parser = argparse.ArgumentParser(
        prog=_prog,
        usage=(
            f"{_prog} [options] SCRIPT [ARGS...]\n"
            f"       {_prog} [options] -m MODULE [ARGS...]\n"
            f"       {_prog} [options] {{{','.join(COMMANDS)}}} [ARGS...]"
        ),
        description=_DESCRIPTION,
        epilog=_EPILOG.format(commands=commands, variables=_variables(), prog=_prog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for flag, kwargs in _settings.OPTIONS:
        parser.add_argument(*SHORT_FLAGS.get(flag, ()), flag, **kwargs)
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help=f"show tpushim's debug lines too (the settings and TPU each call was decided by); "
        f"${_settings.LOG_LEVEL_VAR} sets the level without it.",
    )
    parser.add_argument(
        "--summary",
        action="store_true",
        default=None,
        help="add a table to the run summary: per train/evaluate/predict call, the path it ran "
        "on, seconds, steps, steps/s, first session run, padding and input wait. "
        f"Default: ${_settings.SUMMARY_VAR}, else no.",
    )
    parser.add_argument(
        "-m",
        dest="module",
        metavar="MODULE",
        help="run library module MODULE as a script (as python -m does); ends the options",
    )
    from tpushim.version import __version__

    parser.add_argument("--version", action="version", version=f"tpushim {__version__}")
    return parser


def console_main():
    """The ``tpushim`` console command: ``tpushim script.py ...`` is ``python -m tpushim
    script.py ...``; exits with the script's status."""
    sys.exit(main(prog="tpushim"))


def main(argv=None, prog=PROG):
    """``python -m tpushim``; returns the exit status (the script's, when one runs).

    Args:
      argv: the arguments after ``python -m tpushim``; default ``sys.argv[1:]``.
      prog: the command's name in usage and error messages.
    """
    global _prog  # one command line per process: its name, for every message below
    _prog = prog
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    own, module, target = split_argv(argv, RUNNER_VALUE_FLAGS)
    options = parser.parse_args(own + (["-m", module] if module is not None else []))
    try:  # before anything runs, by the same rules patch() applies
        options.settings = _settings.parse_arguments(
            **{name: getattr(options, name) for name in _settings.ENV_VARS}
        )
        _settings.log_level_from_environment()
        table = options.summary or _settings.summary_table_from_environment()
    except ConfigurationError as e:
        parser.error(str(e))
    if module is None and not target:
        parser.print_usage(sys.stderr)
        return _stop(
            f"give a script, -m MODULE, or a command ({', '.join(COMMANDS)}); see {_prog} --help"
        )
    if module is None and target[0] in COMMANDS:
        return COMMANDS[target[0]].run(options, target[1:])
    if module is None:
        unknown = _unknown_command(target[0])
        if unknown:
            return _stop(unknown)
    stopped = _patch_before_running(options, module, target)
    if stopped is not None:
        return stopped
    quiet = _settings.resolve((options.settings,)).quiet  # -q, else TPUSHIM_QUIET
    with _summary.summarizing(enabled=bool(table) or not quiet, table=bool(table)) as summary:
        code, uncaught = _launch(module, target)
        if summary is not None:
            summary.ended(code, uncaught)
    return code
