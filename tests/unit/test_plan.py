"""tpushim._plan: the conversion's one frozen plan and the context derived from it (TF-free).
Against TPUEstimator's own _InternalTPUContext on a faked pod: tests/tpuestimator/test_context.py."""

import dataclasses

import pytest

from tpushim import _plan, _settings


def plan(**settings):
    return _plan.ConversionPlan(settings=_settings.Settings(**settings))


def test_the_plan_is_frozen_and_reads_its_settings():
    made = plan(batch_size=20, pod_input="files", iterations_per_loop=7)
    assert (made.batch_size, made.pod_input, made.iterations_per_loop) == (20, "files", 7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.settings = _settings.Settings(batch_size=8)
    bare = _plan.ConversionPlan()
    assert (bare.batch_size, bare.pod_input) == (None, "auto")
    assert bare.iterations_per_loop == _settings.DEFAULT_ITERATIONS_PER_LOOP


@pytest.mark.parametrize(
    "mode,batch,replicas,hosts,padded,per_replica,per_pipeline,per_host",
    [
        (_plan.TRAIN, 20, 16, 2, 32, 2, 2, 16),  # padded: 12 rows weighted 0
        (_plan.TRAIN, 64, 16, 2, 64, 4, 4, 32),
        (_plan.EVAL, 20, 16, 2, 32, 2, 2, 16),
        (_plan.PREDICT, 20, 16, 2, 32, 2, 32, 16),  # one pipeline broadcast on several hosts
        (_plan.PREDICT, 20, 8, 1, 24, 3, 3, 24),
    ],
)
def test_context_numbers(mode, batch, replicas, hosts, padded, per_replica, per_pipeline, per_host):
    context = plan(batch_size=batch).context(mode, replicas, hosts)
    assert context.global_batch() == batch
    assert context.padded_batch() == padded
    assert context.per_replica_batch() == per_replica
    assert context.input_fn_batch() == per_pipeline
    assert context.host_batch() == per_host
    assert context.replicas_per_host == replicas // hosts


def test_the_plans_batch_comes_first_else_the_inputs():
    assert plan(batch_size=8).context(_plan.TRAIN, 8).global_batch(input_batch=32) == 8
    assert plan().context(_plan.TRAIN, 8).padded_batch(input_batch=30) == 32
    assert plan().context(_plan.TRAIN, 8).padded_batch() is None  # nothing known yet


def test_on_cpu_nothing_is_padded():
    context = plan(batch_size=20).context(_plan.TRAIN, on_tpu=False)
    assert (context.padded_batch(), context.per_replica_batch(), context.host_batch()) == (20,) * 3


def test_eval_steps():
    context = plan(batch_size=20).context(_plan.EVAL, 16, 2)
    assert context.eval_steps(100, 5, 20) == 5  # batched by the global batch: its batches
    assert context.eval_steps(100, 4, 32) == 5  # re-batched: ceil(100 / 20)
    assert context.eval_steps(0, 0, 20) == 1


def test_replicas_must_split_over_hosts():
    with pytest.raises(ValueError, match="12 replicas cannot be split over 8 hosts"):
        plan().context(_plan.TRAIN, 12, 8)
