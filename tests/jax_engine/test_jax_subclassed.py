"""Subclassed Keras models on the JAX engine (tpushim/_jax/_subclassed.py), as stock's
``model_to_estimator`` takes them (``checkpoint_format='saver'``: rebuilt from their config,
freshly initialised, outputs ``output_1``, ...; their own ``train_step`` never called): trained,
evaluated and predicted on 8 XLA CPU devices with a short last batch padded, every weight,
metric and prediction within 1e-5 of stock TensorFlow 2.15's
(tests/reference/jax_subclassed_tf215.json, recorded by tests/jax_engine/jax_subclassed.py):
dict features and two outputs, an ``add_loss`` in ``call``, BatchNormalization, an unseeded
Dropout drawn from ``tf_random_seed``. The user's model keeps its weights. A ``call`` whose
shapes depend on the batch's values is refused before anything is written, naming the op.
"""

import os

import numpy as np
import pytest
from jax_scripts import JAX_TESTS, eight_devices, scripts_started  # noqa: F401 (scripts_started: the scripts' run, in the background)

pytestmark = JAX_TESTS

jax = eight_devices()

import jax_subclassed as cases
import tensorflow as tf

from tpushim import ConversionError

TOL = 1e-5


def _stock(kind):
    import json

    with open(cases.RECORD, encoding="utf-8") as f:
        entry = json.load(f)[kind]
    return (
        entry["metrics"],
        np.array(entry["predictions"], np.float64),
        {n: np.array(v, np.float64) for n, v in entry["values"].items()},
    )


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    root = tmp_path_factory.mktemp("subclassed")
    out = {}
    for kind in cases.KINDS:
        user_model = cases.model(kind)
        before = [w.numpy() for w in user_model.weights]
        estimator = cases.converted(user_model, os.path.join(root, kind), mode="cpu", engine="jax")
        out[kind] = (
            type(estimator).__name__,
            cases.run(estimator, kind),
            all(np.array_equal(a, w.numpy()) for a, w in zip(before, user_model.weights)),
        )
    return out


@pytest.mark.parametrize("kind", cases.KINDS)
def test_eight_devices_equal_stock_2_15(runs, kind):
    """multi: dict features, two outputs, an add_loss in call, a custom train_step, weights of
    its own before conversion; noisy: BatchNormalization over the real rows, Dropout drawn as
    stock draws it, a branch on the training flag."""
    engine, (metrics, predictions, values), _ = runs[kind]
    assert engine == "JaxEstimator"
    stock_metrics, stock_predictions, stock_values = _stock(kind)
    assert sorted(values) == sorted(stock_values)  # stock's variable names
    assert max(_rel(values[n], v) for n, v in stock_values.items()) < TOL
    assert sorted(metrics) == sorted(stock_metrics)  # output_1_mae, output_2_accuracy, ...
    assert max(_rel(metrics[k], v) for k, v in stock_metrics.items()) < TOL
    assert predictions.shape == stock_predictions.shape == (cases.ROWS, predictions.shape[1])
    assert _rel(predictions, stock_predictions) < TOL


@pytest.mark.parametrize("kind", cases.KINDS)
def test_the_users_model_is_unchanged(runs, kind):
    assert runs[kind][2]


class Masked(tf.keras.Model):
    """A call whose shapes depend on the values (``tf.boolean_mask``): stock's graph runs it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.out = tf.keras.layers.Dense(1)

    def call(self, x):
        return self.out(x) * tf.reduce_mean(tf.boolean_mask(x, x[:, 0] > 0))


def test_a_value_dependent_shape_is_refused_naming_it(runs, tmp_path):
    import tpushim

    model = Masked()
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    with tpushim.patched(quiet=True, mode="cpu", engine="jax"):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=model, model_dir=str(tmp_path / "masked"), checkpoint_format="saver"
        )
    with pytest.raises(ConversionError, match=r"depend on the batch's values.*Where in .*masked"):
        estimator.train(cases.input_fn("noisy"))
    assert tf.train.latest_checkpoint(str(tmp_path / "masked")) is None  # nothing written
