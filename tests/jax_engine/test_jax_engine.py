"""The JAX engine (engine=jax) as a legacy script meets it: the demo script (a Keras model
compiled with legacy SGD + momentum, ``tf.keras.estimator.model_to_estimator``, a shuffled
Dataset input_fn, train / evaluate / predict) under ``TPUSHIM_MODE=cpu TPUSHIM_ENGINE=jax`` on 8
XLA CPU devices gives stock TensorFlow 2.15's recorded numbers (tests/reference/tf215.json); a
model_dir stock 2.15 wrote resumes on the engine with stock's numbers, and one the engine wrote
resumes on tpushim's estimator API's stock path with them too (checkpoints in stock's format,
names and global step); what the engine does not run yet is refused in words before anything
is written.

Each run is a subprocess (``TF_USE_LEGACY_KERAS`` and the 8 devices are decided once per
process). Needs jax and tf2jax (the ``jax`` extra), as tests/jax_engine does.
"""

import json
import math
import os
import re
import runpy
import shutil

import numpy as np
import procs
from jax_scripts import JAX_TESTS, REFERENCE, ROOT, answers, differences, scripts_started  # noqa: F401

# Not imported here (each run is a subprocess): the step's tests ask for 8 devices before jax's
# first import in this process.
pytestmark = JAX_TESTS

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
TOL = 1e-5
EIGHT = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
JAX = {**EIGHT, "TPUSHIM_MODE": "cpu", "TPUSHIM_ENGINE": "jax", "PYTHONPATH": ROOT}
RESUME = runpy.run_path(os.path.join(SCRIPTS, "record_reference.py"))["RESUME"]


def _result(proc):
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _checkpoint_names(path):
    import tensorflow as tf

    return {name for name, _ in tf.train.list_variables(path)}


def _resume(model_dir, env):
    return _result(
        procs.python(
            ["2", model_dir],
            code="import tpushim; tpushim.patch()\n" + RESUME,
            env=env,
            cwd=model_dir,
            timeout=600,
        )
    )


def test_demo_on_eight_devices_equals_stock_2_15(answers):  # noqa: F811
    # (run with the scripts, in tests/jax_engine/jax_scripts.py's process: mode cpu, engine jax)
    got = answers["demo.py"]
    assert "result" in got, got
    assert differences(got["result"], REFERENCE["demo"]) == {}
    # Negative control: the comparison tells another run apart (stock's 200-step resume).
    assert {"loss", "global_step"} <= set(differences(got["result"], REFERENCE["demo resumed"]))
    # Stock's checkpoint: the same keys as stock 2.15's own model.ckpt-100 (object-based,
    # tf.keras.estimator's default), the global step among them.
    stock = os.path.join(ROOT, "tests", "reference", "tf215_demo_model", "model.ckpt-100")
    ours = os.path.join(got["workdir"], "model.ckpt-300")
    assert _checkpoint_names(ours) == _checkpoint_names(stock)
    assert got["written"] == sorted(
        f"model.ckpt-{n}.{ext}"
        for n in (0, 300)
        for ext in ("index", "meta", "data-00000-of-00002", "data-00001-of-00002")
    )


def test_a_model_dir_stock_2_15_wrote_resumes_on_the_engine_with_stocks_numbers(tmp_path):
    # Stock 2.15 trained the demo 100 steps (tests/reference/tf215_demo_model); the engine
    # restores its weights, momentum slots and global step, trains 100 more, ends where stock did.
    model_dir = tmp_path / "model"
    shutil.copytree(os.path.join(ROOT, "tests", "reference", "tf215_demo_model"), model_dir)
    got = _resume(model_dir, JAX)
    assert got["global_step"] == 200
    assert differences(got, REFERENCE["demo resumed"]) == {}


def test_a_model_dir_the_engine_wrote_resumes_on_the_stock_path_with_stocks_numbers(tmp_path):
    # Phase 1 (100 steps) on the engine; phase 2 on tpushim's estimator API's stock path (no TPU,
    # mode auto): it restores the engine's checkpoint and ends where stock 2.15 ended.
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    procs.python(
        ["1", model_dir],
        code="import tpushim; tpushim.patch()\n" + RESUME,
        env=JAX,
        cwd=model_dir,
        timeout=600,
    ).check_returncode()
    assert os.path.exists(model_dir / "model.ckpt-100.index")
    got = _resume(model_dir, {"PYTHONPATH": ROOT})
    assert got["global_step"] == 200
    assert differences(got, REFERENCE["demo resumed"]) == {}


def test_stateless_draw_is_refused_before_anything_is_written(answers):  # noqa: F811
    # (run with the scripts: a Lambda adding a stateless draw, train() on the engine)
    got = answers["stateless_draw.py"]
    assert got.get("refused", "").startswith(
        "tpushim's JAX engine does not train these random draws in training"
    ), got
    assert "StatelessRandomNormalV2 in model/stateless/" in got["refused"]
    assert "engine=strategy" in got["refused"]
    assert got["written"] == []


KEEP = """
import json, os, sys
import logging
import tpushim; tpushim.patch()  # stock's path (no TPU), the engine's in its scope
import numpy as np, tensorflow as tf
data = (np.arange(128, dtype=np.float32).reshape(32, 4) / 128, np.ones([32, 1], np.float32))
out, said = {}, []
handler = logging.Handler()
handler.emit = lambda record: said.append(record.getMessage())
logging.getLogger("tensorflow").addHandler(handler)
logging.getLogger("tensorflow").setLevel(logging.INFO)
for run, scope in (("engine", dict(mode="cpu", engine="jax")), ("stock", {})):
    for case, v1, keep, hours, optimizer in (
        ("v1 keep 2", True, 2, 10000, lambda: tf.keras.optimizers.legacy.SGD(0.1)),
        ("v1 keep 2, one every 1e-7 hours", True, 2, 1e-7, lambda: tf.keras.optimizers.RMSprop(
            0.01, momentum=0.5, centered=True, epsilon=0.1)),
        ("v2 keep 2", False, 2, 10000, lambda: tf.keras.optimizers.legacy.Adagrad(
            0.1, epsilon=0.1)),
        ("v1 keep 2, tf.compat.v1 Adam", True, 2, 10000, lambda:
            tf.compat.v1.train.AdamOptimizer(0.05)),
    ):
        tf.keras.utils.set_random_seed(1)
        x = tf.keras.Input((4,), name="x")
        m = tf.keras.Model(x, tf.keras.layers.Dense(1, name="y")(x))
        m.compile(optimizer(), "mse")
        model_dir = os.path.join(sys.argv[1], run, case)
        config = tf.estimator.RunConfig(
            model_dir=model_dir, save_checkpoints_steps=1, keep_checkpoint_max=keep,
            keep_checkpoint_every_n_hours=hours, tf_random_seed=1, log_step_count_steps=3,
        )
        with tpushim.patched(**scope):
            convert = (tf.compat.v1 if v1 else tf).keras.estimator.model_to_estimator
            est = convert(keras_model=m, config=config)
        print("MADE", run, type(est).__name__)
        said.clear()
        for _ in range(2):  # a second call continues the first's rotation
            est.train(lambda: tf.data.Dataset.from_tensor_slices(data).batch(8).repeat(), steps=4)
        lines = [m for m in said if m.startswith(("loss = ", "Loss for final step"))]
        state = tf.train.get_checkpoint_state(model_dir)
        out.setdefault(run, {})[case] = dict(
            files=sorted(p[:-6] for p in os.listdir(model_dir) if p.endswith(".index")),
            listed=[os.path.basename(p) for p in state.all_model_checkpoint_paths],
            lines=lines,
            # the second call restored the first's weights and slots: every value at its end
            values={
                name: float(np.sum(reader.get_tensor(name)))
                for reader in [tf.train.load_checkpoint(model_dir)]
                for name, dtype in reader.get_variable_to_dtype_map().items()
                if dtype.is_floating
            },
        )
# A TPU this TensorFlow cannot drive ('local': no TPU kernels here): the JAX engine asks neither
# TensorFlow's resolver nor its TPU check; the strategy engine's check refuses it.
tpu_dir = os.path.join(sys.argv[1], "tpu")
x = tf.keras.Input((4,), name="x")
m = tf.keras.Model(x, tf.keras.layers.Dense(1, name="y")(x))
m.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
with tpushim.patched(tpu="local", engine="jax"):
    est = tf.keras.estimator.model_to_estimator(m, model_dir=tpu_dir)
est.train(lambda: tf.data.Dataset.from_tensor_slices(data).batch(8), steps=2)
out["tpu local"] = {"jax": os.path.basename(tf.train.latest_checkpoint(tpu_dir))}
try:
    with tpushim.patched(tpu="local", engine="strategy"):
        tf.keras.estimator.model_to_estimator(m, model_dir=os.path.join(sys.argv[1], "tpu2"))
except tpushim.NoTPUError as e:
    out["tpu local"]["strategy"] = str(e)
# A model another estimator converted and trained first (Keras's cloning leaves that graph's
# labels pinned on it), converted again on the engine: it trains as stock's path does.
tf.keras.utils.set_random_seed(2)
x = tf.keras.Input((4,), name="x")
m = tf.keras.Model(x, tf.keras.layers.Dense(1, name="y")(x))
m.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse", metrics=["mae"])
out["again"] = {}
for run, scope in (("stock", {}), ("engine", dict(mode="cpu", engine="jax"))):
    again_dir = os.path.join(sys.argv[1], "again", run)
    with tpushim.patched(**scope):
        est = tf.keras.estimator.model_to_estimator(m, model_dir=again_dir)
    est.train(lambda: tf.data.Dataset.from_tensor_slices(data).batch(8), steps=4)
    reader = tf.train.load_checkpoint(again_dir)
    out["again"][run] = {
        name: reader.get_tensor(name).tolist()
        for name, dtype in reader.get_variable_to_dtype_map().items()
        if dtype.is_floating and "/m/" not in name
    }
print("RESULT " + json.dumps(out))
"""


def _loss_line(line):
    """(loss text, step) of ``loss = L, step = S (T sec)``; step "final" of the last line."""
    if line.startswith("Loss for final step: "):
        return line[len("Loss for final step: ") : -1], "final"
    match = re.match(r"^loss = (\S+), step = (\d+)(?: \(\d+\.\d{3} sec\))?$", line)
    assert match, line
    return match.group(1), int(match.group(2))


def test_checkpoints_loss_lines_and_optimizers_as_stocks_and_a_tpu_left_to_jax(tmp_path):
    # keep_checkpoint_max and keep_checkpoint_every_n_hours as stock's Saver honours them: the
    # name-based one (the v1 spelling) takes both from the RunConfig; keras_lib's object-based
    # one keeps 5 whatever it says. Stock here: tpushim's estimator API's stock path (no TPU),
    # in the same process, the engine's runs in tpushim.patched(engine="jax") scopes.
    proc = procs.python([tmp_path], code=KEEP, env=EIGHT, cwd=tmp_path, timeout=600)
    got = _result(proc)
    made = [x for x in proc.stdout.splitlines() if x.startswith("MADE ")]
    assert made == ["MADE engine JaxEstimator"] * 4 + ["MADE stock Estimator"] * 4, made
    tpu = got.pop("tpu local")
    # A model the stock path converted and trained first converts and trains on the engine
    # (it failed in Keras's clone: the earlier graph's labels pinned on the model), as stock.
    again = got.pop("again")
    assert "layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE" in again["engine"]
    assert again["engine"].keys() == again["stock"].keys()
    for name, value in again["stock"].items():
        assert np.allclose(again["engine"][name], value, rtol=TOL, atol=1e-6), name
    lines = {run: {c: got[run][c].pop("lines") for c in got[run]} for run in got}
    # Trained as stock, the slots too, through the first call's checkpoint: SGD; RMSprop (its v2
    # spelling, trained as its legacy twin) with momentum, centered; Adagrad.
    slots = {}
    for case, stock in got["stock"].items():
        values = got["engine"][case].pop("values")
        assert differences(values, stock.pop("values")) == {}, case
        names = {k.split("/.ATTRIBUTES")[0].rsplit("/", 1)[-1] for k in values}
        slots[case] = sorted(
            names & {"momentum", "rms", "mg", "accumulator", "Adam", "Adam_1", "beta1_power"}
        )
    assert slots == {
        "v1 keep 2": ["momentum"],  # (the SGD's hyperparameter, not a slot)
        "v1 keep 2, one every 1e-7 hours": ["mg", "momentum", "rms"],
        "v2 keep 2": ["accumulator"],
        # tf.compat.v1.train's Adam (Keras's TFOptimizer): its slots and beta powers as stock's
        "v1 keep 2, tf.compat.v1 Adam": ["Adam", "Adam_1", "beta1_power"],
    }
    assert got["engine"] == got["stock"]
    ckpt = [f"model.ckpt-{i}" for i in range(9)]
    assert got["engine"]["v1 keep 2"] == dict(files=ckpt[7:], listed=ckpt[7:])
    assert got["engine"]["v1 keep 2, tf.compat.v1 Adam"] == dict(files=ckpt[7:], listed=ckpt[7:])
    # Each one past the hours kept, but the first call's last listed one (its time recovered
    # from its file, in whole seconds, is before the second call's Saver began).
    hourly = [c for c in ckpt if c != "model.ckpt-3"]
    assert got["engine"]["v1 keep 2, one every 1e-7 hours"] == dict(files=hourly, listed=ckpt[7:])
    assert got["engine"]["v2 keep 2"] == dict(files=ckpt[4:], listed=ckpt[4:])
    # LoggingTensorHook's lines at stock's steps (each call's first, then every 3rd), the loss
    # printed as stock prints a float32 (its shortest digits), within 1e-5 of stock's.
    for case, stock in lines["stock"].items():
        engine = [_loss_line(x) for x in lines["engine"][case]]
        stock = [_loss_line(x) for x in stock]
        assert [s for _, s in engine] == [0, 3, "final", 4, 7, "final"]
        # (stock reads the global step in the step's own session.run, beside its increment, with
        # no order between them: it prints the step before or, at times, after it)
        assert all(s == e or s == e + 1 for (_, e), (_, s) in zip(engine, stock)), stock
        for (text, _), (stock_text, _) in zip(engine, stock):
            assert text == str(np.float32(text)), engine
            assert math.isclose(float(text), float(stock_text), rel_tol=TOL, abs_tol=1e-6)
    assert "(" in lines["engine"]["v2 keep 2"][1]  # the seconds since the last line
    # A TPU TensorFlow cannot drive is left to JAX, which finds its devices (8 CPU ones here).
    assert (
        "-> the JAX engine" in proc.stderr
        and "on TPU local [TPU from tpu= argument]" in proc.stderr
    )
    assert tpu["jax"] == "model.ckpt-2"
    assert "tensorflow-tpu" in tpu["strategy"], tpu  # the control: TensorFlow's check refuses it
