"""Random draws in training on the JAX engine (tpushim/_jax/_draws.py): Dropout, SpatialDropout1D,
GaussianNoise, GaussianDropout and a ``Lambda`` of ``tf.random.uniform`` drawn on the host by
stock's own ops and seeds, fed to the JAX step.

- A legacy script's model with all five, seeded layers and unseeded ones (``tf_random_seed``
  set), trained twice (a shuffled, repeated input with short batches mid-stream, then a finite
  one), evaluated and predicted: the engine's numbers equal stock's (tpushim's estimator API on
  this TensorFlow, live) and stock TensorFlow 2.15's (recorded below) within 1e-5.
- The step on 8 devices = on 1 device; the draws deterministic given the seeds, other seeds
  give others; each step's mask differs, keeps the rate (a statistical bound) and scales by
  1 / (1 - rate); evaluation does not drop.
- A draw evaluation's and prediction's outputs read (a ``Lambda`` that draws whatever the mode):
  stock's, made on the host per call as training's (live stock and stock 2.15's numbers).
- Converted alone, such a draw is refused, and draws that are not stock's stateful ones, by name.
"""

import jax_scripts
import numpy as np
import pytest
from jax_scripts import JAX_TESTS, ROOT, eight_devices, scripts_started  # noqa: F401

pytestmark = JAX_TESTS

jax = eight_devices()

import tensorflow as tf

from tpushim import ConversionError
from tpushim._jax import _draws, _step, _trace

TOL = 1e-5
#: Stock TensorFlow 2.15.1's numbers for PROGRAM (its estimator, no TPU: tpushim passes it
#: through), measured on CPU: seeded -> (loss, first prediction, tenth prediction).
STOCK_215 = {
    "seeded": (0.9539778828620911, 0.026405103504657745, 0.019571617245674133),
    "unseeded": (0.9005775451660156, -0.18816879391670227, 0.027317941188812256),
}

PROGRAM = """
import json, sys
import tpushim; tpushim.patch()  # stock's path (no TPU), the engine's in its scope
import numpy as np, tensorflow as tf
L = tf.keras.layers
rng = np.random.RandomState(0)
data = (rng.randn(36, 4).astype(np.float32), rng.randn(36, 1).astype(np.float32))
out = {}
for run, scope in (("engine", dict(mode="cpu", engine="jax")), ("stock", {})):
    for case in ("seeded", "unseeded"):
        seed = (lambda s: s) if case == "seeded" else (lambda s: None)
        tf.keras.utils.set_random_seed(1)
        x = tf.keras.Input((4,), name="x")
        h = L.Dense(16, activation="relu", name="h")(x)
        h = L.Dropout(0.5, seed=seed(11))(h)
        h = L.GaussianNoise(0.3, seed=seed(3))(h)
        h = L.GaussianDropout(0.2, seed=seed(5))(h)
        h = L.Flatten()(L.SpatialDropout1D(0.3, seed=seed(9))(L.Reshape((4, 4))(h)))
        h = L.Lambda(lambda t: tf.keras.backend.in_train_phase(
            t + tf.random.uniform(tf.shape(t), seed=seed(17)) * 0.1, t))(h)
        m = tf.keras.Model(x, L.Dense(1, name="y")(h))
        m.compile(tf.keras.optimizers.legacy.SGD(0.05), "mse")
        config = tf.estimator.RunConfig(
            model_dir=f"{sys.argv[1]}/{run}-{case}", tf_random_seed=7)
        with tpushim.patched(**scope):
            est = tf.keras.estimator.model_to_estimator(m, config=config)
        ds = lambda: tf.data.Dataset.from_tensor_slices(data)
        est.train(lambda: ds().shuffle(36).batch(8).repeat(), steps=7)  # short batches
        est.train(lambda: ds().batch(8), steps=6)  # its 5 batches
        results = est.evaluate(lambda: ds().batch(8))
        predictions = [float(p["y"][0]) for p in est.predict(lambda: ds().batch(8))]
        out.setdefault(run, {})[case] = dict(
            type=type(est).__name__, loss=float(results["loss"]),
            step=int(results["global_step"]), predictions=predictions,
            weights={n: est.get_variable_value(n).ravel().tolist()
                     for n in est.get_variable_names() if "kernel/.ATTR" in n and "OPTIM" not in n})
# A draw evaluation and prediction read (a Lambda that draws whatever the mode), unseeded
for run, scope in (("engine", dict(mode="cpu", engine="jax")), ("stock", {})):
    tf.keras.utils.set_random_seed(1)
    x = tf.keras.Input((4,), name="x")
    h = L.GaussianNoise(0.3)(L.Dense(16, activation="relu", name="h")(x))
    h = L.Lambda(lambda t: t + 0.2 * tf.random.normal(tf.shape(t)), name="always")(h)
    m = tf.keras.Model(x, L.Dense(1, name="y")(h))
    m.compile(tf.keras.optimizers.legacy.SGD(0.05), "mse", metrics=["mae"])
    config = tf.estimator.RunConfig(model_dir=f"{sys.argv[1]}/{run}-inference", tf_random_seed=7)
    with tpushim.patched(**scope):
        est = tf.keras.estimator.model_to_estimator(m, config=config)
    ds = lambda: tf.data.Dataset.from_tensor_slices(data)
    est.train(lambda: ds().shuffle(36).batch(8), steps=3)
    results = est.evaluate(lambda: ds().batch(8))  # batches of 8, the last one of 4
    case = out[run]["inference"] = dict(
        type=type(est).__name__, loss=float(results["loss"]), mae=float(results["mae"]),
        predictions=[float(p["y"][0]) for p in est.predict(lambda: ds().batch(8))])
    if run == "engine":  # the negative control: the draws not made (zeros)
        from tpushim._jax import _draws
        made = _draws.CallDraws.draws
        _draws.CallDraws.draws = lambda self, d: [np.zeros_like(a) for a in made(self, d)]
        case["control_loss"] = float(est.evaluate(lambda: ds().batch(8))["loss"])
        _draws.CallDraws.draws = made
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    work = tmp_path_factory.mktemp("draws")
    return jax_scripts.program_result(PROGRAM, work)


def test_a_scripts_draws_are_stocks(program):
    for case in ("seeded", "unseeded"):  # (one test: the program runs once per worker)
        _equal_to_stocks(program, case)


def _equal_to_stocks(program, case):
    engine, stock = program["engine"][case], program["stock"][case]
    assert engine["type"] == "JaxEstimator" and stock["type"] != "JaxEstimator"
    assert engine["step"] == stock["step"] == 12
    assert abs(engine["loss"] - stock["loss"]) < TOL
    np.testing.assert_allclose(engine["predictions"], stock["predictions"], atol=TOL)
    assert engine["weights"].keys() == stock["weights"].keys() and len(engine["weights"]) == 2
    for name, values in stock["weights"].items():
        np.testing.assert_allclose(engine["weights"][name], values, atol=TOL)
    loss, first, tenth = STOCK_215[case]
    assert abs(engine["loss"] - loss) < TOL
    assert abs(engine["predictions"][0] - first) < TOL
    assert abs(engine["predictions"][9] - tenth) < TOL
    # the seeded and unseeded draws are not the same draws
    other = program["engine"]["unseeded" if case == "seeded" else "seeded"]
    assert abs(other["loss"] - engine["loss"]) > 1e-3


#: Stock TensorFlow 2.15.1's numbers for PROGRAM's model whose Lambda draws in evaluation and
#: prediction too (tf.random.normal, unseeded, tf_random_seed 7): evaluate's loss and mae, the
#: first, tenth and last predictions.
STOCK_215_INFERENCE = (
    1.1991780996322632,
    0.9299116134643555,
    (-0.3072820007801056, 0.27829262614250183, 1.0018078088760376),
)


def test_draws_evaluation_and_prediction_read_are_stocks(program):
    """A Lambda drawing whatever the mode (was refused): evaluate's loss and metric and every
    prediction equal stock's (live) and stock 2.15's within 1e-5, each call's draws seeded as
    stock's graph of that call seeds them; the draws not made (the control) are told apart."""
    engine, stock = program["engine"]["inference"], program["stock"]["inference"]
    assert engine["type"] == "JaxEstimator" and stock["type"] != "JaxEstimator"
    loss, mae, (first, tenth, last) = STOCK_215_INFERENCE
    for numbers in (engine, stock):
        assert abs(numbers["loss"] - loss) < TOL and abs(numbers["mae"] - mae) < TOL
        assert len(numbers["predictions"]) == 36
        for i, value in ((0, first), (9, tenth), (35, last)):
            assert abs(numbers["predictions"][i] - value) < TOL
    np.testing.assert_allclose(engine["predictions"], stock["predictions"], atol=TOL)
    assert abs(engine["control_loss"] - loss) > 1e-3


# --- the step, in this process ------------------------------------------------------------------

GLOBAL_BATCH = 16


def noisy_model():
    """Dense -> Dropout -> GaussianNoise -> Dense, no seeds of their own."""
    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(32, activation="relu", name="h")(x)
    h = tf.keras.layers.Dropout(0.4, name="drop")(h)
    h = tf.keras.layers.GaussianNoise(0.5, name="noise")(h)
    model = tf.keras.Model(x, tf.keras.layers.Dense(1, name="y")(h))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    return model


def batches():
    rng = np.random.RandomState(3)
    rows = [16, 16, 16, 5]  # a short last batch, padded
    return [
        ([rng.randn(n, 4).astype(np.float32)], [rng.randn(n, 1).astype(np.float32)], None)
        for n in rows
    ]


def trained(seeds, devices):
    trainer = _step.Trainer(noisy_model(), GLOBAL_BATCH, devices=devices, seeds=seeds)
    losses = trainer.train(batches())
    return losses, trainer.weights()


def test_eight_devices_equal_one_and_the_seeds_decide_the_draws():
    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    losses8, weights8 = trained((7, 0), jax.local_devices()[:8])
    losses1, weights1 = trained((7, 0), jax.local_devices()[:1])
    np.testing.assert_allclose(losses8, losses1, atol=TOL)
    for name in weights1:
        np.testing.assert_allclose(weights8[name], weights1[name], atol=TOL)
    again, _ = trained((7, 0), jax.local_devices()[:8])
    np.testing.assert_array_equal(again, losses8)  # deterministic given the seeds
    other, _ = trained((8, 0), jax.local_devices()[:8])
    assert np.max(np.abs(other - losses8)) > 1e-3  # another tf_random_seed, other draws


def test_each_step_drops_at_the_rate_and_evaluation_does_not():
    rate, rows, width = 0.3, 64, 256
    x = tf.keras.Input((width,), name="x")
    model = tf.keras.Model(x, tf.keras.layers.Dropout(rate, name="drop")(x))
    model.compile("sgd", "mse")
    ones = np.ones([rows, width], np.float32)
    batch = ([ones], [ones], [np.ones([rows], np.float32)], np.ones([rows], np.float32))
    train = _trace.training_function(model, seeds=(7, 0), global_batch=rows)
    traced = _trace.convert(model, train, *batch)
    assert [d.op for d in traced.draws] == ["RandomUniform"] and traced.draws[0].batched
    host = _draws.HostDraws(traced.draws, rows)
    masks = []
    for _ in range(2):
        (_, outputs), _ = traced.fn(traced.params, *batch, host.draw(rows))
        out = np.asarray(outputs[0])
        kept = out != 0
        # kept values scaled by 1 / (1 - rate); dropped at the rate (16384 draws: sd 0.0036)
        np.testing.assert_allclose(out[kept], 1 / (1 - rate), rtol=1e-6)
        assert abs(1 - kept.mean() - rate) < 0.02, kept.mean()
        masks.append(kept)
    assert (masks[0] != masks[1]).mean() > 0.2  # each step its own draws
    host.close()
    evaluate = _trace.training_function(model, training=False)
    fn, _ = _trace.convert_inference(model, evaluate, *batch)
    (_, outputs), _ = fn(traced.params, *batch)
    np.testing.assert_array_equal(np.asarray(outputs[0]), ones)  # no dropout


def test_refuses_a_draw_evaluation_reads_and_draws_not_stocks_stateful_ones():
    x = tf.keras.Input((4,), name="x")
    y = tf.keras.layers.Lambda(lambda t: t + tf.random.normal(tf.shape(t)), name="always")(x)
    model = tf.keras.Model(x, y)
    model.compile("sgd", "mse")
    features = [np.ones([8, 4], np.float32)]
    with pytest.raises(ConversionError, match=r"random draws in evaluation or prediction.*always"):
        _trace.convert_inference(model, _trace.predict_function(model), features)

    shuffled = tf.keras.layers.Lambda(tf.random.shuffle, name="shuffle")(x)
    model = tf.keras.Model(x, tf.keras.layers.Dense(1)(shuffled))
    model.compile("sgd", "mse")
    trainer = _step.Trainer(model, 8, devices=jax.local_devices()[:1])
    with pytest.raises(
        ConversionError, match=r"random draws in training.*RandomShuffle in .*shuffle"
    ):
        trainer.train([(features, [np.ones([8, 1], np.float32)], None)])
