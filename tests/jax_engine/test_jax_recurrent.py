"""Recurrent layers (their ``While`` loops over time steps) on the JAX engine: the training
step's loss and ``jax.grad`` of it against TensorFlow's within 1e-6 (benchmarks/jax_layers.py's
models), the loop cut one step short as the negative control, a loop whose values decide its
iterations refused by name, an Embedding + LSTM + GRU + SimpleRNN text classifier with
``recurrent_dropout`` (a mask per time step, drawn on the host) through ``model_to_estimator``
on 8 devices against stock TensorFlow 2.15's recorded numbers (one mask for every step put it
0.19 off stock's estimator on this TensorFlow), and a recurrent layer's input ``dropout``
refused (stock's own numbers change from run to run: its loop's iterations take the mask's
draws in no fixed order)."""

import os
import sys

import numpy as np
import pytest
from jax_scripts import ROOT, eight_devices

pytestmark = pytest.mark.jax

jax = eight_devices()

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import jax_layers

STACK = "Embedding(mask_zero)+Bidirectional(LSTM, GRU(go_backwards))+SimpleRNN"


def test_masked_stacked_bidirectional_backwards_recurrent_layers_equal_tensorflows():
    row = jax_layers.measure(STACK)
    assert row["step"] == "converts", row
    assert row["loss_diff"] < 1e-6 and row["grad_diff"] < 1e-6, row


def test_a_loop_cut_one_step_short_is_not_tensorflows(monkeypatch):
    from tpushim._jax import _ops

    trips = _ops._trip_count
    monkeypatch.setattr(_ops, "_trip_count", lambda *a: trips(*a) - 1)
    row = jax_layers.measure("SimpleRNN")
    assert row["step"] == "converts", row
    assert row["loss_diff"] > 1e-4 and row["grad_diff"] > 1e-4, row


def test_a_loop_whose_values_decide_its_iterations_is_refused_naming_it():
    row = jax_layers.measure("tf.while_loop (a Lambda's)")
    assert row["step"].startswith("refused"), row
    assert "model/lambda/while" in row["step"] or "lambda/while" in row["step"], row
    assert "decided by its values" in row["step"], row


def test_recurrent_layers_with_recurrent_dropout_train_and_evaluate_as_stock_2_15(tmp_path):
    import json

    import jax_recurrent

    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    with open(jax_recurrent.RECORD, encoding="utf-8") as f:
        stock = json.load(f)
    metrics, weights = jax_recurrent.classifier(str(tmp_path), mode="cpu", engine="jax")
    assert set(weights) == set(stock["weights"]) and len(weights) == 12, sorted(weights)
    for name, values in stock["weights"].items():
        np.testing.assert_allclose(weights[name], values, atol=1e-5, err_msg=name)
    assert set(metrics) == set(stock["metrics"]), metrics
    for key, value in stock["metrics"].items():
        assert abs(metrics[key] - value) < 1e-5, (key, metrics[key], value)


def test_a_recurrent_layers_dropout_is_refused_naming_the_layer():
    from tpushim._errors import ConversionError
    from tpushim._jax import _trace

    model, features, labels = jax_layers.families()["LSTM(dropout, recurrent_dropout)"]()
    rows = len(features[0])
    with pytest.raises(ConversionError, match=r"recurrent layer with dropout on its inputs \(lstm"):
        _trace.convert(
            model,
            _trace.training_function(model),
            features,
            labels,
            [np.ones([rows], "float32")],
            np.ones([rows], "float32"),
        )
