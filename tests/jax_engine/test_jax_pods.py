"""The JAX engine on a pod (tpushim/_jax/_pod.py), proven on CPU: 2 processes started here, joined
by ``jax.distributed`` on a loopback coordinator (gloo's CPU collectives), 4 XLA CPU devices each,
every process reading its own share of the input; against one process with 8 devices (one
board) and the stock estimator (tpushim's estimator API: stock 2.15's numbers). The processes run
tests/jax_pod_proof.py; negative controls (a process feeding another's share, every process
reading the whole input) must fail. Only loopback addresses: the coordinator binds 127.0.0.1.
"""

import itertools
import json
import os
import socket
import subprocess
import sys

import numpy as np
import procs
import pytest
import sparse_program
from jax_scripts import JAX_TESTS, ROOT

pytestmark = JAX_TESTS
TOL = 1e-5
PROOF = os.path.join(ROOT, "tests", "jax_pod_proof.py")
#: Seconds on a quiet machine each group of processes may take (stretched by the load).
TIMEOUT = 240
PROCESSES = 2


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(role, root, env):
    env = procs.env_without_tpu(
        PYTHONPATH=ROOT, TPUSHIM_MODE="cpu", TPUSHIM_ENGINE="jax", TPUSHIM_QUIET="1", **env
    )
    return subprocess.Popen(
        [sys.executable, PROOF, role, str(root)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait(processes):
    timeout = procs.scaled(TIMEOUT)
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in processes]
    finally:
        for p in processes:  # one that hangs (its peer died) is ended here
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, out in zip(processes, outputs):
        assert p.returncode == 0, out[-4000:]


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    root = tmp_path_factory.mktemp("jaxpod")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    workers = [
        _start(
            "worker",
            root,
            {
                "XLA_FLAGS": f"--xla_force_host_platform_device_count={8 // PROCESSES}",
                "JAX_COORDINATOR_ADDRESS": address,
                "JAX_COORDINATOR_BIND_ADDRESS": address,  # never every interface
                "JAX_NUM_PROCESSES": str(PROCESSES),
                "JAX_PROCESS_ID": str(i),
            },
        )
        for i in range(PROCESSES)
    ]
    _wait(workers)
    _wait([_start("board", root, {}), _start("stock", root, {})])

    def read(name):
        with open(root / name, encoding="utf-8") as f:
            return json.load(f)

    return {
        "workers": [read(f"worker-{i}.json") for i in range(PROCESSES)],
        "board": read("board.json"),
        "stock": read("stock.json"),
    }


def _flat(lists):
    return list(itertools.chain.from_iterable(lists))


def _pooled(proof, case):
    """Every global batch's real rows, the processes' shares in process order."""
    shares = [w["shares"][case]["steps"] for w in proof["workers"]]
    return [_flat(parts) for parts in zip(*shares)]


def _diff(a, b):
    assert sorted(a["weights"]) == sorted(b["weights"])
    return max(
        float(np.max(np.abs(np.subtract(a["weights"][k], b["weights"][k])))) for k in a["weights"]
    )


def test_the_processes_form_one_pod_of_8_devices(proof):
    assert [w["pod"] for w in proof["workers"]] == [[i, PROCESSES, 8] for i in range(PROCESSES)]


@pytest.mark.parametrize("case", ["shuffle 5", "list_files 5"])
def test_exact_path_every_global_batch_is_one_boards(proof, case):
    """Every process runs the whole pipeline (seeded alike) and feeds its rows of each global
    batch: pooled over the processes, each step's examples are one board's, in its order (a short
    last batch's padding left out)."""
    assert _pooled(proof, case) == proof["board"]["batches"][case]


def test_exact_path_unseeded_every_example_once(proof):
    """No tf_random_seed: process 0 draws the seed and every process shuffles with it."""
    pooled = _pooled(proof, "shuffle None")
    assert [len(b) for b in pooled] == [16, 16, 16, 12]
    assert sorted(_flat(pooled)) == list(range(60))


def test_exact_path_numpy_input_fn_queue_is_one_boards(proof):
    """A shuffled numpy_input_fn (was refused on a pod): each process reads its queue's rows in
    stock's order from process 0's start row (each process drew its own), pooled one board's;
    every process starting at the row it drew (the control) is not."""
    board = proof["board"]["batches"]["numpy 5"]
    assert sorted(_flat(board)) == list(range(60)) and len(board) == 4
    assert _pooled(proof, "numpy 5") == board
    assert _pooled(proof, "control own_starts numpy 5") != board


def test_queue_input_fns_on_the_pod_every_example_once_pooled_one_boards(proof):
    """``tf.compat.v1.train.batch`` / ``shuffle_batch`` queues (refused on a pod before): process 0
    reads them as one board does and hands each process every global batch, each feeding its rows:
    pooled, the FIFO queue's batches are one board's, and the shuffled queue's every example once;
    process 1 feeding process 0's rows (the control) feeds some twice and others never."""
    board = proof["board"]["batches"]["queue batch 5"]
    assert [len(b) for b in board] == [16, 16, 16, 12] and _flat(board) == list(range(60))
    assert _pooled(proof, "queue batch 5") == board
    shuffled = _pooled(proof, "queue shuffle_batch 5")
    assert [len(b) for b in shuffled] == [16, 16, 16, 12]
    assert sorted(_flat(shuffled)) == list(range(60)) and _flat(shuffled) != list(range(60))
    control = _flat(_pooled(proof, "control other_share queue shuffle_batch 5"))
    assert len(set(control)) < 60 < len(control)  # process 0's rows twice, process 1's never


def test_evaluate_on_the_pod_with_strings_reaching_the_metrics_equals_stock(proof):
    """A ``StringLookup`` feature and ``add_metrics`` reading its strings (refused on a pod
    before): every process gathers every process's strings and returns stock's metrics."""
    stock = proof["stock"]["strings"]
    assert sorted(stock) == ["global_step", "lima_error", "lima_y", "loss"]
    assert stock["lima_y"] != 0.0
    for got in [proof["board"]["strings"]] + [w["strings"] for w in proof["workers"]]:
        assert sorted(got) == sorted(stock)
        for k in stock:
            assert abs(got[k] - stock[k]) < TOL, (k, got[k], stock[k])


def test_sparse_inputs_on_the_pod_every_example_once_pooled_one_boards(proof):
    """Two ``SparseTensor`` features (27 rows in global batches of 8, the last of 3): each
    process feeds its rows' entries, renumbered as its own rows (a short batch padded as a dense
    feature's rows are), pooled in process order one board's rows; process 1 feeding process
    0's share (the control) feeds some rows twice and others never."""
    board = proof["board"]["batches"]["sparse"]
    assert [len(b) for b in board] == [8, 8, 8, 3]
    assert [row[0] for row in _flat(board)] == list(range(27))
    assert _pooled(proof, "sparse") == board
    control = [row[0] for row in _flat(_pooled(proof, "control other_share sparse"))]
    assert len(set(control)) < 27 and sorted(control) != list(range(27))


def test_sparse_inputs_train_and_evaluate_on_the_pod_as_one_board_and_stock(proof):
    """The sparse inputs' model (``CategoryEncoding`` and a ``Lambda`` of sparse ops run on the
    host, a ``Dense`` reading its input made dense) trained 4 steps and evaluated on the pod and
    one board: 2 steps from its Dataset, then its last 2 batches from a FIFO
    ``tf.compat.v1.train.batch`` queue of its ``SparseTensor`` rows (stock trains the 4 from the
    Dataset): every process's weights equal one board's and the stock estimator's, its metrics
    stock 2.15's, within 1e-5."""
    board, stock = proof["board"]["sparse"], proof["stock"]["sparse"]
    assert len(stock["weights"]) == 6 and _diff(board, stock) < TOL
    for got in [board] + [w["sparse"] for w in proof["workers"]]:
        assert _diff(got, stock) < TOL
        for k, value in sparse_program.STOCK_2_15.items():
            assert abs(got["metrics"][k] - value) < TOL, (k, got["metrics"][k], value)
            assert abs(stock["metrics"][k] - value) < TOL, k


def test_add_metrics_reading_sparse_features_on_one_board_and_the_pod_as_stock(proof):
    """``add_metrics`` metrics reading the ``SparseTensor`` features (each row's ``x`` entries
    summed times its prediction; its count of ids): stock's values on one board and on every
    process of the pod (each process's rows gathered, renumbered in process order, the last
    batch's padding left out). They failed on both: the metrics were given the
    ``SparseTensorValue``'s arrays as dense tensors."""
    stock = proof["stock"]["sparse"]["metrics"]
    assert stock["ids_count"] > 1 and abs(stock["x_y"]) > 0.1
    for got in [proof["board"]["sparse"]] + [w["sparse"] for w in proof["workers"]]:
        for k in ("x_y", "ids_count"):
            assert abs(got["metrics"][k] - stock[k]) < TOL, (k, got["metrics"][k], stock[k])


def _pooled_predictions(predictions, rows, batch):
    """The processes' predictions (each its own rows of each global batch of ``batch``, in
    order), pooled batch by batch in process order: one board's order."""
    out, taken = [], [0] * PROCESSES
    for p_start in range(0, rows, batch):
        for p in range(PROCESSES):
            n = len(_own_rows(min(batch, rows - p_start), batch, p))
            out += predictions[p][taken[p] : taken[p] + n]
            taken[p] += n
    assert taken == [len(p) for p in predictions]
    return out


def test_predict_with_sparse_inputs_on_the_pod_pooled_one_boards_and_stocks(proof):
    """predict() of the sparse inputs' model (27 rows in batches of 8, the last of 3: process 1
    has no real row of it): each process yields its own rows once, pooled in process order one
    board's and stock's predictions within 1e-5 (stock 2.15's first five too); process 1
    predicting process 0's rows (the control) is told apart."""
    board, stock = proof["board"]["sparse"], proof["stock"]["sparse"]
    rows = sparse_program.ROWS
    assert len(board["predictions"]) == len(stock["predictions"]) == rows
    assert np.max(np.abs(np.subtract(board["predictions"], stock["predictions"]))) < TOL
    first = np.reshape(stock["predictions"][:5], [-1])
    assert np.max(np.abs(first - sparse_program.STOCK_2_15_PREDICTIONS)) < TOL
    mine = [w["sparse"]["predictions"] for w in proof["workers"]]
    assert [len(m) for m in mine] == [15, 12]
    pooled = _pooled_predictions(mine, rows, 8)
    assert np.max(np.abs(np.subtract(pooled, board["predictions"]))) < TOL
    assert np.max(np.abs(np.subtract(pooled, stock["predictions"]))) < TOL
    control = [w["sparse"]["control_predictions"] for w in proof["workers"]]
    assert np.max(np.abs(np.subtract(control[0], mine[0]))) < TOL  # (process 0 its own)
    assert len(control[1]) == 15 and np.max(np.abs(np.subtract(control[1], mine[0]))) < TOL
    assert np.max(np.abs(np.subtract(control[1][:12], mine[1]))) > 1e-3  # rows 0-3 twice


def test_sparse_features_from_files_on_the_pod_each_process_its_own_files(proof):
    """tf.Examples parsed into ``SparseTensor`` features (``VarLenFeature``, ``SparseFeature``),
    shuffled and repeated from 4 files: on the files path each process reads only its own 2
    files, every step's global batch of 16 every row once, <= 1.05 records parsed per record
    fed; process 1 reading process 0's files (the control) feeds rows twice."""
    shares = [w["shares"]["sparse files"] for w in proof["workers"]]
    mine = [{row[0] for row in _flat(s["steps"])} for s in shares]
    assert not mine[0] & mine[1] and sorted(mine[0] | mine[1]) == list(range(16))
    pooled = _pooled(proof, "sparse files")
    assert len(pooled) == 160
    assert all(sorted(r[0] for r in b) == list(range(16)) for b in pooled)
    for s in shares:
        assert s["parsed"] / sum(len(b) for b in s["steps"]) <= 1.05
    control = [
        {row[0] for row in _flat(w["shares"]["control other_share sparse files"]["steps"])}
        for w in proof["workers"]
    ]
    assert control[0] & control[1] and len(control[0] | control[1]) < 16


def test_sparse_features_from_files_train_on_the_pod_as_stock(proof):
    """The sparse inputs' model trained 3 more steps on the files path (each global batch the
    16 rows, read by the 2 processes from their own files) and evaluated: every process's
    weights and metrics equal the stock estimator's within 1e-5."""
    stock = proof["stock"]["sparse"]["files"]
    assert stock["metrics"]["global_step"] == 7 and len(stock["weights"]) == 6
    assert _diff(stock, proof["stock"]["sparse"]) > 1e-3  # (3 steps on from the Dataset's 4)
    for worker in proof["workers"]:
        got = worker["sparse"]["files"]
        assert _diff(got, stock) < TOL
        for k in ("loss", "mae", "global_step"):
            assert abs(got["metrics"][k] - stock["metrics"][k]) < TOL, k


def test_a_queue_of_sparse_features_on_the_pod_pooled_one_boards(proof):
    """The sparse inputs' rows through a FIFO ``tf.compat.v1.train.batch`` queue of
    ``SparseTensor`` features (batches of 8, 8, 8, 3): process 0 reads the queue and hands each
    process every batch, each feeding its rows, pooled the Dataset's batches on one board
    (``shuffle_batch``'s: every row once, each with its own entries);
    process 1 feeding process 0's rows (the control) feeds rows twice. (Trained from such a
    queue: test_sparse_inputs_train_and_evaluate_on_the_pod_as_one_board_and_stock.)"""
    board = proof["board"]["batches"]["sparse"]
    assert _pooled(proof, "sparse queue") == board
    shuffled = _pooled(proof, "sparse shuffle_batch")  # (shuffle_batch: every row once)
    assert [len(b) for b in shuffled] == [8, 8, 8, 3]
    assert sorted(map(tuple, _flat(shuffled))) == sorted(map(tuple, _flat(board)))
    assert [row[0] for row in _flat(shuffled)] != list(range(27))
    control = [row[0] for row in _flat(_pooled(proof, "control other_share sparse queue"))]
    assert len(set(control)) < 27  # (rows 0-3 of each batch twice, 4-7 never)


def test_negative_control_a_process_feeding_anothers_share(proof):
    pooled = _pooled(proof, "control other_share shuffle 5")
    assert pooled != proof["board"]["batches"]["shuffle 5"]
    assert len(set(_flat(pooled))) < 60  # some examples twice, others never


def test_files_path_each_process_reads_only_its_own_files(proof):
    """Shuffled, endless input from 8 files: each process reads whole files of its own (none read
    by two), every example once per global epoch (4 steps of 16), <= 1.05 records parsed per
    record fed (the exact path parses every record in every process)."""
    shares = [w["shares"]["files"] for w in proof["workers"]]
    mine = [set(_flat(s["steps"])) for s in shares]
    assert not mine[0] & mine[1] and sorted(mine[0] | mine[1]) == list(range(64))
    pooled = _pooled(proof, "files")
    assert all(len(b) == 16 for b in pooled)
    for epoch in range(len(pooled) // 4):
        assert sorted(_flat(pooled[4 * epoch : 4 * epoch + 4])) == list(range(64)), epoch
    for s in shares:
        assert s["parsed"] / sum(len(b) for b in s["steps"]) <= 1.05
    exact = [w["shares"]["list_files 5"]["parsed"] for w in proof["workers"]]
    assert exact == [64] * PROCESSES


@pytest.mark.parametrize("control", ["whole_input", "other_share"])
def test_negative_control_files_read_twice(proof, control):
    """Every process reading every file, or process 1 reading process 0's files: examples on two
    processes, and an epoch's steps no longer every example once."""
    shares = [
        set(_flat(w["shares"][f"control {control} files"]["steps"])) for w in proof["workers"]
    ]
    assert shares[0] & shares[1]
    pooled = _pooled(proof, f"control {control} files")
    assert sorted(_flat(pooled[:4])) != list(range(64))


def test_training_on_the_pod_equals_one_board_and_stock(proof):
    """A BatchNormalization model, SGD with momentum, a seeded shuffle, a global batch of 20 that
    the 8 devices do not divide (each padded to 24) and a short last one,
    then a second train() from process 0's checkpoint over a FIFO ``tf.compat.v1.train.batch``
    queue (process 0 reads it for every process; refused on a pod before): the weights, slots and global step every
    process reads equal one board's and the stock estimator's within 1e-5; the model_dir holds
    what one board's holds (process 0 wrote it, alone)."""
    board, stock = proof["board"]["training"], proof["stock"]["training"]
    assert stock["type"] == "Estimator" and board["type"] == "JaxEstimator"
    assert _diff(board, stock) < TOL
    for worker in proof["workers"]:
        pod = worker["training"]
        assert pod["type"] == "JaxEstimator" and pod["step"] == stock["step"] == 5
        assert _diff(pod, board) < TOL and _diff(pod, stock) < TOL
        assert pod["files"] == board["files"]


def test_negative_control_training_with_a_process_feeding_anothers_share(proof):
    for worker in proof["workers"]:
        assert _diff(worker["control_training"], proof["board"]["training"]) > 1e-3


def test_negative_control_each_process_feeding_the_first_rows_draws(proof):
    """The training's Dropout draws: every process feeding its rows the draws of the global
    batch's first rows (what drawing for its own rows alone would feed) is told apart."""
    for worker in proof["workers"]:
        assert _diff(worker["control_draws"], proof["board"]["training"]) > 1e-3


def test_evaluate_on_the_pod_equals_one_board_and_stock(proof):
    """Each process evaluates its rows of each global batch (44 rows: 16, 16, 12, the last one
    padded) over the pod's devices; the loss and metrics every process returns are one board's
    and stock's within 1e-5, the eval events written once (process 0)."""
    board, stock = proof["board"]["training"], proof["stock"]["training"]
    assert sorted(board["metrics"]) == sorted(stock["metrics"]) == ["global_step", "loss", "mae"]
    for k in ("loss", "mae"):
        assert abs(board["metrics"][k] - stock["metrics"][k]) < TOL, k
    for worker in proof["workers"]:
        pod = worker["training"]
        assert pod["metrics"]["global_step"] == stock["metrics"]["global_step"] == 5
        for k in ("loss", "mae"):
            assert abs(pod["metrics"][k] - board["metrics"][k]) < TOL, k
        assert pod["eval_files"] == board["eval_files"] and len(pod["eval_files"]) == 1


def test_recurrent_dropout_on_the_pod_equals_one_board_and_stock_2_15(proof):
    """An LSTM, GRU and SimpleRNN with ``recurrent_dropout`` (a mask per time step, drawn on the
    host in stock's order; each process feeding its rows of them), trained in batches of 8 (the
    last of 5, padded) and evaluated: every process's weights and metrics equal stock 2.15's
    recorded ones within 1e-5 (one board's equal them too: test_jax_recurrent.py). Control: each
    process feeding its rows the masks of the global batch's first rows (as drawing for its own
    rows alone would) is told apart."""
    with open(os.path.join(ROOT, "tests", "reference", "jax_recurrent_tf215.json")) as f:
        stock = json.load(f)
    runs = [w["recurrent"] for w in proof["workers"]]
    for metrics, weights in runs:
        assert sorted(weights) == sorted(stock["weights"]) and len(weights) == 12
        for name, values in stock["weights"].items():
            assert np.max(np.abs(np.subtract(weights[name], values))) < TOL, name
        for key, value in stock["metrics"].items():
            assert abs(metrics[key] - value) < TOL, (key, metrics[key], value)
    for worker in proof["workers"]:
        control = worker["control_recurrent"][1]
        assert (
            max(np.max(np.abs(np.subtract(control[n], stock["weights"][n]))) for n in control)
            > 1e-3
        )


def test_padding_on_the_pod_is_logged_as_one_boards(proof):
    """A global batch the 8 devices do not divide: the training's (20), and evaluate()'s and
    predict()'s (10), each logged once, in one board's training's words, on every process."""
    from tpushim._batch_math import indivisible_batch

    want = ["%s; %s." % indivisible_batch(size, 8) for size in (20, 10, 10)]
    assert proof["board"]["padding_notes"] == want
    assert proof["board"]["training"]["padded_rows"] == 10
    for worker in proof["workers"]:
        assert worker["padding_notes"] == want
    assert sum(w["training"]["padded_rows"] for w in proof["workers"]) == 10


def _own_rows(rows, batch, process):
    """Process ``process``'s rows of ``rows`` examples in global batches of ``batch``."""
    share = batch // PROCESSES
    return [
        i
        for start in range(0, rows, batch)
        for i in range(start + process * share, min(start + (process + 1) * share, rows))
    ]


def test_predict_on_the_pod_yields_each_process_its_own_rows(proof):
    """predict() over 20 rows in batches of 8: each process yields its own rows of each global
    batch (4 of each; the last batch's 4 real rows all process 0's), pooled one board's and
    stock's within 1e-5."""
    board, stock = proof["board"]["training"], proof["stock"]["training"]
    assert len(board["predictions"]) == len(stock["predictions"]) == 20
    assert np.max(np.abs(np.subtract(board["predictions"], stock["predictions"]))) < TOL
    for p, worker in enumerate(proof["workers"]):
        mine = [board["predictions"][i] for i in _own_rows(20, 8, p)]
        assert len(worker["training"]["predictions"]) == len(mine) == [12, 8][p]
        assert np.max(np.abs(np.subtract(worker["training"]["predictions"], mine))) < TOL


def test_negative_control_evaluate_and_predict_with_a_process_feeding_anothers_share(proof):
    board = proof["board"]["training"]
    controls = [w["training"]["control"] for w in proof["workers"]]
    assert abs(controls[0]["metrics"]["loss"] - board["metrics"]["loss"]) > 1e-3
    mine = [board["predictions"][i] for i in _own_rows(20, 8, 1)]
    assert np.max(np.abs(np.subtract(controls[1]["predictions"][:8], mine))) > 1e-3


# --- how the environment asks for a pod (no process started) ------------------------------------


@pytest.mark.parametrize(
    "environ, wanted",
    [
        ({}, None),
        ({"TPU_WORKER_HOSTNAMES": "t1v-n-0"}, None),  # one host: one process
        ({"TPU_WORKER_HOSTNAMES": "t1v-n-0,t1v-n-1"}, "tpu"),
        ({"MEGASCALE_COORDINATOR_ADDRESS": "127.0.0.1:8476"}, "tpu"),
        (
            {
                "JAX_COORDINATOR_ADDRESS": "127.0.0.1:1",
                "JAX_NUM_PROCESSES": "2",
                "JAX_PROCESS_ID": "1",
            },
            "explicit",
        ),
    ],
)
def test_the_environment_says_when_to_join_a_pod(environ, wanted):
    from tpushim._jax import _pod

    assert _pod.wanted(environ) == wanted


def test_a_coordinator_without_the_process_count_is_refused_naming_both():
    from tpushim import ConversionError
    from tpushim._jax import _pod

    with pytest.raises(ConversionError, match="JAX_NUM_PROCESSES and JAX_PROCESS_ID"):
        _pod.wanted({"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1"})
