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
import sys
import _thread  # threading's RLock without importing threading (and functools, collections)
import warnings

from tpushim import _hooks, _settings


def _logger():
    import logging  # pylint: disable=import-outside-toplevel  # lazily: 3 ms of start-up
    return logging.getLogger("tpushim")

# Supported range of TensorFlow, [low, high): estimators and Keras 2's model_to_estimator were
# removed in TF 2.16 (Keras 3).
SUPPORTED_TF = ((2, 9), (2, 16))
FIX = 'pip install "tensorflow<2.16"  (or "tensorflow-cpu<2.16"; tpushim supports TensorFlow 2.9-2.15)'


class Target:
    """One attribute tpushim wraps: ``module.attr``."""

    __slots__ = ("module", "attr")

    def __init__(self, module, attr):
        self.module, self.attr = module, attr


#: Everything tpushim patches. patch() and unpatch() read only this table, so they cannot drift.
TARGETS = (Target("tensorflow_estimator.python.estimator.keras_lib", "model_to_estimator"),)

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

def _version_tuple(version):
    if not version:  # patch() before TensorFlow: nothing to parse, and no re to import
        return None
    import re  # pylint: disable=import-outside-toplevel
    parts = re.findall(r"\d+", str(version))[:2]
    return tuple(int(p) for p in parts) if len(parts) == 2 else None


def version_problem(tf_version, keras_version, has_estimator):
    """Why tpushim cannot patch these versions, or None when it can. Pure: tested on strings."""
    tf_v = _version_tuple(tf_version)
    low, high = SUPPORTED_TF
    supported = f"{low[0]}.{low[1]} <= TensorFlow < {high[0]}.{high[1]}"
    if tf_v is not None and not low <= tf_v < high:
        why = ("TensorFlow 2.16 removed estimators and Keras 2's model_to_estimator"
               if tf_v >= high else "TensorFlow before 2.9 lacks APIs tpushim uses")
        return (f"tpushim does not support TensorFlow {tf_version} ({why}); supported: {supported}. "
                f"Nothing was patched. Fix: {FIX}")
    keras_v = _version_tuple(keras_version)
    if keras_v is not None and keras_v >= (3, 0):
        return (f"tpushim does not support Keras {keras_version} (Keras 3 has no model_to_estimator); "
                f"supported: Keras 2 with {supported}. Nothing was patched. Fix: {FIX}")
    if not has_estimator:
        return (f"tpushim needs tensorflow_estimator, which is not installed (TensorFlow {tf_version or '?'}); "
                f"supported: {supported}. Nothing was patched. Fix: {FIX}")
    return None


def _installed_versions():
    """Versions of the modules already imported; TensorFlow is never imported for this."""
    tf = sys.modules.get("tensorflow")
    tf_version = getattr(tf, "__version__", None) if tf else None
    keras_version = None
    if tf is not None:
        keras_mod = sys.modules.get("keras")
        keras_version = getattr(keras_mod, "__version__", None) if keras_mod else None
    if "tensorflow_estimator" in sys.modules:
        has_estimator = True
    else:
        from importlib.machinery import PathFinder  # pylint: disable=import-outside-toplevel
        has_estimator = PathFinder.find_spec("tensorflow_estimator") is not None
    return tf_version, keras_version, has_estimator


def _check_versions():
    global _unsupported, _warned
    _unsupported = version_problem(*_installed_versions())
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
    from importlib import metadata  # pylint: disable=import-outside-toplevel
    out = {"tpushim": tpushim_version}
    for key, dists in (("tensorflow", ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-nightly")),
                       ("keras", ("keras",)),
                       ("tensorflow_estimator", ("tensorflow-estimator",))):
        module = sys.modules.get(key)
        out[key] = getattr(module, "__version__", None) if module else None
        for dist in dists:
            if out[key]:
                break
            try:
                out[key] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                pass
    return out
