"""Faults survived: a killed training resumes; nothing reaches the network unless a TPU was named."""

import math
import re
import signal
import subprocess
import sys
import textwrap
import time

import procs
import pytest

pytestmark = pytest.mark.slow  # trains estimators or runs scripts: outside the fast tier

TRAIN_SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np
    import tensorflow as tf
    import tpushim
    tf.get_logger().setLevel("INFO")
    tpushim.patch(mode="cpu")
    model_dir, max_steps = sys.argv[1], int(sys.argv[2])
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, input_shape=(4,), name="hidden"),
                                 tf.keras.layers.Dense(1, name="out")])
    model.compile(tf.keras.optimizers.legacy.SGD(0.01), "mse")
    x = np.random.RandomState(0).rand(64, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    est = tf.keras.estimator.model_to_estimator(
        keras_model=model, model_dir=model_dir,
        config=tf.estimator.RunConfig(save_checkpoints_steps=5, save_checkpoints_secs=None))

    class Slow(tf.estimator.SessionRunHook):
        def after_run(self, run_context, run_values):
            time.sleep(0.05)

    est.train(lambda: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8),
              max_steps=max_steps, hooks=[Slow()])
    metrics = est.evaluate(lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
    print("DONE", metrics["global_step"], metrics["loss"])
""")


def _checkpoint_step(model_dir):
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(model_dir)
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def test_sigkill_mid_training_resumes_from_last_checkpoint(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    model_dir = str(tmp_path / "model")
    # A file, not a pipe: a full pipe would stall the child. Closed once the child is killed.
    log = open(tmp_path / "first.log", "wb")  # noqa: SIM115
    # Popen, not procs.python: the test kills it mid-run. Its environment is procs' all the same.
    proc = subprocess.Popen(
        [sys.executable, str(script), model_dir, "100000"],
        env=procs.env_without_tpu(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 180
    try:
        while _checkpoint_step(model_dir) < 10:
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        log.close()
    assert proc.returncode == -signal.SIGKILL
    killed_at = _checkpoint_step(model_dir)
    rerun = procs.python([script, model_dir, killed_at + 10])
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    restored = re.findall(r"Restoring parameters from (\S+)", rerun.stderr)
    assert restored and restored[0].endswith(f"model.ckpt-{killed_at}")  # resumed, not restarted
    done = re.search(r"DONE (\d+) (\S+)", rerun.stdout)
    assert int(done.group(1)) == killed_at + 10  # the global step continued
    assert math.isfinite(float(done.group(2)))  # a finite loss: the checkpoint loads intact
    assert _checkpoint_step(model_dir) == killed_at + 10


NETWORK_PROBE = textwrap.dedent("""
    import sys
    events = []
    sys.addaudithook(lambda event, args: events.append((event, args))
                     if event in ("socket.connect", "socket.getaddrinfo") else None)
    import numpy as np
    import tensorflow as tf
    import tpushim
    x = np.random.rand(16, 4).astype("float32"); y = np.random.rand(16, 1).astype("float32")
    for mode in ("auto", "cpu"):
        tpushim.patch(mode=mode)
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
        model.compile("sgd", "mse")
        est = tf.keras.estimator.model_to_estimator(keras_model=model)
        est.train(lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(4), steps=2)
        tpushim.status()
    print("EVENTS", events)
""")


def test_nothing_reaches_the_network_unless_a_tpu_was_named(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(NETWORK_PROBE)
    proc = procs.python([script])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "EVENTS []" in proc.stdout
