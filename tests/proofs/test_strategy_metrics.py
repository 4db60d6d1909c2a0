"""``tf.estimator.add_metrics`` on the strategy engine (tpushim/_added_metrics.py): the estimator
it returns is still the engine's, and its added metrics -- every signature stock takes, returning
``tf.compat.v1.metrics`` pairs or Keras ``Metric`` objects, chained, one replacing a compiled
metric -- equal stock's on 8 replicas with padded batches (tests/strategy_metrics_proof.py, in a
subprocess: the logical devices must be made before TensorFlow initialises). What scripts do
around it: ``train_and_evaluate`` with ``LatestExporter`` and ``BestExporter``,
``get_variable_names`` / ``get_variable_value`` / ``latest_checkpoint``, an Estimator rebuilt
around its model_fn (stock's, said with the fix). On TensorFlow >= 2.16, against stock TF 2.15's
numbers (tests/reference/strategy_metrics_tf215.json)."""

import json
import logging
import os

import numpy as np
import procs
import pytest

import tpushim

TOLERANCE = 1e-5

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    root = tmp_path_factory.mktemp("strategy_metrics")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = procs.python([os.path.join(here, "strategy_metrics_proof.py"), root], timeout=900)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, result.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_added_metrics_run_on_the_engine(proof):
    assert proof["engine"] == "StrategyEstimator" and proof["replicas"] == 8


def test_added_metrics_equal_stocks(proof):
    assert proof["keys"] == proof["stock_keys"]
    assert {"auc", "precision", "keras_auc", "keras_recall", "mean_feature"} <= set(proof["keys"])
    assert proof["difference"] <= TOLERANCE, proof


def test_stocks_add_metrics_on_the_engines_checkpoint(proof):
    if "same_checkpoint" not in proof:
        pytest.skip("TensorFlow >= 2.16: no stock estimator to read the checkpoint")
    assert proof["same_checkpoint"] <= TOLERANCE, proof


def test_negative_control_padding_rows_in_the_added_metrics(proof):
    assert proof["control"] > 1e-3, proof


def test_ridge_regressions_mae_and_mse_over_short_batches_as_stocks(proof):
    """A ridge regression (feature columns, an L2 kernel regularizer, ``mae``, ``mse`` and a
    ``MeanAbsoluteError`` object, float64 [batch] labels) evaluated in batches of 10 with a short
    last one, on 8 replicas (each batch padded): stock's loss and metrics, averaged over the
    batches as stock's graph averages a [batch] label's. The control hands the metrics the labels
    as [batch, 1] (averages over the rows): its MAE moves by more than 1e-3 relative."""
    ridge = proof["ridge"]
    assert ridge["replicas"] == 8
    assert sorted(ridge["engine"]) == sorted(ridge["stock"])
    assert {"loss", "mae", "mse", "mae_object"} <= set(ridge["engine"])
    assert ridge["difference"] <= TOLERANCE, ridge
    assert ridge["control"] > 1e-3, ridge


def test_a_second_ridge_regression_starts_from_stocks_weights(proof):
    """A second ridge regression built after the first was trained and evaluated, its initial
    weights drawn from the program's random state (not seeded again), as a script comparing two
    models builds its second: stock's initial weights. When the engine's copies of a model for its
    checks drew from that state, the second started from other weights; trained towards the
    optimum, its loss and MSE came out close to stock's and its MAE 1e-3 off (the MAE moves with
    the weights to first order there, the loss to second). The control draws one Keras seed
    between the two models."""
    second = proof["ridge"]["second"]
    assert len(second["engine"]) == len(second["stock"]) == 3  # kernel [2, 1], bias [1]
    assert second["difference"] <= TOLERANCE, second
    assert second["control"] > 1e-3, second


def test_a_second_ridge_regression_starts_where_stocks_does(proof):
    """A second ridge regression built after the first in one program, its initial weights drawn
    from the program's random state (not seeded again), as a script comparing two models builds
    its second: stock's loss and metrics. When the engine's copies of a model drew from that
    state, the second started from other weights; trained to convergence, its loss and MSE came
    out equal to stock's and its MAE did not (the MAE moves with the weights to first order, the
    loss only to second). The control draws one Keras seed between the two models."""
    second = proof["ridge"]["second"]
    assert sorted(second["engine"]) == sorted(second["stock"])
    assert second["difference"] <= TOLERANCE, second
    assert second["control"] > 1e-3, second


def test_stock_is_stock_tensorflow_215():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(here, "reference", "strategy_metrics_tf215.json")) as f:
        assert json.load(f)["tensorflow"].startswith("2.15.")


def _metric_fn(labels, predictions, features, config):
    import tensorflow as tf

    assert config.model_dir
    return {
        "mean_feature": tf.compat.v1.metrics.mean(features[:, 0]),
        "accuracy": tf.compat.v1.metrics.accuracy(
            tf.reshape(labels, [-1]), tf.argmax(predictions["probs"], 1)
        ),
        "top_probability": tf.compat.v1.metrics.mean(tf.reduce_max(predictions["probs"], 1)),
    }


def test_train_and_evaluate_with_exporters_and_the_variables_as_stocks(tmp_path):
    """On one device: the add_metrics estimator under ``train_and_evaluate`` with both exporters
    (they call ``export_saved_model``) gives stock's metrics, exports what stock exports, and
    serves the engine's predictions; the checkpoint's names and values, as a script reads them
    from the estimator, are stock's."""
    import tensorflow as tf
    import tfcases

    from tpushim._strategy import estimator as _strategy_estimator

    api = tfcases.ESTIMATOR  # tf.estimator (on TensorFlow >= 2.16: tpushim's)
    x, y = tfcases.data()
    train = tfcases.dataset_input_fn(x, y)
    serving = api.export.build_raw_serving_input_receiver_fn({"hidden_input": tf.zeros([1, 4])})
    runs = {}
    for name, patch in (
        ("stock", {"mode": "off"}),
        ("engine", {"mode": "cpu", "engine": "strategy"}),
    ):
        with tpushim.patched(quiet=True, **patch):
            converted = tfcases.convert(tmp_path / name, config=api.RunConfig(tf_random_seed=7))
            estimator = api.add_metrics(converted, _metric_fn)
        exporters = [api.LatestExporter("latest", serving), api.BestExporter("best", serving)]
        metrics, exports = api.train_and_evaluate(
            estimator,
            api.TrainSpec(train, max_steps=6),
            api.EvalSpec(train, steps=None, throttle_secs=0, exporters=exporters),
        )
        runs[name] = (estimator, metrics, exports)
    (stock, stock_metrics, stock_exports), (engine, metrics, exports) = (
        runs["stock"],
        runs["engine"],
    )
    assert isinstance(engine, _strategy_estimator.StrategyEstimator)
    assert set(metrics) == set(stock_metrics) >= {"mean_feature", "top_probability", "accuracy"}
    for key, value in stock_metrics.items():
        np.testing.assert_allclose(metrics[key], value, atol=TOLERANCE, err_msg=key)
    assert (
        [os.path.basename(os.path.dirname(p)) for p in map(os.fsdecode, exports)]
        == [os.path.basename(os.path.dirname(p)) for p in map(os.fsdecode, stock_exports)]
        == ["latest", "best"]
    )
    predicted = np.array([p["probs"] for p in engine.predict(tfcases.dataset_input_fn(x))])
    for path in exports:
        served = tf.saved_model.load(os.fsdecode(path)).signatures["serving_default"]
        np.testing.assert_allclose(
            served(hidden_input=tf.constant(x))["probs"].numpy(), predicted, atol=TOLERANCE
        )
    assert os.path.basename(engine.latest_checkpoint()) == os.path.basename(
        stock.latest_checkpoint()
    )
    assert engine.get_variable_names() == stock.get_variable_names()
    for variable in stock.get_variable_names():
        if variable != "_CHECKPOINTABLE_OBJECT_GRAPH":
            np.testing.assert_allclose(
                engine.get_variable_value(variable),
                stock.get_variable_value(variable),
                atol=TOLERANCE,
                err_msg=variable,
            )


def test_add_metrics_keeps_the_engine_and_a_rebuilt_estimator_is_said_with_the_fix(
    tmp_path, caplog
):
    """add_metrics returns the engine's estimator (its model_dir, config, conversion; chained
    metric_fns add up; stock's argument check first); an Estimator rebuilt around its model_fn
    is stock's, said in one line naming add_metrics."""
    import tensorflow as tf
    import tfcases

    from tpushim._strategy import estimator as _strategy_estimator

    def first(predictions):
        return {"mean": tf.compat.v1.metrics.mean(predictions["probs"])}

    api = tfcases.ESTIMATOR
    with tpushim.patched(mode="cpu", engine="strategy", quiet=True):
        converted = tfcases.convert(tmp_path / "m")
        added = api.add_metrics(api.add_metrics(converted, first), _metric_fn)
        with pytest.raises(ValueError, match="has following not expected args: \\['params'\\]"):
            api.add_metrics(converted, lambda predictions, params: {})
        tpushim_logger = logging.getLogger("tpushim")
        tpushim_logger.setLevel(logging.INFO)
        caplog.clear()  # what the conversion said before (its level depends on earlier tests)
        with caplog.at_level(logging.WARNING, logger="tpushim"):
            rebuilt = api.Estimator(model_fn=converted.model_fn, model_dir=str(tmp_path / "r"))
    assert isinstance(added, _strategy_estimator.StrategyEstimator)
    assert added.model_dir == converted.model_dir
    assert added.config.tf_random_seed == converted.config.tf_random_seed
    assert added._tpushim_plan is converted._tpushim_plan
    assert added._tpushim_metric_fns == (first, _metric_fn)
    assert converted._tpushim_metric_fns == ()
    assert not isinstance(rebuilt, _strategy_estimator.StrategyEstimator)
    said = [
        r.getMessage()
        for r in caplog.records
        if r.name == "tpushim" and r.levelno >= logging.WARNING
    ]
    assert len(said) == 1, said
    assert "Estimator(model_fn=<the strategy engine's estimator>.model_fn) -> stock" in said[0]
    assert "use tf.estimator.add_metrics(<the converted estimator>, metric_fn)" in said[0]


def test_a_metric_named_loss_is_refused_as_stock_refuses_it(tmp_path):
    import tensorflow as tf
    import tfcases

    from tpushim._strategy import estimator as _strategy_estimator

    def named_loss(predictions):
        return {"loss": tf.compat.v1.metrics.mean(predictions["probs"])}

    x, y = tfcases.data(n=8)
    api = tfcases.ESTIMATOR
    with tpushim.patched(mode="cpu", engine="strategy", quiet=True):
        added = api.add_metrics(tfcases.convert(tmp_path), named_loss)
    assert isinstance(added, _strategy_estimator.StrategyEstimator)
    added.train(tfcases.dataset_input_fn(x, y), steps=1)
    with pytest.raises(ValueError, match='Metric with name "loss" is not allowed'):
        added.evaluate(tfcases.dataset_input_fn(x, y))


def test_only_the_tensors_the_metrics_read_come_to_the_host():
    """Built once on the input's specs: a feature no metric reads (here 784 floats a row) is
    neither gathered from the replicas nor fed; what is read updates stock's metric code."""
    import tensorflow as tf

    from tpushim import _added_metrics

    def metric_fn(labels, predictions, features):
        return {
            "mean_b": tf.compat.v1.metrics.mean(features["b"]),
            "auc": tf.compat.v1.metrics.auc(labels, predictions["out"]),
        }

    def spec(*shape):
        return tf.TensorSpec(shape, tf.float32)

    added = _added_metrics.added(
        [metric_fn],
        None,
        {"other": spec(2, 1), "out": spec(2, 1)},
        {"features": {"a": spec(2, 784), "b": spec(2)}, "labels": spec(2, 1)},
    )
    assert added.used == {"features": [1], "labels": [0], "predictions": [1]}
    added.update(
        {
            "features": [np.array([1.0, 3.0], np.float32)],
            "labels": [np.array([[0.0], [1.0]], np.float32)],
            "predictions": [np.array([[0.2], [0.9]], np.float32)],
        }
    )
    results = added.results()
    assert results["mean_b"] == 2.0 and results["auc"] > 0.99
    assert _added_metrics.added((), None, {}, {}) is None


def _same_lists(text):
    """An error's text with each bracketed list's items sorted (stock prints sets as lists)."""
    import re

    return re.sub(r"\[([^\]]*)\]", lambda m: f"[{', '.join(sorted(m[1].split(', ')))}]", text)


def test_metric_names_map_as_stocks(proof):
    """model_to_estimator's metric_names_map renames the compiled metrics on the engine as on
    stock (the keys; the values within 1e-5 of stock's, on 8 replicas)."""
    stock, engine = proof["names_map"]["stock"]["mapped"], proof["names_map"]["engine"]["mapped"]
    assert sorted(engine) == sorted(stock) == ["global_step", "loss", "my_accuracy", "my_mae"]
    for key, value in stock.items():
        assert abs(engine[key] - value) <= TOLERANCE * max(1.0, abs(value)), (key, engine, stock)


@pytest.mark.parametrize("case", ["missing", "extra"])
def test_wrong_metric_names_map_refused_as_stock(proof, case):
    """A map missing a compiled metric's name, or naming one the model lacks: stock's ValueError
    at train(), in its words, raised by the engine before its train() writes anything."""
    stock, engine = proof["names_map"]["stock"][case], proof["names_map"]["engine"][case]
    assert engine["error"].startswith("Invalid `metric_names_map`."), engine
    assert _same_lists(engine["error"]) == _same_lists(stock["error"]), (engine, stock)
    assert engine["wrote"] == [], engine
