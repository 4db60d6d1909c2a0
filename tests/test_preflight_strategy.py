"""The preflight of the strategy engine (#33): where a conversion would run on it (TensorFlow >=
2.16, or ``engine='strategy'`` on 2.12-2.15), ``tpushim.check`` compiles that engine's training
step for 8 replicas with XLA on CPU and reports what the engine itself would refuse, saying
which engine the findings are for. Runs in-process on every TensorFlow (tiny models)."""

import numpy as np
import pytest
import tensorflow as tf

import tpushim
from tpushim import _versions

X = np.random.RandomState(0).rand(64, 4).astype("float32")
Y = (X.sum(axis=1, keepdims=True) > 2).astype("float32")
XLA = "XLA compile of the training step"
ENGINE_NOTE = "the XLA compile of the training step is the strategy engine's"


def model(layer=None, normalize=False, **dense):
    tf.keras.backend.clear_session()
    inputs = tf.keras.Input((4,), name="x")
    hidden = tf.keras.layers.Dense(8, name="dense", **dense)(inputs)
    if normalize:
        hidden = tf.keras.layers.BatchNormalization(name="bn")(hidden)
    if isinstance(layer, tf.keras.layers.Layer):
        hidden = layer(hidden)
    elif layer is not None:
        hidden = tf.keras.layers.Lambda(layer, name="odd")(hidden)
    m = tf.keras.Model(inputs, tf.keras.layers.Dense(1, name="out")(hidden))
    m.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    return m


def input_fn():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(60).prefetch(1)


def codes(report):
    """The findings' codes but the batch's (60 rows on 8 cores: batch-indivisible, a warning)."""
    return [c for c in report.codes() if c != "batch-indivisible"]


def check(keras_model, engine="strategy"):
    # On TensorFlow >= 2.16 the strategy engine is the only TPU path (engine="auto" picks it).
    with tpushim.patched(engine=None if _versions.uses_own_estimator() else engine):
        return tpushim.check(keras_model, input_fn)


def test_a_clean_model_compiles_as_the_strategy_engines_step():
    report = check(model())
    assert report.ok and codes(report) == [], report
    assert XLA in report.checked and "batch-indivisible" in report.codes()
    notes = [n for n in report.notes if n.startswith(ENGINE_NOTE)]
    # 60 rows: padded to 64 for 8 replicas, 8 rows each.
    assert len(notes) == 1 and "one replica's step of 8, 8 rows each" in notes[0], report.notes


def test_an_op_xla_cannot_compile_in_the_strategy_step_names_the_layer():
    report = check(model(lambda t: t + 0.0 * tf.strings.to_number(tf.strings.as_string(t))))
    assert not report.ok and report.exit_code == 1
    found = [(f.code, f.where) for f in report.findings if f.code != "batch-indivisible"]
    assert found == [("xla-unsupported-op", "layer 'odd' (op AsString)")], report
    assert any(n.startswith(ENGINE_NOTE) for n in report.notes)


@tf.keras.utils.register_keras_serializable(package="tpushim_test_preflight_strategy")
class CallLoss(tf.keras.layers.Layer):
    """Adds a loss from its inputs in its call (``self.add_loss``)."""

    def call(self, x):
        self.add_loss(tf.reduce_mean(tf.abs(x)))
        return x + 0.0


def test_what_only_the_strategy_engine_refuses_is_an_error():
    # A loss a layer adds in its call in a model with BatchNormalization: TPUEstimator's path
    # takes it, the strategy engine refuses it (tpushim/_strategy.make_plan) before anything is
    # written: the check says so. An activity regularizer beside BatchNormalization, or the
    # call's loss without it, the engine takes: no finding.
    assert codes(check(model(activity_regularizer="l2", normalize=True))) == []
    assert codes(check(model(CallLoss(name="adds")))) == []
    report = check(model(CallLoss(name="adds"), normalize=True))
    assert not report.ok
    refused = [f for f in report.findings if f.code == "strategy-engine-refuses"]
    assert len(refused) == 1 and "add_loss" in refused[0].message, report
    assert "adds" in refused[0].message and "BatchNormalization" in refused[0].message
    assert refused[0].where.startswith("model ")
    # The model's own step is still compiled (it compiles): the other findings as before.
    assert XLA in report.checked and codes(report) == ["strategy-engine-refuses"]
    assert not any(n.startswith(ENGINE_NOTE) for n in report.notes)


@pytest.mark.skipif(_versions.uses_own_estimator(), reason="TensorFlow >= 2.16 has no TPUEstimator")
@pytest.mark.tpuestimator
def test_negative_control_on_tpuestimator_nothing_of_the_strategy_engine():
    report = check(model(CallLoss(name="adds"), normalize=True), engine="tpuestimator")
    assert report.ok and codes(report) == [] and XLA in report.checked, report
    assert not any(n.startswith(ENGINE_NOTE) for n in report.notes)


@pytest.mark.skipif(
    _versions.uses_own_estimator(), reason="the script's check on 2.16+: test_tf216_tools"
)
@pytest.mark.tpuestimator
def test_a_scripts_conversion_to_the_strategy_engine_says_what_was_not_checked(tmp_path):
    # Its calls are not recorded: no TPUEstimator TPU graph is claimed, a note says so.
    from tpushim import _preflight

    with tpushim.patched(mode="cpu", engine="strategy"), _preflight.recording() as recorder:
        tf.keras.estimator.model_to_estimator(keras_model=model(), model_dir=str(tmp_path / "m"))
    report = recorder.report()
    assert not [c for c in report.checked if c.startswith("TPU graphs")], report.checked
    assert "conversion" in report.checked and report.ok
    assert any("converted to the strategy engine" in n for n in report.notes), report.notes
