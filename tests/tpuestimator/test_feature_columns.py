"""Feature columns inside the model (``DenseFeatures``), on a TPU: the weight-free part runs in the
input pipeline, the embedding weights stay in the model (tpushim/_feature_columns.py).

Each family of columns -- vocabulary list and file, hash bucket, crossed, bucketized, identity,
weighted, indicator, embedding (mean, sqrtn, sum, max_norm), numeric -- is compared with stock:
cpu mode (weights, evaluate() with a short last batch, predict(), the exported SavedModel fed raw
features), TPUEstimator's graph on a faked 8-core TPU system (no lookup, cross or string in the
TPU computation; the host's input pipeline runs), and 8 emulated shards with numbers. A layer
whose lookups feed a weight tpushim cannot move is refused, naming the layer and the column.
"""

import logging
import os

import numpy as np
import pytest

from tpushim import _versions

if _versions.uses_own_estimator():
    pytest.skip("the TPUEstimator path exists on TensorFlow <= 2.15", allow_module_level=True)

import replicas
import tensorflow as tf
import tfcases

import tpushim
from tpushim import _feature_columns
from tpushim._errors import ConversionError
from tpushim._preflight import faketpu

pytestmark = pytest.mark.slow  # trains estimators: outside the fast tier

fc = tf.feature_column
N = 72
RAW = ("chas", "rad", "town", "zone", "town_w", "rm", "age")
#: Ops with no XLA kernel the feature columns make (what the preflight used to name).
HOST_OPS = {
    "LookupTableFindV2",
    "SparseCross",
    "SparseCrossHashed",
    "StringToHashBucketFast",
    "SparseFillEmptyRows",
    "SparseSegmentMean",
    "SparseSegmentSum",
    "SparseSegmentSqrtN",
}


def _data(n=N, seed=3):
    rng = np.random.RandomState(seed)
    features = {
        "rm": rng.uniform(4, 9, [n, 1]).astype("float32"),
        "age": rng.uniform(0, 100, [n, 1]).astype("float32"),
        "chas": rng.choice(["yes", "no"], [n, 1]),
        "rad": rng.choice(["1", "2", "3", "4", "24", "unknown"], [n, 1]),
        "town": rng.choice([f"town{i}" for i in range(12)], [n, 1]),
        "zone": rng.randint(0, 4, [n, 1]).astype("int64"),
        "town_w": rng.uniform(-0.2, 2.0, [n, 1]).astype("float32"),  # weights <= 0 are dropped
    }
    price = features["rm"] * 3 + (features["chas"] == "yes") * 4 - features["age"] / 30
    return features, price.astype("float32")


def _columns(family, vocab_file):
    """One family of feature columns (every family mixes weight-free and embedded columns)."""
    age = fc.bucketized_column(fc.numeric_column("age"), [20.0, 40.0, 60.0, 80.0])
    chas = fc.categorical_column_with_vocabulary_list("chas", ["yes", "no"])
    if family == "vocabulary":
        rad_file = fc.categorical_column_with_vocabulary_file("rad", vocab_file, num_oov_buckets=1)
        towns = fc.categorical_column_with_vocabulary_list("town", [f"town{i}" for i in range(5)])
        return [
            fc.numeric_column("rm"),
            fc.indicator_column(chas),
            fc.embedding_column(rad_file, 3),  # mean
            fc.indicator_column(towns),  # town5... -> -1: no id
            fc.embedding_column(towns, 2, combiner="sqrtn"),  # rows with no id: zeros
        ]
    if family == "hash_crossed":
        town = fc.categorical_column_with_hash_bucket("town", 16)
        return [
            fc.numeric_column("rm"),
            fc.embedding_column(town, 3, combiner="sqrtn"),
            fc.indicator_column(fc.crossed_column([chas, "rad"], 20)),
            fc.embedding_column(fc.crossed_column([age, "chas"], 10), 2, combiner="sum"),
        ]
    if family == "bucketized_identity_weighted":
        town = fc.categorical_column_with_vocabulary_list("town", [f"town{i}" for i in range(8)])
        return [
            age,
            fc.numeric_column("rm"),
            fc.embedding_column(age, 2, max_norm=0.05),
            fc.indicator_column(fc.categorical_column_with_identity("zone", 4)),
            fc.embedding_column(fc.categorical_column_with_identity("zone", 4), 2),
            fc.embedding_column(fc.weighted_categorical_column(town, "town_w"), 2, combiner="sum"),
        ]
    raise ValueError(family)


FAMILIES = ["vocabulary", "hash_crossed", "bucketized_identity_weighted"]


def _vocab_file(tmp_path):
    path = tmp_path / "rad_vocab.txt"
    path.write_text("1\n2\n3\n4\n24\n")
    return str(path)


def _raw_inputs():
    """A fresh Keras session, seeded, and one Input per raw feature (its dtype), by name."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    features, _ = _data(1)
    return {
        key: tf.keras.Input((1,), name=key, dtype=tf.as_dtype(value.dtype))
        for key, value in features.items()
    }


def _model(family, vocab_file, optimizer=None):
    """A Boston-housing regressor: raw features in, DenseFeatures first, as public scripts write it."""
    inputs = _raw_inputs()
    # "+v1": tf.compat.v1.keras.layers.DenseFeatures (variable scopes), as TF1-style scripts use.
    family, v1 = family.removesuffix("+v1"), family.endswith("+v1")
    layer = tf.compat.v1.keras.layers.DenseFeatures if v1 else tf.keras.layers.DenseFeatures
    x = layer(_columns(family, vocab_file))(inputs)
    x = tf.keras.layers.Dense(6, activation="relu")(x)
    out = tf.keras.layers.Dense(1, name="price")(x)
    model = tf.keras.Model(inputs, out)
    model.compile(optimizer or tf.keras.optimizers.Adam(0.05), "mse", metrics=["mae"])
    return model


def _dataset(rows, batch, repeat=False, labels=True, scale=1.0):
    """``repeat="first"``: repeated before batching (no short batch); ``scale``: the prices' unit
    (Ftrl's accumulators, sums of squared gradients, stay within float32's resolution of 1e-5 at
    a tenth)."""
    features, price = _data()
    features = {k: v[rows] for k, v in features.items()}
    price = price * np.float32(scale)
    ds = tf.data.Dataset.from_tensor_slices((features, price[rows]) if labels else features)
    if repeat == "first":
        return ds.repeat().batch(batch)
    ds = ds.batch(batch)
    return ds.repeat() if repeat else ds


def _serve(estimator, export_dir, features, output="price"):
    """The exported SavedModel, fed raw features: its predictions."""

    def receiver():
        raw = {
            k: tf.compat.v1.placeholder(tf.as_dtype(v.dtype), [None, 1], name=k)
            for k, v in features.items()
        }
        return tf.estimator.export.ServingInputReceiver(raw, raw)

    path = estimator.export_saved_model(str(export_dir), receiver)
    loaded = tf.saved_model.load(path)
    serve = loaded.signatures["serving_default"]
    return serve(**{k: tf.constant(v) for k, v in features.items()})[output].numpy()


@pytest.mark.parametrize("family", [*FAMILIES, "hash_crossed+v1"])
def test_cpu_mode_equals_stock_and_moves_the_weight_free_part(tmp_path, family, caplog):
    vocab = _vocab_file(tmp_path)
    caplog.set_level(logging.INFO, logger="tpushim")
    stock, shim = tfcases.compare(
        tmp_path,
        lambda: _model(family, vocab),
        lambda: _dataset(np.arange(48), 16, repeat=True),
        lambda: _dataset(np.arange(48, 70), 16),  # a short last batch: padded, weighted out
        lambda: _dataset(np.arange(48, 58), 4, labels=False),
        steps=6,
    )
    assert "feature columns: layer 'dense_features'" in caplog.text  # the conversion line
    # What the TPU would run (the model) holds none of the lookups: they are in the input's map.
    graph = tf.compat.v1.GraphDef()
    from google.protobuf import text_format

    with open(os.path.join(shim[0].model_dir, "graph.pbtxt")) as f:
        text_format.Parse(f.read(), graph)
    in_model = {n.op for n in graph.node if n.name.startswith("dense_features/")}
    assert in_model and not in_model & HOST_OPS, in_model
    # Exported, both take the raw features and serve the same predictions.
    features, _ = _data()
    rows = {k: v[:9] for k, v in features.items()}
    np.testing.assert_allclose(
        _serve(shim[0], tmp_path / "shim_export", rows),
        _serve(stock[0], tmp_path / "stock_export", rows),
        atol=tfcases.TOL,
        rtol=0,
    )


def test_negative_control_ids_with_no_weight_counted_differ_from_stock(tmp_path, monkeypatch):
    """The comparison sees what stock drops: rows whose town is in no vocabulary (id -1, weight
    0 in the block) counted as id 0 fail it."""
    vocab = _vocab_file(tmp_path)
    own = _feature_columns._embedded

    def counting_all(column, table, ids, weights):
        return own(column, table, ids, tf.ones_like(weights))

    monkeypatch.setattr(_feature_columns, "_embedded", counting_all)
    with pytest.raises(AssertionError):
        tfcases.compare(
            tmp_path,
            lambda: _model("vocabulary", vocab),
            lambda: _dataset(np.arange(48), 16, repeat=True),
            steps=2,
        )


def _tpu_computation_ops(build):
    """Op types of the TPU computation: the nodes TPU replication marks, and the functions they
    run (the training loop's body), through every function those call."""
    graph = build.graph.as_graph_def()
    functions = {f.signature.name: f for f in graph.library.function}
    nodes = [n for n in graph.node if "_tpu_replicate" in n.attr]
    ops, seen = set(), set()
    while nodes:
        node = nodes.pop()
        ops.add(node.op)
        for attr in node.attr.values():
            name = attr.func.name
            if name in functions and name not in seen:
                seen.add(name)
                nodes.extend(functions[name].node_def)
    return ops


@pytest.mark.parametrize("family", FAMILIES)
def test_faked_tpu_system_gets_ids_not_strings_and_no_lookups(tmp_path, family):
    vocab = _vocab_file(tmp_path)
    with faketpu.faked_tpu_system() as tpu:
        est = tfcases.convert(
            tmp_path / "model", lambda: _model(family, vocab), patch=tfcases.on_faked_tpu(tpu, 2)
        )
        train = tpu.build(
            lambda: est.train(lambda: _dataset(np.arange(48), 16, repeat=True), steps=4)
        )
        predict = tpu.build(
            lambda: list(est.predict(lambda: _dataset(np.arange(48, 58), 16, labels=False)))
        )
    for build in (train, predict):
        ops = _tpu_computation_ops(build)
        assert "MatMul" in ops and not ops & HOST_OPS, ops & HOST_OPS
        for node in build.nodes("InfeedEnqueueTuple"):
            assert tf.string not in [tf.as_dtype(t) for t in node.attr["dtypes"].list.type]
        assert all(None not in shape for shapes in build.infeed_shapes() for shape in shapes)
    assert len(train.nodes("TPUReplicateMetadata")) == 1
    # The host runs the lookups: each core's ids are those of its rows (2 rows per core).
    batches = train.host_input(0, max_batches=8)
    assert len(batches) == 8 and all(b[0].shape[0] == 2 for b in batches)


def _host_batch(model, features, labels):
    """The global batch as the input pipeline hands it to the TPU: blocks, not raw features."""
    split = _feature_columns.plan(model)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        host = split.host(tf.nest.map_structure(tf.constant, features))
        sess.run(tf.compat.v1.tables_initializer())
        return sess.run(host), labels


@pytest.mark.parametrize("family", FAMILIES)
def test_eight_shards_train_like_stock_on_the_global_batch(tmp_path, family):
    vocab = _vocab_file(tmp_path)
    features, labels = _data(replicas.GLOBAL * 2)
    build = lambda: _model(family, vocab, tf.keras.optimizers.legacy.Adam(0.05))
    _eight_shards(tmp_path, build, features, labels, steps=2)


def _eight_shards(tmp_path, build, features, labels, steps):
    """Stock on global batches of ``features``, and 8 emulated shards fed the host's blocks of
    the same batches: every replica's variables (weights, optimizer slots) equal stock's."""
    model = build()
    init = model.get_weights()
    stock = tf.compat.v1.keras.estimator.model_to_estimator(
        keras_model=model,
        model_dir=str(tmp_path / "stock"),
        config=tf.estimator.RunConfig(tf_random_seed=7),
    )
    stock.train(
        lambda: tf.data.Dataset.from_tensor_slices((features, labels)).batch(replicas.GLOBAL),
        steps=steps,
    )
    ref = tfcases.checkpoint_values(stock.model_dir)
    assert ref.pop("global_step") == steps
    emu_model = replicas.tpu_model(build)
    rows = lambda s: {k: v[s] for k, v in features.items()}
    first = _host_batch(emu_model, rows(slice(0, replicas.GLOBAL)), labels[: replicas.GLOBAL])
    emu = replicas.Emulation(emu_model, tf.estimator.ModeKeys.TRAIN, first)
    try:
        emu.load_weights(init)
        for step in range(steps):
            part = slice(step * replicas.GLOBAL, (step + 1) * replicas.GLOBAL)
            emu.train(_host_batch(emu_model, rows(part), labels[part]))
        names = emu.var_names()
        assert sorted(ref) == sorted(names)
        assert replicas.max_diff(init, [ref[n] for n in emu.weight_names()]) > 1e-2
        want = [ref[n] for n in names]
        for values in emu.sess.run(emu.vars):  # every replica's weights and Adam slots
            for name, got, value in zip(names, values, want):
                np.testing.assert_allclose(
                    got, value, rtol=tfcases.TOL, atol=tfcases.TOL, err_msg=name
                )
    finally:
        emu.close()


class _Scaled(tf.keras.layers.Layer):
    """A trainable layer in front of DenseFeatures: its output feeds a bucketized column."""

    def build(self, shape):
        self.scale = self.add_weight("scale", shape=[], initializer="ones")

    def call(self, x):
        return x * self.scale


def test_lookup_behind_a_trainable_weight_is_refused_naming_the_layer(tmp_path):
    inputs = {"age": tf.keras.Input((1,), name="age")}
    scaled = {"age": _Scaled(name="scaled")(inputs["age"])}
    column = fc.bucketized_column(fc.numeric_column("age"), [20.0, 40.0])
    x = tf.keras.layers.DenseFeatures([column], name="age_features")(scaled)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(x))
    model.compile("sgd", "mse")
    with pytest.raises(
        ConversionError,
        match=r"layer 'age_features'.*reads the output of layer 'scaled', which holds weights "
        r"\('scaled/scale:0'\)",
    ):
        tfcases.convert(tmp_path / "model", model, patch={"mode": "cpu"})
    assert not os.path.exists(tmp_path / "model")  # refused before anything was written


def test_shared_embedding_is_refused_naming_the_layer_and_column(tmp_path):
    with tf.Graph().as_default():  # shared embeddings exist in graph mode only
        chas = fc.categorical_column_with_vocabulary_list("chas", ["yes", "no"])
        rad = fc.categorical_column_with_vocabulary_list("rad", ["yes", "no"])
        shared = fc.shared_embeddings([chas, rad], 2)
        inputs = {k: tf.keras.Input((1,), name=k, dtype=tf.string) for k in ("chas", "rad")}
        x = tf.keras.layers.DenseFeatures(shared, name="shared_features")(inputs)
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(x))
        model.compile("sgd", "mse")
        with pytest.raises(
            ConversionError, match="layer 'shared_features', column 'chas_shared_embedding'"
        ):
            tfcases.convert(tmp_path / "model", model, patch={"mode": "cpu"})
    assert not os.path.exists(tmp_path / "model")


@pytest.mark.parametrize("family", FAMILIES)
def test_preflight_reports_the_move_as_info_and_compiles_the_rest(tmp_path, family):
    """Before, the preflight named the lookups and crosses (xla-unsupported-op) and the string
    features (string-input) as errors; now the step it compiles with XLA is the TPU's."""
    model = _model(family, _vocab_file(tmp_path), tf.keras.optimizers.legacy.Adam(0.05))
    report = tpushim.check(model, lambda: _dataset(np.arange(48), 16, repeat=True))
    found = {(f.code, f.severity, f.where) for f in report.findings}
    assert ("feature-columns-on-host", "info", "layer 'dense_features'") in found, report
    assert not [f for f in report.findings if f.severity == "error"], report
    assert "XLA compile of the training step" in report.checked


def test_preflight_names_the_layer_it_cannot_split(tmp_path):
    inputs = {"age": tf.keras.Input((1,), name="age")}
    scaled = {"age": _Scaled(name="scaled")(inputs["age"])}
    column = fc.bucketized_column(fc.numeric_column("age"), [20.0, 40.0])
    x = tf.keras.layers.DenseFeatures([column], name="age_features")(scaled)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(x))
    model.compile("sgd", "mse")
    report = tpushim.check(model)
    errors = [f for f in report.findings if f.severity == "error"]
    assert [f.code for f in errors] == ["unconvertible-feature-columns"], report
    assert "layer 'age_features'" in errors[0].message


# --- BatchNormalization right after the moved layer (issue 48) ------------------------------------


def _bn_model(vocab_file, optimizer, synchronized=False, activity=False):
    """DenseFeatures (numeric, vocabulary-list and crossed indicators, embeddings), then
    BatchNormalization right after it, then Dense layers, as the Boston-housing scripts write it.
    Momentum 0.5: the moving statistics move visibly in a few steps. ``activity``: an activity
    regularizer on the Dense layer after the normalisation (a loss computed from the moved
    layer's output)."""
    inputs = _raw_inputs()
    x = tf.keras.layers.DenseFeatures(_columns("hash_crossed", vocab_file))(inputs)
    # SyncBatchNormalization: BatchNormalization(synchronized=True) leaves the flag out of its
    # config, so no estimator's clone is synchronized (see test_tpu_emulation.py).
    bn = tf.keras.layers.experimental.SyncBatchNormalization if synchronized else None
    x = (bn or tf.keras.layers.BatchNormalization)(momentum=0.5, name="bn")(x)
    regularizer = tf.keras.regularizers.l2(0.05) if activity else None
    x = tf.keras.layers.Dense(4, activation="relu", activity_regularizer=regularizer)(x)
    out = tf.keras.layers.Dense(1, name="price")(x)
    model = tf.keras.Model(inputs, out)
    model.compile(optimizer, "mse", metrics=["mae"])
    return model


BN_OPTIMIZERS = {
    "ftrl": lambda: tf.keras.optimizers.Ftrl(0.5),
    "adam": lambda: tf.keras.optimizers.Adam(0.05),
}


@pytest.mark.tpuestimator
@pytest.mark.parametrize(
    "optimizer, train_rows, eval_rows, activity",
    [
        ("ftrl", 40, 22, False),  # training's third batch and evaluation's second: padded
        # repeat().batch(), full evaluation: an activity loss over padding is refused in training
        ("adam", 48, 16, True),
        ("ftrl", 48, 16, False),  # full batches only: no padding anywhere
    ],
    ids=["ftrl-short", "adam-activity-full", "ftrl-full"],
)
def test_batchnorm_right_after_the_columns_equals_stock(
    tmp_path, optimizer, train_rows, eval_rows, activity
):
    """The moved layer's output read from the input pipeline's blocks still depends on the
    clone's inputs: Keras's train function keeps the normalisation's moving-average updates (and
    the total loss an activity regularizer after it), which it keeps only where they are
    reachable from the model's inputs. Before, the moving mean and variance never moved, and
    evaluate() and predict() normalised with their initial values (issue 48: Ftrl, 129.1 where
    stock gives 336.8), while the trained weights equalled stock's."""
    vocab = _vocab_file(tmp_path)
    rows = np.arange(train_rows, train_rows + eval_rows)
    stock, _ = tfcases.compare(
        tmp_path,
        lambda: _bn_model(vocab, BN_OPTIMIZERS[optimizer](), activity=activity),
        lambda: _dataset(np.arange(train_rows), 16, "first" if activity else True, scale=0.05),
        lambda: _dataset(rows, 16, scale=0.05),
        lambda: _dataset(rows, 4 if eval_rows % 16 else 8, labels=False),
        steps=4,
    )
    # Stock's statistics moved from where they start (0 and 1): equal to stock's is not "unmoved".
    mean = next(v for k, v in stock[3].items() if "/moving_mean/" in k)
    variance = next(v for k, v in stock[3].items() if "/moving_variance/" in k)
    assert np.abs(mean).max() > 1e-2 and np.abs(variance - 1).max() > 1e-2


def _blocks_of_rows(model, rows):
    """(host blocks, labels) of ``rows`` of :func:`_data` as numpy: what the TPU is fed."""
    features, labels = _data()
    return _host_batch(model, {k: v[rows] for k, v in features.items()}, labels[rows])


@pytest.mark.tpuestimator
def test_tpu_train_step_updates_the_moving_statistics(tmp_path):
    """The TPU train step, replicated over 8 cores (built, not run), runs the normalisation's
    moving-average updates: they are live in the computation that produces the step's loss."""
    model = replicas.tpu_model(
        lambda: _bn_model(_vocab_file(tmp_path), tf.keras.optimizers.legacy.Adam(0.05))
    )
    features, labels = _blocks_of_rows(model, slice(0, replicas.PER))
    _, _, outputs = replicas.replicated_model_fn(
        model,
        tfcases.ModeKeys.TRAIN,
        lambda: {k: tf.constant(v) for k, v in features.items()},
        lambda: tf.constant(labels),
        replicas.train_step_outputs,
    )
    live = replicas.live_ops([t for replica in outputs for t in replica])
    updates = [
        op for op in live if op.type == "AssignSubVariableOp" and "bn/AssignMovingAvg" in op.name
    ]
    assert len(updates) == 2, sorted(op.name for op in live if "bn/" in op.name)


@pytest.mark.tpuestimator
def test_eight_shards_synchronized_batchnorm_after_the_columns_train_like_stock(tmp_path):
    """8 emulated shards fed the host's blocks in global batches of 32 over 45 rows (the second
    batch 13 real rows: shards 4-7 padding only), a synchronized BatchNormalization right after
    the moved layer: every replica's variables -- weights, moving mean and variance, Adam's
    slots -- equal stock's on the whole global batch after each step."""
    from tpushim import _batching, _padding

    vocab = _vocab_file(tmp_path)
    build = lambda: _bn_model(vocab, tf.keras.optimizers.legacy.Adam(0.05), synchronized=True)
    rows = 45
    features, labels = _data()
    features = {k: v[:rows] for k, v in features.items()}
    model = build()
    init = model.get_weights()
    stock = tf.compat.v1.keras.estimator.model_to_estimator(
        keras_model=model,
        model_dir=str(tmp_path / "stock"),
        config=tf.estimator.RunConfig(tf_random_seed=7, save_checkpoints_steps=1),
    )
    raw = lambda: tf.data.Dataset.from_tensor_slices((features, labels[:rows]))
    stock.train(lambda: raw().batch(replicas.GLOBAL).repeat(), steps=3)
    emu_model = replicas.tpu_model(build)
    blocks, _ = _host_batch(emu_model, features, labels[:rows])
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        dataset = tf.data.Dataset.from_tensor_slices((blocks, labels[:rows]))
        fitted = _batching.fit_batches(
            dataset.batch(replicas.GLOBAL).repeat(), replicas.GLOBAL, tfcases.ModeKeys.TRAIN
        )
        nxt = tf.compat.v1.data.make_one_shot_iterator(fitted).get_next()
        batches = [sess.run(nxt) for _ in range(3)]
    assert [int(b[0][_padding.PADDING_KEY].sum()) for b in batches] == [32, 13, 32]
    emu = replicas.Emulation(emu_model, tfcases.ModeKeys.TRAIN, batches[0])
    try:
        emu.load_weights(init)
        names = emu.var_names()
        assert any("moving_mean" in n for n in names)
        for step, batch in enumerate(batches, 1):
            emu.train(batch)
            ref = tfcases.checkpoint_values(os.path.join(stock.model_dir, f"model.ckpt-{step}"))
            want = [ref[n] for n in names]
            for values in emu.sess.run(emu.vars):
                for name, got, value in zip(names, values, want):
                    np.testing.assert_allclose(
                        got, value, rtol=tfcases.TOL, atol=tfcases.TOL, err_msg=f"{step} {name}"
                    )
    finally:
        emu.close()


# --- weight-free layers between the raw inputs and the columns (issue 48) -------------------------


def _taxi_dataset(rows, batch, repeat=False, labels=True):
    features, fare = tfcases.taxi_data()
    features = {k: v[rows] for k, v in features.items()}
    ds = tf.data.Dataset.from_tensor_slices((features, fare[rows]) if labels else features)
    ds = ds.batch(batch)
    return ds.repeat() if repeat else ds


@pytest.mark.parametrize("direct", [False, True], ids=["columns-only", "distance-read-directly"])
def test_weight_free_layers_before_the_columns_run_on_the_host_as_stock(tmp_path, caplog, direct):
    """Lambdas (one called twice) and a TF op between the raw inputs and DenseFeatures run in the
    input pipeline with the columns: weights, evaluate() over a short last batch, predict() and
    the exported model fed raw features equal stock's. Before, conversion refused the model ("a
    trainable weight depends on them": none does). ``direct``: a Dense layer reads the distance
    too: the raw coordinates stay fed and the model computes it again."""
    caplog.set_level(logging.INFO, logger="tpushim")
    stock, shim = tfcases.compare(
        tmp_path,
        lambda: tfcases.taxi_model(direct=direct),
        lambda: _taxi_dataset(np.arange(40), 8, repeat=True),
        lambda: _taxi_dataset(np.arange(40, 52), 8),  # a short last batch: padded, weighted out
        lambda: _taxi_dataset(np.arange(40, 50), 4, labels=False),
        steps=6,
    )
    assert "(with layers euclidean, scale_lat, scale_lon, tf.math.log1p, which they read)" in (
        caplog.text
    )
    # Stock's trip cells moved: the embedding compared is a trained one.
    table = next(
        v for k, v in stock[3].items() if "embedding_weights" in k and "OPTIMIZER" not in k
    )
    assert np.abs(table).sum() > 0
    features, _ = tfcases.taxi_data()
    rows = {k: v[:9] for k, v in features.items()}
    np.testing.assert_allclose(
        _serve(shim[0], tmp_path / "shim_export", rows, "fare"),
        _serve(stock[0], tmp_path / "stock_export", rows, "fare"),
        atol=tfcases.TOL,
        rtol=0,
    )


@pytest.mark.tpuestimator
def test_eight_shards_with_weight_free_layers_before_the_columns_train_like_stock(tmp_path):
    """8 emulated shards fed the host's blocks (the Lambdas computed there) train as stock on the
    global batch: every replica's weights and Adam slots."""
    features, labels = tfcases.taxi_data(replicas.GLOBAL * 2)
    _eight_shards(tmp_path, tfcases.taxi_model, features, labels, steps=2)


@pytest.mark.parametrize(
    "between, why",
    [
        (lambda: tf.keras.layers.Dense(1, name="shift"), r"'shift', which holds weights"),
        (lambda: tf.keras.layers.Dropout(0.2, name="drop"), "'drop', which draws random numbers"),
        (
            lambda: tf.keras.layers.Lambda(
                lambda x: x + tf.random.normal(tf.shape(x), stddev=1e-3), name="noisy"
            ),
            "'noisy', which draws random numbers",
        ),
        (
            lambda: tf.keras.layers.Lambda(lambda x, training=None: x, name="mode"),
            "'mode', which depends on the training mode",
        ),
    ],
    ids=["weights", "random", "random-lambda", "training-mode"],
)
@pytest.mark.parametrize("engine", ["tpuestimator", "strategy"])
def test_a_layer_that_cannot_move_before_the_columns_is_refused_naming_it(
    tmp_path, between, why, engine
):
    """The columns read the distance; the layer it is computed from holds a weight, draws random
    numbers or reads the training mode: refused on both engines, naming that layer."""
    with pytest.raises(
        ConversionError,
        match=r"layer 'trip_features' on a TPU: it reads the output of layer 'euclidean', "
        r"computed from layer " + why,
    ):
        tfcases.convert(
            tmp_path / "model",
            lambda: tfcases.taxi_model(between=between()),
            patch={"mode": "cpu", "engine": engine},
        )
    assert not os.path.exists(tmp_path / "model")  # refused before anything was written


# --- the host layers are not computed again on the device --------------------------------------

CITIES = np.array(["Paris", "ROME", "oslo", "Rome"], dtype=object)


def _city_data(n=tfcases.N, seed=0):
    rng = np.random.RandomState(seed)
    city = CITIES[rng.randint(0, len(CITIES), (n, 1))]
    x = rng.rand(n, 1).astype("float32")
    y = (x + 1.5 * (np.char.lower(city.astype(str)) == "rome")).astype("float32")
    return {"city": city, "x": x}, y


def _city_model():
    """A ``Lambda`` taking strings (lower-casing a city) and one of a number (``expm1``), between
    the raw inputs and ``DenseFeatures``: both run on the host with the columns."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    fc = tf.feature_column
    inputs = {
        "city": tf.keras.Input((1,), name="city", dtype=tf.string),
        "x": tf.keras.Input((1,), name="x"),
    }
    lower = tf.keras.layers.Lambda(tf.strings.lower, name="lower")(inputs["city"])
    # (in a lambda: a Lambda of tf.math.expm1 itself did not survive cloning here)
    scaled = tf.keras.layers.Lambda(lambda v: tf.math.expm1(v), name="scaled")(inputs["x"])  # noqa: PLW0108
    vocabulary = fc.categorical_column_with_vocabulary_list("city", ["paris", "rome", "oslo"])
    columns = [fc.indicator_column(vocabulary), fc.numeric_column("x")]
    h = tf.keras.layers.DenseFeatures(columns, name="place")({"city": lower, "x": scaled})
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, name="y")(h))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse", metrics=["mae"])
    return model


def _city_input(rows, batch, repeat=False, labels=True):
    features, y = _city_data()
    features = {k: v[rows] for k, v in features.items()}
    ds = tf.data.Dataset.from_tensor_slices((features, y[rows]) if labels else features)
    ds = ds.batch(batch)
    return ds.repeat() if repeat else ds


def test_host_layers_taking_strings_before_the_columns_train_as_stock(tmp_path):
    """The host layers only the columns read are not computed in the model on the device (they
    were, on zero stand-ins of the raw inputs: wasted work, and a ``Lambda`` taking strings
    failed there: "'StringLower' Op has type float32"). Weights, evaluate() over a short last
    batch, predict() and the exported model fed raw strings equal stock's."""
    stock, shim = tfcases.compare(
        tmp_path,
        _city_model,
        lambda: _city_input(np.arange(40), 8, repeat=True),
        lambda: _city_input(np.arange(40, 52), 8),  # a short last batch
        lambda: _city_input(np.arange(40, 50), 4, labels=False),
        steps=6,
    )
    assert stock[1]["loss"] < 1.0
    features, _ = _city_data()
    rows = {k: v[:9] for k, v in features.items()}
    np.testing.assert_allclose(
        _serve(shim[0], tmp_path / "shim_export", rows, "y"),
        _serve(stock[0], tmp_path / "stock_export", rows, "y"),
        atol=tfcases.TOL,
        rtol=0,
    )


def test_faked_tpu_computation_holds_no_host_layer(tmp_path):
    """On a faked TPU system: the TPU computation of train and predict holds neither the
    strings' op nor the number's (``Expm1``, no other layer's), the host computes them, and no
    string is fed."""
    with faketpu.faked_tpu_system() as tpu:
        est = tfcases.convert(tmp_path / "model", _city_model, patch=tfcases.on_faked_tpu(tpu, 2))
        train = tpu.build(lambda: est.train(lambda: _city_input(np.arange(48), 16, True), steps=4))
        predict = tpu.build(
            lambda: list(est.predict(lambda: _city_input(np.arange(48), 16, labels=False)))
        )
    for build in (train, predict):
        ops = _tpu_computation_ops(build)
        assert "MatMul" in ops, sorted(ops)
        assert not ops & {"StringLower", "Expm1", *HOST_OPS}, sorted(ops & {"StringLower", "Expm1"})
        for node in build.nodes("InfeedEnqueueTuple"):
            assert tf.string not in [tf.as_dtype(t) for t in node.attr["dtypes"].list.type]
