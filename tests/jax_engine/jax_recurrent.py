"""A recurrent text classifier with ``recurrent_dropout`` on the JAX engine, and stock's numbers
for it: a helper of tests/jax_engine/test_jax_recurrent.py, not a test module.

Stock's graph draws a recurrent cell's ``recurrent_dropout`` mask inside the loop over time
steps: a new mask at every step, in order (each reads the last step's state). Stock is the stock
estimator on TensorFlow 2.15, recorded by

    python tests/jax_engine/jax_recurrent.py --record tests/reference/jax_recurrent_tf215.json

in a TF 2.15 venv: its evaluate() results and final model weights. With input ``dropout``
(``classifier(dropout=True)``) stock's numbers change from run to run; :func:`in_time_order`
fixes them (stock's loops run one iteration at a time), for a comparison live in one process.
"""

import contextlib
import json
import os
import sys

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(os.path.dirname(HERE), "reference", "jax_recurrent_tf215.json")


def _patched(scope):
    if not scope:  # stock's (on TensorFlow >= 2.16 its estimator is tpushim's estimator API)
        if hasattr(tf, "estimator") and hasattr(tf.keras, "estimator"):
            return contextlib.nullcontext()
        scope = {"mode": "off"}
    import tpushim

    return tpushim.patched(quiet=True, **scope)


@contextlib.contextmanager
def in_time_order():
    """Stock's recurrent loops made to run one iteration at a time, first step first (Keras's
    backend ``rnn`` calls ``tf.compat.v1.while_loop`` with ``parallel_iterations=32``; 1
    inside): a mask drawn in the loop (input ``dropout``) then takes its stream's draws in time
    order, and stock's numbers are fixed. For stock's run only (this module's patch of stock,
    not tpushim's)."""
    from tpushim._tfprivate import modules

    v1 = modules.keras_module("backend").tf.compat.v1
    loop = v1.while_loop

    def while_loop(*args, **kwargs):
        kwargs["parallel_iterations"] = 1
        return loop(*args, **kwargs)

    v1.while_loop = while_loop
    try:
        yield
    finally:
        v1.while_loop = loop


def classifier(model_dir, dropout=False, evaluate=True, **scope):
    """An Embedding(mask_zero) + LSTM + GRU + SimpleRNN classifier, each recurrent layer with
    ``recurrent_dropout`` (unseeded: drawn from ``tf_random_seed``), through
    ``model_to_estimator`` in ``tpushim.patched(**scope)`` (none: stock's), trained (13 rows in
    batches of 8: the last of 5) and evaluated (``evaluate``; else no metrics): (metrics,
    checkpoint's model weights). ``dropout``: the layers with ``dropout`` on their inputs instead
    (the LSTM and the SimpleRNN alone, the GRU with ``recurrent_dropout`` too)."""
    rates = {"lstm": (0.3, 0), "gru": (0.2, 0.4), "rnn": (0.5, 0)}
    if not dropout:
        rates = {"lstm": (0, 0.3), "gru": (0, 0.4), "rnn": (0, 0.5)}
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
    h = L.LSTM(5, return_sequences=True, **_rates(rates, "lstm"))(h)
    h = L.GRU(4, return_sequences=True, **_rates(rates, "gru"))(h)
    h = L.SimpleRNN(3, **_rates(rates, "rnn"))(h)
    model = tf.keras.Model(x, L.Dense(1, activation="sigmoid", name="y")(h))
    model.compile(tf.keras.optimizers.Adam(0.05), "binary_crossentropy", metrics=["accuracy"])
    with _patched(scope):
        config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=1)
        est = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
        est.train(input_fn)
        metrics = est.evaluate(input_fn) if evaluate else {}
    reader = tf.train.load_checkpoint(model_dir)
    weights = {
        n: reader.get_tensor(n)
        for n, d in reader.get_variable_to_dtype_map().items()
        if d.is_floating and "layer_with_weights" in n and "OPTIMIZER" not in n
    }
    return {k: float(v) for k, v in metrics.items()}, {
        n: w.ravel().tolist() for n, w in weights.items()
    }


def _rates(rates, name):
    return dict(zip(("dropout", "recurrent_dropout"), rates[name]), name=name)


if __name__ == "__main__":  # --record PATH: stock's numbers (TensorFlow 2.15)
    import tempfile

    assert sys.argv[1] == "--record", "usage: jax_recurrent.py --record PATH"
    with tempfile.TemporaryDirectory() as root:
        metrics, weights = classifier(root)
    with open(sys.argv[2], "w") as f:
        json.dump(
            {"tensorflow": tf.__version__, "metrics": metrics, "weights": weights},
            f,
            indent=1,
            sort_keys=True,
        )
        f.write("\n")
