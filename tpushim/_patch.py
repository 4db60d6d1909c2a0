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
* ``Estimator.__new__`` (estimator.py's v1 class, the base of ``tf.estimator.Estimator``,
  ``tf.compat.v1.estimator.Estimator`` and ``TPUEstimator``): a script that rebuilds an estimator
  around a converted one's model_fn (``Estimator(model_fn=converted.model_fn, ...)``, under any
  name bound at any time) gets a converted estimator with its arguments (:mod:`tpushim._extenders`);
  every other construction is ``object.__new__``'s, as without tpushim. Set on the class only while
  patched, and only once tpushim has converted a model (there is nothing to rebuild before):
  by then TensorFlow has defined its estimator classes, whose deprecation decorator would
  otherwise take a ``__new__`` it finds on their base for their own. Estimator defines no
  ``__new__`` of its own; removing ours leaves a plain one in its place (CPython cannot go back
  to ``object.__new__`` once a class had another: its constructor calls would fail).

The modules are imported lazily by TensorFlow (keras_lib on the first ``model_to_estimator``
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

    from tpushim._types import Mode, PodInput

    _F = TypeVar("_F", bound=Callable[..., object])

#: ``KERAS_LIB.TARGET`` is ``model_to_estimator``. Other modules name keras_lib by this.
KERAS_LIB = "tensorflow_estimator.python.estimator.keras_lib"
TARGET = "model_to_estimator"
EXTENDERS = "tensorflow_estimator.python.estimator.extenders"
ESTIMATOR = "tensorflow_estimator.python.estimator.estimator"

#: Every attribute tpushim wraps, as (module, attribute, kind of wrapper): see the module's doc.
TARGETS = (
    (KERAS_LIB, TARGET, "convert"),
    (EXTENDERS, "estimator_lib", "add_metrics"),
    (ESTIMATOR, "Estimator.__new__", "rewrap"),
)
#: On TensorFlow >= 2.16 (no tf.estimator): tpushim's estimator namespace as ``tf.estimator``,
#: ``tf.compat.v1.estimator`` and ``tf.compat.v2.estimator`` (dotted attributes of the
#: ``tensorflow`` module), and tf_keras's ``model_to_estimator`` functions -- which raise
#: NotImplementedError there -- wrapped in every module that holds them: ``tf.keras.estimator``
#: (tf_keras.api._v2), ``tf.compat.v1.keras.estimator`` (api._v1), ``tf.compat.v2.keras...``,
#: ``from tensorflow.keras.estimator import ...`` and ``from tensorflow.compat.v1.keras.estimator
#: import ...`` (each import makes a module of that name, a copy of the api module's names), and
#: tf_keras's own. Bare ``keras`` is Keras 3
#: there, which has no estimator: that spelling is not provided.
ESTIMATOR_API_TARGETS = (
    ("tensorflow", "estimator", "namespace"),
    ("tensorflow", "compat.v1.estimator", "namespace"),
    ("tensorflow", "compat.v2.estimator", "namespace"),
    ("tf_keras.src.estimator", "model_to_estimator", "convert"),
    ("tf_keras.src.estimator", "model_to_estimator_v2", "convert"),
    ("tf_keras.estimator", "model_to_estimator", "convert"),
    ("tf_keras.api._v2.keras.estimator", "model_to_estimator", "convert"),
    ("tf_keras.api._v1.keras.estimator", "model_to_estimator", "convert"),
    ("tensorflow.keras.estimator", "model_to_estimator", "convert"),
    ("tensorflow.compat.v1.keras.estimator", "model_to_estimator", "convert"),
)


def targets():
    """The table in effect: :data:`ESTIMATOR_API_TARGETS` on TensorFlow >= 2.16, else
    :data:`TARGETS`."""
    return ESTIMATOR_API_TARGETS if _versions.uses_own_estimator() else TARGETS


class _State:
    """Everything patching remembers in a process, changed only with ``lock`` held."""

    def __init__(self):
        self.lock = _thread.RLock()
        # The settings layers of the patched() scopes open in this thread / asyncio task, outermost
        # first. A ContextVar is made once and never replaced: reset() empties this context's value.
        self.scope_layers = contextvars.ContextVar("tpushim_scope_layers", default=())
        # Built with the first wrapper of each kind; kept by reset() (old wrappers use them).
        self.wrapper_types = {}
        # TensorFlow >= 2.16: {key: _Delegation} of the original functions that call tpushim's
        # wrapper now (see _delegate); kept by _clear(), emptied by _sync() as it restores them.
        self.delegations = {}
        self._clear()

    def _clear(self):
        self.process_layer = None  # the explicit arguments of the active patch(), or None
        self.open_scopes = 0  # patched() scopes entered and not yet left, across all threads
        self.version_problem = None  # the version guard's message when it refused, else None
        self.warned = False  # the guard warns once per process
        # A model_to_estimator call converted: from then on an estimator may be rebuilt around a
        # converted one's model_fn, and Estimator.__new__ is wrapped (see the module's doc).
        self.converted = False

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
    ``rewrap``: a ``__new__`` running :func:`_rewrap_new` (a staticmethod on the class).
    """
    if kind not in STATE.wrapper_types:
        import wrapt

        if kind == "namespace":  # tpushim/_estimator_api's module type: only ours are of it
            from tpushim._estimator_api import _api

            STATE.wrapper_types[kind] = _api._Namespace
            return _api._Namespace
        if kind == "rewrap":

            def init(self, wrapped):
                self.__wrapped__ = wrapped

            def call(self, cls, *args, **kwargs):
                return _rewrap_new(self.__wrapped__, cls, args, kwargs)

            bases, body = (object,), {"__init__": init, "__call__": call}
        elif kind == "convert":
            bases, body = (wrapt.FunctionWrapper,), {}
        else:

            def estimator(self):
                return lambda *args, **kwargs: _add_metrics_estimator(
                    self.__wrapped__.Estimator, args, kwargs
                )

            bases, body = (wrapt.ObjectProxy,), {"Estimator": property(estimator)}
        name = {
            "convert": "TPUShimWrapper",
            "add_metrics": "TPUShimEstimatorLib",
            "rewrap": "TPUShimEstimatorNew",
        }[kind]
        STATE.wrapper_types[kind] = type(name, bases, {"__module__": __name__, **body})
    return STATE.wrapper_types[kind]


def _wrap(kind, original, spelling=None):
    if kind == "namespace":
        from tpushim._estimator_api import _api

        _wrapper_class(kind)  # is_ours() knows the type from here on
        namespace = _api.build(spelling)
        namespace.__wrapped__ = original  # None: TensorFlow >= 2.16 has no tf.estimator
        return namespace
    if kind == "convert":
        return _wrapper_class(kind)(original, _convert_call)
    return _wrapper_class(kind)(original)


def is_ours(obj):
    """True when ``obj`` is one of tpushim's wrappers (without importing wrapt when nothing was
    wrapped)."""
    return any(isinstance(obj, t) for t in tuple(STATE.wrapper_types.values()))


def _check_versions(layers=None):
    """Runs the version guard (lock held): remembers its verdict and warns once per process.

    On TensorFlow >= 2.16 it first makes ``tf.keras`` tf_keras, or refuses where that is too late;
    the line that says so is hidden where the settings of ``layers`` (a ``patch()`` or scope's,
    default: those in effect here) are quiet.
    """

    def quiet():
        if layers is None:
            return (current_settings() or _settings.resolve(())).quiet
        return _settings.resolve(layers).quiet

    # The guard first: TF_USE_LEGACY_KERAS is set, and said, only where tpushim then patches.
    STATE.version_problem = _versions.version_problem_now() or _versions.legacy_keras_problem(quiet)
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


def _holder(module, attribute):
    """``(the object holding the last name, the last name)`` of a dotted attribute (a class's,
    or a submodule's: ``compat.v1.estimator``), or ``(None, name)`` where a part is missing."""
    *path, name = attribute.split(".")
    holder = module
    for part in path:
        holder = getattr(holder, part, None)
    return holder, name


def _current(module, attribute):
    """What ``attribute`` is now: a class's own entry (not an inherited one), unwrapped from its
    staticmethod; None where it or a part of its path is missing."""
    holder, name = _holder(module, attribute)
    if holder is None or not isinstance(holder, type):
        return getattr(holder, name, None)
    current = vars(holder).get(name)
    return current.__func__ if isinstance(current, staticmethod) else current


def _apply(module, attribute, kind):
    spelling = f"tf.{attribute}" if module.__name__ == "tensorflow" else None
    holder, name = _holder(module, attribute)
    if holder is None or (kind in ("convert", "add_metrics") and not hasattr(holder, name)):
        return
    current = _current(module, attribute)
    if is_ours(current):
        return  # exactly one layer, however often we are asked
    if kind == "rewrap" and current is None:
        current = _object_new  # the class had none: object.__new__, which takes no arguments
    wrapper = _wrap(kind, current, spelling)
    if kind == "rewrap":
        import inspect

        # What inspect.signature(the class) reads first (its __new__'s): __init__'s, as before;
        # and the names TensorFlow's deprecation decorator reads from a subclass defined now,
        # which keeps this __new__ as its own (it then passes through once unpatched).
        wrapper.__signature__ = inspect.signature(holder.__init__)
        if current is _object_new:  # left in place once ours is removed: the same signature
            _object_new.__signature__ = wrapper.__signature__
        wrapper.__name__, wrapper.__qualname__ = name, f"{holder.__qualname__}.{name}"
        wrapper.__module__, wrapper.__doc__ = holder.__module__, None
        wrapper = staticmethod(wrapper)
    setattr(holder, name, wrapper)


def _remove(module, attribute):
    current = _current(module, attribute)
    # Restore only what is still our wrapper: someone may have wrapped on top of us since.
    if is_ours(current):
        holder, name = _holder(module, attribute)
        original = current.__wrapped__
        if original is None:
            delattr(holder, name)  # a name tpushim added (tf.estimator on >= 2.16): gone again
            return
        # A class's __new__ once set cannot be deleted: CPython then keeps calling object.__new__
        # with the constructor's arguments (TypeError). _object_new stays in its place.
        setattr(holder, name, staticmethod(original) if isinstance(holder, type) else original)


# --- names bound before the patch (TensorFlow >= 2.16) --------------------------------------------
#
# On TensorFlow <= 2.15 every public spelling calls keras_lib.model_to_estimator at call time, so
# a name bound before patch() converts. On 2.16+ the spellings ARE tf_keras's functions (which
# raise NotImplementedError there): ``from tensorflow.keras.estimator import model_to_estimator``
# run before patch() keeps tf_keras's own function, which the wrappers in tf_keras's modules do
# not reach. While the wrappers are on, each such original function's code is swapped for a
# trampoline that calls tpushim's wrapper logic, and swapped back when they come off. Why the
# function itself and not the names bound to it: every reference converts, wherever it is held
# (a module's global, a function's local or closure, a default argument, a list, another
# library's wrapper), as on 2.15; it costs one attribute store per function (no scan of
# sys.modules); and it is undone exactly, by restoring the very code object.


class _Delegation:
    """One original function that delegates while the wrappers are on: made once per process."""

    def __init__(self, function, key):
        import inspect
        import types

        self.function = function
        self.own_code = function.__code__
        self.trampoline = _trampoline_code(function, key)
        # The function as it was, for what the wrapper passes through to and reads the
        # signature of (the original itself would call the trampoline again).
        self.pristine = types.FunctionType(
            function.__code__,
            function.__globals__,
            function.__name__,
            function.__defaults__,
            function.__closure__,
        )
        self.pristine.__kwdefaults__ = function.__kwdefaults__
        self.pristine.__qualname__ = function.__qualname__
        self.pristine.__module__ = function.__module__
        self.pristine.__doc__ = function.__doc__
        # inspect.signature reads the code: the trampoline's (*args, **kwargs) would hide the
        # original's parameters, so they are pinned while it delegates (where none was pinned).
        self.signature = None if "__signature__" in vars(function) else inspect.signature(function)
        self.said = False  # one log line each time it starts delegating

    def on(self):
        if self.function.__code__ is self.own_code:
            if self.signature is not None:
                self.function.__signature__ = self.signature
            self.function.__code__ = self.trampoline
            self.said = False

    def off(self):
        if self.function.__code__ is self.trampoline:  # only while it is still ours
            self.function.__code__ = self.own_code
            if self.signature is not None:
                vars(self.function).pop("__signature__", None)


def _trampoline(*args, **kwargs):
    """The code a delegating original runs: the import keeps its module's namespace untouched."""
    from tpushim._patch import _delegated_call

    return _delegated_call("__tpushim_delegation_key__", args, kwargs)


_TRAMPOLINE_KEY = "__tpushim_delegation_key__"
#: Every function that ever delegated, by key (module.qualname): its :class:`_Delegation`.
_DELEGATIONS = {}


def _trampoline_code(function, key):
    code = _trampoline.__code__
    consts = tuple(key if c == _TRAMPOLINE_KEY else c for c in code.co_consts)
    names = {"co_name": function.__code__.co_name}
    if hasattr(code, "co_qualname"):  # Python >= 3.11: what tracebacks show
        names["co_qualname"] = function.__code__.co_qualname
    return code.replace(co_consts=consts, **names)


def _delegate(wanted):
    """TensorFlow >= 2.16: makes every original ``convert`` function delegate to tpushim's
    wrapper while ``wanted``, and restores its own code otherwise (lock held)."""
    if not wanted:
        for key in list(STATE.delegations):
            STATE.delegations.pop(key).off()
        return
    for module_name, attribute, kind in targets():
        module = sys.modules.get(module_name)
        if kind != "convert" or module is None:
            continue
        function = _current(module, attribute)
        if is_ours(function):
            function = function.__wrapped__
        key = f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', '')}"
        if key in STATE.delegations or type(function) is not type(_trampoline):
            continue
        if function.__closure__ is not None:  # a trampoline cannot take its closure's cells
            _logger().debug(
                "%s has a closure: a name bound to it before the patch does not convert", key
            )
            continue
        delegation = _DELEGATIONS.get(key)
        if delegation is None or delegation.function is not function:
            delegation = _DELEGATIONS[key] = _Delegation(function, key)
        delegation.on()
        STATE.delegations[key] = delegation


def _delegated_call(key, args, kwargs):
    """A call to an original function while it delegates: tpushim's wrapper logic, around the
    function as it was."""
    delegation = _DELEGATIONS[key]
    if key not in STATE.delegations:  # restored meanwhile: the call is stock's
        return delegation.pristine(*args, **kwargs)
    if not delegation.said:
        delegation.said = True
        _logger().info(
            "tpushim: %s was called through a name bound to it before the patch; tpushim "
            "makes that function itself call its wrapper while patched, so it converts "
            "(unpatch restores it)",
            key,
        )
    return _convert_call(delegation.pristine, None, args, kwargs)


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
    table = targets()
    for name in ("tensorflow", *dict.fromkeys(t[0] for t in table)):
        if wanted and name not in sys.modules:
            # _hooks ignores a hook registered twice: each fires once, however often we get here.
            _hooks.when_imported(name, _on_import)
        elif not wanted:
            _hooks.discard(name, _on_import)  # the finder leaves when nothing else waits
    for module_name, attribute, kind in table:
        module = sys.modules.get(module_name)
        if module is not None:
            if wanted and (kind != "rewrap" or STATE.converted):
                _apply(module, attribute, kind)
            else:
                _remove(module, attribute)
    if STATE.delegations or (wanted and _versions.uses_own_estimator()):
        _delegate(wanted)


def applied():
    """``{"<module>.<attribute>": True | False | "pending import" | "pending conversion"}`` for
    every target: is the wrapper on? (``Estimator.__new__`` waits for the first conversion.)"""
    out = {}
    for module_name, attribute, kind in targets():
        module = sys.modules.get(module_name)
        if module is not None and _holder(module, attribute)[0] is None:
            module = None  # a part of the dotted path is not there yet
        ours = module is not None and is_ours(_current(module, attribute))
        pending = kind == "rewrap" and not STATE.converted and STATE.wrapper_wanted()
        out[f"{module_name}.{attribute}"] = (
            "pending import"
            if module is None
            else "pending conversion"
            if pending and not ours
            else ours
        )
    return out


# --- public entry points (re-exported by tpushim/__init__.py) -------------------------------------


def patch(
    mode: Mode | None = None,
    tpu: str | object | None = None,
    batch_size: int | None = None,
    iterations_per_loop: int | None = None,
    quiet: bool | None = None,
    pod_input: PodInput | None = None,
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
    # Strict: a bad variable raises here, before anything changes (unless TPUSHIM_MODE=off).
    level = _settings.check_environment()
    if level is not None:  # logging imported only when asked for
        from tpushim import _log

        _log.show(level)
    with STATE.lock:
        if _check_versions((layer,)):
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

    ``with tpushim.patched(mode="cpu"): ...`` or ``@tpushim.patched(mode="cpu")`` (on a function,
    a coroutine function, or a generator function: the scope is open while the generator runs,
    not while it waits at a ``yield``; an async generator function is refused). The scope
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
        mode: Mode | None = None,
        tpu: str | object | None = None,
        batch_size: int | None = None,
        iterations_per_loop: int | None = None,
        quiet: bool | None = None,
        pod_input: PodInput | None = None,
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
        _settings.check_environment()  # strict: a bad variable raises before the scope opens
        with STATE.lock:
            outer = (STATE.process_layer,) if STATE.process_layer is not None else ()
            _check_versions(outer + STATE.scope_layers.get() + (self._layer,))
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

        if inspect.isasyncgenfunction(func):
            raise TypeError(
                f"tpushim.patched() cannot decorate the async generator function "
                f"{func.__qualname__}: open the scope inside it instead "
                f"(async def ...: with tpushim.patched(...): ...)."
            )
        if inspect.isgeneratorfunction(func):

            @wrapt.decorator
            def generator_wrapper(wrapped, instance, args, kwargs):
                del instance
                return (yield from self._each_step_in_scope(wrapped(*args, **kwargs)))

            return generator_wrapper(func)
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

    def _each_step_in_scope(self, generator):
        """Runs ``generator`` with the scope open while it runs, closed while it is suspended
        (:func:`tpushim._generators.each_step_in`)."""
        from tpushim import _generators

        return _generators.each_step_in(lambda: self, generator)


# --- the wrapper ---------------------------------------------------------------------------------


def _convert_call(wrapped, instance, args, kwargs):
    """The wrapper around ``model_to_estimator``: outside any scope the call is stock's; inside,
    the conversion (:func:`tpushim._convert.convert`) decides and converts or passes through."""
    del instance
    settings = current_settings()
    if settings is None:  # patched for another thread's scope only
        return wrapped(*args, **kwargs)
    from tpushim import _convert  # not at start-up

    estimator, converted = _convert.convert(wrapped, args, kwargs, settings)
    if converted:
        with STATE.lock:
            if not STATE.converted:
                STATE.converted = True
                _sync()  # Estimator.__new__: see the module's doc
    return estimator


def _add_metrics_estimator(estimator_class, args, kwargs):
    """``Estimator(*args, **kwargs)`` as ``tf.estimator.add_metrics`` calls it: for an estimator
    tpushim converted, the same TPU estimator with the added metrics; else stock's Estimator."""
    from tpushim import _engines  # not at start-up

    converted = _engines.add_metrics_call(args, kwargs)
    if converted is None:
        return estimator_class(*args, **kwargs)
    return converted


def _object_new(cls, *args, **kwargs):
    """``object.__new__`` for a class whose ``__init__`` takes the arguments."""
    del args, kwargs
    return object.__new__(cls)


def _rewrap_new(wrapped, cls, args, kwargs):
    """``Estimator.__new__``: for an estimator built around a converted one's model_fn, a
    converted estimator (``cls.__init__`` then leaves it as it is); else a new ``cls`` object."""
    model_fn = kwargs.get("model_fn", args[0] if args else None)
    if model_fn is not None and current_settings() is not None:  # else: outside any scope
        from tpushim import _engines  # not at start-up

        converted = _engines.rewrap_call(cls, args, kwargs)
        if converted is not None:
            return converted
    return wrapped(cls, *args, **kwargs)
