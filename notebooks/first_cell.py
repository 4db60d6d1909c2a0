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

SUPPORTED_PYTHON = ((3, 9), (3, 14))  # 3.9-3.11: TensorFlow <= 2.15; 3.12-3.13: TensorFlow >= 2.16
ESTIMATOR_PYTHON = (3, 12)  # TensorFlow <= 2.15 (estimators, TPUEstimator) has wheels below it
SUPPORTED_TF = ((2, 12), (2, 16))  # estimators end with TensorFlow 2.15
TF_INSTALL = ["tensorflow>=2.12,<2.16", "numpy<2"]  # numpy 2 breaks TensorFlow <= 2.15
# Python 3.12/3.13: TensorFlow 2.16-2.21 and tf-keras (Keras 2) of its minor; tpushim brings the
# estimator API itself there; its TPU path there is the strategy engine (TPUStrategy).
ESTIMATOR_API_TF = ((2, 16), (2, 22))
ESTIMATOR_API_TF_INSTALL = ["tensorflow>=2.16,<2.22", "tf-keras>=2.16,<2.22"]
# What docs/how-to/platforms.md installs on Colab's TPU runtime (a v5e-1 without TensorFlow): the
# TPU build of one release, which stops at 2.20, with its libtpu; on Kaggle, tf-keras without its
# dependencies (they would bring the full tensorflow beside Kaggle's tensorflow-cpu).
LIBTPU_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
COLAB_TPU_INSTALL = ["tensorflow==2.20.*", "tensorflow-tpu==2.20.*", "tf-keras~=2.20.0", "-f", LIBTPU_INDEX]
# Kaggle's TPU (JAX and libtpu preinstalled): the JAX engine's converter too, without dependencies
# (tf2jax's would bring the full tensorflow as well).
KAGGLE_TPU_INSTALL = ["tf2jax", "dm-tree"]
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


def _platform():
    """colab-tpu, colab, kaggle-tpu, kaggle or None: told as tpushim tells it, from the environment."""
    tpu = bool(
        os.environ.get("TPU_ACCELERATOR_TYPE") or glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
    )
    if os.environ.get("COLAB_RELEASE_TAG"):
        return "colab-tpu" if tpu else "colab"
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE") or os.environ.get("KAGGLE_URL_BASE"):
        return "kaggle-tpu" if tpu or os.environ.get("ISTPUVM") else "kaggle"  # Kaggle's TPU image sets it
    return None


def _restart(tf_version, what):
    return (
        f"TensorFlow {tf_version} ({what}) is already imported in this session: on Colab: "
        f"Runtime > Restart session, then Run all again, and this cell installs it."
    )


def _tensorflow_for(python):
    """(TensorFlow installed or replaced for this Python, None) or (None, why it cannot be)."""
    tf_version = _tensorflow()
    if python < ESTIMATOR_PYTHON:
        if tf_version is not None and SUPPORTED_TF[0] <= _minor(tf_version) < SUPPORTED_TF[1]:
            return [], None
        if "tensorflow" in sys.modules:
            return None, _restart(tf_version, "no estimators; TensorFlow 2.15 has them")
        if not _pip_install(*TF_INSTALL):
            return None, (
                f"pip could not install {' '.join(TF_INSTALL)} (TensorFlow {tf_version} here has no "
                f"estimators): see its message above. {WHERE_TO_RUN}"
            )
        return [f"installed TensorFlow {_tensorflow()} in place of {tf_version or 'none'}"], None
    # Python 3.12+: TensorFlow 2.16-2.21 with the tf-keras of its minor (tpushim's estimators).
    platform = _platform()
    if platform == "colab-tpu" and _installed("tensorflow-tpu") is None:
        if "tensorflow" in sys.modules:
            return None, _restart(tf_version, "not the TPU build this TPU runtime needs")
        if not _pip_install(*COLAB_TPU_INSTALL):
            return None, f"pip could not install {' '.join(COLAB_TPU_INSTALL)}: see its message above."
        return [
            f"installed TensorFlow {_tensorflow()}, its TPU build and tf-keras "
            f"{_installed('tf-keras', 'tf_keras')} in place of {'TensorFlow ' + tf_version if tf_version else 'none'}"
        ], None
    if tf_version is not None and ESTIMATOR_API_TF[0] <= _minor(tf_version) < ESTIMATOR_API_TF[1]:
        minor = ".".join(tf_version.split(".")[:2])
        keras2 = _installed("tf-keras", "tf_keras")
        if keras2 is not None and _minor(keras2) == _minor(tf_version):
            return [], None
        wanted = [f"tf-keras~={minor}.0"]  # each tf-keras release pins its TensorFlow minor
        if platform == "kaggle-tpu":
            wanted += KAGGLE_TPU_INSTALL
        if not _pip_install(*(["--no-deps"] if platform in ("kaggle", "kaggle-tpu") else []), *wanted):
            return None, f"pip could not install {' '.join(wanted)}: see its message above. {WHERE_TO_RUN}"
        jax_engine = f" and tf2jax {_installed('tf2jax')} (the JAX engine)" if platform == "kaggle-tpu" else ""
        return [f"installed tf-keras {_installed('tf-keras', 'tf_keras')}{jax_engine}"], None
    if "tensorflow" in sys.modules:
        return None, _restart(tf_version, "tpushim supports 2.16-2.21 on this Python")
    if not _pip_install(*ESTIMATOR_API_TF_INSTALL):
        return None, (
            f"pip could not install {' '.join(ESTIMATOR_API_TF_INSTALL)}: see its message above. "
            f"{WHERE_TO_RUN}"
        )
    return [
        f"installed TensorFlow {_tensorflow()} and tf-keras {_installed('tf-keras', 'tf_keras')} "
        f"in place of {'TensorFlow ' + tf_version if tf_version else 'none'}"
    ], None


def check_runtime():
    """(ready, one line: what this runtime can do, or what to do otherwise)."""
    python = tuple(sys.version_info[:2])
    if not SUPPORTED_PYTHON[0] <= python < SUPPORTED_PYTHON[1]:
        return False, (
            f"Python {python[0]}.{python[1]} here: TensorFlow has no wheel tpushim supports for it "
            f"(Python 3.9-3.11: TensorFlow 2.12-2.15; 3.12-3.13: TensorFlow 2.16-2.21). "
            f"{WHERE_TO_RUN}"
        )
    done, problem = _tensorflow_for(python)
    if problem:
        return False, problem
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
    versions = f"Python {python[0]}.{python[1]}, TensorFlow {_tensorflow()}, "
    if python >= ESTIMATOR_PYTHON:
        versions += f"tf-keras {_installed('tf-keras', 'tf_keras')}, "
        # tf.keras as Keras 2 (tf-keras) for the whole session, also where a cell uses tf.keras
        # before tpushim is loaded: TensorFlow reads this once, at tf.keras's first use.
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    line = versions + f"tpushim {_installed('tpushim')}: this runtime runs the notebook" + (
        f" ({'; '.join(done)})" if done else ""
    )
    if python >= ESTIMATOR_PYTHON and _platform() == "colab-tpu":
        # Python 3.11 is no way out here: pip's TensorFlow 2.15 cannot drive this TPU either.
        return True, line + (
            ". On TensorFlow >= 2.16 tpushim brings the estimator API itself; on this TPU runtime "
            "(a v5e-1, PJRT only) its TPU path is the strategy engine (TPUStrategy), proven on "
            "emulated replicas and not yet run on a real TPU."
        )
    if python >= ESTIMATOR_PYTHON:
        return True, line + (
            ". On TensorFlow >= 2.16 tpushim brings the estimator API itself and runs the legacy "
            "script on CPU/GPU with stock 2.15's numbers; its TPU path there is the strategy "
            "engine (TPUStrategy), proven on emulated replicas and not yet run on a real TPU. "
            f"TPUEstimator's path (a TPU v2, v3 or v4): {ON_CLOUD}"
        )
    return True, line + (
        ". The cells below say whether TensorFlow reaches a TPU here; without one they run "
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
