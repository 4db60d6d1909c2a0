# tpushim first cell: can this runtime run the notebook? One line says what it can do, and what to do
# otherwise; the cells below run only when it can (each one else prints why it was skipped).
# The same cell opens every tpushim notebook: notebooks/first_cell.py is its source.
import glob
import importlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys

SUPPORTED_PYTHON = ((3, 9), (3, 12))  # TensorFlow <= 2.15 has wheels for Python 3.9-3.11
SUPPORTED_TF = ((2, 12), (2, 16))  # estimators end with TensorFlow 2.15
TF_INSTALL = ["tensorflow>=2.12,<2.16", "numpy<2"]  # numpy 2 breaks TensorFlow <= 2.15
# Where else to run, kept apart: Colab's own menu, and Google Cloud (a TPU VM you create).
ON_COLAB = "On Colab: Runtime > Change runtime type > Runtime version: one with Python 3.11."
ON_CLOUD = (
    "On Google Cloud: a TPU VM created from a TensorFlow 2.15 image "
    "(gcloud compute tpus tpu-vm create ... --version tpu-vm-tf-2.15.1-se; TPU v2, v3 or v4)."
)
WHERE_TO_RUN = f"{ON_COLAB} {ON_CLOUD}"
# tpushim is not on PyPI: pip installs it from its repository (TensorFlow is handled above).
REPOSITORY = "tpushim @ git+https://github.com/tpushim/tpushim"


def _installed(*dists):
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


def _tensorflow():
    return _installed("tensorflow", "tensorflow-cpu", "tensorflow-tpu")


def _minor(version):
    return tuple(int(part) for part in version.split(".")[:2])


def _pip_install(*requirements):
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", *requirements]).returncode == 0


def check_runtime():
    """(ready, one line: what this runtime can do, or what to do otherwise)."""
    python = tuple(sys.version_info[:2])
    if not SUPPORTED_PYTHON[0] <= python < SUPPORTED_PYTHON[1]:
        return False, (
            f"Python {python[0]}.{python[1]} here, and TensorFlow 2.15 (the last release with "
            f"estimators) has no wheel for it. {WHERE_TO_RUN}"
        )
    done = []
    tf_version = _tensorflow()
    if tf_version is None or not SUPPORTED_TF[0] <= _minor(tf_version) < SUPPORTED_TF[1]:
        if "tensorflow" in sys.modules:
            return False, (
                f"TensorFlow {tf_version} (no estimators) is already imported in this session: "
                f"on Colab: Runtime > Restart session, then Run all again, and this cell installs "
                f"TensorFlow 2.15."
            )
        if not _pip_install(*TF_INSTALL):
            return False, (
                f"pip could not install {' '.join(TF_INSTALL)} (TensorFlow {tf_version} here has no "
                f"estimators): see its message above. {WHERE_TO_RUN}"
            )
        done.append(f"installed TensorFlow {_tensorflow()} in place of {tf_version or 'none'}")
    if importlib.util.find_spec("tpushim") is None:
        wheels = sorted(glob.glob("tpushim-*.whl")) + sorted(glob.glob("dist/tpushim-*.whl"))
        source = wheels[-1] if wheels else ("./tpushim" if os.path.isfile("tpushim/pyproject.toml") else REPOSITORY)
        if not _pip_install(source):
            return False, (
                f"pip could not install {source} (tpushim is not on PyPI): see its message above. "
                "Or upload a wheel (`python -m build --wheel` in a tpushim checkout makes "
                "dist/tpushim-*.whl) or a checkout as ./tpushim, then run this cell again."
            )
        importlib.invalidate_caches()
        done.append(f"installed tpushim from {source}")
    return True, (
        f"Python {python[0]}.{python[1]}, TensorFlow {_tensorflow()}, tpushim "
        f"{_installed('tpushim')}: this runtime runs the notebook"
        + (f" ({'; '.join(done)})" if done else "")
        + ". The cells below say whether TensorFlow reaches a TPU here; without one they run "
        "tpushim's cpu mode, the TPU code path on the CPU."
    )


def _skip_cells_below(reason):
    """Until this cell runs again and succeeds, every other cell prints why it is skipped."""
    try:
        shell = get_ipython()  # noqa: F821 (IPython's builtin)
    except NameError:
        return  # not in IPython: nothing to skip
    kept = [t for t in shell.input_transformers_post if not getattr(t, "tpushim_skip", False)]
    shell.input_transformers_post[:] = kept
    if reason is None:
        return

    def skip(lines):
        if lines and lines[0].startswith("# tpushim first cell"):
            return lines  # this cell again: run it
        return [f"print({'skipped: ' + reason!r})\n"]

    skip.tpushim_skip = True
    shell.input_transformers_post.append(skip)


READY, ANSWER = check_runtime()
print(("ready: " if READY else "cannot run here: ") + ANSWER)
_skip_cells_below(None if READY else "this runtime cannot run the notebook (see the first cell)")
