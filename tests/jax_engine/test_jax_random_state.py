"""The program's random state after the JAX engine's calls (tpushim/_jax/_checkpoint.py's
``draw_stocks_seeds``): stock's model_fn clones the model in each ``train()``, ``evaluate()`` and
``predict()``, and each clone's unseeded initializers draw a Keras seed (Keras's seed generator,
else Python's ``random``); the engine makes no clone there and draws as many. A program that
builds a second model after the first (a script comparing two models) then starts it from
stock's initial weights, as tests/strategy/test_strategy.py's check shows for the strategy
engine: here against stock's path in the same process (TensorFlow >= 2.16), on 8 XLA CPU
devices.
"""

import concurrent.futures
import random

import numpy as np
import pytest
from jax_scripts import JAX_TESTS, eight_devices, scripts_started  # noqa: F401 (the scripts' run, in the background)

pytestmark = JAX_TESTS

jax = eight_devices()

import tensorflow as tf
import tfcases


def _build(kind, units):
    if kind == "subclassed":
        model = tfcases.Subclassed()
        model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
        return model
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(units, "relu", input_shape=(4,), name="hidden"),
            tf.keras.layers.Dense(3, "softmax", name="probs"),
        ]
    )
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy")
    return model


def _run(tmp_path, seeding, kind, patch, name):
    """A model built, converted, trained, evaluated and predicted in a seeded thread (Keras's
    seed generator is per thread: none there yet), then a second one built: the first's
    metrics, predictions and checkpoint; the program's random state then (Python's, Keras's
    seed generator's, numpy's), the second's initial weights, the next unseeded eager random
    op's draw."""
    from tf_keras.src import backend

    x, y = tfcases.data()
    train, evaluate = tfcases.dataset_input_fn(x, y, repeat=True), tfcases.dataset_input_fn(x, y)
    tf.keras.backend.clear_session()
    if seeding == "keras":
        tf.keras.utils.set_random_seed(0)  # also Keras's own seed generator
    else:
        random.seed(0)
        np.random.seed(0)
        tf.random.set_seed(0)
    model_dir = tmp_path / name
    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
    # (stock refuses object-based checkpoints for a subclassed model)
    checkpoints = {"checkpoint_format": "saver"} if kind == "subclassed" else {}
    estimator = tfcases.convert(
        model_dir, _build(kind, 8), patch=patch, config=config, **checkpoints
    )
    estimator.train(train, steps=1)
    first = (
        estimator.evaluate(evaluate, steps=1),
        [next(iter(p.values())) for p in estimator.predict(tfcases.dataset_input_fn(x[:8]))],
        tfcases.checkpoint_values(model_dir),
    )
    generator = getattr(backend._SEED_GENERATOR, "generator", None)
    states = (random.getstate(), generator and generator.getstate(), str(np.random.get_state()))
    second = _build("functional", 6)  # its unseeded initializers draw from that state
    return first, states, second.get_weights(), tf.random.uniform([3]).numpy()


@pytest.mark.parametrize("seeding,kind", [("keras", "subclassed"), ("a script's", "functional")])
def test_a_second_model_starts_where_stocks_does(tmp_path, seeding, kind):
    """Stock's random state after a model's conversion and its train, evaluate and predict
    calls, with Python's ``random`` (a script's seeding) or Keras's seed generator
    (``tf.keras.utils.set_random_seed``) drawn: the engine leaves the same, so the program's
    next model starts from stock's weights, and its next eager random op draws stock's."""
    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    results = {}
    for name, patch in (
        ("stock", {"mode": "off"}),
        ("engine", {"mode": "cpu", "engine": "jax", "quiet": True}),
    ):
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            results[name] = thread.submit(_run, tmp_path, seeding, kind, patch, name).result()
    (metrics, predictions, values), states, initial, draw = results["stock"]
    got, got_states, got_initial, got_draw = results["engine"]
    assert set(got[0]) == set(metrics)
    for key, value in metrics.items():
        np.testing.assert_allclose(got[0][key], value, atol=1e-5, rtol=0, err_msg=key)
    np.testing.assert_allclose(np.array(got[1]), np.array(predictions), atol=1e-5, rtol=0)
    assert set(got[2]) == set(values)
    for key, value in values.items():
        np.testing.assert_allclose(got[2][key], value, atol=1e-5, rtol=0, err_msg=key)
    assert got_states == states  # Python's, Keras's seed generator's, numpy's
    for weight, value in zip(initial, got_initial):
        np.testing.assert_array_equal(value, weight)
    np.testing.assert_array_equal(got_draw, draw)
