"""The preflight of the strategy engine (#33): where a conversion would run on it (TensorFlow >=
2.16, or ``engine='strategy'`` on 2.12-2.15), ``tpushim.check`` compiles that engine's training
step for 8 replicas with XLA on CPU and reports what the engine itself would refuse, saying
which engine the findings are for; ``python -m tpushim check script.py`` gives a script's model and
input the same findings. Runs on every TensorFlow (tiny models; the scripts' checks in a
subprocess, as a user runs them)."""

import json
import os

import numpy as np
import procs
import pytest
import tensorflow as tf

import tpushim
from tpushim import _versions

X = np.random.RandomState(0).rand(64, 4).astype("float32")
Y = (X.sum(axis=1, keepdims=True) > 2).astype("float32")
XLA = "XLA compile of the training step"
ENGINE_NOTE = "the XLA compile of the training step is the strategy engine's"


def model(layer=None, normalize=False, optimizer=None, **dense):
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
    m.compile(optimizer or tf.keras.optimizers.legacy.SGD(0.1), "mse")
    return m


def variable_rate():
    """A tf.compat.v1.train optimizer whose rate makes a variable each time it is evaluated:
    stock's graph (and TPUEstimator's) makes it once; the strategy engine refuses it."""
    return tf.compat.v1.train.GradientDescentOptimizer(
        lambda: tf.compat.v1.get_variable("rate", initializer=0.1)
    )


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
    # A tf.compat.v1.train optimizer whose rate makes variables: TPUEstimator's path takes it,
    # the strategy engine refuses it (tpushim/_strategy.make_plan) before anything is written:
    # the check says so. A loss a layer adds in its call, beside BatchNormalization or not, or
    # an activity regularizer, the engine takes: no finding.
    assert codes(check(model(activity_regularizer="l2", normalize=True))) == []
    assert codes(check(model(CallLoss(name="adds"), normalize=True))) == []
    report = check(model(optimizer=variable_rate()))
    assert not report.ok
    refused = [f for f in report.findings if f.code == "strategy-engine-refuses"]
    assert len(refused) == 1 and "GradientDescentOptimizer" in refused[0].message, report
    assert "learning_rate makes variables" in refused[0].message
    assert refused[0].where.startswith("model ")
    # The model's own step is still compiled (it compiles): the other findings as before.
    assert XLA in report.checked and codes(report) == ["strategy-engine-refuses"]
    assert not any(n.startswith(ENGINE_NOTE) for n in report.notes)


@pytest.mark.skipif(_versions.uses_own_estimator(), reason="TensorFlow >= 2.16 has no TPUEstimator")
@pytest.mark.tpuestimator
def test_negative_control_on_tpuestimator_nothing_of_the_strategy_engine():
    report = check(model(optimizer=variable_rate()), engine="tpuestimator")
    assert report.ok and codes(report) == [] and XLA in report.checked, report
    assert not any(n.startswith(ENGINE_NOTE) for n in report.notes)


@pytest.mark.skipif(
    _versions.uses_own_estimator(), reason="the script's check on 2.16+: test_tf216_tools"
)
@pytest.mark.tpuestimator
def test_a_scripts_conversion_to_the_strategy_engine_says_what_was_not_checked(tmp_path):
    # No train/evaluate/predict call: the model alone is checked; no TPUEstimator TPU graph is
    # claimed, a note says so.
    from tpushim import _preflight

    with tpushim.patched(mode="cpu", engine="strategy"), _preflight.recording() as recorder:
        tf.keras.estimator.model_to_estimator(keras_model=model(), model_dir=str(tmp_path / "m"))
    report = recorder.report()
    assert not [c for c in report.checked if c.startswith("TPU graphs")], report.checked
    assert "conversion" in report.checked and report.ok
    assert any("converted to the strategy engine" in n for n in report.notes), report.notes


# -- a script's check on the strategy engine ------------------------------------------------------
# A legacy script as found: a compiled functional model, model_to_estimator with a RunConfig, a
# train input_fn batched by 30 (indivisible by 8), train then evaluate. The check runs it as a
# user does (python -m tpushim check script.py), on the strategy engine: TPUSHIM_ENGINE=strategy
# on 2.15, the TPU path itself on 2.21. Its findings must be those tpushim.check(model, input_fn)
# gives for the same model and input under the same engine.
SCRIPT_MODEL = """
import sys
import json

import numpy as np
import tensorflow as tf

x = np.random.RandomState(0).rand(64, 4).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 2).astype("float32")
inputs = tf.keras.Input((4,), name="x")
hidden = tf.keras.layers.Dense(8, name="dense"{regularizer})(inputs)
hidden = tf.keras.layers.Lambda({layer}, name="odd")(hidden)
outputs = tf.keras.layers.Dense(1, activation="sigmoid", name="out")(hidden)
model = tf.keras.Model(inputs, outputs)
model.compile({optimizer}, "binary_crossentropy")


def train_input_fn():
    return tf.data.Dataset.from_tensor_slices(({{"x": x}}, y)).batch(30).repeat()
"""
SCRIPT_RUN = """
config = tf.estimator.RunConfig(model_dir=sys.argv[1]{seed})
est = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
est.train(train_input_fn, steps=20)
print("RESULT", est.evaluate(train_input_fn, steps=2)["loss"])
"""
AS_STRING = "lambda t: t + 0.0 * tf.strings.to_number(tf.strings.as_string(t))"


def _script(tmp_path, layer="lambda t: t * 2", seed="", refused=False):
    model_code = SCRIPT_MODEL.format(
        layer=layer,
        regularizer="",
        # A tf.compat.v1.train optimizer whose rate makes variables: what the engine refuses.
        optimizer=(
            "tf.compat.v1.train.GradientDescentOptimizer(\n"
            '    lambda: tf.compat.v1.get_variable("rate", initializer=0.1)\n'
            ")"
        )
        if refused
        else "tf.keras.optimizers.legacy.SGD(0.1)",
    )
    (tmp_path / "train.py").write_text(model_code + SCRIPT_RUN.format(seed=seed))
    return model_code


def _check_script(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {"PYTHONPATH": root, "TF_USE_LEGACY_KERAS": "", "TPUSHIM_ENGINE": "strategy"}
    proc = procs.python(
        ["-m", "tpushim", "check", "--json", "train.py", tmp_path / "model"],
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr[-4000:]
    return json.loads(proc.stdout), proc


def _api(model_code):
    """tpushim.check of the script's model and train input_fn, under the strategy engine."""
    namespace = {}
    tf.keras.backend.clear_session()
    exec(model_code, namespace)
    with tpushim.patched(engine="strategy"):
        report = tpushim.check(namespace["model"], namespace["train_input_fn"])
    return report


def _findings(found):
    return sorted((f["code"], f["where"]) for f in found)


@pytest.mark.slow
@pytest.mark.parametrize(
    "layer, seed", [(AS_STRING, ""), ("lambda t: t * 2", ", tf_random_seed=3")], ids=["xla", "ok"]
)
def test_a_scripts_check_on_the_strategy_engine_checks_its_input_and_step(tmp_path, layer, seed):
    # Unseeded, the engine reads the input_fn's Dataset as built eagerly; seeded, as built in a
    # graph of its own: either is checked.
    model_code = _script(tmp_path, layer, seed)
    report, proc = _check_script(tmp_path)
    for checked in ("input pipeline", "batch size for 8 cores", XLA):
        assert checked in report["checked"], report
    assert not [c for c in report["checked"] if c.startswith("TPU graphs")], report["checked"]
    notes = [n for n in report["notes"] if n.startswith(ENGINE_NOTE)]
    # 30 rows: padded to 32 for 8 replicas, 4 rows each.
    assert len(notes) == 1 and "one replica's step of 8, 4 rows each" in notes[0], report["notes"]
    api = json.loads(_api(model_code).to_json())
    assert _findings(report["findings"]) == _findings(api["findings"]), (report, api)
    codes = {f["code"] for f in report["findings"]}
    assert {"batch-indivisible", "batch-small", "no-prefetch"} <= codes
    if layer == AS_STRING:
        assert ("xla-unsupported-op", "layer 'odd' (op AsString)") in _findings(
            report["findings"]
        ), report
        assert report["exit_code"] == 1 and proc.returncode == 1
        # The engine's own compile does not end the script first: evaluate() ran and its input
        # was checked too.
        assert "RESULT" in proc.stderr + proc.stdout
    else:
        assert not any(c.startswith("xla-") for c in codes) and proc.returncode == 0, report


@pytest.mark.slow
def test_a_scripts_model_the_strategy_engine_refuses_is_the_apis_finding(tmp_path):
    model_code = _script(tmp_path, refused=True)
    report, proc = _check_script(tmp_path)
    assert proc.returncode == 1 and not report["ok"], report
    refused = [f for f in report["findings"] if f["code"] == "strategy-engine-refuses"]
    assert len(refused) == 1 and "learning_rate makes variables" in refused[0]["message"], report
    assert refused[0]["where"] == "model 'model'"
    assert not [f for f in report["findings"] if f["code"].startswith("conversion-")], report
    if _versions.uses_own_estimator():
        # No TPU path to stop at here: the script ran on the estimator API, which trains the
        # rate's variable (stock 2.15's warm start fails on it: the API's checkpoints hold it).
        assert "RESULT" in proc.stdout + proc.stderr, report
    api = [f for f in _api(model_code).findings if f.code == "strategy-engine-refuses"]
    assert [(f.where, f.message[:200]) for f in api] == [
        (refused[0]["where"], refused[0]["message"][:200])
    ]


class Subclassed(tf.keras.Model):
    """A subclassed model (no build of its own): the strategy engine takes it as stock does."""

    def __init__(self, odd=False, **kwargs):
        super().__init__(**kwargs)
        self.odd = odd
        self.hidden = tf.keras.layers.Dense(8)
        self.out = tf.keras.layers.Dense(1)

    def call(self, x):
        h = self.hidden(x)
        if self.odd:  # a host-only op XLA cannot compile
            h = h + 0.0 * tf.strings.to_number(tf.strings.as_string(h))
        return self.out(h)

    def get_config(self):
        return {"odd": self.odd}


def test_a_subclassed_model_compiles_as_the_strategy_engines_step():
    clean = Subclassed()
    clean.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    report = check(clean)
    assert report.ok and codes(report) == [], report  # no strategy-engine-refuses
    assert XLA in report.checked
    assert any(n.startswith(ENGINE_NOTE) for n in report.notes), report.notes
    odd = Subclassed(odd=True)
    odd.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    report = check(odd)
    found = [f.code for f in report.findings if f.code != "batch-indivisible"]
    assert found == ["xla-unsupported-op"], report


# -- a Lambda reading the script's globals ---------------------------------------------------------
# The checks run after the script has ended; a clone of its model rebuilds each Lambda from its
# config with the globals of the module its function came from (``__main__``): the script's, not
# the process's (python -m tpushim's), or a global the Lambda reads is not defined.
GLOBALS_SCRIPT = """
import sys
import numpy as np
import tensorflow as tf

SCALE = np.float32(2.0)


def scaled(t):
    return t * SCALE


x = tf.keras.Input((4,), name="x")
h = tf.keras.layers.Lambda(lambda t: t * SCALE + 1.0, name="lam")(x)
h = tf.keras.layers.Lambda(scaled, name="lam2")(h)
model = tf.keras.Model(x, tf.keras.layers.Dense(1, name="y")(h))
model.compile(tf.keras.optimizers.SGD(0.01), "mse")
rng = np.random.RandomState(0)
X, Y = rng.randn(64, 4).astype("float32"), rng.randn(64, 1).astype("float32")


def input_fn():
    return tf.data.Dataset.from_tensor_slices(({"x": X}, Y)).batch(64).prefetch(1)


est = tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=sys.argv[1])
est.train(input_fn, steps=2)
"""


@pytest.mark.parametrize("engine", [pytest.param(None, marks=pytest.mark.tpuestimator), "strategy"])
def test_a_lambda_reading_the_scripts_globals_is_checked(tmp_path, monkeypatch, capsys, engine):
    # The default check on TensorFlow <= 2.15 is the TPUEstimator path's (cpu mode).
    import sys

    from tpushim import _cli

    (tmp_path / "lg.py").write_text(GLOBALS_SCRIPT)
    monkeypatch.chdir(tmp_path)
    for name in ("argv", "path"):  # the runner sets them as python would for the script
        monkeypatch.setattr(sys, name, list(getattr(sys, name)))
    main = sys.modules["__main__"]
    engine_flag = ["--engine", engine] if engine else []
    code = _cli.main(["check", *engine_flag, "--json", "lg.py", str(tmp_path / "model")])
    report = json.loads(capsys.readouterr().out)
    assert sys.modules["__main__"] is main  # the script's __main__ kept for the report only
    assert [f for f in report["findings"] if f["severity"] == "error"] == [], report
    assert code == 0 and XLA in report["checked"], report
    assert not (tmp_path / "model").exists(), "the check wrote the user's model_dir"
