"""The JAX engine's training step (tpushim/_jax) against tf-keras's own training of the same
model, data and starting weights: N steps on 8 XLA CPU devices = on 1 device = tf-keras's
``train_on_batch`` on CPU (weights and moving statistics within 1e-5, every step's loss too),
with a short last batch padded to the global batch, BatchNormalization, sample weights, SGD with
momentum and nesterov, Adam in its legacy and v2 spellings; negative controls that must differ;
what the step refuses, by name.

Needs jax and tf2jax (the ``jax`` extra); 8 devices come from
``XLA_FLAGS=--xla_force_host_platform_device_count=8``, set here before jax is first imported.
"""

import numpy as np
import pytest
from jax_scripts import eight_devices, scripts_started  # noqa: F401 (scripts_started: the scripts' run, in the background)

pytestmark = pytest.mark.jax

jax = eight_devices()

import tensorflow as tf
import tfcases

from tpushim import ConversionError
from tpushim._jax import _step

TOL = 1e-5
GLOBAL_BATCH = 8
ROWS = 27  # 3 full batches and a short one of 3 rows: on 8 devices, 5 hold padding only


def eight_devices():
    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    return jax.local_devices()[:8]


def bn_model(optimizer):
    """Dense -> BatchNormalization -> Dense, mse; the same weights at every call."""
    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(8, activation="relu", name="hidden")(x)
    h = tf.keras.layers.BatchNormalization(momentum=0.8, name="bn")(h)
    y = tf.keras.layers.Dense(1, name="y")(h)
    model = tf.keras.Model(x, y)
    model.compile(optimizer(), "mse")
    return model


def two_outputs_model(optimizer):
    """Inputs 'a' and 'b', outputs 'cls' (sparse categorical crossentropy) and 'reg' (mse, loss
    weight 0.5), a kernel regularizer: several mean losses and a weight regularizer."""
    tf.keras.utils.set_random_seed(0)
    a = tf.keras.Input((4,), name="a")
    b = tf.keras.Input((2,), name="b")
    h = tf.keras.layers.Concatenate()([a, b])
    h = tf.keras.layers.Dense(
        6, activation="tanh", name="h", kernel_regularizer=tf.keras.regularizers.L2(0.01)
    )(h)
    h = tf.keras.layers.BatchNormalization(name="bn")(h)
    cls = tf.keras.layers.Dense(3, activation="softmax", name="cls")(h)
    reg = tf.keras.layers.Dense(1, name="reg")(h)
    model = tf.keras.Model([a, b], [cls, reg])
    model.compile(
        optimizer(),
        loss=["sparse_categorical_crossentropy", "mse"],
        loss_weights=[1.0, 0.5],
    )
    return model


def bn_batches(weighted=True):
    rng = np.random.RandomState(1)
    x = rng.randn(ROWS, 4).astype("float32")
    y = (x @ rng.randn(4, 1) + 0.1 * rng.randn(ROWS, 1)).astype("float32")
    w = rng.uniform(0.2, 2.0, ROWS).astype("float32")
    return [
        (
            [x[i : i + GLOBAL_BATCH]],
            [y[i : i + GLOBAL_BATCH]],
            [w[i : i + GLOBAL_BATCH]] if weighted else None,
        )
        for i in range(0, ROWS, GLOBAL_BATCH)
    ]


def two_outputs_batches():
    rng = np.random.RandomState(2)
    a = rng.randn(ROWS, 4).astype("float32")
    b = rng.randn(ROWS, 2).astype("float32")
    cls = rng.randint(0, 3, (ROWS, 1)).astype("int64")
    reg = rng.randn(ROWS, 1).astype("float32")
    w = rng.uniform(0.2, 2.0, ROWS).astype("float32")
    s = lambda i: slice(i, i + GLOBAL_BATCH)
    return [
        ([a[s(i)], b[s(i)]], [cls[s(i)], reg[s(i)]], [w[s(i)], w[s(i)]])
        for i in range(0, ROWS, GLOBAL_BATCH)
    ]


def variants_model(optimizer):
    """tfcases' BatchNormalization of every kind (renorm, fused 4-D, channels first, frozen,
    TimeDistributed, inference-mode, in a nested model...), each on a branch of its own."""
    model = tfcases.batchnorm_variants()
    model.compile(optimizer(), "sparse_categorical_crossentropy")
    return model


def variants_batches():
    rng = np.random.RandomState(3)
    x = rng.randn(ROWS, *tfcases.BATCHNORM_VARIANTS_SHAPE).astype("float32")
    y = rng.randint(0, 3, (ROWS, 1)).astype("int64")
    return [
        ([x[i : i + GLOBAL_BATCH]], [y[i : i + GLOBAL_BATCH]], None)
        for i in range(0, ROWS, GLOBAL_BATCH)
    ]


def keras_reference(model, batches):
    """tf-keras's own training, one train_on_batch per batch (the short one as it is): each
    step's loss, and every weight by name."""
    losses = []
    for features, labels, weights in batches:
        result = model.train_on_batch(features, labels, sample_weight=weights)
        losses.append(result[0] if isinstance(result, list) else result)
    return np.array(losses), {v.name.split(":")[0]: v.numpy() for v in model.weights}


def jax_run(make_model, optimizer, batches, devices, control=None, steps_per_call=None):
    trainer = _step.Trainer(make_model(optimizer), GLOBAL_BATCH, devices=devices, control=control)
    k = steps_per_call or len(batches)
    losses = np.concatenate([trainer.train(batches[i : i + k]) for i in range(0, len(batches), k)])
    return losses, trainer.weights(), trainer


def max_diff(a, b):
    assert set(a) == set(b), (sorted(a), sorted(b))
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


OPTIMIZERS = {
    "sgd-momentum": lambda: tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9),
    "sgd-nesterov": lambda: tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9, nesterov=True),
    "sgd-v2-nesterov": lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: tf.keras.optimizers.legacy.Adam(0.01),
    "adam-v2": lambda: tf.keras.optimizers.Adam(0.01),
    # (legacy RMSprop with momentum and centered, and legacy Adagrad: through a conversion, in
    # test_jax_engine.py, beside the stock path)
    # epsilon 0.1: where each spelling adds it (inside the root or outside) shows in the weights
    "rmsprop": lambda: tf.keras.optimizers.legacy.RMSprop(0.01, epsilon=0.1),
    "rmsprop-momentum-centered": lambda: tf.keras.optimizers.legacy.RMSprop(
        0.01, momentum=0.5, centered=True, epsilon=0.1
    ),
    "rmsprop-v2-momentum": lambda: tf.keras.optimizers.RMSprop(0.01, momentum=0.5, epsilon=0.1),
    "adagrad": lambda: tf.keras.optimizers.legacy.Adagrad(0.1, epsilon=0.1),
    "adagrad-v2": lambda: tf.keras.optimizers.Adagrad(0.1, epsilon=0.1),
}


@pytest.mark.parametrize(
    "model, name",
    [
        ("bn", "sgd-momentum"),
        ("bn", "sgd-nesterov"),
        ("bn", "sgd-v2-nesterov"),
        ("bn", "adam"),
        ("bn", "rmsprop"),
        ("bn", "rmsprop-v2-momentum"),
        ("two_outputs", "adam-v2"),
        ("two_outputs", "sgd-momentum"),
        ("two_outputs", "adagrad-v2"),
        ("variants", "sgd-momentum"),
    ],
)
def test_eight_devices_equal_one_equal_keras(model, name):
    make, batches = {
        "bn": (bn_model, bn_batches()),
        "two_outputs": (two_outputs_model, two_outputs_batches()),
        "variants": (variants_model, variants_batches()),
    }[model]
    optimizer = OPTIMIZERS[name]
    devices = eight_devices()
    ref_losses, ref_weights = keras_reference(make(optimizer), batches)
    # two compiled calls of 2 steps each (iterations_per_loop 2): the second ends on the short batch
    losses8, weights8, trainer = jax_run(make, optimizer, batches, devices, steps_per_call=2)
    losses1, weights1, _ = jax_run(make, optimizer, batches, devices[:1])
    assert trainer.slots()["iterations"] == len(batches)
    assert all(len(v.sharding.device_set) == 8 for v in trainer.params.values())
    assert max_diff(weights8, ref_weights) < TOL
    assert max_diff(weights1, ref_weights) < TOL
    assert max_diff(weights8, weights1) < TOL
    assert np.max(np.abs(losses8 - ref_losses)) < TOL * max(1.0, np.max(np.abs(ref_losses)))
    assert np.max(np.abs(losses1 - ref_losses)) < TOL * max(1.0, np.max(np.abs(ref_losses)))
    moved = max(
        float(np.max(np.abs(ref_weights[k] - v))) for k, v in _start(make, optimizer).items()
    )
    assert moved > 1e-2  # the weights (and the moving statistics) did move


def _start(make, optimizer):
    return {v.name.split(":")[0]: v.numpy() for v in make(optimizer).weights}


@pytest.mark.parametrize("control", _step.CONTROLS)
def test_negative_controls_differ(control):
    """Each device's own mean with the gradients summed (or averaged: its own statistics, an
    uneven share of real rows) over the devices, or padding rows counted in the loss and
    BatchNormalization's statistics: not tf-keras's numbers."""
    batches, optimizer = bn_batches(), OPTIMIZERS["sgd-momentum"]
    _, ref_weights = keras_reference(bn_model(optimizer), batches)
    _, weights, _ = jax_run(bn_model, optimizer, batches, eight_devices(), control=control)
    assert max_diff(weights, ref_weights) > 1e-3


def test_compiled_once_per_shape():
    trainer = _step.Trainer(bn_model(OPTIMIZERS["adam"]), GLOBAL_BATCH, devices=eight_devices())
    batches = bn_batches()
    trainer.train(batches[:2])  # full batches: the step without padding rows
    trainer.train(batches[2:])  # the short batch padded: the same shapes, the padded step
    trainer.train(batches[:2])
    assert sorted(key[1] for key in trainer._traced) == [False, True]  # (weighted, full, ...)
    assert all(loop._cache_size() == 1 for _, loop in trainer._traced.values())


def test_full_batches_run_the_step_without_padding_with_the_padded_steps_numbers():
    """Every batch full: one step compiled, the variant without the padding weight (a plain
    mean, BatchNormalization's plain moments), whose numbers are the padded step's within 1e-6 and
    tf-keras's within 1e-5 (every BatchNormalization kind: the first call of
    test_eight_devices_equal_one_equal_keras[variants-...], two full batches)."""
    batches = bn_batches(weighted=False)[:3]  # 24 rows: three full batches
    optimizer = OPTIMIZERS["sgd-momentum"]
    ref_losses, ref_weights = keras_reference(bn_model(optimizer), batches)
    runs = {}
    for full in (True, False):
        trainer = _step.Trainer(bn_model(optimizer), GLOBAL_BATCH, devices=eight_devices())
        trainer.full_step = full
        runs[full] = trainer.train(batches), trainer.weights()
        assert [key[:2] for key in trainer._traced] == [(False, full)]
        (traced, loop), *_ = trainer._traced.values()
        assert loop._cache_size() == 1
        # the variant's step reads no padding weight: its jaxpr never multiplies by it
        pad = np.ones([GLOBAL_BATCH], np.float32)
        args = [{k: np.asarray(traced.params[k]) for k in (*traced.trainable, *traced.state)}]
        jaxpr = jax.make_jaxpr(traced.fn)(*args, [batches[0][0][0]], [batches[0][1][0]], [pad], pad)
        assert (jaxpr.jaxpr.invars[-1] in _read(jaxpr.jaxpr)) is not full
    assert np.max(np.abs(runs[True][0] - runs[False][0])) < 1e-6
    assert max_diff(runs[True][1], runs[False][1]) < 1e-6
    assert np.max(np.abs(runs[True][0] - ref_losses)) < TOL
    assert max_diff(runs[True][1], ref_weights) < TOL


def _read(jaxpr):
    """Every variable ``jaxpr``'s equations read (in nested jaxprs: by their outer operands)."""
    return {v for eqn in jaxpr.eqns for v in eqn.invars if not hasattr(v, "val")}


class _VariableRate(tf.keras.optimizers.schedules.LearningRateSchedule):
    """A schedule of a variable: the rate a converted step would hold fixed."""

    def __init__(self):
        self.rate = tf.Variable(0.1)

    def __call__(self, step):
        return self.rate * 0.9**step

    def get_config(self):
        return {}


@pytest.mark.parametrize(
    "optimizer, words",
    [
        (
            lambda: tf.compat.v1.train.AdagradDAOptimizer(0.01, tf.Variable(0, dtype=tf.int64)),
            "AdagradDAOptimizer's global_step",
        ),
        (lambda: tf.keras.optimizers.SGD(0.1, use_ema=True), "use_ema"),
        (lambda: tf.keras.optimizers.legacy.SGD(_VariableRate()), "_VariableRate: it reads"),
    ],
)
def test_refuses_other_optimizers_naming_the_fix(optimizer, words):
    with pytest.raises(ConversionError, match=words) as raised:
        _step.Trainer(bn_model(optimizer), GLOBAL_BATCH, devices=jax.local_devices()[:1])
    assert "engine=strategy" in str(raised.value)


def test_refuses_random_draws_naming_the_layer():
    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input((4,))
    shuffled = tf.keras.layers.Lambda(
        lambda t: t + tf.random.stateless_normal(tf.shape(t), seed=[1, 2]), name="drop"
    )(x)
    y = tf.keras.layers.Dense(1)(shuffled)
    model = tf.keras.Model(x, y)
    model.compile("sgd", "mse")
    trainer = _step.Trainer(model, GLOBAL_BATCH, devices=jax.local_devices()[:1])
    with pytest.raises(ConversionError, match=r"random draws.*drop/"):
        trainer.train(bn_batches(weighted=False)[:1])


def test_an_indivisible_global_batch_is_padded_and_trains_as_keras():
    # A global batch of 12 on 8 devices runs as 16 rows, 4 of them weighted 0: the losses,
    # the weights and BatchNormalization's moving statistics are tf-keras's on the 12 (and the
    # short last batch's 3) real rows.
    rng = np.random.RandomState(4)
    x = rng.randn(27, 4).astype("float32")
    y = (x @ rng.randn(4, 1)).astype("float32")
    batches = [([x[i : i + 12]], [y[i : i + 12]], None) for i in range(0, 27, 12)]
    want_losses, want = keras_reference(bn_model(OPTIMIZERS["adam"]), batches)
    trainer = _step.Trainer(bn_model(OPTIMIZERS["adam"]), 12, devices=eight_devices())
    losses = trainer.train(batches)
    assert trainer.global_batch == 16
    assert np.max(np.abs(losses - want_losses)) < TOL, (losses, want_losses)
    assert max_diff(trainer.weights(), {k: want[k] for k in trainer.weights()}) < TOL
    assert {"bn/moving_mean", "bn/moving_variance"} <= set(trainer.weights())


def test_a_padded_global_batch_is_logged_once_per_call_kind_as_one_boards_training(
    tmp_path, caplog
):
    """A global batch of 12 on 8 devices: training, evaluate() and predict() (twice)
    each log the padding once per conversion, in the words one board's training logs."""
    import logging

    import tpushim
    from tpushim import _batch_math

    eight_devices()
    rng = np.random.RandomState(0)
    x, y = rng.randn(20, 4).astype("float32"), rng.randn(20, 1).astype("float32")

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(12)

    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((4,), name="x")
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, name="y")(inputs))
    model.compile(tf.keras.optimizers.SGD(0.1), "mse")
    problem, fix = _batch_math.indivisible_batch(12, 8)
    with (
        caplog.at_level(logging.INFO, logger="tpushim"),
        tpushim.patched(quiet=True, mode="cpu", engine="jax"),
    ):
        est = tf.keras.estimator.model_to_estimator(model, model_dir=str(tmp_path / "m"))
        seen = set()
        for call in ("train", "evaluate", "predict", "predict"):
            caplog.clear()
            if call == "train":
                est.train(input_fn, steps=1)
            elif call == "evaluate":
                est.evaluate(input_fn)
            else:
                assert len(list(est.predict(input_fn))) == 20
            said = [r.getMessage() for r in caplog.records if "does not divide" in r.getMessage()]
            # the first call of each kind logs it, a second of that kind does not
            assert said == ([] if call in seen else [f"{problem}; {fix}."]), call
            seen.add(call)


def conv_model(optimizer):
    """Conv2D -> BatchNormalization -> Dense, sparse categorical crossentropy: a convolution's
    gradient, which XLA CPU runs many times slower inside a compiled loop."""
    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input((6, 6, 1), name="x")
    h = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(x)
    h = tf.keras.layers.BatchNormalization(momentum=0.8, name="bn")(h)
    y = tf.keras.layers.Dense(3, activation="softmax", name="y")(tf.keras.layers.Flatten()(h))
    model = tf.keras.Model(x, y)
    model.compile(optimizer(), "sparse_categorical_crossentropy")
    return model


def test_on_cpu_a_call_runs_one_compiled_step_per_batch_as_keras():
    # On XLA CPU devices a convolution model's steps run as one compiled step per batch (no
    # while loop), with tf-keras's numbers; the scan a TPU runs gives the same numbers.
    rng = np.random.RandomState(5)
    x = rng.randn(ROWS, 6, 6, 1).astype("float32")
    y = rng.randint(0, 3, (ROWS, 1)).astype("int64")
    batches = [
        ([x[i : i + GLOBAL_BATCH]], [y[i : i + GLOBAL_BATCH]], None)
        for i in range(0, ROWS, GLOBAL_BATCH)
    ]
    want_losses, want = keras_reference(conv_model(OPTIMIZERS["adam"]), batches)
    got = {}
    for loop in _step.LOOPS:
        trainer = _step.Trainer(conv_model(OPTIMIZERS["adam"]), GLOBAL_BATCH, eight_devices())
        if loop == "scan":
            trainer.loop = "scan"  # a TPU's
        first = trainer.train(batches[:2])
        ((_, compiled),) = trainer._traced.values()
        fed = []
        if loop == "per step":  # each batch fed as it came: no copy into one stacked array
            step = compiled.step
            compiled.step = lambda *args: fed.append(args[3][0][0]) or step(*args)
        # (batches[3], short, runs the padded step: another compiled step)
        losses = np.concatenate([first, trainer.train(batches[2:3]), trainer.train(batches[3:])])
        assert trainer.loop == loop  # "per step": the engine's choice on CPU devices
        if loop == "per step":  # batches[2], full, fed as its own array
            assert len(fed) == 1 and np.shares_memory(fed[0], batches[2][0][0])
            compiled.step = step
        assert np.max(np.abs(losses - want_losses)) < TOL, (loop, losses, want_losses)
        assert max_diff(trainer.weights(), {k: want[k] for k in trainer.weights()}) < TOL
        one = jax.tree_util.tree_map(
            lambda a: np.asarray(a)[None], _step.pad_batch(batches[0], GLOBAL_BATCH)
        )
        text = compiled.lower(trainer.params, trainer.stats, trainer.opt_state, one).as_text()
        got[loop] = ("stablehlo.while" in text, trainer.weights())
    assert not got["per step"][0] and got["scan"][0]
    assert max_diff(got["per step"][1], got["scan"][1]) < 1e-6
    # a step without convolutions keeps the scan on CPU (one dispatch a call)
    dense = _step.Trainer(bn_model(OPTIMIZERS["adam"]), GLOBAL_BATCH, eight_devices())
    dense.train(bn_batches()[:1])
    assert dense.loop == "scan"
    assert _step.loop_of([type("Tpu", (), {"platform": "tpu"})()]) == "scan"
    assert _step.loop_of(eight_devices(), pod=object()) == "scan"
