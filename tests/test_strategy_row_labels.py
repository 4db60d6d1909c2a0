"""[batch] labels for a [batch, 1] output on the strategy engine (tpushim/_strategy.py), as legacy
scripts feed them. Keras reduces that output's loss to one value inside the loss function, so the
engine reads the labels as [batch, 1] for the loss (one loss per row, as the TPU path does when it
pads) to weigh padding rows out; its host metrics read them as stock's graph does (a metric
reducing the last axis, ``mae``, gives one value per batch, averaged over the batches). Training
on a short last batch then equals stock's within 1e-5, as do the eval loss, every metric and the
predictions: a regression output beside a softmax one, and a sigmoid output with
accuracy / crossentropy / mae / AUC. On TensorFlow >= 2.16 "stock" is tpushim's own Estimator
(tpushim/_legacy), proven equal to stock 2.15 elsewhere."""

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
    from tpushim import _strategy

    stock = _run(tmp_path / "stock", {"mode": "off"}, case)
    engine = _run(tmp_path / "engine", {"mode": "cpu", "engine": "strategy"}, case)
    assert isinstance(engine[0], _strategy.StrategyEstimator)
    assert len(engine[2]) == tfcases.N
    tfcases.assert_same(stock, engine, TOLERANCE)
    # stock's own names (Keras 2's growing output prefix included)
    expected = (
        {"loss", "reg_mae", "reg_reg_reg_root_mean_squared_error", "cls_accuracy"}
        if case == "regression"
        else {"loss", "accuracy", "binary_crossentropy", "mae", "auc"}
    )
    assert expected <= set(engine[1])
