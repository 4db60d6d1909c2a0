"""The strategy engine's optimizers (tpushim/_strategy/step.py): every ``tf.compat.v1.train``
optimizer Keras wraps in a ``TFOptimizer``, a ``tf.compat.v1.train.exponential_decay`` rate on
the global step, optimizer strings and a Keras ``LearningRateSchedule`` train on 8 logical CPU
devices and on 1 as the stock estimator trains them: every weight, slot and non-slot variable
(stock's checkpoint names), metric and prediction within 1e-5; negative controls fail; one
replica's step with the optimizer's apply compiles with XLA. Run in one subprocess
(tests/strategy_optimizers_proof.py; on TensorFlow >= 2.16 against stock 2.15's numbers,
tests/reference/strategy_optimizers_tf215.json). What cannot train as stock's is refused before
anything is written."""

import json
import os

import procs
import pytest

import tpushim

TOLERANCE = 1e-5
KINDS = (
    "tf1_adam",
    "tf1_sgd",
    "tf1_momentum",
    "tf1_rmsprop",
    "tf1_adagrad",
    "tf1_ftrl",
    "tf1_decay",
    "adam_string",
    "sgd_string",
    "keras_schedule",
)
READ_BACK = ("tf1_adam", "tf1_decay")  # also evaluated on 1 replica, and read by stock


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    root = tmp_path_factory.mktemp("optimizers")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(here, "strategy_optimizers_proof.py")
    result = procs.python([script, root], timeout=1500, cwd=here)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, result.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.slow
def test_stock_is_stock_tensorflow_215(proof):
    if proof["stock_from"] == "live":
        assert proof["tensorflow"].split(".")[:2] <= ["2", "15"]
    else:
        with open(proof["stock_from"], encoding="utf-8") as f:
            assert json.load(f)["tensorflow"].startswith("2.15.")


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("replicas", ["eight", "one"])
def test_engine_trains_with_the_optimizer_as_stock(proof, kind, replicas):
    assert proof[kind]["replicas"] == 8
    got = proof[kind][replicas]
    assert got["names_equal"]  # stock's checkpoint names: slots, beta1_power, no optimizer/iter
    assert got["weights"] < TOLERANCE, got  # every weight, slot and non-slot variable
    if replicas == "eight" or kind in READ_BACK:  # also evaluated and predicted
        assert got["metric_keys_equal"] and got["rows"] == 45, got
        assert got["metrics"] < TOLERANCE, got
        assert got["predictions"] < TOLERANCE, got


@pytest.mark.slow
@pytest.mark.parametrize("kind", READ_BACK)
def test_stock_reads_the_engine_checkpoints(proof, kind):
    assert proof[kind]["stock_reads_engine"] < TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("kind", READ_BACK)
def test_a_second_train_call_resumes_the_optimizer(proof, kind):
    # 3 steps, then 2 in a second call: the restored slots, beta powers and global step (the
    # decaying rate's) continue as stock's 5 steps in one call.
    got = proof[kind]["resumed"]
    assert got["names_equal"] and got["weights"] < TOLERANCE, got


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_step_with_the_apply_compiles_with_xla(proof, kind):
    assert proof[kind]["xla"] is None, proof[kind]["xla"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tf1_decay", "keras_schedule"])
def test_negative_control_schedule_stepped_per_replica(proof, kind):
    # The rate read at 8 x the global step (each replica advancing it) trains to other weights.
    assert proof[kind]["per_replica"]["weights"] > 1e-3, proof[kind]["per_replica"]


@pytest.mark.slow
def test_negative_control_tf1_gradients_summed(proof):
    assert proof["tf1_sgd"]["summed"]["weights"] > 1e-3, proof["tf1_sgd"]["summed"]


def _refused_optimizers(tf):
    v1 = tf.compat.v1.train
    # Made eagerly before the conversion: stock's graph cannot evaluate them (stock fails in
    # train() with "Attempting to capture an EagerTensor"), and the engine's would be fixed.
    step = v1.get_or_create_global_step()
    return [
        (v1.GradientDescentOptimizer(tf.constant(0.1)), "learning_rate \\(EagerTensor\\)"),
        (
            v1.GradientDescentOptimizer(v1.exponential_decay(0.1, step, 2, 0.5)),
            "GradientDescentOptimizer: its learning_rate",
        ),
        (
            v1.MomentumOptimizer(0.1, tf.Variable(0.9)),
            "MomentumOptimizer: its momentum \\(ResourceVariable\\)",
        ),
        (  # it aggregates across workers itself, in its own apply_gradients
            v1.SyncReplicasOptimizer(v1.GradientDescentOptimizer(0.1), 1),
            "SyncReplicasOptimizer: it replaces apply_gradients",
        ),
        (
            v1.GradientDescentOptimizer(lambda: tf.compat.v1.get_variable("rate", initializer=0.1)),
            "makes variables \\(rate\\)",
        ),
    ]


def test_optimizers_it_cannot_train_as_stock_are_refused_before_anything_is_written(tmp_path):
    import tensorflow as tf

    for i, (optimizer, why) in enumerate(_refused_optimizers(tf)):
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
        model.compile(optimizer, loss="mse")
        model_dir = tmp_path / str(i)
        with (
            tpushim.patched(mode="cpu", engine="strategy", quiet=True),
            pytest.raises(tpushim.ConversionError, match=why) as raised,
        ):
            tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=str(model_dir))
        assert "tf.keras.optimizers.schedules.LearningRateSchedule" in str(raised.value)  # the fix
        assert "engine='tpuestimator'" in str(raised.value)
        assert not model_dir.exists()


def test_the_preflight_reports_only_the_optimizers_the_engine_refuses():
    import numpy as np
    import tensorflow as tf

    from tpushim import _versions

    x = np.random.RandomState(0).rand(64, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(64)

    v1 = tf.compat.v1.train
    for optimizer, refused in (
        (v1.AdamOptimizer(0.01), False),
        # (A rate tensor made eagerly fails the preflight's own graph as stock's: not this one.)
        (
            v1.GradientDescentOptimizer(lambda: tf.compat.v1.get_variable("rate", initializer=0.1)),
            True,
        ),
    ):
        tf.keras.backend.clear_session()
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
        model.compile(optimizer, loss="mse")
        # On TensorFlow >= 2.16 the strategy engine is the only TPU path (engine="auto" picks it).
        with tpushim.patched(engine=None if _versions.uses_own_estimator() else "strategy"):
            report = tpushim.check(model, input_fn)
        found = [f for f in report.findings if f.code == "strategy-engine-refuses"]
        assert "XLA compile of the training step" in report.checked, report
        if refused:
            assert len(found) == 1, report
            assert "GradientDescentOptimizer: its learning_rate makes" in found[0].message
        else:
            assert report.ok and not found, report


def test_private_names_for_tf1_optimizers(tmp_path):
    import tensorflow as tf

    from tpushim import _tfprivate

    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,), name="d")])
    user = tf.compat.v1.train.AdamOptimizer(0.01, beta1=0.8)
    _tfprivate.keras_compile.create_tf1_optimizer_slots(
        user, model.trainable_variables
    )  # the user's state
    fresh = _tfprivate.keras_compile.fresh_tf1_optimizer(user)
    assert (fresh._lr, fresh._beta1, fresh._slots, fresh._non_slot_dict) == (0.01, 0.8, {}, {})
    assert user._slots  # the user's optimizer is left as it was
    step = tf.Variable(3, dtype=tf.int64)
    model.optimizer = _tfprivate.keras_compile.keras_tf_optimizer(fresh, step)
    _tfprivate.keras_compile.create_tf1_optimizer_slots(fresh, model.trainable_variables)
    _tfprivate.estimator.track_estimator_step(model, step)
    keys = dict(tf.train.list_variables(tf.train.Checkpoint(model).write(str(tmp_path / "c"))))
    # Stock's names (tests/reference/strategy_optimizers_tf215.json): no second global step.
    assert "optimizer/optimizer/beta1_power/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert (
        "layer_with_weights-0/kernel/.OPTIMIZER_SLOT/optimizer/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE"
        in keys
    )
    assert not any("global_step" in k and not k.startswith("estimator_global_step") for k in keys)
    rate = tf.constant(0.1)
    assert [
        n
        for n, _ in _tfprivate.keras_compile.tf1_optimizer_hyperparameters(
            tf.compat.v1.train.MomentumOptimizer(rate, 0.9)
        )
    ] == ["learning_rate"]
