"""Around the strategy engine's steps (tpushim/_stock_hooks.py): stock's log lines at stock's
steps with each step's global loss, the NaN check at the NaN step with stock's checkpoints after
it, the TensorBoard events stock writes in model_dir and model_dir/eval (tags, steps, values),
and the checkpoints stock keeps (``save_checkpoints_steps`` counted from the last save,
``save_checkpoints_secs``, the 5 an object-based Keras estimator keeps), each against the stock
estimator's from the same run, on 8 logical CPU devices with steps_per_execution 3.

On 2.12-2.15 against the stock estimator run beside it (tests/strategy_events_proof.py), on
>= 2.16 against stock TensorFlow 2.15's, tests/reference/strategy_events_tf215.json.
"""

import json
import math
import os

import procs
import pytest

pytestmark = pytest.mark.slow
TOLERANCE = 1e-5
CASES = ("schedule", "nan", "keep", "secs", "summaries")


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    root = tmp_path_factory.mktemp("events")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return procs.proof(os.path.join(here, "strategy_events_proof.py"), root)


def _both(engine, stock):
    """Both sides in full (pytest shortens a message that is not a string)."""
    return f"engine {json.dumps(engine)}\nstock  {json.dumps(stock)}"


def _close(a, b):
    if a is None or b is None:
        return a is b
    if math.isnan(b):
        return math.isnan(a)
    return abs(a - b) <= TOLERANCE * max(1.0, abs(b))


def _saved_again(lines, i):
    """Whether line ``i`` is stock's save of the step the previous call ended at."""
    return i > 0 and lines[i][0] == "save" and lines[i - 1][0] == "final"


def test_stock_is_stock_tensorflow_215(proof):
    assert proof["stock_tensorflow"].split(".")[:2] <= ["2", "15"]


@pytest.mark.parametrize("case", CASES)
def test_log_lines_as_stocks(proof, case):
    """``loss = L, step = S`` at the call's first step and every log_step_count_steps (S the
    global step before the step, L that step's global loss), ``global_step/sec`` between them,
    the saves, the NaN line, ``Loss for final step``, the evaluation's line: in stock's order."""
    stock, engine = proof["stock"][case]["lines"], proof["engine"][case]["lines"]
    # Stock saves the restored step again when a second call starts (the same values); the
    # engine does not rewrite a checkpoint an earlier call wrote (its event is written).
    stock = [line for i, line in enumerate(stock) if not _saved_again(stock, i)]
    # Stock's LoggingTensorHook reads the global step in the session.run that increments it, with
    # no order between the two: its label is the step before, now and then the step after (seen
    # once in a suite run: "step = 5" for the step run from 4). The loss itself is compared.
    stock = [
        [
            kind,
            step - 1 if kind == "loss" and got[1] is not None and step == got[1] + 1 else step,
            value,
        ]
        for (kind, step, value), got in zip(stock, engine + [[None, None]] * len(stock))
    ]
    assert [line[:2] for line in engine] == [line[:2] for line in stock], _both(engine, stock)
    for got, want in zip(engine, stock):
        assert _close(got[2], want[2]), (got, want)


@pytest.mark.parametrize("case", CASES)
def test_training_events_as_stocks(proof, case):
    """model_dir's events in stock's order: CHECKPOINT and START session logs, the loss
    (``loss_1``) every save_summary_steps with the step's global loss, ``global_step/sec``."""
    stock, engine = proof["stock"][case]["events"], proof["engine"][case]["events"]
    assert [e[:3] for e in engine] == [e[:3] for e in stock], _both(engine, stock)
    for got, want in zip(engine, stock):
        if got[2] == "global_step/sec":
            assert got[3] > 0  # a rate: timing, not compared
        else:
            assert got[3] == want[3] or _close(got[3], want[3]), (got, want)


def test_negative_control_replica_0s_loss_reported(proof):
    """The step's loss taken from replica 0 alone (scaled to the global batch, as a TPU's shard
    0's loss would be): the logged ``loss = L`` lines and the written ``loss_1`` leave stock's."""
    stock, control = proof["stock"]["schedule"], proof["engine"]["reported_control"]

    def logged(run):
        return [line[2] for line in run["lines"] if line[0] == "loss"]

    def written(run):
        return [event[3] for event in run["events"] if event[2] == "loss_1"]

    lines = list(zip(logged(control), logged(stock)))
    scalars = list(zip(written(control), written(stock)))
    assert lines and scalars
    assert max(abs(g - w) for g, w in lines) > 1e-3, lines
    assert max(abs(g - w) for g, w in scalars) > 1e-3, scalars


def _probe(events, tag="probe/mean_1"):
    return [e for e in events if e[2] == tag]


@pytest.mark.parametrize("tag", ["probe/mean_1", "probe/spread"])
def test_model_scalars_on_8_replicas_as_stocks(proof, tag):
    """The model's own v1 scalars at stock's steps with the global batch's value, on 8 replicas
    with 2 of padding (the other events: test_training_events_as_stocks): its input's mean,
    and its range (max - min over the batch: no mean of the replicas' values gives it),
    computed on the host from the real rows gathered. Negative control: the padding
    replicas' rows gathered too, the mean leaves stock's."""
    stock = _probe(proof["stock"]["summaries"]["events"], tag)
    engine = _probe(proof["engine"]["summaries"]["events"], tag)
    control = _probe(proof["engine"]["summaries_control"]["events"], tag)
    assert [e[1] for e in stock] == [1, 3, 5, 7, 8, 10], stock
    assert [e[:3] for e in engine] == [e[:3] for e in stock] == [e[:3] for e in control]
    for got, want in zip(engine, stock):
        assert _close(got[3], want[3]), (got, want)
    if tag == "probe/mean_1":
        assert max(abs(c[3] - w[3]) for c, w in zip(control, stock)) > 1e-3, (control, stock)


def test_model_histogram_on_8_replicas_as_stocks(proof):
    """The model's own v1 histogram (its input's values) at stock's steps, of the global batch's
    rows: the 6 real rows gathered from 8 replicas to the host, where stock's op summarizes
    them (its min, max, count, sums, bucket limits and counts within 1e-5); and the histogram
    of its column means (``tf.reduce_mean(x, 0)``, each replica's the mean of its one row),
    computed on the host from those rows in a copy of stock's graph; and of two tensors of one
    row per example computed across the rows (``x - tf.reduce_mean(x, 0)``, each replica's all
    zeros; ``tf.cumsum(x, 0)``), computed on the host from the rows before them. Negative
    control: the padding replicas' rows gathered too, and each replica's rows as it computed
    them (the summary of ``x - mean`` then of zeros)."""

    def histogram(events):
        return [e for e in events if e[0] == "histo"]

    stock = histogram(proof["stock"]["summaries"]["events"])
    engine = histogram(proof["engine"]["summaries"]["events"])
    control = histogram(proof["engine"]["summaries_control"]["events"])
    steps = sorted({e[1] for e in stock})
    assert steps == [1, 3, 5, 7, 8, 10], stock
    assert [e[2] for e in stock if e[1] == 1][:3] == [
        "probe/values:min",
        "probe/values:max",
        "probe/values:num",
    ]
    assert [e[:3] for e in engine] == [e[:3] for e in stock], _both(engine, stock)
    for got, want in zip(engine, stock):
        assert _close(got[3], want[3]), (got, want)
    counts = [e[3] for e in stock if e[2] == "probe/values:num"]
    assert counts == [6 * 3.0] * len(steps), counts  # 6 rows of 3 units
    assert [e[3] for e in control if e[2] == "probe/values:num"] == [8 * 3.0] * len(steps)
    for tag in ("probe/columns:sum", "probe/centred:max", "probe/running:sum"):
        want = [e for e in stock if e[2] == tag]
        assert len(want) == len(steps), (tag, stock)
        moved = [e for e in control if e[2] == tag]
        assert max(abs(c[3] - w[3]) for c, w in zip(moved, want)) > 1e-3, (moved, want)


@pytest.mark.parametrize("case", ["schedule", "nan", "summaries"])
def test_evaluation_events_as_stocks(proof, case):
    """model_dir/eval: the metrics at the global step, and the evaluated checkpoint's path."""
    stock, engine = proof["stock"][case]["eval_events"], proof["engine"][case]["eval_events"]
    assert [e[:3] for e in engine] == [e[:3] for e in stock], _both(engine, stock)
    for got, want in zip(engine, stock):
        assert got[3] == want[3] or _close(got[3], want[3]), (got, want)


@pytest.mark.parametrize("case", CASES)
def test_errors_and_checkpoint_state_as_stocks(proof, case):
    """The NaN step raises stock's error, with stock's checkpoints listed after it; every case's
    ``checkpoint`` file lists stock's checkpoints (5 kept, whatever keep_checkpoint_max says)."""
    stock, engine = proof["stock"][case], proof["engine"][case]
    assert engine["error"] == stock["error"], engine.get("message")
    assert engine["checkpoints"] == stock["checkpoints"]


@pytest.mark.parametrize("case", CASES)
def test_checkpoint_files_kept(proof, case):
    """Stock's files: the checkpoints the state lists beyond keep_checkpoint_max deleted, an
    earlier train() call's too (``keep``: the first call wrote 0-4, the second keeps 4-8, as
    stock), so a run restarted again and again keeps 5, not 5 more at every restart."""
    stock, engine = proof["stock"][case]["files"], proof["engine"][case]["files"]
    if case == "keep":
        assert set(stock) == {f"model.ckpt-{i}" for i in range(4, 9)}
    assert engine == stock


def test_log_lines_print_the_loss_as_stocks(tmp_path):
    """``loss = 471.87808, step = 0``: the loss as LoggingTensorHook prints a float32 (str(),
    its shortest digits), not its float64 digits (``471.8780822753906``), beside stock's lines."""
    import logging
    import re

    import numpy as np
    import tfcases

    x, y = tfcases.data()
    lines = {}
    for name, patch in (
        ("stock", {"mode": "off"}),
        ("engine", {"mode": "cpu", "engine": "strategy"}),
    ):
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7, log_step_count_steps=2)
        estimator = tfcases.convert(tmp_path / name, patch=dict(patch, quiet=True), config=config)
        seen = []
        handler = logging.Handler()
        handler.emit = lambda record, seen=seen: seen.append(record.getMessage())
        logger = logging.getLogger("tensorflow")
        level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            estimator.train(tfcases.dataset_input_fn(x, y, repeat=True), steps=5)
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        lines[name] = [m for m in seen if m.startswith("loss = ")]
    loss = re.compile(r"^loss = (\S+), step = \d+")
    assert len(lines["engine"]) == len(lines["stock"]) == 3, lines
    for got, want in zip(lines["engine"], lines["stock"]):
        text, stock_text = loss.match(got).group(1), loss.match(want).group(1)
        assert text == str(np.float32(text)), (got, want)
        assert abs(float(text) - float(stock_text)) <= 1e-5 * max(1.0, abs(float(stock_text)))


def test_observers_hear_the_engines_calls(tmp_path):
    """The run summary (and the preflight, which caps a call's steps) observe the strategy
    engine's train/evaluate/predict as TPUEstimator's: the steps run, the first tf.function
    call's time, and its input wait (each step's read timed inside the tf.function, each
    evaluation and prediction batch's in Python): seconds and their share, as the TPU path's."""
    import dataclasses
    import re

    import tfcases

    from tpushim import _observe, _summary

    class Capping(_observe.Observer):
        def calling(self, call):
            return dataclasses.replace(call, steps=3) if call.steps else None

    x, y = tfcases.data()
    summary = _summary.Summary(table=True)
    with _observe.observing(summary), _observe.observing(Capping()):
        estimator = tfcases.convert(
            tmp_path,
            patch={"mode": "cpu", "engine": "strategy", "iterations_per_loop": 7, "quiet": True},
        )
        estimator.train(tfcases.dataset_input_fn(x, y, repeat=True), steps=8)
        # 7 batches, 7 steps per call: the second call finds the input exhausted (no step).
        estimator.train(tfcases.dataset_input_fn(x, y))
        estimator.evaluate(tfcases.dataset_input_fn(x, y))
        assert len(list(estimator.predict(tfcases.dataset_input_fn(x)))) == len(x)
    assert estimator.latest_checkpoint().endswith("model.ckpt-10")  # 3 (the cap), then 7
    lines = summary.format().splitlines()
    trains = [line for line in lines if line.strip().startswith("train()") and " s " in line]
    assert "3 steps" in trains[0] and "(first session run" in trains[0], lines
    assert "7 steps" in trains[1], lines
    rows = [line.split() for line in lines if line.strip().startswith(("evaluate()", "predict()"))]
    assert len(rows) == 4, lines  # a summary line and a table row each
    table = [line for line in lines if "TPU path" in line]
    assert len(table) == 4, lines
    for row in table:  # input wait: measured
        assert re.search(r"  \d+\.\d\d s \d+%$", row.rstrip()), lines


#: What stock 2.15 logs (its Saver, at INFO) in the calls of the test below, relative to the
#: model_dir: nothing at the first train() (a warm start from the Keras weights), the latest
#: checkpoint at the resumed train(), at evaluate() and predict(), and the path an evaluate()
#: names. Checked against stock itself where it runs (TensorFlow 2.15).
STOCKS_RESTORING_LINES = ["model.ckpt-3", "model.ckpt-5", "model.ckpt-5", "model.ckpt-3"]


def _restoring_paths():
    from tpushim import _versions

    paths = {"engine": {"mode": "cpu", "engine": "strategy"}}
    if not _versions.uses_own_estimator():
        paths["stock"] = {"mode": "off"}
    return paths


@pytest.mark.parametrize("path", sorted(_restoring_paths()))
def test_restoring_from_a_checkpoint_is_logged_as_stocks(tmp_path, path):
    """``Restoring parameters from <path>``, stock's Saver line at INFO, each time a call reads
    a checkpoint: a train() resuming, evaluate() (the latest, or the checkpoint it names) and
    predict(); none where train() starts from the Keras weights."""
    import logging

    import tfcases

    x, y = tfcases.data()
    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
    patch = dict(_restoring_paths()[path], quiet=True)
    estimator = tfcases.convert(tmp_path, patch=patch, config=config)
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("tensorflow")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        estimator.train(tfcases.dataset_input_fn(x, y, repeat=True), steps=3)
        estimator.train(tfcases.dataset_input_fn(x, y, repeat=True), steps=2)
        estimator.evaluate(tfcases.dataset_input_fn(x, y))
        list(estimator.predict(tfcases.dataset_input_fn(x)))
        estimator.evaluate(
            tfcases.dataset_input_fn(x, y), checkpoint_path=str(tmp_path / "model.ckpt-3")
        )
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    prefix = "Restoring parameters from "
    lines = [m[len(prefix) :] for m in seen if m.startswith(prefix)]
    assert lines == [str(tmp_path / name) for name in STOCKS_RESTORING_LINES], lines
