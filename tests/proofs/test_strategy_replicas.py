"""Rung 2b for the strategy engine (tpushim/_strategy/): 8 replicas on 8 logical CPU devices
equal 1 replica and the stock estimator, for a mean, a SUM and a custom one-number loss, sample
weights, a masked output and losses layers add from their inputs, with an indivisible global
batch and a short last batch, and activity regularizers beside (Sync)BatchNormalization on full
batches; negative controls fail; stock's estimator reads
the engine's checkpoints; the step is compiled with XLA; every legacy input_fn style trains as
stock's. The devices must be made before TensorFlow initialises, so it all runs in one
subprocess (tests/strategy_proof.py).

On every TensorFlow: on 2.12-2.15 against the stock estimator run beside it, on >= 2.16 (no
stock estimator) against stock TensorFlow 2.15's numbers, tests/reference/strategy_tf215.json."""

import json
import os

import procs
import pytest

TOLERANCE = 1e-5
KINDS = ("mean", "sum", "custom", "weighted", "masked", "activity", "synced")
GLOBAL = ("weighted", "masked", "activity", "synced")  # a replica's share: the global counts
# Activity regularizers beside SyncBatchNormalization ("synced", above: 8 replicas and 1) and
# BatchNormalization, whose moments are a replica's own rows' (stock's on 1 replica), in full
# global batches of 16.
ONE_REPLICA = ("normalized",)
# [batch] labels for the [batch, 1] output: a SUM loss, and a per-example loss with sample weights.
ROW_LABELS = ("row_sum", "row_weighted")
STYLES = ("tensors", "one_shot", "queue", "numpy")


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    root = tmp_path_factory.mktemp("strategy")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return procs.proof(os.path.join(here, "strategy_proof.py"), root)


pytestmark = pytest.mark.slow


def test_runs_on_eight_replicas(proof):
    assert proof["replicas"] == 8


def test_stock_is_stock_tensorflow_215(proof):
    if proof["stock_from"] == "live":  # the stock estimator beside the engine
        assert proof["tensorflow"].split(".")[:2] <= ["2", "15"]
    else:
        with open(proof["stock_from"], encoding="utf-8") as f:
            assert json.load(f)["tensorflow"].startswith("2.15.")


@pytest.mark.parametrize(
    "kind,replicas",
    [(k, r) for k in (*KINDS, *ROW_LABELS) for r in ("eight", "one")]
    + [(k, "one") for k in ONE_REPLICA],
)
def test_engine_equals_stock(proof, kind, replicas):
    got = proof[kind][replicas]
    assert got["names_equal"] and got["metric_keys_equal"]  # stock's checkpoint names, metric keys
    # every example predicted once, padding dropped
    assert got["rows"] == (48 if kind in ("synced", *ONE_REPLICA) else 45)
    assert got["weights"] < TOLERANCE, got  # every weight and optimizer slot
    assert got["metrics"] < TOLERANCE, got
    assert got["predictions"] < TOLERANCE, got


@pytest.mark.parametrize("kind", KINDS)
def test_stock_reads_the_engine_checkpoints(proof, kind):
    assert proof[kind]["stock_reads_engine"] < TOLERANCE


@pytest.mark.parametrize("kind", KINDS)
def test_negative_control_gradients_combined_wrongly(proof, kind):
    # mean and custom: each replica's own mean, summed; SUM: the replicas' sums averaged.
    assert proof[kind]["control"]["weights"] > 1e-3, proof[kind]["control"]


@pytest.mark.parametrize("kind", GLOBAL)
def test_negative_control_each_replica_its_own_loss(proof, kind):
    # Each replica's loss normalised by its own rows, weights or unmasked elements (no sum over
    # the replicas): the padded replicas then weigh as much as the full ones.
    assert proof[kind]["local"]["weights"] > 1e-3, proof[kind]["local"]


@pytest.mark.parametrize("kind", ONE_REPLICA)
def test_negative_control_input_losses_from_each_row_run_alone(proof, kind):
    # Each activity regularizer's loss from the model run on each row alone (as the engine took
    # input losses before): BatchNormalization then normalises by that one row.
    assert proof[kind]["per_row"]["weights"] > 1e-3, proof[kind]["per_row"]


def test_negative_control_input_losses_counted_on_padding_rows(proof):
    # The input losses' per-row values summed over every row of the padded batch.
    assert proof["activity"]["unmasked"]["weights"] > 1e-3, proof["activity"]["unmasked"]


def test_step_is_compiled_with_xla(proof):
    error = proof["xla_error"]
    assert error is not None, "a model with a host-only op trained: the step was not XLA-compiled"
    assert "XLA" in error or "compil" in error, error


@pytest.mark.parametrize("style", STYLES)
def test_every_input_fn_style_on_eight_replicas(proof, style):
    """(features, labels) tensors, a one-shot iterator's, a queue's, numpy_input_fn's: unchanged,
    on 8 replicas, trained as stock trains on them (the weights and slots after STEPS steps)."""
    got = proof["inputs"][style]
    assert got["names_equal"]  # stock's checkpoint names
    assert got["weights"] < TOLERANCE, got  # every weight and optimizer slot


def test_a_graph_mode_program_on_eight_replicas(proof):
    """A program in graph mode (as ``disable_v2_behavior()`` makes it; #33): its model built and
    its calls made in its own graph, trained, evaluated and predicted on 8 replicas on the
    engine's eager runtime: stock's weights and slots, metrics and predictions."""
    got = proof["graph"]
    assert got["names_equal"] and got["metric_keys_equal"] and got["rows"] == 45, got
    assert got["weights"] < TOLERANCE, got
    assert got["metrics"] < TOLERANCE, got
    assert got["predictions"] < TOLERANCE, got
