"""[batch] labels for a [batch, 1] output on the strategy engine (tpushim/_strategy.py): Keras
reduces that output's loss to one value inside the loss function, so the engine reads the labels
as [batch, 1] (one loss per row, as the TPU path does when it pads) to weigh padding rows out;
training on a short last batch then equals stock's within 1e-5, as do the eval loss, the metrics
that read rows and the predictions. On TensorFlow >= 2.16 "stock" is tpushim's own Estimator
(tpushim/_legacy), proven equal to stock 2.15 elsewhere.
"""

import pytest
import tfcases

TOLERANCE = 1e-5

pytestmark = pytest.mark.slow


def _run(model_dir, patch):
    x, y = tfcases.two_in_two_out_data(reg_labels_1d=True)  # 'reg': [52] for a [52, 1] output
    assert y["reg"].ndim == 1
    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
    estimator = tfcases.convert(model_dir, tfcases.two_in_two_out, patch=patch, config=config)
    # batches of 8 over 52 rows: the 7th step trains on a short batch of 4, which the engine pads
    estimator.train(tfcases.dataset_input_fn(x, y), steps=7)
    metrics = estimator.evaluate(tfcases.dataset_input_fn(x, y))
    predictions = list(estimator.predict(tfcases.dataset_input_fn(x)))
    return estimator, metrics, predictions, tfcases.checkpoint_values(model_dir)


def test_batch_labels_for_a_batch_by_one_output_train_as_stock(tmp_path):
    from tpushim import _strategy

    stock = _run(tmp_path / "stock", {"mode": "off"})
    engine = _run(tmp_path / "engine", {"mode": "cpu", "engine": "strategy"})
    assert isinstance(engine[0], _strategy.StrategyEstimator)
    assert len(engine[2]) == 52
    # reg_mae: stock's graph averages mae per batch with [batch] labels (Keras's metrics container
    # reads them as [batch, 1]): a known difference of the host metrics, not of training.
    tfcases.assert_same(stock, engine, TOLERANCE, skip=("reg_mae",))
    # stock's own names (Keras 2's growing output prefix included)
    assert {"loss", "reg_reg_reg_root_mean_squared_error", "cls_accuracy"} <= set(engine[1])
