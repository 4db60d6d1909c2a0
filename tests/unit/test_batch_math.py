"""The batch arithmetic (tpushim/_batch_math.py, issue 33 item 6): pure Python, checked against
the definitions it replaces (``math.ceil``, a Dataset's batches counted by hand)."""

import math

import pytest

from tpushim import _batch_math

SIZES = [(1, 8), (7, 8), (8, 8), (9, 8), (100, 8), (104, 8), (12, 5), (3, 2048), (2048, 2048)]


@pytest.mark.parametrize("a,b", SIZES)
def test_ceil_div_is_the_rounded_up_quotient(a, b):
    assert _batch_math.ceil_div(a, b) == math.ceil(a / b)


def test_ceil_div_is_exact_beyond_float_precision():
    # A negative control for math.ceil(a / b), which the float quotient makes wrong here.
    a, b = 2**60 + 1, 2
    assert _batch_math.ceil_div(a, b) == 2**59 + 1
    assert math.ceil(a / b) != 2**59 + 1


@pytest.mark.parametrize("size,shards", SIZES)
def test_padded_batch_is_the_next_multiple_of_the_shards(size, shards):
    padded = _batch_math.padded_batch(size, shards)
    assert padded % shards == 0 and size <= padded < size + shards
    assert (padded == size) == (size % shards == 0)  # nothing padded where the cores divide it


@pytest.mark.parametrize("shards", [0, None])
def test_padded_batch_without_shards_is_the_batch(shards):
    assert _batch_math.padded_batch(100, shards) == 100


def test_per_shard_rows():
    assert _batch_math.per_shard(100, 8) == 13  # 104 rows padded, 13 per core
    assert _batch_math.per_shard(64, 8) == 8
    assert _batch_math.per_shard(3, 8) == 1


@pytest.mark.parametrize("rows", [0, 1, 7, 8, 9, 52, 64])
@pytest.mark.parametrize("size", [1, 8, 13])
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_batches_of_counts_what_batch_makes(rows, size, drop_remainder):
    made = [min(size, rows - start) for start in range(0, rows, size)]
    if drop_remainder:
        made = [b for b in made if b == size]
    assert _batch_math.batches_of(rows, size, drop_remainder) == len(made)


def test_eval_batches_held():
    # Batched by the global batch: the input's own batches (52 rows by 8: 7, the last short).
    assert _batch_math.eval_batches_held(52, 7, 8, 8) == 7
    # Batched by another size (or undeclared): re-batched, ceil(52 / 16) = 4.
    assert _batch_math.eval_batches_held(52, 13, 4, 16) == 4
    assert _batch_math.eval_batches_held(52, None, None, 16) == 4
    # An empty input still runs one (all-padding) step, as a TPU cannot run none.
    assert _batch_math.eval_batches_held(0, 0, 8, 8) == 1


def test_indivisible_batch_text():
    problem, fix = _batch_math.indivisible_batch(100, 8)
    assert "global batch size 100 does not divide among 8 TPU cores" in problem
    assert "padded to 104 rows" in problem and "4 of 104" in problem
    assert "(96 or 104)" in fix
    assert _batch_math.batch_choices(3, 8) == "8"  # no 0-row batch offered


def test_a_runconfig_strategy_said_with_its_batch_arithmetic():
    import types

    from tpushim import _batch_math

    config = types.SimpleNamespace(
        train_distribute=types.SimpleNamespace(num_replicas_in_sync=4), eval_distribute=None
    )
    (key, name, replicas), *rest = _batch_math.distribute_strategies(config)
    assert (key, name, replicas, rest) == ("train_distribute", "SimpleNamespace", 4, [])
    assert _batch_math.distribute_strategies(None) == []
    problem, fix = _batch_math.distributed_batch("train_distribute", "MirroredStrategy", 4, 8)
    assert "reads N x the input_fn's batch (4 x its batch here)" in problem
    assert "split over the 8 TPU cores" in problem
    assert "return N x its batch" in fix and "8 x its batch" in fix
    problem, fix = _batch_math.distributed_batch("eval_distribute", "MirroredStrategy", 1)
    assert "here)" not in problem and "the TPU's cores" in problem
    assert "leave eval_distribute out of RunConfig" in fix
