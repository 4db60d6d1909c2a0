"""[batch] labels for a [batch, 1] output on the strategy engine (tpushim/_strategy/loss.py), as legacy
scripts feed them. Keras reduces that output's loss to one value inside the loss function, so the
engine reads the labels as [batch, 1] for the loss (one loss per row, as the TPU path does when it
pads) to weigh padding rows out; its host metrics read them as stock's graph does (a metric
reducing the last axis, ``mae``, gives one value per batch, averaged over the batches). Training
on a short last batch then equals stock's within 1e-5, as do the eval loss, every metric and the
predictions: a regression output beside a softmax one, and a sigmoid output with
accuracy / crossentropy / mae / AUC.

With sample weights and every loss kind: Keras squeezes the [batch, 1] output to [batch], so a
loss reducing the last axis (mse, binary crossentropy, a SUM loss, KL divergence) is one number
for the batch -- the rows' mean or sum whatever the loss's reduction -- which stock cannot weigh
per example (its first step fails: the engine refuses it before anything is written), while a
per-example custom loss and sparse categorical crossentropy weigh each row. [batch, 1] labels
with weights too. The same on a subclassed model (its output's shape known once it is called),
and on the TPUEstimator path in cpu mode (weighted_metrics weighing each row). Sample weights
stock's graph refuses ([batch, 1], [batch, k]) are refused by both paths with stock's error
before anything is written. On TensorFlow >= 2.16 "stock" is tpushim's own Estimator (tpushim/_estimator_api),
proven equal to stock 2.15 elsewhere."""

import numpy as np
import pytest
import tfcases

TOLERANCE = 1e-5

pytestmark = pytest.mark.slow


def _sigmoid_model():
    import tensorflow as tf

    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((4,), name="x"),
            tf.keras.layers.Dense(5, activation="tanh"),
            tf.keras.layers.Dense(1, activation="sigmoid", name="p"),
        ]
    )
    model.compile(
        "adam",
        "binary_crossentropy",
        metrics=["accuracy", "binary_crossentropy", "mae", tf.keras.metrics.AUC(name="auc")],
    )
    return model


def _data(case):
    if case == "regression":
        x, y = tfcases.two_in_two_out_data(reg_labels_1d=True)  # 'reg': [52] for a [52, 1] output
        assert y["reg"].ndim == 1
        return tfcases.two_in_two_out, x, y
    rng = np.random.RandomState(5)
    x = rng.rand(tfcases.N, 4).astype("float32")
    return _sigmoid_model, x, (x[:, 0] + rng.rand(tfcases.N) > 1.0).astype("float32")  # [52]


def _run(model_dir, patch, case):
    build, x, y = _data(case)
    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
    estimator = tfcases.convert(model_dir, build, patch=patch, config=config)
    # batches of 8 over 52 rows: the 7th step trains on a short batch of 4, which the engine pads;
    # evaluation's batches are 8 and 4 rows: a per-batch mean is not the rows' mean
    estimator.train(tfcases.dataset_input_fn(x, y), steps=7)
    metrics = estimator.evaluate(tfcases.dataset_input_fn(x, y))
    predictions = list(estimator.predict(tfcases.dataset_input_fn(x)))
    return estimator, metrics, predictions, tfcases.checkpoint_values(model_dir)


@pytest.mark.parametrize("case", ["regression", "sigmoid"])
def test_batch_labels_for_a_batch_by_one_output_as_stock(tmp_path, case):
    from tpushim._strategy import estimator as _strategy_estimator

    stock = _run(tmp_path / "stock", {"mode": "off"}, case)
    engine = _run(tmp_path / "engine", {"mode": "cpu", "engine": "strategy"}, case)
    assert isinstance(engine[0], _strategy_estimator.StrategyEstimator)
    assert len(engine[2]) == tfcases.N
    tfcases.assert_same(stock, engine, TOLERANCE)
    # stock's own names (Keras 2's growing output prefix included)
    expected = (
        {"loss", "reg_mae", "reg_reg_reg_root_mean_squared_error", "cls_accuracy"}
        if case == "regression"
        else {"loss", "accuracy", "binary_crossentropy", "mae", "auc"}
    )
    assert expected <= set(engine[1])


def absolute_error(y_true, y_pred):  # one value per example: Keras weighs each row
    import tensorflow as tf

    return tf.abs(y_true - y_pred)


def _loss(name):
    import tensorflow as tf

    return {
        "mse": "mse",
        "bce": "binary_crossentropy",
        "sum": tf.keras.losses.MeanSquaredError(reduction="sum"),
        "kld": "kl_divergence",  # sums the last axis: on [batch] labels, the batch (degree 1)
        "custom": absolute_error,
        "scce": "sparse_categorical_crossentropy",
    }[name]


def _subclassed(units, activation):
    """A subclassed model (no functional graph: its output's shape is known once called)."""
    import tensorflow as tf

    class Rows(tf.keras.Model):
        def __init__(self, units=1, activation="sigmoid", **kwargs):
            super().__init__(**kwargs)
            self.units, self.activation = units, activation
            seeded = tf.keras.initializers.GlorotUniform
            self.hidden = tf.keras.layers.Dense(5, activation="tanh", kernel_initializer=seeded(1))
            self.out = tf.keras.layers.Dense(
                units, activation=activation, kernel_initializer=seeded(2)
            )

        def call(self, x):
            return self.out(self.hidden(x))

        def get_config(self):
            return {"units": self.units, "activation": self.activation}

    return Rows(units, activation)


def _family_model(loss, weighted_metrics=True, subclassed=False):
    import tensorflow as tf

    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    classes = 3 if loss == "scce" else 1
    activation = "softmax" if classes > 1 else "sigmoid"
    if subclassed:
        model = _subclassed(classes, activation)
    else:
        model = tf.keras.Sequential(
            [
                tf.keras.Input((4,), name="x"),
                tf.keras.layers.Dense(5, activation="tanh"),
                tf.keras.layers.Dense(classes, activation=activation, name="p"),
            ]
        )
    metrics = ["accuracy"] if loss == "scce" else ["accuracy", "mae"]
    # each row weighed, as model.evaluate weighs them
    weighted = ["mse"] if loss == "custom" and weighted_metrics else None
    model.compile(
        tf.keras.optimizers.legacy.SGD(0.5), _loss(loss), metrics=metrics, weighted_metrics=weighted
    )
    return model


def _family_data(loss, labels, weights):
    """Features (``{"features", "sample_weights"}`` with weights [52], or ``"batch_by_one"``
    [52, 1]), labels [52] or [52, 1]."""
    rng = np.random.RandomState(5)
    x = rng.rand(tfcases.N, 4).astype("float32")
    if loss == "scce":
        y = np.minimum(x[:, 0] * 3, 2).astype("int64")
    else:
        y = (x[:, 0] + rng.rand(tfcases.N) > 1.0).astype("float32")
    y = y if labels == "batch" else y[:, None]
    w = rng.uniform(0.2, 2.0, tfcases.N).astype("float32")
    w = w[:, None] if weights == "batch_by_one" else w
    return (x if weights is None else {"features": x, "sample_weights": w}), y


def _family_run(model_dir, patch, loss, labels, weights, weighted_metrics=True, subclassed=False):
    features, y = _family_data(loss, labels, weights)
    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
    # stock takes a subclassed model with checkpoint_format='saver'
    saver = {"checkpoint_format": "saver"} if subclassed else {}
    estimator = tfcases.convert(
        model_dir,
        lambda: _family_model(loss, weighted_metrics, subclassed),
        patch=patch,
        config=config,
        **saver,
    )
    # a short last batch of 4 in training and evaluation
    estimator.train(tfcases.dataset_input_fn(features, y), steps=7)
    metrics = estimator.evaluate(tfcases.dataset_input_fn(features, y))
    x = features if weights is None else features["features"]
    predictions = list(estimator.predict(tfcases.dataset_input_fn(x)))
    return estimator, metrics, predictions, _values(model_dir, subclassed)


def _values(model_dir, subclassed):
    """The checkpoint's values; a subclassed model's by the path below its own name (Keras
    numbers a model's name by the models made before it in the process), as stock's
    name-based Saver reads the engine's object-based checkpoint."""
    if not subclassed:
        return tfcases.checkpoint_values(model_dir)
    import tensorflow as tf
    from tensorflow.python.training import saver as saver_lib

    path = tf.train.latest_checkpoint(str(model_dir))
    reader = tf.train.load_checkpoint(path)
    names = {n for n, _ in tf.train.list_variables(path)}
    keys = (
        saver_lib.object_graph_key_mapping(path)
        if "_CHECKPOINTABLE_OBJECT_GRAPH" in names
        else {n: n for n in names}
    )
    return {
        n.split("/", 1)[1]: reader.get_tensor(k)
        for n, k in keys.items()
        if n.count("/") >= 2 and not n.startswith("training/") and "OPTIMIZER_SLOT" not in k
    }


#: (loss, labels, sample weights) that stock trains: weights only where the loss is per example.
FAMILY = [
    ("mse", "batch", None),
    ("bce", "batch", None),
    ("sum", "batch", None),
    ("kld", "batch", None),
    ("custom", "batch", "batch"),
    ("scce", "batch", "batch"),
    ("sum", "batch_by_one", "batch"),
    ("custom", "batch", None),  # its weighted_metrics unweighted, read as stock's graph reads
]
#: The same [batch] labels on a subclassed model (its output's shape known once it is called).
SUBCLASSED = [("sum", "batch", None), ("kld", "batch", None), ("custom", "batch", "batch")]


@pytest.mark.parametrize(
    "loss,labels,weights,subclassed",
    [(*case, False) for case in FAMILY] + [(*case, True) for case in SUBCLASSED],
)
def test_every_loss_kind_with_sample_weights_as_stock(tmp_path, loss, labels, weights, subclassed):
    stock = _family_run(
        tmp_path / "stock", {"mode": "off"}, loss, labels, weights, subclassed=subclassed
    )
    engine = _family_run(
        tmp_path / "engine",
        {"mode": "cpu", "engine": "strategy"},
        loss,
        labels,
        weights,
        subclassed=subclassed,
    )
    assert len(engine[2]) == tfcases.N
    if loss != "custom" or weights is None:
        tfcases.assert_same(stock, engine, TOLERANCE)
        return
    # weighted_metrics: weighted by tpushim (docs/reference/differences.md), as Keras's
    # model.evaluate weighs them: each row's squared error, on stock's predictions.
    tfcases.assert_same(stock, engine, TOLERANCE, skip=("mse",))
    _assert_weighted_mse(engine[1]["mse"], stock[2], loss, labels, weights)


def _assert_weighted_mse(got, stock_predictions, loss, labels, weights):
    """Keras's model.evaluate value of the weighted "mse" on stock's predictions."""
    features, y = _family_data(loss, labels, weights)
    w = features["sample_weights"]
    predictions = np.array([np.ravel(next(iter(p.values())))[0] for p in stock_predictions])
    errors = (predictions - y.reshape(-1)) ** 2
    np.testing.assert_allclose(got, np.sum(w * errors) / np.sum(w), atol=TOLERANCE)


@pytest.mark.parametrize("subclassed", [False, True])
def test_a_sum_loss_read_per_row_is_caught(tmp_path, monkeypatch, subclassed):
    """Negative control: the engine as it was, reading [batch] labels as [batch, 1] for every
    loss (a subclassed model's always), sums a SUM loss over the rows where stock takes their
    mean."""
    from tpushim import _padding
    from tpushim._strategy import loss as _strategy_loss

    stock = _family_run(
        tmp_path / "stock", {"mode": "off"}, "sum", "batch", None, subclassed=subclassed
    )
    monkeypatch.setattr(
        _strategy_loss,
        "row_label_term",
        lambda name, loss, kind, y_true, y_pred, weight: (
            _padding.row_labels(y_true, y_pred),
            kind,
        ),
    )
    engine = _family_run(
        tmp_path / "engine",
        {"mode": "cpu", "engine": "strategy"},
        "sum",
        "batch",
        None,
        subclassed=subclassed,
    )
    with pytest.raises(AssertionError):
        tfcases.assert_same(stock, engine, TOLERANCE)


@pytest.mark.parametrize("loss", ["mse", "sum"])
@pytest.mark.parametrize("call", ["train", "evaluate"])
def test_weights_on_a_one_number_loss_are_refused_before_anything_is_written(tmp_path, loss, call):
    """Stock's first step fails on them ("Can not squeeze dim[0]"): refused, naming the fix."""
    import os

    from tpushim._errors import ConversionError

    features, y = _family_data(loss, "batch", "batch")
    model_dir = tmp_path / "engine"
    estimator = tfcases.convert(
        model_dir, lambda: _family_model(loss), patch={"mode": "cpu", "engine": "strategy"}
    )
    if call == "evaluate":  # trained on [batch, 1] labels, evaluated on [batch] ones
        estimator.train(tfcases.dataset_input_fn(features, y[:, None]), steps=1)
    before = sorted(os.listdir(model_dir)) if model_dir.exists() else []
    with pytest.raises(ConversionError, match=r"\[batch, 1\] \(labels\[:, None\]"):
        getattr(estimator, call)(tfcases.dataset_input_fn(features, y), steps=1)
    after = sorted(os.listdir(model_dir)) if model_dir.exists() else []
    assert after == before


def _refused_weight_data(labels, weights):
    features, y = _family_data("scce" if weights == "per_class" else "mse", labels, "batch")
    if weights == "per_class":  # [52, 3] for the [52, 3] softmax output
        features["sample_weights"] = np.tile(features["sample_weights"][:, None], (1, 3))
    elif weights == "batch_by_one":
        features["sample_weights"] = features["sample_weights"][:, None]
    return features, y


def _refusal(model_dir, patch, labels, weights, call):
    """(the error ``call`` raised, model_dir's files before it, after it)."""
    import os

    features, y = _refused_weight_data(labels, weights)
    loss = "scce" if weights == "per_class" else "mse"
    estimator = tfcases.convert(model_dir, lambda: _family_model(loss, False), patch=patch)
    if call == "evaluate":  # trained on [batch] weights first
        plain, _ = _family_data(loss, labels, "batch")
        estimator.train(tfcases.dataset_input_fn(plain, y), steps=1)
    before = sorted(os.listdir(model_dir)) if model_dir.exists() else []
    with pytest.raises(ValueError) as raised:
        getattr(estimator, call)(tfcases.dataset_input_fn(features, y), steps=1)
    return raised.value, before, sorted(os.listdir(model_dir)) if model_dir.exists() else []


@pytest.mark.parametrize(
    "labels,weights,call",
    [
        ("batch_by_one", "batch_by_one", "train"),
        ("batch", "batch_by_one", "train"),  # before the one-number refusal, as stock
        ("batch", "per_class", "train"),
        ("batch_by_one", "batch_by_one", "evaluate"),
    ],
)
@pytest.mark.parametrize("engine", ["strategy", "tpuestimator"])
def test_sample_weights_stock_refuses_are_refused_with_its_error(
    tmp_path, labels, weights, call, engine
):
    """[batch, 1] and [batch, k] sample weights: Keras's graph takes [batch] weights only
    (sample_weight_mode "temporal": [batch, time]), and stock fails building its step; both
    paths refuse them with stock's error before anything is written."""
    if engine == "tpuestimator" and tfcases.TF_VERSION >= (2, 16):
        pytest.skip("no TPUEstimator on TensorFlow >= 2.16")
    stock, _, _ = _refusal(tmp_path / "stock", {"mode": "off"}, labels, weights, call)
    shape = "(None, 3)" if weights == "per_class" else "(None, 1)"
    assert str(stock) == f"Received sample weight with shape {shape}. Expected shape [None]."
    patch = {"mode": "cpu", "engine": engine}
    error, before, after = _refusal(tmp_path / engine, patch, labels, weights, call)
    assert str(error) == str(stock)
    assert after == before


TPUESTIMATOR = pytest.mark.skipif(
    tfcases.TF_VERSION >= (2, 16), reason="no TPUEstimator on TensorFlow >= 2.16"
)


@TPUESTIMATOR
@pytest.mark.parametrize(
    "loss,labels,weights,subclassed",
    [(*case, False) for case in (FAMILY[2], FAMILY[3], FAMILY[4], FAMILY[7])]
    + [(*case, True) for case in SUBCLASSED],
)
def test_the_tpuestimator_path_as_stock(tmp_path, loss, labels, weights, subclassed):
    """The same family on the TPUEstimator path in cpu mode (its padded short batch): a SUM
    loss and kl_divergence on [batch] labels were read per row there too (a subclassed
    model's until its output's shape was read from its call); a weighted "mse" on [batch]
    labels weighs each row, as on the engine."""
    stock = _family_run(
        tmp_path / "stock", {"mode": "off"}, loss, labels, weights, subclassed=subclassed
    )
    patch = {"mode": "cpu", "engine": "tpuestimator"}
    shim = _family_run(tmp_path / "shim", patch, loss, labels, weights, subclassed=subclassed)
    assert isinstance(shim[0], tfcases.ESTIMATOR.tpu.TPUEstimator)
    tfcases.assert_same(stock, shim, TOLERANCE, skip=("mse",))
    if weights is not None:
        _assert_weighted_mse(shim[1]["mse"], stock[2], loss, labels, weights)


@TPUESTIMATOR
def test_the_tpuestimator_path_refuses_weights_on_a_one_number_loss(tmp_path):
    from tpushim._errors import ConversionError

    features, y = _family_data("mse", "batch", "batch")
    estimator = tfcases.convert(
        tmp_path, lambda: _family_model("mse"), patch={"mode": "cpu", "engine": "tpuestimator"}
    )
    with pytest.raises(ConversionError, match=r"\[batch, 1\] \(labels\[:, None\]"):
        estimator.train(tfcases.dataset_input_fn(features, y), steps=1)
    assert not tf_checkpoint_written(tmp_path)


def tf_checkpoint_written(model_dir):
    import tensorflow as tf

    return tf.train.latest_checkpoint(str(model_dir)) is not None


def _temporal_model():
    tf = tfcases.tf
    tf.keras.utils.set_random_seed(1)
    m = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(5, input_shape=(3, 2), activation="tanh", name="hidden"),
            tf.keras.layers.Dense(1, name="out"),
        ]
    )
    m.compile("sgd", loss="mse", sample_weight_mode="temporal")
    return m


@pytest.mark.parametrize("engine", ["strategy", "tpuestimator"])
def test_temporal_sample_weights_are_refused_as_stock_refuses_them(tmp_path, engine):
    """A model compiled with ``sample_weight_mode="temporal"`` and [batch, time] weights: stock's
    estimator compiles its clone without the mode and fails building its step; both paths refuse
    them with stock's error, before anything is written (what 8 replicas would do with them is
    then never asked)."""
    import os

    if engine == "tpuestimator" and tfcases.TF_VERSION >= (2, 16):
        pytest.skip("no TPUEstimator on TensorFlow >= 2.16")
    rng = np.random.RandomState(0)
    x = rng.randn(20, 3, 2).astype(np.float32)
    features = {"features": x, "sample_weights": rng.uniform(0, 2, (20, 3)).astype(np.float32)}
    input_fn = tfcases.dataset_input_fn(features, x[..., :1])
    errors = {}
    for name, patch in (("stock", {"mode": "off"}), (engine, {"mode": "cpu", "engine": engine})):
        estimator = tfcases.convert(tmp_path / name, _temporal_model, patch=patch)
        before = sorted(os.listdir(tmp_path / name))  # the conversion's keras/ warm start
        with pytest.raises(ValueError) as raised:
            estimator.train(input_fn, steps=1)
        errors[name] = str(raised.value)
        assert sorted(os.listdir(tmp_path / name)) == before
    assert errors["stock"] == "Received sample weight with shape (None, 3). Expected shape [None]."
    assert errors[engine] == errors["stock"]


def _labels_1d_paths():
    from tpushim import _versions

    if _versions.uses_own_estimator():  # TensorFlow >= 2.16: stock 2.15's recorded numbers
        return {"strategy engine": "mode='cpu', quiet=True"}
    return {
        "stock": "",  # live, and equal to what was recorded
        "TPUEstimator path": "mode='cpu', quiet=True",
        "strategy engine": "mode='cpu', engine='strategy', quiet=True",
    }


@pytest.mark.parametrize("path", sorted(_labels_1d_paths()))
def test_batch_labels_for_a_softmax_output_give_stocks_accuracy(tmp_path, path):
    """[batch] labels for a 3-unit softmax output (tests/api215.py ``labels_1d``): with a user's
    loss, stock's ``accuracy`` is categorical, and stock's graph hands it the [batch] labels as
    they are (the argmax over each batch's labels); with the sparse loss by name, sparse. The
    engine's metrics container expanded the labels to [batch, 1] first (accuracy 1.0 where stock
    gives 0.538). Every key within 1e-5 of stock 2.15's, a short last batch padded."""
    import json

    import api215

    with open(api215.OUT, encoding="utf-8") as f:
        recorded = json.load(f)["results"]["labels_1d"]
    paths = _labels_1d_paths()
    patch = f"import tpushim; tpushim.patch({paths[path]})" if paths[path] else ""
    got = api215.run("labels_1d", tmp_path, patch=patch, env={"TF_USE_LEGACY_KERAS": ""})
    # what stock's rule gives, spelled out: a user's loss differs from the sparse one
    assert abs(recorded["users_loss"]["accuracy"] - 0.538462) < 1e-6
    assert abs(recorded["sparse_by_name"]["accuracy"] - 0.480769) < 1e-6
    assert set(got) == set(recorded), json.dumps(got)
    for case, want in recorded.items():
        assert set(got[case]) == set(want), (case, got[case])
        for key, value in want.items():
            assert abs(got[case][key] - value) <= TOLERANCE, (case, key, got[case][key], value)
