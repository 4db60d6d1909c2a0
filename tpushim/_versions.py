"""The version guard: which TensorFlow, Keras and tensorflow_estimator tpushim can patch.

One name, "version problem", for the guard's message (None when the versions are supported):
:func:`version_problem` decides on version strings (pure, tested on strings);
:func:`installed_version_problem` and :func:`version_problem_now` read the versions
(:func:`installed_versions`: imported modules first, installed metadata when asked -- never an
import of TensorFlow) and decide. What the guard remembers in a process (its verdict, whether it warned) is
part of the patching state in :mod:`tpushim._patch`, which runs it before anything is patched.
"""

import os
import sys
import warnings

from tpushim import version

#: The supported TensorFlow range is data (tpushim/version.py): ``(lowest, first unsupported)``.
SUPPORTED_TF = version.tf_range()
FIX = (
    f'pip install "tensorflow{version.tf_specifier()}"  (or "tensorflow-cpu{version.tf_specifier()}"; '
    f"tpushim supports TensorFlow {version.tf_span()}; from {version.ESTIMATOR_API_TF} on with "
    f"tf-keras of the same minor release)"
)
#: From this release on tpushim brings the estimator API legacy scripts call
#: (tpushim/_estimator_api).
ESTIMATOR_API_TF = version.estimator_api_tf()
#: The variable that makes ``tf.keras`` tf_keras (Keras 2) on TensorFlow >= 2.16, and the values
#: TensorFlow reads as on (tensorflow/__init__.py, lazy_loader.py).
LEGACY_KERAS = "TF_USE_LEGACY_KERAS"
LEGACY_KERAS_ON = ("true", "True", "1")

#: Distributions that install the ``tensorflow`` module.
TF_DISTS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-tpu",
    "tensorflow-intel",
    "tensorflow-macos",
    "tf-nightly",
    "tf-nightly-cpu",
)


def _version_tuple(text):
    if not text:  # patch() before TensorFlow: nothing to parse, and no re to import
        return None
    import re

    parts = re.findall(r"\d+", str(text))[:2]
    return tuple(int(p) for p in parts) if len(parts) == 2 else None


def version_problem(tf_version, keras_version, has_estimator, tf_keras_version=None):
    """Why tpushim cannot patch these versions, or None when it can. Pure: tested on strings.

    Args:
      tf_version: TensorFlow's version string; None when not known yet (not imported) or not
        installed.
      keras_version: the ``keras`` package's version string, or None.
      has_estimator: whether ``tensorflow_estimator`` is importable.
      tf_keras_version: tf_keras's version, or None: read where ``TF_USE_LEGACY_KERAS`` makes
        it ``tf.keras`` or TensorFlow is 2.16 or later (where tpushim sets that variable).
    """
    tf_v, keras_v = _version_tuple(tf_version), _version_tuple(keras_version)
    tf_keras_v = _version_tuple(tf_keras_version)
    low, high = SUPPORTED_TF
    fix = FIX
    if tf_v is not None and (tf_v >= high or tf_v < low):
        why = f"tpushim is tested on TensorFlow {version.tf_span()} only"
    elif tf_v is not None and tf_v >= ESTIMATOR_API_TF:
        # tpushim's own estimator API: Keras 2 must be there as tf_keras, of TF's own minor.
        wanted = f"{tf_v[0]}.{tf_v[1]}"
        fix = (
            f'pip install "tf-keras~={wanted}.0"  (each tf-keras release pins its TensorFlow minor)'
        )
        if tf_keras_v is None:
            why = (
                f"TensorFlow {ESTIMATOR_API_TF[0]}.{ESTIMATOR_API_TF[1]} and later run legacy Keras "
                f"scripts through tf_keras (Keras 2), which is not installed"
            )
        elif tf_keras_v != tf_v:
            why = f"tf_keras {tf_keras_version} is not the one for TensorFlow {wanted}"
        else:
            return None
    elif keras_v is not None and keras_v >= (3, 0):
        why = "Keras 3 has no model_to_estimator"
    elif not has_estimator:
        why = (
            "tensorflow_estimator is not installed" if tf_version else "TensorFlow is not installed"
        )
    else:
        return None
    found = (
        f"TensorFlow {tf_version} with Keras {keras_version or '(none)'}"
        if tf_version
        else "this environment"
    )
    if tf_keras_version:
        found += f" and tf_keras {tf_keras_version}"
    return (
        f"tpushim does not support {found}: {why}. Supported: TensorFlow {version.tf_span()} "
        f"with its Keras 2 (tensorflow_estimator up to 2.15, tf_keras from 2.16). "
        f"Nothing was patched. Fix: {fix}"
    )


def dist_version(module_name, dist_names):
    """Version of the installed distribution that provides ``module_name``, read from its metadata
    (nothing is imported), or None. The dist-info beside the module wins: a second TensorFlow
    distribution elsewhere on the path is not the one ``import`` would load."""
    from importlib.machinery import PathFinder

    module_spec = PathFinder.find_spec(module_name)
    if module_spec is None:
        return None
    location = (list(module_spec.submodule_search_locations or ()) or [module_spec.origin or ""])[0]
    found = _dist_info_version(os.path.dirname(location), dist_names)
    if found:
        return found
    from importlib import metadata  # slow (email, socket, typing): where the above finds none

    for name in dist_names:
        for dist in metadata.distributions(name=name, path=[os.path.dirname(location)]):
            return dist.version
    for name in dist_names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None


def _dist_info_version(directory, dist_names):
    """The version in ``NAME-VERSION.dist-info/METADATA`` in ``directory`` for the first of
    ``dist_names`` installed there, or None: what importlib.metadata reads, without importing it
    (``patch()`` reads TensorFlow's version this way on 2.16+ before TensorFlow is imported)."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return None
    by_name = {}
    for entry in entries:
        if entry.endswith(".dist-info"):
            dist = entry[: -len(".dist-info")].rpartition("-")[0]
            by_name.setdefault(dist.lower().replace("-", "_").replace(".", "_"), entry)
    for name in dist_names:
        entry = by_name.get(name.lower().replace("-", "_").replace(".", "_"))
        if entry is None:
            continue
        try:
            with open(os.path.join(directory, entry, "METADATA"), encoding="utf-8") as f:
                for line in f:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():  # the headers end: no Version line
                        break
        except OSError:
            pass
    return None


def installed_versions(read_metadata=False):
    """``(tensorflow, keras, has_estimator, tf_keras)`` as :func:`version_problem` takes them.

    Modules already imported give their ``__version__``. With ``read_metadata`` the rest are read
    from installed metadata, still without importing TensorFlow (slower: for the failure path and
    the command line, not for every ``patch()``).
    """

    def imported(name):
        return getattr(sys.modules.get(name), "__version__", None) if name in sys.modules else None

    tf_version, keras_version = imported("tensorflow"), imported("keras")
    if tf_version is None and uses_own_estimator():  # TensorFlow >= 2.16, not imported yet
        tf_version = _tf_version_cheaply()
    if read_metadata:
        tf_version = tf_version or dist_version("tensorflow", TF_DISTS)
        keras_version = keras_version or dist_version("keras", ("keras", "keras-nightly"))
    elif tf_version is None:
        keras_version = None  # a keras imported without TensorFlow is not necessarily tf.keras
    if "tensorflow_estimator" in sys.modules:
        has_estimator = True
    else:
        from importlib.machinery import PathFinder

        has_estimator = PathFinder.find_spec("tensorflow_estimator") is not None
    tf_keras_version = None
    tf_v = _version_tuple(tf_version)
    if (tf_v is not None and tf_v >= ESTIMATOR_API_TF) or os.environ.get(
        LEGACY_KERAS, ""
    ).strip().lower() in ("1", "true", "yes"):
        tf_keras_version = imported("tf_keras") or (
            dist_version("tf_keras", ("tf-keras", "tf-keras-nightly"))
            if (read_metadata or tf_v is not None) and tf_keras_importable()
            else None
        )
    return tf_version, keras_version, has_estimator, tf_keras_version


def installed_version_problem():
    """The guard's message for this installation, or None: what ``patch()`` would refuse with.

    Reads installed metadata (imports no TensorFlow); warns nothing. The command line stops on it.
    """
    return version_problem(*installed_versions(read_metadata=True))


def version_problem_now():
    """The guard's message for what is imported now, or None: the cheap check every ``patch()`` runs.

    Only when it refuses are the versions not imported yet read from installed metadata, so that
    the message names every installed version (``patch()`` before TensorFlow's import).
    """
    problem = version_problem(*installed_versions())
    return (installed_version_problem() or problem) if problem else None


def installed():
    """``{"tensorflow", "keras", "tensorflow_estimator", "tf_keras", "tpushim": version}`` (None: not
    installed).

    ``keras`` is the version of the Keras a script's ``tf.keras`` is: on TensorFlow >= 2.16 with
    ``TF_USE_LEGACY_KERAS`` on (tpushim sets it when it patches) that is tf-keras (Keras 2), not
    the ``keras`` package (Keras 3), which such a script never uses as ``tf.keras``.
    """
    out = {"tpushim": version.__version__}
    for key, dists in (
        ("tensorflow", TF_DISTS),
        ("keras", ("keras",)),
        ("tensorflow_estimator", ("tensorflow-estimator",)),
        ("tf_keras", ("tf-keras", "tf-keras-nightly")),
    ):
        module = sys.modules.get(key)
        out[key] = (getattr(module, "__version__", None) if module else None) or dist_version(
            key, dists
        )
    if out["tf_keras"] and uses_own_estimator() and _legacy_keras_on():
        out["keras"] = out["tf_keras"]  # without tf-keras, the Keras there is (3) is named
    return out


class guard_warning_silenced:
    """``with`` block in which the guard does not warn: for callers (``info``, ``%load_ext
    tpushim``) that show its message themselves, so that it appears once."""

    def __enter__(self):
        self._context = warnings.catch_warnings()
        self._context.__enter__()
        warnings.filterwarnings(
            "ignore", message="tpushim does not support", category=RuntimeWarning
        )
        return self

    def __exit__(self, *exc_info):
        return self._context.__exit__(*exc_info)


# --- TensorFlow >= 2.16: tpushim's estimator API, and tf.keras as tf_keras ---------------------

_installed_tf = []  # TensorFlow's version read once from metadata (patch() runs often)


def _tf_version_cheaply():
    """The imported TensorFlow's version, else the installed one (metadata read once), or None.

    Metadata is read only where TensorFlow >= 2.16 is possible: tf_keras is installed or
    tensorflow_estimator is not; an environment of TF <= 2.15 with its estimator skips it.
    """
    module = sys.modules.get("tensorflow")
    if module is not None:
        return getattr(module, "__version__", None)
    if not _installed_tf:
        from importlib.machinery import PathFinder

        maybe_new = PathFinder.find_spec("tf_keras") is not None or (
            PathFinder.find_spec("tensorflow_estimator") is None
        )
        _installed_tf.append(dist_version("tensorflow", TF_DISTS) if maybe_new else None)
    return _installed_tf[0]


def uses_own_estimator():
    """True where TensorFlow >= 2.16 is imported or installed: tf.estimator is gone, and tpushim
    runs on its own Estimator (:mod:`tpushim._estimator_api`). Not the ``engine`` setting (which
    picks TPUEstimator or the strategy engine for the TPU path)."""
    tf_v = _version_tuple(_tf_version_cheaply())
    return tf_v is not None and ESTIMATOR_API_TF <= tf_v < SUPPORTED_TF[1]


def _legacy_keras_on():
    return os.environ.get(LEGACY_KERAS) in LEGACY_KERAS_ON


def tf_keras_importable():
    """Whether ``import tf_keras`` would find it (``sys.meta_path``'s finders asked; nothing is
    imported): only then does ``TF_USE_LEGACY_KERAS=1`` leave TensorFlow a Keras to load."""
    if "tf_keras" in sys.modules:
        return True
    from importlib.util import find_spec

    try:
        return find_spec("tf_keras") is not None
    except (ImportError, ValueError):  # a finder that refuses it
        return False


def legacy_keras_problem(quiet=lambda: False):
    """Makes ``tf.keras`` tf_keras (Keras 2) on TensorFlow >= 2.16; None, or why it cannot.

    ``TF_USE_LEGACY_KERAS`` is read by TensorFlow when ``tf.keras`` is first touched: tpushim
    sets it (one line says so, unless ``quiet()``) before that. Where a ``keras`` of TensorFlow's
    already resolved to Keras 3, it is too late, and the message says how to start instead. Where
    tf_keras cannot be imported, nothing is set (``tf.keras`` stays the Keras there is, instead of
    failing at its first use): the version guard then says what to install.
    """
    if not uses_own_estimator() or _legacy_keras_on() or not tf_keras_importable():
        return None
    tf_module = sys.modules.get("tensorflow")
    if tf_module is not None:
        from tpushim._estimator_api import _tfprivate

        resolved = _tfprivate.keras_loaders_resolved_to_keras3(tf_module)
        if resolved:
            return (
                f"tpushim does not support Keras 3 as tf.keras: {', '.join(resolved)} already "
                f"resolved to Keras 3 (TensorFlow {tf_module.__version__}) before tpushim could "
                f"set {LEGACY_KERAS}=1, and Keras 3 has no model_to_estimator. Nothing was "
                f"patched. Fix: call tpushim.patch() before the "
                f"script first uses tf.keras, or start it with `python -m tpushim script.py`, "
                f"TPUSHIM_AUTOPATCH=1 or {LEGACY_KERAS}=1 in the environment."
            )
    os.environ[LEGACY_KERAS] = "1"
    from tpushim import _log

    _log.news(
        f"tpushim set {LEGACY_KERAS}=1: tf.keras is tf_keras (Keras 2) on TensorFlow "
        f"{_tf_version_cheaply()}, and tf.estimator is tpushim's while it is patched",
        quiet(),
    )
    return None
