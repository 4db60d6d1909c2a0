"""Rung 1: cpu mode (TPUEstimator(use_tpu=False), the TPU code path) == the stock estimator.

Same model, data and seed: final weights, every evaluate() key and predict() outputs within 1e-5.
N=52 examples in batches of 8, so evaluation and prediction also prove the padding of the last batch.
"""

import numpy as np
import pytest
import tensorflow as tf
import tfcases

# cpu mode's TPUEstimator against stock: the TPU path throughout.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.tpuestimator,
]  # trains estimators or runs scripts: outside the fast tier


@pytest.mark.parametrize("spelling", ["v2", "v1"])
def test_sequential_sgd_momentum(tmp_path, spelling):
    x, y = tfcases.data()
    fn = tfcases.dataset_input_fn(x, y)
    stock, shim = tfcases.compare(
        tmp_path, tfcases.sequential, fn, fn, tfcases.dataset_input_fn(x), spelling=spelling
    )
    assert set(stock[1]) == {"accuracy", "loss", "global_step"}
    assert stock[1]["global_step"] == shim[1]["global_step"] == 6
    assert len(shim[2]) == tfcases.N


def test_sequential_adam_v1_and_new_style_optimizer(tmp_path):
    x, y = tfcases.data()
    fn = tfcases.dataset_input_fn(x, y)
    tfcases.compare(
        tmp_path / "legacy",
        lambda: tfcases.sequential(tf.keras.optimizers.legacy.Adam(0.01)),
        fn,
        fn,
        spelling="v1",
    )
    # A new-style Keras optimizer is converted to its legacy twin, as stock does.
    tfcases.compare(
        tmp_path / "new", lambda: tfcases.sequential(tf.keras.optimizers.Adam(0.01)), fn, fn
    )


@pytest.mark.parametrize("spelling", ["v1", "v2"])
def test_tf_compat_v1_train_optimizer(tmp_path, spelling):
    x, y = tfcases.data()
    fn = tfcases.dataset_input_fn(x, y)
    tfcases.compare(
        tmp_path,
        lambda: tfcases.sequential(tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)),
        fn,
        fn,
        spelling=spelling,
    )


@pytest.mark.parametrize("spelling", ["v1", "v2"])
@pytest.mark.parametrize("optimizer", sorted(tfcases.OPTIMIZERS))
def test_two_inputs_two_outputs_dicts(tmp_path, optimizer, spelling):
    features, labels = tfcases.two_in_two_out_data()
    fn = tfcases.dataset_input_fn(features, labels)
    _, shim = tfcases.compare(
        tmp_path,
        lambda: tfcases.two_in_two_out(optimizer),
        fn,
        fn,
        tfcases.dataset_input_fn(features),
        output_names=("cls", "reg"),
        spelling=spelling,
    )
    assert set(shim[1]) == {
        "cls_accuracy",
        "reg_mae",
        "reg_root_mean_squared_error",
        "loss",
        "global_step",
    }
    assert set(shim[2][0]) == {"cls", "reg"}


def test_metric_names_stay_stable_across_evaluations(tmp_path):
    """Deliberate deviation: stock's names grow (reg_reg_reg_...) with every clone; ours do not."""
    features, labels = tfcases.two_in_two_out_data()
    fn = tfcases.dataset_input_fn(features, labels)
    stock = tfcases.run("off", tfcases.two_in_two_out, fn, fn, None, tmp_path / "stock", steps=1)[0]
    shim = tfcases.run("cpu", tfcases.two_in_two_out, fn, fn, None, tmp_path / "shim", steps=1)[0]
    stock_names = [sorted(stock.evaluate(fn)) for _ in range(2)]
    shim_names = [sorted(shim.evaluate(fn)) for _ in range(2)]
    assert stock_names[0] != stock_names[1]  # the Keras 2 bug this deviation avoids
    assert shim_names[0] == shim_names[1]
    assert "reg_root_mean_squared_error" in shim_names[0]


def test_metric_names_map(tmp_path):
    features, labels = tfcases.two_in_two_out_data()
    fn = tfcases.dataset_input_fn(features, labels)
    names = {"cls_accuracy": "acc", "reg_mae": "mae", "reg_root_mean_squared_error": "rmse"}
    _, shim = tfcases.compare(
        tmp_path / "a", tfcases.two_in_two_out, fn, fn, output_names=("cls", "reg")
    )
    mapped = tfcases.run(
        "cpu",
        tfcases.two_in_two_out,
        fn,
        fn,
        None,
        tmp_path / "b",
        convert_kwargs={"metric_names_map": names},
    )[1]
    assert set(mapped) == {"acc", "mae", "rmse", "loss", "global_step"}
    for old, new in names.items():
        assert mapped[new] == pytest.approx(shim[1][old], abs=1e-6)


def test_sample_weights(tmp_path):
    x, y = tfcases.data()
    w = np.linspace(0.1, 2.0, tfcases.N).astype("float32")
    fn = tfcases.dataset_input_fn({"features": x, "sample_weights": w}, y)

    def build():
        model = tfcases.sequential()
        model.compile(
            optimizer=tf.keras.optimizers.legacy.SGD(0.1),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            weighted_metrics=["accuracy"],
        )
        return model

    # Stock model_to_estimator does not weight weighted_metrics (its docstring says so: it reports
    # them unweighted). tpushim weights them, as Keras's own model.evaluate does: that is the
    # reference for this one key; everything else equals stock.
    _, shim = tfcases.compare(tmp_path, build, fn, fn, skip=("accuracy_1",), spelling="v1")
    model = build()
    estimator = shim[0]
    trained = {
        n: tf.train.load_variable(estimator.model_dir, n)
        for n in ("hidden/kernel", "hidden/bias", "probs/kernel", "probs/bias")
    }
    model.get_layer("hidden").set_weights([trained["hidden/kernel"], trained["hidden/bias"]])
    model.get_layer("probs").set_weights([trained["probs/kernel"], trained["probs/bias"]])
    keras = model.evaluate(x, y, sample_weight=w, batch_size=8, verbose=0, return_dict=True)
    assert shim[1]["accuracy_1"] == pytest.approx(keras["weighted_accuracy"], abs=1e-5)
    assert shim[1]["accuracy"] == pytest.approx(keras["accuracy"], abs=1e-5)
    assert shim[1]["accuracy"] != pytest.approx(shim[1]["accuracy_1"], abs=1e-3)


@pytest.mark.parametrize(
    "optimizer,spelling",
    [("keras-sgd-momentum", "v2"), ("keras-adam", "v1"), ("tf1-momentum", "v2")],
)
def test_batchnorm_and_dropout(tmp_path, optimizer, spelling):
    x, y = tfcases.data()
    fn = tfcases.dataset_input_fn(x, y)
    # Dropout needs a seed for any two runs (stock or not) to draw the same masks.
    layers = lambda: (
        tf.keras.layers.BatchNormalization(name="bn"),
        tf.keras.layers.Dropout(0.3, seed=5, name="drop"),
    )
    build = lambda: tfcases.sequential(tfcases.OPTIMIZERS[optimizer](), extra_layers=layers())
    tfcases.compare(tmp_path, build, fn, fn, tfcases.dataset_input_fn(x), spelling=spelling)


class Scale(tf.keras.layers.Layer):
    """A custom layer reached through custom_objects."""

    def build(self, input_shape):
        self.scale = self.add_weight("scale", shape=(input_shape[-1],), initializer="ones")

    def call(self, inputs):
        return inputs * self.scale


def test_custom_layer_through_custom_objects(tmp_path):
    x, y = tfcases.data()
    fn = tfcases.dataset_input_fn(x, y)
    tfcases.compare(
        tmp_path,
        lambda: tfcases.sequential(extra_layers=(Scale(name="scale"),)),
        fn,
        fn,
        convert_kwargs={"custom_objects": {"Scale": Scale}},
    )


class AddsLoss(tf.keras.layers.Layer):
    """A custom layer that adds a loss from what it is called on (tpushim classifies it on a
    clone in a graph of its own before stock's first checkpoint)."""

    def call(self, inputs):
        self.add_loss(0.1 * tf.reduce_mean(tf.square(inputs)))
        return inputs


def _functional_adding_a_loss():
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((4,), name="hidden_input")
    hidden = AddsLoss(name="adds")(
        tf.keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    )
    model = tf.keras.Model(
        inputs, tf.keras.layers.Dense(3, activation="softmax", name="probs")(hidden)
    )
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy")
    return model


@pytest.mark.parametrize("kind", ["sequential", "functional"])
def test_a_custom_layer_adding_a_loss_from_its_inputs(tmp_path, kind):
    """Converted as stock converts it: tpushim's scratch clone (which tells a mean from a sum)
    left Keras's classes v1, and the model's weights could not be read for the first checkpoint
    ("no attribute '_compile_time_distribution_strategy'"). Full batches: a TPU refuses an
    input loss on padded ones."""
    x, y = tfcases.data(n=48)
    fn = tfcases.dataset_input_fn(x, y)
    build = {
        "sequential": lambda: tfcases.sequential(extra_layers=(AddsLoss(name="adds"),)),
        "functional": _functional_adding_a_loss,
    }[kind]
    tfcases.compare(
        tmp_path, build, fn, fn, convert_kwargs={"custom_objects": {"AddsLoss": AddsLoss}}
    )


class RowSumActivity(tf.keras.regularizers.Regularizer):
    """A user's own activity regularizer (not one of Keras's: evaluated one row at a time)."""

    def __call__(self, x):
        return 0.03 * tf.reduce_sum(tf.abs(x))

    def get_config(self):
        return {}


@pytest.mark.parametrize("regularizer", ["l2", "l1l2", "own"])
def test_an_activity_regularizer_over_a_padded_eval_batch_as_stock(tmp_path, regularizer):
    """The eval loss of a model with an activity regularizer, its last batch short (52 rows in
    batches of 8: padded to 8): the term over the real rows, as stock's batch of 4 has it (Keras's
    own term is a mean over the padded batch: 1.0718939 against stock's 1.0717617 for ``l2``);
    a regularizer in the middle of the model and on a layer called twice (two terms). Training
    batches full: a TPU refuses an input loss on padded ones."""
    x, y = tfcases.data()
    make = {
        "l2": lambda: tf.keras.regularizers.l2(0.05),
        "l1l2": lambda: tf.keras.regularizers.L1L2(0.01, 0.02),
        "own": RowSumActivity,
    }[regularizer]

    def build():
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        inputs = tf.keras.Input((4,), name="x")
        shared = tf.keras.layers.Dense(4, activation="tanh", activity_regularizer=make())
        hidden = shared(shared(inputs))  # one layer, two calls: a term per call
        hidden = tf.keras.layers.Dense(5, activation="relu", activity_regularizer=make())(hidden)
        outputs = tf.keras.layers.Dense(3, activation="softmax", name="probs")(hidden)
        model = tf.keras.Model(inputs, outputs)
        model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy")
        return model

    train = tfcases.dataset_input_fn(x, y, repeat=True, drop_remainder=True)
    stock, _ = tfcases.compare(
        tmp_path,
        build,
        train,
        tfcases.dataset_input_fn(x, y),  # the last batch 4 rows
        steps=4,
        convert_kwargs={"custom_objects": {"RowSumActivity": RowSumActivity}},
    )
    assert stock[1]["global_step"] == 4


@pytest.mark.parametrize(
    "fmt,optimizer,spelling",
    [
        ("h5", "keras-sgd-momentum", "v2"),
        ("savedmodel", "keras-adam", "v1"),
        ("savedmodel", "keras-sgd-momentum", "v2"),
    ],
)
def test_keras_model_path(tmp_path, fmt, optimizer, spelling):
    x, y = tfcases.data()
    model = tfcases.sequential(tfcases.OPTIMIZERS[optimizer]())
    model.fit(x, y, epochs=1, verbose=0)  # trained before saving: the weights must carry over
    path = str(tmp_path / ("model.h5" if fmt == "h5" else "saved"))
    model.save(path)
    fn = tfcases.dataset_input_fn(x, y)
    stock, shim = tfcases.compare(
        tmp_path,
        None,
        fn,
        fn,
        convert_kwargs={"keras_model_path": path},
        steps=3,
        spelling=spelling,
    )
    assert shim[1]["loss"] == pytest.approx(stock[1]["loss"], abs=1e-5)


def test_sample_weights_for_some_outputs_only(tmp_path):
    """Sample weights for one output of two: Keras 2 then recompiles the clone's loss WITHOUT any
    sample weights when it makes the train/test function, so stock trains and evaluates unweighted;
    cpu mode must report that same eval loss (it once weighted the one given output)."""
    features, labels = tfcases.two_in_two_out_data()
    weights = {"cls": np.linspace(0.1, 2.0, tfcases.N).astype("float32")}
    fn = tfcases.dataset_input_fn({"features": features, "sample_weights": weights}, labels)
    tfcases.compare(
        tmp_path,
        lambda: tfcases.two_in_two_out("keras-sgd-momentum"),
        fn,
        fn,
        output_names=("cls", "reg"),
        spelling="v1",
    )


# -- a tf1 optimizer wrapping another (#34): beyond stock --------------------------------------


class ClipByNorm(tf.compat.v1.train.Optimizer):
    """A gradient-clipping wrapper as scripts wrote them before ``tf.contrib`` went (contrib's
    ``clip_gradients_by_norm``): it delegates to an inner ``tf.compat.v1.train`` optimizer, whose
    slots it does not list."""

    def __init__(self, optimizer, clip_norm, name="ClipByNorm"):
        super().__init__(use_locking=False, name=name)
        self._optimizer, self._clip_norm = optimizer, clip_norm

    def compute_gradients(self, *args, **kwargs):
        gradients, variables = zip(*self._optimizer.compute_gradients(*args, **kwargs))
        clipped, _ = tf.clip_by_global_norm(gradients, self._clip_norm)
        return list(zip(clipped, variables))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        return self._optimizer.apply_gradients(grads_and_vars, global_step, name)


def _adagrad(clip_norm=None):
    def build():
        optimizer = tf.compat.v1.train.AdagradOptimizer(0.1)
        if clip_norm is not None:
            optimizer = ClipByNorm(optimizer, clip_norm)
        return tfcases.sequential(optimizer=optimizer)

    return build


def _adagrad_run(mode, build, model_dir):
    x, y = tfcases.data()
    fn = tfcases.dataset_input_fn(x, y, repeat=True)
    return tfcases.run(
        mode,
        build,
        fn,
        tfcases.dataset_input_fn(x, y),
        tfcases.dataset_input_fn(x),
        model_dir,
        spelling="v1",
    )


def test_a_wrapping_tf1_optimizer_trains_where_stock_fails_at_its_first_checkpoint(tmp_path):
    """Stock's Saver meets the inner optimizer's slots uninitialised; tpushim initialises every
    variable of the first checkpoint's graph. Without clipping (a norm no gradient reaches) the
    wrapped optimizer trains exactly as a plain Adagrad does in stock, and so does a plain one."""
    with pytest.raises(tf.errors.FailedPreconditionError, match="Adagrad"):
        _adagrad_run("off", _adagrad(clip_norm=1e6), tmp_path / "stock-wrapped")
    stock = _adagrad_run("off", _adagrad(), tmp_path / "stock")
    for name, build in (("plain", _adagrad()), ("wrapped", _adagrad(clip_norm=1e6))):
        shim = _adagrad_run("cpu", build, tmp_path / name)
        tfcases.assert_same(stock, shim)
    assert any(name.endswith("/Adagrad") for name in stock[3])


def test_a_clipping_wrapper_trains_as_stock_with_its_owners_patch(tmp_path, monkeypatch):
    """Clipping that bites (norm 0.05), against stock patched as such scripts' owners patched
    TensorFlow: the first checkpoint's graph initialised whole before the save (the reference
    only; tpushim runs unpatched)."""
    build = _adagrad(clip_norm=0.05)
    shim = _adagrad_run("cpu", build, tmp_path / "shim")
    backend = tf.compat.v2.keras.__internal__.backend
    keras_only = backend.initialize_variables

    def owners_patch(sess):
        keras_only(sess)
        variables = tf.compat.v1.global_variables()
        done = sess.run([tf.compat.v1.is_variable_initialized(v) for v in variables])
        sess.run(tf.compat.v1.variables_initializer([v for v, d in zip(variables, done) if not d]))

    monkeypatch.setattr(backend, "initialize_variables", owners_patch)
    stock = _adagrad_run("off", build, tmp_path / "stock")
    tfcases.assert_same(stock, shim)
    unclipped = _adagrad_run("cpu", _adagrad(), tmp_path / "unclipped")
    assert (
        max(float(np.max(np.abs(unclipped[3][k] - shim[3][k]))) for k in shim[3] if "Adagrad" in k)
        > 1e-3
    )  # the clipping changed the steps
