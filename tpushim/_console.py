"""What tpushim prints for people: the one line per conversion on stderr, and its status as lines.

Shared by every way in (``python -m tpushim``, ``%load_ext tpushim``, ``TPUSHIM_AUTOPATCH``), so
they all print the same words. Imports no TensorFlow.
"""

import os
import site

from tpushim import _log, _settings
from tpushim._versions import installed_version_problem

#: The file setup.py puts into site-packages for ``TPUSHIM_AUTOPATCH`` (setup.py spells the name
#: out too: it cannot import the package it installs).
PTH_NAME = "tpushim-autopatch.pth"


def show_conversions(quiet=False, level=None):
    """Makes tpushim's one line per conversion visible on stderr (idempotent), unless ``quiet``.

    Args:
      quiet: True hides them instead (``-q``, ``TPUSHIM_QUIET``).
      level: as :func:`tpushim._log.show` (``-v``: ``"DEBUG"``); None: ``TPUSHIM_LOG_LEVEL``,
        else INFO.
    """
    if quiet:
        hide_conversions()
        return None
    return _log.show(level or _settings.log_level_from_environment())


def hide_conversions():
    """Removes what :func:`show_conversions` added."""
    _log.hide()


def autopatch_files():
    """Paths of the installed :data:`PTH_NAME` files on this interpreter's site dirs."""
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [
        os.path.join(d, PTH_NAME)
        for d in dict.fromkeys(dirs)
        if os.path.isfile(os.path.join(d, PTH_NAME))
    ]


#: How each way in spells "patch this" and "use this option": the command line's hints are
#: commands, a notebook's are the ``%tpushim`` magic.
_HINTS = {
    "command": {"patch": "python -m tpushim SCRIPT patches the script it runs", "option": "--"},
    "notebook": {"patch": "%tpushim patch patches this kernel", "option": "%tpushim --"},
}


def outcome(status, surface="command"):
    """What a ``model_to_estimator`` call returns under ``status`` (a :func:`tpushim.status` dict):
    the core's one decision (:mod:`tpushim._decision`), in words; an option it suggests is spelt
    as ``surface`` (``command`` or ``notebook``) takes it."""
    returns = status["decision"]["returns"]
    return returns.replace(" --", " " + _HINTS[surface]["option"])


def format_status(status, previewing=False, surface="command"):
    """:func:`tpushim.status` as the lines ``python -m tpushim info`` and ``%tpushim`` print.

    Args:
      status: a :func:`tpushim.status` dict.
      previewing: whether ``status`` is of options given for a preview, not of this process.
      surface: ``command`` (``info``) or ``notebook`` (``%tpushim``): how hints are spelt.
    """
    v = status["versions"]
    problem = status.get("unsupported") or installed_version_problem()
    lines = [
        f"tpushim {v['tpushim']}: TensorFlow {v.get('tensorflow') or 'not installed'}, "
        f"Keras {v.get('keras') or '-'}, "
        + (
            f"tf-keras {v.get('tf_keras') or '-'}"  # TensorFlow >= 2.16: Keras 2 is tf-keras
            if status.get("estimator_api", {}).get("provider") == "tpushim"
            else f"tensorflow-estimator {v.get('tensorflow_estimator') or '-'}"
        )
        + f" ({'NOT SUPPORTED' if problem else 'supported'})"
    ]
    if status.get("estimator_api", {}).get("provider") == "tpushim":
        lines.append(f"estimator:   {status['estimator_api']['says']}")
    if problem:
        lines.append(f"  {problem}")
    applied = [str(a) for a in status["applied"].values()]
    if status["patched"]:
        lines.append(
            "patched:     yes"
            + (" (applies when TensorFlow is imported)" if "pending import" in applied else "")
        )
    else:
        lines.append(
            "patched:     no, not this process"
            + (
                " (the options given are previewed below)"
                if previewing
                else f" ({_HINTS[surface]['patch']})"
            )
        )
    lines.append(f"mode:        {status['mode']} (from {status['mode_source']})")
    if status["tpu"]:
        lines.append(f"TPU:         {status['tpu']} (from {status['tpu_source']})")
    else:
        # Here, not at the top: autopatch imports this module at every start, _detect is slower.
        from tpushim import _detect

        lines.append(
            f"TPU:         none found (looked at TPUSHIM_TPU, "
            f"{', '.join(_detect.RESOLVER_ENV_VARS)}, COLAB_TPU_ADDR, TPU VM device files)"
        )
    platform = status.get("platform")
    if platform:
        told = ", ".join(platform["evidence"])
        lines.append(f"platform:    {platform['where']}" + (f" (from {told})" if told else ""))
    lines.append(f"batch size:  {status['batch_size'] or 'taken from the input_fn'}")
    default_iterations = f"default ({_settings.DEFAULT_ITERATIONS_PER_LOOP})"
    lines.append(f"iterations per loop: {status['iterations_per_loop'] or default_iterations}")
    returns = (
        outcome(status, surface) if not problem else "the stock estimator (nothing is patched)"
    )
    lines.append(
        (
            "model_to_estimator returns: "
            if status["patched"] or previewing
            else "model_to_estimator, once patched, returns: "
        )
        + returns
    )
    autopatch = os.environ.get("TPUSHIM_AUTOPATCH")
    files = autopatch_files()
    lines.append(
        "autopatch:   TPUSHIM_AUTOPATCH="
        + (repr(autopatch) if autopatch is not None else "unset")
        + "; "
        + (
            f"{PTH_NAME} installed in {os.path.dirname(files[0])}"
            if files
            else f"{PTH_NAME} not found on this interpreter (reinstall tpushim)"
        )
    )
    return "\n".join(lines)
