"""Pods on the strategy engine (tpushim/_strategy/input.py): each host's input pipeline, built by
the function TPUStrategy calls once per host with a real ``tf.distribute.InputContext``, on 2 and
4 emulated hosts; the engine training 8 replicas on a faked 2-host pod, every host feeding its
share, and on the files path of 2 and 4 hosts against one board; a model of SparseTensor
inputs on a faked 2-host pod. The proof runs in one subprocess (tests/strategy_pod_proof.py: 8
logical devices). The TPUStrategy-only branches run on
a real ``tf.distribute.TPUStrategy`` for a TPU system faked at a loopback address
(tpushim/_preflight/faketpu.py): which replicas each host feeds, ``host_sum``'s reduce, and (in a
process of its own, its hosts loopback servers) ``distributed_input``'s pod branch.

On every TensorFlow: on 2.12-2.15 against the stock estimator run beside it, on >= 2.16 against
stock TensorFlow 2.15's numbers, tests/reference/strategy_pods_tf215.json (the sparse-input
program's: tests/reference/sparse_program_tf215.json)."""

import json
import os

import procs
import pytest
import tensorflow as tf
import tfcases

from tpushim import _padding, _tfprivate
from tpushim._errors import ConversionError
from tpushim._strategy import input as _strategy_input
from tpushim._strategy import step as _strategy_step

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    root = tmp_path_factory.mktemp("pods")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    """A key passed through to an output and a StringLookup (tpushim/_host_part.py), 8
    replicas on a faked 2-host pod and on one board: weights, evaluate() and predict() equal the
    stock estimator's within 1e-5, every key comes back in its row, and each host's pipeline made
    its own copy of the host layers (train, evaluate, predict: 3 per pipeline)."""
    result = proof["strings"][where]
    assert result["replicas"] == 8 and result["names_equal"], result
    assert max(result["weights"], result["metrics"], result["predictions"]) < TOLERANCE, result
    assert result["keys_equal"] and result["keys"] == 45
    assert result["copies"] == 3 * (2 if where == "pod" else 1)


@pytest.mark.slow
def test_sparse_inputs_train_on_a_faked_pod_as_stock(proof):
    """The sparse-input program (tests/sparse_program.py: CategoryEncoding, a Lambda of sparse
    ops and a Dense on SparseTensor inputs, 27 rows in batches of 8) on 8 replicas of a faked
    2-host pod: each host runs the readers on its own copy of the input and keeps its replicas'
    rows. Pooled over the hosts, each step's rows are one board's batch, each row once, their
    values stock's layers' on its SparseTensors; weights equal stock's within 1e-5, evaluate()
    stock 2.15's. Host 1 feeding host 0's share feeds rows twice and moves the weights."""
    result = proof["sparse"]
    assert result["fed_as_one_board"] and result["fed_rows"] == list(range(27)), result
    assert result["weights_compared"] == 6 and result["weights"] < TOLERANCE, result
    assert max(result["metrics"].values()) < TOLERANCE, result
    assert result["control_fed_as_one_board"] is False  # the negative control
    assert result["control_weights"] > 1e-3, result


@pytest.mark.slow
def test_training_on_one_board_follows_stocks_seeded_shuffle(proof):
    """One input pipeline, the same shuffled input seeded by tf_random_seed: the engine builds it
    as stock does (a graph of its own, stock's op seeds), so its batches, and so its weights,
    evaluate() and predict(), are stock's (built eagerly, the shuffle's order was not)."""
    board = proof["training"]["board"]
    assert board["names_equal"]
    assert max(board["weights"], board["metrics"], board["predictions"]) < TOLERANCE, board


@pytest.mark.slow
@pytest.mark.parametrize("hosts", ["2", "4"])
def test_training_on_the_files_path_equals_one_board(proof, hosts):
    """8 replicas, each host reading only its own files (shuffled, endless, list_files), every
    step a whole epoch of them: weights equal one board's (the same model, files and seed on one
    input pipeline) within 1e-5, each replica's loss divided by the global batch's rows."""
    result = proof["files_training"][hosts]
    assert result["paths"] == ["files path"]
    assert result["pod"]["names_equal"]
    assert result["pod"]["weights"] < TOLERANCE, result


@pytest.mark.slow
@pytest.mark.parametrize("hosts", ["2", "4"])
def test_negative_control_files_path_rows_counted_per_host(proof, hosts):
    """The same training with each host's rows counted as its own batch's (the global count left
    out of the files path: every host's gradient hosts x one board's) must differ from one
    board's."""
    result = proof["files_training"][hosts]
    assert result["control_paths"] == ["files path"]
    assert result["control"]["weights"] > 1e-2, result


# --- on a real TPUStrategy, for a TPU system faked at a loopback address -----------------------


def _tpu_strategy(hosts, cores, order=None):
    """A ``tf.distribute.TPUStrategy`` for a faked TPU system of ``hosts`` x ``cores``
    (tpushim/_preflight/faketpu.py answers TensorFlow's TPU system query: no TPU, no network);
    ``order``: the system's cores in replica order (a DeviceAssignment), else TensorFlow's."""
    from tpushim._preflight import faketpu

    with faketpu.faked_tpu_system(hosts=hosts, cores_per_host=cores) as fake:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(fake.master)
        assignment = None
        if order is not None:
            topology = faketpu.topology(hosts, cores)
            coordinates = topology.device_coordinates.reshape(hosts * cores, -1)
            assignment = tf.tpu.experimental.DeviceAssignment(
                topology, coordinates[list(order)][:, None, :]
            )
        return tf.distribute.TPUStrategy(resolver, experimental_device_assignment=assignment)


_FETCHED = tf.distribute.InputOptions(experimental_fetch_to_device=True)


@pytest.mark.parametrize(
    "hosts, cores, order, feeds",
    [
        (2, 4, None, ((0, 1, 2, 3), (4, 5, 6, 7))),
        (4, 2, None, ((0, 1), (2, 3), (4, 5), (6, 7))),
        # replica r on host r % 2: each host feeds the replicas on its cores, not a block
        (2, 4, (0, 4, 1, 5, 2, 6, 3, 7), ((0, 2, 4, 6), (1, 3, 5, 7))),
    ],
)
def test_on_a_tpu_strategy_each_host_feeds_the_replicas_on_its_cores(hosts, cores, order, feeds):
    strategy = _tpu_strategy(hosts, cores, order)
    assert strategy.num_replicas_in_sync == 8 and strategy.extended.num_hosts == hosts
    assert _tfprivate.data.input_replicas(strategy, _FETCHED) == feeds  # TensorFlow's worker lists
    assert _strategy_input.input_feeds(strategy, _FETCHED) == feeds


def test_on_a_tpu_strategy_without_tfs_worker_lists_each_host_feeds_a_block(monkeypatch):
    """Where a TensorFlow keeps no worker lists (``input_replicas`` says None), host h feeds the
    h-th block of replicas, as TensorFlow's own device order lays a pod out."""
    strategy = _tpu_strategy(4, 2)
    monkeypatch.setattr(_tfprivate.data, "input_replicas", lambda strategy, options: None)
    assert _strategy_input.input_feeds(strategy, _FETCHED) == ((0, 1), (2, 3), (4, 5), (6, 7))


def test_host_sum_on_a_tpu_strategy_is_its_reduce():
    """TPUStrategy's ``reduce`` of per-replica values (outside a step, on the host's CPU): their
    sum, as on any other strategy."""
    strategy = _tpu_strategy(2, 4)
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant([1.0, 10.0]) * float(ctx.replica_id_in_sync_group + 1)
    )
    assert _strategy_step.host_sum(strategy, values).numpy().tolist() == [36.0, 360.0]


@pytest.fixture(scope="module")
def tpu_strategy_pods(tmp_path_factory):
    """tests/strategy_pod_proof.py --tpu-strategy: a process of its own (it connects to a
    cluster of loopback servers, the faked hosts, for good)."""
    root = tmp_path_factory.mktemp("tpu_strategy_pods")
    script = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "strategy_pod_proof.py"
    )
    result = procs.python([script, "--tpu-strategy", root])
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, result.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.slow
@pytest.mark.parametrize("hosts", [2, 4])
def test_on_a_tpu_strategy_each_host_builds_its_own_pipeline(tpu_strategy_pods, hosts):
    """distributed_input on a real TPUStrategy of 2 and 4 hosts (its hosts loopback servers):
    TPUStrategy calls the dataset function once per host with that host's InputContext (after
    one call of tpushim's own, host 0's, for the spec), on the files path, each of its 8
    replicas fed 2 rows of a global batch of 16; the input's end is each host's own (steps
    unknown)."""
    result = tpu_strategy_pods[str(hosts)]
    assert result["strategy"].startswith("TPUStrategy")
    assert result["calls"] == sorted([[hosts, 0]] + [[hosts, h] for h in range(hosts)])
    assert result["paths"] == ["files"]
    assert result["spec_rows"] == [2] and result["steps"] is None
    assert result["replica_label_specs"] == [[2]] * 8


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
