"""Recurrent layers (their ``While`` loops over time steps) on the JAX engine: the training
step's loss and ``jax.grad`` of it against TensorFlow's within 1e-6 (benchmarks/jax_layers.py's
models), the loop cut one step short as the negative control, a loop whose values decide its
iterations refused by name, an Embedding + LSTM + GRU + SimpleRNN text classifier with
``recurrent_dropout`` (a mask per time step, drawn on the host) through ``model_to_estimator``
on 8 devices against stock TensorFlow 2.15's recorded numbers (one mask for every step put it
0.19 off stock's estimator on this TensorFlow), and a recurrent layer's input ``dropout``
(LSTM, GRU with ``recurrent_dropout`` too, SimpleRNN; a short padded batch) on 8 devices and 1
against stock's estimator live on this TensorFlow with its loops run one iteration at a time
(its own iterations take the mask's draws in no fixed order, its numbers changing from run to
run: the engine gives the run that took them in time order); the control, each loop's masks in
reverse time order, more than 1e-3 off."""

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


def test_recurrent_layers_input_dropout_trains_as_stocks_loop_in_time_order(
    tmp_path, monkeypatch, caplog
):
    import logging

    import jax_recurrent

    from tpushim._jax import _draws, _step

    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    # TensorFlow's logger at INFO too: a script run before in this process may have quietened it
    with (
        caplog.at_level(logging.INFO),
        caplog.at_level(logging.INFO, logger="tensorflow"),
        jax_recurrent.in_time_order(),  # stock live, its loops run one iteration at a time
    ):
        _, stock = jax_recurrent.classifier(str(tmp_path / "stock"), dropout=True, evaluate=False)
    assert len(stock) == 12, sorted(stock)
    made = {}  # the 8 devices' Trainer, its start and batches
    for method in ("__init__", "restore", "train"):
        monkeypatch.setattr(_step.Trainer, method, _recorded(made, getattr(_step.Trainer, method)))
    with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, logger="tensorflow"):
        _, weights = jax_recurrent.classifier(
            str(tmp_path / "eight"), dropout=True, evaluate=False, mode="cpu", engine="jax"
        )
    monkeypatch.undo()
    notes = [r.getMessage() for r in caplog.records if "input dropout mask" in r.getMessage()]
    assert len(notes) == 1 and "lstm, gru, rnn" in notes[0] and "time order" in notes[0], notes
    final = [
        float(r.getMessage().split(": ")[1].rstrip("."))
        for r in caplog.records
        if r.getMessage().startswith("Loss for final step: ")
    ]
    assert len(final) == 2 and abs(final[0] - final[1]) < 1e-5, final  # stock's, the engine's
    assert set(weights) == set(stock)
    for name, values in stock.items():
        np.testing.assert_allclose(weights[name], values, atol=1e-5, err_msg=name)
    # 1 device from the 8 devices' start: their Trainer's model, seeds, restored state, batches
    eight, start, batches = made["__init__"], made["restore"], made["train"]
    assert len(batches) == 1 and [len(b[0][0]) for b in batches[0]] == [8, 5], batches
    one = _step.Trainer(
        eight.model,
        eight.stock_batch,
        jax.local_devices()[:1],
        eight.custom_objects,
        seeds=eight.seeds,
        fed=eight.fed,
    )
    one.restore(*start)
    one.train(batches[0])
    trained = eight.weights()
    assert set(one.weights()) == set(trained) and len(trained) == 12, sorted(trained)
    for name, values in one.weights().items():
        np.testing.assert_allclose(values, trained[name], atol=1e-6, err_msg=name)

    # the control: each loop's masks taken in reverse time order (the same compiled step, its
    # state and its draws' stream started again)
    draw = _draws.HostDraws.draw

    def reversed_in_time(self, rows):
        return [m[::-1] if d.trips else m for d, m in zip(self.draws, draw(self, rows))]

    monkeypatch.setattr(_draws.HostDraws, "draw", reversed_in_time)
    for host in one._host_draws.values():
        host.close()
    one._host_draws.clear()
    one.params = None
    one.train(batches[0])
    off = max(np.max(np.abs(v - trained[n])) for n, v in one.weights().items())
    assert off > 1e-3, off


def _recorded(made, method):
    """``method`` of a Trainer, recording its self (``__init__``), its arguments (``restore``)
    or its batches (``train``, each call's) in ``made``."""

    def recorded(self, *args, **kwargs):
        name = method.__name__
        if name == "__init__":
            made[name] = self
        elif name == "restore":
            made[name] = args or tuple(kwargs.values())
        else:
            args = (list(args[0]), *args[1:])
            made.setdefault(name, []).append(args[0])
        return method(self, *args, **kwargs)

    return recorded
