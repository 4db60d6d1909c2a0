"""Rung 2, higher: TPUEstimator's whole TPU graph for a faked TPU system of 1 and 2 hosts x 8 cores.

Nothing runs on a TPU: the converted estimator's train/evaluate/predict (and train_and_evaluate)
build everything a TPU system would receive, up to the session. The tests assert on that graph:
replication, static infeed shapes, cross-replica sums, outfeed, the evaluation step count, and
each host's input pipeline, which runs on CPU on a TPU host too and so is run here.
"""

import contextlib
import time

import numpy as np
import pytest
import replicas
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

import tpushim

faketpu = tpuestimator_import("tpushim._preflight.faketpu")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tpuestimator,
]  # trains estimators or runs scripts: outside the fast tier

N = 100  # not a multiple of the global batch: the last eval batch is partial
GLOBAL = 64
ITERATIONS = 4


def _ids_data(n=N):
    x, y = tfcases.data(n=n)
    x[:, 0] = np.arange(n)  # the example's id travels in feature 0
    return x, y


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
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
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
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
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
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
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
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
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
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
        # TPUEstimator refuses predict() per host on a pod: tpushim has host 0 feed every core
        # (SLICED; what each core is fed: tests/proofs/test_pods.py).
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
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
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
            est = tfcases.convert(tmp_path, patch={}, config=config)
            assert config.cluster_spec  # the user's RunConfig is left as it is
        else:
            est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
        build = tpu.build(lambda: tf.estimator.train_and_evaluate(est, *_specs(x, y)))
    _assert_replicated(build, tpu)
    assert _sums(build) == {"gradient": 4, "reported loss": 1, "loss totals": 0}
    # The session still reaches the TPU worker.
    assert est.config.master == tpu.master
    assert [job.name for job in est.config.session_config.cluster_def.job] == ["worker"]


def test_train_and_evaluate_unreachable_tpu_is_a_no_tpu_error(tmp_path):
    # Converted while the TPU answers; gone when the training starts (its port closed).
    with faketpu.faked_tpu_system() as tpu:
        tpushim.patch(tpu=tpu.master)
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


def test_faked_systems_overlapping_without_nesting_each_answer_and_leave_nothing_behind():
    """A starts, B starts, A ends, B ends (as two threads may): B still answers for its master
    after A ended, and TensorFlow's own query and session start are back afterwards."""
    from tensorflow.python.tpu import tpu_system_metadata
    from tensorflow.python.training import monitored_session

    creator_class = monitored_session._MonitoredSession._CoordinatedSessionCreator
    originals = (tpu_system_metadata._query_tpu_system_metadata, creator_class.create_session)
    a_stack, b_stack = contextlib.ExitStack(), contextlib.ExitStack()
    a_stack.enter_context(faketpu.faked_tpu_system(cores_per_host=8))
    b = b_stack.enter_context(faketpu.faked_tpu_system(hosts=2, cores_per_host=4))
    a_stack.close()
    try:
        assert tpu_system_metadata._query_tpu_system_metadata(b.master).num_hosts == 2
    finally:
        b_stack.close()
    assert (tpu_system_metadata._query_tpu_system_metadata, creator_class.create_session) == (
        originals
    )


# --- #24: what stock accepts, a TPU is fed -----------------------------------------------------


def _ids_input_fn(n, batch, repeat=False, features_only=False):
    x, y = _ids_data(n)
    x[:, 0] += 1  # ids from 1: a padding row of zeros would show

    def input_fn():
        ds = tf.data.Dataset.from_tensor_slices(x if features_only else (x, y))
        return (ds.repeat() if repeat else ds).batch(batch)

    return input_fn


def _step_rows(batches, cores):
    """Per step: the (id, weight) pairs of the global batch the cores of one host fed."""
    steps = [batches[i : i + cores] for i in range(0, len(batches), cores)]
    return [[(int(f[0]), float(w)) for b in step for f, w in zip(b[0], b[1])] for step in steps]


@pytest.mark.parametrize("hosts", [1, 2])
def test_indivisible_global_batch_is_padded_to_the_cores(tmp_path, hosts, tpushim_log):
    """Global batches of 100 on 8 (16) cores: each step feeds stock's batch of 100, padded to 104
    (112) with zero-weight copies of a real row; logged once per call, never an error."""
    with faketpu.faked_tpu_system(hosts=hosts) as tpu:
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
        build = tpu.build(lambda: est.train(_ids_input_fn(250, 100, repeat=True), steps=4))
    padded = -(-100 // tpu.num_cores) * tpu.num_cores
    per_core = padded // tpu.num_cores
    _assert_replicated(build, tpu)
    assert build.infeed_shapes() == [[[per_core, 4], [per_core], [per_core, 1]]] * tpu.num_cores
    hosts_rows = [
        _step_rows(build.host_input(h, max_batches=3 * tpu.cores_per_host), tpu.cores_per_host)
        for h in range(hosts)
    ]
    real_ids = [1 + i % 250 for i in range(300)]  # stock's batches of repeat().batch(100)
    for step in range(3):
        rows = [row for host in hosts_rows for row in host[step]]
        assert len(rows) == padded
        assert sorted(i for i, w in rows if w == 1) == sorted(
            real_ids[100 * step : 100 * (step + 1)]
        )
        padding = [i for i, w in rows if w == 0]
        assert len(padding) == padded - 100 and set(padding) <= set(real_ids)  # real rows' copies
    message = f"global batch size 100 does not divide among {tpu.num_cores} TPU cores"
    assert tpushim_log.text.count(message) == 1
    assert f"each of its batches is padded to {padded} rows" in tpushim_log.text


def test_indivisible_eval_and_predict_batches_see_every_example_once(tmp_path):
    """Evaluation in batches of 50 and prediction in batches of 20 on 8 cores (56 and 24 a step):
    every example once, the padding rows copies of real ones weighted 0; after the input's end a
    host reads its last batch again, weighted 0 (a TPU runs a fixed number of steps)."""
    with faketpu.faked_tpu_system() as tpu:
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
        evaluate = tpu.build(lambda: est.evaluate(_ids_input_fn(120, 50)))
        predict = tpu.build(lambda: est.predict(_ids_input_fn(50, 20, features_only=True)))
    assert evaluate.eval_steps == 3
    assert evaluate.infeed_shapes() == [[[7, 4], [7], [7, 1]]] * 8
    steps = _step_rows(evaluate.host_input(0, max_batches=5 * 8), 8)
    assert [sorted(i for i, w in step if w) for step in steps[:3]] == [
        list(range(1, 51)),
        list(range(51, 101)),
        list(range(101, 121)),
    ]
    assert all(i in range(101, 121) for step in steps[2:] for i, _ in step)  # no zeros
    assert [sum(w for _, w in step) for step in steps[3:]] == [0, 0]  # fillers: weight 0
    assert predict.infeed_shapes()[0][:2] == [[3, 4], [3]]
    # TPUEstimator's own stopping signal (the last input) ends prediction: the batches before it.
    batches = [b for b in predict.host_input(0) if not b[-1].any()]
    assert [i for step in _step_rows(batches, 8) for i, w in step if w] == list(range(1, 51))


def _lookup_input_fn(n, batch):
    """Words looked up in the input_fn's own graph, outside any Dataset.map: the Dataset holds
    the looked-up ids."""
    words = ["good", "bad", "fine", "poor"]

    def input_fn():
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(words, tf.constant([1.0, 2.0, 3.0, 4.0])), 0.0
        )
        texts = [" ".join(words[(i + k) % 4] for k in range(4)) for i in range(n)]
        ids = tf.sparse.to_dense(table.lookup(tf.compat.v1.string_split(tf.constant(texts))))
        ids = tf.ensure_shape(ids, [n, 4]) + tf.range(n, dtype=tf.float32)[:, None] * 10
        return tf.data.Dataset.from_tensor_slices((ids, np.zeros([n, 1], "int64"))).batch(batch)

    return input_fn


@pytest.mark.parametrize("hosts", [1, 2])
def test_lookup_table_in_the_input_fn_graph_feeds_every_host(tmp_path, hosts):
    """Each host's table is initialised before its dataset (as the Scaffold does it), and the
    evaluation's length is read with the table initialised: every looked-up row once."""
    with faketpu.faked_tpu_system(hosts=hosts) as tpu:
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS))
        build = tpu.build(lambda: est.evaluate(_lookup_input_fn(100, GLOBAL)))
    assert build.eval_steps == 2
    rows = [
        row
        for h in range(hosts)
        for batch in build.host_input(h, max_batches=2 * tpu.cores_per_host)
        for row, weight in zip(batch[0], batch[1])
        if weight
    ]
    assert sorted(int(row[0]) // 10 for row in rows) == list(range(100))
    assert all(row[0] % 10 in (1, 2, 3, 4) for row in rows)  # looked up: no default value


def _images(n, channels):
    """JPEG bytes of n images of odd sizes."""
    rng = np.random.RandomState(0)
    return [
        tf.io.encode_jpeg(rng.randint(0, 255, (20 + i % 5, 24, channels)).astype("uint8")).numpy()
        for i in range(n)
    ]


def _image_model():
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((16, 16, 3), name="image")
    base = tf.keras.Sequential(  # a nested base, as a Keras application is
        [tf.keras.layers.Conv2D(2, 4, strides=4, input_shape=(16, 16, 3))], name="base"
    )
    outputs = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(base(inputs)))
    model = tf.keras.Model(inputs, outputs)
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    return model


def _decoded_input_fn(images, repeat=True):
    def input_fn():
        ds = tf.data.Dataset.from_tensor_slices((images, np.zeros([len(images), 1], "float32")))
        ds = ds.map(
            lambda jpeg, y: (
                {"image": tf.image.resize(tf.io.decode_jpeg(jpeg), [16, 16]) / 255.0},
                y,
            )
        )
        return (ds.repeat() if repeat else ds).batch(16)

    return input_fn


def test_shape_the_model_declares_is_given_to_the_feature(tmp_path, tpushim_log):
    """decode_jpeg without channels: (16, 16, ?) in the pipeline, (16, 16, 3) in the model's
    Input: fed with the model's shape; an element of another shape is an error naming both."""
    with faketpu.faked_tpu_system() as tpu:
        est = tfcases.convert(tmp_path, _image_model, patch={"tpu": tpu.master})
        build = tpu.build(lambda: est.train(_decoded_input_fn(_images(20, 3)), steps=4))
        assert build.infeed_shapes()[0] == [[2, 16, 16, 3], [2, 1]]
        assert (
            "input shapes completed from the model's inputs: feature 'image' (None, 16, 16, 3)"
            in (tpushim_log.text)
        )
        assert build.host_input(0, max_batches=8)[0][0].shape == (2, 16, 16, 3)
        gray = tpu.build(lambda: est.train(_decoded_input_fn(_images(20, 1)), steps=4))
        with pytest.raises(tf.errors.InvalidArgumentError) as info:
            gray.host_input(0, max_batches=1)
    assert (
        "tpushim: feature image has another shape than (None, 16, 16, 3), which the model input "
        "image declares" in str(info.value)
    )
    assert "This batch has shape] [16 16 16 1]" in str(info.value)


def test_faked_topology_is_a_cloud_tpus():
    """The TPU system query's topology (TPUEstimator asks for it with model parallelism): a
    v2-8/v3-8's mesh and core coordinates, as TPUEstimator logs them on one; 2 and 4 hosts tile it."""
    v3_8 = faketpu.topology(1, 8)
    assert v3_8.mesh_shape.tolist() == [2, 2, 1, 2]
    assert v3_8.device_coordinates.tolist() == [
        [[0, 0, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0], [1, 0, 0, 1]]
        + [[0, 1, 0, 0], [0, 1, 0, 1], [1, 1, 0, 0], [1, 1, 0, 1]]
    ]
    assert faketpu.topology(2, 8).mesh_shape.tolist() == [4, 2, 1, 2]
    assert faketpu.topology(4, 8).mesh_shape.tolist() == [4, 4, 1, 2]
    with faketpu.faked_tpu_system(hosts=2) as tpu:  # answered serialized, as a TPU's is
        serialized = tpu.answer(query_topology=True).topology
    assert tf.tpu.experimental.Topology(serialized=serialized).num_tasks == 2


@pytest.mark.parametrize("hosts", [1, 2])
@pytest.mark.parametrize("cores_per_replica", [1, 2])
def test_model_parallelism_builds_on_the_faked_system(tmp_path, hosts, cores_per_replica):
    """``TPUConfig(num_cores_per_replica=...)`` (valid on a TPU): the faked system answers the
    topology query, and TPUEstimator builds its replicas over the device assignment."""
    from tensorflow_estimator.python.estimator.tpu import tpu_config

    x, y = _ids_data()
    config = tpu_config.RunConfig(
        tpu_config=tpu_config.TPUConfig(num_cores_per_replica=cores_per_replica)
    )
    with faketpu.faked_tpu_system(hosts=hosts) as tpu:
        est = tfcases.convert(tmp_path, patch=tfcases.on_faked_tpu(tpu, ITERATIONS), config=config)
        build = tpu.build(lambda: est.train(dataset_style(x, y, repeat=True), steps=ITERATIONS))
    replicas_ = tpu.num_cores // cores_per_replica
    (metadata,) = build.nodes("TPUReplicateMetadata")
    assert metadata.attr["num_replicas"].i == replicas_
    assert metadata.attr["num_cores_per_replica"].i == cores_per_replica
    assert list(metadata.attr["topology"].s) != []  # the device assignment's topology
    assert (
        build.infeed_shapes() == [[[GLOBAL // replicas_, 4], [GLOBAL // replicas_, 1]]] * replicas_
    )
