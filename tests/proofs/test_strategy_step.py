"""The strategy engine's training step costs no more rendezvous than a hand-written Keras
``fit``'s under the same strategy, and reads its input as fit does where TensorFlow knows the
input's length (issue 33): tests/strategy_step_proof.py, run in a process of its own (8 logical
CPU devices), on every TensorFlow."""

import os

import numpy as np
import procs
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    root = tmp_path_factory.mktemp("step")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return procs.proof(os.path.join(here, "strategy_step_proof.py"), root)


def test_runs_on_eight_replicas(proof):
    assert proof["replicas"] == 8


def test_no_more_all_reduces_a_step_than_keras_fit(proof):
    counts = proof["collectives"]
    assert counts["keras"] > 0  # the gradients' (the count is found at all)
    assert counts["engine"] <= counts["keras"]


def test_negative_control_rows_counted_by_an_all_reduce(proof):
    counts = proof["collectives"]
    assert counts["control"] > counts["keras"]


def test_asks_whether_a_batch_is_left_only_where_the_length_is_unknown(proof):
    assert proof["reads"] == {"repeated": False, "finite": False, "unknown": True}


@pytest.mark.parametrize("steps", ["None", "5"])
def test_a_known_end_trains_as_the_asking_read(proof, steps):
    known, asked = proof["ends"][f"finite-{steps}"], proof["ends"][f"unknown-{steps}"]
    # 20 rows by 8: three steps, then stock's last before_run meets the end of the input.
    assert known["step"] == asked["step"] == 3
    assert known["calls"] == asked["calls"]
    assert known["calls"][-2:] == ["before_run", "end"]
    assert known["calls"].count("after_run") == 3
    assert known["weights"].keys() == asked["weights"].keys()
    for name in known["weights"]:
        np.testing.assert_allclose(known["weights"][name], asked["weights"][name], atol=1e-6)
