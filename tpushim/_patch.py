"""Patching: one table of targets, applied and removed under one lock.

Why a private TensorFlow path: every public spelling of ``model_to_estimator`` --
``tf.keras.estimator``, ``tf.compat.v1/v2.keras.estimator``, ``keras.estimator`` and names imported
from them before or after :func:`patch` -- calls ``keras_lib.model_to_estimator`` by attribute at
call time, with ``use_v2_estimator`` telling v1 from v2. Wrapping that one attribute therefore
catches all of them; wrapping ``tf.keras.estimator`` would miss five of seven.

``keras_lib`` is imported lazily by TensorFlow (on the first ``model_to_estimator`` call), so the
wrapper is applied by a post-import hook: immediately when the module is already imported,
otherwise the moment it is. ``import tpushim`` and ``patch()`` import no TensorFlow -- nor wrapt,
inspect or logging before there is something to wrap: start-up stays within a few milliseconds.
"""

import contextvars
import os
import sys
import _thread  # threading's RLock without importing threading (and functools, collections)
import warnings

from tpushim import _hooks, _settings, version


def _logger():
    import logging  # pylint: disable=import-outside-toplevel  # lazily: 3 ms of start-up
    return logging.getLogger("tpushim")

# The supported TensorFlow range is data (tpushim/version.py), checked before anything is patched.
SUPPORTED_TF = version.tf_range()
FIX = (f'pip install "tensorflow{version.tf_specifier()}"  (or "tensorflow-cpu{version.tf_specifier()}"; '
       f'tpushim supports TensorFlow {version.tf_span()})')


class Target:
    """One attribute tpushim wraps: ``module.attr``."""

    __slots__ = ("module", "attr")

    def __init__(self, module, attr):
        self.module, self.attr = module, attr


#: Everything tpushim patches. patch() and unpatch() read only this table, so they cannot drift.
KERAS_LIB = "tensorflow_estimator.python.estimator.keras_lib"
TARGETS = (Target(KERAS_LIB, "model_to_estimator"),)

_lock = _thread.RLock()
_process_layer = None  # the explicit arguments of the active patch(), or None
_open_scopes = 0  # scopes entered and not yet left, across all threads
_scope_layers = contextvars.ContextVar("tpushim_scope_layers", default=())
_hooks_registered = False  # a post-import hook for the targets is waiting
_tf_hook_registered = False  # ... and one for tensorflow (the version guard)
_unsupported = None  # the version guard's message once it refused
_warned = False


_wrapper_type = None


def _wrapper_class():
    """tpushim's wrapper type (a wrapt.FunctionWrapper): ``isinstance`` tells our layer from others'."""
    global _wrapper_type
    if _wrapper_type is None:
        import wrapt  # pylint: disable=import-outside-toplevel
        _wrapper_type = type("TPUShimWrapper", (wrapt.FunctionWrapper,), {"__module__": __name__})
    return _wrapper_type


def is_ours(obj):
    """True when ``obj`` is tpushim's wrapper (without importing wrapt when nothing was wrapped)."""
    return _wrapper_type is not None and isinstance(obj, _wrapper_type)


# --- version guard -------------------------------------------------------------------------------

def _version_tuple(text):
    if not text:  # patch() before TensorFlow: nothing to parse, and no re to import
        return None
    import re  # pylint: disable=import-outside-toplevel
    parts = re.findall(r"\d+", str(text))[:2]
    return tuple(int(p) for p in parts) if len(parts) == 2 else None


def version_problem(tf_version, keras_version, has_estimator, tf_keras_version=None):
    """Why tpushim cannot patch these versions, or None when it can. Pure: tested on strings.

    Args:
      tf_version: TensorFlow's version string; None when not known yet (not imported) or not
        installed.
      keras_version: the ``keras`` package's version string, or None.
      has_estimator: whether ``tensorflow_estimator`` is importable.
      tf_keras_version: tf_keras's version when ``TF_USE_LEGACY_KERAS`` makes it ``tf.keras``.
    """
    tf_v, keras_v = _version_tuple(tf_version), _version_tuple(keras_version)
    low, high = SUPPORTED_TF
    if tf_v is not None and tf_v >= high:
        why = (f"TensorFlow {high[0]}.{high[1]} removed tf.estimator and Keras 2's model_to_estimator "
               f"(tf_keras does not bring them back)")
    elif tf_v is not None and tf_v < low:
        why = f"tpushim is tested on TensorFlow {version.tf_span()} only"
    elif keras_v is not None and keras_v >= (3, 0):
        why = "Keras 3 has no model_to_estimator"
    elif not has_estimator:
        why = "tensorflow_estimator is not installed" if tf_version else "TensorFlow is not installed"
    else:
        return None
    found = (f"TensorFlow {tf_version} with Keras {keras_version or '(none)'}" if tf_version
             else "this environment")
    if tf_keras_version:
        found += f" and tf_keras {tf_keras_version} (TF_USE_LEGACY_KERAS)"
    return (f"tpushim does not support {found}: {why}. Supported: TensorFlow {version.tf_span()} "
            f"with its Keras 2 and tensorflow_estimator. Nothing was patched. Fix: {FIX}")


def _dist_version(module_name, dist_names):
    """Version of the installed distribution that provides ``module_name``, read from its metadata
    (nothing is imported), or None. The dist-info beside the module wins: a second TensorFlow
    distribution elsewhere on the path is not the one ``import`` would load."""
    from importlib import metadata  # pylint: disable=import-outside-toplevel  # slow: failure path only
    from importlib.machinery import PathFinder  # pylint: disable=import-outside-toplevel
    spec = PathFinder.find_spec(module_name)
    if spec is None:
        return None
    location = (list(spec.submodule_search_locations or ()) or [spec.origin or ""])[0]
    for name in dist_names:
        for dist in metadata.distributions(name=name, path=[os.path.dirname(location)]):
            return dist.version
    for name in dist_names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None


TF_DISTS = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tensorflow-intel", "tensorflow-macos",
            "tf-nightly", "tf-nightly-cpu")


def installed_versions(read_metadata=False):
    """``(tensorflow, keras, has_estimator, tf_keras)`` as :func:`version_problem` takes them.

    Modules already imported give their ``__version__``. With ``read_metadata`` the rest are read
    from installed metadata, still without importing TensorFlow (slower: for the failure path and
    the command line, not for every ``patch()``).
    """
    def imported(name):
        return getattr(sys.modules.get(name), "__version__", None) if name in sys.modules else None

    tf_version, keras_version = imported("tensorflow"), imported("keras")
    if read_metadata:
        tf_version = tf_version or _dist_version("tensorflow", TF_DISTS)
        keras_version = keras_version or _dist_version("keras", ("keras", "keras-nightly"))
    elif tf_version is None:
        keras_version = None  # a keras imported without TensorFlow is not necessarily tf.keras
    if "tensorflow_estimator" in sys.modules:
        has_estimator = True
    else:
        from importlib.machinery import PathFinder  # pylint: disable=import-outside-toplevel
        has_estimator = PathFinder.find_spec("tensorflow_estimator") is not None
    tf_keras_version = None
    if os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes"):
        tf_keras_version = imported("tf_keras") or (
            _dist_version("tf_keras", ("tf-keras", "tf-keras-nightly")) if read_metadata else None)
    return tf_version, keras_version, has_estimator, tf_keras_version


def unsupported():
    """The guard's message for this installation, or None: what ``patch()`` would refuse with.

    Reads installed metadata (imports no TensorFlow); warns nothing. The command line stops on it.
    """
    return version_problem(*installed_versions(read_metadata=True))


class guard_warning_silenced:  # pylint: disable=invalid-name
    """``with`` block in which the guard does not warn: for callers (``info``, ``%load_ext
    tpushim``) that show its message themselves, so that it appears once."""

    def __enter__(self):
        self._context = warnings.catch_warnings()
        self._context.__enter__()
        warnings.filterwarnings("ignore", message="tpushim does not support", category=RuntimeWarning)
        return self

    def __exit__(self, *exc_info):
        return self._context.__exit__(*exc_info)


def _check_versions():
    global _unsupported, _warned
    _unsupported = version_problem(*installed_versions())
    if _unsupported:
        # Read what was not imported from the installed metadata, so that the message names every
        # installed version (patch() before TensorFlow's import; keras not imported yet).
        _unsupported = unsupported() or _unsupported
    if _unsupported and not _warned:
        _warned = True  # one warning, on one channel (logging users see it through captureWarnings)
        warnings.warn(_unsupported, RuntimeWarning, stacklevel=4)
    return _unsupported


# --- apply / remove ------------------------------------------------------------------------------

def _wanted():
    return _unsupported is None and (_process_layer is not None or _open_scopes > 0)


def _apply(module, target):
    current = getattr(module, target.attr)
    if is_ours(current):
        return  # exactly one layer, however often we are asked
    setattr(module, target.attr, _wrapper_class()(current, _convert_call))


def _remove(module, target):
    current = getattr(module, target.attr, None)
    # Restore only what is still our wrapper: someone may have wrapped on top of us since.
    if is_ours(current):
        setattr(module, target.attr, current.__wrapped__)


def _on_import(module):
    """Post-import hook for tensorflow (the version guard) and the targets: fires once per module."""
    global _hooks_registered, _tf_hook_registered
    with _lock:
        if module.__name__ == "tensorflow":
            _tf_hook_registered = False
        else:
            _hooks_registered = False
        _check_versions()
        _sync()


def _sync():
    """Makes the patched state of every imported target match what is wanted."""
    global _hooks_registered, _tf_hook_registered
    if _wanted() and "tensorflow" not in sys.modules and not _tf_hook_registered:
        _tf_hook_registered = True
        _hooks.when_imported("tensorflow", _on_import)
    if _wanted() and not _hooks_registered and any(t.module not in sys.modules for t in TARGETS):
        _hooks_registered = True
        for module_name in sorted({t.module for t in TARGETS if t.module not in sys.modules}):
            _hooks.when_imported(module_name, _on_import)
    for target in TARGETS:
        module = sys.modules.get(target.module)
        if module is not None:
            (_apply if _wanted() else _remove)(module, target)


# --- public entry points (re-exported by tpushim/__init__.py) -------------------------------------

def patch(mode=None, tpu=None, batch_size=None, iterations_per_loop=None):
    """Makes ``model_to_estimator`` return a TPUEstimator when a TPU is configured.

    Every spelling of ``model_to_estimator`` is covered, including names bound before this call.
    Safe to call any number of times from any thread: there is always exactly one wrapper layer,
    and a later call with other arguments replaces the settings. Imports no TensorFlow: when
    TensorFlow is not imported yet, the patch takes effect when it is.

    Args:
      mode: ``"auto"`` (default: a TPUEstimator when a TPU is configured, else the stock
        estimator), ``"cpu"`` (the TPU code path on CPU/GPU, ``use_tpu=False``), ``"tpu"``
        (require a TPU) or ``"off"``. ``TPUSHIM_MODE`` when None.
      tpu: a TPU name, ``"grpc://host:port"``, ``"local"`` or a ``TPUClusterResolver``; when None,
        ``TPUSHIM_TPU``, then the RunConfig, ``TPU_NAME`` & co., ``COLAB_TPU_ADDR`` and TPU VM
        device files are consulted.
      batch_size: global batch size for train, eval and predict (``TPUSHIM_BATCH_SIZE``); when
        None, taken from the input_fn.
      iterations_per_loop: training steps per TPU loop (``TPUSHIM_ITERATIONS_PER_LOOP``).

    Raises:
      tpushim.ConfigurationError: an argument or ``TPUSHIM_*`` variable is invalid. Nothing is
        patched in that case.
    """
    global _process_layer
    layer = _settings.parse_arguments(
        mode=mode, tpu=tpu, batch_size=batch_size, iterations_per_loop=iterations_per_loop)
    _settings.parse_environment()  # strict: a bad variable raises here, before anything changes
    with _lock:
        if _check_versions():
            return
        if _process_layer is not None and _process_layer != layer:
            _logger().info("tpushim.patch: settings updated from %s to %s",
                           _describe(_process_layer), _describe(layer))
        _process_layer = layer
        _sync()


def unpatch():
    """Restores the original ``model_to_estimator`` (the very object). Harmless when not patched."""
    global _process_layer
    with _lock:
        _process_layer = None
        _sync()


def is_patched():
    """True while ``patch()`` is in effect (or will take effect when TensorFlow is imported)."""
    with _lock:
        return _process_layer is not None and _unsupported is None


def _describe(layer):
    return ", ".join(f"{k}={v!r}" for k, v in layer.items()) or "defaults"


def current_settings():
    """Settings for a call made now in this thread/task, or None when nothing applies here."""
    layers = _scope_layers.get()
    process = _process_layer
    if process is None and not layers:
        return None
    return _settings.resolve(((process,) if process is not None else ()) + layers)


class patched:  # pylint: disable=invalid-name
    """Converts ``model_to_estimator`` calls only inside a ``with`` block or a decorated function.

    ``with tpushim.patched(mode="cpu"): ...`` or ``@tpushim.patched(mode="cpu")``. The scope
    applies to the thread (and asyncio task) that entered it; nested scopes: the innermost wins;
    leaving a scope restores the outer settings exactly, exception or not. Arguments as
    :func:`patch`; ``TPUSHIM_MODE=off`` still wins.
    """

    def __init__(self, mode=None, tpu=None, batch_size=None, iterations_per_loop=None):
        self._layer = _settings.parse_arguments(
            mode=mode, tpu=tpu, batch_size=batch_size, iterations_per_loop=iterations_per_loop)
        _settings.parse_environment()
        # Tokens live in a per-scope ContextVar, so one object may be entered from many threads.
        self._tokens = contextvars.ContextVar(f"tpushim_patched_{id(self)}", default=())

    def __enter__(self):
        global _open_scopes
        with _lock:
            _check_versions()
            _open_scopes += 1
            _sync()
        token = _scope_layers.set(_scope_layers.get() + (self._layer,))
        self._tokens.set(self._tokens.get() + (token,))
        return self

    def __exit__(self, *exc_info):
        global _open_scopes
        tokens = self._tokens.get()
        self._tokens.set(tokens[:-1])
        _scope_layers.reset(tokens[-1])
        with _lock:
            _open_scopes -= 1
            _sync()
        return False

    def __call__(self, func):
        import inspect  # pylint: disable=import-outside-toplevel
        import wrapt  # pylint: disable=import-outside-toplevel
        if inspect.iscoroutinefunction(func):
            @wrapt.decorator
            async def async_wrapper(wrapped, instance, args, kwargs):
                del instance
                with self:
                    return await wrapped(*args, **kwargs)
            return async_wrapper(func)

        @wrapt.decorator
        def wrapper(wrapped, instance, args, kwargs):
            del instance
            with self:
                return wrapped(*args, **kwargs)
        return wrapper(func)


# --- the wrapper ---------------------------------------------------------------------------------

def _convert_call(wrapped, instance, args, kwargs):
    """The wrapper around keras_lib.model_to_estimator: decide, then convert or pass through."""
    del instance
    settings = current_settings()
    if settings is None:  # patched for another thread's scope only
        return wrapped(*args, **kwargs)
    call = _bind(wrapped, args, kwargs)
    stock = "EstimatorV2" if call["use_v2_estimator"] else "Estimator"
    if settings.mode == "off":
        _logger().info("model_to_estimator -> stock %s (tpushim mode off, from %s)", stock,
                       settings.sources.get("mode"))
        return wrapped(*args, **kwargs)
    from tpushim import _detect  # pylint: disable=import-outside-toplevel
    spec = _detect.find_tpu(settings, call.get("config"))
    if spec is None and settings.mode == "auto":
        _logger().info("model_to_estimator -> stock %s (no TPU configured; TPUSHIM_MODE=cpu runs "
                       "the TPU path on CPU)", stock)
        return wrapped(*args, **kwargs)
    if spec is None and settings.mode == "tpu":
        from tpushim._errors import NoTPUError  # pylint: disable=import-outside-toplevel
        raise NoTPUError(
            "tpushim mode 'tpu' (from {}) needs a TPU, and none is configured. Name one with "
            "tpushim.patch(tpu=...) or TPUSHIM_TPU (a TPU name, 'grpc://IP:8470' or 'local' on a "
            "TPU VM), set TPU_NAME, pass a tpu_config.RunConfig with a cluster, or use "
            "TPUSHIM_MODE=cpu to run the TPU code path on CPU.".format(settings.sources.get("mode")))
    from tpushim import _estimator  # pylint: disable=import-outside-toplevel
    return _estimator.build(call, settings, spec if settings.mode != "cpu" else None)


def _bind(wrapped, args, kwargs):
    import inspect  # pylint: disable=import-outside-toplevel
    bound = inspect.signature(wrapped).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def status():
    """What tpushim would do now, as a dict.

    Keys: ``patched``, ``mode`` and ``mode_source``, ``tpu`` and ``tpu_source`` (the TPU a call
    would use now and where it came from), ``batch_size``, ``iterations_per_loop``, ``applied``
    (whether the wrapper is on ``keras_lib`` yet, or pending TensorFlow's import), ``unsupported``
    (the version guard's message) and ``versions`` (tensorflow, keras, tensorflow_estimator, tpushim).
    """
    from tpushim import _detect  # pylint: disable=import-outside-toplevel
    from tpushim.version import __version__  # pylint: disable=import-outside-toplevel
    with _lock:
        settings = current_settings() or _settings.resolve()
        applied = {}
        for target in TARGETS:
            module = sys.modules.get(target.module)
            applied[f"{target.module}.{target.attr}"] = (
                "pending import" if module is None
                else is_ours(getattr(module, target.attr, None)))
        spec = _detect.find_tpu(settings)
        return {
            "patched": is_patched(),
            "mode": settings.mode,
            "mode_source": settings.sources.get("mode"),
            "tpu": spec.describe() if spec else None,
            "tpu_source": spec.source if spec else None,
            "batch_size": settings.batch_size,
            "iterations_per_loop": settings.iterations_per_loop,
            "applied": applied,
            "unsupported": _unsupported,
            "versions": _versions(__version__),
        }


def _versions(tpushim_version):
    out = {"tpushim": tpushim_version}
    for key, dists in (("tensorflow", TF_DISTS), ("keras", ("keras",)),
                       ("tensorflow_estimator", ("tensorflow-estimator",))):
        module = sys.modules.get(key)
        out[key] = (getattr(module, "__version__", None) if module else None) or _dist_version(key, dists)
    return out
