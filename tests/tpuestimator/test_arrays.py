"""In-memory data at real size (issue 22): numpy_input_fn / pandas_input_fn arrays are fed to the
Dataset that reads them, never embedded in a graph, and never copied whole: rows read back exactly
from every alignment; a graph and a model_dir the same size for 1,000 and 100,000 rows, in cpu
mode and on a faked TPU system, with no constant holding the arrays; the feed reaching a pipeline
placed on another task through a gRPC session. Equality with stock: tests/tpuestimator/test_legacy_input.py."""

import os

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

import tpushim
from tpushim import _errors

_arrays = tpuestimator_import("tpushim._arrays")
_input_fn = tpuestimator_import("tpushim._input_fn")
_source = tpuestimator_import("tpushim._source")
_tfprivate = tpuestimator_import("tpushim._tfprivate")
faketpu = tpuestimator_import("tpushim._preflight.faketpu")

pytestmark = pytest.mark.tpuestimator  # the TPU path (cpu mode's TPUEstimator) throughout

ModeKeys = tfcases.ModeKeys
numpy_input_fn = tfcases.ESTIMATOR.inputs.numpy_input_fn
pandas_input_fn = tfcases.ESTIMATOR.inputs.pandas_input_fn
SMALL, LARGE = 1000, 100_000
FEATURES = 32  # 100,000 rows: 12.8 MB a graph would hold if the arrays were in it
GRAPH_SLACK = 4096  # bytes: the row count is written in a few shapes, nothing grows with it


def _columns(dtype, rows, shift):
    """Arrays of ``rows`` rows of several shapes, each starting ``shift`` elements into a buffer
    of its own, so their data sits at every alignment."""
    rng = np.random.default_rng(shift)
    out = []
    for shape in [(rows,), (rows, 5, 2), (rows, 100)]:
        size = int(np.prod(shape))
        buffer = np.empty(size + 64, dtype)
        array = buffer[shift : shift + size].reshape(shape)
        array[...] = (rng.random(shape) * 100).astype(dtype)
        out.append(array)
    return out


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "bool"])
def test_rows_are_read_exactly_at_every_alignment_from_the_arrays_own_memory(dtype):
    rows = 37
    columns = [c for shift in (0, 1, 3, 6, 13) for c in _columns(dtype, rows, shift)]
    with tf.Graph().as_default() as graph:
        reader = _arrays.Rows(columns + [range(rows)])
        indices = tf.compat.v1.placeholder(tf.int64, [None])
        gathered = reader.gather(indices)
        order = np.concatenate([np.random.default_rng(0).permutation(rows), [0, rows - 1, 0]])
        with _input_fn.graph_session() as session:
            *got, numbers = session.run(gathered, {indices: order})
    for array, read in zip(columns, got):
        assert read.dtype == array.dtype and np.array_equal(read, array[order])
    np.testing.assert_array_equal(numbers, order)  # range(rows): the row numbers themselves
    # What is fed: views of the arrays' own memory, aligned so that a feed takes them without a
    # copy, and a few edge elements per array (copied), or a tiny array as it is.
    fed = list(_arrays.fed_arrays(graph).values())
    views = [
        a for a in fed if any(np.shares_memory(a, c) for c in columns) and a.ctypes.data % 64 == 0
    ]
    assert sum(a.nbytes for a in views) > 0.95 * sum(c.nbytes for c in columns)
    others = sum(a.nbytes for a in fed if not any(a is v for v in views))
    assert others <= len(columns) * (64 + 2 * 100 * 8)


def _rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _first_batch_fed(x, batch):
    """Starts tpushim's cpu-mode input over numpy_input_fn(x) and returns its first batch."""
    fn = numpy_input_fn(x, x[:, 0], batch_size=batch, shuffle=True, num_epochs=None)
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(7)
        result = _input_fn.call(fn, ModeKeys.TRAIN, _input_fn.UserParams(), None)
        dataset = _input_fn.adapt(result, ModeKeys.TRAIN, batch, {})
        return tfcases.read_batches(dataset, 1)[0]


def test_starting_the_input_copies_no_array():
    """The feed takes the arrays' memory as it is and tf.data rewrites (which copy what a pipeline
    captures) are off: starting the pipeline over 200 MB adds nothing near 200 MB."""
    _first_batch_fed(np.ones((64, 1024), np.float32), 32)  # TensorFlow's own first-run memory
    x = np.arange(50_000 * 1024, dtype=np.float32).reshape(50_000, 1024)  # 205 MB, resident
    before = _rss()
    features, labels = _first_batch_fed(x, 32)
    assert _rss() - before < 0.25 * x.nbytes, (_rss() - before) / 2**20
    rows = (features[:, 0] / 1024).astype(int)
    np.testing.assert_array_equal(features, x[rows])
    np.testing.assert_array_equal(labels, x[rows, 0])


# --- graph and model_dir sizes do not depend on the rows -----------------------------------------


def _data(rows):
    rng = np.random.default_rng(0)
    return rng.random((rows, FEATURES), dtype=np.float32), rng.integers(0, 3, rows)


def _model():
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    inp = tf.keras.Input((FEATURES,), name="x")
    model = tf.keras.Model({"x": inp}, tf.keras.layers.Dense(3, activation="softmax")(inp))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy")
    return model


def _numpy_input(rows, **kwargs):
    x, y = _data(rows)
    return numpy_input_fn({"x": x}, y, batch_size=64, **kwargs)


def _pandas_input(rows, **kwargs):
    x, y = _data(rows)
    frame = pd.DataFrame({name: x[:, i] for i, name in enumerate(COLUMNS)})
    return pandas_input_fn(frame, pd.Series(y), batch_size=64, **kwargs)


COLUMNS = "abcd"  # a DataFrame's columns, one feature each


def _columns_model():
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    inputs = {k: tf.keras.Input((), name=k) for k in COLUMNS}
    stacked = tf.keras.layers.Lambda(lambda d: tf.stack([d[k] for k in COLUMNS], axis=1))(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(3, activation="softmax")(stacked))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy")
    return model


def _largest_constant(graph_def):
    nodes = [n for n in graph_def.node] + [
        n for f in graph_def.library.function for n in f.node_def
    ]
    return max(n.attr["value"].tensor.ByteSize() for n in nodes if n.op == "Const")


def _written(model_dir):
    """Bytes of graph.pbtxt, of every file in the model_dir, and the largest constant in the
    latest checkpoint's meta graph."""
    files = [os.path.join(d, f) for d, _, names in os.walk(model_dir) for f in names]
    meta_file = tf.train.latest_checkpoint(model_dir) + ".meta"
    meta_graph = tf.compat.v1.MetaGraphDef()
    with open(meta_file, "rb") as f:
        meta_graph.ParseFromString(f.read())
    return (
        os.path.getsize(os.path.join(model_dir, "graph.pbtxt")),
        sum(os.path.getsize(f) for f in files),
        _largest_constant(meta_graph.graph_def),
    )


@pytest.mark.slow  # trains estimators
@pytest.mark.parametrize(
    "make_input, make_model",
    [(_numpy_input, _model), (_pandas_input, _columns_model)],
    ids=["numpy", "pandas"],
)
def test_cpu_mode_graph_and_model_dir_do_not_grow_with_the_rows(
    tmp_path, tpushim_log, make_input, make_model
):
    written = {}
    for rows in (SMALL, LARGE):
        model_dir = tmp_path / str(rows)
        tpushim.patch(mode="cpu")
        est = tf.keras.estimator.model_to_estimator(
            keras_model=make_model(), model_dir=str(model_dir)
        )
        tpushim.unpatch()
        est.train(make_input(rows, shuffle=True, num_epochs=None), steps=2)
        written[rows] = _written(str(model_dir))
    assert "fed when the iterator starts" in tpushim_log.text  # the Dataset tpushim feeds
    (small_graph, small_dir, _), (large_graph, large_dir, largest) = written[SMALL], written[LARGE]
    assert abs(large_graph - small_graph) < GRAPH_SLACK, written
    assert abs(large_dir - small_dir) < 4 * GRAPH_SLACK, written
    assert largest < LARGE, written  # no constant holds even one row number per row


@pytest.mark.slow  # builds TPUEstimator's TPU graphs
def test_tpu_graphs_do_not_grow_with_the_rows_and_each_host_reads_the_fed_rows(tmp_path):
    sizes, largest = {}, {}
    for rows in (SMALL, LARGE):
        x, y = _data(rows)
        x[:, 0] = np.arange(rows)  # the row's number travels in feature 0
        train = numpy_input_fn({"x": x}, y, batch_size=64, shuffle=False, num_epochs=None)
        evaluate = numpy_input_fn({"x": x}, y, batch_size=64, shuffle=False, num_epochs=1)
        with faketpu.faked_tpu_system(hosts=2) as tpu:
            tpushim.patch(tpu=tpu.master, iterations_per_loop=4)
            est = tf.keras.estimator.model_to_estimator(
                keras_model=_model(), model_dir=str(tmp_path / str(rows))
            )
            tpushim.unpatch()
            built = {"train": tpu.build(lambda: est.train(train, steps=8))}
            built["evaluate"] = tpu.build(lambda: est.evaluate(evaluate))
        graph_defs = {event: b.graph.as_graph_def() for event, b in built.items()}
        sizes[rows] = {event: g.ByteSize() for event, g in graph_defs.items()}
        largest[rows] = max(_largest_constant(g) for g in graph_defs.values())
        # Every row counted without a constant holding it: the evaluation's steps from the input.
        assert built["evaluate"].eval_steps == -(-rows // 64)
        # Each host's pipeline, fed the arrays where it starts, reads its share of the first
        # global batch: together, stock's first batch.
        shares = [
            [
                int(i)
                for piece in built["train"].host_input(h, tpu.cores_per_host)
                for i in piece[0][:, 0]
            ]
            for h in range(tpu.num_hosts)
        ]
        assert sorted(shares[0] + shares[1]) == list(range(64)), shares
    for event in ("train", "evaluate"):
        assert abs(sizes[LARGE][event] - sizes[SMALL][event]) < GRAPH_SLACK, sizes
    assert largest[LARGE] < LARGE, largest


# --- the feed reaches a pipeline on another task ------------------------------------------------


@pytest.fixture(scope="module")
def grpc_target():
    """A TensorFlow server on loopback in this process (job 'localhost'), for the whole module:
    a session to its grpc:// target runs through the distributed master and worker, as a session
    to a TPU node's host does."""
    return tf.distribute.Server.create_local_server().target


def _remote_rows(target, x):
    """Rows of numpy_input_fn(x) read through a MonitoredSession on ``target`` from a pipeline
    placed on the server's CPU, initialised by Estimator's initializer hook, fed by tpushim."""
    fn = numpy_input_fn(x, x[:, 0], batch_size=8, shuffle=False, num_epochs=1)
    with tf.Graph().as_default():
        with tf.device("/job:localhost/replica:0/task:0/device:CPU:0"):
            dataset = _source.call_and_recover(fn, ModeKeys.TRAIN, {}, None)
            iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
            element = iterator.get_next()
        initializer_hook = _tfprivate.estimator.dataset_initializer_hook_classes()[0](iterator)
        hooks = _arrays.feeding_hooks([initializer_hook])
        creator = tf.compat.v1.train.ChiefSessionCreator(master=target)
        read = []
        with tf.compat.v1.train.MonitoredSession(creator, hooks=hooks) as session:
            while not session.should_stop():
                read.append(session.run(element)[0])
    return np.concatenate(read)


@pytest.mark.slow  # starts a TensorFlow server
def test_the_arrays_reach_a_pipeline_on_a_remote_task(grpc_target):
    x = np.arange(50 * 3, dtype=np.float32).reshape(50, 3)
    np.testing.assert_array_equal(_remote_rows(grpc_target, x[1:]), x[1:])  # unaligned


@pytest.mark.slow  # starts a TensorFlow server
def test_a_feed_too_large_for_one_remote_run_is_a_clear_error(grpc_target, monkeypatch):
    # gRPC aborts the process on a request over 2 GB: tpushim raises first.
    monkeypatch.setattr(_arrays, "REMOTE_FEED_LIMIT", 100)
    with pytest.raises(_errors.ConversionError, match=r"at most 2 GB.*TPU VM.*TFRecord"):
        _remote_rows(grpc_target, np.zeros((50, 3), np.float32))
