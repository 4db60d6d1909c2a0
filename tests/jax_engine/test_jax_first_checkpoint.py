"""The JAX engine's first checkpoint: ``train()`` writes ``model.ckpt-0`` as stock does, before
its first step, and as early as it is right to: once the step's refusals are known (its
conversion to JAX), before XLA compiles the step, before the input is read ahead, from the
starting weights read once. Order of events, not timing: each event notes whether
``model.ckpt-0`` existed when it happened; a checkpoint's values loaded in one session run. Its values, and the last checkpoint's, are stock's
(tpushim's estimator API's stock path on the same model, data and seed) within 1e-5."""

import numpy as np
import pytest
from jax_scripts import eight_devices, scripts_started  # noqa: F401 (the scripts' run, in the background)

pytestmark = pytest.mark.jax

jax = eight_devices()

import tensorflow as tf

import tpushim
from tpushim._jax import _checkpoint, _estimator, _step, _warm_start

STEPS = 3


def _train(model_dir, scope):
    tf.keras.utils.set_random_seed(1)
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(3, activation="tanh", name="h")(x)
    model = tf.keras.Model(x, tf.keras.layers.Dense(1, name="y")(h))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9), "mse")
    data = (
        np.arange(128, dtype=np.float32).reshape(32, 4) / 128,
        np.linspace(0, 1, 32, dtype=np.float32).reshape(32, 1),
    )
    config = tf.estimator.RunConfig(model_dir=str(model_dir), tf_random_seed=1)
    with tpushim.patched(**scope):
        estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
    estimator.train(lambda: tf.data.Dataset.from_tensor_slices(data).batch(8).repeat(), steps=STEPS)


def _values(path):
    reader = tf.train.load_checkpoint(path)
    return {
        name: reader.get_tensor(name)
        for name, dtype in reader.get_variable_to_dtype_map().items()
        if dtype.is_floating
    }


def test_ckpt_0_is_written_before_the_compile_and_the_read_ahead_with_stocks_values(
    tmp_path, monkeypatch
):
    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    tpushim.patch(quiet=True)  # stock's path (no TPU; tf.estimator on TF >= 2.16), undone after
    model_dir = tmp_path / "engine"
    written = (model_dir / "model.ckpt-0.index").exists
    events = []

    compile_step = _step.Trainer._compile

    class Watched:  # the step's jitted loop: XLA compiles it at its first call (or lower())
        def __init__(self, loop):
            self.loop = loop

        def __call__(self, *args):
            events.append(("step compiled", written()))
            return self.loop(*args)

        def lower(self, *args):
            events.append(("step compiled", written()))
            return self.loop.lower(*args)

    monkeypatch.setattr(
        _step.Trainer, "_compile", lambda self, *a, **k: Watched(compile_step(self, *a, **k))
    )
    read = _estimator.ReadAhead._read

    def reading(self):
        events.append(("read ahead", written()))
        return read(self)

    monkeypatch.setattr(_estimator.ReadAhead, "_read", reading)
    warm_started = _warm_start.warm_started

    def warm(*args, **kwargs):
        events.append(("warm start read", written()))
        return warm_started(*args, **kwargs)

    monkeypatch.setattr(_warm_start, "warm_started", warm)
    # Each checkpoint's values loaded in one run of its session, then stock's Saver's one: a
    # run per variable cost seconds before model.ckpt-0 on a large graph (MobileNetV2's 262).
    runs, writing, session_run = [], [], tf.compat.v1.Session.run
    write = _checkpoint.StockCheckpoints.write

    def counted(self, *args, **kwargs):
        if writing:
            runs[-1] += 1
        return session_run(self, *args, **kwargs)

    def written_once(self, *args, **kwargs):
        runs.append(0)
        writing.append(True)
        try:
            return write(self, *args, **kwargs)
        finally:
            writing.pop()

    monkeypatch.setattr(tf.compat.v1.Session, "run", counted)
    monkeypatch.setattr(_checkpoint.StockCheckpoints, "write", written_once)

    _train(model_dir, dict(mode="cpu", engine="jax"))
    # the starting weights read once (not again to write them), before anything is written
    assert [e for e in events if e[0] == "warm start read"] == [("warm start read", False)], events
    assert ("step compiled", True) in events and ("step compiled", False) not in events, events
    assert ("read ahead", True) in events and ("read ahead", False) not in events, events
    assert len(runs) == 2 and runs == [2, 2], runs  # model.ckpt-0 and model.ckpt-3

    _train(tmp_path / "stock", {})  # tpushim's estimator API, stock's path
    for step in (0, STEPS):
        got = _values(str(model_dir / f"model.ckpt-{step}"))
        want = _values(str(tmp_path / "stock" / f"model.ckpt-{step}"))
        assert set(got) == set(want) and len(want) >= 4
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, atol=1e-5, err_msg=f"{step} {name}")
    # Negative control: the comparison tells the first checkpoint from the last.
    first, last = _values(str(model_dir / "model.ckpt-0")), _values(str(model_dir / "model.ckpt-3"))
    assert any(not np.allclose(first[n], last[n], atol=1e-5) for n in first)


def test_a_later_train_call_reuses_the_compiled_step(tmp_path, monkeypatch):
    """A conversion's second ``train()`` call (a resumed run, a train/evaluate loop) runs the
    step its first call converted and compiled: XLA compiles it once per batch shape, not once
    per call. Its numbers are stock's (test_jax_optimizers' resumed run)."""
    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    tpushim.patch(quiet=True)  # tf.estimator on TF >= 2.16 (tpushim's estimator API), undone after
    compiled, compile_step = [], _step.Trainer._compile

    def counted(self, *args, **kwargs):
        compiled.append(self)
        return compile_step(self, *args, **kwargs)

    monkeypatch.setattr(_step.Trainer, "_compile", counted)
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(4,))])
    model.compile(tf.keras.optimizers.legacy.Adam(0.01), "mse")
    x = np.arange(64, dtype=np.float32).reshape(16, 4) / 64
    data = (x, x[:, :2])
    config = tf.estimator.RunConfig(model_dir=str(tmp_path / "engine"), tf_random_seed=1)
    with tpushim.patched(mode="cpu", engine="jax"):
        estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
    for _ in range(3):
        estimator.train(lambda: tf.data.Dataset.from_tensor_slices(data).batch(8).repeat(), steps=2)
    assert len(compiled) == 1, compiled
    assert tf.train.latest_checkpoint(str(tmp_path / "engine")).endswith("model.ckpt-6")
