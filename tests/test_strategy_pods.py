"""Pods on the strategy engine (tpushim/_strategy_input.py): each host's input pipeline, built by
the function TPUStrategy calls once per host with a real ``tf.distribute.InputContext``, on 2 and
4 emulated hosts; and the engine training 8 replicas on a faked 2-host pod, every host feeding
its share. The proof runs in one subprocess (tests/strategy_pod_proof.py: 8 logical devices).

On every TensorFlow: on 2.12-2.15 against the stock estimator run beside it, on >= 2.16 against
stock TensorFlow 2.15's numbers, tests/reference/strategy_pods_tf215.json."""

import os

import procs
import pytest
import tensorflow as tf
import tfcases

from tpushim import _padding, _strategy_input
from tpushim._errors import ConversionError

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    root = tmp_path_factory.mktemp("pods")
    here = os.path.dirname(os.path.abspath(__file__))
    return procs.proof(os.path.join(here, "strategy_pod_proof.py"), root)


SEEDED = ["no shuffle 1", "shuffle 1", "list_files 3"]
UNSEEDED = ["shuffle None", "list_files None"]


@pytest.mark.slow
@pytest.mark.parametrize("hosts", [2, 4])
@pytest.mark.parametrize("case", SEEDED + UNSEEDED)
def test_exact_path_every_global_batch_is_one_boards(proof, hosts, case):
    """Every host runs the whole pipeline (its copy seeded as every other's) and keeps its
    replicas' pieces: every example once per epoch, each step 12 real rows (padded to 16), and,
    seeded, each replica's rows those one board gives it. Host 1 feeding host 0's share fails, and
    so do copies each seeded with a seed of its own."""
    result = proof["exact"][f"{hosts} {case}"]
    assert result["path"] == "exact"
    assert result["every_once"] and result["real_rows"] == [12]
    if case in SEEDED:
        assert result["equals_one_board"] is True
        assert result["control_equals_one_board"] is False  # the negative control
    else:
        assert result["control_every_once"] is False  # the negative control
        assert result["unpinned_every_once"] is False  # copies seeded apart disagree


@pytest.mark.slow
@pytest.mark.parametrize("hosts", [2, 4])
def test_exact_path_evaluates_every_example_once(proof, hosts):
    """list_files (shuffled file names, unseeded), 70 examples in batches of 12: the last partial."""
    result = proof["exact"][f"{hosts} evaluate"]
    assert result["path"] == "exact" and result["every_once"]
    assert result["real_rows"] == [12, 12, 12, 12, 12, 10]


@pytest.mark.slow
@pytest.mark.parametrize("hosts", ["2", "4"])
def test_files_path_each_host_reads_only_its_own_files(proof, hosts):
    """Shuffled, endless input from files: each host reads whole files of its own share
    (assigned by size), none on two hosts, every example once per global epoch, about one record
    parsed per record fed (the exact path parses every record on every host). Host 1 reading
    host 0's files fails."""
    result = proof["files"][hosts]
    assert result["path"] == "files"
    assert result["whole_files"] and all(result["reads_its_share"])
    assert result["files_on_two_hosts"] == 0
    assert result["every_once_per_epoch"] and result["real_rows"] == [16]
    assert result["parsed_per_fed_files"] <= 1.05
    assert result["parsed_per_fed_exact"] >= int(hosts) - 0.05
    assert result["control_files_on_two_hosts"] > 0  # the negative control
    assert not result["control_every_once_per_epoch"]


@pytest.mark.slow
def test_training_on_a_faked_pod_equals_stock(proof):
    """8 replicas, 2 hosts each feeding its share of a shuffled, seeded input: weights, evaluate()
    and predict() equal the stock estimator's within 1e-5; host 1 feeding host 0's share does not."""
    result = proof["training"]
    assert result["replicas"] == 8
    pod = result["pod"]
    assert pod["names_equal"]
    assert max(pod["weights"], pod["metrics"], pod["predictions"]) < TOLERANCE, pod
    assert result["control"]["weights"] > 1e-3  # the negative control


@pytest.mark.slow
@pytest.mark.parametrize("where", ["pod", "board"])
def test_strings_and_lookups_run_on_each_host_as_stock(proof, where):
    """A key passed through to an output and a StringLookup (tpushim/_strategy_host.py), 8
    replicas on a faked 2-host pod and on one board: weights, evaluate() and predict() equal the
    stock estimator's within 1e-5, every key comes back in its row, and each host's pipeline made
    its own copy of the host layers (train, evaluate, predict: 3 per pipeline)."""
    result = proof["strings"][where]
    assert result["replicas"] == 8 and result["names_equal"], result
    assert max(result["weights"], result["metrics"], result["predictions"]) < TOLERANCE, result
    assert result["keys_equal"] and result["keys"] == 45
    assert result["copies"] == 3 * (2 if where == "pod" else 1)


@pytest.mark.slow
def test_training_on_one_board_follows_stocks_seeded_shuffle(proof):
    """One input pipeline, the same shuffled input seeded by tf_random_seed: the engine builds it
    as stock does (a graph of its own, stock's op seeds), so its batches, and so its weights,
    evaluate() and predict(), are stock's (built eagerly, the shuffle's order was not)."""
    board = proof["training"]["board"]
    assert board["names_equal"]
    assert max(board["weights"], board["metrics"], board["predictions"]) < TOLERANCE, board


# --- fast: what the engine refuses on a pod ---------------------------------------------------------


class _Config:
    tf_random_seed = None
    session_config = None


def test_tensors_input_on_a_pod_names_the_dataset_it_needs():
    def input_fn():
        return {"x": tf.zeros([4, 2])}, tf.zeros([4, 1])

    with pytest.raises(ConversionError, match="each host runs its own input pipeline"):
        _strategy_input.HostInput(input_fn, "train", _Config(), None, ((0, 1), (2, 3)), "auto")


def test_replicas_split_evenly_over_hosts():
    assert _strategy_input._blocks(8, 2) == ((0, 1, 2, 3), (4, 5, 6, 7))
    with pytest.raises(ConversionError, match="8 replicas cannot be split evenly over 3 hosts"):
        _strategy_input._blocks(8, 3)


def test_files_path_where_a_host_would_feed_only_padding_takes_the_exact_path(
    tmp_path, tpushim_log
):
    """A global batch of 10 on 8 replicas (2 rows each, the last 3 replicas padding only): on 4
    hosts host 3's replicas hold no real row, so reading its own files it would feed nothing. The
    exact path is taken, said in the line, and every host's copy reads every file again."""
    paths = []
    for k in range(8):
        paths.append(str(tmp_path / f"part-{k}.tfrecord"))
        with tf.io.TFRecordWriter(paths[-1]) as writer:
            for i in range(5 * k, 5 * k + 5):
                writer.write(str(i).encode())

    def input_fn():
        return (
            tf.data.Dataset.list_files(str(tmp_path / "*.tfrecord"))
            .interleave(tf.data.TFRecordDataset)
            .map(lambda r: (tf.strings.to_number(r)[None], tf.zeros([1])))
            .repeat()
            .batch(10)
        )

    feeds = _strategy_input._blocks(8, 4)
    pod = _strategy_input.HostInput(input_fn, "train", _Config(), None, feeds, "auto")
    assert pod.path.name == "exact" and pod.path.fallback
    assert "a host would feed padding only: the exact path instead" in tpushim_log.text
    fed = []
    for h in range(4):
        host = pod(tf.distribute.InputContext(4, h, 8)).take(2 * 4)  # 4 steps
        fed += [
            float(x)
            for element in host
            for x, w in zip(
                element[0][_padding.FEATURES_KEY][:, 0].numpy(),
                element[0][_padding.PADDING_KEY].numpy(),
            )
            if w > 0
        ]
    assert sorted(fed) == list(range(40))


@pytest.mark.parametrize("pod_input", ["auto", "exact", "files"])
def test_pod_input_setting_reaches_the_strategy_engine(tmp_path, pod_input):
    """The setting TPUEstimator's pods read (``patch(pod_input=)``) is the strategy engine's too."""
    patch = {"mode": "cpu", "engine": "strategy", "quiet": True, "pod_input": pod_input}
    estimator = tfcases.convert(tmp_path, patch=patch)
    assert estimator._tpushim_plan.pod_input == pod_input
