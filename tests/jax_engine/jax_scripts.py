"""The run of every tests/scripts script on the JAX engine that tests/jax_engine/test_jax_scripts.py
reads: one subprocess for all of them (TensorFlow and JAX start once), started in the background
by the first test of tests/jax_engine a pytest session runs (:func:`scripts_started`, imported by
each module there), so that it overlaps the other tests; :func:`answers` waits for it. Under
xdist the first worker to start it does (a lock in the session's shared temp folder); the others
read its answers.
"""

import fcntl
import importlib.util
import json
import math
import os
import subprocess
import sys
import time

import procs
import pytest


def differences(got, want, tol=1e-5):
    """Keys whose values differ beyond ``tol`` (relative, or 1e-6 absolute near 0), or are
    missing on either side: ``{key: (got, want)}``."""
    out = {k: (got.get(k), want.get(k)) for k in set(got) ^ set(want)}
    for key, value in want.items():
        if key in got and not math.isclose(got[key], value, rel_tol=tol, abs_tol=1e-6):
            out[key] = (got[key], value)
    return out


def program_result(program, work, *args):
    """``program`` (Python source printing ``RESULT <json>``) run in a process of its own on 8
    XLA CPU devices, in ``work`` (its first argument, then ``args``): the JSON it printed last."""
    proc = procs.python(
        ["-c", program, str(work), *args],
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PYTHONPATH": ROOT},
        cwd=str(work),
        timeout=600,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


#: The end of a program's loop over ``(run, scope)`` (``"engine"`` in tpushim's scope, ``"stock"``
#: outside it) that built ``model``, ``config`` and ``input_fn``: trained 4 steps, evaluated,
#: predicted from ``FEATURES`` (replace it), its RESULT what :func:`trained_as_stock` reads.
TRAINED_AS_STOCKS = """
    with tpushim.patched(**scope) if scope else contextlib.nullcontext():
        est = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
    est.train(input_fn, steps=4)
    metrics = est.evaluate(input_fn)
    preds = est.predict(lambda: tf.data.Dataset.from_tensor_slices(FEATURES).batch(8))
    reader = tf.train.load_checkpoint(config.model_dir)
    out[run] = {"metrics": {k: float(v) for k, v in metrics.items()},
                "predictions": [float(p["y"][0]) for p in preds],
                "weights": {n: reader.get_tensor(n).ravel().tolist()
                            for n, d in reader.get_variable_to_dtype_map().items()
                            if d.is_floating and "layer_with_weights" in n}}
print("RESULT " + json.dumps(out))
"""


def trained_as_stock(got, weights, rows, stock_2_15, stock_2_15_predictions):
    """A program's ``got`` (``{"engine"|"stock": {"weights", "predictions", "metrics"}}``): its
    ``weights`` weights, its ``rows`` predictions and its metrics on the engine equal stock's
    estimator's in the same process, and the metrics and first predictions stock 2.15's
    (recorded), within 1e-5."""
    import numpy as np

    engine, stock = got["engine"], got["stock"]
    assert set(engine["weights"]) == set(stock["weights"]) and len(stock["weights"]) == weights
    for name, values in stock["weights"].items():
        np.testing.assert_allclose(engine["weights"][name], values, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(engine["predictions"], stock["predictions"], atol=1e-5)
    assert len(stock["predictions"]) == rows
    for key, value in stock["metrics"].items():
        assert abs(engine["metrics"][key] - value) < 1e-5, key
    for key, value in stock_2_15.items():
        assert abs(engine["metrics"][key] - value) < 1e-5, key
    np.testing.assert_allclose(
        engine["predictions"][: len(stock_2_15_predictions)], stock_2_15_predictions, atol=1e-5
    )


def checkpoints_as_stocks(program, tmp_path, cases):
    """``program`` (Python source training each case on the engine and on stock's path on 8
    devices, printing ``RESULT {"engine"|"stock": {case: {variable: values}}}``) run in a
    process of its own: its ``cases`` cases, each checkpoint's every floating variable equal to
    stock's within 1e-5. The results."""
    import numpy as np

    got = program_result(program, tmp_path)
    assert set(got["engine"]) == set(got["stock"]) and len(got["stock"]) == cases
    for case, stock in got["stock"].items():
        engine = got["engine"][case]
        assert set(engine) == set(stock), (case, sorted(set(engine) ^ set(stock)))
        for name, values in stock.items():
            np.testing.assert_allclose(engine[name], values, atol=1e-5, err_msg=f"{case} {name}")
    return got


def eight_devices(tf2jax=True):
    """jax, with 8 XLA CPU devices (as 8 TPU cores) asked for where it is not imported yet (jax
    may come in with TensorFlow); the calling test module skipped without jax (or tf2jax)."""
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
        ).strip()
    jax = pytest.importorskip("jax")
    if tf2jax:
        pytest.importorskip("tf2jax")
    return jax


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
with open(os.path.join(ROOT, "tests", "reference", "tf215.json"), encoding="utf-8") as _f:
    REFERENCE = json.load(_f)["results"]  # stock 2.15's recorded numbers of every script
#: Every JAX engine test module's marks: the jax marker, skipped without the jax extra.
JAX_TESTS = [
    pytest.mark.jax,
    pytest.mark.skipif(
        not all(importlib.util.find_spec(m) for m in ("jax", "tf2jax")),
        reason="jax and tf2jax not installed (the jax extra)",
    ),
]
with open(os.path.join(ROOT, "tests", "reference", "tf215.json"), encoding="utf-8") as _f:
    NAMES = sorted(name for name in json.load(_f)["results"] if name.endswith(".py"))
#: The scripts without recorded numbers (the test expects the engine to refuse them), and the
#: argument each takes instead of a work folder.
UNRECORDED = {"legacy_text_classifier.py": "5", "text_rebuilt_estimator.py": None}
#: Programs of test_jax_engine.py's run here too (one process less), by name: the demo, and a
#: model the engine refuses (a stateless draw in a Lambda: not one of stock's stateful draws).
INLINE = {
    "demo.py": "\n".join(
        [
            "import json, sys",
            "import tpushim; tpushim.patch()",
            "from tpushim.demo import legacy_mlp",
            "results, predictions = legacy_mlp.train_and_evaluate(sys.argv[1])",
            "out = {k: float(v) for k, v in results.items()}",
            "out.update(predictions=len(predictions), first=float(predictions[0][0]),"
            " last=float(predictions[-1][0]))",
            "print('RESULT ' + json.dumps(out))",
        ]
    ),
    "stateless_draw.py": """
import sys
import tpushim; tpushim.patch()
import numpy as np, tensorflow as tf
x = tf.keras.Input((4,), name="x")
h = tf.keras.layers.Dense(8, name="h")(x)
h = tf.keras.layers.Lambda(
    lambda t: t + tf.random.stateless_normal(tf.shape(t), seed=[1, 2]), name="stateless")(h)
m = tf.keras.Model(x, tf.keras.layers.Dense(1, name="y")(h))
m.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
est = tf.keras.estimator.model_to_estimator(m, model_dir=sys.argv[1])
data = (np.ones([16, 4], np.float32), np.ones([16, 1], np.float32))
est.train(lambda: tf.data.Dataset.from_tensor_slices(data).batch(8), steps=2)
""",
}
#: Graph programs of tests/jax_engine's own, run last (they disable TensorFlow 2 behaviour for the
#: rest of the process), by name: tests/jax_engine/test_jax_v1.py reads jax_v1.py's answer.
GRAPH_HELPERS = {"jax_v1.py": os.path.join(ROOT, "tests", "jax_engine", "jax_v1.py")}
ENV = {
    "PYTHONPATH": ROOT,
    "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
    "TPUSHIM_MODE": "cpu",
    "TPUSHIM_ENGINE": "jax",
}
#: Seconds on a quiet machine the run may take (stretched by the load: procs.scaled).
TIMEOUT = 600

#: Runs each script named on its command line in turn, each in a work folder of its own with its
#: own sys.argv and stdout, Keras's session cleared before it; writes answers.json at the end.
DRIVER = r"""
import contextlib, io, json, os, runpy, sys, traceback
root, scripts, entries = sys.argv[1], sys.argv[2], sys.argv[3:]
got = {}
try:
    import tpushim; tpushim.patch(quiet=True)
    import tensorflow as tf
    for entry in entries:
        path, _, arg = entry.partition("=")
        name = os.path.basename(path)
        workdir = os.path.join(root, name[:-3])
        os.makedirs(workdir)
        os.chdir(workdir)
        tf.keras.backend.clear_session()
        # Keras's own seed generator as a fresh process has it (none): a script before that
        # called tf.keras.utils.set_random_seed leaves it set, and a script seeding random,
        # numpy and TensorFlow alone would draw other initial weights than stock's run did.
        # (tf_keras's private module: test code, reading no more than this one attribute.)
        import tf_keras.src.backend as keras_backend
        if getattr(keras_backend._SEED_GENERATOR, "generator", None) is not None:
            keras_backend._SEED_GENERATOR.generator = None
        sys.argv = [os.path.join(scripts, path), arg or workdir]
        stdout = io.StringIO()
        answer = got[name] = {"workdir": workdir}
        try:
            with contextlib.redirect_stdout(stdout):
                runpy.run_path(sys.argv[0], run_name="__main__")
        except tpushim.ConversionError as e:
            answer["refused"] = " ".join(str(e).split())
        except BaseException as e:
            answer["raised"] = "".join(traceback.format_exception(e))[-3000:]
        results = [x for x in stdout.getvalue().splitlines() if x.startswith("RESULT ")]
        if results:
            answer["result"] = json.loads(results[-1][len("RESULT ") :])
        answer["written"] = sorted(
            os.path.relpath(os.path.join(d, f), workdir)
            for d, _, files in os.walk(workdir) for f in files if f.startswith("model.ckpt")
        )
except BaseException as e:
    got["_error"] = "".join(traceback.format_exception(e))[-3000:]
finally:
    with open(os.path.join(root, "answers.tmp"), "w") as f:
        json.dump(got, f)
    os.replace(os.path.join(root, "answers.tmp"), os.path.join(root, "answers.json"))
"""


def _graph_program(name):
    with open(os.path.join(SCRIPTS, name), encoding="utf-8") as f:
        return "disable_v2_behavior()" in f.read()


def _work(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jax_scripts"


@pytest.fixture(scope="session", autouse=True)
def scripts_started(request, tmp_path_factory):
    """Starts the run (once per session, where it selected a test of test_jax_scripts.py or
    test_jax_v1.py, or one named ``test_demo_...`` or ``test_stateless_draw_...``)
    without waiting for it; waits for it at the session's end where it started it."""
    wanted = (
        "test_jax_scripts.py",
        "test_jax_v1.py",
        *(f"::test_{name[:-3]}_" for name in INLINE),
    )
    if not any(w in item.nodeid for item in request.session.items for w in wanted):
        yield None
        return
    work, process = _work(tmp_path_factory), None
    with open(f"{work}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not work.exists():
            work.mkdir()
            # the scripts that disable TensorFlow 2 behaviour (for the rest of the process) last
            order = sorted([*NAMES, *UNRECORDED], key=lambda n: (_graph_program(n), n))
            entries = [f"{n}={UNRECORDED[n]}" if UNRECORDED.get(n) else n for n in order]
            (work / "inline").mkdir()
            for name, code in INLINE.items():
                (work / "inline" / name).write_text(code)
            # after the scripts of tests/scripts (the demo's tf.keras.utils.set_random_seed
            # leaves Keras's own seed generator set, which a script seeding random, numpy and
            # TensorFlow alone does not reset: its initial weights differed), before the graph
            # programs
            last = next((i for i, n in enumerate(order) if _graph_program(n)), len(order))
            entries[last:last] = [str(work / "inline" / name) for name in INLINE]
            entries += list(GRAPH_HELPERS.values())
            with open(work / "stdout", "w") as out, open(work / "stderr", "w") as err:
                process = subprocess.Popen(
                    [sys.executable, "-c", DRIVER, str(work), SCRIPTS, *entries],
                    env=procs.env_without_tpu(**ENV),
                    cwd=work,
                    stdout=out,
                    stderr=err,
                )
            (work / "pid").write_text(str(process.pid))
    yield work
    if process is not None:
        try:
            process.wait(timeout=procs.scaled(TIMEOUT))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="session")
def answers(scripts_started):
    """script -> what the run saw it do: ``workdir``, ``refused`` (the ConversionError's words), ``raised``
    (any other exception's traceback), ``result`` (its RESULT line), ``written`` (the
    checkpoint files in its work folder); ``_error`` where the run itself failed."""
    work = scripts_started
    done, deadline = work / "answers.json", time.monotonic() + procs.scaled(TIMEOUT)
    while not done.exists():
        pid = (work / "pid").read_text() if (work / "pid").exists() else ""
        if pid and not _alive(int(pid)) and not done.exists():
            pytest.fail(
                "the scripts' run ended without answers: " + (work / "stderr").read_text()[-4000:]
            )
        if time.monotonic() > deadline:
            pytest.fail("the scripts' run took too long: " + (work / "stderr").read_text()[-4000:])
        time.sleep(0.5)
    got = json.loads(done.read_text())
    assert "_error" not in got, got["_error"]
    return got
