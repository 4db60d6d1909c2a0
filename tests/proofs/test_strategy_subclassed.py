"""Subclassed Keras models on the strategy engine (tpushim/_strategy/), as stock's
``model_to_estimator`` takes them (``checkpoint_format='saver'``; cloned from their config,
freshly initialised, outputs ``output_1``, ...; a custom ``train_step`` never called): 8
replicas and 1 replica equal the stock estimator within 1e-5, and the user's model keeps its
weights. The devices must be made before TensorFlow initialises, so it all runs in one
subprocess (tests/strategy_subclassed_proof.py).

On 2.12-2.15 against the stock estimator run beside it, on >= 2.16 against stock TensorFlow
2.15's numbers, tests/reference/strategy_subclassed_tf215.json."""

import json
import os

import procs
import pytest

TOLERANCE = 1e-5
KINDS = ("plain", "built", "multi", "stepped", "rows")
ONE = ("plain", "multi", "bn", "rows")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    root = tmp_path_factory.mktemp("subclassed")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return procs.proof(os.path.join(here, "strategy_subclassed_proof.py"), root)


def test_runs_on_eight_replicas_against_stock_215(proof):
    assert proof["replicas"] == 8
    if proof["stock_from"] == "live":
        assert proof["tensorflow"].split(".")[:2] <= ["2", "15"]
    else:
        with open(proof["stock_from"], encoding="utf-8") as f:
            assert json.load(f)["tensorflow"].startswith("2.15.")


def _same(got):
    assert got["names_equal"] and got["metric_keys_equal"], got  # stock's variables, metric keys
    assert got["weights"] < TOLERANCE, got
    assert got["metrics"] < TOLERANCE, got
    assert got["predictions"] < TOLERANCE, got


@pytest.mark.parametrize("kind", KINDS)
def test_eight_replicas_equal_stock(proof, kind):
    """plain: no build of its own, never called; built: called (and its weights moved) before
    conversion, and stock starts from fresh weights all the same; multi: dict features, two
    outputs, dict labels; stepped: a custom train_step, which stock never calls; rows: [batch]
    labels of its [batch, 1] output with a SUM loss (one number for the batch: the rows' mean,
    its output's shape known once the model is called)."""
    _same(proof[kind]["eight"])
    assert proof[kind]["eight"]["rows"] == 45  # every example predicted once, padding dropped


@pytest.mark.parametrize("kind", ONE)
def test_one_replica_equals_stock(proof, kind):
    """bn (BatchNormalization and a branch on the training flag) on full batches, one replica:
    batch moments in training, moving ones in evaluation and prediction, as stock."""
    _same(proof[kind]["one"])


@pytest.mark.parametrize("kind", [*KINDS, "bn"])
def test_the_users_model_is_unchanged(proof, kind):
    assert proof[kind]["user_model_unchanged"]


def test_negative_control_warm_started_from_the_users_weights(proof):
    assert proof["built"]["control"]["weights"] > 1e-3, proof["built"]["control"]


def test_negative_control_batch_labels_read_per_row(proof):
    """rows with its [batch] labels read as [batch, 1]: the SUM loss sums the rows."""
    assert proof["rows"]["control"]["weights"] > 1e-3, proof["rows"]["control"]
