"""``TPUSHIM_AUTOPATCH=1 python legacy.py``: patch at interpreter start, no code change.

``tpushim-autopatch.pth`` (put into site-packages by setup.py, for ``pip install .`` and
``pip install -e .`` alike) holds one line that ``site`` executes at every interpreter start. It
reads the variable with string methods only -- its content is never evaluated -- and only when the
variable is on does it run this file (``runpy.run_path``) and call :func:`start`. An interpreter
without the variable pays one dictionary lookup and imports nothing.

Why this file is loaded by path and the patch waits: ``site`` runs .pth lines while it is still
building ``sys.path``. A user-site or venv install of tpushim is processed before the system
site-packages that may hold tpushim's dependencies, so importing the ``tpushim`` package from the
.pth line could fail there. This module therefore imports only the standard library, and
:func:`start` defers ``tpushim.patch()`` to the end of ``site`` (its ``import sitecustomize``), or
to the first import of TensorFlow, whichever comes first. Nothing here ever raises: whatever goes
wrong becomes a ``RuntimeWarning`` and the interpreter starts unpatched.
"""

import os
import sys
import warnings

VARIABLE = "TPUSHIM_AUTOPATCH"
ON = ("1", "true", "yes", "on")
OFF = ("", "0", "false", "no", "off")  # the .pth line skips exactly these without loading us

#: Imports that mean "sys.path is complete now": site's last steps, or TensorFlow itself.
TRIGGERS = frozenset(
    {"sitecustomize", "usercustomize", "tensorflow", "tensorflow_estimator", "keras"}
)


def wanted(environ=None):
    """True, False, or None when ``TPUSHIM_AUTOPATCH`` holds a value that is neither on nor off."""
    environ = os.environ if environ is None else environ
    value = environ.get(VARIABLE, "").strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    return None


def _kill_switch(environ):
    # By hand, _settings.resolve's rule: this runs from the .pth before sys.path is complete, so
    # nothing of the package may be imported yet.
    return environ.get("TPUSHIM_MODE", "").strip().lower() == "off"


def patch_now():
    """``tpushim.patch()`` with the ``TPUSHIM_*`` settings, conversion lines on stderr.

    Returns whether tpushim is patched. Never raises.
    """
    try:
        # importable only once sys.path is complete
        from tpushim._console import show_conversions
        from tpushim._patch import is_patched, patch
        from tpushim._settings import resolve

        # Lines shown first: patch() itself may say one (tpushim set TF_USE_LEGACY_KERAS=1).
        show_conversions(quiet=resolve(()).quiet)  # TPUSHIM_QUIET
        patch()  # imports no TensorFlow
        return is_patched()
    except Warning:
        raise
    except Exception as e:
        problem = f"{type(e).__name__}: {e}"
        _warn(
            f"{VARIABLE} is set, but patching failed, so this interpreter runs unpatched: {problem}"
        )
        _remind_at_first_conversion(problem)
        return False


def _remind_at_first_conversion(problem):
    """Says it again at the first ``model_to_estimator`` call, in the conversion line's format:
    the warning at start-up is one line among TensorFlow's many, and the run goes on stock.

    A one-shot wrapper on keras_lib's ``model_to_estimator`` (as :mod:`tpushim._patch` wraps it,
    when keras_lib is imported): it takes itself off at its first call, and says nothing if
    tpushim was patched in code since.
    """
    try:
        import functools

        from tpushim import _hooks, _patch
    except Exception:  # nothing to remind with: the warning stands alone
        return

    def install(module):
        original = getattr(module, _patch.TARGET)

        @functools.wraps(original)
        def reminding(*args, **kwargs):
            if getattr(module, _patch.TARGET, None) is reminding:
                setattr(module, _patch.TARGET, original)
            if not told and not _patch.is_patched():
                told.append(True)
                estimator = "EstimatorV2" if kwargs.get("use_v2_estimator") else "Estimator"
                sys.stderr.write(
                    f"tpushim: model_to_estimator -> stock {estimator} ({VARIABLE} is set, but "
                    f"tpushim is not patched: {problem})\n"
                )
                sys.stderr.flush()
            return original(*args, **kwargs)

        setattr(module, _patch.TARGET, reminding)

    told = []
    _hooks.when_imported(_patch.KERAS_LIB, install)


class _PatchWhenPathIsComplete:
    """A one-shot ``sys.meta_path`` entry: at the first trigger import it patches and leaves.

    It finds nothing itself (``find_spec`` returns None), so every import proceeds as without it.
    """

    # site runs a venv's .pth files twice when it includes the system site-packages (CPython
    # < 3.12), and each run loads this file anew: this mark, not the class, tells ours apart.
    tpushim_autopatch = True

    def find_spec(self, fullname, path=None, target=None):
        del path, target
        if fullname in TRIGGERS:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                return None  # already left (a nested import got here first)
            patch_now()
        return None


def start(environ=None):
    """Entry point of ``tpushim-autopatch.pth``. Returns what it did; never raises.

    Returns:
      ``"deferred"`` (patches at the end of start-up), ``"patched"`` (tpushim was already
      imported, so it patched at once), or ``"off"`` (the variable is off or not understood, or
      ``TPUSHIM_MODE=off``).
    """
    environ = os.environ if environ is None else environ
    try:
        choice = wanted(environ)
        if choice is None:
            _warn(
                f"{VARIABLE}={environ.get(VARIABLE)!r} is not understood: set it to 1, true, yes "
                f"or on to patch at start (0, false, no, off or unset: do not). Not patched."
            )
            return "off"
        if not choice or _kill_switch(environ):
            return "off"  # TPUSHIM_MODE=off: the interpreter stays exactly as without tpushim
        if "tpushim" in sys.modules:  # a .pth processed late (site.addsitedir): no need to wait
            patch_now()
            return "patched"
        if not any(getattr(f, "tpushim_autopatch", False) for f in sys.meta_path):
            sys.meta_path.insert(0, _PatchWhenPathIsComplete())
        return "deferred"
    except Warning:
        raise  # -W error: the user asked for warnings to raise
    except Exception as e:
        _warn(
            f"{VARIABLE} is set, but autopatching failed, so this interpreter runs unpatched: "
            f"{type(e).__name__}: {e}"
        )
        return "off"


def _warn(message):
    # Under -W error this raises; site then reports the .pth line and the interpreter still starts.
    warnings.warn(f"tpushim: {message}", RuntimeWarning, stacklevel=3)
