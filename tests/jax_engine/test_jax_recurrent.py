"""Recurrent layers (their ``While`` loops over time steps) on the JAX engine: the training
step's loss and ``jax.grad`` of it against TensorFlow's within 1e-6 (benchmarks/jax_layers.py's
models), the loop cut one step short as the negative control, a loop whose values decide its
iterations refused by name, an Embedding + LSTM + GRU + SimpleRNN text classifier with
``recurrent_dropout`` (a mask per time step, drawn on the host) through ``model_to_estimator``
on 8 devices against stock's estimator in this process (one mask for every step is 0.19 off
it), and a recurrent layer's input ``dropout`` refused (stock's own numbers change from run to
run: its iterations take the mask's draws in no fixed order)."""

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


def _classifier(model_dir, **scope):
    """An Embedding(mask_zero) + LSTM + GRU + SimpleRNN classifier, each recurrent layer with
    ``recurrent_dropout`` (unseeded: drawn from ``tf_random_seed``), through
    ``model_to_estimator`` in ``tpushim.patched(**scope)`` (none: stock's), trained (13 rows in
    batches of 8: the last of 5) and evaluated: (metrics, checkpoint's model weights)."""
    import tensorflow as tf

    import tpushim

    rng = np.random.RandomState(0)
    lengths = rng.randint(1, 7, 13)
    ids = np.array([[rng.randint(1, 20) if t < n else 0 for t in range(6)] for n in lengths])
    y = (lengths > 3).astype(np.float32)[:, None]

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"ids": ids}, y)).batch(8)

    tf.keras.utils.set_random_seed(3)
    L = tf.keras.layers
    x = tf.keras.Input((6,), name="ids", dtype="int64")
    h = L.Embedding(20, 4, mask_zero=True, name="emb")(x)
    h = L.LSTM(5, recurrent_dropout=0.3, return_sequences=True, name="lstm")(h)
    h = L.GRU(4, recurrent_dropout=0.4, return_sequences=True, name="gru")(h)
    h = L.SimpleRNN(3, recurrent_dropout=0.5, name="rnn")(h)
    model = tf.keras.Model(x, L.Dense(1, activation="sigmoid", name="y")(h))
    model.compile(tf.keras.optimizers.Adam(0.05), "binary_crossentropy", metrics=["accuracy"])
    with tpushim.patched(quiet=True, **(scope or {"mode": "off"})):
        config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=1)
        est = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
        est.train(input_fn)
        metrics = est.evaluate(input_fn)
    reader = tf.train.load_checkpoint(model_dir)
    weights = {
        n: reader.get_tensor(n)
        for n, d in reader.get_variable_to_dtype_map().items()
        if d.is_floating and "layer_with_weights" in n and "OPTIMIZER" not in n
    }
    return {k: float(v) for k, v in metrics.items()}, weights


def _largest_difference(got, want):
    assert set(got[1]) == set(want[1]) and len(want[1]) == 12, sorted(set(got[1]) ^ set(want[1]))
    assert set(got[0]) == set(want[0]), (got[0], want[0])
    return max(
        *(float(np.max(np.abs(got[1][n] - w))) for n, w in want[1].items()),
        *(abs(got[0][k] - w) for k, w in want[0].items()),
    )


@pytest.fixture(scope="module")
def stock_classifier(tmp_path_factory):
    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    return _classifier(str(tmp_path_factory.mktemp("stock")))


def test_recurrent_layers_with_recurrent_dropout_train_and_evaluate_as_stock(
    stock_classifier, tmp_path
):
    got = _classifier(str(tmp_path), mode="cpu", engine="jax")
    assert _largest_difference(got, stock_classifier) < 1e-5


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
