"""Patching: the targets, the state, and patch/unpatch/patched applying and removing the wrappers.

What is wrapped is one table, :data:`TARGETS`, which ``patch()``, ``unpatch()`` and ``status()``
all read (as OpenTelemetry's instrumentors read theirs), so they cannot drift apart:

* ``keras_lib.model_to_estimator``. Every public spelling of ``model_to_estimator`` --
  ``tf.keras.estimator``, ``tf.compat.v1/v2.keras.estimator``, ``keras.estimator`` and names
  imported from them before or after :func:`patch` -- calls it by attribute at call time, with
  ``use_v2_estimator`` telling v1 from v2, so wrapping that one attribute catches all of them.
  Wrapping ``tf.keras.estimator.model_to_estimator`` instead would miss five of these seven
  (checked on TF 2.15): the tf.compat.v1 and v2 modules, ``keras.estimator``, the v1
  ``from ... import`` and any name bound before the patch.
* ``extenders.estimator_lib``, the estimator module as ``tf.estimator.add_metrics`` sees it. Every
  spelling of ``add_metrics`` (``tf.estimator``, ``tf.compat.v1/v2.estimator``, names bound before
  the patch) is one function object, which builds its result as ``estimator_lib.Estimator(...)``,
  looking the module up at call time: through tpushim's view of the module, ``add_metrics`` on a
  converted estimator returns a converted estimator (:mod:`tpushim._extenders`); every other
  use of the module, and ``add_metrics`` on any other estimator, is stock's.

Both modules are imported lazily by TensorFlow (keras_lib on the first ``model_to_estimator``
call), each at its own time, so each wrapper is applied by a post-import hook: immediately when
its module is already imported, otherwise the moment it is. ``import tpushim`` and ``patch()``
import no TensorFlow -- nor wrapt, inspect or logging before there is something to wrap: start-up
stays within a few milliseconds.
"""

from __future__ import annotations  # annotations stay strings: typing is not imported at start-up

import _thread  # threading's RLock without importing threading (and functools, collections)
import contextvars
import sys
import warnings

from tpushim import _hooks, _settings, _versions

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Callable, TypeVar

    _F = TypeVar("_F", bound=Callable[..., object])

#: ``KERAS_LIB.TARGET`` is ``model_to_estimator``. Other modules name keras_lib by this.
KERAS_LIB = "tensorflow_estimator.python.estimator.keras_lib"
TARGET = "model_to_estimator"
EXTENDERS = "tensorflow_estimator.python.estimator.extenders"

#: Every attribute tpushim wraps, as (module, attribute, kind of wrapper): see the module's doc.
TARGETS = (
    (KERAS_LIB, TARGET, "convert"),
    (EXTENDERS, "estimator_lib", "add_metrics"),
)


class _State:
    """Everything patching remembers in a process, changed only with ``lock`` held."""

    def __init__(self):
        self.lock = _thread.RLock()
        # The settings layers of the patched() scopes open in this thread / asyncio task, outermost
        # first. A ContextVar is made once and never replaced: reset() empties this context's value.
        self.scope_layers = contextvars.ContextVar("tpushim_scope_layers", default=())
        # Built with the first wrapper of each kind; kept by reset() (old wrappers use them).
        self.wrapper_types = {}
        self._clear()

    def _clear(self):
        self.process_layer = None  # the explicit arguments of the active patch(), or None
        self.open_scopes = 0  # patched() scopes entered and not yet left, across all threads
        self.version_problem = None  # the version guard's message when it refused, else None
        self.warned = False  # the guard warns once per process

    def wrapper_wanted(self):
        """True when the wrappers should be on: patched, or a scope open somewhere."""
        return self.version_problem is None and (
            self.process_layer is not None or self.open_scopes > 0
        )

    def reset(self):
        """Back to a fresh import, for tests: unpatched (the original restored), no pending import
        hooks, the version guard's verdict and its one warning forgotten.

        Raises:
          RuntimeError: a ``patched()`` scope was still open (after resetting all the same).
        """
        with self.lock:
            left_open = self.open_scopes
            self._clear()
            self.scope_layers.set(())
            _sync()
        _hooks.REGISTRY.reset()
        if left_open:
            raise RuntimeError(f"{left_open} tpushim.patched() scope(s) left open")


STATE = _State()


def reset():
    """:meth:`_State.reset` of the one state object."""
    STATE.reset()


def _logger():
    import logging  # lazily: 3 ms of start-up

    return logging.getLogger("tpushim")


def _wrapper_class(kind):
    """tpushim's wrapper type of this kind: ``isinstance`` tells our layer from others'.

    ``convert``: a wrapt.FunctionWrapper running :func:`_convert_call`. ``add_metrics``: a
    wrapt.ObjectProxy of the estimator module whose ``Estimator`` is :func:`_add_metrics_estimator`.
    """
    if kind not in STATE.wrapper_types:
        import wrapt

        if kind == "convert":
            bases, body = (wrapt.FunctionWrapper,), {}
        else:

            def estimator(self):
                return lambda *args, **kwargs: _add_metrics_estimator(
                    self.__wrapped__.Estimator, args, kwargs
                )

            bases, body = (wrapt.ObjectProxy,), {"Estimator": property(estimator)}
        name = {"convert": "TPUShimWrapper", "add_metrics": "TPUShimEstimatorLib"}[kind]
        STATE.wrapper_types[kind] = type(name, bases, {"__module__": __name__, **body})
    return STATE.wrapper_types[kind]


def _wrap(kind, original):
    if kind == "convert":
        return _wrapper_class(kind)(original, _convert_call)
    return _wrapper_class(kind)(original)


def is_ours(obj):
    """True when ``obj`` is one of tpushim's wrappers (without importing wrapt when nothing was
    wrapped)."""
    return any(isinstance(obj, t) for t in tuple(STATE.wrapper_types.values()))


def _check_versions():
    """Runs the version guard (lock held): remembers its verdict and warns once per process."""
    STATE.version_problem = _versions.version_problem_now()
    if STATE.version_problem and not STATE.warned:
        STATE.warned = (
            True  # one warning, on one channel (logging users see it through captureWarnings)
        )
        warnings.warn(STATE.version_problem, RuntimeWarning, stacklevel=4)
    return STATE.version_problem


def version_problem():
    """The version guard's message if it refused the last ``patch()`` or scope, else None."""
    return STATE.version_problem


# --- apply / remove ------------------------------------------------------------------------------


def _apply(module, attribute, kind):
    current = getattr(module, attribute)
    if is_ours(current):
        return  # exactly one layer, however often we are asked
    setattr(module, attribute, _wrap(kind, current))


def _remove(module, attribute):
    current = getattr(module, attribute, None)
    # Restore only what is still our wrapper: someone may have wrapped on top of us since.
    if is_ours(current):
        setattr(module, attribute, current.__wrapped__)


def _on_import(module):
    """Post-import hook for tensorflow (the version guard sees its real version) and each
    target's module."""
    del module
    with STATE.lock:
        if STATE.wrapper_wanted():
            _check_versions()
        _sync()


def _sync():
    """Makes the wrappers' presence on their modules match what is wanted (lock held)."""
    wanted = STATE.wrapper_wanted()
    if wanted:
        # _hooks ignores a hook registered twice: each fires once, however often we get here.
        for name in ("tensorflow", *dict.fromkeys(t[0] for t in TARGETS)):
            if name not in sys.modules:
                _hooks.when_imported(name, _on_import)
    for module_name, attribute, kind in TARGETS:
        module = sys.modules.get(module_name)
        if module is not None:
            _apply(module, attribute, kind) if wanted else _remove(module, attribute)


def applied():
    """``{"<module>.<attribute>": True | False | "pending import"}`` for every target: is the
    wrapper on?"""
    out = {}
    for module_name, attribute, _ in TARGETS:
        module = sys.modules.get(module_name)
        out[f"{module_name}.{attribute}"] = (
            "pending import" if module is None else is_ours(getattr(module, attribute, None))
        )
    return out


# --- public entry points (re-exported by tpushim/__init__.py) -------------------------------------


def patch(
    mode: str | None = None,
    tpu: str | object | None = None,
    batch_size: int | None = None,
    iterations_per_loop: int | None = None,
    quiet: bool | None = None,
    pod_input: str | None = None,
    engine: str | None = None,
) -> None:
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
      quiet: True hides the line each conversion to a TPUEstimator prints on stderr when logging
        is not configured (``TPUSHIM_QUIET``). Configured logging gets it at INFO either way.
      pod_input: how a pod's hosts (a TPU of several hosts) read the input
        (``TPUSHIM_POD_INPUT``): ``"auto"`` (default: each host reads only its own files where
        the training input is shuffled, endless and read from files; else ``exact``),
        ``"exact"`` (every host reads the whole input and keeps its share: stock's batches,
        every example once) or ``"files"`` (each host reads its own files wherever the input
        allows it).
      engine: what runs the TPU path (``TPUSHIM_ENGINE``): ``"auto"`` (default: TPUEstimator
        where it runs; the ``tf.distribute`` strategy engine on a PJRT TPU runtime or TensorFlow
        >= 2.16), ``"tpuestimator"`` or ``"strategy"``.

    Raises:
      tpushim.ConfigurationError: an argument or ``TPUSHIM_*`` variable is invalid. Nothing is
        patched in that case.
    """
    layer = _settings.parse_arguments(
        mode=mode,
        tpu=tpu,
        batch_size=batch_size,
        iterations_per_loop=iterations_per_loop,
        quiet=quiet,
        pod_input=pod_input,
        engine=engine,
    )
    _settings.parse_environment()  # strict: a bad variable raises here, before anything changes
    level = _settings.log_level_from_environment()
    if level is not None:  # logging imported only when asked for
        from tpushim import _log

        _log.show(level)
    with STATE.lock:
        if _check_versions():
            return
        if STATE.process_layer is not None and STATE.process_layer != layer:
            _logger().info(
                "tpushim.patch: settings updated from %s to %s",
                _describe(STATE.process_layer),
                _describe(layer),
            )
        STATE.process_layer = layer
        _sync()


def unpatch() -> None:
    """Restores the original ``model_to_estimator`` (the very object). Harmless when not patched."""
    with STATE.lock:
        STATE.process_layer = None
        _sync()


def is_patched() -> bool:
    """True while ``patch()`` is in effect (or will take effect when TensorFlow is imported)."""
    with STATE.lock:
        return STATE.process_layer is not None and STATE.version_problem is None


def _describe(layer):
    return ", ".join(f"{k}={v!r}" for k, v in layer.items()) or "defaults"


def current_settings():
    """Settings for a call made now in this thread/task, or None when nothing applies here."""
    layers = STATE.scope_layers.get()
    process = STATE.process_layer
    if process is None and not layers:
        return None
    return _settings.resolve(((process,) if process is not None else ()) + layers)


class patched:
    """Converts ``model_to_estimator`` calls only inside a ``with`` block or a decorated function.

    ``with tpushim.patched(mode="cpu"): ...`` or ``@tpushim.patched(mode="cpu")``. The scope
    applies to the thread (and asyncio task) that entered it; nested scopes: the innermost wins;
    leaving a scope restores the outer settings exactly, exception or not. Arguments as
    :func:`patch`, checked here; ``TPUSHIM_*`` variables are read each time the scope is entered
    (not when a decorator is applied), and ``TPUSHIM_MODE=off`` still wins.

    Raises:
      tpushim.ConfigurationError: an invalid argument (here) or ``TPUSHIM_*`` variable (on entry,
        before the scope opens).
    """

    def __init__(
        self,
        mode: str | None = None,
        tpu: str | object | None = None,
        batch_size: int | None = None,
        iterations_per_loop: int | None = None,
        quiet: bool | None = None,
        pod_input: str | None = None,
        engine: str | None = None,
    ) -> None:
        self._layer = _settings.parse_arguments(
            mode=mode,
            tpu=tpu,
            batch_size=batch_size,
            iterations_per_loop=iterations_per_loop,
            quiet=quiet,
            pod_input=pod_input,
            engine=engine,
        )
        # Tokens live in a per-scope ContextVar, so one object may be entered from many threads.
        self._tokens = contextvars.ContextVar(f"tpushim_patched_{id(self)}", default=())

    def __enter__(self) -> patched:
        _settings.parse_environment()  # strict: a bad variable raises before the scope opens
        with STATE.lock:
            _check_versions()
            STATE.open_scopes += 1
            _sync()
        token = STATE.scope_layers.set(STATE.scope_layers.get() + (self._layer,))
        self._tokens.set(self._tokens.get() + (token,))
        return self

    def __exit__(self, *exc_info: object) -> bool:
        tokens = self._tokens.get()
        self._tokens.set(tokens[:-1])
        STATE.scope_layers.reset(tokens[-1])
        with STATE.lock:
            STATE.open_scopes -= 1
            _sync()
        return False

    def __call__(self, func: _F) -> _F:
        import inspect

        import wrapt

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
    arguments = _arguments_by_name(wrapped, args, kwargs)
    from tpushim import _decision, _detect  # not at start-up

    tpu = _detect.find_tpu(settings, arguments.get("config")) if settings.mode != "off" else None
    decision = _decision.decide(settings, tpu)
    _logger().debug(
        "model_to_estimator called with %s; TPU found: %s; decision: %s (%s)",
        settings,
        tpu.describe() if tpu else "none",
        decision.action,
        decision.why,
    )
    if decision.action == _decision.STOCK:
        _logger().info(
            "model_to_estimator -> stock %s (%s)",
            "EstimatorV2" if arguments["use_v2_estimator"] else "Estimator",
            decision.why,
        )
        return wrapped(*args, **kwargs)
    if decision.action == _decision.NO_TPU:
        from tpushim._errors import NoTPUError

        raise NoTPUError(decision.why)
    from tpushim import _estimator

    return _estimator.build(arguments, settings, decision.tpu)


def _add_metrics_estimator(estimator_class, args, kwargs):
    """``Estimator(*args, **kwargs)`` as ``tf.estimator.add_metrics`` calls it: for an estimator
    tpushim converted, the same TPU estimator with the added metrics; else stock's Estimator."""
    from tpushim import _extenders  # not at start-up

    converted = _extenders.add_metrics_call(args, kwargs)
    if converted is None:
        return estimator_class(*args, **kwargs)
    return converted


def _arguments_by_name(wrapped, args, kwargs):
    """The call's arguments by parameter name, defaults filled in: what ``_estimator.build`` takes."""
    import inspect

    bound = inspect.signature(wrapped).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)
