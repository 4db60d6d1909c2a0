"""Small models, data and the stock-vs-tpushim comparison harness shared by the conversion tests."""

import numpy as np
import tensorflow as tf

import tpushim

tf.get_logger().setLevel("ERROR")

# Where stock itself differs between the TensorFlow releases tpushim supports, tests branch on these.
TF_VERSION = tuple(int(p) for p in tf.__version__.split(".")[:2])
KERAS_VERSION = tuple(int(p) for p in __import__("keras").__version__.split(".")[:2])

#: ``tf.compat.v1.estimator``; on TensorFlow >= 2.16 (none there) the namespace tpushim installs as
#: it while patched, for the names a test module binds at import (ModeKeys, numpy_input_fn).
if hasattr(tf.compat.v1, "estimator"):
    ESTIMATOR = tf.compat.v1.estimator
else:
    from tpushim._estimator_api import _api

    ESTIMATOR = _api.build("tf.compat.v1.estimator")
ModeKeys = ESTIMATOR.ModeKeys

N = 52  # examples: not divisible by the batch size (8), so eval/predict pad the last batch
BATCH = 8
TOL = 1e-5


def data(n=N, dim=4, classes=3, seed=0):
    rng = np.random.RandomState(seed)
    return rng.rand(n, dim).astype("float32"), rng.randint(0, classes, size=(n, 1)).astype("int64")


def sequential(optimizer=None, metrics=("accuracy",), extra_layers=(), clear_session=True):
    """``clear_session``: False in a program's own graph (it resets the default graph)."""
    if clear_session:
        tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(8, activation="relu", input_shape=(4,), name="hidden"),
            *extra_layers,
            tf.keras.layers.Dense(3, activation="softmax", name="probs"),
        ]
    )
    model.compile(
        optimizer=optimizer or tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=list(metrics),
    )
    return model


#: a row of :func:`batchnorm_variants`' input: 3 steps of 4 numbers
BATCHNORM_VARIANTS_SHAPE = (3, 4)


def batchnorm_variants():
    """One functional model with a BatchNormalization of each kind on a branch of its own (momenta
    below 1 so that the moving statistics move): renorm with clipping and its own momentum;
    another momentum and epsilon without centre, and without scale (fused); a model nested in
    the model; under ``TimeDistributed`` (its rows folded into the batch); frozen
    (``trainable=False``: the moving statistics, none updated); called with ``training=False``;
    fused by request and not fused on 4-D inputs; normalising axis 1 (channels first)."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    layers = tf.keras.layers
    bn = layers.BatchNormalization
    x = tf.keras.Input(BATCHNORM_VARIANTS_SHAPE)
    h = layers.Dense(6, name="hidden")(layers.Flatten()(x))
    steps = layers.TimeDistributed(layers.Dense(5), name="steps")(x)
    image = layers.Conv2D(3, 2, name="conv")(layers.Reshape((3, 4, 1))(x))  # [2, 3, 3]
    nested = tf.keras.Sequential([bn(momentum=0.5, name="inner")], name="nested")
    branches = [
        bn(
            momentum=0.5,
            renorm=True,
            renorm_momentum=0.7,
            name="renorm",
            renorm_clipping={"rmax": 1.2, "rmin": 0.8, "dmax": 0.2},
        )(h),
        bn(momentum=0.9, epsilon=0.5, center=False, name="eps")(h),
        nested(h),
        layers.TimeDistributed(bn(momentum=0.5, name="timed"), name="each_step")(steps),
        bn(momentum=0.5, trainable=False, name="frozen")(h),
        bn(momentum=0.5, name="inference")(h, training=False),
        bn(momentum=0.8, epsilon=0.1, scale=False, fused=True, name="fused")(image),
        bn(momentum=0.5, fused=False, name="unfused")(image),
        bn(axis=1, momentum=0.5, name="channels_first")(layers.Permute((3, 1, 2))(image)),
    ]
    out = layers.Concatenate()([layers.Flatten()(b) for b in branches])
    model = tf.keras.Model(x, layers.Dense(3, activation="softmax", name="probs")(out))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy", ["acc"])
    return model


def ghost_batchnorm():
    """Ghost batches (``virtual_batch_size=2``): an unbuilt Sequential, as Keras's own config of a
    built such layer cannot be cloned (its axis is saved shifted), by stock neither."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(6),
            tf.keras.layers.BatchNormalization(momentum=0.5, virtual_batch_size=2),
            tf.keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy", ["acc"])
    return model


OPTIMIZERS = {
    "keras-sgd-momentum": lambda: tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9),
    "keras-adam": lambda: tf.keras.optimizers.legacy.Adam(0.01),
    "tf1-momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
}


def two_in_two_out(optimizer="keras-adam", cls_crossentropy_metric=False):
    """Functional model: inputs 'a' and 'b', outputs 'cls' and 'reg', per-output metrics and loss weights.

    Args:
      optimizer: a key of :data:`OPTIMIZERS`, or a function returning an optimizer.
      cls_crossentropy_metric: also a ``SparseCategoricalCrossentropy`` metric object on 'cls'.
    """
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    a = tf.keras.Input((4,), name="a")
    b = tf.keras.Input((2,), name="b")
    h = tf.keras.layers.Dense(6, activation="tanh", name="h")(tf.keras.layers.Concatenate()([a, b]))
    cls = tf.keras.layers.Dense(3, activation="softmax", name="cls")(h)
    reg = tf.keras.layers.Dense(1, name="reg")(h)
    model = tf.keras.Model({"a": a, "b": b}, {"cls": cls, "reg": reg})
    cls_metrics = ["accuracy"]
    if cls_crossentropy_metric:
        cls_metrics.append(tf.keras.metrics.SparseCategoricalCrossentropy())
    make_optimizer = OPTIMIZERS[optimizer] if isinstance(optimizer, str) else optimizer
    model.compile(
        optimizer=make_optimizer(),
        loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
        loss_weights={"cls": 1.0, "reg": 0.5},
        metrics={"cls": cls_metrics, "reg": ["mae", tf.keras.metrics.RootMeanSquaredError()]},
    )
    return model


def two_in_two_out_data(n=N, seed=3, sample_weights=False, reg_labels_1d=False):
    """(features, labels) for :func:`two_in_two_out`.

    Args:
      n: examples.
      seed: the numpy seed.
      sample_weights: features become ``{"features": inputs, "sample_weights": per-output
        weights}``, as stock's model_fn reads them.
      reg_labels_1d: 'reg' labels of shape [n] for the [n, 1] output; with ``sample_weights``
        'reg' is then not weighted (stock cannot weight it: Keras reduces that output's loss to
        one value first).
    """
    rng = np.random.RandomState(seed)
    features = {"a": rng.rand(n, 4).astype("float32"), "b": rng.rand(n, 2).astype("float32")}
    labels = {
        "cls": rng.randint(0, 3, size=(n, 1)).astype("int64"),
        "reg": rng.rand(n, 1).astype("float32"),
    }
    if reg_labels_1d:
        labels["reg"] = labels["reg"][:, 0]
    if not sample_weights:
        return features, labels
    weights = {
        "cls": rng.uniform(0.2, 2.0, n).astype("float32"),
        "reg": rng.uniform(0.2, 2.0, n).astype("float32"),
    }
    if reg_labels_1d:
        del weights["reg"]
    return {"features": features, "sample_weights": weights}, labels


TAXI = ("plon", "plat", "dlon", "dlat", "passengers")


def taxi_data(n=N, seed=5):
    """(features, fares) of taxi trips: raw pickup/dropoff coordinates and passengers, [n, 1]."""
    rng = np.random.RandomState(seed)
    plon, plat = rng.uniform(-74.05, -73.75, [n, 1]), rng.uniform(40.6, 40.9, [n, 1])
    dlon, dlat = plon + rng.normal(0, 0.04, [n, 1]), plat + rng.normal(0, 0.04, [n, 1])
    passengers = rng.randint(1, 6, [n, 1]).astype("float32")
    fare = 2.5 + 180 * np.sqrt((dlon - plon) ** 2 + (dlat - plat) ** 2) + 0.4 * passengers
    values = (plon, plat, dlon, dlat, passengers)
    return {k: v.astype("float32") for k, v in zip(TAXI, values)}, fare.astype("float32")


def _euclidean(params):
    lon1, lat1, lon2, lat2 = params
    return tf.sqrt((lon2 - lon1) ** 2 + (lat2 - lat1) ** 2)


def taxi_model(optimizer=None, between=None, direct=False):
    """Taxi fares as the public samples engineer them inside the model: weight-free layers between
    the raw inputs and ``DenseFeatures`` -- one ``Lambda`` scaling both longitudes (a layer called
    twice), ``Lambda``s for the latitudes and the Euclidean distance from the four raw
    coordinates, a TF op (``log1p``) -- then numeric, bucketized, crossed (embedded) and indicator
    columns over their outputs and a raw input, then Dense layers. ``between``: a layer that
    makes the distance's input from the pickup longitude (what tpushim cannot move refuses);
    ``direct``: the distance read by a Dense layer too, beside the columns' output."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    fc = tf.feature_column
    inputs = {k: tf.keras.Input((1,), name=k) for k in TAXI}
    scale_lon = tf.keras.layers.Lambda(lambda x: (x + 78) / 8.0, name="scale_lon")
    plon = between(inputs["plon"]) if between is not None else inputs["plon"]
    features = {
        "plon": scale_lon(inputs["plon"]),
        "dlon": scale_lon(inputs["dlon"]),
        "plat": tf.keras.layers.Lambda(lambda x: (x - 37) / 8.0, name="scale_lat")(inputs["plat"]),
        "passengers": inputs["passengers"],
        "log_passengers": tf.math.log1p(inputs["passengers"]),
        "euclidean": tf.keras.layers.Lambda(_euclidean, name="euclidean")(
            [plon, inputs["plat"], inputs["dlon"], inputs["dlat"]]
        ),
    }
    buckets = np.linspace(0.45, 0.55, 6).tolist()
    cells = fc.crossed_column(
        [
            fc.bucketized_column(fc.numeric_column("plon"), buckets),
            fc.bucketized_column(fc.numeric_column("dlon"), buckets),
            fc.bucketized_column(fc.numeric_column("plat"), np.linspace(0.45, 0.5, 4).tolist()),
        ],
        64,
    )
    columns = [
        fc.numeric_column("passengers"),
        fc.numeric_column("log_passengers"),
        fc.numeric_column("euclidean"),
        fc.indicator_column(fc.bucketized_column(fc.numeric_column("euclidean"), [0.02, 0.05])),
        fc.embedding_column(cells, 3, combiner="sqrtn"),
    ]
    x = tf.keras.layers.DenseFeatures(columns, name="trip_features")(features)
    if direct:
        x = tf.keras.layers.Concatenate()([x, features["euclidean"] * 10.0])
    x = tf.keras.layers.Dense(8, activation="relu")(x)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, name="fare")(x))
    model.compile(optimizer or tf.keras.optimizers.legacy.Adam(0.05), "mse", metrics=["mae"])
    return model


def dataset_input_fn(features, labels=None, batch=BATCH, drop_remainder=False, repeat=False):
    def input_fn():
        ds = tf.data.Dataset.from_tensor_slices(features if labels is None else (features, labels))
        if repeat:
            ds = ds.repeat()
        return ds.batch(batch, drop_remainder=drop_remainder)

    return input_fn


def checkpoint_values(model_dir):
    reader = tf.train.load_checkpoint(model_dir)
    return {
        name: reader.get_tensor(name)
        for name, _ in tf.train.list_variables(model_dir)
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }


def convert(model_dir, model=None, spelling="v2", patch=None, **kwargs):
    """What ``model_to_estimator`` returns for ``model`` in ``model_dir``: the one conversion helper.

    Args:
      model: a Keras model, or a function that builds one; None: a fresh :func:`sequential`
        (unless ``kwargs`` names ``keras_model`` or ``keras_model_path`` itself).
      spelling: ``"v2"`` (``tf.keras.estimator``) or ``"v1"`` (``tf.compat.v1.keras.estimator``).
      patch: ``tpushim.patch()``'s arguments for this call only (unpatched afterwards;
        ``{"mode": "off"}``: stock); None converts under whatever the caller patched.
      kwargs: ``model_to_estimator``'s other arguments.
    """

    def to_estimator(**kwargs):  # looked up once patched, as a script that patches at its top
        return {
            "v2": lambda: tf.keras.estimator.model_to_estimator,
            "v1": lambda: tf.compat.v1.keras.estimator.model_to_estimator,
        }[spelling]()(**kwargs)

    if "keras_model" not in kwargs and "keras_model_path" not in kwargs:
        model = sequential if model is None else model
        kwargs["keras_model"] = model if isinstance(model, tf.keras.Model) else model()
    if patch is None:
        return to_estimator(model_dir=str(model_dir), **kwargs)
    tpushim.patch(**patch)
    try:
        return to_estimator(model_dir=str(model_dir), **kwargs)
    finally:
        tpushim.unpatch()


def on_faked_tpu(tpu, iterations_per_loop, **settings):
    """:func:`convert`'s ``patch`` for a faked TPU system (``faketpu.faked_tpu_system``)."""
    return dict(tpu=tpu.master, iterations_per_loop=iterations_per_loop, **settings)


def run(
    mode,
    build_model,
    train_fn,
    eval_fn,
    predict_fn,
    model_dir,
    steps=6,
    spelling="v2",
    convert_kwargs=None,
):
    """Converts with tpushim in ``mode`` ('off' = stock), trains, evaluates and predicts."""
    kwargs = {"config": ESTIMATOR.RunConfig(tf_random_seed=7), **(convert_kwargs or {})}
    estimator = convert(model_dir, build_model, spelling, {"mode": mode}, **kwargs)
    if steps:
        estimator.train(train_fn, steps=steps)
    metrics = estimator.evaluate(eval_fn) if eval_fn else None
    predictions = list(estimator.predict(predict_fn)) if predict_fn else None
    return estimator, metrics, predictions, checkpoint_values(model_dir)


def stock_metric_names(metrics, output_names):
    """Stock's metric names with Keras 2's growing output prefix undone (see stable_metric_name)."""
    if len(output_names) <= 1:  # nothing to undo (and _model_fn is the TPUEstimator path's)
        return dict(metrics)
    from tpushim._model_fn import stable_metric_name

    return {stable_metric_name(k, output_names): v for k, v in metrics.items()}


def assert_same(stock, shim, tol=TOL, output_names=(), skip=()):
    """Weights, every evaluate() key (but ``skip``) and every prediction within ``tol``."""
    _, stock_metrics, stock_preds, stock_weights = stock
    _, shim_metrics, shim_preds, shim_weights = shim
    if stock_metrics is not None:
        stock_metrics = stock_metric_names(stock_metrics, output_names)
        stock_metrics = {k: v for k, v in stock_metrics.items() if k not in skip}
        shim_metrics = {k: v for k, v in shim_metrics.items() if k not in skip}
    assert set(stock_weights) == set(shim_weights)
    for name, value in stock_weights.items():
        np.testing.assert_allclose(shim_weights[name], value, atol=tol, rtol=0, err_msg=name)
    if stock_metrics is not None:
        assert set(stock_metrics) == set(shim_metrics)
        for key, value in stock_metrics.items():
            np.testing.assert_allclose(shim_metrics[key], value, atol=tol, rtol=0, err_msg=key)
    if stock_preds is not None:
        assert len(shim_preds) == len(stock_preds)
        for got, want in zip(shim_preds, stock_preds):
            assert set(got) == set(want)
            for key in want:
                np.testing.assert_allclose(got[key], want[key], atol=tol, rtol=0, err_msg=key)


def compare(
    tmp_path,
    build_model,
    train_fn,
    eval_fn=None,
    predict_fn=None,
    output_names=(),
    skip=(),
    **kwargs,
):
    stock = run("off", build_model, train_fn, eval_fn, predict_fn, tmp_path / "stock", **kwargs)
    shim = run("cpu", build_model, train_fn, eval_fn, predict_fn, tmp_path / "shim", **kwargs)
    from tpushim._estimator import TPUShimEstimator

    assert not isinstance(stock[0], TPUShimEstimator)
    assert isinstance(shim[0], tf.compat.v1.estimator.tpu.TPUEstimator)
    assert_same(stock, shim, output_names=output_names, skip=skip)
    return stock, shim


# --- models the conversion (and the preflight) refuse -------------------------------------------


class Subclassed(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = tf.keras.layers.Dense(3)

    def call(self, inputs):
        return self.dense(inputs)


class NoConfigMetric(tf.keras.metrics.Mean):
    """A metric whose __init__ takes an argument its config does not hold: it cannot be rebuilt."""

    def __init__(self, threshold):
        super().__init__(name="above")
        self.threshold = threshold

    def update_state(self, y_true, y_pred, sample_weight=None):
        return super().update_state(tf.cast(y_pred > self.threshold, tf.float32), sample_weight)


def uncompiled():
    """A model never compiled."""
    tf.keras.backend.clear_session()
    return tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])


def subclassed():
    """A compiled subclassed model (stock refuses object-based checkpoints for it)."""
    model = Subclassed()
    model.compile("sgd", "mse")
    return model


def with_unrebuildable_metric():
    return sequential(metrics=[NoConfigMetric(0.5)])


class HandRolledSGD(tf.keras.optimizers.Optimizer):
    """A new-style optimizer with no legacy twin: estimators (and so TPUs) cannot use it."""

    def build(self, var_list):
        super().build(var_list)

    def update_step(self, gradient, variable):
        variable.assign_sub(0.1 * gradient)


def with_legacyless_optimizer():
    return sequential(optimizer=HandRolledSGD(name="hand_rolled"))


class LoopbackListener:
    """A loopback port that accepts TCP connections and says nothing: a fake, reachable TPU address."""

    def __enter__(self):
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = "grpc://127.0.0.1:%d" % self.sock.getsockname()[1]
        return self

    def __exit__(self, *exc):
        self.sock.close()


# --- one input_fn call, as tpushim's estimator makes it -----------------------------------------


def adapted(input_fn, mode, params, global_batch=None):
    """``input_fn`` called once as tpushim's estimator calls it, then adapted as it hands the result
    to TPUEstimator (``params``: TPUEstimator's, per core on a TPU with its ``context``)."""
    from tpushim import _input_fn

    result = _input_fn.call(input_fn, mode, _input_fn.UserParams(), None)
    return _input_fn.adapt(result, mode, global_batch or params["batch_size"], params, input_fn)


def read_batches(dataset, count=None):
    """The first ``count`` (None: all) elements ``dataset`` yields, as numpy, read in the default
    graph as tpushim's estimator reads its input: from an initializable iterator, its start fed
    the in-memory arrays (numpy_input_fn's) the graph reads by placeholder."""
    from tpushim import _input_fn

    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    element = iterator.get_next()
    out = []
    with _input_fn.graph_session() as session:
        session.run(iterator.initializer)
        while count is None or len(out) < count:
            try:
                out.append(session.run(element))
            except tf.errors.OutOfRangeError:
                break
    return out


def input_facts(input_fn, mode, count=False):
    """What tpushim reads of one call of ``input_fn`` (``InputFacts``), in a graph of its own."""
    from tpushim import _input_fn

    with tf.Graph().as_default():
        result = _input_fn.call(input_fn, mode, _input_fn.UserParams(), None)
        return _input_fn.read_facts(result, count=count)
