"""Pods (rung 2): every example fed exactly once, each host reading only its share where it can.

TPUEstimator's whole graph is built for faked TPU systems of 2 and 4 hosts x 8 cores, and every
host's input pipeline is run from it (as a TPU host runs it on its CPU). Each example's id travels
in feature 0; what the hosts feed is pooled and compared with the input (and, on the exact path,
with what one board feeds, step by step).
"""

import itertools
import os
import random

import numpy as np
import pytest
import sparse_program
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

import tpushim

faketpu = tpuestimator_import("tpushim._preflight.faketpu")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tpuestimator,
]  # builds TPUEstimator graphs and runs every host's pipeline

GLOBAL = 32  # divides among 32 cores (4 hosts): 1 row per core there, 2 on 2 hosts
ITERATIONS = 4
SIZES = (12, 4, 11, 5, 10, 6, 9, 7)  # 64 records in files of unequal size; even by size on 2, 4
EVAL_SIZES = (12, 4, 11, 5, 10, 6, 9, 13)  # 70 records: the last eval batch is partial
SPEC = {"x": tf.io.FixedLenFeature([4], tf.float32), "y": tf.io.FixedLenFeature([1], tf.int64)}


def _write(directory, sizes):
    """TFRecord files holding ``sizes`` records each; record ids run on from file to file."""
    os.makedirs(directory)
    paths, start = [], 0
    for k, size in enumerate(sizes):
        paths.append(os.path.join(directory, f"part-{k}.tfrecord"))
        with tf.io.TFRecordWriter(paths[-1]) as writer:
            for i in range(start, start + size):
                features = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, 0.5, 0.5, 0.5])),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3])),
                }
                writer.write(
                    tf.train.Example(
                        features=tf.train.Features(feature=features)
                    ).SerializeToString()
                )
        start += size
    return paths


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    return {
        "train": _write(str(root / "train"), SIZES),
        "eval": _write(str(root / "eval"), EVAL_SIZES),
        "three": _write(str(root / "three"), (20, 22, 22)),
    }


def _parse(record):
    example = tf.io.parse_single_example(record, SPEC)
    return example["x"], example["y"]


def _ids(n):
    x, y = tfcases.data(n=n)
    x[:, 0] = np.arange(n)
    return x, y


def _inputs(paths, n=64, repeat=True):
    """The issue's inputs, batched by GLOBAL (ids 0..n-1 in feature 0), endless or one epoch."""
    pattern = os.path.join(os.path.dirname(paths[0]), "*.tfrecord")
    x, y = _ids(n)
    again = (lambda ds: ds.repeat()) if repeat else (lambda ds: ds)
    return {
        "no shuffle": lambda: again(tf.data.TFRecordDataset(paths).map(_parse)).batch(GLOBAL),
        "shuffle": lambda: again(tf.data.TFRecordDataset(paths).map(_parse).shuffle(1000)).batch(
            GLOBAL
        ),
        "list_files": lambda: again(
            tf.data.Dataset.list_files(pattern)  # shuffles the file names by default
            .interleave(tf.data.TFRecordDataset, cycle_length=2)
            .map(_parse)
        ).batch(GLOBAL),
        "finite shuffle": lambda: (
            tf.data.TFRecordDataset(paths).map(_parse).shuffle(1000).batch(GLOBAL)
        ),
        "numpy_input_fn": tf.compat.v1.estimator.inputs.numpy_input_fn(
            x, y, batch_size=GLOBAL, shuffle=True, num_epochs=None
        ),
    }


def _hosts_fed(build, tpu, steps):
    """Per host, per step, the ids of the rows it feeds (every row: training input)."""
    per_host = []
    for host in range(tpu.num_hosts):
        batches = build.host_input(host, max_batches=steps * tpu.cores_per_host)
        assert len(batches) == steps * tpu.cores_per_host
        cores = [
            batches[s * tpu.cores_per_host : (s + 1) * tpu.cores_per_host] for s in range(steps)
        ]
        per_host.append([[int(i) for b in step for i in b[0][:, 0]] for step in cores])
    return per_host


def _steps_fed(build, tpu, steps):
    """Per step, the ids all hosts feed, pooled and sorted: that step's global batch."""
    per_host = _hosts_fed(build, tpu, steps)
    return [sorted(i for host in per_host for i in host[s]) for s in range(steps)]


def _train(tpu, est, input_fn, steps):
    build = tpu.build(lambda: est.train(input_fn, steps=ITERATIONS))
    return build, _steps_fed(build, tpu, steps)


def _pin_entropy(monkeypatch):
    """The environment: the operating-system entropy numpy_input_fn's reader draws its start row
    from (``random.seed(None)``, at each call of its input_fn) pinned: another value at each
    call, the same sequence in each test."""
    original, calls = random.seed, itertools.count()
    monkeypatch.setattr(
        random, "seed", lambda a=None, *args: original(1234 + next(calls) if a is None else a)
    )


_ONE_BOARD = {}


def _one_board(files, tmp_path_factory, name):
    """What one board (8 cores) feeds, step by step, seeded: the reference for the exact path."""
    if name not in _ONE_BOARD:
        with pytest.MonkeyPatch.context() as monkeypatch, faketpu.faked_tpu_system(hosts=1) as tpu:
            _pin_entropy(monkeypatch)
            est = tfcases.convert(
                tmp_path_factory.mktemp("one_board"),
                patch=tfcases.on_faked_tpu(tpu, ITERATIONS),
                config=tf.estimator.RunConfig(tf_random_seed=1),
            )
            _, _ONE_BOARD[name] = _train(tpu, est, _inputs(files["train"])[name], 4)
    return _ONE_BOARD[name]


# --- the exact path: identical copies, each host keeping its share -------------------------------


@pytest.mark.parametrize("hosts", [2, 4])
@pytest.mark.parametrize(
    "name,seed",
    [
        ("no shuffle", 1),
        ("shuffle", None),
        ("shuffle", 1),
        ("list_files", None),
        ("finite shuffle", None),
        ("numpy_input_fn", None),
        ("numpy_input_fn", 1),
    ],
)
def test_exact_path_feeds_every_example_once_per_epoch(
    files, tmp_path, tmp_path_factory, tpushim_log, hosts, name, seed, monkeypatch
):
    """Every host's copy is built with the same seeds, so the copies agree and each host keeping
    its pieces of each global batch feeds every example once per epoch; seeded, each step's global
    batch is the one a single board feeds. (Shuffled files are read per host by default: here
    pod_input=exact; unshuffled, finite and array input take the exact path by default.)
    numpy_input_fn's rows come in stock's queue's order, whose batches run across epochs: each
    host's copy reads from where the first copy's reader starts (the operating system's entropy
    it draws from pinned here, as for one board)."""
    _pin_entropy(monkeypatch)
    exact = {"pod_input": "exact"} if name in ("shuffle", "list_files") else {}
    epochs = 1 if name.startswith("finite") else 2
    with faketpu.faked_tpu_system(hosts=hosts) as tpu:
        est = tfcases.convert(
            tmp_path,
            patch=tfcases.on_faked_tpu(tpu, ITERATIONS, **exact),
            config=tf.estimator.RunConfig(tf_random_seed=seed),
        )
        _, steps = _train(tpu, est, _inputs(files["train"])[name], 2 * epochs)
    assert f"train() on {hosts} TPU hosts: exact path" in tpushim_log.text
    if name == "no shuffle":
        assert "the training input is not shuffled: stock's batches, in order" in tpushim_log.text
        assert steps[:2] == [list(range(32)), list(range(32, 64))]
    for epoch in range(epochs if name != "numpy_input_fn" else 0):
        assert sorted(i for step in steps[2 * epoch : 2 * epoch + 2] for i in step) == list(
            range(64)
        )
    assert all(len(step) == GLOBAL for step in steps)
    if seed is not None:
        assert steps == _one_board(files, tmp_path_factory, name)


# --- the files path: each host reads its own files ------------------------------------------------


def _file_ids(paths, sizes):
    starts = np.cumsum((0,) + sizes)
    return {path: set(range(starts[k], starts[k + 1])) for k, path in enumerate(paths)}


@pytest.mark.parametrize("hosts", [2, 4])
@pytest.mark.parametrize("name,seed", [("shuffle", None), ("list_files", 1)])
def test_files_path_each_host_reads_only_its_own_files(
    files, tmp_path, tpushim_log, hosts, name, seed
):
    """Shuffled, endless training input from files: each host reads whole files of its own, no
    example is fed by two hosts, and (the shares even by size) over one global epoch every example
    is fed exactly once."""
    with faketpu.faked_tpu_system(hosts=hosts) as tpu:
        est = tfcases.convert(
            tmp_path,
            patch=tfcases.on_faked_tpu(tpu, ITERATIONS),
            config=tf.estimator.RunConfig(tf_random_seed=seed),
        )
        build = tpu.build(lambda: est.train(_inputs(files["train"])[name], steps=ITERATIONS))
        per_host = _hosts_fed(build, tpu, 4)
    assert f"train() on {hosts} TPU hosts: files path" in tpushim_log.text
    assert f"each host reads only its own {8 // hosts} of them (assigned by size)" in (
        tpushim_log.text
    )
    owned = _file_ids(files["train"], SIZES)
    seen = [{i for step in host for i in step} for host in per_host]
    for ids in seen:  # whole files, 64 / hosts records each
        assert ids == set().union(*(f for f in owned.values() if f & ids))
        assert len(ids) == 64 // hosts
    assert sorted(i for ids in seen for i in ids) == list(range(64))  # no example on two hosts
    epoch = sorted(i for host in per_host for step in host[:2] for i in step)
    assert epoch == list(range(64))


def test_fewer_files_than_hosts_fall_back_to_the_exact_path(files, tmp_path, tpushim_log):
    three = _inputs(files["three"])["shuffle"]
    with faketpu.faked_tpu_system(hosts=4) as tpu:
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
        _, steps = _train(tpu, est, three, 2)
    lines = [r.getMessage() for r in tpushim_log.records if "TPU hosts" in r.getMessage()]
    assert len(lines) == 1, lines  # one line per call, naming the path and why
    assert "exact path" in lines[0] and "3 file(s) for 4 hosts: fewer files than hosts" in lines[0]
    assert sorted(i for step in steps for i in step) == list(range(64))


def test_nondeterministic_pipeline_is_made_deterministic(files, tmp_path, tpushim_log):
    """deterministic=False interleave and map (unshuffled: the exact path) would let each host's
    copy emit another order; they are made deterministic, and the hosts feed stock's batches."""
    pattern = os.path.join(os.path.dirname(files["train"][0]), "*.tfrecord")

    def input_fn():
        return (
            tf.data.Dataset.list_files(pattern, shuffle=False)
            .interleave(
                tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=4, deterministic=False
            )
            .map(_parse, num_parallel_calls=4, deterministic=False)
            .repeat()
            .batch(GLOBAL)
        )

    with faketpu.faked_tpu_system(hosts=2) as tpu:
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
        build, steps = _train(tpu, est, input_fn, 2)
    assert "exact path" in tpushim_log.text
    assert (
        "made deterministic: ParallelMapDatasetV2, ParallelInterleaveDatasetV4" in tpushim_log.text
    )
    modes = {
        n.name: n.attr["deterministic"].s
        for n in build.graph.as_graph_def().node
        if "deterministic" in n.attr
    }
    assert len(modes) == 4 and set(modes.values()) == {b"true"}, modes  # 2 ops x 2 hosts
    assert sorted(i for step in steps for i in step) == list(range(64))


# --- SparseTensor inputs: their readers run on every host ------------------------------------

#: The flat order of a fed batch of the sparse-input program (features by name, then the padding
#: weight and the label): each row's number, the ids input's placeholder, the host part's outputs
#: (its CategoryEncodings and Lambda), the x input made dense for its Dense.
_SPARSE_FED = ("id", "ids", "count", "multi", "ops", "x", "weight")


def _sparse_steps(per_host, steps, cores):
    """Per step, each real row the hosts feed, pooled in host order: (id, {name: values})."""
    pooled = []
    for step in range(steps):
        rows = []
        for batches in per_host:
            for batch in batches[step * cores : (step + 1) * cores]:
                named = dict(zip(_SPARSE_FED, batch))
                for r in np.flatnonzero(named["weight"] > 0):
                    rows.append((int(named["id"][r]), {k: v[r] for k, v in named.items()}))
        pooled.append(rows)
    return pooled


def _as_one_board(pooled, stock_rows):
    """Each step's rows are one board's batch (rows 8s.. of the input: every row once; the
    hosts' cores take turns, TensorFlow's replica order), each row's values stock's layers' on
    its SparseTensors within 1e-6."""
    for step, rows in enumerate(pooled):
        ids = sorted(i for i, _ in rows)
        if ids != list(range(8 * step, min(8 * step + 8, sparse_program.ROWS))):
            return False
        for i, row in rows:
            if any(np.max(np.abs(row[k] - v[i])) > 1e-6 for k, v in stock_rows.items()):
                return False
    return True


def test_sparse_inputs_on_a_pod_feed_one_boards_rows(tmp_path):
    """The sparse-input program (tests/sparse_program.py: CategoryEncoding, a Lambda of sparse
    ops and a Dense on SparseTensor inputs; 27 rows in batches of 8, the last of 3) trained on a
    faked 2-host pod: each host runs the readers on its own copy of the input, before the
    padding. Pooled over the hosts, each step's rows are one board's batch, every row once,
    their values those stock's own layers compute from the row's SparseTensors (one board's
    training with them is stock's: tests/strategy/test_strategy_sparse_inputs.py). Host 0's
    share pooled in place of host 1's is not."""
    model = sparse_program.model()
    made = sparse_program.features()[0]()
    layers = {layer.name: layer for layer in model.layers}
    stock_rows = {
        "count": layers["count"](made["ids"]).numpy(),
        "multi": layers["multi"](made["ids"]).numpy(),
        "ops": layers["ops"](made["x"]).numpy(),
        "x": tf.sparse.to_dense(made["x"]).numpy(),
    }
    with faketpu.faked_tpu_system(hosts=2) as tpu:
        est = tfcases.convert(
            tmp_path,
            model=model,
            patch=tfcases.on_faked_tpu(tpu, ITERATIONS),
            config=tf.estimator.RunConfig(tf_random_seed=1),
        )
        build = tpu.build(lambda: est.train(sparse_program.input_fn(with_id=True), steps=4))
    cores = tpu.cores_per_host
    per_host = [build.host_input(h, max_batches=4 * cores) for h in range(tpu.num_hosts)]
    assert _as_one_board(_sparse_steps(per_host, 4, cores), stock_rows)
    control = [per_host[0], per_host[0]]  # host 1 feeding host 0's share
    assert not _as_one_board(_sparse_steps(control, 4, cores), stock_rows)


# --- evaluate() and predict() --------------------------------------------------------------------


def _real_ids(batch, features=0, weight=1):
    return [int(i) for i, w in zip(batch[features][:, 0], batch[weight]) if w > 0]


def _assert_evaluated_once(build, tpu, n, steps, sliced=False, in_order=True):
    """Each step's global batch holds the next real examples; every example is evaluated once.
    ``sliced``: host 0's one pipeline feeds every core (one global batch a step)."""
    assert build.eval_steps == steps
    pieces = 1 if sliced else tpu.cores_per_host  # what a pipeline feeds per step
    pipelines = [
        build.host_input(h, max_batches=steps * pieces)
        for h in range(1 if sliced else tpu.num_hosts)
    ]
    every = []
    for step in range(steps):
        now = slice(step * pieces, (step + 1) * pieces)
        every += sorted(i for batches in pipelines for b in batches[now] for i in _real_ids(b))
    assert (every if in_order else sorted(every)) == list(range(n))


@pytest.mark.parametrize("hosts", [2, 4])
def test_evaluate_list_files_with_a_partial_last_batch(files, tmp_path, hosts):
    """The common eval input: list_files (shuffled file names), a partial last batch."""
    input_fn = _inputs(files["eval"], n=70, repeat=False)["list_files"]
    with faketpu.faked_tpu_system(hosts=hosts) as tpu:
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
        build = tpu.build(lambda: est.evaluate(input_fn))
    # Each step's examples are those of the same batch on every host: the hosts' copies agree.
    _assert_evaluated_once(build, tpu, 70, steps=3, in_order=False)


@pytest.mark.parametrize("hosts", [1, 2])
def test_evaluate_without_steps_rebatched_with_a_partial_last_batch(tmp_path, hosts):
    """An input batched by 10, evaluated with a global batch of 64: 100 examples are 2 steps, the
    second partial (flooring the step count would leave 36 examples out)."""
    x, y = _ids(100)
    with faketpu.faked_tpu_system(hosts=hosts) as tpu:
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS, batch_size=64))
        build = tpu.build(lambda: est.evaluate(tfcases.dataset_input_fn(x, y, batch=10)))
    _assert_evaluated_once(build, tpu, 100, steps=2)


def _with_tpu_config(tpu, model_dir, **tpu_config_kwargs):
    """model_to_estimator given the user's own tpu_config.RunConfig."""
    from tensorflow_estimator.python.estimator.tpu import tpu_config

    config = tpu_config.RunConfig(
        cluster=tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu.master),
        tpu_config=tpu_config.TPUConfig(iterations_per_loop=ITERATIONS, **tpu_config_kwargs),
    )
    return tfcases.convert(model_dir, patch={}, config=config)


def test_users_sliced_eval_config_feeds_from_host_zero(tmp_path):
    """TPUConfig(eval_training_input_configuration=SLICED): TPUEstimator calls the input_fn once,
    host 0 feeding every core: nothing is sharded by the host count."""
    from tensorflow_estimator.python.estimator.tpu import tpu_config

    x, y = _ids(300)
    with faketpu.faked_tpu_system(hosts=2) as tpu:
        est = _with_tpu_config(
            tpu,
            tmp_path,
            per_host_input_for_training=tpu_config.InputPipelineConfig.PER_HOST_V2,
            eval_training_input_configuration=tpu_config.InputPipelineConfig.SLICED,
        )
        build = tpu.build(lambda: est.evaluate(tfcases.dataset_input_fn(x, y, batch=GLOBAL)))
    _assert_evaluated_once(build, tpu, 300, steps=10, sliced=True)


def test_users_broadcast_config_keeps_every_batch(files, tmp_path):
    """per_host_input_for_training=BROADCAST: one input_fn call, host 0's pipeline feeding every
    core the whole global batch (TPUEstimator's broadcast): every batch kept, in order."""
    from tensorflow_estimator.python.estimator.tpu import tpu_config

    with faketpu.faked_tpu_system(hosts=2) as tpu:
        est = _with_tpu_config(
            tpu, tmp_path, per_host_input_for_training=tpu_config.InputPipelineConfig.BROADCAST
        )
        build = tpu.build(
            lambda: est.train(_inputs(files["train"])["no shuffle"], steps=ITERATIONS)
        )
    batches = build.host_input(0, max_batches=2)
    assert [[int(i) for i in b[0][:, 0]] for b in batches] == [
        list(range(32)),
        list(range(32, 64)),
    ]


@pytest.mark.parametrize("hosts", [2, 4])
def test_predict_on_a_pod_predicts_every_example_once_in_order(tmp_path, hosts):
    """TPUEstimator refuses predict() per host on a pod; tpushim has host 0 feed every core in
    order (SLICED), as TPUEstimator evaluates with it."""
    x, _ = _ids(70)
    with faketpu.faked_tpu_system(hosts=hosts) as tpu:
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
        build = tpu.build(
            lambda: est.predict(lambda: tf.data.Dataset.from_tensor_slices(x).batch(32))
        )
    per_core = GLOBAL // tpu.num_cores
    shapes = build.infeed_shapes()
    assert len(shapes) == tpu.num_cores and all(
        s[:2] == [[per_core, 4], [per_core]] for s in shapes
    )
    # The one pipeline: global batches (features, padding weight, TPUEstimator's padding mask
    # and stopping signal), then TPUEstimator's stop.
    *batches, stop = build.host_input(0)
    assert stop[3].all() and not any(b[3].any() for b in batches)
    assert [i for b in batches for i in _real_ids(b)] == list(range(70))
    for host in range(1, hosts):
        with pytest.raises(ValueError, match="expected one input iterator"):
            build.host_input(host)


# --- the preflight --------------------------------------------------------------------------------


def test_preflight_says_which_path_each_input_takes(files, tmp_path):
    """``check --cores 16`` and above: a finding per input naming its path and why; a warning
    where every host would read every file."""
    from tpushim import _preflight

    def shuffled_files():
        return _inputs(files["train"])["shuffle"]()

    def three_files():
        return _inputs(files["three"])["shuffle"]()

    tpushim.patch(mode="cpu")
    with _preflight.recording() as recorder:
        est = tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(), model_dir=str(tmp_path)
        )
        est.train(shuffled_files, steps=1)
        est.train(three_files, steps=1)

    def paths(cores):
        report = recorder.report(num_cores=cores, tpu_graphs=False)
        return {f.where: (f.severity, f.message) for f in report.findings if f.code == "pod-input"}

    assert paths(8) == {}
    two, four = paths(16), paths(32)
    assert two["train() input_fn 'shuffled_files'"] == (
        "info",
        "on 2 TPU hosts: files path: shuffled, endless training input read from 8 files: each "
        "host reads only its own 4 of them (assigned by size), before the input_fn's parse and map",
    )
    assert two["train() input_fn 'three_files'"][1].startswith(
        "on 2 TPU hosts: files path: shuffled, endless training input read from 3 files: each "
        "host reads only its own 1-2 of them"
    )
    assert four["train() input_fn 'three_files'"] == (
        "warning",
        "on 4 TPU hosts: exact path: every host reads the whole input and keeps its share, as 3 "
        "file(s) for 4 hosts: fewer files than hosts",
    )
