"""The core's one extension point (tpushim._observe): what observers hear, in order, and that an
observer cannot break the user's call."""

import inspect
import logging
import pathlib
import re

import pytest
import tensorflow as tf
import tfcases

import tpushim
from tpushim import _observe


class Listener(_observe.Observer):
    def __init__(self, cap_train_steps=None):
        self.events = []
        self.cap = cap_train_steps

    def converted(self, conversion):
        self.events.append(("converted", conversion.settings.mode))

    def calling(self, call):
        self.events.append(("calling", call.event, call.steps))
        if call.event == "train" and self.cap:
            return _observe.Call(call.event, call.estimator, call.input_fn, self.cap)
        return None

    def input_called(self, input_call):
        self.events.append(("input", input_call.call.event, input_call.global_batch))

    def adapted(self, call, kind, text):
        self.events.append(("adapted", call.event if call else None, kind))

    def finished(self, call, seconds, steps, first_step_seconds):
        assert seconds >= 0
        self.events.append(("finished", call.event, steps, first_step_seconds is not None))


def test_a_failing_observer_is_logged_and_skipped(caplog):
    class Broken(_observe.Observer):
        def adapted(self, call, kind, text):
            raise RuntimeError("observer bug")

    with _observe.observing(_observe.Observer()), _observe.observing(Broken()):
        with caplog.at_level(logging.WARNING, logger="tpushim"):
            _observe.note("padding", "padded %d rows", 3)
        assert "failed in adapted" in caplog.text
        assert _observe.has_observers()
    assert not _observe.has_observers()


def test_an_observer_that_misses_an_event_is_refused():
    """As tf-keras's CallbackList calls every hook of every Callback: an observer without a
    method for an event fails when it starts observing, naming what it misses."""

    class Partial:
        def converted(self, conversion):
            pass

    with (
        pytest.raises(TypeError, match="Partial is not a tpushim observer") as raised,
        _observe.observing(Partial()),
    ):
        pass
    assert all(event in str(raised.value) for event in _observe.EVENTS if event != "converted")
    assert not _observe.has_observers()
    with pytest.raises(TypeError, match="does not handle converting, refused"):
        _observe.observing(object()).__enter__()


def _events_told():
    """The events the module dispatches: each _tell("...") and the one it calls itself."""
    source = inspect.getsource(_observe)
    return set(re.findall(r'_tell\(\s*"(\w+)"', source)) | set(
        re.findall(r"observer\.(\w+)\(", source)
    )


def _tpushims_observers():
    """Every observer tpushim itself registers, by the classes it passes to observing()."""
    from tpushim import _summary, _versions, demo
    from tpushim._preflight import strategy_checks

    found = set()
    for path in pathlib.Path(tpushim.__file__).parent.rglob("*.py"):
        found |= set(re.findall(r"_observe\.observing\((\w+)", path.read_text()))
    # summary, engines: instances of these classes (tpushim/_summary.py, tpushim/demo)
    classes = {
        "StrategyRecorder": strategy_checks.StrategyRecorder,
        "summary": _summary.Summary,
        "engines": demo._Engines,
    }
    if not _versions.uses_own_estimator():  # the TPUEstimator path's recorder (checked on <= 2.15)
        from tpushim._preflight import recorder

        classes["Recorder"] = recorder.Recorder
    assert found == set(classes) | {"Recorder"}, "an observer tpushim registers is not checked here"
    return classes.values()


def test_every_event_is_handled_by_every_observer():
    """An event added to the core without every observer handling it fails here: EVENTS lists
    what _observe dispatches, Observer handles each (a no-op), and each of tpushim's own
    observers has a method for each."""
    assert _events_told() == set(_observe.EVENTS)
    assert _observe.unhandled(_observe.Observer()) == []
    for cls in _tpushims_observers():
        assert _observe.unhandled(cls) == [], cls.__name__
        for event in _observe.EVENTS:  # each its own (a recorder's from their shared base)
            owner = next(c for c in cls.__mro__ if event in vars(c))
            assert owner is not object


def test_calling_may_replace_the_call_and_notes_belong_to_it():
    seen = []

    class Capper(_observe.Observer):
        def calling(self, call):
            return _observe.Call(call.event, call.estimator, call.input_fn, steps=2)

        def adapted(self, call, kind, text):
            seen.append((call.steps, kind, text))

    with _observe.observing(Capper()):
        with _observe.calling(_observe.Call("train", None, None, steps=100)) as call:
            assert call.steps == 2 and _observe.current_call() is call
            _observe.note("rebatch", "re-batched to %d", 8)
        assert _observe.current_call() is None
    assert seen == [(2, "rebatch", "re-batched to 8")]


@pytest.mark.slow  # trains an estimator
@pytest.mark.tpuestimator
def test_a_cpu_mode_run_in_the_order_observers_hear_it(tmp_path):
    x, y = tfcases.data()
    listener = Listener(cap_train_steps=2)
    with _observe.observing(listener):
        est = tfcases.convert(tmp_path, patch={"mode": "cpu"})
        est.train(tfcases.dataset_input_fn(x, y, repeat=True), steps=50)
        est.evaluate(tfcases.dataset_input_fn(x, y))
        predictions = list(est.predict(tfcases.dataset_input_fn(x)))
    assert len(predictions) == len(x)
    assert listener.events == [
        ("converted", "cpu"),
        ("calling", "train", 50),
        ("input", "train", tfcases.BATCH),
        ("finished", "train", 2, True),  # capped by the observer: 2 steps ran
        ("calling", "evaluate", None),
        ("input", "evaluate", tfcases.BATCH),
        ("adapted", "evaluate", "padding"),  # 52 rows in batches of 8: the last one short
        ("finished", "evaluate", None, False),
        ("calling", "predict", None),
        ("input", "predict", tfcases.BATCH),
        ("adapted", "predict", "padding"),
        ("finished", "predict", None, False),
    ]
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("-2")


@pytest.mark.tpuestimator
def test_converting_may_replace_the_arguments_hears_refusals_and_cannot_be_skipped(tmp_path):
    """``converting`` sees the call's arguments before anything is written and may replace them
    (the preflight's scratch model_dir); ``refused`` hears the error a conversion raises; a
    ``converting`` that fails stops the conversion (it is not skipped as other observers are)."""
    heard = []

    class Redirect(_observe.Observer):
        def converting(self, arguments):
            return dict(arguments, model_dir=str(tmp_path / "instead"))

        def refused(self, arguments, error):
            heard.append((arguments["model_dir"], type(error).__name__))

    with _observe.observing(Redirect()):
        est = tfcases.convert(tmp_path / "asked", patch={"mode": "cpu"})
        with pytest.raises(ValueError):
            tfcases.convert(tmp_path / "asked", model=tfcases.uncompiled, patch={"mode": "cpu"})
    assert est.model_dir == str(tmp_path / "instead") and not (tmp_path / "asked").exists()
    assert heard == [(str(tmp_path / "instead"), "ValueError")]

    class Broken(_observe.Observer):
        def converting(self, arguments):
            raise RuntimeError("cannot move the model_dir")

    with _observe.observing(Broken()), pytest.raises(RuntimeError, match="cannot move"):
        tfcases.convert(tmp_path / "asked", patch={"mode": "cpu"})
    assert not (tmp_path / "asked").exists()
