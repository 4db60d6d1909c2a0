"""The core's one extension point: observers hear what tpushim's estimators do.

The preflight's recorders (``python -m tpushim check``) and the runner's run summary observe; the
core knows neither. An observer handles every event below, each a method of its own (as
tf-keras's ``CallbackList`` calls every hook of every ``Callback``): :func:`observing` refuses
one that lacks any of :data:`EVENTS` with a ``TypeError`` naming them, so an event added to the
core is never skipped in silence by an observer written before it. Subclass :class:`Observer`
(every event a no-op) to handle only some; tpushim's own observers define every one.

* ``converting(arguments)`` -- a ``model_to_estimator`` call is about to be converted (its
  arguments by name, before anything is checked or written); it may return replaced arguments
  (the preflight's scratch model_dir), or None to leave them; unlike the others, an error it
  raises stops the conversion;
* ``refused(arguments, error)`` -- that conversion raised ``error`` (tpushim refused the model,
  or an argument); the error then reaches the caller as usual;
* ``converted(conversion)`` -- a ``model_to_estimator`` call became a tpushim estimator
  (:class:`Conversion`);
* ``derived(estimator, source, model_fn)`` -- a tpushim estimator was made from another one's
  conversion (``tf.estimator.add_metrics``): ``estimator`` runs ``model_fn``, which wraps
  ``source``'s;
* ``bypassed(source, why)`` -- a stock estimator was built around ``source``'s model_fn, off
  tpushim's TPU path (``why``: the call and the reason, one line);
* ``calling(call)`` -- a ``train``/``evaluate``/``predict`` call starts (:class:`Call`); it may
  return a replacement (e.g. fewer steps), or None to leave the call as it is;
* ``input_called(input_call)`` -- the user's input_fn ran, once, in the graph being built
  (:class:`InputCall`), before anything is read from it;
* ``adapted(call, kind, text)`` -- tpushim changed something about the input or the run (a cast,
  a queue fed as a Dataset, padding, re-batching, ...): :func:`note`, which also logs ``text``;
* ``input_waited(call, seconds)`` -- just before ``finished``: how long the call's session runs
  waited for their batches (:mod:`tpushim._input_wait`), or None where not measured (a TPU);
* ``finished(call, seconds, steps, first_step_seconds)`` -- the call returned (for ``train``,
  the global steps it ran and how long its first session run took).

Observers are process-wide, not per thread or task: a script may train from a thread it started.
An observer that raises is logged and skipped (except in ``converting``); the user's call goes on.
"""

import contextlib
import dataclasses
import logging
import threading
from typing import Any, Optional

logger = logging.getLogger("tpushim")

#: Every event an observer hears (each a method of every observer), in the order of a run.
EVENTS = (
    "converting",
    "refused",
    "converted",
    "derived",
    "bypassed",
    "calling",
    "input_called",
    "adapted",
    "input_waited",
    "finished",
)

_lock = threading.Lock()
_observers: tuple = ()  # replaced, never mutated: readers iterate a snapshot without the lock
_local = threading.local()  # the Call this thread is in, for note()


@dataclasses.dataclass(frozen=True)
class Conversion:
    """A ``model_to_estimator`` call tpushim converted.

    Attributes:
      estimator: the estimator returned.
      keras_model: the Keras model it was built from.
      arguments: the call's arguments by name (``keras_lib.model_to_estimator``'s parameters).
      settings: the :class:`tpushim._settings.Settings` it was converted with.
      model_fn: the model_fn tpushim made for it (the same for a TPU and for cpu mode).
      description: what it became and why, as the conversion's log line says it.
    """

    estimator: Any
    keras_model: Any
    arguments: dict
    settings: Any
    model_fn: Any
    description: str


@dataclasses.dataclass(frozen=True)
class Call:
    """One ``train``/``evaluate``/``predict`` call of a tpushim estimator.

    Attributes:
      event: ``"train"``, ``"evaluate"`` or ``"predict"``.
      estimator: the estimator called.
      input_fn: the input_fn it was given.
      steps, max_steps: as given (None where the call takes no such argument).
    """

    event: str
    estimator: Any
    input_fn: Any
    steps: Optional[int] = None
    max_steps: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class InputCall:
    """The user's input_fn, called once by the estimator, and what tpushim read of it.

    Attributes:
      call: the :class:`Call` it belongs to (None outside one, e.g. an estimator driven by
        ``train_and_evaluate`` internals that tpushim did not see start).
      mode: the ``tf.estimator.ModeKeys`` value.
      result: what the call returned, traced back to its source (a ``tf.data.Dataset``, or
        tensors), in the graph being built; nothing has been read from it.
      facts: the :class:`tpushim._input_fn.InputFacts` tpushim read of it.
      global_batch: the global batch size this call runs with.
    """

    call: Optional[Call]
    mode: str
    result: Any
    facts: Any
    global_batch: int


class Observer:
    """An observer that handles every event by doing nothing (tf-keras's ``Callback``):
    subclass it and override the events to act on. The module's docstring says what each is."""

    def converting(self, arguments):
        return None

    def refused(self, arguments, error):
        pass

    def converted(self, conversion):
        pass

    def derived(self, estimator, source, model_fn):
        pass

    def bypassed(self, source, why):
        pass

    def calling(self, call):
        return None

    def input_called(self, input_call):
        pass

    def adapted(self, call, kind, text):
        pass

    def input_waited(self, call, seconds):
        pass

    def finished(self, call, seconds, steps, first_step_seconds):
        pass


def unhandled(observer):
    """The :data:`EVENTS` ``observer`` has no method for (none: it is an observer)."""
    return [event for event in EVENTS if not callable(getattr(observer, event, None))]


@contextlib.contextmanager
def observing(observer):
    """While active, ``observer`` hears of every tpushim estimator's conversions and calls.

    Raises:
      TypeError: ``observer`` lacks a method for one of :data:`EVENTS`.
    """
    global _observers
    missing = unhandled(observer)
    if missing:
        raise TypeError(
            f"{type(observer).__name__} is not a tpushim observer: it does not handle "
            f"{', '.join(missing)}. An observer has a method for every event "
            f"({', '.join(EVENTS)}); subclass tpushim._observe.Observer to ignore the others."
        )
    with _lock:
        _observers = (*_observers, observer)
    try:
        yield observer
    finally:
        with _lock:
            kept = list(_observers)
            kept.remove(observer)
            _observers = tuple(kept)


def _tell(method, *args):
    """Calls ``method`` on every observer (each has it: :func:`observing`); their results."""
    results = []
    for observer in _observers:
        try:
            results.append(getattr(observer, method)(*args))
        except Exception:
            logger.warning("tpushim observer %r failed in %s", observer, method, exc_info=True)
    return results


@contextlib.contextmanager
def converting(arguments):
    """The duration of one conversion: observers may replace its ``arguments`` (the yielded
    value is what the conversion uses) and hear of the error that ends it, if one does."""
    for observer in _observers:
        # Not _tell: an observer that fails to replace the arguments (the preflight moving the
        # model_dir to a scratch copy) must stop the conversion, not be skipped.
        replaced = observer.converting(arguments)
        if replaced is not None:
            arguments = replaced
    try:
        yield arguments
    except Exception as e:
        _tell("refused", arguments, e)
        raise


def converted(conversion):
    """Tells observers of a conversion."""
    _tell("converted", conversion)


def derived(estimator, source, model_fn):
    """Tells observers that ``estimator`` (running ``model_fn``) was made from ``source``."""
    _tell("derived", estimator, source, model_fn)


def bypassed(source, why):
    """Tells observers that a stock estimator was built around ``source``'s model_fn, off
    tpushim's TPU path (``why``: the call and the reason, one line)."""
    _tell("bypassed", source, why)


@contextlib.contextmanager
def calling(call):
    """The duration of one train/evaluate/predict call: observers may replace ``call`` (the
    yielded value is the call to run) and :func:`note` attributes notes to it meanwhile."""
    for replaced in _tell("calling", call):
        if replaced is not None:
            call = replaced
    outer = getattr(_local, "call", None)
    _local.call = call
    try:
        yield call
    finally:
        _local.call = outer


def current_call():
    """The :class:`Call` this thread is in, or None."""
    return getattr(_local, "call", None)


def input_called(input_call):
    """Tells observers what the user's input_fn returned."""
    _tell("input_called", input_call)


def note(kind, text, *args):
    """Logs ``text % args`` (INFO) and tells observers that tpushim adapted something.

    Args:
      kind: a short tag, e.g. ``"float64"``, ``"queue"``, ``"padding"``, ``"rebatch"``.
      text, args: the log message and its arguments, as for ``logging``.
    """
    logger.info(text, *args)
    if _observers:
        _tell("adapted", current_call(), kind, text % args if args else text)


def input_waited(call, seconds):
    """Tells observers how long ``call`` waited for its input (None: not measured)."""
    _tell("input_waited", call, seconds)


def finished(call, seconds, steps=None, first_step_seconds=None):
    """Tells observers that ``call`` returned after ``seconds``."""
    _tell("finished", call, seconds, steps, first_step_seconds)


def has_observers():
    """True while at least one observer is active."""
    return bool(_observers)
