"""Run a script or a ``-m`` module in this process exactly as ``python`` would run it.

Same ``sys.argv``, ``sys.path[0]``, ``__main__`` and ``__file__``, and an uncaught exception
printed as Python prints it, without our frames. ``SystemExit`` and ``KeyboardInterrupt`` pass
through, so Python itself turns them into the exit status.

In this process rather than by exec'ing a fresh interpreter with the autopatch variable set (as
OpenTelemetry's ``opentelemetry-instrument`` does), though an exec'd interpreter would give the
same argv, ``__main__`` and traceback for free: ``python -m tpushim check`` must run the script
inside the preflight's recorder, in this process, anyway; options handed over as ``TPUSHIM_*``
variables stop being options (``status()`` says ``from TPUSHIM_MODE``, not ``from argument``;
``TPUSHIM_MODE=off`` must be kept from being overwritten; every Python process the script starts
is patched too); the interpreter's flags (``-S``, ``-X``, ``-W``) would have to be re-created, and
the autopatch .pth would have to be installed. Exec also starts a second interpreter.
"""

import builtins
import contextlib
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import types

#: While :func:`main_kept` is active: a script's ``__main__`` stays ``sys.modules["__main__"]``
#: after the script ends.
_KEEPING = []


@contextlib.contextmanager
def main_kept():
    """While active, the ``__main__`` module a script run here ran as stays
    ``sys.modules["__main__"]`` after the script ends, as in python, where it stays until the
    process ends; the one before is restored on exit.

    The preflight's checks run after the script: a clone of its model rebuilds a ``Lambda`` from
    its config, with the globals of ``sys.modules[the function's module]`` (Keras's
    ``Lambda.from_config``), so a ``Lambda`` reading one of the script's globals (``SCALE``, a
    helper function) must find the script's ``__main__`` there, not this process's.
    """
    saved = sys.modules.get("__main__")
    _KEEPING.append(True)
    try:
        yield
    finally:
        _KEEPING.pop()
        if saved is not None:
            sys.modules["__main__"] = saved


def script_problem(path):
    """Why python could not run ``path`` (its own message), or None."""
    if path == "-":
        return "reading a script from stdin is not supported; save it to a file"
    if not os.path.exists(path):
        return f"can't open file {path!r}: [Errno 2] No such file or directory"
    return None


def module_problem(name):
    """Why ``python -m name`` could not run it (its own message), or None."""
    try:
        spec = importlib.util.find_spec(name)  # imports the parent packages, as python -m does
        if spec is None:
            return f"No module named {name!r}"
        if (
            spec.submodule_search_locations is not None
            and importlib.util.find_spec(name + ".__main__") is None
        ):
            return f"No module named {name}.__main__; {name!r} is a package and cannot be directly executed"
    except (ImportError, ValueError) as e:
        return str(e)
    return None


def _print_uncaught(exc):
    """Prints ``exc`` as Python prints an uncaught exception, without this module's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in (__name__, "runpy"):
        tb = tb.tb_next
    # excepthook prints the exception's own __traceback__, so the trimmed one goes there.
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)


def _run_as_python_would(run, reported=None):
    """``(exit code, the uncaught exception or None)`` of ``run()``; an uncaught exception is
    printed unless ``reported(exc)`` says the caller reports it otherwise."""
    try:
        run()
    except (SystemExit, KeyboardInterrupt):
        raise  # Python itself turns these into the exit status (and SIGINT), as without tpushim
    except BaseException as exc:
        if reported is None or not reported(exc):
            _print_uncaught(exc)
        return 1, exc
    return 0, None


def _exec_as_main(file):
    """Runs a source file as python runs its script: a fresh ``__main__``, ``__file__`` = ``file``.

    Not ``runpy.run_path``: it sets ``sys.argv[0]`` to the path it is given, and python keeps
    ``sys.argv[0]`` as typed while giving ``__file__`` (and tracebacks) the absolute path.
    """
    with open(file, "rb") as f:
        source = f.read()
    code = compile(source, file, "exec", dont_inherit=True)  # bytes: honours a coding cookie
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=file,
        __cached__=None,
        __package__=None,
        __spec__=None,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", file),
    )
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved is not None and not _KEEPING:
            sys.modules["__main__"] = saved


def _runpy_main(run):
    """Runs ``run()`` (runpy's, as ``__main__``); where :func:`main_kept` is active, the
    namespace the code ran in stays ``sys.modules["__main__"]`` as a module (runpy runs it in a
    temporary module and puts the one before back)."""
    namespace = None
    try:
        namespace = run()  # a copy of the namespace
    except BaseException as exc:
        namespace = _main_globals(exc.__traceback__)
        raise
    finally:
        if _KEEPING and namespace is not None:
            module = types.ModuleType("__main__")
            module.__dict__.update(namespace)
            sys.modules["__main__"] = module


def _main_globals(tb):
    """The globals of the outermost ``__main__`` code an exception went through (runpy's
    temporary module's, while it ran the script), or None."""
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            return frame.f_globals
        tb = tb.tb_next
    return None


def run_script(path, args, reported=None):
    """Runs ``path`` as ``python path args...`` would.

    ``reported(exc)``: True for an uncaught exception the caller reports itself (the preflight's
    refused conversions), which is then not printed.

    Returns:
      ``(exit code, uncaught exception or None)``; the exception has been printed as python
      prints it. ``SystemExit`` and ``KeyboardInterrupt`` are raised, as from python's script.
    """
    sys.argv = [path, *args]
    if not sys.flags.safe_path:
        if os.path.isfile(path):
            # As python does: the script's own folder, symlinks resolved, replaces ours (the cwd).
            sys.path[0] = os.path.dirname(os.path.realpath(path))
        else:
            del sys.path[0]  # a folder or zip with __main__.py: run_path puts it first itself
    if os.path.isfile(path) and not path.endswith((".pyc", ".pyo")):
        # python 3.9+ makes __main__.__file__ absolute (the cwd joined, not normalised).
        file = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
        return _run_as_python_would(lambda: _exec_as_main(file), reported)
    return _run_as_python_would(
        lambda: _runpy_main(lambda: runpy.run_path(path, run_name="__main__")), reported
    )


def run_module(name, args, reported=None):
    """Runs module ``name`` as ``python -m name args...`` would (``sys.path[0]`` stays the cwd).

    Returns:
      as :func:`run_script`.
    """
    sys.argv = [name, *args]
    return _run_as_python_would(
        lambda: _runpy_main(lambda: runpy.run_module(name, run_name="__main__", alter_sys=True)),
        reported,
    )
