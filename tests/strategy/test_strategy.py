"""The engine setting and choice (tpushim/_settings.py, tpushim/_engines.py, tpushim/_decision.py):
``engine = auto | tpuestimator | strategy``, parsed strictly from every way in, and ``auto``'s
choice from the environment alone. The strategy engine's numbers are tests/proofs/test_strategy_replicas.py's.
"""

import json
import os

import numpy as np
import pytest

import tpushim
from tpushim import _decision, _engines, _settings, _versions
from tpushim._detect import TPUSpec
from tpushim._errors import ConfigurationError

TPU = TPUSpec("grpc://127.0.0.1:1", "TPU_NAME")


def settings(**kwargs):
    return _settings.resolve((_settings.parse_arguments(**kwargs),), environ={})


@pytest.mark.parametrize("value", ["auto", "TPUEstimator", " strategy "])
def test_engine_values(value):
    assert settings(engine=value).engine == value.strip().lower()


@pytest.mark.parametrize("value", ["", "tpu", "mirrored", 1, True])
def test_engine_is_strict_everywhere(value, monkeypatch):
    with pytest.raises(ConfigurationError, match="engine"):
        _settings.parse_arguments(engine=value)
    with pytest.raises(ConfigurationError, match="engine"):
        tpushim.patch(engine=value)
    assert not tpushim.is_patched()
    if isinstance(value, str) and value:
        monkeypatch.setenv("TPUSHIM_ENGINE", value)
        with pytest.raises(ConfigurationError, match="TPUSHIM_ENGINE"):
            tpushim.patch()


def test_engine_from_environment_and_precedence(monkeypatch):
    monkeypatch.setenv("TPUSHIM_ENGINE", "strategy")
    resolved = _settings.resolve()
    assert (resolved.engine, resolved.sources["engine"]) == ("strategy", "TPUSHIM_ENGINE")
    with tpushim.patched(engine="tpuestimator"):
        current = tpushim._patch.current_settings()
        assert (current.engine, current.sources["engine"]) == ("tpuestimator", "argument")
    assert "engine='strategy'" in repr(resolved)


def test_engine_is_a_command_line_option():
    flags = [flag for flag, _ in _settings.OPTIONS]
    assert "--engine" in flags  # python -m tpushim and %tpushim add exactly these


@pytest.mark.parametrize(
    "environ,tf_version,engine,why",
    [
        ({}, "2.15.1", "tpuestimator", "TPUEstimator runs here"),
        ({}, "2.16.1", "strategy", "TensorFlow 2.16.1 has no TPUEstimator"),
        ({}, "2.21.0", "strategy", "no TPUEstimator"),
        ({"PJRT_DEVICE": "TPU"}, "2.15.1", "strategy", "PJRT_DEVICE=TPU"),
        (
            {
                "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
                "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so",
            },
            "2.15.1",
            "strategy",
            "TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so",
        ),
        # Another pluggable device (not a TPU's libtpu) or PJRT for another device: TPUEstimator.
        ({"TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/opt/libitex_xpu.so"}, "2.15.1", "tpuestimator", ""),
        ({"PJRT_DEVICE": "CPU"}, "2.15.1", "tpuestimator", ""),
    ],
)
def test_auto_engine(environ, tf_version, engine, why):
    chosen, reason = _engines.choose(settings(), environ=environ, tf_version=tf_version)
    assert chosen == engine
    assert why in reason


def test_explicit_engine_wins_over_the_runtime():
    chosen, reason = _engines.choose(
        settings(engine="tpuestimator"), environ={"PJRT_DEVICE": "TPU"}, tf_version="2.15.1"
    )
    assert (chosen, reason) == ("tpuestimator", "engine tpuestimator from argument")


@pytest.mark.parametrize(
    "mode,tpu,action,returns",
    [
        ("cpu", None, "cpu", "the strategy engine (tf.distribute.MirroredStrategy"),
        ("auto", TPU, "tpu", "the strategy engine (tf.distribute.TPUStrategy) on TPU grpc://"),
        ("tpu", TPU, "tpu", "(engine strategy from argument)"),
    ],
)
def test_decision_names_the_engine(mode, tpu, action, returns):
    decision = _decision.decide(settings(mode=mode, engine="strategy"), tpu)
    assert (decision.action, decision.engine) == (action, "strategy")
    assert returns in decision.returns


@pytest.mark.skipif(
    _versions.uses_own_estimator(),
    reason="TensorFlow >= 2.16: the strategy engine whatever the runtime",
)
def test_decision_on_a_pjrt_runtime(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    decision = _decision.decide(settings(), TPU)
    assert decision.engine == "strategy"
    assert "PJRT TPU runtime (PJRT_DEVICE=TPU)" in decision.returns
    monkeypatch.delenv("PJRT_DEVICE")
    assert _decision.decide(settings(), TPU).engine == "tpuestimator"


def test_private_names_the_engine_uses(tmp_path):
    import numpy as np
    import tensorflow as tf

    from tpushim import _tfprivate

    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
    optimizer = tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9)
    _tfprivate.keras_compile.create_optimizer_slots(optimizer, model.trainable_variables)
    assert len(optimizer.variables()) == 1 + len(model.trainable_variables)  # iterations + slots
    model.optimizer = optimizer
    _tfprivate.estimator.track_estimator_step(model, tf.Variable(7, dtype=tf.int64))
    path = tf.train.Checkpoint(model).write(str(tmp_path / "ckpt"))
    keys = dict(tf.train.list_variables(path))
    assert "estimator_global_step/.ATTRIBUTES/VARIABLE_VALUE" in keys  # keras_lib's name
    assert callable(_tfprivate.estimator.create_keras_model_fn)

    # The XLA check's compiler IR takes no eager op seed: the next unseeded op draws as without it.
    step = tf.function(lambda x: tf.reduce_sum(x * 2.0), jit_compile=True)
    try:
        tf.random.set_seed(3)
        unseeded = tf.random.uniform([3]).numpy()
        tf.random.set_seed(3)
        assert "HloModule" in _tfprivate.graph.compiler_ir(step, tf.TensorSpec([2], tf.float32))
        np.testing.assert_array_equal(tf.random.uniform([3]).numpy(), unseeded)
    finally:
        tf.random.set_seed(None)

    # AutoGraph's marker: tpushim's function runs unconverted (its branch on a tensor fails), the
    # status beneath it kept, and the user's function it calls through user_code converted.
    def users(v):
        if tf.reduce_sum(v) > 0:
            return -v
        return v

    statuses = []

    @_tfprivate.graph.not_converted
    def ours(v):
        statuses.append(tf.__internal__.autograph.control_status_ctx().status.name)
        return _tfprivate.graph.user_code(users)(v)

    @_tfprivate.graph.not_converted
    def branching(v):
        return -v if tf.reduce_sum(v) > 0 else v

    def traced(function):  # a converted tf.function body around it, as the engine's
        def body(v):
            return function(v)

        return tf.function(body)

    assert traced(ours)(tf.constant([1.0, 2.0])).numpy().tolist() == [-1, -2]
    assert statuses == ["ENABLED"]
    with pytest.raises(TypeError, match="as a Python `bool`"):
        traced(branching)(tf.constant([1.0]))
    assert _tfprivate.graph.user_code(users) is users  # no AutoGraph around it: called as it is


def _call_loss_layer():
    import tensorflow as tf

    class CallLoss(tf.keras.layers.Layer):
        """Adds a loss from its inputs in its call (``self.add_loss``)."""

        def call(self, x):
            self.add_loss(tf.reduce_mean(tf.abs(x)))
            return x + 0.0

    return CallLoss


@pytest.mark.slow
def test_what_the_engine_cannot_run_yet_is_refused_before_anything_is_written(tmp_path):
    import tensorflow as tf

    tf1 = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
    # A rate made eagerly: stock's graph cannot read it (tests/proofs/test_strategy_optimizers.py).
    tf1.compile(tf.compat.v1.train.GradientDescentOptimizer(tf.constant(0.1)), loss="mse")
    with (
        tpushim.patched(mode="cpu", engine="strategy", quiet=True),
        pytest.raises(tpushim.ConversionError, match="GradientDescentOptimizer: its learning_rate"),
    ):
        tf.keras.estimator.model_to_estimator(
            keras_model=tf1, model_dir=str(tmp_path / "m"), checkpoint_format="saver"
        )
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_a_subclassed_model_is_refused_where_stock_refuses_it(tmp_path):
    """Stock's two refusals of a subclassed model, in its words, before anything is written:
    object-based checkpoints (its default format), and a model that does not rebuild from its
    config. With ``checkpoint_format='saver'`` the engine takes it (tests/strategy_subclassed_
    proof.py trains it against stock)."""
    import tensorflow as tf

    class Subclassed(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = tf.keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

    class NoConfig(Subclassed):
        def get_config(self):
            raise NotImplementedError

    def convert(model, where, **kwargs):
        model.compile(tf.keras.optimizers.legacy.SGD(0.1), loss="mse")
        with tpushim.patched(mode="cpu", engine="strategy", quiet=True):
            return tf.keras.estimator.model_to_estimator(
                keras_model=model, model_dir=str(tmp_path / where), **kwargs
            )

    with pytest.raises(ValueError, match="Object-based checkpoints are currently not supported"):
        convert(Subclassed(), "a")
    with pytest.raises(
        ValueError, match=r"must implement `Model\.get_config` and `Model\.from_config`"
    ):
        convert(NoConfig(), "b", checkpoint_format="saver")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    estimator = convert(Subclassed(), "c", checkpoint_format="saver")
    assert type(estimator).__name__ == "StrategyEstimator"
    assert not (tmp_path / "c" / "keras").exists()  # no warm start, as stock


@pytest.mark.slow
def test_estimator_surface_on_one_device(tmp_path):
    """In this process (one CPU device): a classifier with ``accuracy`` and 52 examples in batches
    of 8 equals stock; ``train_and_evaluate`` drives the engine; ``export_saved_model`` (the base
    Estimator's, from stock's model_fn over the engine's checkpoint) serves its predictions."""
    import numpy as np
    import tensorflow as tf
    import tfcases

    from tpushim._strategy import estimator as _strategy_estimator

    x, y = tfcases.data()
    train = tfcases.dataset_input_fn(x, y)
    features_only = tfcases.dataset_input_fn(x)

    def run(patch, model_dir):
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)  # tf.estimator's (2.16+: tpushim's)
        estimator = tfcases.convert(model_dir, patch=patch, config=config)
        estimator.train(train, steps=6)
        return (
            estimator,
            estimator.evaluate(train),
            list(estimator.predict(features_only)),
            tfcases.checkpoint_values(model_dir),
        )

    stock = run({"mode": "off"}, tmp_path / "stock")
    engine = run({"mode": "cpu", "engine": "strategy", "quiet": True}, tmp_path / "engine")
    assert isinstance(engine[0], _strategy_estimator.StrategyEstimator)
    tfcases.assert_same(stock, engine)

    estimator_api = tfcases.ESTIMATOR  # tf.estimator (on TensorFlow >= 2.16: tpushim's)
    estimators = {}
    for name, patch in (
        ("stock", {"mode": "off"}),
        ("engine", {"mode": "cpu", "engine": "strategy"}),
    ):
        estimator = tfcases.convert(tmp_path / f"te-{name}", patch=dict(patch, quiet=True))
        metrics, _ = estimator_api.train_and_evaluate(
            estimator,
            estimator_api.TrainSpec(train, max_steps=6),
            estimator_api.EvalSpec(train, steps=None, throttle_secs=0),
        )
        estimators[name] = (estimator, metrics)
    for key, value in estimators["stock"][1].items():
        np.testing.assert_allclose(estimators["engine"][1][key], value, atol=1e-5, err_msg=key)

    engine_estimator = estimators["engine"][0]
    serving = estimator_api.export.build_raw_serving_input_receiver_fn(
        {"hidden_input": tf.zeros([1, 4])}
    )
    path = engine_estimator.export_saved_model(str(tmp_path / "export"), serving)
    served = tf.saved_model.load(path).signatures["serving_default"](hidden_input=tf.constant(x))
    predicted = np.array([p["probs"] for p in engine_estimator.predict(features_only)])
    np.testing.assert_allclose(served["probs"].numpy(), predicted, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "seeding,kind",
    [("a script's", "functional"), ("keras", "functional"), ("a script's", "subclassed")],
)
def test_a_second_model_starts_where_stocks_does(tmp_path, seeding, kind):
    """Two models built, converted, trained, evaluated and predicted one after the other in one
    seeded process (a script comparing two models, tests/scripts/boston_feature_columns_batchnorm.py):
    the engine leaves the program's random state as stock leaves it, so the second model starts
    from stock's initial weights (a subclassed model's clone: from fresh ones, drawn as stock's)
    and trains to stock's numbers, and the program's next unseeded eager random op draws what it
    draws after stock. The engine's XLA check (on a copy here: an activity regularizer, or a
    subclassed model), its evaluation's metrics model and its graph of stock's checkpoint names
    made copies stock does not, which drew Keras seeds, and the XLA check's device look-up took
    an eager op seed."""
    import concurrent.futures
    import random

    import numpy as np
    import tensorflow as tf
    import tfcases

    x, y = tfcases.data()
    train, evaluate = tfcases.dataset_input_fn(x, y, repeat=True), tfcases.dataset_input_fn(x, y)
    features_only = tfcases.dataset_input_fn(x)

    def build(units):
        if kind == "subclassed":
            model = tfcases.Subclassed()
            model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
            return model
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Dense(units, "relu", input_shape=(4,), name="hidden"),
                tf.keras.layers.Dense(4, activity_regularizer="l2", name="act"),
                tf.keras.layers.Dense(3, "softmax", name="probs"),
            ]
        )
        model.compile(
            tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy", ["accuracy"]
        )
        return model

    def run(patch, name):
        tf.keras.backend.clear_session()
        if seeding == "keras":
            tf.keras.utils.set_random_seed(0)  # also Keras's own seed generator
        else:
            random.seed(0)
            np.random.seed(0)
            tf.random.set_seed(0)
        runs = []
        for units in (8, 6):
            model = build(units)
            initial = model.get_weights()
            model_dir = tmp_path / name / str(units)
            config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
            # (stock refuses object-based checkpoints for a subclassed model)
            checkpoints = {"checkpoint_format": "saver"} if kind == "subclassed" else {}
            estimator = tfcases.convert(model_dir, model, patch=patch, config=config, **checkpoints)
            estimator.train(train, steps=4)
            runs.append(
                (
                    initial,
                    estimator.evaluate(evaluate),
                    [next(iter(p.values())) for p in estimator.predict(features_only)],
                    tfcases.checkpoint_values(model_dir),
                )
            )
        return runs, tf.random.uniform([3]).numpy()

    def in_a_thread_of_its_own(*args):  # Keras's seed generator is per thread: none yet there
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            return thread.submit(run, *args).result()

    stock, stock_next = in_a_thread_of_its_own({"mode": "off"}, "stock")
    engine, engine_next = in_a_thread_of_its_own(
        {"mode": "cpu", "engine": "strategy", "quiet": True}, "engine"
    )
    for want, got in zip(stock, engine):  # each model: initial weights, metrics, ...
        initial, metrics, predictions, values = want
        for weight, value in zip(initial, got[0]):
            np.testing.assert_allclose(value, weight, atol=1e-5, rtol=0)
        assert set(got[1]) == set(metrics)
        for key, value in metrics.items():
            np.testing.assert_allclose(got[1][key], value, atol=1e-5, rtol=0, err_msg=key)
        np.testing.assert_allclose(np.array(got[2]), np.array(predictions), atol=1e-5, rtol=0)
        assert set(got[3]) == set(values)
        for key, value in values.items():
            np.testing.assert_allclose(got[3][key], value, atol=1e-5, rtol=0, err_msg=key)
    np.testing.assert_array_equal(engine_next, stock_next)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"steps": 1, "max_steps": 2}, "Can not provide both steps and max_steps."),
        ({"steps": 0}, "Must specify steps > 0, given: 0"),
        ({"max_steps": -1}, "Must specify max_steps > 0, given: -1"),
    ],
)
def test_train_step_arguments_checked_as_stock(tmp_path, kwargs, message):
    """One check of train()'s step arguments for both engines (tpushim/_estimator_api/_estimator.py's),
    with stock's errors, before the input_fn is called or anything is written."""
    import re

    import tfcases

    stock = tfcases.convert(tmp_path / "stock", patch={"mode": "off"})
    engine = tfcases.convert(tmp_path / "engine", patch={"mode": "cpu", "engine": "strategy"})
    for estimator in (stock, engine):
        with pytest.raises(ValueError, match=re.escape(message)):
            estimator.train(lambda: pytest.fail("input_fn called"), **kwargs)
    assert not list((tmp_path / "engine").glob("model.ckpt-*"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine",
    ["strategy", pytest.param("tpuestimator", marks=pytest.mark.tpuestimator)],
)
@pytest.mark.parametrize("spelling,ran", [("v2", [3, 4, 6, 7]), ("v1", [3, 3, 5, 7])])
def test_float_steps_run_to_their_ceiling_as_stock(tmp_path, engine, spelling, ran):
    """Legacy scripts compute ``max_steps = epochs * rows / batch`` (1578.9): stock's
    StopAtStepHook stops at the first global step at or past it, so a float runs to its ceiling,
    for ``max_steps``, ``steps`` and train_and_evaluate's ``TrainSpec.max_steps`` alike; the
    weights are stock's."""
    import numpy as np
    import tfcases

    x, y = tfcases.data()
    train = tfcases.dataset_input_fn(x, y, repeat=True)
    runs = {}
    for name, patch in (("stock", {"mode": "off"}), ("shim", {"mode": "cpu", "engine": engine})):
        model_dir = tmp_path / name
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
        estimator = tfcases.convert(
            model_dir, spelling=spelling, patch=dict(patch, quiet=True), config=config
        )
        steps = []

        def saved():  # the step of the last checkpoint, from its name (model.ckpt-N)
            steps.append(int(estimator.latest_checkpoint().rsplit("-", 1)[1]))

        estimator.train(train, max_steps=2.5)
        saved()
        # Past it already: skipped from a name-based checkpoint (v1); from an object-based one
        # (v2) stock's skip reads no global step (0), and its StopAtStepHook stops after one.
        estimator.train(train, max_steps=2.5)
        saved()
        estimator.train(train, steps=1.2)
        saved()
        tfcases.ESTIMATOR.train_and_evaluate(
            estimator,
            tfcases.ESTIMATOR.TrainSpec(train, max_steps=6.1),
            tfcases.ESTIMATOR.EvalSpec(train, steps=1.5, throttle_secs=0),
        )
        saved()
        runs[name] = steps, tfcases.checkpoint_values(model_dir)
    assert runs["stock"][0] == ran
    assert runs["shim"][0] == runs["stock"][0]
    for key, value in runs["stock"][1].items():
        np.testing.assert_allclose(runs["shim"][1][key], value, atol=1e-5, err_msg=key)


@pytest.mark.slow
def test_the_engine_takes_the_conversion_plan(tmp_path):
    """Issue 33 item 6: the strategy engine's Plan is built from the conversion plan both engines
    take (tpushim._plan.ConversionPlan): its batch size, steps per execution and loss kinds are
    the plan's, and the plan holds the conversion's settings, TPU (none: cpu mode) and the
    warm-start checkpoint the estimator starts from."""
    import tfcases

    from tpushim import _plan
    from tpushim._strategy import estimator as _strategy_estimator

    patch = {"mode": "cpu", "engine": "strategy", "quiet": True}
    converted = tfcases.convert(tmp_path, patch=dict(patch, batch_size=8, iterations_per_loop=3))
    assert isinstance(converted, _strategy_estimator.StrategyEstimator)
    plan = converted._tpushim_plan
    conversion = plan.conversion
    assert isinstance(conversion, _plan.ConversionPlan)
    assert conversion.settings.engine == "strategy" and conversion.tpu is None
    assert (plan.batch_size, plan.steps_per_execution) == (8, 3)
    assert (conversion.batch_size, conversion.iterations_per_loop) == (8, 3)
    assert plan.loss_kinds is conversion.loss_plan.outputs
    assert conversion.warm_start == converted._warm_start_settings.ckpt_to_initialize_from
    assert conversion.warm_start.startswith(str(tmp_path))


@pytest.mark.slow
def test_a_setting_changed_after_conversion_does_not_reach_the_engine(tmp_path, monkeypatch):
    """The engine's plan is frozen and holds no copy of the settings: batch size, pod input and
    steps per execution are read from the conversion plan (settings -> decision -> plan -> the
    engine), so a later scope or environment changes nothing, and a changed conversion plan
    changes all three with it (a copy would stay behind)."""
    import dataclasses

    import tfcases

    from tpushim import _settings
    from tpushim._strategy import estimator as _strategy_estimator

    patch = {"mode": "cpu", "engine": "strategy", "quiet": True}
    given = {"batch_size": 8, "pod_input": "exact", "iterations_per_loop": 3}
    converted = tfcases.convert(tmp_path, patch=dict(patch, **given))
    plan = converted._tpushim_plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.warm_start = None
    with pytest.raises(AttributeError):
        plan.batch_size = 16
    taken = []
    made = _strategy_estimator.distributed_input
    monkeypatch.setattr(
        _strategy_estimator,
        "distributed_input",
        lambda *args: taken.append(args[4:6]) or made(*args),
    )
    monkeypatch.setenv("TPUSHIM_BATCH_SIZE", "16")
    monkeypatch.setenv("TPUSHIM_POD_INPUT", "files")
    x, y = tfcases.data()
    later = {"batch_size": 4, "pod_input": "files", "iterations_per_loop": 5}
    with tpushim.patched(**patch, **later):
        converted.train(tfcases.dataset_input_fn(x, y, batch=8, repeat=True), steps=3)
    assert taken == [(8, "exact")]
    assert (plan.batch_size, plan.pod_input, plan.steps_per_execution) == (8, "exact", 3)
    assert converted._tpushim_plan is plan
    changed = dataclasses.replace(
        plan,
        conversion=dataclasses.replace(plan.conversion, settings=_settings.Settings(**later)),
    )
    assert (changed.batch_size, changed.pod_input, changed.steps_per_execution) == (4, "files", 5)


@pytest.mark.slow
@pytest.mark.parametrize("activation", ["softmax_layer", "sigmoid_op"])
def test_crossentropy_metrics_read_the_outputs_logits_as_stocks(tmp_path, activation):
    """Keras's crossentropy metrics compute from an output's logits where stock's graph output
    carries them: a Keras activation's ``_keras_logits`` (any crossentropy: ``binary_crossentropy``
    of a softmax output is sigmoid crossentropy on its logits), or a Sigmoid/Softmax op's input
    (only the crossentropy of that op). The engine's gathered eager outputs carried neither, so
    its ``binary_crossentropy`` of iris's softmax output was 0.4004 where stock's is 0.4821."""
    import numpy as np
    import tensorflow as tf
    import tfcases

    x, y = tfcases.data()
    onehot = np.eye(3, dtype="float32")[y[:, 0]]
    train = tfcases.dataset_input_fn(x, onehot)  # a short last batch

    def build():
        tf.keras.backend.clear_session()
        init = tf.keras.initializers.GlorotUniform
        inputs = tf.keras.layers.Input(shape=(4,), name="hidden_input")
        hidden = tf.keras.layers.Dense(8, "relu", kernel_initializer=init(seed=1))(inputs)
        if activation == "softmax_layer":
            probs = tf.keras.layers.Dense(
                3, activation="softmax", kernel_initializer=init(seed=2), name="probs"
            )(hidden)
        else:
            # Saturated: clipped probabilities and logits give different crossentropies.
            big = tf.keras.initializers.RandomNormal(stddev=30.0, seed=2)
            logits = tf.keras.layers.Dense(3, kernel_initializer=big)(hidden)
            probs = tf.keras.layers.Lambda(tf.nn.sigmoid, name="probs")(logits)
        model = tf.keras.Model(inputs, probs)
        model.compile(
            "adam",
            "categorical_crossentropy",
            metrics=["binary_crossentropy", "categorical_crossentropy", "accuracy"],
        )
        return model

    _evaluated_as_stocks(tmp_path, build, train, steps=4)


@pytest.mark.slow
def test_a_model_with_dict_outputs_as_stocks(tmp_path):
    """A functional model built with ``outputs={...}`` (two inputs, two outputs, per-output
    metrics, a metric object, loss weights): the engine called it and got a dict, which its
    losses read as one output ("Expected any non-tensor type"), and reused the user's metric
    object, whose variables live in the conversion's graph. Weights, metrics (stock's names) and
    predictions equal stock's."""
    import tfcases

    features, labels = tfcases.two_in_two_out_data()
    train = tfcases.dataset_input_fn(features, labels)  # a short last batch

    def run(patch, model_dir):
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
        estimator = tfcases.convert(model_dir, tfcases.two_in_two_out(), patch=patch, config=config)
        estimator.train(train, steps=3)
        return (
            estimator,
            estimator.evaluate(train),
            list(estimator.predict(tfcases.dataset_input_fn(features))),
            tfcases.checkpoint_values(model_dir),
        )

    stock = run({"mode": "off"}, tmp_path / "stock")
    engine = run({"mode": "cpu", "engine": "strategy", "quiet": True}, tmp_path / "engine")
    tfcases.assert_same(stock, engine)


@pytest.mark.slow
def test_what_no_tpu_step_compiles_is_refused_in_words_before_anything_is_written(tmp_path):
    """Strings in the input that no layer of the model takes are named (not an XLA error about
    ``_Arg``), before model.ckpt-0. (Strings and lookups the model's layers take run on the
    host: tests/strategy/test_strategy_strings.py.)"""
    import numpy as np
    import tensorflow as tf

    def string_input():
        features = {"x": np.ones((8, 2), "float32"), "key": np.array([b"a"] * 8)}
        return tf.data.Dataset.from_tensor_slices((features, np.ones((8, 1), "float32"))).batch(4)

    inputs = {
        "x": tf.keras.Input((2,), name="x"),
        "key": tf.keras.Input((1,), name="key", dtype=tf.string),
    }
    strings = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(inputs["x"]))
    strings.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")

    for name, model, input_fn, words in (
        ("strings", strings, string_input, "its input carries strings (feature 'key')"),
    ):
        model_dir = tmp_path / name
        with tpushim.patched(mode="cpu", engine="strategy", quiet=True):
            estimator = tf.keras.estimator.model_to_estimator(
                keras_model=model, model_dir=str(model_dir)
            )
        before = sorted(p.name for p in model_dir.rglob("*"))
        with pytest.raises(
            tpushim.ConversionError, match=words.replace("(", r"\(").replace(")", r"\)")
        ):
            estimator.train(input_fn, steps=1)
        assert sorted(p.name for p in model_dir.rglob("*")) == before  # nothing written


@pytest.mark.slow
def test_the_xla_check_runs_once_per_conversion_and_input_shape(tmp_path, monkeypatch):
    """The training step's XLA check (for MobileNetV2 it costs about what tracing the step does)
    runs at a conversion's first train() call and not again at the next one on the same input;
    an input of another shape is checked."""
    import tfcases

    from tpushim._strategy import xla_check as _strategy_xla_check

    checked, check = [], _strategy_xla_check.check_xla
    monkeypatch.setattr(
        _strategy_xla_check, "check_xla", lambda *a: checked.append(a[1]) or check(*a)
    )
    x, y = tfcases.data()
    engine = {"mode": "cpu", "engine": "strategy", "quiet": True}
    estimator = tfcases.convert(tmp_path / "m", tfcases.sequential, patch=engine)
    counts = []
    for batch in (4, 4, 2):
        estimator.train(tfcases.dataset_input_fn(x, y, batch=batch), steps=1)
        counts.append(len(checked))
    assert counts == [1, 1, 2]
    assert checked[0] != checked[1]  # control: the shapes differ


@pytest.mark.slow
def test_the_xla_check_traces_the_users_model_itself_and_still_refuses(tmp_path, monkeypatch):
    """The XLA check of a built graph network traces the user's model as it is (no clone: for
    ResNet50 a clone cost as much as lowering the step), leaves its weights as they were, and
    still refuses an op XLA cannot compile (tf.numpy_function) before anything is written; a
    subclassed model and one with an activity regularizer are cloned (control: the check does
    clone where it must)."""
    import numpy as np
    import tensorflow as tf
    import tfcases

    from tpushim._strategy import xla_check as _strategy_xla_check

    real_clone, cloned = _strategy_xla_check.clone, []

    def clone(plan, features=None):
        cloned.append(plan.keras_model)
        return real_clone(plan, features)

    monkeypatch.setattr(_strategy_xla_check, "clone", clone)
    check, clones = _strategy_xla_check.check_xla, []

    def counted(*args):
        before = len(cloned)
        try:
            check(*args)
        finally:
            clones.append(len(cloned) - before)

    monkeypatch.setattr(_strategy_xla_check, "check_xla", counted)
    x, y = tfcases.data()
    engine = {"mode": "cpu", "engine": "strategy", "quiet": True}
    keras_model = tfcases.sequential()
    weights = [w.numpy() for w in keras_model.weights]
    estimator = tfcases.convert(tmp_path / "as_is", keras_model, patch=engine)
    estimator.train(tfcases.dataset_input_fn(x, y), steps=1)
    assert clones == [0]
    assert all(np.array_equal(a, w.numpy()) for a, w in zip(weights, keras_model.weights))

    host_only = tf.keras.Sequential(
        [
            tf.keras.layers.Lambda(
                lambda t: tf.reshape(tf.numpy_function(np.tanh, [t], tf.float32), [-1, 4]),
                input_shape=(4,),
            ),
            tf.keras.layers.Dense(3),
        ]
    )
    host_only.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy")
    model_dir = tmp_path / "host_only"
    estimator = tfcases.convert(model_dir, host_only, patch=engine)
    before = sorted(p.name for p in model_dir.rglob("*"))
    with pytest.raises(tpushim.ConversionError, match="does not compile with XLA"):
        estimator.train(tfcases.dataset_input_fn(x, y), steps=1)
    assert clones == [0, 0]
    assert sorted(p.name for p in model_dir.rglob("*")) == before

    estimator = tfcases.convert(
        tmp_path / "subclassed", tfcases.subclassed(), patch=engine, checkpoint_format="saver"
    )
    estimator.train(tfcases.dataset_input_fn(x, y), steps=1)
    assert clones[2] == 1
    # An activity regularizer: the step records it in the regularizer's place, so on a clone.
    regularized = tfcases.sequential(
        extra_layers=[tf.keras.layers.Dense(4, activity_regularizer="l2", name="act")]
    )
    estimator = tfcases.convert(tmp_path / "activity", regularized, patch=engine)
    estimator.train(tfcases.dataset_input_fn(x, y), steps=1)
    assert clones[3] == 1
    assert type(regularized.get_layer("act").activity_regularizer) is tf.keras.regularizers.L2


@pytest.mark.slow
def test_the_xla_checks_trace_leaves_the_users_call_losses(tmp_path, monkeypatch):
    """Traced as it is, the user's model keeps the losses its last call added (Keras clears them
    at a call and would keep the trace's, tensors of a graph never run); control: without
    ``call_losses_kept`` it holds the trace's."""
    import contextlib

    import tensorflow as tf
    import tfcases

    from tpushim import _tfprivate

    class AddsLoss(tf.keras.layers.Layer):
        def call(self, inputs):
            self.add_loss(0.1 * tf.reduce_mean(tf.square(inputs)))
            return inputs

    x, y = tfcases.data(n=48)  # full batches: a loss from the inputs is refused on padded ones
    engine = {"mode": "cpu", "engine": "strategy", "quiet": True}

    def train(name):
        model = tfcases.sequential(extra_layers=(AddsLoss(name="adds"),))
        model(x[:4])
        losses = model.losses
        estimator = tfcases.convert(tmp_path / name, model, patch=engine)
        estimator.train(tfcases.dataset_input_fn(x, y), steps=1)
        return losses, model.losses

    before, after = train("kept")
    assert [id(t) for t in after] == [id(t) for t in before] and len(after) == 1
    monkeypatch.setattr(
        _tfprivate.keras_compile, "call_losses_kept", lambda model: contextlib.nullcontext()
    )
    before, after = train("control")
    assert [id(t) for t in after] != [id(t) for t in before]


INPUT_LOSSES_RECORD = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "reference",
    "strategy_input_losses_tf215.json",
)


def _input_loss_model(where):
    """A layer's ``add_loss`` of its inputs after (``"after"``: it reads the normalised batch) or
    before a BatchNormalization, on a classifier."""
    import tensorflow as tf

    class SquareLoss(tf.keras.layers.Layer):
        def call(self, x):
            self.add_loss(0.5 * tf.reduce_mean(tf.square(x)))
            return x + 0.0

    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    normalize = tf.keras.layers.BatchNormalization(name="bn")
    adds = SquareLoss(name="adds")
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(6, activation="tanh", input_shape=(4,), name="hidden"),
            *((normalize, adds) if where == "after" else (adds, normalize)),
            tf.keras.layers.Dense(3, activation="softmax", name="probs"),
        ]
    )
    model.compile(
        tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def _input_loss_run(patch, model_dir, where):
    """(evaluate()'s metrics, checkpoint values) after 7 steps of 8 over 52 examples (the last
    batch short: 4 rows)."""
    import tfcases

    x, y = tfcases.data(n=52)
    estimator = tfcases.convert(model_dir, lambda: _input_loss_model(where), patch=patch)
    estimator.train(tfcases.dataset_input_fn(x, y), steps=7)
    metrics = estimator.evaluate(tfcases.dataset_input_fn(x, y))
    values = tfcases.checkpoint_values(model_dir)
    return (
        {k: float(v) for k, v in metrics.items()},
        {k: np.asarray(v, np.float64).tolist() for k, v in values.items()},
    )


def _record_input_losses(root):  # run on TensorFlow 2.15: stock's numbers
    import tensorflow as tf

    out = {"tensorflow": tf.__version__}
    for where in ("after", "before"):
        metrics, values = _input_loss_run({"mode": "off"}, os.path.join(root, where), where)
        out[where] = {"metrics": metrics, "values": values}
    with open(INPUT_LOSSES_RECORD, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["after", "before"])
def test_input_loss_beside_batchnormalization_trains_stocks_numbers(tmp_path, where):
    """A layer's ``add_loss`` of its inputs beside BatchNormalization, with a short last batch:
    the engine's weights (moving statistics included) and evaluate() equal stock's (live on TF
    2.15, its recorded numbers on >= 2.16). The loss after the normalisation reads each row as
    the batch's call normalised it (the batch's moments), not the row normalised alone."""
    with open(INPUT_LOSSES_RECORD) as f:
        recorded = json.load(f)[where]
    stock_metrics, stock_values = recorded["metrics"], recorded["values"]
    if not _versions.uses_own_estimator():  # the record is stock's, live here
        live = _input_loss_run({"mode": "off"}, tmp_path / "stock", where)
        assert sorted(live[1]) == sorted(stock_values) and live[0] == pytest.approx(stock_metrics)
        for name, value in live[1].items():
            np.testing.assert_allclose(value, stock_values[name], atol=1e-6, err_msg=name)
    patch = {"mode": "cpu", "engine": "strategy", "quiet": True}
    metrics, values = _input_loss_run(patch, tmp_path / "engine", where)
    assert sorted(values) == sorted(stock_values)
    for name, value in values.items():
        np.testing.assert_allclose(value, stock_values[name], atol=1e-5, rtol=0, err_msg=name)
    assert sorted(metrics) == sorted(stock_metrics)
    for key, value in metrics.items():
        assert value == pytest.approx(stock_metrics[key], abs=1e-5), key


@pytest.mark.slow
def test_input_losses_beside_batchnormalization_which_the_engine_takes(tmp_path):
    """Activity regularizers are read from the model's own forward pass, so BatchNormalization
    (and SyncBatchNormalization) beside them is taken; a loss added in a layer's call beside a
    SyncBatchNormalization is taken as beside a BatchNormalization (numbers:
    tests/proofs/test_strategy_replicas.py, test_input_loss_beside_batchnormalization_...)."""
    import tensorflow as tf

    def model(normalization, *middle):
        m = tf.keras.Sequential(
            [
                tf.keras.layers.Dense(2, input_shape=(2,), activity_regularizer="l2", name="act"),
                *middle,
                normalization(name="bn"),
                tf.keras.layers.Dense(1, activity_regularizer="l1"),
            ]
        )
        m.compile(tf.keras.optimizers.legacy.SGD(0.1), loss="mse")
        return m

    sync = tf.keras.layers.experimental.SyncBatchNormalization
    with tpushim.patched(mode="cpu", engine="strategy", quiet=True):
        for i, normalization in enumerate((tf.keras.layers.BatchNormalization, sync)):
            tf.keras.estimator.model_to_estimator(
                keras_model=model(normalization), model_dir=str(tmp_path / f"m{i}")
            )
        tf.keras.estimator.model_to_estimator(
            keras_model=model(sync, _call_loss_layer()(name="adds")),
            model_dir=str(tmp_path / "taken"),
        )


@pytest.mark.slow
def test_metric_objects_named_as_stocks_calls_name_them(tmp_path):
    """Stock's every train() and evaluate() compiles a clone with the user's metric objects,
    and Keras prefixes a shared object's name with its output's each time (its first checkpoint's
    clone too): ``reg_reg_root_mean_squared_error`` at an evaluate() before training, one more
    prefix at each later call. The engine's keys follow stock's, call by call."""
    import tfcases

    features, labels = tfcases.two_in_two_out_data()
    train = tfcases.dataset_input_fn(features, labels)

    def keys(patch, model_dir):
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
        estimator = tfcases.convert(model_dir, tfcases.two_in_two_out(), patch=patch, config=config)
        seen = [sorted(estimator.evaluate(train, steps=1))]  # before any training, as stock
        estimator.train(train, steps=1)
        seen.append(sorted(estimator.evaluate(train, steps=1)))
        estimator.train(train, steps=1)
        seen.append(sorted(estimator.evaluate(train, steps=1)))
        seen.append(sorted(estimator.evaluate(train, steps=1)))
        return seen

    stock = keys({"mode": "off"}, tmp_path / "stock")
    engine = keys({"mode": "cpu", "engine": "strategy", "quiet": True}, tmp_path / "engine")
    assert "reg_" * 7 + "root_mean_squared_error" in stock[-1]  # stock's names grow
    assert engine == stock


def _custom_sparse_loss(y_true, y_pred):  # a user's own loss: Keras cannot tell its kind
    import tensorflow as tf

    return tf.keras.losses.sparse_categorical_crossentropy(y_true, y_pred)


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss,units,metrics",
    [
        # stock: categorical accuracy (a user's loss and 3 units say nothing of sparse labels);
        # its categorical crossentropy fails on these labels
        (_custom_sparse_loss, 3, ["accuracy", "acc"]),
        ("sparse_categorical_crossentropy", 3, ["accuracy", "acc", "crossentropy", "ce"]),
        ("binary_crossentropy", 1, ["accuracy", "acc", "crossentropy", "ce"]),  # one unit
    ],
    ids=["custom-loss", "sparse-loss", "one-unit"],
)
def test_accuracy_and_crossentropy_by_names_resolved_as_stocks(tmp_path, loss, units, metrics):
    """``metrics=["accuracy", "acc", "crossentropy", "ce"]``: stock's model_fn compiles its clone
    in a graph, where Keras picks each one's function by the output's last dimension and the loss
    alone (a user's loss on 3 classes: categorical, whatever the labels), not by the labels'
    shape as an eager compile does (sparse for [batch, 1] labels): the engine's values are
    stock's, even where stock's function is not the one the labels call for."""
    import tensorflow as tf
    import tfcases

    x, y = tfcases.data()
    if units == 1:
        y = (y > 0).astype("float32")
    train = tfcases.dataset_input_fn(x, y)

    def build():
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Dense(8, activation="relu", input_shape=(4,), name="hidden"),
                tf.keras.layers.Dense(units, activation="sigmoid" if units == 1 else "softmax"),
            ]
        )
        model.compile("adam", loss, metrics=metrics)
        return model

    _evaluated_as_stocks(tmp_path, build, train, steps=3)


@pytest.mark.slow
def test_accuracy_by_name_on_two_outputs_resolved_per_output_as_stocks(tmp_path):
    """One ``"accuracy"`` for two outputs named out of alphabetical order (``zeta``: 3 units and
    a user's loss, stock's pick categorical; ``alpha``: one unit, binary): each output its own
    pick, as stock's."""
    import tensorflow as tf
    import tfcases

    x, y = tfcases.data()
    labels = {"zeta": y, "alpha": (y > 0).astype("float32")}

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((x, labels)).batch(tfcases.BATCH)

    def build():
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        inputs = tf.keras.Input((4,), name="hidden_input")
        hidden = tf.keras.layers.Dense(8, activation="relu")(inputs)
        zeta = tf.keras.layers.Dense(3, activation="softmax", name="zeta")(hidden)
        alpha = tf.keras.layers.Dense(1, activation="sigmoid", name="alpha")(hidden)
        model = tf.keras.Model(inputs, [zeta, alpha])
        model.compile("adam", {"zeta": _custom_sparse_loss, "alpha": "mse"}, metrics=["accuracy"])
        return model

    _evaluated_as_stocks(tmp_path, build, input_fn, steps=3)


def _evaluated_as_stocks(tmp_path, build, input_fn, steps):
    """The model ``build()`` makes, converted by stock and onto the engine (one device), each
    trained ``steps`` steps and evaluated on ``input_fn``: the same keys and values."""
    import numpy as np
    import tfcases

    results = {}
    for name, patch in (
        ("stock", {"mode": "off"}),
        ("engine", {"mode": "cpu", "engine": "strategy", "quiet": True}),
    ):
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
        estimator = tfcases.convert(tmp_path / name, build(), patch=patch, config=config)
        estimator.train(input_fn, steps=steps)
        results[name] = estimator.evaluate(input_fn)
    assert set(results["engine"]) == set(results["stock"])
    for key, value in results["stock"].items():
        np.testing.assert_allclose(results["engine"][key], value, rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.slow
def test_the_users_python_branches_on_tensors_converted_as_stocks(tmp_path):
    """AutoGraph leaves tpushim's own graph code in the engine's ``tf.function``s unconverted
    (``_tfprivate.graph.not_converted``: converting it cost seconds before the first checkpoint), and
    still converts the user's, as stock's graph does: a layer's ``call`` and a loss function that
    branch in Python on a tensor (``if tf.reduce_sum(x) > 0:``) train and evaluate as stock's,
    through the XLA check, a short last batch's padding and a weighted metric. Marked with
    ``tf.autograph.experimental.do_not_convert`` instead, the engine's functions would disable
    the conversion beneath them, and this layer would fail ("using a `tf.Tensor` as a Python
    `bool` is not allowed")."""
    import numpy as np
    import tensorflow as tf

    # Each branch on the whole batch, so taken alike on stock's batch and on the engine's
    # (padded with copies of its rows), and a per-example loss (one the engine splits).
    class Branching(tf.keras.layers.Layer):
        def call(self, inputs):
            if tf.reduce_sum(tf.abs(inputs)) > 0.0:
                return inputs * 2.0
            return inputs - 1.0

    def branching_loss(y_true, y_pred):
        loss = tf.keras.losses.sparse_categorical_crossentropy(y_true, y_pred)
        if tf.reduce_min(y_pred) >= 0.0:  # probabilities
            return loss
        return -loss

    def build():
        tf.keras.utils.set_random_seed(0)
        inputs = tf.keras.Input((4,))
        hidden = Branching()(tf.keras.layers.Dense(8, activation="tanh")(inputs))
        outputs = tf.keras.layers.Dense(3, activation="softmax")(hidden)
        model = tf.keras.Model(inputs, outputs)
        model.compile(tf.keras.optimizers.legacy.SGD(0.1), branching_loss, metrics=["accuracy"])
        return model

    rng = np.random.RandomState(0)
    x, y = rng.randn(20, 4).astype("float32"), rng.randint(0, 3, (20, 1))

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(8)  # the last batch short

    _evaluated_as_stocks(tmp_path, build, input_fn, steps=3)


@pytest.mark.slow
@pytest.mark.parametrize("wrong", ["features", "labels"])
def test_input_keys_that_miss_the_models_are_refused_with_stocks_error(tmp_path, wrong):
    """An input_fn whose feature (or label) keys do not cover the model's inputs (outputs):
    stock's KeyError, verbatim, from train(), evaluate() and predict(), before anything is
    written (it was reported as a step that "does not compile with XLA", the cause buried)."""
    import tfcases

    features, labels = tfcases.two_in_two_out_data()
    if wrong == "features":
        features = {"a": features["a"], "bb": features["b"]}
    else:
        labels = {"cls": labels["cls"], "r": labels["reg"]}
    input_fn = tfcases.dataset_input_fn(features, labels)
    raised = {}
    for name, patch in (
        ("stock", {"mode": "off"}),
        ("engine", {"mode": "cpu", "engine": "strategy"}),
    ):
        estimator = tfcases.convert(
            tmp_path / name, tfcases.two_in_two_out, patch=dict(patch, quiet=True)
        )
        calls = [lambda: estimator.train(input_fn, steps=1), lambda: estimator.evaluate(input_fn)]
        if wrong == "features":
            calls.append(lambda: list(estimator.predict(tfcases.dataset_input_fn(features))))
        raised[name] = []
        for call in calls:
            with pytest.raises(KeyError) as caught:
                call()
            raised[name].append(str(caught.value))
    assert raised["engine"] == raised["stock"]
    assert "does not cover requested" in raised["stock"][0]
    assert not list((tmp_path / "engine").glob("model.ckpt-*"))


@pytest.mark.slow
def test_float64_input_is_cast_to_float32_for_the_replicas_as_on_the_tpu_path(tmp_path):
    """numpy's and pandas' float64 features and labels reach the engine's replicas as float32,
    as the TPUEstimator path feeds them (no TPU infeed takes float64: on a TPU the engine's input
    would fail), said once per call as there; the numbers stay stock's, short last batch included.
    Without the cast the replicas' element holds float64 and the note is missing."""
    import numpy as np
    import tensorflow as tf
    import tfcases

    from tpushim import _observe

    def build():
        tf.keras.utils.set_random_seed(0)
        inputs = tf.keras.Input((4,), name="x")
        outputs = tf.keras.layers.Dense(1)(tf.keras.layers.Dense(8, activation="tanh")(inputs))
        model = tf.keras.Model(inputs, outputs)
        model.compile(tf.keras.optimizers.legacy.SGD(0.05), "mse", metrics=["mae"])
        return model

    rng = np.random.RandomState(0)
    x, y = rng.randn(20, 4), rng.randn(20, 1)  # float64, as numpy gives them

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(8)  # the last batch short

    class Notes(_observe.Observer):
        def __init__(self):
            self.kinds = []

        def adapted(self, call, kind, text):
            self.kinds.append(kind)

    notes = Notes()
    with _observe.observing(notes):
        _evaluated_as_stocks(tmp_path, build, input_fn, steps=3)
    assert "float64" in notes.kinds

    estimator = tfcases.convert(
        tmp_path / "spec",
        build(),
        patch={"mode": "cpu", "engine": "strategy", "quiet": True},
        config=tfcases.ESTIMATOR.RunConfig(tf_random_seed=7),
    )
    made = estimator._input(input_fn, tfcases.ESTIMATOR.ModeKeys.TRAIN)
    dtypes = {spec.dtype for spec in tf.nest.flatten(made[1])}
    assert tf.float64 not in dtypes and tf.float32 in dtypes, dtypes


def _same_names_model(outputs):
    """A model whose ``weighted_metrics`` repeat names of its ``metrics``: one output, or
    :func:`tfcases.two_in_two_out`'s two."""
    import tensorflow as tf
    import tfcases

    if outputs == 2:
        model = tfcases.two_in_two_out()
        model.compile(
            optimizer=model.optimizer,
            loss=model.loss,
            loss_weights={"cls": 1.0, "reg": 0.5},
            metrics={"cls": ["accuracy"], "reg": ["mae"]},
            weighted_metrics={"cls": ["accuracy"], "reg": ["mae", "mse"]},
        )
        return model
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(8, activation="relu", input_shape=(4,), name="hidden"),
            tf.keras.layers.Dense(3, activation="softmax", name="probs"),
        ]
    )
    model.compile(
        "adam",
        "sparse_categorical_crossentropy",
        metrics=["accuracy", "mae"],
        weighted_metrics=["accuracy", "mse"],
    )
    return model


#: Stock 2.15's evaluate() of :func:`_same_names_model` after 3 steps (recorded on TF 2.15.1):
#: a weighted metric named as an unweighted one is ``<name>_1`` (Keras's v1 compile), never
#: ``weighted_<name>`` (its v2 metrics container).
_SAME_NAMES_STOCK_215 = {
    1: {
        "accuracy": 0.48076922,
        "accuracy_1": 0.48076922,
        "mae": 0.79487175,
        "mse": 0.97800136,
        "loss": 1.0929339,
    },
    2: {
        "cls_accuracy": 0.34615386,
        "cls_accuracy_1": 0.34615386,
        "reg_mae": 0.8213596,
        "reg_mae_1": 0.8213596,
        "reg_mse": 0.85674655,
        "loss": 1.5556678,
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("outputs", [1, 2])
def test_weighted_metrics_named_as_unweighted_ones_are_named_as_stocks(tmp_path, outputs):
    """``metrics=["accuracy"]`` with ``weighted_metrics=["accuracy"]`` (and the family: several
    metrics, several outputs): stock's keys and values on the strategy engine, and in cpu mode
    (the TPUEstimator path on TensorFlow <= 2.15), against stock 2.15's recorded numbers."""
    import numpy as np
    import tfcases

    if outputs == 2:
        features, labels = tfcases.two_in_two_out_data()
    else:
        features, labels = tfcases.data()
    train = tfcases.dataset_input_fn(features, labels)
    results = {}
    for name, patch in (
        ("stock", {"mode": "off"}),
        ("cpu", {"mode": "cpu", "quiet": True}),
        ("strategy", {"mode": "cpu", "engine": "strategy", "quiet": True}),
    ):
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
        model = _same_names_model(outputs)
        estimator = tfcases.convert(tmp_path / name, model, patch=patch, config=config)
        estimator.train(train, steps=3)
        results[name] = estimator.evaluate(train)
    want = _SAME_NAMES_STOCK_215[outputs]
    for name, got in results.items():
        assert set(got) == set(want) | {"global_step"}, name
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-5, err_msg=f"{name} {key}")


@pytest.mark.parametrize(
    "engine", ["strategy", pytest.param("tpuestimator", marks=pytest.mark.tpuestimator)]
)
def test_a_runconfig_strategy_on_a_tpu_is_said_with_its_batch_arithmetic(tmp_path, caplog, engine):
    """``RunConfig(train_distribute=MirroredStrategy())`` on a TPU (faked): stock gives each of
    the strategy's replicas a batch of its own, a TPU splits the input_fn's batch over its cores
    as the global batch. The conversion says so, with the arithmetic and what to do (the
    strategy engine in its line too); without a strategy, nothing of it."""
    import tensorflow as tf
    import tfcases

    from tpushim._preflight import faketpu

    said = "A TPU does not use the strategy: the input_fn's batch is the global batch"
    for name, distribute in (("plain", None), ("mirrored", tf.distribute.MirroredStrategy())):
        caplog.clear()
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7, train_distribute=distribute)
        with faketpu.faked_tpu_system() as tpu, caplog.at_level("INFO", logger="tpushim"):
            tfcases.convert(
                tmp_path / name, patch=dict(tpu=tpu.master, engine=engine), config=config
            )
        line = [r.getMessage() for r in caplog.records if "model_to_estimator ->" in r.getMessage()]
        if distribute is None:
            assert said not in caplog.text
            continue
        assert "RunConfig(train_distribute=MirroredStrategy) gives each of its replicas" in (
            caplog.text
        )
        assert said in caplog.text
        assert "have the input_fn return N x its batch" in caplog.text
        if engine == "strategy":
            assert "RunConfig's train_distribute=MirroredStrategy not used" in line[0], line


@pytest.mark.parametrize(
    "engine", ["strategy", pytest.param("tpuestimator", marks=pytest.mark.tpuestimator)]
)
def test_the_preflight_warns_of_a_runconfig_strategy_with_its_batch_arithmetic(tmp_path, engine):
    """The preflight's ``distribute-batch`` warning for a RunConfig's strategy (one replica
    here: cpu mode refuses several), with the cores checked; none without a strategy. As
    ``python -m tpushim check`` runs a script: cpu mode, or on TensorFlow >= 2.16 tpushim's
    estimator API (mode off) and the strategy engine's checks."""
    import tensorflow as tf
    import tfcases

    from tpushim import _preflight
    from tpushim._preflight import strategy_checks

    own = _versions.uses_own_estimator()
    recording = strategy_checks.recording if own else _preflight.recording
    for name, distribute in (("plain", None), ("mirrored", tf.distribute.MirroredStrategy())):
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7, train_distribute=distribute)
        with (
            tpushim.patched(mode="off" if own else "cpu", engine=engine, quiet=True),
            recording() as recorder,
        ):
            tfcases.convert(tmp_path / name, config=config)
        report = recorder.report(num_cores=16)
        found = [f for f in report.findings if f.code == "distribute-batch"]
        if distribute is None:
            assert not found, report
            continue
        assert len(found) == 1 and found[0].severity == "warning", report
        assert found[0].where == "RunConfig(train_distribute=MirroredStrategy)"
        assert "split over the 16 TPU cores" in found[0].message
        assert "16 x its batch" in found[0].fix
