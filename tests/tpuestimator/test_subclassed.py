"""Subclassed Keras models and the premade LinearModel / WideDeepModel (issue 16).

Stock ``model_to_estimator`` converts them, so tpushim does. Rung 1 ports the TF Estimator tests
that passed stock and failed under tpushim (keras_test.py: ``test_train_keras_estimator_subclass``,
``..._subclass_w_fit``, ``..._hooks``, ``..._hooks_and_fit``, ``..._tf_optimizer``,
``test_export_subclassed_model_retains_model_state``; keras_premade_model_test.py:
``test_train_premade_linear_model``, ``test_train_premade_widedeep_model_with_feature_layers``) as
stock-vs-cpu-mode comparisons; rung 2 builds each one's TPU train step for 8 replicas on CPU;
rung 2b runs a subclassed model and a two-optimizer WideDeepModel as 8 emulated shards.
"""

import numpy as np
import pytest
import replicas
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import
from replicas import PER, REPLICAS

import tpushim

_model_fn = tpuestimator_import("tpushim._model_fn")
TPUShimEstimator = tpuestimator_import("tpushim._estimator", "TPUShimEstimator")
faketpu = tpuestimator_import("tpushim._preflight.faketpu")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tpuestimator,
]  # trains estimators or runs scripts: outside the fast tier

ModeKeys = tfcases.ModeKeys
numpy_io = tfcases.ESTIMATOR.inputs


class SimpleModel(tf.keras.Model):
    """keras_test.simple_subclassed_model (Dense, Dropout, Dense), with an explicit config."""

    def __init__(self, units=8, classes=3, **kwargs):
        super().__init__(**kwargs)
        self.units, self.classes = units, classes
        self.dense1 = tf.keras.layers.Dense(units, activation="relu")
        self.dp = tf.keras.layers.Dropout(0.1)
        self.dense2 = tf.keras.layers.Dense(classes, activation="softmax")

    def call(self, inputs, training=None):
        return self.dense2(self.dp(self.dense1(inputs), training=training))

    def get_config(self):
        return {"units": self.units, "classes": self.classes}


class NoConfigModel(tf.keras.Model):
    """No get_config/from_config: Keras derives the config from the basic __init__ arguments."""

    def __init__(self, units=6):
        super().__init__()
        self.hidden = tf.keras.layers.Dense(units, activation="tanh")
        self.out = tf.keras.layers.Dense(3, activation="softmax")

    def call(self, inputs):
        return self.out(self.hidden(inputs))


class MyHook(tf.compat.v1.train.SessionRunHook):
    """keras_test.MyHook: a hook that adds a variable to the graph in begin()."""

    def begin(self):
        _ = tf.compat.v1.get_variable("temp", [1])


def _subclassed(cls=SimpleModel, optimizer=None, fit=False):
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = cls()
    model.compile(
        optimizer=optimizer() if optimizer else tf.compat.v1.train.RMSPropOptimizer(0.01),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    if fit:
        x, y = tfcases.data(seed=5)
        model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    return model


def _run(
    mode,
    build,
    train_fn,
    eval_fn,
    predict_fn,
    model_dir,
    steps=6,
    hooks=None,
    spelling="v1",
    checkpoint_format="saver",
):
    """tfcases.run, with training hooks and stock's checkpoint format for subclassed models."""
    estimator = tfcases.convert(
        model_dir,
        build,
        spelling,
        {"mode": mode},
        config=tf.estimator.RunConfig(tf_random_seed=7),
        checkpoint_format=checkpoint_format,
    )
    assert isinstance(estimator, TPUShimEstimator) == (mode == "cpu")
    estimator.train(train_fn, steps=steps, hooks=[h() for h in hooks or ()])
    metrics = estimator.evaluate(eval_fn)
    predictions = list(estimator.predict(predict_fn)) if predict_fn else None
    return estimator, metrics, predictions, tfcases.checkpoint_values(model_dir)


def _compare(tmp_path, build, train_fn, eval_fn, predict_fn=None, **kwargs):
    stock = _run("off", build, train_fn, eval_fn, predict_fn, tmp_path / "stock", **kwargs)
    shim = _run("cpu", build, train_fn, eval_fn, predict_fn, tmp_path / "shim", **kwargs)
    tfcases.assert_same(stock, shim)
    return stock, shim


# --- rung 1: cpu mode == stock -------------------------------------------------------------------


# keras_test.test_train_keras_estimator's subclass cases (tf.compat.v1.train RMSProp, 'saver'
# checkpoints); its 'tf_optimizer' case is 'hooks_and_fit' again.
@pytest.mark.parametrize(
    "fit,hooks",
    [(False, None), (True, None), (False, [MyHook]), (True, [MyHook])],
    ids=["subclass", "subclass_w_fit", "hooks", "hooks_and_fit-tf_optimizer"],
)
def test_train_keras_estimator_subclass(tmp_path, fit, hooks):
    x, y = tfcases.data()
    predict = tfcases.dataset_input_fn(x) if fit == bool(hooks) else None  # two cases suffice
    _stock, shim = _compare(
        tmp_path,
        lambda: _subclassed(fit=fit),
        tfcases.dataset_input_fn(x, y, repeat=True),
        tfcases.dataset_input_fn(x, y),
        predict,
        hooks=hooks,
    )
    assert set(shim[1]) == {"accuracy", "loss", "global_step"} and shim[1]["global_step"] == 6
    assert ("temp" in shim[3]) == bool(hooks)
    if predict:
        assert len(shim[2]) == tfcases.N and set(shim[2][0]) == {"output_1"}


def test_subclass_without_get_config_keras_optimizer_v2_spelling(tmp_path):
    """Stock manages a model with no get_config (Keras derives one); a Keras optimizer; EstimatorV2."""
    x, y = tfcases.data()
    _compare(
        tmp_path,
        lambda: _subclassed(NoConfigModel, lambda: tf.keras.optimizers.legacy.Adam(0.02)),
        tfcases.dataset_input_fn(x, y, repeat=True),
        tfcases.dataset_input_fn(x, y),
        tfcases.dataset_input_fn(x),
        spelling="v2",
    )


def test_subclass_errors_are_stocks(tmp_path):
    class NeedsArg(SimpleModel):
        def get_config(self):
            raise NotImplementedError

    for mode in ("off", "cpu"):
        tpushim.patch(mode=mode)
        try:
            with pytest.raises(
                ValueError, match="Object-based checkpoints are currently not supported"
            ):
                tf.keras.estimator.model_to_estimator(
                    keras_model=_subclassed(), model_dir=str(tmp_path / mode / "a")
                )
            with pytest.raises(
                ValueError, match=r"must implement `Model\.get_config` and `Model\.from_config`"
            ):
                tf.keras.estimator.model_to_estimator(
                    keras_model=_subclassed(NeedsArg),
                    model_dir=str(tmp_path / mode / "b"),
                    checkpoint_format="saver",
                )
        finally:
            tpushim.unpatch()
        assert not (tmp_path / mode / "a").exists() and not (tmp_path / mode / "b").exists()


def _serving_input():
    x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
    return tf.estimator.export.TensorServingInputReceiver(x, {"x": x})


def test_export_subclassed_model_retains_model_state(tmp_path):
    """keras_test's test: after conversion and training the user's model keeps its optimizer and its
    iterations; and the exported SavedModel holds the trained weights, equal to stock's."""
    x, y = tfcases.data()
    exported = {}
    for mode in ("off", "cpu"):
        model = _subclassed(fit=True)
        optimizer = model.optimizer
        iterations = tf.keras.backend.get_value(model.optimizer.iterations)
        tpushim.patch(mode=mode)
        try:
            est = tf.compat.v1.keras.estimator.model_to_estimator(
                keras_model=model,
                model_dir=str(tmp_path / mode),
                checkpoint_format="saver",
                config=tf.estimator.RunConfig(tf_random_seed=7),
            )
        finally:
            tpushim.unpatch()
        est.train(tfcases.dataset_input_fn(x, y, repeat=True), steps=4)
        assert model.optimizer is optimizer
        assert tf.keras.backend.get_value(model.optimizer.iterations) == iterations
        path = est.export_saved_model(str(tmp_path / f"export-{mode}"), _serving_input).decode()
        exported[mode] = tfcases.checkpoint_values(path + "/variables/variables")
        trained = tfcases.checkpoint_values(str(tmp_path / mode))
        for name in ("simple_model/dense/kernel", "simple_model/dense_1/bias"):
            np.testing.assert_allclose(exported[mode][name], trained[name], atol=0, rtol=0)
        # A second conversion into the same model_dir continues from its checkpoint.
        tpushim.patch(mode=mode)
        try:
            again = tf.compat.v1.keras.estimator.model_to_estimator(
                keras_model=_subclassed(), model_dir=str(tmp_path / mode), checkpoint_format="saver"
            )
        finally:
            tpushim.unpatch()
        again.train(tfcases.dataset_input_fn(x, y, repeat=True), steps=2)
        assert again.get_variable_value("global_step") == 6
    assert set(exported["off"]) == set(exported["cpu"])
    for name, value in exported["off"].items():
        np.testing.assert_allclose(
            exported["cpu"][name], value, atol=tfcases.TOL, rtol=0, err_msg=name
        )


def _linear_data(n=tfcases.N):
    rng = np.random.RandomState(1337)
    x = rng.uniform(-5, 5, size=(n, 2)).astype("float32")
    return x, (0.3 * x[:, 0] + 0.2 * x[:, 1]).astype("float32")


def _linear_model(fit=True):
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.experimental.LinearModel(units=1)
    model.compile(tf.keras.optimizers.legacy.SGD(0.02), "mse", ["mse"])
    if fit:  # stock then starts from a fresh model all the same (it warns): so must tpushim
        x, y = _linear_data()
        model.fit(x, y, epochs=2, verbose=0)
    return model


def test_train_premade_linear_model(tmp_path):
    x, y = _linear_data()
    _stock, shim = _compare(
        tmp_path,
        _linear_model,
        tfcases.dataset_input_fn(x, y, repeat=True),
        tfcases.dataset_input_fn(x, y),
        tfcases.dataset_input_fn(x),
        steps=10,
    )
    assert shim[1]["loss"] < 3  # trained, from kernel zeros


VOCAB, VOCAB_VAL = ["alpha", "beta", "gamma"], [0.4, 0.6, 0.9]


def _vocab_data(n=tfcases.N, seed=1337):
    rng = np.random.RandomState(seed)
    data = rng.choice(VOCAB, size=n)
    y = np.zeros_like(data, dtype=np.float32)
    for vocab, val in zip(VOCAB, VOCAB_VAL):
        idx = np.where(data == vocab)
        y[idx] = val + rng.uniform(-0.01, 0.01, size=idx[0].shape)
    return data, y


def _wide_deep(columns, keras_input, opts=("sgd", "adam")):
    """keras_premade_model_test's WideDeepModel: DenseFeatures + LinearModel, DenseFeatures + DNN,
    compiled with one optimizer per sub-model."""
    linear = tf.keras.Sequential(
        [
            tf.compat.v1.keras.layers.DenseFeatures(columns),
            tf.keras.experimental.LinearModel(units=1, name="Linear"),
        ]
    )
    dnn = tf.keras.Sequential(
        [
            tf.compat.v1.keras.layers.DenseFeatures(columns),
            tf.keras.layers.Dense(4, activation="relu", name="DNNHidden"),
            tf.keras.layers.Dense(1, name="DNNDense"),
        ]
    )
    model = tf.keras.experimental.WideDeepModel(linear, dnn)
    model._set_inputs(keras_input)  # as stock's test does
    make = {
        "sgd": lambda: tf.keras.optimizers.legacy.SGD(0.1),
        "adam": lambda: tf.keras.optimizers.legacy.Adam(0.1),
        "adagrad": lambda: tf.keras.optimizers.legacy.Adagrad(0.1),
    }
    model.compile([make[o]() for o in opts], "mse", ["mse"])
    return model


def _vocab_wide_deep(opts=("sgd", "adam")):
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    ind = tf.feature_column.indicator_column(
        tf.feature_column.categorical_column_with_vocabulary_list("symbol", VOCAB)
    )
    return _wide_deep(
        [ind], {"symbol": tf.keras.layers.Input(name="symbol", shape=3, dtype=tf.string)}, opts
    )


def _symbol_input(data, y=None, epochs=1):
    return numpy_io.numpy_input_fn(
        x={"symbol": data}, y=y, batch_size=8, num_epochs=epochs, shuffle=False
    )


def test_train_premade_widedeep_model_with_feature_layers(tmp_path):
    """Compared with stock on SGD + Adagrad over a finite input (2 epochs of 48 = 12 steps). Stock's
    own SGD + Adam pair is not reproducible stock against stock: both optimizers assign_add the
    one global step they share, in no fixed order, so Adam's bias correction and the step at which
    StopAtStepHook (which fetches the step in the same run) stops vary from run to run."""
    data, y = _vocab_data(48)
    eval_data, eval_y = _vocab_data(tfcases.N, seed=2)
    stock, shim = _compare(
        tmp_path,
        lambda: _vocab_wide_deep(("sgd", "adagrad")),
        _symbol_input(data, y, epochs=2),
        _symbol_input(eval_data, eval_y),
        _symbol_input(eval_data),
        steps=None,
    )
    # Each optimizer trained its own sub-model only.
    assert any(k.startswith("training/Adagrad/") and "DNNDense" in k for k in shim[3])
    assert not any(k.startswith("training/Adagrad/") and "Linear" in k for k in shim[3])
    # Stock quirk, kept: both optimizers advance the global step: 2 per train step.
    assert stock[1]["global_step"] == shim[1]["global_step"] == 24
    assert len(shim[2]) == tfcases.N


def test_train_premade_widedeep_sgd_adam_as_stocks_test(tmp_path):
    """keras_premade_model_test's own check, in cpu mode: SGD + Adam train the WideDeepModel."""
    data, y = _vocab_data(48)
    tpushim.patch(mode="cpu")
    try:
        est = tf.compat.v1.keras.estimator.model_to_estimator(
            keras_model=_vocab_wide_deep(), model_dir=str(tmp_path), checkpoint_format="saver"
        )
    finally:
        tpushim.unpatch()
    assert isinstance(est, TPUShimEstimator)
    before = est.evaluate(_symbol_input(data, y), steps=1)
    est.train(_symbol_input(data, y, epochs=None), steps=20)
    after = est.evaluate(_symbol_input(data, y), steps=1)
    assert after["loss"] < before["loss"] and after["loss"] < 0.1


def test_premade_linear_model_with_dense_features_warm_starts(tmp_path):
    """LinearModel inside a functional model (keras_premade_model_test's dense-features case): a
    graph network, so the estimator warm-starts from the fitted Keras weights, as stock."""
    data, y = _vocab_data()

    def build():
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        ind = tf.feature_column.indicator_column(
            tf.feature_column.categorical_column_with_vocabulary_list("symbol", VOCAB)
        )
        keras_input = tf.keras.layers.Input(name="symbol", shape=(), dtype=tf.string)
        h = tf.compat.v1.keras.layers.DenseFeatures([ind])({"symbol": keras_input})
        model = tf.keras.Model(keras_input, tf.keras.experimental.LinearModel(units=1)(h))
        model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse", ["mse"])
        model.fit({"symbol": data}, y, epochs=2, verbose=0)
        return model

    fn = lambda epochs: numpy_io.numpy_input_fn(
        x={"symbol": data}, y=y, batch_size=8, num_epochs=epochs, shuffle=False
    )
    _, shim = _compare(tmp_path, build, fn(None), fn(1), steps=1)
    assert (
        shim[1]["loss"] < 0.05
    )  # one step from zeros would not get there: it started from the fit


# --- rung 2: the TPU train step, replicated over 8 TPU replicas, built on CPU -------------------


def _tpu_train_step(model, features, labels):
    graph, _, _ = replicas.replicated_model_fn(
        model, ModeKeys.TRAIN, features, labels, replicas.train_step_outputs
    )
    trainable = graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    sums = replicas.ops_of_type(graph, "CrossReplicaSum")
    for op in sums:
        assert op.inputs[0].shape.is_fully_defined(), op.name
    return trainable, sums


def _numeric_wide_deep(opts):
    """A WideDeepModel a TPU can run: numeric feature columns (a vocabulary lookup is a host op)."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    col = tf.feature_column.numeric_column("x", shape=(4,))
    return _wide_deep([col], {"x": tf.keras.layers.Input(name="x", shape=(4,))}, opts)


@pytest.mark.parametrize(
    "case", ["subclass-tf1-rmsprop", "subclass-keras-sgd", "linear-model", "widedeep-sgd-adam"]
)
def test_tpu_train_step_one_cross_replica_sum_per_variable_and_for_the_reported_loss(case):
    cls_labels = lambda: tf.zeros([PER, 1], tf.int64)
    reg_labels = lambda: tf.zeros([PER, 1])
    model, features, labels = {
        "subclass-tf1-rmsprop": lambda: (_subclassed(), lambda: tf.zeros([PER, 4]), cls_labels),
        "subclass-keras-sgd": lambda: (
            _subclassed(optimizer=lambda: tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9)),
            lambda: tf.zeros([PER, 4]),
            cls_labels,
        ),
        "linear-model": lambda: (_linear_model(fit=False), lambda: tf.zeros([PER, 2]), reg_labels),
        "widedeep-sgd-adam": lambda: (
            _numeric_wide_deep(("sgd", "adam")),
            lambda: {"x": tf.zeros([PER, 4])},
            reg_labels,
        ),
    }[case]()
    trainable, sums = _tpu_train_step(model, features, labels)
    assert len(trainable) == {"linear-model": 2}.get(case, 4 if case.startswith("subclass") else 6)
    # One per gradient, and the cores' losses summed into the loss the step reports.
    purposes = replicas.cross_replica_sums(op.name for op in sums)
    assert purposes == {"gradient": len(trainable), "reported loss": 1, "loss totals": 0}


class _GraphBuilt(Exception):
    """Raised where TPUEstimator would open its session: the whole TPU graph is built by then."""


@pytest.mark.parametrize("case", ["subclass-tf1-rmsprop", "widedeep-sgd-adam"])
def test_tpuestimator_whole_tpu_graph_builds_on_cpu(case, tmp_path, monkeypatch):
    """TPUEstimator.train on a faked 8-core TPU system (environment only: the system metadata and
    the session it would open) builds replication, infeed, one CrossReplicaSum per variable and
    one for the reported loss."""
    import collections

    from tensorflow.python.client import session as session_lib
    from tensorflow.python.tpu import tpu_system_metadata
    from tensorflow_estimator.python.estimator import estimator as estimator_lib
    from tensorflow_estimator.python.estimator.tpu import tpu_context

    task = "/job:worker/replica:0/task:0/device:"
    devices = [
        session_lib._DeviceAttributes(f"{task}TPU:{i}", "TPU", 0, 0) for i in range(REPLICAS)
    ]
    devices.append(session_lib._DeviceAttributes(f"{task}CPU:0", "CPU", 0, 0))
    metadata = tpu_system_metadata.TPUSystemMetadata(
        num_cores=REPLICAS,
        num_hosts=1,
        num_of_cores_per_host=REPLICAS,
        topology=None,
        devices=devices,
    )
    monkeypatch.setattr(
        tpu_context._InternalTPUContext, "_get_tpu_system_metadata", lambda self: metadata
    )
    built = {}

    def stop_before_session(*args, **kwargs):
        built["graph"] = tf.compat.v1.get_default_graph()
        raise _GraphBuilt()

    monkeypatch.setattr(estimator_lib.training, "MonitoredTrainingSession", stop_before_session)
    x, y = tfcases.data(n=64)
    if case.startswith("widedeep"):
        model, x, y = _numeric_wide_deep(("sgd", "adam")), {"x": x}, x.sum(axis=1, keepdims=True)
    else:
        model = _subclassed()
    with faketpu.faked_tpu_system() as tpu:  # the conversion asks the TPU for its devices
        tpushim.patch(tpu=tpu.master, mode="tpu")
        try:
            est = tf.compat.v1.keras.estimator.model_to_estimator(
                keras_model=model, model_dir=str(tmp_path), checkpoint_format="saver"
            )
        finally:
            tpushim.unpatch()
        assert est.config.master == tpu.master  # a TPUEstimator for that TPU, not cpu mode
        with pytest.raises(_GraphBuilt):
            est.train(
                tfcases.dataset_input_fn(x, y, batch=32, repeat=True), steps=2, hooks=[MyHook()]
            )
    graph = built["graph"]
    ops = collections.Counter(op.type for op in graph.get_operations())
    ops.update(
        n.op for f in graph.as_graph_def().library.function for n in f.node_def
    )  # loop bodies
    (replicate,) = [op for op in graph.get_operations() if op.type == "TPUReplicateMetadata"]
    assert replicate.get_attr("num_replicas") == REPLICAS
    assert ops["InfeedEnqueueTuple"] == REPLICAS and ops["InfeedDequeueTuple"] == 1
    trainable = graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    assert len(trainable) == (6 if case.startswith("widedeep") else 4)
    sums = [n.name for n in graph.as_graph_def().node if n.op == "CrossReplicaSum"] + [
        n.name
        for f in graph.as_graph_def().library.function
        for n in f.node_def
        if n.op == "CrossReplicaSum"
    ]
    assert len(sums) == ops["CrossReplicaSum"]
    # One per gradient, and the cores' losses summed into the loss the step reports.
    purposes = replicas.cross_replica_sums(sums)
    assert purposes == {"gradient": len(trainable), "reported loss": 1, "loss totals": 0}


# --- rung 2b: eight shards emulated with numbers --------------------------------------------------


def _emulated_train(build, x, y, steps):
    """replicas.Emulation of ``build()`` from replica 0's initial values: (those values, every
    replica's variables after ``steps`` steps on its shard of (x, y), variable names)."""
    emu = replicas.Emulation(build(), ModeKeys.TRAIN, (x, y))
    try:
        init = emu.start_as_replica_0()
        for _ in range(steps):
            emu.train((x, y))
        return init, emu.sess.run(emu.vars), emu.var_names()
    finally:
        emu.close()


def _reference_train(build, x, y, init, steps):
    """The same model_fn without a TPU: ``steps`` steps on the whole global batch, same start."""
    graph = tf.Graph()
    model = build()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        before = {v.ref() for v in replicas.global_vars(graph)}
        spec = _model_fn.make_model_fn(model)(
            tf.nest.map_structure(tf.constant, x),
            tf.constant(y),
            ModeKeys.TRAIN,
            params={"use_tpu": False, "batch_size": REPLICAS * PER},
        )
        vs = [v for v in replicas.global_vars(graph) if v.ref() not in before]
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            replicas.Assigner(graph, vs)(sess, init)
            for _ in range(steps):
                sess.run(spec.train_op)
            return sess.run(vs)


@pytest.mark.parametrize(
    "case", ["subclass-sgd-momentum", "subclass-tf1-momentum", "widedeep-sgd-adagrad"]
)
def test_eight_shards_equal_one_global_batch(case):
    """No Adam here: it reads the global step, which both of WideDeep's optimizers advance in no
    fixed order (see test_train_premade_widedeep_model_with_feature_layers)."""
    steps = 2
    x, y = tfcases.data(n=REPLICAS * PER)
    build = {  # NoConfigModel: no Dropout, whose random masks differ between replicas
        "subclass-sgd-momentum": lambda: _subclassed(
            NoConfigModel, lambda: tf.keras.optimizers.legacy.SGD(0.5, momentum=0.9)
        ),
        "subclass-tf1-momentum": lambda: _subclassed(
            NoConfigModel, lambda: tf.compat.v1.train.MomentumOptimizer(0.5, 0.9)
        ),
        "widedeep-sgd-adagrad": lambda: _numeric_wide_deep(("sgd", "adagrad")),
    }[case]
    if case.startswith("widedeep"):
        x, y = {"x": x}, x.sum(axis=1, keepdims=True)
    init, emulated, names = _emulated_train(build, x, y, steps)
    ref = _reference_train(build, x, y, init, steps)
    assert replicas.max_diff(init, ref) > 1e-3  # training moved the weights
    for values in emulated:
        assert replicas.max_diff(values, ref) < tfcases.TOL, names


# --- what a TPU cannot run: the preflight names it, cpu mode still converts ----------------------


class ValueShapedModel(tf.keras.Model):
    """A shape computed from the batch's values: graph mode and CPU run it, a TPU cannot compile it."""

    def __init__(self):
        super().__init__()
        self.out = tf.keras.layers.Dense(3, activation="softmax")

    def call(self, inputs):
        n = tf.cast(tf.reduce_max(inputs) * 10, tf.int32)
        return self.out(inputs) + 0.0 * tf.reduce_sum(tf.ones([n]))


def test_value_dependent_shape_named_by_preflight_and_converted_in_cpu_mode(tmp_path):
    x, y = tfcases.data()
    build = lambda: _subclassed(ValueShapedModel, lambda: tf.keras.optimizers.legacy.SGD(0.1))
    report = tpushim.check(build(), tfcases.dataset_input_fn(x, y))
    finding = next(f for f in report.findings if f.code == "value-dependent-shape")
    assert finding.severity == "error" and "op Fill" in finding.where and not report.ok
    assert (
        "value-dependent-shape"
        not in tpushim.check(_subclassed(NoConfigModel), tfcases.dataset_input_fn(x, y)).codes()
    )
    _compare(
        tmp_path,
        build,
        tfcases.dataset_input_fn(x, y, repeat=True),
        tfcases.dataset_input_fn(x, y),
        steps=2,
    )


def test_preflight_checks_widedeep_with_dict_features():
    """An unbuilt subclassed model (nothing to copy to the XLA clone) with dict features compiles."""
    x = tfcases.data(n=64)[0]
    report = tpushim.check(
        _numeric_wide_deep(("sgd", "adam")),
        tfcases.dataset_input_fn({"x": x}, x.sum(axis=1, keepdims=True), batch=64),
    )
    assert "XLA compile of the training step" in report.checked
    assert report.ok, str(report)
