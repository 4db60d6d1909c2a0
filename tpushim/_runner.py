"""``python -m tpushim``: patch, then run a script or module exactly as ``python`` would.

The command line is split by hand at the first word that is not a runner option (the script, a
command such as ``info``, or what follows ``-m``): everything after it belongs to the script, so
``python -m tpushim train.py --mode x`` passes ``--mode x`` to ``train.py``. argparse then parses
only the runner's own options, and each command parses its own arguments. A new command is one more
entry in :data:`COMMANDS`.
"""

import argparse
import builtins
import dataclasses
import importlib.machinery
import json
import logging
import os
import runpy
import site
import sys
import textwrap
import types
from typing import Callable, List, Optional, Sequence

from tpushim import _settings

PROG = "python -m tpushim"
PTH_NAME = "tpushim-autopatch.pth"

#: The runner's options: (flags, argparse keyword arguments). The argv splitter reads this table
#: too, so it knows which options take a value.
OPTIONS = (
    (("--mode",), dict(metavar="MODE", type=lambda s: s.strip().lower(), choices=_settings.MODES,
                       help="auto, cpu, tpu or off (see modes below). Default: $TPUSHIM_MODE, "
                            "else auto.")),
    (("--tpu",), dict(metavar="TPU",
                      help="a TPU name, grpc://host:port, or 'local' on a TPU VM. Default: "
                           "$TPUSHIM_TPU, else found from the RunConfig, TPU_NAME & co., "
                           "COLAB_TPU_ADDR or the TPU VM's device files.")),
    (("--batch-size",), dict(metavar="N",
                             help="global batch size for train, eval and predict. Default: "
                                  "$TPUSHIM_BATCH_SIZE, else taken from the input_fn.")),
    (("--iterations-per-loop",), dict(metavar="N",
                                      help="training steps per TPU loop. Default: "
                                           "$TPUSHIM_ITERATIONS_PER_LOOP, else 100.")),
    (("-q", "--quiet"), dict(action="store_true",
                             help="do not print tpushim's conversion lines on stderr.")),
)


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand: ``run(options, argv) -> exit code``; ``help`` is one line for ``--help``."""

    run: Callable[[argparse.Namespace, List[str]], int]
    help: str


def _run_info(options, argv):
    parser = argparse.ArgumentParser(prog=f"{PROG} info", description=COMMANDS["info"].help)
    parser.add_argument("--json", action="store_true", help="print tpushim.status() as JSON")
    args = parser.parse_args(argv)
    import tpushim  # pylint: disable=import-outside-toplevel
    settings = settings_from(options)
    from tpushim import _patch  # pylint: disable=import-outside-toplevel
    try:
        # A scope, not patch(): info reports this interpreter as it is, previewing the options.
        # The guard's message is one of info's lines: not a warning as well.
        with _patch.guard_warning_silenced(), tpushim.patched(**settings):
            status = tpushim.status()
    except tpushim.ConfigurationError as e:
        print(f"{PROG} info: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True, default=str))
    else:
        print(format_status(status, previewing=bool(settings)))
    return 0


def _run_demo(options, argv):
    parser = argparse.ArgumentParser(prog=f"{PROG} demo", description=COMMANDS["demo"].help)
    parser.parse_args(argv)
    if _unsupported_stop("demo: "):
        return 2
    import tpushim  # pylint: disable=import-outside-toplevel
    from tpushim import demo  # pylint: disable=import-outside-toplevel
    try:
        return demo.run(**settings_from(options))
    except tpushim.ConfigurationError as e:
        return _fail(f"demo: error: {e}")
    except tpushim.TPUShimError as e:  # e.g. --mode tpu without a TPU: the message says what to do
        return _fail(f"demo: {type(e).__name__}: {e}", code=1)


def _run_check(options, argv):
    """``check [--json] [--cores N] SCRIPT [ARGS...] | -m MODULE [ARGS...]``: the TPU preflight."""
    parser = argparse.ArgumentParser(
        prog=f"{PROG} check", description=COMMANDS["check"].help,
        usage=f"{PROG} [options] check [--json] [--cores N] (SCRIPT | -m MODULE) [ARGS...]")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout "
                        "(the script's own output then goes to stderr)")
    parser.add_argument("--cores", type=int, default=8, metavar="N",
                        help="TPU cores to check the batch size against (default 8: a v2/v3/v4-8)")
    own, module, target = [], None, list(argv)
    while target and target[0] in ("--json", "--cores", "-h", "--help") or (
            target and target[0].startswith("--cores=")):
        own.append(target.pop(0))
        if own[-1] == "--cores" and target:
            own.append(target.pop(0))
    if target[:1] == ["-m"]:
        module, target = (target[1] if len(target) > 1 else None), target[2:]
    args = parser.parse_args(own)
    if module is None and not target:
        return _fail("check: give the script (or -m MODULE) to check")
    problem = _module_problem(module) if module is not None else _script_problem(target[0])
    if problem:
        return _fail(f"check: {problem}")
    if _unsupported_stop("check: "):
        return 2
    import contextlib  # pylint: disable=import-outside-toplevel
    import tpushim  # pylint: disable=import-outside-toplevel
    try:
        tpushim.patch(**dict(settings_from(options), mode="cpu"))  # checks run the TPU path on CPU
    except tpushim.ConfigurationError as e:
        return _fail(f"check: error: {e}")
    if not options.quiet:
        show_conversions()
    from tpushim import _preflight  # pylint: disable=import-outside-toplevel
    out = sys.stderr if args.json else sys.stdout
    uncaught = []
    with _preflight.recording() as recorder, contextlib.redirect_stdout(out):
        try:
            code = (run_module(module, target, uncaught) if module is not None
                    else run_script(target[0], target[1:], uncaught))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    try:
        report = recorder.report(num_cores=args.cores)
    except Exception as e:  # pylint: disable=broad-except  # --json must still print a report
        report = _preflight.Report()
        report.add("preflight-failed", "error", _preflight.last_frame(e),
                   f"the preflight failed: {_preflight.summary(e)}", "please report this to tpushim")
    for exc in uncaught:
        report.add("script-raised", "error", _preflight.last_frame(exc),
                   f"the script raised {_preflight.summary(exc)} while checked in cpu mode (the "
                   f"TPU code path on CPU): it would fail on a TPU too",
                   "see the traceback above; run the script with --mode cpu to reproduce it uncapped")
    if code and not uncaught:
        report.add("script-exit", "warning", "script",
                   f"the script exited with status {code} while checked in cpu mode (its training "
                   f"was capped at {recorder.MAX_TRAIN_STEPS} steps, evaluation at "
                   f"{recorder.MAX_EVAL_STEPS})", "see its output above; run it with --mode cpu "
                   "to see it uncapped")
    print(report.to_json() if args.json else report)
    return report.exit_code


#: Subcommands, by name.
COMMANDS = {
    "info": Command(_run_info, "print what tpushim would do here: versions, patched or not, mode, "
                               "the TPU found and where from (imports no TensorFlow)."),
    "demo": Command(_run_demo, "run a bundled legacy Keras -> Estimator script twice, stock and "
                               "converted by tpushim, and print both results side by side."),
    "check": Command(_run_check, "TPU preflight: run SCRIPT in cpu mode for a few steps and report "
                                 "what would break or crawl on a TPU (exit 1 if something would "
                                 "fail; --json for machines)."),
}

_DESCRIPTION = """\
Patches tf.keras.estimator.model_to_estimator (every spelling of it), then runs SCRIPT as
`python SCRIPT ARGS...` would: same sys.argv, sys.path[0] is the script's folder, __name__ is
'__main__', and its exit code and exceptions come through unchanged. `-m MODULE` runs a module as
`python -m MODULE` would. Everything after SCRIPT or MODULE belongs to it.

The converted model_to_estimator returns a TPUEstimator when a TPU is configured, and the stock
estimator otherwise; each conversion prints one line on stderr saying what it returned and why."""

_EPILOG = """\
commands:
{commands}
  (a script named like a command: give its path, e.g. ./info)

modes (--mode, TPUSHIM_MODE):
  auto   a TPUEstimator when a TPU is configured, else the stock estimator (default)
  cpu    TPUEstimator(use_tpu=False): the TPU code path on CPU/GPU, to try a conversion
  tpu    require a TPU; model_to_estimator raises tpushim.NoTPUError when none is configured
  off    never convert

environment variables:
  TPUSHIM_MODE                 the mode; TPUSHIM_MODE=off is a kill switch that beats every option
  TPUSHIM_TPU                  the TPU (as --tpu)
  TPUSHIM_BATCH_SIZE           global batch size (as --batch-size)
  TPUSHIM_ITERATIONS_PER_LOOP  steps per TPU loop (as --iterations-per-loop)
  TPUSHIM_AUTOPATCH=1          patch every Python process at start, without this runner
  precedence: TPUSHIM_MODE=off, then options, then TPUSHIM_* variables, then defaults.

examples:
  python -m tpushim demo
  python -m tpushim info
  python -m tpushim check train.py --epochs 3
  python -m tpushim train.py --epochs 3
  python -m tpushim --mode cpu -m mypackage.train --epochs 3
  TPUSHIM_TPU=local python -m tpushim train.py"""


def build_parser():
    """The runner's argparse parser (its options only: the split is done by :func:`split_argv`)."""
    commands = "\n".join(textwrap.fill(command.help, 96, initial_indent=f"  {name:<7}",
                                        subsequent_indent=" " * 9)
                          for name, command in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=(f"{PROG} [options] SCRIPT [ARGS...]\n"
               f"       {PROG} [options] -m MODULE [ARGS...]\n"
               f"       {PROG} [options] {{{','.join(COMMANDS)}}} [ARGS...]"),
        description=_DESCRIPTION, epilog=_EPILOG.format(commands=commands),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    for flags, kwargs in OPTIONS:
        parser.add_argument(*flags, **kwargs)
    parser.add_argument("-m", dest="module", metavar="MODULE",
                        help="run library module MODULE as a script (as python -m does); ends the options")
    from tpushim.version import __version__  # pylint: disable=import-outside-toplevel
    parser.add_argument("--version", action="version", version=f"tpushim {__version__}")
    return parser


def split_argv(argv):
    """Splits argv into (runner options, module or None, target argv).

    The target argv starts with the script or command name; for ``-m`` it is the module's arguments.
    """
    takes_value = {flag for flags, kwargs in OPTIONS if kwargs.get("action") is None for flag in flags}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[:i], None, argv[i + 1:]
        if arg == "-m":
            if i + 1 == len(argv):
                return argv[:i + 1], None, []  # argparse reports the missing MODULE
            return argv[:i], argv[i + 1], argv[i + 2:]
        if arg.startswith("-m") and not arg.startswith("--"):
            return argv[:i], arg[2:], argv[i + 1:]  # -mMODULE, as python accepts it
        if arg.startswith("-") and arg != "-":
            i += 2 if arg in takes_value else 1
            continue
        return argv[:i], None, argv[i:]
    return argv, None, []


def settings_from(options):
    """The tpushim settings given in an argparse namespace (``--mode`` & co.), as patch() kwargs."""
    return {name: getattr(options, name) for name in _settings.ENV_VARS
            if getattr(options, name, None) is not None}


# --- logging -------------------------------------------------------------------------------------

class ConsoleHandler(logging.Handler):
    """Writes tpushim's log lines to stderr while the application has configured no logging.

    Once the application configures the root logger (``logging.basicConfig`` & co.), tpushim's
    lines reach it by propagation in its format, and this handler steps aside so no line is
    printed twice.
    """

    def filter(self, record):
        return not logging.getLogger().handlers and super().filter(record)

    def format(self, record):
        message = super().format(record)
        return message if message.startswith("tpushim") else f"tpushim: {message}"

    def emit(self, record):
        try:
            # sys.stderr at emit time: notebooks and test runners replace it after start-up.
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # pylint: disable=broad-except
            self.handleError(record)


def show_conversions():
    """Makes tpushim's one line per conversion visible on stderr; idempotent. Returns the handler."""
    logger = logging.getLogger("tpushim")
    for handler in logger.handlers:
        if isinstance(handler, ConsoleHandler):
            return handler
    handler = ConsoleHandler(logging.INFO)
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:  # an explicit level set by the application wins
        logger.setLevel(logging.INFO)
    return handler


def hide_conversions():
    """Removes what :func:`show_conversions` added."""
    logger = logging.getLogger("tpushim")
    for handler in [h for h in logger.handlers if isinstance(h, ConsoleHandler)]:
        logger.removeHandler(handler)


# --- status --------------------------------------------------------------------------------------

def autopatch_files():
    """Paths of the installed ``tpushim-autopatch.pth`` files on this interpreter's site dirs."""
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [os.path.join(d, PTH_NAME) for d in dict.fromkeys(dirs)
            if os.path.isfile(os.path.join(d, PTH_NAME))]


def outcome(status):
    """What a ``model_to_estimator`` call returns under ``status`` (a :func:`tpushim.status` dict)."""
    mode, tpu = status["mode"], status["tpu"]
    if mode == "off":
        return f"the stock estimator (mode off, from {status['mode_source']})"
    if mode == "cpu":
        return "TPUEstimator(use_tpu=False): the TPU code path on CPU/GPU"
    if tpu:
        return f"TPUEstimator on TPU {tpu} (from {status['tpu_source']})"
    if mode == "tpu":
        return "an error, tpushim.NoTPUError: mode tpu needs a TPU and none is configured"
    return "the stock estimator (no TPU configured; --mode cpu runs the TPU code path on CPU)"


def format_status(status, previewing=False):
    """:func:`tpushim.status` as the lines ``python -m tpushim info`` and ``%tpushim`` print."""
    from tpushim import _patch  # pylint: disable=import-outside-toplevel
    v = status["versions"]
    problem = status.get("unsupported") or _patch.unsupported()
    lines = [f"tpushim {v['tpushim']}: TensorFlow {v.get('tensorflow') or 'not installed'}, "
             f"Keras {v.get('keras') or '-'}, tensorflow-estimator {v.get('tensorflow_estimator') or '-'}"
             f" ({'NOT SUPPORTED' if problem else 'supported'})"]
    if problem:
        lines.append(f"  {problem}")
    applied = [str(a) for a in status["applied"].values()]
    if status["patched"]:
        lines.append("patched:     yes" + (" (applies when TensorFlow is imported)"
                                           if "pending import" in applied else ""))
    else:
        lines.append("patched:     no, not this process" + (
            " (the options given are previewed below)" if previewing else
            " (python -m tpushim SCRIPT patches the script it runs)"))
    lines.append(f"mode:        {status['mode']} (from {status['mode_source']})")
    if status["tpu"]:
        lines.append(f"TPU:         {status['tpu']} (from {status['tpu_source']})")
    else:
        from tpushim import _detect  # pylint: disable=import-outside-toplevel
        lines.append(f"TPU:         none found (looked at TPUSHIM_TPU, "
                     f"{', '.join(_detect.RESOLVER_ENV_VARS)}, COLAB_TPU_ADDR, TPU VM device files)")
    lines.append(f"batch size:  {status['batch_size'] or 'taken from the input_fn'}")
    lines.append(f"iterations per loop: {status['iterations_per_loop'] or 'default (100)'}")
    returns = outcome(status) if not problem else "the stock estimator (nothing is patched)"
    lines.append(("model_to_estimator returns: " if status["patched"] or previewing
                  else "model_to_estimator, once patched, returns: ") + returns)
    autopatch = os.environ.get("TPUSHIM_AUTOPATCH")
    files = autopatch_files()
    lines.append("autopatch:   TPUSHIM_AUTOPATCH=" + (repr(autopatch) if autopatch is not None else "unset")
                 + "; " + (f"{PTH_NAME} installed in {os.path.dirname(files[0])}" if files
                           else f"{PTH_NAME} not found on this interpreter (reinstall tpushim)"))
    return "\n".join(lines)


# --- running the target --------------------------------------------------------------------------

def _fail(message, code=2):
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def _unsupported_stop(command=""):
    """The version guard, before a command imports TensorFlow: on an installation tpushim does not
    support (TensorFlow 2.16+, Keras 3, no tensorflow_estimator) prints its message and returns True,
    so the command exits 2 without a traceback from deep inside TensorFlow."""
    from tpushim import _patch  # pylint: disable=import-outside-toplevel
    problem = _patch.unsupported()
    if problem:
        _fail(command + problem)
    return bool(problem)


def _script_problem(path):
    if path == "-":
        return "reading a script from stdin is not supported; save it to a file"
    if not os.path.exists(path):
        return f"can't open file {path!r}: [Errno 2] No such file or directory"
    return None


def _module_problem(name):
    import importlib.util  # pylint: disable=import-outside-toplevel
    try:
        spec = importlib.util.find_spec(name)  # imports the parent packages, as python -m does
        if spec is None:
            return f"No module named {name!r}"
        if spec.submodule_search_locations is not None and importlib.util.find_spec(name + ".__main__") is None:
            return f"No module named {name}.__main__; {name!r} is a package and cannot be directly executed"
    except (ImportError, ValueError) as e:
        return str(e)
    return None


def _print_uncaught(exc):
    """Prints ``exc`` as Python prints an uncaught exception, without the runner's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in (__name__, "runpy"):
        tb = tb.tb_next
    # excepthook prints the exception's own __traceback__, so the trimmed one goes there.
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)


def _run_target(run, uncaught=None):
    try:
        run()
    except (SystemExit, KeyboardInterrupt):
        raise  # Python itself turns these into the exit status (and SIGINT), as without tpushim
    except BaseException as exc:  # pylint: disable=broad-except
        _print_uncaught(exc)
        if uncaught is not None:
            uncaught.append(exc)
        return 1
    return 0


def _exec_as_main(file):
    """Runs a source file as python runs its script: a fresh ``__main__``, ``__file__`` = ``file``.

    Not ``runpy.run_path``: it sets ``sys.argv[0]`` to the path it is given, and python keeps
    ``sys.argv[0]`` as typed while giving ``__file__`` (and tracebacks) the absolute path.
    """
    with open(file, "rb") as f:
        source = f.read()
    code = compile(source, file, "exec", dont_inherit=True)  # bytes: honours a coding cookie
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=file, __cached__=None, __package__=None, __spec__=None,
                           __builtins__=builtins,
                           __loader__=importlib.machinery.SourceFileLoader("__main__", file))
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)  # pylint: disable=exec-used
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def run_script(path, args, uncaught=None):
    """Runs ``path`` as ``__main__`` with ``sys.argv == [path, *args]``; returns the exit code.
    An uncaught exception is printed as python prints it, and appended to ``uncaught``."""
    sys.argv = [path, *args]
    is_source = os.path.isfile(path) and not path.endswith((".pyc", ".pyo"))
    if not sys.flags.safe_path:
        if os.path.isfile(path):
            # As python does: the script's own folder, symlinks resolved, replaces ours (the cwd).
            sys.path[0] = os.path.dirname(os.path.realpath(path))
        else:
            del sys.path[0]  # a folder or zip with __main__.py: run_path puts it first itself
    if is_source:
        # python 3.9+ makes __main__.__file__ absolute (the cwd joined, not normalised).
        file = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
        return _run_target(lambda: _exec_as_main(file), uncaught)
    return _run_target(lambda: runpy.run_path(path, run_name="__main__"), uncaught)


def run_module(name, args, uncaught=None):
    """Runs module ``name`` as ``python -m name`` would (``sys.path[0]`` stays the cwd)."""
    sys.argv = [name, *args]
    return _run_target(lambda: runpy.run_module(name, run_name="__main__", alter_sys=True), uncaught)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m tpushim``; returns the exit status (the script's, when one runs)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    own, module, target = split_argv(argv)
    options = parser.parse_args(own + (["-m", module] if module is not None else []))
    if module is None and not target:
        parser.print_usage(sys.stderr)
        return _fail(f"give a script, -m MODULE, or a command ({', '.join(COMMANDS)}); "
                     f"see {PROG} --help")
    if module is None and target[0] in COMMANDS:
        return COMMANDS[target[0]].run(options, target[1:])

    problem = _module_problem(module) if module is not None else _script_problem(target[0])
    if problem:
        return _fail(problem)
    if _unsupported_stop():
        return 2
    import tpushim  # pylint: disable=import-outside-toplevel
    try:
        tpushim.patch(**settings_from(options))
    except tpushim.ConfigurationError as e:
        return _fail(f"error: {e}")
    if not options.quiet:
        show_conversions()
    if module is not None:
        return run_module(module, target)
    return run_script(target[0], target[1:])
