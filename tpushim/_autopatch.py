"""``TPUSHIM_AUTOPATCH=1 python legacy.py``: patch at interpreter start, no code change.

``tpushim-autopatch.pth`` (installed into site-packages by setup.py, for ``pip install .`` and
``pip install -e .`` alike) holds one line that ``site`` executes at every start::

    import os; os.environ.get("TPUSHIM_AUTOPATCH", "").strip().lower() not in ("", "0", ...) and \
        __import__("tpushim._autopatch", fromlist=["run"]).run()

It reads the variable with string methods only -- its content is never evaluated -- and imports this
module only when the variable asks for it, so an interpreter without it pays nothing. :func:`run`
must never break the interpreter: whatever goes wrong becomes a warning.
"""

import os
import warnings

VARIABLE = "TPUSHIM_AUTOPATCH"
ON = ("1", "true", "yes", "on")
OFF = ("", "0", "false", "no", "off")


def wanted(environ=None):
    """True, False, or None when ``TPUSHIM_AUTOPATCH`` holds a value that is neither on nor off."""
    environ = os.environ if environ is None else environ
    value = environ.get(VARIABLE, "").strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    return None


def run(environ=None):
    """Patches when ``TPUSHIM_AUTOPATCH`` says so; returns whether it patched. Never raises."""
    environ = os.environ if environ is None else environ
    try:
        choice = wanted(environ)
        if choice is None:
            _warn(f"{VARIABLE}={environ.get(VARIABLE)!r} is not understood: set it to 1, true, yes "
                  f"or on to patch at start (0, false, no, off or unset: do not). Not patched.")
            return False
        if not choice:
            return False
        from tpushim import _runner, _settings  # pylint: disable=import-outside-toplevel
        if _settings.kill_switch_on(environ):
            return False  # TPUSHIM_MODE=off: leave the interpreter exactly as without tpushim
        import tpushim  # pylint: disable=import-outside-toplevel
        tpushim.patch()  # honours TPUSHIM_MODE, TPUSHIM_TPU, ...; imports no TensorFlow
        _runner.show_conversions()
        return tpushim.is_patched()
    except Exception as e:  # pylint: disable=broad-except
        _warn(f"{VARIABLE} is set, but patching failed, so this interpreter runs unpatched: "
              f"{type(e).__name__}: {e}")
        return False


def _warn(message):
    # Under -W error this raises; site then reports the .pth line and the interpreter still starts.
    warnings.warn(f"tpushim: {message}", RuntimeWarning, stacklevel=3)
