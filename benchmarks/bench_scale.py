"""In-memory data at real size (``--only scale``): ``numpy_input_fn`` arrays, stock against cpu
mode, each run in a process of its own (peak memory is per process).

* MNIST-sized: ``numpy_input_fn({"x": x}, y, batch_size=128, num_epochs=None, shuffle=True)``
  over 60000 x 784 float32 (188 MB), a one-layer Keras model, ``train(steps=20)``; stock, stock
  again (the noise floor) and cpu mode interleaved. Goals: whole-process wall <= 1.2x, peak RSS
  <= 1.2x (the arrays are not copied again), model_dir <= 1.5x (no array bytes in it).
* Over 2 GB: 720000 x 784 float32 (2.26 GB) trains in cpu mode (stock beside it), and its TPU
  train graph builds on a faked 8-core TPU system (:mod:`tpushim._preflight.faketpu`) with no
  array in it, host 0's pipeline then reading two batches from the fed arrays. Run one process at
  a time, and skipped (with a note) when the machine has not the memory to spare.

A child process generates its data directly as float32 (no float64 temporary), so the peak it
reports is what the estimator adds to the arrays.
"""

import json
import os
import subprocess
import sys
import time

import benchlib
from benchlib import median

SECTION = "scale"
STOCK, STOCK_AGAIN, SHIM = "stock estimator", "stock estimator again", "tpushim cpu mode"
FEATURES, BATCH, STEPS = 784, 128, 20
MNIST_ROWS, BIG_ROWS = 60000, 720000


# -- the child: one contender's whole run ---------------------------------------------------------
def _data(rows):
    import numpy as np

    rng = np.random.default_rng(benchlib.SEED)
    return rng.random((rows, FEATURES), dtype=np.float32), rng.integers(0, 10, rows)


def _estimator(tf, model_dir):
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input((FEATURES,), name="x")
    model = tf.keras.Model({"x": x}, tf.keras.layers.Dense(10, activation="softmax")(x))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy")
    return tf.keras.estimator.model_to_estimator(
        keras_model=model,
        model_dir=model_dir,
        config=tf.estimator.RunConfig(tf_random_seed=benchlib.SEED),
    )


def _peak_rss():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _largest_constant(graph_def):
    sizes = [n.attr["value"].tensor.ByteSize() for n in graph_def.node if n.op == "Const"]
    return max(sizes, default=0)


def child(job, mode, rows, model_dir):
    """Runs one contender and prints its measurements as one JSON line."""
    tf = benchlib.tf()
    import tpushim

    x, y = _data(rows)
    fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
        {"x": x}, y, batch_size=BATCH, num_epochs=None, shuffle=True
    )
    out = {}
    if job == "train":
        if mode != "off":
            tpushim.patch(mode=mode)
        est = _estimator(tf, model_dir)
        start = time.perf_counter()
        est.train(fn, steps=STEPS)
        out["train_s"] = time.perf_counter() - start
    else:  # the TPU train graph on a faked TPU system
        from tpushim._preflight import faketpu

        with faketpu.faked_tpu_system() as tpu:
            tpushim.patch(tpu=tpu.master)
            est = _estimator(tf, model_dir)
            build = tpu.build(lambda: est.train(fn, steps=STEPS))
        graph_def = build.graph.as_graph_def()
        out["graph_bytes"] = graph_def.ByteSize()
        out["largest_const"] = _largest_constant(graph_def)
        batches = build.host_input(0, max_batches=2)
        out["host_batches"] = [list(b[0].shape) for b in batches]
    out["peak_rss"] = _peak_rss()
    print(json.dumps(out))


# -- the parent -----------------------------------------------------------------------------------
def _run_child(job, mode, rows, model_dir):
    """``(wall seconds, measurements or None, stderr tail)`` of one child process."""
    env = benchlib.clean_env({"PYTHONPATH": benchlib.REPO})
    argv = [sys.executable, os.path.abspath(__file__), job, mode, str(rows), model_dir]
    start = time.perf_counter()
    proc = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    measured = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    return wall, measured, proc.stderr[-2000:]


def _dir_bytes(path):
    return sum(
        os.path.getsize(os.path.join(folder, f))
        for folder, _, files in os.walk(path)
        for f in files
    )


def _available_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _mb(n):
    return f"{n / 2**20:.0f} MB" if n >= 2**20 else f"{n / 2**10:.0f} KB"


def _mnist_rows(table, opts, report, scratch):
    rows = MNIST_ROWS // 10 if opts.quick else MNIST_ROWS
    reps = benchlib.rounds(opts, full=3, quick=1)
    contenders = [(STOCK, "off"), (STOCK_AGAIN, "off"), (SHIM, "cpu")]
    runs = {name: [] for name, _ in contenders}

    def measure(mode):
        model_dir = scratch.new()
        wall, measured, err = _run_child("train", mode, rows, model_dir)
        if measured is None:
            raise RuntimeError(f"a {mode} run of the scale benchmark failed:\n{err}")
        measured.update(wall=wall, model_dir=_dir_bytes(model_dir))
        return measured

    values = benchlib.interleaved(contenders, reps, measure)
    case = f"numpy_input_fn(shuffle=True), {rows}x{FEATURES} float32, train({STEPS}), x{reps}"
    metrics = (
        ("whole-process wall", "wall", lambda v: f"{v:.2f} s", 1.2),
        ("peak RSS", "peak_rss", _mb, 1.2),
        ("model_dir", "model_dir", _mb, 1.5),
        ("train() call", "train_s", lambda v: f"{v:.2f} s", None),
    )
    for label, key, show, goal in metrics:
        per = {name: [m[key] for m in values[name]] for name, _ in contenders}
        paired = benchlib.Paired(per, STOCK)
        noise = paired.ratios(STOCK_AGAIN)
        for name, _ in contenders:
            ratio = paired.ratio(name)
            gated = goal is not None and name == SHIM
            table.add(
                SECTION,
                f"{label}, {case}",
                name,
                show(median(per[name])),
                f"{ratio:.3f}x",
                f"<= {goal}x" if gated else "",
                ratio <= goal if gated else None,
                spread=paired.spread(name),
                noise=(min(noise), max(noise)),
            )
        runs[label] = per
    report["scale"]["mnist"] = runs


def _big_rows(table, opts, report, scratch):
    size = BIG_ROWS * FEATURES * 4
    available = _available_bytes()
    need = 3 * size + 2 * 2**30  # the arrays, stock's peak beside them, room for everyone else
    case = f"over 2 GB: numpy_input_fn(shuffle=True), {BIG_ROWS}x{FEATURES} float32 ({_mb(size)})"
    if opts.quick or (available is not None and available < need):
        why = "--quick" if opts.quick else f"{_mb(available or 0)} available, {_mb(need)} needed"
        table.notes.append(f"scale: the over-2-GB case was skipped ({why}).")
        return
    big = {}
    for name, job, mode in (
        (STOCK, "train", "off"),
        (SHIM, "train", "cpu"),
        (SHIM + ", TPU train graph (faked 8 cores)", "tpu-graph", "tpu"),
    ):
        model_dir = scratch.new()
        wall, measured, err = _run_child(job, mode, BIG_ROWS, model_dir)
        big[name] = dict(measured or {}, wall=wall, error=None if measured else err)
        if measured is None:
            table.add(SECTION, case, name, "failed", goal="runs", ok=False)
            table.notes.append(f"scale: {name} failed:\n{err}")
            continue
        if job == "train":
            value = (
                f"{wall:.1f} s wall, peak RSS {_mb(measured['peak_rss'])}, "
                f"model_dir {_mb(_dir_bytes(model_dir))}"
            )
            ok = None if mode == "off" else True
            table.add(SECTION, f"{case}, train({STEPS})", name, value, goal="trains", ok=ok)
        else:
            shapes = measured["host_batches"]
            value = (
                f"graph {_mb(measured['graph_bytes'])}, largest Const "
                f"{measured['largest_const']} B, peak RSS {_mb(measured['peak_rss'])}, "
                f"host 0 read {len(shapes)} batches of {shapes[0] if shapes else None}"
            )
            ok = measured["graph_bytes"] < 2**20 and len(shapes) == 2
            table.add(SECTION, case, name, value, goal="builds, < 1 MB", ok=ok)
    report["scale"]["over 2 GB"] = big


def run(table, opts, report):
    """The ``scale`` section."""
    report["scale"] = {}
    with benchlib.ScratchDir("tpushim-bench-scale-") as scratch:
        _mnist_rows(table, opts, report, scratch)
        _big_rows(table, opts, report, scratch)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    child(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
