"""Every built-in Keras metric, as a string (aliases included) and as an object, under the built-in
losses that make sense for the output, computed by tpushim's eval ``metric_fn`` as cpu mode and a
TPU host run it, against the stock estimator's model_fn and Keras's own ``model.evaluate``
(issue 24, item 4: a metric must not silently compute another).

Fast: per model, one scratch graph holds stock's EVAL model_fn and tpushim's, fed the same
batches (the last one short: stock's as it is, tpushim's padded), with the Keras model's weights;
no estimator is trained.
"""

import re

import numpy as np
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import
from replicas import Assigner

keras_lib = tpuestimator_import("tensorflow_estimator.python.estimator", "keras_lib")

_model_fn = tpuestimator_import("tpushim._model_fn")
_padding = tpuestimator_import("tpushim._padding")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tpuestimator,
]  # a Keras evaluate and two compiles of ~60 metrics per family

ModeKeys = tfcases.ModeKeys
ROWS, BATCH = 20, 8  # batches of 8, 8 and 4 (padded to 8)
TOL = 1e-5


def _metric_objects(*names, **with_args):
    """Metric objects by class name (named after it: Keras wants unique names), made only where
    this Keras has the class."""
    wanted = [(n, {}) for n in names] + list(with_args.items())
    return [
        getattr(tf.keras.metrics, n)(**dict({"name": "object_" + n}, **args))
        for n, args in wanted
        if hasattr(tf.keras.metrics, n)
    ]


#: Strings Keras resolves by the loss and the output's shape ('acc', 'ce', ...) or by name.
ANY_OUTPUT = [
    "accuracy",
    "acc",
    "crossentropy",
    "ce",
    "mse",
    "mae",
    "mape",
    "msle",
    "MSE",
    "MAE",
    "MAPE",
    "MSLE",
    "mean_squared_error",
    "mean_absolute_error",
    "mean_absolute_percentage_error",
    "mean_squared_logarithmic_error",
    # 'kld', 'KLD' and 'kl_divergence' compile nowhere in Keras 2.15 (metrics.get returns the
    # string itself): stock refuses them as Keras does.
    "kullback_leibler_divergence",
    "poisson",
    "logcosh",
    "log_cosh",
    "cosine_similarity",
    "hinge",
    "squared_hinge",
    "binary_accuracy",
    "binary_crossentropy",
]

FAMILIES = {
    # softmax over 3 classes, one-hot labels
    "softmax-onehot": dict(
        units=3,
        activation="softmax",
        labels="onehot",
        losses=["categorical_crossentropy", "kld", "poisson", "mse", "categorical_hinge"],
        metrics=ANY_OUTPUT
        + [
            "categorical_accuracy",
            "categorical_crossentropy",
            "top_k_categorical_accuracy",
            "categorical_hinge",
        ]
        + _metric_objects(
            "CategoricalAccuracy",
            "CategoricalCrossentropy",
            "BinaryCrossentropy",
            "KLDivergence",
            "Poisson",
            "CategoricalHinge",
            "AUC",
            "Precision",
            "Recall",
            "RootMeanSquaredError",
            TopKCategoricalAccuracy=dict(k=2, name="top2"),
            OneHotIoU=dict(num_classes=3, target_class_ids=[0, 2]),
            OneHotMeanIoU=dict(num_classes=3),
        ),
    ),
    # softmax over 3 classes, integer labels of shape [batch, 1]
    "softmax-sparse": dict(
        units=3,
        activation="softmax",
        labels="sparse",
        losses=["sparse_categorical_crossentropy"],
        metrics=[
            "accuracy",
            "acc",
            "crossentropy",
            "ce",
            "sparse_categorical_accuracy",
            "sparse_categorical_crossentropy",
            "sparse_top_k_categorical_accuracy",
        ]
        + _metric_objects(
            "SparseCategoricalAccuracy",
            "SparseCategoricalCrossentropy",
            SparseTopKCategoricalAccuracy=dict(k=2, name="top2"),
        ),
    ),
    # one sigmoid, 0/1 labels
    "sigmoid-binary": dict(
        units=1,
        activation="sigmoid",
        labels="binary",
        losses=["binary_crossentropy", "hinge", "squared_hinge", "mse", "poisson"],
        metrics=ANY_OUTPUT
        + _metric_objects(
            "BinaryAccuracy",
            "BinaryCrossentropy",
            "AUC",
            "Precision",
            "Recall",
            "TruePositives",
            "FalsePositives",
            "TrueNegatives",
            "FalseNegatives",
            "Hinge",
            "SquaredHinge",
            AUC=dict(curve="PR", name="pr_auc"),
            PrecisionAtRecall=dict(recall=0.5),
            RecallAtPrecision=dict(precision=0.5),
            SensitivityAtSpecificity=dict(specificity=0.5),
            SpecificityAtSensitivity=dict(sensitivity=0.5),
            BinaryIoU=dict(threshold=0.4),
        ),
    ),
    # 0/1 labels of shape [batch] for a [batch, 1] sigmoid (legacy scripts' habit): stock's graph
    # broadcasts them against the output for some metrics (Keras's evaluate does not), and
    # tpushim reports what stock reports
    "sigmoid-flat-labels": dict(
        units=1,
        activation="sigmoid",
        labels="flat",
        losses=["binary_crossentropy", "mse"],
        metrics=ANY_OUTPUT + _metric_objects("BinaryAccuracy", "AUC", "Precision"),
        keras_differs={"all"},
    ),
    # three independent sigmoids (multi-label): the graph-mode compile estimators use resolves
    # 'accuracy' by the binary crossentropy loss (binary_accuracy), Keras's evaluate by the output's
    # shape (categorical_accuracy)
    "sigmoid-multilabel": dict(
        units=3,
        activation="sigmoid",
        labels="multilabel",
        losses=["binary_crossentropy"],
        keras_differs={"accuracy", "acc", "crossentropy", "ce"},
        metrics=ANY_OUTPUT
        # (AUC(multi_label=True): stock's conversion fails on it, in a session run.)
        + _metric_objects("BinaryAccuracy", "BinaryCrossentropy", "AUC"),
    ),
    # a softmax at every step of a masked sequence
    "sequence-masked": dict(
        units=3,
        activation="softmax",
        labels="onehot",
        steps=3,
        losses=["categorical_crossentropy", "mse"],
        metrics=[
            "accuracy",
            "acc",
            "ce",
            "categorical_accuracy",
            "categorical_crossentropy",
            "mse",
            "binary_crossentropy",
        ]
        + _metric_objects("CategoricalAccuracy", "AUC"),
    ),
    # linear regression
    "linear": dict(
        units=1,
        activation="softplus",  # positive, as poisson and msle want
        labels="regression",
        losses=[
            "mse",
            "mae",
            "mape",
            "msle",
            "huber",
            "log_cosh",
            "poisson",
            "cosine_similarity",
            "kld",
        ],
        metrics=[m for m in ANY_OUTPUT if m not in ("binary_crossentropy", "crossentropy", "ce")]
        + _metric_objects(
            "MeanSquaredError",
            "RootMeanSquaredError",
            "MeanAbsoluteError",
            "MeanAbsolutePercentageError",
            "MeanSquaredLogarithmicError",
            "LogCoshError",
            "CosineSimilarity",
        ),
    ),
}


def _data(labels, units, steps=None):
    rng = np.random.RandomState(5)
    if steps:  # sequences, their later steps zero (masked) at random
        x = rng.rand(ROWS, steps, 4).astype("float32")
        x *= (np.arange(steps)[None, :, None] < rng.randint(1, steps + 1, (ROWS, 1, 1))).astype(
            "float32"
        )
        y = np.eye(units, dtype="float32")[rng.randint(0, units, (ROWS, steps))]
        return x, y
    x = rng.rand(ROWS, 4).astype("float32")
    if labels == "onehot":
        y = np.eye(units, dtype="float32")[rng.randint(0, units, ROWS)]
    elif labels == "sparse":
        y = rng.randint(0, units, (ROWS, 1)).astype("int64")
    elif labels == "binary":
        y = rng.randint(0, 2, (ROWS, 1)).astype("float32")
    elif labels == "flat":
        y = rng.randint(0, 2, ROWS).astype("float32")
    elif labels == "multilabel":
        y = rng.randint(0, 2, (ROWS, units)).astype("float32")
    else:
        y = rng.uniform(0.5, 2.0, (ROWS, units)).astype("float32")
    return x, y


#: Aliases Keras resolves by the loss (and the output's shape): checked under every loss.
BY_LOSS = {"accuracy", "acc", "crossentropy", "ce"}
# (F1Score, FBetaScore and R2Score, Keras >= 2.13, need a static label shape: stock's conversion
# refuses them, as its placeholder targets have none.)


def _model(family):
    """One output per loss of the family (``out0`` ... from a shared hidden layer): every metric
    on the first, the aliases Keras resolves by the loss on each of the others."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    steps = family.get("steps")
    x = tf.keras.Input((steps, 4) if steps else (4,))
    # A Keras mask (Masking: steps of zeros) weighs each step's metrics in stock's graph.
    hidden = tf.keras.layers.Dense(5, activation="relu")(
        tf.keras.layers.Masking()(x) if steps else x
    )
    names = [f"out{i}" for i in range(len(family["losses"]))]
    outputs = {
        n: tf.keras.layers.Dense(family["units"], activation=family["activation"], name=n)(hidden)
        for n in names
    }
    model = tf.keras.Model(x, outputs)
    # Metric objects are stateful: every model gets its own copies.
    metrics = {names[0]: [_copy(m) for m in family["metrics"]]}
    metrics.update({n: [m for m in family["metrics"] if m in BY_LOSS] for n in names[1:]})
    model.compile(
        tf.keras.optimizers.legacy.SGD(0.1),
        dict(zip(names, family["losses"])),
        metrics={n: m for n, m in metrics.items() if m},
    )
    return model


def _copy(metric):
    return metric if isinstance(metric, str) else metric.__class__.from_config(metric.get_config())


def _padded(a):
    """A short batch's rows as tpushim feeds them: padded to BATCH rows."""
    return np.concatenate([a, np.zeros((BATCH - len(a),) + a.shape[1:], a.dtype)])


def _evaluate_in_one_graph(model, x, y):
    """{"stock": metrics, "tpushim": metrics} from stock's EVAL model_fn and tpushim's, in one
    graph, over the same batches, from the model's weights. Every batch carries a padding weight,
    so tpushim's metric_fn gets new tensors (the real rows), as a TPU host gets them from the
    outfeed: nothing of the output tensors' own reaches it."""
    weights = model.get_weights() * 2  # for its two clones, stock's and tpushim's
    # As a conversion does first, outside the graph (keras_lib's first checkpoint clones the
    # model): Keras's cloning reads the compile arguments once, and keeps them.
    compile_args = model._get_compile_args()
    model._get_compile_args = lambda: compile_args
    clones, clone = [], keras_lib._clone_and_build_model
    with tf.Graph().as_default() as graph, pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            keras_lib,
            "_clone_and_build_model",
            lambda *a, **k: clones.append(clone(*a, **k)) or clones[-1],
        )
        tf.compat.v1.train.get_or_create_global_step()
        shape = list(y.shape[1:])
        xs = tf.compat.v1.placeholder(tf.float32, [None] + list(x.shape[1:]))
        ys = tf.compat.v1.placeholder(tf.as_dtype(y.dtype), [None] + shape)
        xp = tf.compat.v1.placeholder(tf.float32, [BATCH] + list(x.shape[1:]))
        yp = tf.compat.v1.placeholder(tf.as_dtype(y.dtype), [BATCH] + shape)
        wp = tf.compat.v1.placeholder(tf.float32, [BATCH])
        labels = lambda t: {n: tf.identity(t) for n in model.output_names}
        stock = keras_lib._create_keras_model_fn(model)(tf.identity(xs), labels(ys), ModeKeys.EVAL)
        shim = _model_fn.make_model_fn(model)(
            {_padding.FEATURES_KEY: tf.identity(xp), _padding.PADDING_KEY: wp},
            labels(yp),
            ModeKeys.EVAL,
            params={"use_tpu": False, "batch_size": BATCH},
        )
        metric_fn, tensors = shim.eval_metrics
        runs = {"stock": stock.eval_metric_ops, "tpushim": metric_fn(**tensors)}
        assign = Assigner(graph, [w for c in clones for w in c.weights])
        losses = []
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(tf.compat.v1.local_variables_initializer())
            assign(sess, weights)
            for i in range(0, ROWS, BATCH):
                bx, by = x[i : i + BATCH], y[i : i + BATCH]
                real = np.array([1.0] * len(bx) + [0.0] * (BATCH - len(bx)), "float32")
                feed = {xs: bx, ys: by, xp: _padded(bx), yp: _padded(by), wp: real}
                updates = {k: {n: op for n, (_, op) in r.items()} for k, r in runs.items()}
                losses.append(sess.run([updates, stock.loss, shim.loss], feed)[1:])
            values = sess.run({k: {n: v for n, (v, _) in r.items()} for k, r in runs.items()})
    # Stock's eval loss is the mean of the batches' losses.
    values["stock"]["loss"], values["tpushim"]["loss"] = np.mean(losses, axis=0)
    return values


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_builtin_metric_equals_stock_and_keras(family):
    """Every metric of the family under its first loss, and the aliases Keras resolves by the
    loss under each of the others: tpushim == stock (each metric and the loss), and stock ==
    Keras's own model.evaluate."""
    spec = FAMILIES[family]
    x, y = _data(spec["labels"], spec["units"], spec.get("steps"))
    model = _model(spec)
    outputs = {n: y for n in model.output_names}
    keras = model.evaluate(x, outputs, batch_size=BATCH, verbose=0, return_dict=True)
    got = _evaluate_in_one_graph(_model(spec), x, y)
    stock = tfcases.stock_metric_names(got["stock"], model.output_names)
    assert set(got["tpushim"]) == set(stock)
    aliases = sum(m in BY_LOSS for m in spec["metrics"])
    metrics = len(spec["metrics"]) + aliases * (len(spec["losses"]) - 1)
    assert len([n for n in stock if not n.endswith("loss")]) == metrics  # every metric
    differs = spec.get("keras_differs", set())
    for name, want in stock.items():
        assert abs(got["tpushim"][name] - want) <= TOL, (name, got["tpushim"][name], want)
        # Stock's estimator reports what Keras's own evaluate reports (but the losses: stock's
        # are means of the batches' losses, Keras's of the rows').
        metric = re.sub(r"^out\d+_", "", name)  # with one output, Keras adds no prefix
        if not metric.endswith("loss") and "all" not in differs and metric not in differs:
            assert abs(keras[name] - want) <= TOL, ("keras", name, keras[name], want)
