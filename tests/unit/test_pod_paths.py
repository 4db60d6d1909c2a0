"""How a pod's hosts read an input (tpushim/_pods.py), decided from the pipeline's graph: the graph
reading, the decision, the files each host reads, each host's copy made to follow the path, and
the seeds every copy is built with. What the hosts then feed is in tests/proofs/test_pods.py."""

import os

import pytest
import tensorflow as tf
from conftest import tpuestimator_import

import tpushim
from tpushim import _settings

_pods = tpuestimator_import("tpushim._pods")
_tfprivate = tpuestimator_import("tpushim._tfprivate")

pytestmark = pytest.mark.tpuestimator  # the TPU path (cpu mode's TPUEstimator) throughout

TRAIN, EVAL, PREDICT = "train", "eval", "infer"  # tf.estimator.ModeKeys' values


@pytest.fixture
def record_files(tmp_path):
    """Six TFRecord files of 1..6 records (record k of file f: b"f:k")."""
    paths = []
    for f in range(6):
        paths.append(str(tmp_path / f"part-{f}.tfrecord"))
        with tf.io.TFRecordWriter(paths[-1]) as writer:
            for k in range(f + 1):
                writer.write(f"{f}:{k}".encode())
    return paths


def _analysed(make):
    with tf.Graph().as_default():
        return _pods.analyse(make())


def _graph(**kwargs):
    fields = dict(shuffled=True, endless=True, reads_files=True, files=("a", "b", "c", "d"))
    fields["sizes"] = (4, 3, 2, 1)
    return _pods.InputGraph(**dict(fields, **kwargs))


# --- reading the graph ------------------------------------------------------------------------


def test_file_inputs_are_read_as_files(record_files):
    pattern = os.path.join(os.path.dirname(record_files[0]), "*.tfrecord")
    for make in (
        lambda: tf.data.TFRecordDataset(record_files).shuffle(10).repeat().batch(2),
        lambda: tf.data.TFRecordDataset(record_files, num_parallel_reads=2).repeat(),
        lambda: tf.data.Dataset.list_files(pattern).interleave(tf.data.TFRecordDataset).repeat(),
        lambda: (
            tf.data.Dataset.from_tensor_slices(record_files)
            .repeat()
            .flat_map(tf.data.TFRecordDataset)
        ),
    ):
        graph = _analysed(make)
        assert graph.not_files is None and graph.endless and graph.reads_files
        assert sorted(graph.files) == record_files
        assert graph.sizes == tuple(os.path.getsize(f) for f in graph.files)
    assert _analysed(lambda: tf.data.TFRecordDataset(record_files).repeat()).shuffled is False
    assert _analysed(lambda: tf.data.Dataset.list_files(pattern).repeat()).reads_files is False


def test_inputs_that_cannot_be_cut_by_files(record_files):
    cases = {
        "it reads no files (TensorSliceDataset)": lambda: tf.data.Dataset.from_tensor_slices(
            [1, 2, 3]
        ).repeat(),
        "it reads a RangeDataset beside its files": lambda: tf.data.Dataset.zip(
            (tf.data.TFRecordDataset(record_files), tf.data.Dataset.range(100))
        ),
        "it reads 2 lists of files": lambda: tf.data.TFRecordDataset(record_files[:2]).concatenate(
            tf.data.TFRecordDataset(record_files[2:])
        ),
        # Cut before a take(), a host's share would lose other files than the take() drops.
        "its file names are made in the pipeline (by a TakeDataset)": lambda: (
            tf.data.Dataset.from_tensor_slices(record_files)
            .take(3)
            .repeat()
            .flat_map(tf.data.TFRecordDataset)
        ),
        "its file names are made in the pipeline (by a MapDataset)": lambda: (
            tf.data.Dataset.range(2).map(tf.strings.as_string).flat_map(tf.data.TFRecordDataset)
        ),
    }
    for why, make in cases.items():
        graph = _analysed(make)
        assert graph.not_files == why and graph.files is None
    with tf.Graph().as_default():
        names = tf.compat.v1.placeholder(tf.string, [None])  # known only when fed
        graph = _pods.analyse(tf.data.TFRecordDataset(names))
    assert graph.not_files.startswith("its file list cannot be read before the run")


def test_reordering_ops_are_found_and_made_deterministic(record_files):
    options = tf.data.Options()
    options.deterministic = False
    cases = {
        "ParallelInterleaveDatasetV4": lambda: tf.data.Dataset.from_tensor_slices(
            record_files
        ).interleave(tf.data.TFRecordDataset, num_parallel_calls=2, deterministic=False),
        "LegacyParallelInterleaveDatasetV2": lambda: tf.data.Dataset.from_tensor_slices(
            record_files
        ).apply(tf.data.experimental.parallel_interleave(tf.data.TFRecordDataset, 2, sloppy=True)),
        "ParallelMapDatasetV2": lambda: tf.data.Dataset.range(8).map(
            tf.identity, num_parallel_calls=2, deterministic=False
        ),
        "ParallelBatchDataset": lambda: tf.data.Dataset.range(8).batch(
            2, num_parallel_calls=2, deterministic=False
        ),
        "OptionsDataset": lambda: tf.data.Dataset.range(8).with_options(options),
    }
    for op_type, make in cases.items():
        with tf.Graph().as_default():
            dataset = make()
            assert _pods.analyse(dataset).reordering == (op_type,), op_type
            _pods.prepare(dataset, _pods.Path("exact", ""), 0)
            assert _pods.analyse(dataset).reordering == (), op_type
            with tf.compat.v1.Session() as session:  # the changed graph still runs
                iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
                session.run(iterator.initializer)
                session.run(iterator.get_next())


def _reordered_range(i):
    return tf.data.Dataset.range(i).map(tf.identity, num_parallel_calls=2, deterministic=False)


def test_reordering_inside_a_dataset_function_is_a_warning(record_files):
    graph = _analysed(lambda: tf.data.Dataset.range(2).interleave(_reordered_range).repeat())
    assert graph.reordering == () and graph.reordering_inside == ("ParallelMapDatasetV2",)
    path = _pods.decide(graph, EVAL, "auto", 2)
    assert path.name == "exact" and path.fallback
    assert "WARNING: ParallelMapDatasetV2 inside a dataset function" in path.why
    assert "pass deterministic=True there" in path.why


# --- the decision -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "graph,mode,setting,hosts,name,fallback,why",
    [
        (_graph(), TRAIN, "auto", 2, "files", False, "each host reads only its own 2 of them"),
        (_graph(), TRAIN, "files", 4, "files", False, "own 1 of them (assigned by size)"),
        (_graph(sizes=None), TRAIN, "auto", 3, "files", False, "1-2 of them (assigned in turn"),
        (_graph(), TRAIN, "exact", 2, "exact", False, "as pod_input=exact says"),
        (_graph(shuffled=False), TRAIN, "auto", 2, "exact", False, "not shuffled"),
        (_graph(shuffled=False), TRAIN, "files", 2, "files", False, "pod_input=files"),
        (_graph(), TRAIN, "auto", 5, "exact", True, "4 file(s) for 5 hosts"),
        (_graph(), EVAL, "files", 2, "exact", True, "an evaluation reads every example once"),
        (_graph(), EVAL, "auto", 2, "exact", False, "an evaluation reads every example once"),
        (_graph(endless=False), TRAIN, "auto", 2, "exact", False, "not known to repeat forever"),
        (_graph(not_files="it reads no files (X)"), TRAIN, "auto", 2, "exact", False, "(X)"),
        (_graph(not_files="it reads a X beside"), TRAIN, "auto", 2, "exact", True, "beside"),
        (_graph(reordering=("ParallelMapDatasetV2",)), EVAL, "auto", 2, "exact", False, "made"),
        (_graph(), PREDICT, "auto", 1, "exact", False, "one input pipeline (host 0's)"),
        (_graph(), TRAIN, "files", 1, "exact", True, "one input pipeline (host 0's)"),
    ],
)
def test_decision(graph, mode, setting, hosts, name, fallback, why):
    if "no files" in (graph.not_files or ""):
        graph = _pods.InputGraph(**dict(graph.__dict__, reads_files=False, files=None))
    path = _pods.decide(graph, mode, setting, hosts)
    assert (path.name, path.fallback) == (name, fallback), path
    assert why in path.why
    assert (path.shares is not None) == (name == "files")


def test_files_are_assigned_by_size():
    names = tuple("abcdefgh")
    sizes = (12, 4, 11, 5, 10, 6, 9, 7)
    for hosts in (2, 4):
        shares = _pods.assign(names, sizes, hosts)
        loads = [sum(sizes[names.index(f)] for f in share) for share in shares]
        assert loads == [64 // hosts] * hosts, shares
        assert sorted(f for share in shares for f in share) == list(names)
        assert all(list(share) == sorted(share) for share in shares)  # in list order
    # Largest first leaves 17 against 13 here; one swap evens it.
    assert _pods.assign(tuple("abcde"), (8, 7, 6, 5, 4), 2) == (("c", "d", "e"), ("a", "b"))
    assert _pods.assign(names, None, 3) == (("a", "d", "g"), ("b", "e", "h"), ("c", "f"))


def test_a_host_copy_reads_only_its_share(record_files):
    with tf.Graph().as_default():
        pattern = os.path.join(os.path.dirname(record_files[0]), "*.tfrecord")
        dataset = tf.data.Dataset.list_files(pattern).interleave(
            tf.data.TFRecordDataset, cycle_length=2
        )
        path = _pods.decide(_pods.analyse(dataset.repeat()), TRAIN, "files", 2)
        _pods.prepare(dataset, path, 1)
        with tf.compat.v1.Session() as session:
            read = session.run(dataset.batch(100).get_single_element())
    files = {int(r.split(b":")[0]) for r in read}
    assert {record_files[f] for f in files} == set(path.shares[1])
    assert len(read) == sum(f + 1 for f in files)


# --- the seeds every copy is built with -----------------------------------------------------------


@pytest.mark.parametrize("graph_seed", [None, 7])
def test_every_copy_is_built_with_the_first_copys_seeds(graph_seed):
    with tf.Graph().as_default() as graph:
        graph.seed = graph_seed
        tf.random.uniform([])  # an op before the input: the counter is not at 0
        before = _tfprivate.graph.graph_seeds(graph)
        seeds = _pods.Seeds(graph)
        copies = []
        for _ in range(3):
            with seeds.pinned():  # what a shuffle made now is seeded with, twice
                copies.append([tf.compat.v1.random.get_seed(None) for _ in range(2)])
            if len(copies) == 1:
                after_first = _tfprivate.graph.graph_seeds(graph)
        assert copies[0] == copies[1] == copies[2] and None not in copies[0][0]
        assert copies[0][0] != copies[0][1]  # ops within one copy are seeded apart
        if graph_seed is None:  # drawn for this call, and the graph left without one
            assert seeds.drawn and after_first == before == _tfprivate.graph.graph_seeds(graph)
        else:  # the graph goes on as stock's: the counter where the first copy left it
            assert after_first == (7, before[1] + 2) == _tfprivate.graph.graph_seeds(graph)
    assert _pods.Seeds(tf.Graph())._pin != _pods.Seeds(tf.Graph())._pin  # unseeded: per call


# --- the setting ------------------------------------------------------------------------------


def test_pod_input_setting(monkeypatch):
    assert _settings.resolve().pod_input == "auto"
    monkeypatch.setenv("TPUSHIM_POD_INPUT", " Files ")
    settings = _settings.resolve()
    assert (settings.pod_input, settings.sources["pod_input"]) == ("files", "TPUSHIM_POD_INPUT")
    assert _settings.resolve([{"pod_input": "exact"}]).pod_input == "exact"
    monkeypatch.setenv("TPUSHIM_POD_INPUT", "sharded")
    with pytest.raises(tpushim.ConfigurationError) as info:
        tpushim.patch()
    assert "TPUSHIM_POD_INPUT='sharded' is not a pod input path" in str(info.value)
    assert "choose one of auto, exact, files" in str(info.value)
    assert not tpushim.is_patched()
    monkeypatch.delenv("TPUSHIM_POD_INPUT")
    for bad in ("all", 1, True):
        with pytest.raises(tpushim.ConfigurationError, match=r"pod_input=.* is not a pod input"):
            tpushim.patch(pod_input=bad)
        with pytest.raises(tpushim.ConfigurationError):
            tpushim.patched(pod_input=bad)
    with tpushim.patched(pod_input="exact"):
        assert tpushim._patch.current_settings().pod_input == "exact"
    assert ("--pod-input", "pod_input") in [(f, kw["dest"]) for f, kw in _settings.OPTIONS]


def test_runner_option_is_parsed_strictly(capsys):
    from tpushim import _cli

    with pytest.raises(SystemExit) as info:
        _cli.main(["--pod-input", "sharded", "info"])
    assert info.value.code == 2
    assert "pod_input='sharded' is not a pod input path" in capsys.readouterr().err
    assert _cli.main(["--pod-input", "files", "info"]) == 0
