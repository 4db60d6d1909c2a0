"""The JAX engine's preflight: ``python -m tpushim check --engine jax script.py`` runs the script
on tpushim's estimator API (steps capped, nothing of the user's written), converts the model's
training step with tf2jax and compiles it with XLA for 8 CPU devices (the TPU's cores) as the
engine splits the batch, and reports what the engine refuses, naming the op and the layer: a
script the engine trains (with a Dropout layer, and Lambdas reading the script's globals, which the
check's clones of the model must find after the script ended) passes; the same script adding a
stateless draw in a ``Lambda`` (not one of stock's stateful draws) is refused (exit 1).
Each check is a subprocess (the 8 devices are decided when jax starts).
"""

import importlib.util
import json
import os

import procs
import pytest
from jax_scripts import scripts_started  # noqa: F401 (the scripts' run, in the background)

pytestmark = [
    pytest.mark.jax,
    pytest.mark.skipif(
        not all(importlib.util.find_spec(m) for m in ("jax", "tf2jax")),
        reason="jax and tf2jax not installed (the jax extra)",
    ),
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = """
import sys
import numpy as np
import tensorflow as tf

SCALE = np.float32(0.5)


def scaled(t):
    return t * SCALE


rng = np.random.RandomState(0)
features = rng.randn(512, 20).astype(np.float32)
labels = np.eye(3, dtype=np.float32)[rng.randint(0, 3, 512)]
x = tf.keras.Input((20,), name="x")
h = tf.keras.layers.Lambda(lambda t: t * SCALE + 1.0, name="lam")(x)
h = tf.keras.layers.Lambda(scaled, name="lam2")(h)
h = tf.keras.layers.Dense(32, activation="relu", name="hidden")(h)
DROPOUT
m = tf.keras.Model(x, tf.keras.layers.Dense(3, activation="softmax", name="probs")(h))
m.compile(tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9), "categorical_crossentropy")
est = tf.keras.estimator.model_to_estimator(m, model_dir=sys.argv[1])
est.train(
    lambda: tf.data.Dataset.from_tensor_slices((features, labels)).batch(64).repeat(), steps=100
)
"""
DROPOUT = 'h = tf.keras.layers.Dropout(0.5, name="drop")(h)'
STATELESS = (
    "h = tf.keras.layers.Lambda(lambda t: t + tf.random.stateless_normal(tf.shape(t), "
    'seed=[1, 2]), name="drop")(h)'
)


def _check(tmp_path, name, stateless):
    script = tmp_path / f"{name}.py"
    script.write_text(SCRIPT.replace("DROPOUT", STATELESS if stateless else DROPOUT))
    model_dir = tmp_path / f"{name}_model"
    proc = procs.python(
        ["-m", "tpushim", "check", "--engine", "jax", "--json", str(script), str(model_dir)],
        env={"PYTHONPATH": ROOT},
        cwd=str(tmp_path),
        timeout=600,
    )
    assert not model_dir.exists(), "the check wrote the user's model_dir"
    return proc, json.loads(proc.stdout)


def test_check_engine_jax_compiles_the_step_and_names_what_it_refuses(tmp_path):
    proc, report = _check(tmp_path, "runs", stateless=False)
    assert proc.returncode == 0 and report["exit_code"] == 0, proc.stderr[-3000:]
    assert "XLA compile of the training step" in report["checked"]
    note = [n for n in report["notes"] if n.startswith("the XLA compile of the training step")]
    assert note == [
        "the XLA compile of the training step is the JAX engine's: converted with tf2jax and "
        "compiled for 8 CPU device(s) of JAX's here, the global batch of 64 rows split over them"
    ]
    assert [f for f in report["findings"] if f["severity"] == "error"] == []
    # what was not run is said of the engine asked for, not of the strategy engine
    assert not any("strategy engine" in n for n in report["notes"]), report["notes"]
    assert any("the JAX engine was asked for" in n for n in report["notes"]), report["notes"]

    proc, report = _check(tmp_path, "refused", stateless=True)
    assert proc.returncode == 1 and report["exit_code"] == 1, proc.stderr[-3000:]
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert [f["code"] for f in errors] == ["jax-engine-refuses"], errors
    assert errors[0]["where"] == "model 'model', layer 'drop'"
    message = errors[0]["message"]
    assert message.startswith("the JAX engine would refuse this model: ")
    assert (
        "random draws in training" in message
        and "StatelessRandomNormalV2 in model/drop/" in message
    )
    assert "engine=strategy" in errors[0]["fix"]


def test_check_engine_jax_compiles_the_step_of_a_program_that_disabled_v2_behaviour(tmp_path):
    # census_numpy_tf1.py: disable_v2_behavior(), a graph-mode model; its eager copy's step is
    # converted and compiled (the engine trains it: the check passes, as stock's numbers say).
    model_dir = tmp_path / "model"
    proc = procs.python(
        [
            *("-m", "tpushim", "check", "--engine", "jax", "--json"),
            os.path.join(ROOT, "tests", "scripts", "census_numpy_tf1.py"),
            str(model_dir),
        ],
        env={"PYTHONPATH": ROOT},
        cwd=str(tmp_path),
        timeout=600,
    )
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["exit_code"] == 0, proc.stderr[-3000:]
    assert [f for f in report["findings"] if f["severity"] == "error"] == []
    assert (
        "the XLA compile of the training step is the JAX engine's: converted with tf2jax and "
        "compiled for 8 CPU device(s) of JAX's here, the global batch of 32 rows split over them"
    ) in report["notes"]
    assert not model_dir.exists(), "the check wrote the user's model_dir"
