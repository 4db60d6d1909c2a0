"""The user's SessionRunHooks on the strategy engine (tpushim/_stock_hooks.py, SessionHooks):
stock's stop, early-stopping and counter hooks and hand-written ones called at stock's steps,
training stopped at stock's step with stock's weights, against the stock estimator on 8 logical
CPU devices with steps_per_execution 3 (tests/strategy_hooks_proof.py; on >= 2.16 against stock
TensorFlow 2.15's, tests/reference/strategy_hooks_tf215.json); the hooks that need the model's
graph or session refused before anything is written; how many steps a tf.function call runs
beside each kind of hook.
"""

import os

import procs
import pytest
import tensorflow as tf
import tfcases

import tpushim

TOLERANCE = 1e-5
CASES = ("stop_at", "request_stop", "early", "early_steps", "clock", "counter", "eval_predict")


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    root = tmp_path_factory.mktemp("hooks")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return procs.proof(os.path.join(here, "strategy_hooks_proof.py"), root)


@pytest.mark.slow
def test_stock_is_stock_tensorflow_215(proof):
    assert proof["stock_tensorflow"].split(".")[:2] <= ["2", "15"]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_hooks_called_and_stopped_as_stocks(proof, case):
    """Every hook call (begin, after_create_session, before_run, after_run with the global step
    its fetch read, end) in stock's order, the step each train() call ended at, the hooks' lines
    and TensorBoard steps, the evaluations' losses and predictions' counts."""
    stock, engine = proof["stock"][case], proof["engine"][case]
    assert engine["calls"] == stock["calls"]
    assert engine["ended"] == stock["ended"]
    assert engine.get("counter") == stock.get("counter")
    assert engine["lines"] == stock["lines"]
    for key in ("evals", "eval"):
        got, want = engine.get(key), stock.get(key)
        assert (got is None) == (want is None)
        for a, b in zip(tf.nest.flatten(got or []), tf.nest.flatten(want or [])):
            assert abs(a - b) <= TOLERANCE * max(1.0, abs(b)), (key, got, want)
    assert engine.get("predicted") == stock.get("predicted")


@pytest.mark.slow
@pytest.mark.parametrize("case", ("early", "early_steps", "clock"))
def test_early_stopping_reads_the_step_before_it_runs(proof, case):
    """The engine's early-stopping hooks read the global step before its step runs (stock's,
    read in the session.run that increments it, now and then read the next: that stock run is
    set aside and run again, and the run compared above is one without the race)."""
    stock, engine = proof["stock"][case], proof["engine"][case]
    assert engine["reads"] == list(range(len(engine["reads"]))) and engine["reads"]
    assert stock["reads"] == engine["reads"], stock["retried"]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_weights_as_stocks(proof, case):
    stock, engine = proof["stock"][case]["weights"], proof["engine"][case]["weights"]
    assert sorted(engine) == sorted(stock) and engine
    for name, want in stock.items():
        diff = abs(tf.constant(engine[name]) - tf.constant(want))
        assert float(tf.reduce_max(diff)) <= TOLERANCE, name


class _Fetching(tf.compat.v1.train.SessionRunHook):
    """Fetches a tensor of a graph of its own (as a hook holding a model tensor would)."""

    def __init__(self):
        with tf.Graph().as_default():
            self.tensor = tf.constant(1.0)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self.tensor)


class _SessionUser(tf.compat.v1.train.SessionRunHook):
    def after_create_session(self, session, coord):
        session.run(session.graph.get_tensor_by_name("hidden/kernel:0"))


def _refused_hooks(where):
    with tf.Graph().as_default():  # its writer is made with it (a TF1 script's graph mode)
        profiler = tf.compat.v1.train.ProfilerHook(save_steps=1, output_dir=where)
    return {
        "ProfilerHook": profiler,
        "CheckpointSaverHook": tf.compat.v1.train.CheckpointSaverHook(where, save_steps=1),
        "SummarySaverHook": tf.compat.v1.train.SummarySaverHook(
            save_steps=1, output_dir=where, summary_op=["summary"]
        ),
        "NanTensorHook": tf.compat.v1.train.NanTensorHook("loss"),
        "LoggingTensorHook": tf.compat.v1.train.LoggingTensorHook(
            {"w": "hidden/kernel:0"}, every_n_iter=1
        ),
        "_Fetching": _Fetching(),
        "_SessionUser": _SessionUser(),
    }


@pytest.mark.slow
def test_hooks_needing_the_graph_refused_before_anything_is_written(tmp_path):
    """Each hook that needs the model's graph or session: a ConversionError naming it, in
    train, evaluate and predict, before a checkpoint or event is written (model_dir as the
    conversion left it); a hook that is no SessionRunHook: stock's TypeError."""
    x, y = tfcases.data()
    model_dir = tmp_path / "m"
    estimator = tfcases.convert(
        model_dir, patch={"mode": "cpu", "engine": "strategy", "quiet": True}
    )
    before = sorted(os.listdir(model_dir)) if model_dir.exists() else []
    for name, hook in _refused_hooks(str(tmp_path / "elsewhere")).items():
        with pytest.raises(tpushim.ConversionError, match=f"cannot run {name}"):
            estimator.train(tfcases.dataset_input_fn(x, y), hooks=[hook], steps=2)
        now = sorted(os.listdir(model_dir)) if model_dir.exists() else []
        assert now == before, name
    with pytest.raises(TypeError, match="All hooks must be SessionRunHook instances"):
        estimator.train(tfcases.dataset_input_fn(x, y), hooks=["not a hook"], steps=2)
    estimator.train(tfcases.dataset_input_fn(x, y), steps=2)
    written = sorted(os.listdir(model_dir))
    for name, hook in _refused_hooks(str(tmp_path / "elsewhere")).items():
        with pytest.raises(tpushim.ConversionError, match=f"cannot run {name}"):
            estimator.evaluate(tfcases.dataset_input_fn(x, y), hooks=[hook])
        with pytest.raises(tpushim.ConversionError, match=f"cannot run {name}"):
            next(estimator.predict(tfcases.dataset_input_fn(x), hooks=[hook]))
        assert sorted(os.listdir(model_dir)) == written, name


class _Stopping(tf.compat.v1.train.SessionRunHook):
    def after_run(self, run_context, run_values):
        run_context.request_stop()


class _BeginEnd(tf.compat.v1.train.SessionRunHook):
    def begin(self):
        pass

    def end(self, session):
        pass


@pytest.mark.slow
def test_steps_per_call_beside_each_hook(tmp_path):
    """A call runs steps_per_execution steps unless a hook may stop within it: up to a
    StopAtStepHook's last step, up to an early-stopping hook's next check on steps; one step
    beside a hook that may stop at any step (a hand-written after_run, a check on a clock)."""
    from tpushim import _stock_hooks as _step_events

    estimator = tfcases.convert(
        tmp_path, patch={"mode": "cpu", "engine": "strategy", "quiet": True}
    )
    api = tf.estimator if hasattr(tf, "estimator") else None
    if api is None:
        with tpushim.patched(mode="off", quiet=True):
            api = tf.estimator

    def early(**every):
        return api.experimental.make_early_stopping_hook(estimator, lambda: False, **every)

    def per_call(hook, step, n=8, start=0):
        return _step_events.SessionHooks([hook], start).per_call(step, n)

    assert per_call(tf.compat.v1.train.StopAtStepHook(last_step=5), 0) == 5
    assert per_call(tf.compat.v1.train.StopAtStepHook(last_step=5), 3, n=3) == 2
    assert per_call(tf.compat.v1.train.StopAtStepHook(num_steps=4), 10, start=10) == 4
    assert per_call(early(run_every_secs=None, run_every_steps=3), 0) == 1  # its first check
    hook = early(run_every_secs=None, run_every_steps=3)
    hooks = _step_events.SessionHooks([hook], 0)
    hooks.after(0)  # checked after step 1 (the step before it: 0); next after 3 -> 4
    assert hooks.per_call(1, 8) == 3
    assert per_call(early(run_every_secs=60, run_every_steps=None), 0) == 1
    assert per_call(_Stopping(), 0) == 1
    assert per_call(_BeginEnd(), 0) == 8
    assert per_call(tf.compat.v1.train.StepCounterHook(every_n_steps=2, output_dir=None), 0) == 8
    logging_hook = tf.compat.v1.train.LoggingTensorHook({"s": "global_step"}, every_n_iter=1)
    assert per_call(logging_hook, 0) == 8


class _StopAt(tf.compat.v1.train.SessionRunHook):
    """Fetches nothing; stops in its ``at``-th after_run."""

    def __init__(self, at):
        self.at, self.seen = at, 0

    def after_run(self, run_context, run_values):
        self.seen += 1
        if self.seen == self.at:
            run_context.request_stop()


@pytest.mark.slow
def test_stop_falls_at_its_step_because_calls_end_there(tmp_path, monkeypatch):
    """Negative control: with steps_per_execution 3, a StopAtStepHook(last_step=5) and a hook
    stopping in its 4th after_run stop at steps 5 and 4 only because calls end there; calls of
    3 steps regardless of the hooks (TPUEstimator's once-per-loop check) overshoot to 6."""
    from tpushim import _stock_hooks as _step_events

    x, y = tfcases.data()

    def stopped_at(name, hook):
        estimator = tfcases.convert(
            tmp_path / name,
            patch={"mode": "cpu", "engine": "strategy", "iterations_per_loop": 3, "quiet": True},
        )
        estimator.train(tfcases.dataset_input_fn(x, y, repeat=True), hooks=[hook], steps=20)
        return int(estimator.latest_checkpoint().rsplit("-", 1)[1])

    assert stopped_at("last", tf.compat.v1.train.StopAtStepHook(last_step=5)) == 5
    assert stopped_at("own", _StopAt(4)) == 4
    monkeypatch.setattr(_step_events.SessionHooks, "per_call", lambda self, step, n: n)
    assert stopped_at("last_per_loop", tf.compat.v1.train.StopAtStepHook(last_step=5)) == 6
    assert stopped_at("own_per_loop", _StopAt(4)) == 6


class _StepReader(tf.compat.v1.train.SessionRunHook):
    """Fetches the global step in before_run; records what after_run got."""

    def __init__(self, calls):
        self.calls, self.seen = calls, []

    def begin(self):
        self._step = tf.compat.v1.train.get_global_step()

    def before_run(self, run_context):
        self.calls.append("before_run")
        return tf.compat.v1.train.SessionRunArgs({"step": self._step})

    def after_run(self, run_context, run_values):
        self.seen.append(run_values.results)


def test_hooks_fetches_read_in_one_session_run_per_step():
    """As stock's MonitoredSession: every hook's before_run first, then one session.run reading
    all their fetches (a hook fetching nothing gets None); a hook whose fetches are of another
    graph is still named beside a good one."""
    from tpushim import _stock_hooks as _step_events

    calls = []
    readers = [_StepReader(calls), _StepReader(calls), _StepReader(calls)]
    hooks = _step_events.SessionHooks([*readers, _StopAt(99)], 7)  # step 7's before_run
    hooks.after(7)
    real_run = hooks._session.run

    def run(fetches, *args, **kwargs):
        calls.append("run")
        return real_run(fetches, *args, **kwargs)

    hooks._session.run = run
    try:
        for step in (8, 9):
            calls.clear()
            hooks.before(step)
            assert calls == ["before_run"] * 3 + ["run"]  # before: 3 runs, one per hook
            hooks.after(step)
        assert all(r.seen == [{"step": 7}, {"step": 8}, {"step": 9}] for r in readers)
    finally:
        hooks.close()
    with pytest.raises(tpushim.ConversionError, match="cannot run _Fetching"):
        _step_events.SessionHooks([_StepReader([]), _Fetching()], 0)
