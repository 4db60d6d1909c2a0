"""The user's hooks, saving listeners, ``train_and_evaluate`` and the TensorBoard events on the JAX
engine (8 XLA CPU devices, 4 steps per compiled call) against stock's own estimator on this
TensorFlow, in one subprocess (tests/jax_hooks_proof.py): hooks as legacy scripts write them (a
StopAtStepHook, a LoggingTensorHook on the loss, a hand-written hook recording its calls and the
loss it fetched) called at stock's steps with stock's values, a listener's saves at stock's steps,
the step-rate lines, model_dir's and model_dir/eval's events with stock's tags and steps and
values within 1e-5, stock's weights, metrics and predictions; and the refusals, before anything
is written: a hook fetching a weight (named); train_and_evaluate with an exporter exports.
"""

import os

import numpy as np
import procs
import pytest
from jax_scripts import JAX_TESTS, ROOT, scripts_started  # noqa: F401

pytestmark = JAX_TESTS

TOL = 1e-5


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    root = tmp_path_factory.mktemp("jax_hooks")
    return procs.proof(os.path.join(ROOT, "tests", "jax_hooks_proof.py"), root, timeout=600)


def _close(a, b):
    return len(a) == len(b) and np.allclose(np.asarray(a, float), np.asarray(b, float), TOL, TOL)


def _same_events(got, want):
    """Event by event: the same kind, tag and step, a value within 1e-5 (global_step/sec: a
    rate, compared by its presence only)."""
    assert [e[:3] for e in got] == [e[:3] for e in want]
    for g, w in zip(got, want):
        if w[3] is not None and w[1] != "global_step/sec":
            assert abs(g[3] - w[3]) <= TOL * max(1.0, abs(w[3])), (g, w)


def test_train_hooks_and_listener_at_stocks_steps(proof):
    stock, jax = proof["stock"]["train"], proof["jax"]["train"]
    # StopAtStepHook(last_step=7) stops at 7 (calls of 4 steps end there, as stock's steps)
    assert jax["step"] == stock["step"] == 7
    assert jax["calls"] == stock["calls"]  # begin, after_create_session, before/after_run, end
    assert jax["calls"].count("after_run") == 7
    assert _close(jax["losses"], stock["losses"])  # each step's loss the hook fetched
    assert jax["listener"] == stock["listener"]  # saves at 0, 3, 6, 7
    assert [c for c in jax["listener"] if c[0] == "after_save"] == [
        ["after_save", s] for s in (0, 3, 6, 7)
    ]
    assert _close(jax["user_lines"], stock["user_lines"])  # LoggingTensorHook on loss/mul:0
    assert jax["rate_lines"] == stock["rate_lines"] > 0  # global_step/sec: ...
    assert sorted(jax["weights"]) == sorted(stock["weights"]) and jax["weights"]
    for name, want in stock["weights"].items():
        assert _close(np.ravel(jax["weights"][name]), np.ravel(want)), name


def test_training_events_as_stocks(proof):
    stock, jax = proof["stock"]["train"], proof["jax"]["train"]
    _same_events(jax["events"], stock["events"])
    tags = {e[1] for e in stock["events"] if e[0] == "summary"}
    assert {"loss_1", "global_step/sec"} <= tags
    assert jax["graph_pbtxt"] and stock["graph_pbtxt"]
    # Negative control: another run's events (train_and_evaluate's) are told apart.
    with pytest.raises(AssertionError):
        _same_events(jax["events"], proof["stock"]["train_and_evaluate"]["events"])


def test_evaluate_and_predict_hooks_as_stocks(proof):
    stock, jax = proof["stock"]["evaluate"], proof["jax"]["evaluate"]
    assert jax["calls"] == stock["calls"]  # the hook stopped it after 4 batches
    assert jax["calls"].count("after_run") == 4
    assert _close(jax["losses"], stock["losses"])
    assert _close(jax["user_lines"], stock["user_lines"])
    assert sorted(jax["results"]) == sorted(stock["results"])
    for key, want in stock["results"].items():
        assert abs(jax["results"][key] - want) <= TOL * max(1.0, abs(want)), key
    _same_events(jax["events"], stock["events"])  # model_dir/eval: metrics at step 7
    stock, jax = proof["stock"]["predict"], proof["jax"]["predict"]
    assert jax["calls"] == stock["calls"]
    assert jax["count"] == stock["count"] == 32  # two batches of 16, then the hook's stop
    assert _close(jax["last"], stock["last"])


def test_train_and_evaluate_as_stocks(proof):
    stock, jax = proof["stock"]["train_and_evaluate"], proof["jax"]["train_and_evaluate"]
    assert sorted(jax["result"]) == sorted(stock["result"])
    for key, want in stock["result"].items():
        assert abs(jax["result"][key] - want) <= TOL * max(1.0, abs(want)), key
    assert jax["result"]["global_step"] == 9
    assert jax["exports"] == stock["exports"] == []
    assert jax["train_calls"] == stock["train_calls"] == 9
    assert jax["eval_calls"] == stock["eval_calls"]  # evaluations at 4, 8 and 9: 2 steps each
    assert jax["eval_calls"].count("begin") == 3
    assert _close(jax["eval_losses"], stock["eval_losses"])
    for name, want in stock["weights"].items():
        assert _close(np.ravel(jax["weights"][name]), np.ravel(want)), name
    _same_events(jax["events"], stock["events"])
    _same_events(jax["eval_events"], stock["eval_events"])


def test_refused_before_anything_is_written(proof):
    refused = proof["jax"]["refused"]
    message, before, after = refused["weight"]
    assert message.startswith("tpushim's JAX engine cannot run LoggingTensorHook")
    assert "'hidden/kernel:0'" in message and "'loss/mul:0'" in message
    assert after == before
    # then train_and_evaluate with an exporter: one SavedModel, exported at its evaluation
    (exported,) = refused["exporter"]
    assert "saved_model.pb" in exported and "variables" in exported, exported
