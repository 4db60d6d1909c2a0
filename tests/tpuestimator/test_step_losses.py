"""The training loss of every step on a TPU: stock's log line and NaN check at stock's steps.

Stock's estimator logs ``loss = L, step = S`` at the first step of a ``train()`` call and then every
``log_step_count_steps`` steps, and raises ``NanLossDuringTrainingError`` after the first NaN step.
tpushim's TPU step records each step's global loss (:mod:`tpushim._step_losses`), and
``StepLossHook`` does stock's work after each loop. Shown here: the records are the reported global
loss of every step on 8 emulated shards (rung 2b), the lines and the error are stock's (text,
steps, values within 1e-5) for loops of ``iterations_per_loop`` steps, and on a faked TPU system the
record sits in the TPU loop, fed by the cross-replica sum, with the hook replacing TPUEstimator's
once-per-loop line.
"""

import contextlib
import logging
import re

import numpy as np
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import
from replicas import GLOBAL, REPLICAS, Emulation, tpu_model

import tpushim

_losses = tpuestimator_import("tpushim._losses")
_step_losses = tpuestimator_import("tpushim._step_losses")
faketpu = tpuestimator_import("tpushim._preflight.faketpu")

pytestmark = pytest.mark.tpuestimator  # the TPU path (cpu mode's TPUEstimator) throughout

ModeKeys = tfcases.ModeKeys
LINE = re.compile(r"^loss = (\S+), step = (\d+)(?: \((\d+\.\d{3}) sec\))?$")


class _Lines(logging.Handler):
    """TensorFlow's log records at INFO and above, as their messages."""

    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        logger = tf.get_logger()
        self._level = logger.level
        logger.setLevel("INFO")
        logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        logger = tf.get_logger()
        logger.removeHandler(self)
        logger.setLevel(self._level)

    def parsed(self):
        """``[(step, loss, seconds or None)]`` of the ``loss = ..., step = ...`` lines."""
        found = [LINE.match(m) for m in self.messages]
        return [(int(m[2]), float(m[1]), None if m[3] is None else float(m[3])) for m in found if m]


def _model():
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(6, activation="tanh", name="h")(x)
    model = tf.keras.Model(x, tf.keras.layers.Dense(2, name="y")(h))
    model.compile(tf.keras.optimizers.legacy.SGD(0.05, momentum=0.5), loss="mse")
    return model


def _data(steps, nan_at=None):
    rng = np.random.RandomState(3)
    x = rng.randn(GLOBAL * steps, 4).astype("float32")
    y = rng.randn(GLOBAL * steps, 2).astype("float32")
    if nan_at is not None:
        y[GLOBAL * nan_at + 5] = np.nan  # one row of that step's global batch
    return x, y


def _stock(tmp_path, x, y, steps, every_n):
    """Stock's lines for ``train(steps)`` on the global batches in order, and its error if any."""
    est = tf.compat.v1.keras.estimator.model_to_estimator(
        keras_model=_model(),
        model_dir=str(tmp_path / "stock"),
        config=tf.estimator.RunConfig(log_step_count_steps=every_n, save_summary_steps=None),
    )
    error = None
    with _Lines() as lines:
        try:
            est.train(
                lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL).repeat(),
                steps=steps,
            )
        except tf.compat.v1.train.NanLossDuringTrainingError as e:
            error = e
    return lines, error


def _emulated(x, y, steps, every_n, iterations):
    """The hook's lines over 8 emulated shards run in loops of ``iterations`` steps; the error it
    raised, if any; every replica's records after the last loop run."""
    config = tf.compat.v1.estimator.tpu.RunConfig(
        save_summary_steps=None,
        tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(iterations_per_loop=iterations),
    )
    batches = [
        (x[s * GLOBAL : (s + 1) * GLOBAL], y[s * GLOBAL : (s + 1) * GLOBAL]) for s in range(steps)
    ]
    model = tpu_model(_model)
    init = model.get_weights()  # _model() is seeded: stock's starting weights
    emu = Emulation(model, ModeKeys.TRAIN, batches[0], config=config)
    hook, error = _step_losses.StepLossHook(every_n), None
    try:
        emu.load_weights(init)
        pairs = _step_losses.pairs(emu.graph)
        assert len(pairs) == REPLICAS
        with emu.graph.as_default():
            hook.begin()
        context = tf.compat.v1.train.SessionRunContext(None, emu.sess)
        with _Lines() as lines:
            try:
                for start in range(0, steps, iterations):
                    hook.before_run(context)
                    for batch in batches[start : start + iterations]:
                        emu.train(batch)
                    hook.after_run(context, None)
            except tf.compat.v1.train.NanLossDuringTrainingError as e:
                error = e
        return lines, error, emu.sess.run(pairs)
    finally:
        emu.close()


def _same_steps_as_stocks(got, expected):
    """Lines at stock's steps. Stock logs at its 0th, n-th, 2n-th ... run of ``train()`` the global
    step it reads in that run, which its graph leaves unordered against the run's increment (a
    loaded machine reads it after: ``step = 3`` for the run that started at 2). tpushim labels a
    step's loss with the step before it, as stock's unraced read does."""
    assert len(got) == len(expected)
    assert all(s - e in (0, -1) for (s, _, _), (e, _, _) in zip(got, expected)), (got, expected)


@pytest.mark.slow
@pytest.mark.parametrize("iterations", [4, 3, 1])
def test_each_steps_loss_is_logged_as_stock_at_stocks_steps(tmp_path, iterations):
    steps, every_n = 10, 3
    x, y = _data(steps)
    stock, stock_error = _stock(tmp_path, x, y, steps, every_n)
    shim, shim_error, records = _emulated(x, y, steps, every_n, iterations)
    assert stock_error is None and shim_error is None
    expected, got = stock.parsed(), shim.parsed()
    assert [s for s, _, _ in got] == [0, 3, 6, 9]
    _same_steps_as_stocks(got, expected)
    for (_, loss, _), (_, stock_loss, _) in zip(got, expected):
        assert abs(loss - stock_loss) < 1e-5, (got, expected)
    # seconds as stock: none on the first line, then the time since the line before
    assert got[0][2] is None and all(t is not None and t >= 0 for _, _, t in got[1:])
    # every shard recorded the same global losses and steps (the loop's last `iterations` steps)
    losses, numbers = records[0]
    assert sorted(numbers) == list(range(steps - len(numbers), steps))
    for other_losses, other_numbers in records[1:]:
        np.testing.assert_array_equal(other_numbers, numbers)
        np.testing.assert_allclose(other_losses, losses, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_a_nan_step_raises_stocks_error_after_the_lines_before_it(tmp_path):
    steps, every_n, nan_at = 10, 2, 5
    x, y = _data(steps, nan_at=nan_at)
    stock, stock_error = _stock(tmp_path, x, y, steps, every_n)
    # loops of 4: the NaN step is the second of the second loop, whose other steps ran on
    shim, shim_error, _ = _emulated(x, y, steps, every_n, iterations=4)
    assert isinstance(stock_error, tf.compat.v1.train.NanLossDuringTrainingError)
    assert type(shim_error) is type(stock_error) and str(shim_error) == str(stock_error)
    assert [s for s, _, _ in shim.parsed()] == [0, 2, 4]
    _same_steps_as_stocks(shim.parsed(), stock.parsed())

    def tail(lines):  # the loss lines and NanTensorHook's message, in order
        return [m for m in lines.messages if LINE.match(m) or m == _step_losses.NAN_MESSAGE]

    assert tail(shim)[-1] == tail(stock)[-1] == _step_losses.NAN_MESSAGE
    assert len(tail(shim)) == len(tail(stock)) == 4


def _recording_graph(iterations):
    """A graph with one replica's records and assign ops for a loop of given (step, loss)."""
    graph = tf.Graph()
    with graph.as_default():
        loss = tf.compat.v1.placeholder(tf.float32, [])
        step = tf.compat.v1.placeholder(tf.int64, [])
        op = _step_losses.record(loss, step, iterations)
        init = tf.compat.v1.local_variables_initializer()
    sess = tf.compat.v1.Session(graph=graph)
    sess.run(init)

    def loop(pairs):
        for s, value in pairs:
            sess.run(op, {step: s, loss: value})

    return graph, sess, loop


@pytest.mark.parametrize(
    "first, loops, every_n, logged, stride",
    [
        (0, [4, 4, 2], 3, [0, 3, 6, 9], 1),
        (7, [4, 4, 4, 1], 5, [7, 12, 17], 1),  # a resumed train(): the first line at its first step
        (0, [4, 4], 1, list(range(8)), 1),
        (0, [3, 3], None, [], 1),  # log_step_count_steps=None: no lines, as stock
        (0, [2, 2, 2], 100, [0], 1),
        # A two-optimizer model advances the global step twice a step; stock counts its runs.
        (0, [4, 4, 2], 3, [0, 6, 12, 18], 2),
    ],
)
def test_the_hook_logs_stocks_schedule_over_loops(first, loops, every_n, logged, stride):
    iterations = max(loops)
    graph, sess, loop = _recording_graph(iterations)
    hook = _step_losses.StepLossHook(every_n)
    with graph.as_default():
        hook.begin()
    context = tf.compat.v1.train.SessionRunContext(None, sess)
    step = first
    with _Lines() as lines:
        for count in loops:
            hook.before_run(context)
            loop([(s, 0.5 + s) for s in range(step, step + count * stride, stride)])
            hook.after_run(context, None)
            step += count * stride
    sess.close()
    assert [(s, v) for s, v, _ in lines.parsed()] == [(s, 0.5 + s) for s in logged]
    assert all(LINE.match(m) or "is deprecated" in m for m in lines.messages)


def test_the_hook_raises_at_the_first_nan_step_only():
    graph, sess, loop = _recording_graph(4)
    hook = _step_losses.StepLossHook(2)
    with graph.as_default():
        hook.begin()
    context = tf.compat.v1.train.SessionRunContext(None, sess)
    with _Lines() as lines:
        hook.before_run(context)
        loop([(0, 1.0), (1, np.nan), (2, 3.0), (3, 4.0)])
        with pytest.raises(tf.compat.v1.train.NanLossDuringTrainingError):
            hook.after_run(context, None)
    sess.close()
    said = [m for m in lines.messages if "is deprecated" not in m]  # TF's, once per process
    assert said == ["loss = 1.0, step = 0", _step_losses.NAN_MESSAGE]


def test_the_hook_does_nothing_where_nothing_is_recorded():
    graph = tf.Graph()
    hook = _step_losses.StepLossHook(1)
    with graph.as_default():
        hook.begin()
    hook.before_run(None)
    hook.after_run(None, None)  # no session needed: nothing is read


@pytest.mark.parametrize(
    "value, counted", [(4, 4), ("100", 100), ("60s", None), ("2m", None), ("1h", None)]
)
def test_iterations_per_loop_in_seconds_records_nothing(value, counted):
    config = tf.compat.v1.estimator.tpu.RunConfig(
        tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(iterations_per_loop=value)
    )
    assert _step_losses.iterations_counted(config) == counted
    assert _step_losses.iterations_counted(None) is None
    assert _step_losses.iterations_counted(tf.estimator.RunConfig()) is None


def _data_ancestors(function, node_name):
    """Names and ops of the nodes whose values flow into ``node_name`` (control edges left out)."""
    nodes = {n.name: n for n in function.node_def}
    seen, stack = {}, [node_name]
    while stack:
        name = stack.pop().split(":")[0]
        if name in seen or name not in nodes:
            continue
        seen[name] = nodes[name].op
        stack.extend(i for i in nodes[name].input if not i.startswith("^"))
    return seen


def _faked_tpu_train(tmp_path, iterations_per_loop, **config):
    x, y = tfcases.data(n=128)
    with faketpu.faked_tpu_system() as tpu:
        tpushim.patch(tpu=tpu.master)
        try:
            est = tf.keras.estimator.model_to_estimator(
                keras_model=tfcases.sequential(),
                model_dir=str(tmp_path),
                config=tf.compat.v1.estimator.tpu.RunConfig(
                    tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(
                        iterations_per_loop=iterations_per_loop
                    ),
                    **config,
                ),
            )
        finally:
            tpushim.unpatch()
        return tpu.build(
            lambda: est.train(
                lambda: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64), steps=8
            )
        )


@contextlib.contextmanager
def _logged_warnings():
    """TensorFlow's WARNING lines logged inside the block."""
    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler, logger = Keep(logging.WARNING), logging.getLogger("tensorflow")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)  # the suite may run with TensorFlow's logging turned down
    try:
        yield lines
    finally:
        logger.setLevel(level)
        logger.removeHandler(handler)


@pytest.mark.slow
def test_tpu_train_graph_records_every_steps_global_loss_in_the_loop(tmp_path):
    build = _faked_tpu_train(tmp_path / "md", 4, log_step_count_steps=3)
    graph = build.graph
    ((losses, numbers),) = _step_losses.pairs(graph)
    assert losses.shape == [4] and numbers.shape == [4] and numbers.dtype == tf.int64
    # local: never in a checkpoint
    assert not {losses.ref(), numbers.ref()} & {v.ref() for v in tf.compat.v1.global_variables()}
    assert {losses.ref(), numbers.ref()} <= {
        v.ref() for v in graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
    }
    # The graph is written (the checkpoint's meta graph) without TensorFlow's "Issue encountered
    # when serializing" warning (a collection of tuples, before), which the preflight printed.
    with graph.as_default(), _logged_warnings() as warnings:
        tf.compat.v1.train.export_meta_graph(graph=graph)
    assert not [w for w in warnings if "serializing" in w], warnings
    # Both are written inside the TPU training loop's body, the losses from the reported sum.
    writes = [
        (function, node)
        for function in graph.as_graph_def().library.function
        for node in function.node_def
        if node.op == "AssignVariableOp" and "tpushim_step_" in node.input[0]
    ]
    assert len(writes) == 3 and len({f.signature.name for f, _ in writes}) == 1  # + the count
    function = writes[0][0]
    assert any(n.op == "OutfeedEnqueueTuple" for n in function.node_def)  # the step's body
    (loss_write,) = [n for _, n in writes if "tpushim_step_losses" in n.input[0]]
    sums = [
        name
        for name, op in _data_ancestors(function, loss_write.input[1]).items()
        if op == "CrossReplicaSum"
    ]
    assert len(sums) == 1 and _losses.REPORTED_SUM in sums[0], sums  # not a gradient's
    # The hook, with the user's log_step_count_steps, is the session's first: its NaN error comes
    # before the CheckpointSaverHook can save a NaN loop's weights, and its lines before
    # Estimator's NanTensorHook. TPUEstimator's once-per-loop LoggingTensorHook is gone.
    names = [type(h).__name__ for h in build.hooks]
    assert "LoggingTensorHook" not in names
    assert names[0] == "StepLossHook" and names.count("StepLossHook") == 1
    assert {"CheckpointSaverHook", "NanTensorHook"} <= set(names)
    (hook,) = [h for h in build.hooks if isinstance(h, _step_losses.StepLossHook)]
    assert hook._every_n == 3


@pytest.mark.slow
def test_iterations_per_loop_in_seconds_keeps_tpuestimators_loop_line(tmp_path):
    build = _faked_tpu_train(tmp_path / "md", "30s")
    assert _step_losses.pairs(build.graph) == []
    names = [type(h).__name__ for h in build.hooks]
    assert "LoggingTensorHook" in names  # TPUEstimator's own, once every 30 s


@pytest.mark.slow
def test_stock_saves_a_nan_steps_weights_on_a_save_step(tmp_path):
    """Why tpushim's check on a TPU runs before the checkpoint saver: stock's saver runs first
    (a chief-only hook) and keeps the NaN weights of a NaN step that is a save step."""
    x, y = _data(10, nan_at=5)  # the sixth run: global step 6, a save step for every 3
    est = tf.compat.v1.keras.estimator.model_to_estimator(
        keras_model=_model(),
        model_dir=str(tmp_path),
        config=tf.estimator.RunConfig(save_checkpoints_steps=3, save_summary_steps=None),
    )
    with pytest.raises(tf.compat.v1.train.NanLossDuringTrainingError):
        est.train(
            lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL).repeat(), steps=10
        )
    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert latest.endswith("model.ckpt-6")
    assert np.isnan(tf.train.load_checkpoint(latest).get_tensor("h/kernel")).any()
