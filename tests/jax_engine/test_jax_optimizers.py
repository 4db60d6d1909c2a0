"""The JAX engine's optimizer updates (tpushim/_jax/_optimizers.py) against TensorFlow's own: the
same starting weights and five steps of the same gradients through tf-keras's
``apply_gradients`` (the legacy optimizers' kernels, the v2 optimizers' ``update_step``, the
``tf.compat.v1.train`` optimizer a ``compile`` wraps in Keras's ``TFOptimizer``) and through the
engine's jitted update: weights and slots within 1e-6. Hyperparameters away from their defaults
where the arithmetic's placement of them shows (epsilon, l1/l2, a learning-rate power). And the
optimizers this round added, through the estimator: two ``train()`` calls on the engine (the
second resuming from the first's checkpoint) leave a checkpoint of stock's names and values.
"""

import jax_scripts
import numpy as np
import pytest
from jax_scripts import ROOT, eight_devices, scripts_started  # noqa: F401 (scripts_started: the scripts' run, in the background)

pytestmark = pytest.mark.jax

jax = eight_devices()

import tensorflow as tf

from tpushim import ConversionError
from tpushim._jax import _optimizers

TOL = 1e-6
k = tf.keras.optimizers
v1 = tf.compat.v1.train
#: name -> (the optimizer as a script compiles with it, its slots as the engine names them)
OPTIMIZERS = {
    "adamax": (lambda: k.legacy.Adamax(0.01, epsilon=1e-3), ("m", "v")),
    "adamax-v2": (lambda: k.Adamax(0.01, epsilon=1e-3), ("m", "u")),
    "adadelta": (lambda: k.legacy.Adadelta(1.0, epsilon=1e-3), ("accum_grad", "accum_var")),
    "adadelta-v2": (
        lambda: k.Adadelta(1.0, epsilon=1e-3),
        ("accumulated_grad", "accumulated_delta_var"),
    ),
    "ftrl": (
        lambda: k.legacy.Ftrl(
            0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.01, beta=0.1
        ),
        ("accumulator", "linear"),
    ),
    "ftrl-power-shrinkage": (
        lambda: k.legacy.Ftrl(
            0.1, learning_rate_power=-0.7, l2_shrinkage_regularization_strength=0.05
        ),
        ("accumulator", "linear"),
    ),
    "ftrl-v2": (
        lambda: k.Ftrl(
            0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.01, beta=0.1
        ),
        ("accumulator", "linear"),
    ),
    "adam-amsgrad": (lambda: k.legacy.Adam(0.01, amsgrad=True), ("m", "v", "vhat")),
    "adam-v2-amsgrad": (lambda: k.Adam(0.01, amsgrad=True), ("m", "v", "vhat")),
    "adamw": (lambda: k.AdamW(0.01, weight_decay=0.1), ("m", "v")),
    "adamw-amsgrad": (lambda: k.AdamW(0.01, weight_decay=0.1, amsgrad=True), ("m", "v", "vhat")),
    "v1-gradient-descent": (lambda: v1.GradientDescentOptimizer(0.1), ()),
    "v1-momentum": (lambda: v1.MomentumOptimizer(0.1, 0.9), ("momentum",)),
    "v1-momentum-nesterov": (
        lambda: v1.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
        ("momentum",),
    ),
    "v1-adam": (lambda: v1.AdamOptimizer(0.01, epsilon=1e-3), ("m", "v")),
    "nadam": (lambda: k.legacy.Nadam(0.01, epsilon=1e-3), ("m", "v")),
    "nadam-v2": (lambda: k.Nadam(0.01, epsilon=1e-3), ("m", "v")),
    "v1-rmsprop": (lambda: v1.RMSPropOptimizer(0.01, epsilon=1e-3), ("rms", "momentum")),
    "v1-rmsprop-momentum-centered": (
        lambda: v1.RMSPropOptimizer(0.01, momentum=0.5, epsilon=1e-3, centered=True),
        ("rms", "momentum", "mg"),
    ),
    "v1-adagrad": (
        lambda: v1.AdagradOptimizer(0.1, initial_accumulator_value=0.2),
        ("accumulator",),
    ),
    "v1-ftrl": (
        lambda: v1.FtrlOptimizer(
            0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.01, beta=0.1
        ),
        ("accum", "linear"),
    ),
    "v1-ftrl-power-shrinkage": (
        lambda: v1.FtrlOptimizer(
            0.1, learning_rate_power=-0.7, l2_shrinkage_regularization_strength=0.05
        ),
        ("accum", "linear"),
    ),
    "v1-proximal-adagrad": (
        lambda: v1.ProximalAdagradOptimizer(
            0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.02
        ),
        ("accumulator",),
    ),
    "v1-proximal-gradient-descent": (
        lambda: v1.ProximalGradientDescentOptimizer(
            0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.02
        ),
        (),
    ),
    "v1-proximal-gradient-descent-l2": (
        lambda: v1.ProximalGradientDescentOptimizer(0.1, l2_regularization_strength=0.05),
        (),
    ),
    "v1-adadelta": (
        lambda: v1.AdadeltaOptimizer(1.0, rho=0.9, epsilon=1e-3),
        ("accum", "accum_update"),
    ),
    "v1-adagrad-da": (
        lambda: v1.AdagradDAOptimizer(
            0.1,
            np.int64(2),
            initial_gradient_squared_accumulator_value=0.2,
            l1_regularization_strength=0.01,
            l2_regularization_strength=0.02,
        ),
        ("gradient_accumulator", "gradient_squared_accumulator"),
    ),
    "v1-adagrad-da-l2": (
        lambda: v1.AdagradDAOptimizer(0.1, np.int64(0), l2_regularization_strength=0.05),
        ("gradient_accumulator", "gradient_squared_accumulator"),
    ),
}
S = k.schedules
#: A decaying learning rate and clipped gradients (name -> as OPTIMIZERS): each schedule Keras
#: offers (its own __call__ converted to JAX), each legacy optimizer's ``decay`` (with a schedule
#: too: _decayed_lr applies both), each clipping, and the three clippings' order.
DECAYS = {
    "sgd-momentum-exponential": (
        lambda: k.legacy.SGD(S.ExponentialDecay(0.1, 2, 0.5), momentum=0.9),
        ("momentum",),
    ),
    "adam-exponential-staircase-decay-clipvalue": (
        lambda: k.legacy.Adam(
            S.ExponentialDecay(0.01, 2, 0.5, staircase=True), decay=0.5, clipvalue=0.1
        ),
        ("m", "v"),
    ),
    "rmsprop-piecewise-global-clipnorm": (
        lambda: k.legacy.RMSprop(
            S.PiecewiseConstantDecay([1, 3], [0.01, 0.005, 0.001]), global_clipnorm=0.5
        ),
        ("rms",),
    ),
    "adagrad-inverse-time-decay": (
        lambda: k.legacy.Adagrad(S.InverseTimeDecay(0.1, 1, 0.5), decay=0.5),
        ("accumulator",),
    ),
    "adamax-polynomial-decay": (
        lambda: k.legacy.Adamax(S.PolynomialDecay(0.01, 4, 0.001, power=2.0), decay=0.5),
        ("m", "v"),
    ),
    "adadelta-cosine-decay": (
        lambda: k.legacy.Adadelta(S.CosineDecay(1.0, 4, alpha=0.1), epsilon=1e-3, decay=0.5),
        ("accum_grad", "accum_var"),
    ),
    "ftrl-cosine-restarts-decay": (
        lambda: k.legacy.Ftrl(
            S.CosineDecayRestarts(0.1, 2, m_mul=0.5), l2_regularization_strength=0.01, decay=0.5
        ),
        ("accumulator", "linear"),
    ),
    "adamw-exponential-global-clipnorm": (
        lambda: k.AdamW(S.ExponentialDecay(0.01, 2, 0.5), weight_decay=0.1, global_clipnorm=0.5),
        ("m", "v"),
    ),
    "nadam-v2-exponential": (lambda: k.Nadam(S.ExponentialDecay(0.01, 2, 0.5)), ("m", "v")),
    "sgd-decay-clipnorm": (lambda: k.legacy.SGD(0.1, decay=0.5, clipnorm=0.5), ()),
    "sgd-momentum-decay-clipvalue-clipnorm": (
        lambda: k.legacy.SGD(0.1, momentum=0.9, decay=0.5, clipvalue=0.5, clipnorm=0.8),
        ("momentum",),
    ),
    "rmsprop-momentum-decay-clipnorm": (
        lambda: k.legacy.RMSprop(0.01, momentum=0.5, decay=0.5, clipnorm=0.5),
        ("rms", "momentum"),
    ),
}
OPTIMIZERS.update(DECAYS)


def _compiled_optimizer(make):
    """The model's optimizer after ``compile``, as the engine reads it."""
    x = tf.keras.Input((3,))
    model = tf.keras.Model(x, tf.keras.layers.Dense(4)(x))
    model.compile(make(), "mse")
    return model.optimizer


def _keras_slots(optimizer, variables, names):
    if type(optimizer).__name__ == "TFOptimizer":
        return {
            s: {n: optimizer.optimizer.get_slot(v, s).numpy() for n, v in variables.items()}
            for s in names
        }
    if hasattr(optimizer, "get_slot"):  # legacy
        return {
            s: {n: optimizer.get_slot(v, s).numpy() for n, v in variables.items()} for s in names
        }
    return None  # v2: its variables are not slots by name; the weights say it


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_update_equals_tensorflows_own(name):
    make, slot_names = OPTIMIZERS[name]
    rng = np.random.RandomState(0)
    start = {"kernel": rng.randn(3, 4).astype(np.float32), "bias": rng.randn(4).astype(np.float32)}
    grads = [
        {n: rng.randn(*v.shape).astype(np.float32) for n, v in start.items()} for _ in range(5)
    ]
    optimizer = _compiled_optimizer(make)
    variables = {n: tf.Variable(v) for n, v in start.items()}
    apply = getattr(optimizer, "optimizer", optimizer).apply_gradients  # TFOptimizer's own
    for g in grads:
        apply([(tf.constant(g[n]), variables[n]) for n in variables])

    update = _optimizers.of(optimizer)
    assert update.slots == slot_names
    params = {n: jax.numpy.asarray(v) for n, v in start.items()}
    state = update.init(params)
    step = jax.jit(lambda p, g, s: _optimizers.update(update, p, g, s))  # clipped there
    for g in grads:
        params, state = step(params, g, state)
    assert int(state["iterations"]) == len(grads)
    assert step._cache_size() == 1  # one compile: the step (a schedule's too) a traced input
    for n, v in variables.items():
        assert np.max(np.abs(np.asarray(params[n]) - v.numpy())) < TOL, n
        assert np.max(np.abs(start[n] - v.numpy())) > 1e-2  # it did move
    want = _keras_slots(optimizer, variables, slot_names)
    for slot, values in (want or {}).items():
        for n, v in values.items():
            # (relative beyond 1: Ftrl's linear slot grows to ~50, where float32 steps 4e-6)
            err = np.abs(np.asarray(state[slot][n]) - v) / np.maximum(1.0, np.abs(v))
            assert np.max(err) < TOL, (slot, n)
    if name == "nadam":  # its momentum schedule's product, a variable of its own
        assert abs(float(state["momentum_cache"]) - optimizer._m_cache.numpy()) < TOL


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: v1.AdagradDAOptimizer(0.01, tf.Variable(0, dtype=tf.int64)), "a tensor"),
        (lambda: k.AdamW(0.01, weight_decay=0.1, use_ema=True), "use_ema"),
        (lambda: v1.AdamOptimizer(tf.Variable(0.01)), "a tensor"),
    ],
)
def test_refuses_what_it_does_not_compute_by_name(make, words):
    with pytest.raises(ConversionError, match=words):
        _optimizers.of(_compiled_optimizer(make))


#: Stock's path and the engine's on one model per optimizer, two train() calls each: every
#: floating value of the last checkpoint (weights, slots, Nadam's momentum_cache) by name.
CHECKPOINTS = """
import json, os, sys
import tpushim; tpushim.patch()
import numpy as np, tensorflow as tf
data = (np.arange(128, dtype=np.float32).reshape(32, 4) / 128, np.linspace(0, 1, 32, dtype=np.float32).reshape(32, 1))
v1 = tf.compat.v1.train
out = {}
for run, scope in (("engine", dict(mode="cpu", engine="jax")), ("stock", {})):
    for case, v1ckpt, optimizer in (
        ("nadam", True, lambda: tf.keras.optimizers.legacy.Nadam(0.05)),
        ("nadam-v2", False, lambda: tf.keras.optimizers.Nadam(0.05)),
        ("v1-rmsprop-centered", True, lambda: v1.RMSPropOptimizer(0.05, momentum=0.5, centered=True)),
        ("v1-adagrad", False, lambda: v1.AdagradOptimizer(0.1)),
        ("v1-ftrl", True, lambda: v1.FtrlOptimizer(0.1, l1_regularization_strength=0.01)),
        ("v1-proximal-adagrad", True, lambda: v1.ProximalAdagradOptimizer(0.1, l2_regularization_strength=0.01)),
        ("v1-proximal-gradient-descent", True, lambda: v1.ProximalGradientDescentOptimizer(0.1, l1_regularization_strength=0.01)),
        ("v1-adadelta", False, lambda: v1.AdadeltaOptimizer(1.0, epsilon=1e-3)),
        ("v1-adagrad-da", True, lambda: v1.AdagradDAOptimizer(0.1, np.int64(1), l1_regularization_strength=0.01)),
    ):
        tf.keras.utils.set_random_seed(1)
        x = tf.keras.Input((4,), name="x")
        h = tf.keras.layers.Dense(3, activation="tanh", name="h")(x)
        m = tf.keras.Model(x, tf.keras.layers.Dense(1, name="y")(h))
        m.compile(optimizer(), "mse")
        model_dir = os.path.join(sys.argv[1], run, case)
        config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=1)
        with tpushim.patched(**scope):
            convert = (tf.compat.v1 if v1ckpt else tf).keras.estimator.model_to_estimator
            est = convert(keras_model=m, config=config)
        for _ in range(2):  # the second call resumes from the first's checkpoint (slots)
            est.train(lambda: tf.data.Dataset.from_tensor_slices(data).batch(8).repeat(), steps=3)
        reader = tf.train.load_checkpoint(model_dir)
        out.setdefault(run, {})[case] = {
            name: reader.get_tensor(name).ravel().tolist()
            for name, dtype in reader.get_variable_to_dtype_map().items() if dtype.is_floating}
print("RESULT " + json.dumps(out))
"""


def test_checkpoints_hold_stocks_names_and_values_after_a_resumed_run(tmp_path):
    got = jax_scripts.checkpoints_as_stocks(CHECKPOINTS, tmp_path, 9)
    assert any("momentum_cache" in n for n in got["stock"]["nadam"])
    # 4 weights, each with rms, momentum and mg (v1's names: h/kernel/RMSProp, ..._1, ..._2)
    assert len(got["stock"]["v1-rmsprop-centered"]) == 16
    # (AdagradDA's two slots under v1's names: y/kernel/AdagradDA, ..._1; Adadelta's object ones)
    assert len(got["stock"]["v1-adagrad-da"]) == 12
    assert sum("OPTIMIZER_SLOT" in n for n in got["stock"]["v1-adadelta"]) == 8


#: Every optimizer the engine computes, as a script compiles with it -> whether TensorFlow's
#: sparse update of a gathered weight (an Embedding's: ``IndexedSlices``) leaves the rows a
#: batch does not look up, and their slots, as they were where its dense update with zero rows
#: moves them: the legacy optimizers' sparse kernels do, the v2 ``update_step`` does not.
SPARSE_DIFFERS = {
    "sgd": (lambda: k.legacy.SGD(0.1), False),
    "sgd-v2": (lambda: k.SGD(0.1), False),
    "sgd-momentum": (lambda: k.legacy.SGD(0.1, momentum=0.9), True),
    "sgd-nesterov": (lambda: k.legacy.SGD(0.1, momentum=0.9, nesterov=True), True),
    "sgd-momentum-v2": (lambda: k.SGD(0.1, momentum=0.9), False),
    "adam": (lambda: k.legacy.Adam(0.01, epsilon=1e-3), False),
    "adam-amsgrad": (lambda: k.legacy.Adam(0.01, amsgrad=True), False),
    "adam-v2": (lambda: k.Adam(0.01, amsgrad=True), False),
    "adamw": (lambda: k.AdamW(0.01, weight_decay=0.1), False),
    "adamax": (lambda: k.legacy.Adamax(0.01, epsilon=1e-3), True),
    "adamax-v2": (lambda: k.Adamax(0.01), False),
    "adadelta": (lambda: k.legacy.Adadelta(1.0, epsilon=1e-3), True),
    "adadelta-v2": (lambda: k.Adadelta(1.0), False),
    "ftrl": (lambda: k.legacy.Ftrl(0.1, l1_regularization_strength=0.01, beta=0.1), True),
    "ftrl-shrinkage": (lambda: k.legacy.Ftrl(0.1, l2_shrinkage_regularization_strength=0.05), True),
    "ftrl-v2": (lambda: k.Ftrl(0.1), False),
    "rmsprop": (lambda: k.legacy.RMSprop(0.01, centered=True), False),
    "rmsprop-momentum": (lambda: k.legacy.RMSprop(0.01, momentum=0.5), True),
    "rmsprop-momentum-centered": (lambda: k.legacy.RMSprop(0.01, 0.9, 0.5, centered=True), True),
    "rmsprop-v2": (lambda: k.RMSprop(0.01, momentum=0.5, centered=True), False),
    "adagrad": (lambda: k.legacy.Adagrad(0.1), False),
    "adagrad-v2": (lambda: k.Adagrad(0.1), False),
    "v1-gradient-descent": (lambda: v1.GradientDescentOptimizer(0.1), False),
    "v1-momentum": (lambda: v1.MomentumOptimizer(0.1, 0.9), True),
    "v1-adam": (lambda: v1.AdamOptimizer(0.01), False),
    "nadam": (lambda: k.legacy.Nadam(0.01), True),  # its weights' rows given only
    "nadam-v2": (lambda: k.Nadam(0.01), False),
    "v1-rmsprop": (lambda: v1.RMSPropOptimizer(0.01), True),
    "v1-rmsprop-momentum-centered": (
        lambda: v1.RMSPropOptimizer(0.01, momentum=0.5, centered=True),
        True,
    ),
    "v1-adagrad": (lambda: v1.AdagradOptimizer(0.1), False),
    "v1-ftrl": (lambda: v1.FtrlOptimizer(0.1, l1_regularization_strength=0.01), True),
    "v1-proximal-adagrad": (lambda: v1.ProximalAdagradOptimizer(0.1), False),
    "v1-proximal-gradient-descent": (lambda: v1.ProximalGradientDescentOptimizer(0.1), False),
    "v1-proximal-gradient-descent-l1": (
        lambda: v1.ProximalGradientDescentOptimizer(0.1, l1_regularization_strength=0.05),
        True,
    ),
    "v1-adadelta": (lambda: v1.AdadeltaOptimizer(1.0, epsilon=1e-3), True),
    "v1-adagrad-da": (lambda: v1.AdagradDAOptimizer(0.1, np.int64(0)), True),
    "v1-proximal-adagrad-l2": (
        lambda: v1.ProximalAdagradOptimizer(0.1, l2_regularization_strength=0.05),
        True,
    ),
}
#: Three steps' looked-up rows of a 6-row table: duplicates; row 2 never; row 0 once, last.
LOOKED_UP = [[1, 3, 1], [3, 4, 4], [0, 1, 5]]


def _tensorflows(make, start, values, sparse):
    """The table and every optimizer variable after three ``apply_gradients`` of the rows'
    gradients: as ``IndexedSlices`` (stock's gather) or dense (the same, zero rows elsewhere)."""
    optimizer = _compiled_optimizer(make)
    apply = getattr(optimizer, "optimizer", optimizer)
    table = tf.Variable(start)
    for rows, g in zip(LOOKED_UP, values):
        grad = tf.IndexedSlices(tf.constant(g), tf.constant(rows), tf.constant(start.shape))
        apply.apply_gradients([(grad if sparse else tf.convert_to_tensor(grad), table)])
    own = apply.variables() if callable(apply.variables) else apply.variables
    return optimizer, table.numpy(), [v.numpy() for v in own]


@pytest.mark.parametrize("name", sorted(SPARSE_DIFFERS))
def test_sparse_update_of_a_gathered_weight_as_tensorflows(name):
    make, differs = SPARSE_DIFFERS[name]
    rng = np.random.RandomState(0)
    start = rng.randn(6, 3).astype(np.float32)
    values = [rng.randn(3, 3).astype(np.float32) for _ in LOOKED_UP]
    optimizer, sparse, sparse_slots = _tensorflows(make, start, values, True)
    _, dense, dense_slots = _tensorflows(make, start, values, False)
    found = max(
        float(np.max(np.abs(a - b))) for a, b in zip([sparse, *sparse_slots], [dense, *dense_slots])
    )
    update = _optimizers.of(optimizer)
    # the table the engine keeps: a TensorFlow change or a new optimizer cannot go unnoticed
    assert (found > 1e-5) == differs == update.sparse_differs, found

    params = {"table": jax.numpy.asarray(start)}
    state = update.init(params)
    step = jax.jit(lambda p, g, s, rows: _optimizers.update(update, p, g, s, {"table": rows}))
    for rows, g in zip(LOOKED_UP, values):
        dense_g = np.zeros_like(start)
        np.add.at(dense_g, rows, g)  # duplicates summed, as TensorFlow sums them
        looked_up = np.zeros(len(start), bool)
        looked_up[rows] = True
        params, state = step(params, {"table": dense_g}, state, looked_up)
    assert np.max(np.abs(np.asarray(params["table"]) - sparse)) < TOL
    if differs:  # a dense update would not do
        assert np.max(np.abs(np.asarray(params["table"]) - dense)) > 1e-5 or any(
            np.max(np.abs(a - b)) > 1e-5 for a, b in zip(sparse_slots, dense_slots)
        )
