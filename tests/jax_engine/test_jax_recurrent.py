"""Recurrent layers (their ``While`` loops over time steps) on the JAX engine: the training
step's loss and ``jax.grad`` of it against TensorFlow's within 1e-6 (benchmarks/jax_layers.py's
models), the loop cut one step short as the negative control, a loop whose values decide its
iterations refused by name, and an Embedding + LSTM text classifier through
``model_to_estimator`` on 8 devices against stock's estimator (in the same process)."""

import os
import sys

import numpy as np
import pytest
from jax_scripts import ROOT, eight_devices, program_result

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


CODE = """
import json, os, sys
import contextlib
import tpushim; tpushim.patch()
import numpy as np, tensorflow as tf
rng = np.random.RandomState(0)
lengths = rng.randint(1, 7, 21)
ids = np.array([[rng.randint(1, 20) if t < n else 0 for t in range(6)] for n in lengths], np.int64)
y = (lengths > 3).astype(np.float32)[:, None]  # 21 rows in batches of 8: the last has 5
def input_fn():
    return tf.data.Dataset.from_tensor_slices(({"ids": ids}, y)).batch(8)
out = {}
for run, scope in (("engine", dict(mode="cpu", engine="jax")), ("stock", None)):
    tf.keras.utils.set_random_seed(3)
    L = tf.keras.layers
    x = tf.keras.Input((6,), name="ids", dtype="int64")
    h = L.LSTM(5, name="lstm")(L.Embedding(20, 4, mask_zero=True, name="emb")(x))
    model = tf.keras.Model(x, L.Dense(1, activation="sigmoid", name="y")(h))
    model.compile(tf.keras.optimizers.Adam(0.05), "binary_crossentropy", metrics=["accuracy"])
    config = tf.estimator.RunConfig(model_dir=os.path.join(sys.argv[1], run), tf_random_seed=1)
    with tpushim.patched(**scope) if scope else contextlib.nullcontext():
        est = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
    est.train(input_fn)  # 3 steps, the last of 5 rows
    metrics = est.evaluate(input_fn)
    reader = tf.train.load_checkpoint(config.model_dir)
    out[run] = {"metrics": {k: float(v) for k, v in metrics.items()},
                "weights": {n: reader.get_tensor(n).ravel().tolist()
                            for n, d in reader.get_variable_to_dtype_map().items()
                            if d.is_floating and "layer_with_weights" in n and "OPTIMIZER" not in n}}
print("RESULT " + json.dumps(out))
"""


def test_an_embedding_lstm_classifier_trains_and_evaluates_as_stock(tmp_path):
    got = program_result(CODE, tmp_path)
    engine, stock = got["engine"], got["stock"]
    assert set(engine["weights"]) == set(stock["weights"]) and len(stock["weights"]) == 6
    for name, values in stock["weights"].items():
        np.testing.assert_allclose(engine["weights"][name], values, atol=1e-5, err_msg=name)
    for key, value in stock["metrics"].items():
        assert abs(engine["metrics"][key] - value) < 1e-5, key


def test_a_recurrent_layers_dropout_is_refused_naming_the_layer():
    from tpushim._errors import ConversionError
    from tpushim._jax import _trace

    model, features, labels = jax_layers.families()["LSTM(dropout, recurrent_dropout)"]()
    rows = len(features[0])
    with pytest.raises(ConversionError, match=r"recurrent layer with dropout.*\(lstm"):
        _trace.convert(
            model,
            _trace.training_function(model),
            features,
            labels,
            [np.ones([rows], "float32")],
            np.ones([rows], "float32"),
        )
