"""The conversion's one frozen plan and the context derived from it (tpushim._plan.RunContext),
against TPUEstimator's own _InternalTPUContext: on a faked pod of 2 hosts x 8 cores, each mode's
hosts, replicas, global batch, per-replica and per-pipeline batch, evaluation steps and loop
iterations are the numbers TPUEstimator builds its TPU graph with. And the settings reach the
running estimator only through its plan: a setting changed after the conversion changes nothing.
"""

import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

import tpushim
from tpushim import _plan

faketpu = tpuestimator_import("tpushim._preflight.faketpu")
_pods = tpuestimator_import("tpushim._pods")

pytestmark = [pytest.mark.slow, pytest.mark.tpuestimator]  # builds TPU graphs

N = 100  # examples: five batches of 20
BATCH = 20  # the global batch set at conversion: 16 cores pad it to 32, 2 rows per core
ITERATIONS = 4


def _input_fn(repeat, seen):
    x, y = tfcases.data(n=N)

    def input_fn(params):
        seen.append(params.get("batch_size"))
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        return (ds.repeat() if repeat else ds).batch(BATCH)

    return input_fn


def _tpuestimator_numbers(estimator, mode):
    """What TPUEstimator's own context of the call that just ran answers for ``mode``."""
    with estimator._ctx.with_mode(mode) as ctx:
        return {
            "hosts": ctx.num_hosts,
            "replicas": ctx.num_replicas,
            "replicas_per_host": ctx.num_of_replicas_per_host,
            "global_batch": ctx.global_batch_size,
            "model_fn_batch": ctx.batch_size_for_model_fn,
            "input_fn_batch": ctx.batch_size_for_input_fn,
            "iterations": estimator.config.tpu_config.iterations_per_loop,
        }


def _context_numbers(context):
    return {
        "hosts": context.hosts,
        "replicas": context.replicas,
        "replicas_per_host": context.replicas_per_host,
        "global_batch": context.padded_batch(),
        "model_fn_batch": context.per_replica_batch(),
        "input_fn_batch": context.input_fn_batch(),
        "iterations": context.iterations_per_loop,
    }


def test_context_of_a_two_host_pod_is_tpuestimators(tmp_path, monkeypatch):
    decided = []
    decide = _pods.decide
    monkeypatch.setattr(
        _pods,
        "decide",
        lambda graph, mode, setting, n: decided.append(setting) or decide(graph, mode, setting, n),
    )
    seen = []
    with faketpu.faked_tpu_system(hosts=2) as tpu:
        patch = tfcases.on_faked_tpu(tpu, ITERATIONS, batch_size=BATCH, pod_input="exact")
        estimator = tfcases.convert(tmp_path, patch=patch)
        plan = estimator._tpushim_plan
        # Settings changed after the conversion (a later scope, the environment) reach neither
        # the plan nor the running estimator.
        monkeypatch.setenv("TPUSHIM_BATCH_SIZE", "48")
        monkeypatch.setenv("TPUSHIM_POD_INPUT", "files")
        with tpushim.patched(batch_size=40, pod_input="files", iterations_per_loop=7):
            builds = {
                _plan.TRAIN: tpu.build(
                    lambda: estimator.train(_input_fn(True, seen), steps=2 * ITERATIONS)
                ),
            }
            numbers = {_plan.TRAIN: _tpuestimator_numbers(estimator, _plan.TRAIN)}
            builds[_plan.EVAL] = tpu.build(lambda: estimator.evaluate(_input_fn(False, seen)))
            numbers[_plan.EVAL] = _tpuestimator_numbers(estimator, _plan.EVAL)
            builds[_plan.PREDICT] = tpu.build(lambda: estimator.predict(_input_fn(False, seen)))
            numbers[_plan.PREDICT] = _tpuestimator_numbers(estimator, _plan.PREDICT)
    assert (plan.batch_size, plan.pod_input, plan.iterations_per_loop) == (20, "exact", 4)
    assert estimator._tpushim_plan is plan
    assert set(seen) == {BATCH} and set(decided) == {"exact"}  # the user's params, the pod path
    for mode, theirs in numbers.items():
        context = plan.context(mode, replicas=tpu.num_cores, hosts=tpu.num_hosts)
        assert _context_numbers(context) == theirs, mode
    train = plan.context(_plan.TRAIN, 16, 2)
    assert (train.padded_batch(), train.per_replica_batch(), train.host_batch()) == (32, 2, 16)
    # Every core is fed the per-replica batch in the graph TPUEstimator built (features, the
    # padding rows' weight, labels).
    rows = train.per_replica_batch()
    assert builds[_plan.TRAIN].infeed_shapes() == [[[rows, 4], [rows], [rows, 1]]] * 16
    # The evaluation steps TPUEstimator runs: the batches of 20 the input holds.
    evaluation = plan.context(_plan.EVAL, 16, 2)
    assert builds[_plan.EVAL].eval_steps == evaluation.eval_steps(N, N // BATCH, BATCH) == 5
    # Predict on several hosts: one pipeline broadcast (sliced) to every core.
    assert numbers[_plan.PREDICT]["input_fn_batch"] == 32 != numbers[_plan.EVAL]["input_fn_batch"]


def test_context_on_cpu_is_tpuestimators(tmp_path):
    """The TPU code path on CPU: one replica, the global batch unpadded."""
    seen = []
    estimator = tfcases.convert(tmp_path, patch={"mode": "cpu", "batch_size": BATCH, "quiet": True})
    with tpushim.patched(batch_size=40, mode="cpu", quiet=True):
        estimator.train(_input_fn(True, seen), steps=1)
    plan = estimator._tpushim_plan
    context = plan.context(_plan.TRAIN, on_tpu=False)
    assert estimator._call_context(_plan.TRAIN) == context
    with estimator._ctx.with_mode(_plan.TRAIN) as ctx:
        assert ctx.is_running_on_cpu()
        assert (ctx.global_batch_size, ctx.batch_size_for_model_fn) == (BATCH, BATCH)
    assert (context.padded_batch(), context.per_replica_batch()) == (BATCH, BATCH)
    assert set(seen) == {BATCH}
    assert tf.train.latest_checkpoint(estimator.model_dir).endswith("model.ckpt-1")
