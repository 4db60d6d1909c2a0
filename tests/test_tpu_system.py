"""Rung 2, higher: TPUEstimator's whole TPU graph for a faked TPU system of 1 and 2 hosts x 8 cores.

Nothing runs on a TPU: the converted estimator's train/evaluate/predict (and train_and_evaluate)
build everything a TPU system would receive, up to the session. The tests assert on that graph:
replication, static infeed shapes, cross-replica sums, outfeed, the evaluation step count, and
each host's input pipeline, which runs on CPU on a TPU host too and so is run here.
"""

import socket
import time

import numpy as np
import pytest
import replicas
import tensorflow as tf
import tfcases

import tpushim
from tpushim._preflight import faketpu

pytestmark = pytest.mark.slow  # trains estimators or runs scripts: outside the fast tier

N = 100  # not a multiple of the global batch: the last eval batch is partial
GLOBAL = 64
ITERATIONS = 4


def _ids_data(n=N):
    x, y = tfcases.data(n=n)
    x[:, 0] = np.arange(n)  # the example's id travels in feature 0
    return x, y


def _convert(tpu, tmp_path):
    tpushim.patch(tpu=tpu.master, iterations_per_loop=ITERATIONS)
    try:
        return tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(), model_dir=str(tmp_path)
        )
    finally:
        tpushim.unpatch()


# Legacy input styles; each returns global batches of GLOBAL (the last one short when finite).
def dataset_style(x, y, repeat=False, drop_remainder=False):
    def input_fn():
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        return (ds.repeat() if repeat else ds).batch(GLOBAL, drop_remainder=drop_remainder)

    return input_fn


def iterator_style(x, y, repeat=False):
    def input_fn():
        ds = tf.compat.v1.data.Dataset.from_tensor_slices(({"hidden_input": x}, y))
        return (ds.repeat() if repeat else ds).batch(GLOBAL).make_one_shot_iterator().get_next()

    return input_fn


def numpy_style(x, y):
    return lambda: (x[:GLOBAL], y[:GLOBAL])  # stock feeds these same values every step


def _types(build, op_type):
    return len(build.nodes(op_type))


def _sums(build):
    """What the train step's cross-replica sums are for (see replicas.cross_replica_sums)."""
    return replicas.cross_replica_sums(n.name for n in build.nodes("CrossReplicaSum"))


def _assert_replicated(build, tpu):
    metadata = build.nodes("TPUReplicateMetadata")
    assert len(metadata) == 1 and metadata[0].attr["num_replicas"].i == tpu.num_cores
    # Results come back through the outfeed, one dequeue per core on the host side.
    assert _types(build, "OutfeedEnqueueTuple") >= 1
    assert _types(build, "OutfeedDequeueTuple") >= tpu.num_cores


@pytest.mark.parametrize("hosts", [1, 2])
def test_train_graph(tmp_path, hosts):
    x, y = _ids_data()
    with faketpu.faked_tpu_system(hosts=hosts) as tpu:
        est = _convert(tpu, tmp_path)
        assert est.config.tpu_config.iterations_per_loop == ITERATIONS
        build = tpu.build(lambda: est.train(dataset_style(x, y, repeat=True), steps=2 * ITERATIONS))
    _assert_replicated(build, tpu)
    per_core = GLOBAL // tpu.num_cores
    # One infeed enqueue per core, each sending one static per-core batch.
    assert build.infeed_shapes() == [[[per_core, 4], [per_core, 1]]] * tpu.num_cores
    # Gradients averaged across cores: one all-reduce per trainable variable (2 Dense layers);
    # one more sums the cores' losses into the global batch's, the loss the step reports.
    assert _sums(build) == {"gradient": 4, "reported loss": 1, "loss totals": 0}
    # Each host reads a distinct part of the input.
    seen = [
        [int(i) for batch in build.host_input(h, max_batches=8) for i in batch[0][:, 0]]
        for h in range(hosts)
    ]
    for ids in seen:
        assert len(ids) == 8 * per_core
    if hosts == 2:
        assert not set(seen[0]) & set(seen[1])


def _real_ids(batch):
    """The example ids of the real (weight 1) rows of one padded eval batch."""
    features, weight = batch[0], batch[1]
    return [int(i) for i, w in zip(features[:, 0], weight) if w == 1]


def _assert_eval_input(build, tpu, n, steps):
    """Each host feeds steps x cores_per_host per-core batches; step s's global batch holds
    exactly stock's s-th batch (examples s*GLOBAL ...), so every example is evaluated once."""
    assert build.eval_steps == steps
    per_core = GLOBAL // tpu.num_cores
    hosts = [
        build.host_input(h, max_batches=steps * tpu.cores_per_host) for h in range(tpu.num_hosts)
    ]
    for batches in hosts:
        assert len(batches) == steps * tpu.cores_per_host  # never runs dry before the last step
        assert all(b[0].shape == (per_core, 4) for b in batches)
    every = []
    for step in range(steps):
        cores = slice(step * tpu.cores_per_host, (step + 1) * tpu.cores_per_host)
        ids = sorted(i for batches in hosts for batch in batches[cores] for i in _real_ids(batch))
        assert ids == list(range(step * GLOBAL, min(n, (step + 1) * GLOBAL)))
        every += ids
    assert every == list(range(n))


@pytest.mark.parametrize("hosts", [1, 2])
@pytest.mark.parametrize("style,n", [("dataset", N), ("dataset", 2 * GLOBAL + 1), ("iterator", N)])
def test_evaluate_graph(tmp_path, hosts, style, n):
    x, y = _ids_data(n)
    input_fn = dataset_style(x, y) if style == "dataset" else iterator_style(x, y)
    with faketpu.faked_tpu_system(hosts=hosts) as tpu:
        est = _convert(tpu, tmp_path)
        build = tpu.build(lambda: est.evaluate(input_fn))
    _assert_replicated(build, tpu)
    per_core = GLOBAL // tpu.num_cores
    # features, padding weight, labels: static per-core shapes on every core
    assert build.infeed_shapes() == [[[per_core, 4], [per_core], [per_core, 1]]] * tpu.num_cores
    assert (
        _types(build, "CrossReplicaSum") == 1
    )  # the eval loss: (sum, count) of the one output, over all cores
    _assert_eval_input(build, tpu, n, steps=-(-n // GLOBAL))


def test_evaluate_steps_beyond_the_input_are_capped(tmp_path):
    """EvalSpec's default steps=100 on a 2-batch set: stock stops at the end of the input; a TPU
    cannot, so tpushim runs the batches the input holds (padding-only steps would skew the loss)."""
    x, y = _ids_data()
    with faketpu.faked_tpu_system() as tpu:
        est = _convert(tpu, tmp_path)
        assert tpu.build(lambda: est.evaluate(dataset_style(x, y), steps=100)).eval_steps == 2
        assert tpu.build(lambda: est.evaluate(dataset_style(x, y), steps=1)).eval_steps == 1
        # A repeating input holds no end: the given steps are run; without steps, a clear error
        # (iterator tensors included: their Dataset keeps its cardinality, nothing counts forever).
        assert (
            tpu.build(lambda: est.evaluate(dataset_style(x, y, repeat=True), steps=3)).eval_steps
            == 3
        )
        assert (
            tpu.build(lambda: est.evaluate(iterator_style(x, y, repeat=True), steps=3)).eval_steps
            == 3
        )
        with pytest.raises(
            tpushim.ConversionError, match="needs `steps` when the input repeats forever"
        ):
            est.evaluate(iterator_style(x, y, repeat=True))


@pytest.mark.parametrize("style", ["drop_remainder", "numpy", "iterator"])
def test_train_and_evaluate_input_styles(tmp_path, style):
    x, y = _ids_data()
    train_fn = {
        "drop_remainder": dataset_style(x, y, repeat=True, drop_remainder=True),
        "numpy": numpy_style(x, y),
        "iterator": iterator_style(x, y, repeat=True),
    }[style]
    with faketpu.faked_tpu_system() as tpu:
        est = _convert(tpu, tmp_path)
        train = tpu.build(lambda: est.train(train_fn, steps=ITERATIONS))
        evaluate = tpu.build(lambda: est.evaluate(train_fn, steps=2))
    for build in (train, evaluate):
        _assert_replicated(build, tpu)
        assert [shape[0] for shape in build.infeed_shapes()] == [[8, 4]] * 8
    assert evaluate.eval_steps == 2
    ids = [int(i) for batch in train.host_input(0, max_batches=8) for i in batch[0][:, 0]]
    assert ids == list(range(GLOBAL))  # the first global batch, split over the 8 cores in order


@pytest.mark.parametrize("hosts", [1, 2])
def test_predict_graph(tmp_path, hosts):
    x, _ = _ids_data()
    predict_fn = lambda: tf.data.Dataset.from_tensor_slices(x).batch(GLOBAL)
    with faketpu.faked_tpu_system(hosts=hosts) as tpu:
        est = _convert(tpu, tmp_path)
        # TPUEstimator refuses predict() per host on a pod: tpushim has host 0 feed every core
        # (SLICED; what each core is fed: tests/test_pods.py).
        build = tpu.build(lambda: est.predict(predict_fn))
    _assert_replicated(build, tpu)
    # features, padding weight, and TPUEstimator's stopping signal for the end of the input
    shapes = build.infeed_shapes()
    per_core = GLOBAL // tpu.num_cores
    assert len(shapes) == tpu.num_cores
    assert all(s[:2] == [[per_core, 4], [per_core]] for s in shapes)
    assert _types(build, "CrossReplicaSum") == 0


def test_input_fn_called_once_per_input_pipeline(tmp_path):
    """On a TPU the input_fn is called as TPUEstimator calls it, once per host's pipeline (the
    first of them made before the model, to read the batch size): no extra call."""
    x, y = _ids_data()
    calls = []

    def input_fn(repeat):
        calls.append(1)
        return dataset_style(x, y, repeat=repeat)()

    with faketpu.faked_tpu_system(hosts=2) as tpu:
        est = _convert(tpu, tmp_path)
        tpu.build(lambda: est.train(lambda: input_fn(True), steps=ITERATIONS))
        assert len(calls) == 2
        tpu.build(lambda: est.evaluate(lambda: input_fn(False)))
        assert len(calls) == 4


# --- tf.estimator.train_and_evaluate with a TPU configured ----------------------------------------


def _specs(x, y):
    return (
        tf.estimator.TrainSpec(dataset_style(x, y, repeat=True), max_steps=2 * ITERATIONS),
        tf.estimator.EvalSpec(dataset_style(x, y)),
    )


@pytest.mark.parametrize("own_config", [False, True], ids=["tpushim-config", "users-tpu-config"])
def test_train_and_evaluate_runs_the_tpu_path(tmp_path, own_config):
    """train_and_evaluate trains locally against the TPU master (no in-process gRPC server on the
    TPU's address, which the distributed-worker path starts and which then fails), whether tpushim
    built the TPU RunConfig or the user passed a tpu_config.RunConfig(cluster=resolver)."""
    x, y = _ids_data()
    with faketpu.faked_tpu_system() as tpu:
        if own_config:
            from tensorflow_estimator.python.estimator.tpu import tpu_config

            config = tpu_config.RunConfig(
                cluster=tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu.master),
                tpu_config=tpu_config.TPUConfig(iterations_per_loop=ITERATIONS),
            )
            tpushim.patch()
            est = tf.keras.estimator.model_to_estimator(
                keras_model=tfcases.sequential(), model_dir=str(tmp_path), config=config
            )
            tpushim.unpatch()
            assert config.cluster_spec  # the user's RunConfig is left as it is
        else:
            est = _convert(tpu, tmp_path)
        build = tpu.build(lambda: tf.estimator.train_and_evaluate(est, *_specs(x, y)))
    _assert_replicated(build, tpu)
    assert _sums(build) == {"gradient": 4, "reported loss": 1, "loss totals": 0}
    # The session still reaches the TPU worker.
    assert est.config.master == tpu.master
    assert [job.name for job in est.config.session_config.cluster_def.job] == ["worker"]


def test_train_and_evaluate_unreachable_tpu_is_a_no_tpu_error(tmp_path):
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tpushim.patch(tpu=f"grpc://127.0.0.1:{port}")
    est = tf.keras.estimator.model_to_estimator(
        keras_model=tfcases.sequential(), model_dir=str(tmp_path)
    )
    tpushim.unpatch()
    x, y = _ids_data()
    start = time.monotonic()
    with pytest.raises(tpushim.NoTPUError, match="is not reachable"):
        tf.estimator.train_and_evaluate(est, *_specs(x, y))
    assert time.monotonic() - start < 10
    assert tf.train.latest_checkpoint(str(tmp_path)) is None


def test_faked_tpu_is_loopback_only():
    with (
        pytest.raises(ValueError, match="loopback only"),
        faketpu.faked_tpu_system("grpc://10.0.0.2:8470"),
    ):
        pass
