"""The strategy engine's checkpoints are stock's, in both of model_to_estimator's formats
(tpushim/_strategy/checkpoint.py): ``checkpoint_format='checkpoint'`` (object-based) and
``'saver'`` (name-based, stock's graph names).

Against the estimator model_to_estimator returns unpatched: stock's on TensorFlow 2.15, tpushim's
own on >= 2.16 (tpushim/_estimator_api), and on every TensorFlow against what stock 2.15 wrote, recorded
in tests/reference/strategy_checkpoints_tf215.json (``python tests/proofs/test_strategy_checkpoints.py
--record`` on TensorFlow 2.15). Stock's Estimator continues the engine's run and the engine
continues stock's, with stock's numbers; warm starts and export read the engine's checkpoints as
stock's.
"""

import json
import os
import re
import sys

import numpy as np
import pytest

TOL = 1e-5
FORMATS = ("checkpoint", "saver")
STOCK = {"mode": "off"}
ENGINE = {"mode": "cpu", "engine": "strategy", "quiet": True}
RUNS = (("stock", STOCK), ("engine", ENGINE))
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(HERE, "reference", "strategy_checkpoints_tf215.json")


def test_private_names_the_checkpoints_use():
    """Stock's graph names by object path (tpushim/_tfprivate/checkpoint.py), for a model with one layer."""
    import tensorflow as tf

    from tpushim import _tfprivate

    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,), name="out")])
    model.compile(tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9), "mse")
    names, unmatched = _tfprivate.checkpoint.stock_checkpoint_names(model, None)
    slot = ".OPTIMIZER_SLOT/optimizer/momentum"
    assert names == {
        "estimator_global_step": "global_step",
        "layer_with_weights-0/kernel": "out/kernel",
        "layer_with_weights-0/bias": "out/bias",
        f"layer_with_weights-0/kernel/{slot}": "training/SGD/out/kernel/momentum",
        f"layer_with_weights-0/bias/{slot}": "training/SGD/out/bias/momentum",
        "optimizer/decay": "training/SGD/decay",
        "optimizer/learning_rate": "training/SGD/learning_rate",
        "optimizer/momentum": "training/SGD/momentum",
    }
    assert unmatched == []
    step = tf.Variable(0, dtype=tf.int64)
    _tfprivate.estimator.track_estimator_step(model, step)
    assert _tfprivate.checkpoint.checkpoint_variables(model)["estimator_global_step"] is step


OPTIMIZERS = ("sgd", "momentum", "adam", "rmsprop", "nadam", "ftrl", "schedule", "named", "tf1")


def _optimizer(name):
    """Keras optimizers with every kind of variable (slots, hyperparameters, a schedule, Nadam's
    momentum cache, a name of its own) and a ``tf.compat.v1.train`` one (Keras's TFOptimizer)."""
    import tensorflow as tf

    legacy = tf.keras.optimizers.legacy
    return {
        "sgd": lambda: legacy.SGD(0.1),
        "momentum": lambda: legacy.SGD(0.1, momentum=0.9, nesterov=True),
        "adam": lambda: legacy.Adam(amsgrad=True),
        "rmsprop": lambda: legacy.RMSprop(momentum=0.5, centered=True),
        "nadam": legacy.Nadam,
        "ftrl": legacy.Ftrl,
        "schedule": lambda: legacy.Adam(
            tf.keras.optimizers.schedules.ExponentialDecay(0.1, 9, 0.9)
        ),
        "named": lambda: legacy.Adagrad(name="mine"),
        "tf1": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
    }[name]()


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_stocks_names_without_its_gradients(monkeypatch, optimizer):
    """Stock's names are those of Keras's whole train function, for a model with nested, frozen,
    BatchNormalization and two output layers; built without gradients for a Keras optimizer
    (its get_gradients refused), with them for a ``tf.compat.v1.train`` one."""
    import tensorflow as tf

    from tpushim import _tfprivate

    layers = tf.keras.layers
    inputs = tf.keras.Input((4,), name="x")
    hidden = layers.BatchNormalization(name="bn")(layers.Dense(6, name="h")(inputs))
    inner = tf.keras.Sequential(
        [layers.Dense(3, name="d"), layers.Dense(3, name="frozen", trainable=False)], name="inner"
    )
    outputs = [layers.Dense(2, name="o1")(inner(hidden)), layers.Dense(1, name="o2")(hidden)]
    model = tf.keras.Model(inputs, outputs)
    model.compile(_optimizer(optimizer), ["sparse_categorical_crossentropy", "mse"])
    with monkeypatch.context() as whole:  # the names as Keras's train function makes them
        whole.setattr(
            _tfprivate.checkpoint, "make_train_variables", lambda m: m._make_train_function()
        )
        want = _tfprivate.checkpoint.stock_checkpoint_names(model, None)
    if optimizer != "tf1":

        def refused(*args, **kwargs):
            raise AssertionError("stock's names were read from a graph with gradients")

        monkeypatch.setattr(tf.keras.optimizers.legacy.Optimizer, "get_gradients", refused)
    assert _tfprivate.checkpoint.stock_checkpoint_names(model, None) == want
    made = [name for name in want[0].values() if name.startswith("training/")]
    assert made and not [name for name in made if "frozen" in name]  # the optimizer's, compared


def _model():
    import tensorflow as tf
    import tfcases

    # Adam: its bias correction reads the global step, so a run that lost its step differs.
    return tfcases.sequential(optimizer=tf.keras.optimizers.legacy.Adam(0.01))


def _estimator(patch, model_dir, fmt):
    import tfcases

    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
    return tfcases.convert(model_dir, _model, patch=patch, checkpoint_format=fmt, config=config)


def _train(patch, model_dir, fmt, steps=3):
    import tfcases

    x, y = tfcases.data()
    estimator = _estimator(patch, model_dir, fmt)
    estimator.train(tfcases.dataset_input_fn(x, y), steps=steps)
    return estimator


def _evaluate(estimator):
    import tfcases

    x, y = tfcases.data()
    return estimator.evaluate(tfcases.dataset_input_fn(x, y))


def _assert_close(got, want, what):
    assert set(got) == set(want), what
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, atol=TOL, rtol=0, err_msg=f"{what}: {key}")


def written(model_dir):
    """What a checkpoint reader sees of model_dir: the latest checkpoint's keys and shapes, the
    graph names an object-based one records, and the paths ``checkpoint`` lists (model_dir
    written as ``MODEL_DIR``)."""
    import tensorflow as tf
    from tensorflow.python.training import saver

    latest = tf.train.latest_checkpoint(str(model_dir))
    keys = {name: list(shape) for name, shape in tf.train.list_variables(latest)}
    try:
        full_names = saver.object_graph_key_mapping(latest)
    except tf.errors.NotFoundError:
        full_names = None
    with open(os.path.join(model_dir, "checkpoint"), encoding="utf-8") as f:
        listed = re.findall(r'^all_model_checkpoint_paths: "(.*)"$', f.read(), re.MULTILINE)
    listed = [p.replace(str(model_dir), "MODEL_DIR") for p in listed]
    return {"keys": keys, "full_names": full_names, "listed": listed}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_engines_checkpoints_are_stocks(tmp_path, fmt):
    """After 3 steps, stock's: keys and shapes, the graph names an object-based checkpoint
    records, the ``checkpoint`` file, every value; ``tf.train.load_variable`` with stock's names.
    Read as stock's: ``WarmStartSettings(model_dir, vars_to_warm_start=[".*"])`` (every global
    variable: the optimizer's slots and the global step too) warm-starts an Estimator to what it
    does from stock's, and ``export_saved_model`` serves stock's outputs."""
    import tensorflow as tf
    import tfcases

    x, y = tfcases.data()
    estimators = {name: _train(patch, tmp_path / name, fmt) for name, patch in RUNS}
    stock, engine = written(tmp_path / "stock"), written(tmp_path / "engine")
    assert engine == stock
    with open(REFERENCE, encoding="utf-8") as f:
        assert engine == json.load(f)[fmt]  # stock TensorFlow 2.15's
    _assert_close(
        tfcases.checkpoint_values(tmp_path / "engine"),
        tfcases.checkpoint_values(tmp_path / "stock"),
        fmt,
    )
    if fmt == "saver":
        for name in ("hidden/kernel", "training/Adam/probs/bias/m", "global_step"):
            np.testing.assert_allclose(
                tf.train.load_variable(str(tmp_path / "engine"), name),
                tf.train.load_variable(str(tmp_path / "stock"), name),
                atol=TOL,
            )

    warm, served = {}, {}
    for name, estimator in estimators.items():
        fresh = _estimator(STOCK, tmp_path / f"fresh-{name}", fmt)
        warmed = tfcases.ESTIMATOR.Estimator(
            model_fn=fresh.model_fn,
            model_dir=str(tmp_path / f"warm-{name}"),
            warm_start_from=tfcases.ESTIMATOR.WarmStartSettings(
                str(tmp_path / name), vars_to_warm_start=[".*"]
            ),
        )
        warmed.train(tfcases.dataset_input_fn(x, y), steps=1)
        warm[name] = tfcases.checkpoint_values(tmp_path / f"warm-{name}")
        receiver = tfcases.ESTIMATOR.export.build_raw_serving_input_receiver_fn(
            {"hidden_input": tf.zeros([1, 4])}
        )
        path = estimator.export_saved_model(str(tmp_path / f"export-{name}"), receiver)
        signature = tf.saved_model.load(path).signatures["serving_default"]
        served[name] = {k: v.numpy() for k, v in signature(hidden_input=tf.constant(x)).items()}
    _assert_close(warm["engine"], warm["stock"], "warm-started, then 1 step")
    step = [v for k, v in warm["engine"].items() if "global_step" in k]
    assert [int(s) for s in step] == [4]  # the engine's step 3, warm-started, then one more
    _assert_close(served["engine"], served["stock"], "served")


def _functional_rmsprop():
    import tensorflow as tf

    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((4,), name="x")
    hidden = tf.keras.layers.Dense(6, activation="tanh", name="h")(inputs)
    outputs = tf.keras.layers.Dense(3, activation="softmax", name="out")(hidden)
    model = tf.keras.Model(inputs, outputs)
    model.compile(
        tf.keras.optimizers.legacy.RMSprop(0.01, momentum=0.5), "sparse_categorical_crossentropy"
    )
    return model


def _batchnorm_sgd():
    import tensorflow as tf
    import tfcases

    return tfcases.sequential(extra_layers=[tf.keras.layers.BatchNormalization(name="bn")])


@pytest.mark.slow
@pytest.mark.parametrize(
    "build,fmt", [(_functional_rmsprop, "saver"), (_batchnorm_sgd, "checkpoint")]
)
def test_other_models_and_optimizers(tmp_path, monkeypatch, build, fmt):
    """A functional model with RMSprop (momentum and rms slots), name-based, and a Sequential with
    BatchNormalization (moving statistics) and SGD + momentum, object-based: stock's keys, names
    and values. The engine reads stock's names from the graph its conversion builds for the
    warm-start checkpoint (stock's training graph), building no second one."""
    import tfcases

    from tpushim import _tfprivate

    def second_graph(*args):
        raise AssertionError("stock's training graph was built again for its names")

    monkeypatch.setattr(_tfprivate.checkpoint, "stock_training_graph", second_graph)
    x, y = tfcases.data()
    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
    for name, patch in RUNS:
        estimator = tfcases.convert(
            tmp_path / name, build, patch=patch, checkpoint_format=fmt, config=config
        )
        estimator.train(tfcases.dataset_input_fn(x, y), steps=2)
    assert written(tmp_path / "engine") == written(tmp_path / "stock")
    _assert_close(
        tfcases.checkpoint_values(tmp_path / "engine"),
        tfcases.checkpoint_values(tmp_path / "stock"),
        fmt,
    )


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_switching_engines_mid_training_keeps_the_run(tmp_path, fmt):
    """3 steps on one estimator, 3 more on the other in the same model_dir: the weights, slots,
    step and evaluation of stock's 3 + 3. Where TPUEstimator runs (TensorFlow <= 2.15), also
    from tpushim's TPUEstimator path to the strategy engine and back (a TPU v3 run continued on
    a v5e, and back)."""
    import tfcases

    from tpushim import _versions

    switches = [("stock", STOCK), ("engine", ENGINE)]
    if not _versions.uses_own_estimator():
        switches.append(("tpuestimator", {"mode": "cpu", "engine": "tpuestimator", "quiet": True}))
    pairs = [("stock", "stock")]
    pairs += [(a, b) for a, _ in switches for b, _ in switches if "engine" in (a, b) and a != b]
    patches = dict(switches)
    runs = {}
    for first, second in pairs:
        name = f"{first}_then_{second}"
        model_dir = tmp_path / name
        _train(patches[first], model_dir, fmt)
        after_three = tfcases.checkpoint_values(model_dir)
        estimator = _train(patches[second], model_dir, fmt)
        runs[name] = (tfcases.checkpoint_values(model_dir), _evaluate(estimator), after_three)
    want_values, want_metrics, three = runs.pop("stock_then_stock")
    assert not np.allclose(  # control: the second call trained on
        want_values[next(k for k in want_values if "kernel" in k)],
        three[next(k for k in three if "kernel" in k)],
        atol=1e-3,
    )
    assert len(runs) == 2 * (len(switches) - 1)
    for name, (values, metrics, _) in runs.items():
        _assert_close(values, want_values, f"{name} weights")
        _assert_close(metrics, want_metrics, f"{name} evaluate")
        assert metrics["global_step"] == 6


@pytest.mark.slow
def test_a_name_based_checkpoint_of_another_optimizer_is_refused_by_name(tmp_path):
    """Continuing a name-based model_dir whose checkpoint lacks this optimizer's slots fails as
    stock's Saver does (NotFoundError), naming them, and writes nothing."""
    import tensorflow as tf
    import tfcases

    x, y = tfcases.data()
    model_dir = tmp_path / "m"
    sgd = tfcases.convert(model_dir, tfcases.sequential, patch=STOCK, checkpoint_format="saver")
    sgd.train(tfcases.dataset_input_fn(x, y), steps=2)
    before = sorted(os.listdir(model_dir))
    engine = _estimator(ENGINE, model_dir, "saver")
    with pytest.raises(tf.errors.NotFoundError, match="training/Adam/hidden/bias/m"):
        engine.train(tfcases.dataset_input_fn(x, y), steps=1)
    assert sorted(os.listdir(model_dir)) == before


def record():
    """Writes what stock TensorFlow 2.15 writes (tests/reference/strategy_checkpoints_tf215.json)."""
    import tempfile

    import tensorflow as tf

    assert tf.__version__.startswith("2.15."), tf.__version__
    out = {"tensorflow": tf.__version__}
    with tempfile.TemporaryDirectory() as root:
        for fmt in FORMATS:
            _train(STOCK, os.path.join(root, fmt), fmt)
            out[fmt] = written(os.path.join(root, fmt))
    with open(REFERENCE, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    sys.path.insert(0, HERE)
    record()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_relative_model_dir_as_stocks(tmp_path, monkeypatch, fmt):
    """A model_dir relative to the working directory (a script's ``model_dir="runs/x"``): the
    ``checkpoint`` file lists what stock's lists, and two train() calls then evaluate() continue
    from the latest checkpoint, as stock's do. The engine once listed its checkpoints relative
    twice over (``../../model.ckpt-3``): the second train() and evaluate() found none and
    started again from the Keras weights, at step 0, without an error."""
    monkeypatch.chdir(tmp_path)
    results, listed = {}, {}
    for name, patch in RUNS:
        model_dir = os.path.join(name, "model")  # relative
        estimator = _train(patch, model_dir, fmt, steps=2)
        _train(patch, model_dir, fmt, steps=2)
        results[name] = _evaluate(estimator)
        with open(os.path.join(model_dir, "checkpoint"), encoding="utf-8") as f:
            listed[name] = f.read().replace(name, "NAME")
    assert listed["engine"] == listed["stock"]
    assert results["engine"]["global_step"] == results["stock"]["global_step"] == 4
    _assert_close(results["engine"], results["stock"], f"relative model_dir, {fmt}")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_earlier_calls_checkpoints_rotated_as_stocks(tmp_path, fmt):
    """A checkpoint every step over three train() calls, as a preemptible TPU's restarts make
    them: model_dir's files are stock's (the ``checkpoint`` state's list beyond its keep, an
    earlier call's included, deleted with its index, data and ``.meta``), and a file beside them
    that the state does not list (the user's) stays, as stock's Saver leaves it."""
    import tensorflow as tf
    import tfcases

    x, y = tfcases.data()
    files = {}
    for name, patch in RUNS:
        model_dir = tmp_path / name
        config = tfcases.ESTIMATOR.RunConfig(
            tf_random_seed=7, save_checkpoints_steps=1, keep_checkpoint_max=2
        )
        model_dir.mkdir()
        (model_dir / "model.ckpt-0.notes").write_text("the user's")
        for _ in range(3):
            estimator = tfcases.convert(
                model_dir, _model, patch=patch, checkpoint_format=fmt, config=config
            )
            estimator.train(tfcases.dataset_input_fn(x, y), steps=2)
        tf.compat.v1.summary.FileWriterCache.clear()
        # (stock's sharded Saver writes a data file per device: their count is not compared)
        names = {re.sub(r"data-\d+-of-\d+$", "data", n) for n in os.listdir(model_dir)}
        files[name] = sorted(n for n in names if "tfevents" not in n)
    assert files["engine"] == files["stock"], (files["engine"], files["stock"])
    assert "model.ckpt-0.notes" in files["stock"]
    assert sum(n.endswith(".index") for n in files["stock"]) == {"saver": 2, "checkpoint": 5}[fmt]
