"""The run summary's input wait (issue 35, item 4): how long each call's session runs waited for
their batches, measured in the graph (tpushim._input_wait). Shares are compared, not absolute
times: a slow input's share must exceed a fast one's, whatever the machine's load."""

import time

import pytest
import tensorflow as tf
import tfcases

from tpushim import _observe, _summary

PAUSE = 0.1  # seconds each batch of the slow input takes to make
STRATEGY_PAUSE = 0.5  # the same on the strategy engine: see its test


def _input_fn(x, y=None, slow=False, repeat=False, seconds=PAUSE):
    """Batches of 8 rows; ``slow``: each batch waits ``seconds`` in a ``tf.py_function``."""

    def pause():
        time.sleep(seconds)
        return 0.0

    def slowed(*batch):
        done = tf.py_function(pause, [], tf.float32)
        with tf.control_dependencies([done]):
            return tf.nest.map_structure(tf.identity, batch)

    def input_fn():
        ds = tf.data.Dataset.from_tensor_slices(x if y is None else (x, y))
        ds = (ds.repeat() if repeat else ds).batch(tfcases.BATCH)
        return ds.map(slowed) if slow else ds

    return input_fn


class Waits(_observe.Observer):
    """What observers hear of input waits, per call, next to each call's seconds."""

    def __init__(self):
        self.waits, self.calls = [], []

    def input_waited(self, call, seconds):
        self.waits.append((call.event, seconds))

    def finished(self, call, seconds, steps, first_step_seconds):
        self.calls.append((call.event, seconds))

    def shares(self):
        assert len(self.waits) == len(self.calls)  # each call told its wait before it finished
        return {
            event: wait / seconds for (event, wait), (_, seconds) in zip(self.waits, self.calls)
        }


def _calls(tmp_path, slow, engine=None, seconds=PAUSE):
    x, y = tfcases.data()
    waits, summary = Waits(), _summary.Summary(table=True)
    patch = {"mode": "cpu"} if engine is None else {"mode": "cpu", "engine": engine, "quiet": True}
    with _observe.observing(waits), _observe.observing(summary):
        est = tfcases.convert(tmp_path, patch=patch)
        est.train(_input_fn(x, y, slow, repeat=True, seconds=seconds), steps=8)
        est.evaluate(_input_fn(x, y, slow, seconds=seconds))
        assert len(list(est.predict(_input_fn(x, slow=slow, seconds=seconds)))) == len(x)
    return waits, summary


@pytest.mark.slow  # trains estimators
@pytest.mark.tpuestimator  # cpu mode; the strategy engine's: the test below
def test_a_slow_input_waits_a_larger_share_of_each_call_than_a_fast_one(tmp_path):
    slow, slow_summary = _calls(tmp_path / "slow", slow=True)
    fast, _ = _calls(tmp_path / "fast", slow=False)
    assert [event for event, _ in slow.waits] == ["train", "evaluate", "predict"]
    for event, share in slow.shares().items():
        # 8 or 7 pauses of 0.1 s in a call of a few seconds, against microseconds per batch.
        assert 0 < fast.shares()[event] * 3 < share <= 1, (event, slow.shares(), fast.shares())
    print("input wait shares: slow", slow.shares(), "fast", fast.shares())
    table = slow_summary.format()
    assert "padding        input wait" in table
    for event, share in slow.shares().items():
        row = next(
            line for line in table.splitlines() if line.split()[:3] == [f"{event}()", "TPU", "path"]
        )
        assert row.endswith(f" s {100 * share:.0f}%"), row


@pytest.mark.slow  # trains estimators
def test_the_strategy_engines_input_wait_holds_a_slow_inputs_pauses(tmp_path):
    # Its training loop's reads are timed inside its tf.function, evaluation's and prediction's
    # batches in Python. Its calls' set-up (tracing, the XLA check, checkpoints) outweighs 8
    # batches, and tf.data makes the next batches while it runs: the pauses are compared
    # with the wait, not shares. Each call makes 7 or 8 batches, pausing STRATEGY_PAUSE for
    # each; some are made ahead (prefetched while the call traces its function), and each other
    # one's pause overlaps the engine's own work on the batch before it, which grows with the
    # machine's load (CI on 2 busy cores: evaluate waited 1.4 of 0.25 s pauses): more than one
    # whole pause is asked, against a fast input's hundredths of a second.
    slow, slow_summary = _calls(tmp_path / "slow", True, "strategy", STRATEGY_PAUSE)
    fast, _ = _calls(tmp_path / "fast", False, "strategy")
    assert [event for event, _ in slow.waits] == ["train", "evaluate", "predict"]
    print("input waits: slow", slow.waits, "fast", fast.waits, "calls", slow.calls)
    for (event, wait), (_, fast_wait), (_, seconds) in zip(slow.waits, fast.waits, slow.calls):
        assert 0 < fast_wait < 0.5 * STRATEGY_PAUSE, (event, fast.waits)
        assert wait - fast_wait > STRATEGY_PAUSE and wait < seconds, (event, slow.waits)
    table = slow_summary.format()
    for (event, wait), (_, seconds) in zip(slow.waits, slow.calls):
        row = next(
            line for line in table.splitlines() if line.split()[:3] == [f"{event}()", "TPU", "path"]
        )
        assert row.endswith(f"{wait:.2f} s {100 * wait / seconds:.0f}%"), row


@pytest.mark.slow  # trains estimators
@pytest.mark.tpuestimator  # cpu mode (the strategy engine's loop is timed, observed or not)
def test_measuring_the_input_wait_leaves_cpu_modes_numbers_stocks(tmp_path):
    # Dropout draws masks from op seeds: the timing ops are made when the session starts, after
    # the model, so observing changes no seed, nor any number.
    x, y = tfcases.data()

    def model():
        return tfcases.sequential(extra_layers=(tf.keras.layers.Dropout(0.3, seed=5),))

    waits = Waits()
    with _observe.observing(waits):
        tfcases.compare(
            tmp_path,
            model,
            _input_fn(x, y, repeat=True),
            _input_fn(x, y),
            _input_fn(x),
        )
    assert [event for event, _ in waits.waits] == ["train", "evaluate", "predict"]
    assert all(seconds > 0 for _, seconds in waits.waits)


def test_the_table_shows_input_wait_as_seconds_and_share_or_a_dash_where_not_measured():
    summary = _summary.Summary(table=True)
    estimator = object()
    summary.converted(
        type("C", (), {"estimator": estimator, "description": "TPUEstimator(use_tpu=True, X)"})()
    )
    train = _observe.Call("train", estimator, None, 4)
    summary.calling(train)
    summary.input_waited(train, 0.5)
    summary.finished(train, 2.0, 4, 0.5)
    evaluate = _observe.Call("evaluate", estimator, None)
    summary.calling(evaluate)
    summary.input_waited(evaluate, None)  # a TPU's infeed: not measured
    summary.finished(evaluate, 1.0, None, None)
    rows = [line.split() for line in summary.format().splitlines()]
    assert rows[-3][-2:] == ["input", "wait"]
    assert rows[-2] == ["train()", "TPU", "2.00", "4", "2.0", "0.50", "none", "0.50", "s", "25%"]
    assert rows[-1] == ["evaluate()", "TPU", "1.00", "-", "-", "-", "none", "-"]
