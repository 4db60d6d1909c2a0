"""tpushim benchmarks: every ratio measured side by side in one run, interleaved, median reported.

    python benchmarks/bench.py            # full run, about 3-4 minutes on 2 CPU cores
    python benchmarks/bench.py --quick    # smoke run, under a minute
    python benchmarks/bench.py --only train,graph --json /tmp/bench.json

Sections (``--only`` takes their names):

* ``startup``: ``import tpushim; tpushim.patch()`` before TensorFlow against a bare interpreter
  (``python -c pass``), in fresh subprocesses, interleaved: the median of the paired wall-clock
  differences, and the code's own time measured inside the interpreter (far less noisy). Rows: with
  bytecode cached (as after ``pip install``; the cache lives in a temporary PYTHONPYCACHEPREFIX,
  never in the tree), under ``python -S`` (no ``.pth`` file preloads stdlib modules: a lean
  interpreter's cost), and, when PYTHONDONTWRITEBYTECODE is set, with no bytecode at all. Then
  whether TensorFlow (and wrapt, inspect, logging, dataclasses) got imported, and a
  ``python -X importtime`` breakdown. Goal: <= 5 ms added, no TensorFlow.
* ``wrapper``: ``model_to_estimator`` patched in auto mode with no TPU against the unpatched call
  (same model, fresh model_dir per call), interleaved; plus the wrapper alone around a no-op
  stand-in, which is the part of the difference that is the wrapper's own. Goal: <= 1% added.
* ``train`` (ratios: the median of each repetition's ratio to stock): steady-state training steps/s and examples/s of the stock estimator, tpushim auto mode
  (no TPU: must be stock), tpushim cpu mode and a hand-written TPUEstimator(use_tpu=False) model_fn
  (TPUConfig's default iterations_per_loop=2, and again with tpushim's 100), on a tiny MLP and an
  MNIST-sized CNN (synthetic data). Graph building, session start and the final checkpoint are
  excluded: a hook times steps W+1 .. W+M inside one ``train()`` call; one discarded warm-up run
  per model first. Goals: auto >= 0.99x stock, cpu >= 0.9x stock.
* ``input``: legacy input in cpu mode against stock, interleaved. The first step's latency (from
  the ``train()`` call to the end of step 1, graph building and tpushim's input inspection
  included) on TFRecords with ``shuffle(10000)`` and ``batch(B)`` without drop_remainder, goal
  <= 1.05x; steady-state steps/s of ``make_one_shot_iterator(...).get_next()`` tensors and of
  ``numpy_input_fn`` (both fed by tpushim as a Dataset), goal >= 0.98x.
* ``graph``: ops of tpushim's TRAIN model_fn (``params['use_tpu']=True``) replicated over 8
  replicas with ``tf.compat.v1.tpu.replicate`` (built on CPU, never run) against a hand-written
  minimal TPU model_fn for the same model: ops in the whole graph, ops inside the replicate
  cluster, and the cluster's live ops (those the replicated outputs depend on; dead stateless ops
  are pruned before XLA compiles, dead stateful ones are not). Ratios are to the hand-written
  model_fn that uses the Keras loss object the model is compiled with; a second one with
  ``reduce_mean`` shows what the Keras loss machinery itself costs. Goal: <= 1.02x (cluster).

Every contender gets the same model, data, seed and batch size; TensorFlow's logger is set to
ERROR so log formatting is not timed. ``CONTENDERS`` and ``GRAPH_CONTENDERS`` are module-level
lists so a scratch script can add a prototype (import this module, append, call ``main()``).
"""

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SEED = 7
REPLICAS = 8
# Variables naming a TPU or tpushim settings: removed so that "no TPU configured" is true here.
_TPU_ENV = ("TPUSHIM_", "TPU_NAME", "TPU_CONFIG", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "COLAB_TPU_ADDR")


def median(values):
    return statistics.median(values) if values else float("nan")


def _clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(_TPU_ENV)}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.update(extra or {})
    return env


class Table:
    """Rows of (section, item, contender, value, ratio, goal, verdict)."""

    HEAD = ("benchmark", "case", "contender", "median", "ratio", "goal", "ok")

    def __init__(self):
        self.rows = []
        self.notes = []

    def add(self, bench, case, contender, value, ratio="", goal="", ok=None):
        verdict = "" if ok is None else ("yes" if ok else "NO")
        self.rows.append((bench, case, contender, value, ratio, goal, verdict))

    def render(self):
        widths = [max(len(str(r[i])) for r in self.rows + [self.HEAD]) for i in range(len(self.HEAD))]
        line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
        out = [line(self.HEAD), line(["-" * w for w in widths])]
        last = None
        for row in self.rows:
            if last is not None and row[0] != last:
                out.append("")
            last = row[0]
            out.append(line(row))
        return "\n".join(out)


# ==================================================================================================
# 1. start-up
# ==================================================================================================

SHIM_CODE = "import tpushim; tpushim.patch()"
IMPORT_CODE = "import tpushim"
CHECK_CODE = ("import json, sys, tpushim; tpushim.patch(); "
              "print(json.dumps(sorted(m for m in ('tensorflow', 'tensorflow_estimator', 'keras', "
              "'numpy', 'wrapt', 'inspect', 'logging', 'dataclasses') if m in sys.modules)))")


def _self_timed(code):
    """``code`` that also prints how long it took inside the interpreter (perf_counter seconds)."""
    return f"import time as _t; _s = _t.perf_counter(); {code}; print(_t.perf_counter() - _s)"


def _repo_of_tpushim():
    return os.path.dirname(os.path.dirname(importlib.util.find_spec("tpushim").origin))


def _cached_env(pycache, pythonpath=None, no_site=False):
    """An environment whose imports read bytecode from ``pycache`` (written there by warm-up runs,
    never into the source tree), as after ``pip install`` -- whatever PYTHONDONTWRITEBYTECODE says
    here. ``pythonpath``: a tree to import tpushim from first. ``no_site``: PYTHONPATH for
    ``python -S`` (the tree holding tpushim, and wrapt's site-packages)."""
    env = _clean_env({"PYTHONPYCACHEPREFIX": pycache})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    paths = [pythonpath] if pythonpath else []
    if no_site:
        paths.append(pythonpath or _repo_of_tpushim())
        paths.append(os.path.dirname(os.path.dirname(importlib.util.find_spec("wrapt").origin)))
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _run(argv, env):
    # cwd: a neutral folder, as ``-c`` puts the working directory first on sys.path (run from the
    # repository root, it would shadow the tree under test).
    start = time.perf_counter()
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True,
                         cwd=tempfile.gettempdir()).stdout
    return time.perf_counter() - start, out


class StartupVariant:
    """One way to start an interpreter: ``flags`` + ``-c code`` under ``env``."""

    def __init__(self, label, code, env, flags=()):
        self.label, self.code, self.env, self.flags = label, code, env, list(flags)

    def wall(self):
        return _run([sys.executable, *self.flags, "-c", self.code], self.env)[0]

    def in_process(self):
        out = _run([sys.executable, *self.flags, "-c", _self_timed(self.code)], self.env)[1]
        return float(out.split()[-1])


def _startup_rows(table, case, variants, reps, goals):
    """Runs ``variants`` (the first is the baseline) interleaved, ``reps`` times each, both plain
    (wall clock, measured from here) and self-timed (the code's own time inside the interpreter).
    Adds one row per variant; ``goals``: labels held to the <= 5 ms goal."""
    for v in variants:  # warm-up: writes the bytecode cache, fills the OS file cache
        v.wall(), v.in_process()
    wall = {v.label: [] for v in variants}
    inner = {v.label: [] for v in variants}
    for i in range(reps):
        shift = i % len(variants)
        for v in variants[shift:] + variants[:shift]:
            wall[v.label].append(v.wall())
            inner[v.label].append(v.in_process())
    base = wall[variants[0].label]
    for v in variants:
        ms, own = median(wall[v.label]) * 1e3, median(inner[v.label]) * 1e3
        if v is variants[0]:
            table.add("start-up", case, v.label, f"{ms:.1f} ms wall")
            continue
        added = median([a - b for a, b in zip(wall[v.label], base)]) * 1e3  # paired per repetition
        goal = v.label in goals
        table.add("start-up", case, v.label, f"{ms:.1f} ms wall; in-process {own:.2f} ms",
                  f"+{added:.1f} ms", "<= +5 ms" if goal else "",
                  (added <= 5.0 and own <= 5.0) if goal else None)
    return {"wall_s": wall, "in_process_s": inner}


def parse_importtime(stderr):
    """[(name, depth, self_us, cumulative_us)] for the imports after ``site`` (the -c code's)."""
    rows = []
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)", line)
        if m:
            rows.append((m.group(4), len(m.group(3)) // 2, int(m.group(1)), int(m.group(2))))
    site = max((i for i, r in enumerate(rows) if r[0] == "site" and r[1] == 0), default=-1)
    return rows[site + 1:]


def importtime_breakdown(runs, env):
    """Median self/cumulative microseconds per module over ``runs`` runs of -X importtime."""
    per_module, order = {}, None
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-c", SHIM_CODE], env=env,
                              capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
        rows = parse_importtime(proc.stderr)
        order = order or rows
        for name, _, self_us, cum_us in rows:
            per_module.setdefault(name, []).append((self_us, cum_us))
    return [(name, depth, median([s for s, _ in per_module[name]]),
             median([c for _, c in per_module[name]])) for name, depth, _, _ in order]


def bench_startup(table, quick, report, compare_tree=None):
    reps = 15 if quick else 50
    pycache = tempfile.mkdtemp(prefix="tpushim-bench-pycache-")
    report["startup"] = {"reps": reps}
    try:
        env = _cached_env(pycache)
        modules = json.loads(_run([sys.executable, "-c", CHECK_CODE], env)[1].splitlines()[-1])
        tf_imported = "tensorflow" in modules
        variants = [StartupVariant("python -c pass", "pass", env),
                    StartupVariant(IMPORT_CODE, IMPORT_CODE, env),
                    StartupVariant(SHIM_CODE, SHIM_CODE, env)]
        goals = {SHIM_CODE}
        if compare_tree:  # a prototype tree, interleaved with the rest
            label = f"{SHIM_CODE}  [PYTHONPATH={compare_tree}]"
            variants.append(StartupVariant(label, SHIM_CODE, _cached_env(pycache, compare_tree)))
            goals.add(label)
        report["startup"]["cached"] = _startup_rows(
            table, f"bytecode cached, {reps} runs", variants, reps, goals)
        table.add("start-up", "modules after patch()", SHIM_CODE,
                  ", ".join(modules) or "none of those checked", "", "no tensorflow", not tf_imported)
        report["startup"]["modules"] = modules
        # Under -S no .pth file preloads stdlib modules (this machine's site imports certifi and
        # with it pathlib, typing, re, ...): the cost on a lean interpreter.
        ns_env = _cached_env(pycache, no_site=True)
        variants = [StartupVariant("python -S -c pass", "pass", ns_env, ["-S"]),
                    StartupVariant(f"python -S: {SHIM_CODE}", SHIM_CODE, ns_env, ["-S"])]
        if compare_tree:
            variants.append(StartupVariant(
                f"python -S: {SHIM_CODE}  [PYTHONPATH={compare_tree}]", SHIM_CODE,
                _cached_env(pycache, compare_tree, no_site=True), ["-S"]))
        report["startup"]["no_site"] = _startup_rows(
            table, f"python -S (no site), {reps} runs", variants, reps, {v.label for v in variants[1:]})
        # As this checkout starts when PYTHONDONTWRITEBYTECODE is set (this machine): an editable
        # install without bytecode compiles tpushim's sources at every start.
        raw_env = _clean_env()
        if raw_env.get("PYTHONDONTWRITEBYTECODE"):
            variants = [StartupVariant("python -c pass", "pass", raw_env),
                        StartupVariant(SHIM_CODE, SHIM_CODE, raw_env)]
            report["startup"]["no_bytecode"] = _startup_rows(
                table, f"PYTHONDONTWRITEBYTECODE=1, no bytecode, {reps // 2} runs", variants,
                reps // 2, set())
        breakdown = importtime_breakdown(3 if quick else 7, env)
    finally:
        shutil.rmtree(pycache, ignore_errors=True)
    report["startup_importtime"] = breakdown
    lines = ['python -X importtime -c "import tpushim; tpushim.patch()" (bytecode cached; median '
             'of runs; microseconds; only the imports after site; depth <= 2 or self >= 300 us):',
             f"  {'self':>7} {'cumul':>7}  module"]
    for name, depth, self_us, cum_us in breakdown:
        if depth <= 2 or self_us >= 300:
            lines.append(f"  {self_us:7.0f} {cum_us:7.0f}  {'  ' * depth}{name}")
    top = sorted(breakdown, key=lambda r: -r[2])[:8]
    lines.append("  largest self times: " + ", ".join(f"{n} {s:.0f}" for n, _, s, _ in top))
    table.notes.append("\n".join(lines))


# ==================================================================================================
# TensorFlow side: models and data
# ==================================================================================================

def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tf.get_logger().setLevel("ERROR")
    import warnings  # pylint: disable=import-outside-toplevel
    warnings.filterwarnings("ignore", module="keras")
    return tf


class ModelCase:
    """One model, its data and its training lengths; identical for every contender."""

    def __init__(self, name, build_layers, input_shape, classes, n, batch, lr, warmup, measure):
        self.name, self.build_layers, self.input_shape = name, build_layers, input_shape
        self.classes, self.n, self.batch, self.lr = classes, n, batch, lr
        self.warmup, self.measure = warmup, measure
        self._data = None

    def data(self):
        if self._data is None:
            import numpy as np  # pylint: disable=import-outside-toplevel
            rng = np.random.RandomState(0)
            x = rng.rand(self.n, *self.input_shape).astype("float32")
            y = rng.randint(0, self.classes, size=(self.n, 1)).astype("int64")
            self._data = (x, y)
        return self._data

    def keras_model(self, optimizer=None, metrics=("accuracy",)):
        tf = _tf()
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input(self.input_shape)] + self.build_layers())
        model.compile(optimizer=optimizer or tf.keras.optimizers.legacy.SGD(self.lr),
                      loss="sparse_categorical_crossentropy", metrics=list(metrics))
        return model

    def apply_layers(self, features):
        """The same layers applied to a tensor, for the hand-written model_fns."""
        out = features
        for layer in self.build_layers():
            out = layer(out)
        return out

    def legacy_input_fn(self):
        """What a legacy script passes: no params, batches with a dynamic batch dimension."""
        tf = _tf()
        x, y = self.data()
        batch = self.batch
        return lambda: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)

    def params_input_fn(self):
        """What a hand-written TPUEstimator takes: params['batch_size'], static batches."""
        tf = _tf()
        x, y = self.data()

        def input_fn(params):
            return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
                params["batch_size"], drop_remainder=True)
        return input_fn


def _mlp_layers():
    tf = _tf()
    return [tf.keras.layers.Dense(16, activation="relu", name="hidden"),
            tf.keras.layers.Dense(3, activation="softmax", name="probs")]


def _cnn_layers():
    tf = _tf()
    L = tf.keras.layers
    return [L.Conv2D(16, 3, activation="relu", name="conv1"), L.MaxPooling2D(name="pool1"),
            L.Conv2D(32, 3, activation="relu", name="conv2"), L.MaxPooling2D(name="pool2"),
            L.Flatten(name="flat"), L.Dense(64, activation="relu", name="dense"),
            L.Dense(10, activation="softmax", name="probs")]


def model_cases(quick):
    return [
        ModelCase("tiny MLP 4-16-3", _mlp_layers, (4,), 3, 4096, 32, 0.05,
                  warmup=50 if quick else 100, measure=400 if quick else 2500),
        ModelCase("CNN 28x28x1 (MNIST-sized)", _cnn_layers, (28, 28, 1), 10, 2048, 32, 0.01,
                  warmup=10 if quick else 20, measure=40 if quick else 300),
    ]


# ==================================================================================================
# 2. the wrapper on a model_to_estimator call
# ==================================================================================================

def bench_wrapper(table, quick, report):
    tf = _tf()
    import tpushim  # pylint: disable=import-outside-toplevel
    from tensorflow_estimator.python.estimator import keras_lib  # pylint: disable=import-outside-toplevel
    case = model_cases(quick)[0]
    root = tempfile.mkdtemp(prefix="tpushim-bench-wrapper-")
    reps = 6 if quick else 40
    times = {"stock": [], "auto": []}
    diffs = []
    try:
        def call(kind):
            if kind == "auto":
                tpushim.patch(mode="auto")
            else:
                tpushim.unpatch()
            # A fresh, identical model per call: keras_lib cannot convert one model object twice.
            model = case.keras_model()
            model_dir = tempfile.mkdtemp(dir=root)
            config = tf.estimator.RunConfig(tf_random_seed=SEED)
            start = time.perf_counter()
            est = tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=model_dir,
                                                        config=config)
            elapsed = time.perf_counter() - start
            tpushim.unpatch()
            assert type(est).__name__ == "EstimatorV2", type(est)
            return elapsed

        call("stock"), call("auto")  # first calls import keras_lib and tpushim._detect
        for i in range(reps):
            pair = {}
            for kind in (("stock", "auto") if i % 2 == 0 else ("auto", "stock")):
                pair[kind] = call(kind)
                times[kind].append(pair[kind])
            diffs.append(pair["auto"] - pair["stock"])

        # The wrapper alone: tpushim's layer around a no-op stand-in with the same signature,
        # applied through the public patch()/unpatch() (which wrap whatever keras_lib holds).
        original = keras_lib.model_to_estimator

        def stand_in(*args, **kwargs):
            del args, kwargs
        stand_in.__wrapped__ = original  # same inspect.signature as the real one
        keras_lib.model_to_estimator = stand_in
        model = case.keras_model()
        n = 300 if quick else 2000
        alone = {"stand-in": [], "wrapped": []}
        try:
            for _ in range(5):
                for kind in ("stand-in", "wrapped"):
                    if kind == "wrapped":
                        tpushim.patch(mode="auto")
                    fn = keras_lib.model_to_estimator
                    start = time.perf_counter()
                    for _ in range(n):
                        fn(keras_model=model, model_dir="/nonexistent")
                    alone[kind].append((time.perf_counter() - start) / n)
                    tpushim.unpatch()
        finally:
            tpushim.unpatch()
            keras_lib.model_to_estimator = original
    finally:
        tpushim.unpatch()
        shutil.rmtree(root, ignore_errors=True)
    stock, auto = median(times["stock"]) * 1e3, median(times["auto"]) * 1e3
    own_us = (median(alone["wrapped"]) - median(alone["stand-in"])) * 1e6
    case_name = f"{case.name}, {reps} interleaved pairs"
    table.add("model_to_estimator", case_name, "stock (unpatched)", f"{stock:.1f} ms/call")
    # The goal is judged on the paired differences (each wrapped call against the stock call made
    # next to it), which cancel machine drift; the ratio of the two medians is shown for reference.
    table.add("model_to_estimator", case_name, "tpushim auto, no TPU", f"{auto:.1f} ms/call",
              f"{auto / stock:.3f}x")
    table.add("model_to_estimator", case_name, "  median of paired differences",
              f"{median(diffs) * 1e3:+.2f} ms", f"{median(diffs) * 1e3 / stock * 100:+.2f}%",
              "<= +1%", median(diffs) * 1e3 / stock <= 0.01)
    table.add("model_to_estimator", f"wrapper alone, {n} calls x5", "tpushim layer, auto, no TPU",
              f"{own_us:.1f} us/call", f"{own_us / 1e3 / stock * 100:+.3f}%", "<= 1%",
              own_us / 1e3 / stock <= 0.01)
    report["wrapper"] = {"stock_s": times["stock"], "auto_s": times["auto"],
                         "alone_s": alone}


# ==================================================================================================
# 3. training throughput
# ==================================================================================================

class Contender:
    """A way to get an estimator and its input_fn for a ModelCase.

    ``make(case, model_dir)`` returns ``(estimator, input_fn)``. ``expect`` is a goal as a
    (min ratio to stock, text) pair or None.
    """

    def __init__(self, name, make, expect=None):
        self.name, self.make, self.expect = name, make, expect


def _converted(mode):
    def make(case, model_dir):
        tf = _tf()
        import tpushim  # pylint: disable=import-outside-toplevel
        if mode is None:
            tpushim.unpatch()
        else:
            tpushim.patch(mode=mode)
        try:
            est = tf.keras.estimator.model_to_estimator(
                keras_model=case.keras_model(), model_dir=model_dir,
                config=tf.estimator.RunConfig(tf_random_seed=SEED))
        finally:
            tpushim.unpatch()
        return est, case.legacy_input_fn()
    return make


def hand_model_fn(case):
    """A minimal hand-written TPUEstimator model_fn: Keras layers, the Keras loss, a tf1 optimizer."""
    tf = _tf()

    def model_fn(features, labels, mode, params):
        probs = case.apply_layers(features)
        loss = tf.keras.losses.SparseCategoricalCrossentropy()(labels, probs)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(case.lr)
        if params.get("use_tpu"):
            optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
        train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode=mode, loss=loss, train_op=train_op)
    return model_fn


def _hand_written(iterations_per_loop=None):
    def make(case, model_dir):
        tf = _tf()
        tpu = tf.compat.v1.estimator.tpu
        tpu_config = tpu.TPUConfig(iterations_per_loop=iterations_per_loop or 2)  # 2: the default
        est = tpu.TPUEstimator(model_fn=hand_model_fn(case), use_tpu=False,
                               train_batch_size=case.batch, eval_batch_size=case.batch,
                               predict_batch_size=case.batch,
                               config=tpu.RunConfig(tf_random_seed=SEED, model_dir=model_dir,
                                                    tpu_config=tpu_config))
        return est, case.params_input_fn()
    return make


CONTENDERS = [
    Contender("stock estimator", _converted(None)),
    Contender("tpushim auto (no TPU)", _converted("auto"), (0.99, ">= 0.99x")),
    Contender("tpushim cpu mode", _converted("cpu"), (0.90, ">= 0.90x")),
    Contender("hand-written TPUEstimator(use_tpu=False)", _hand_written()),
    # TPUEstimator logs examples/sec every ceil(log_step_count_steps / iterations_per_loop)
    # session.run()s -- on CPU, steps. tpushim's iterations_per_loop is 100 (TPUEstimator's own
    # default is 2): this row shows what that alone costs a hand-written TPUEstimator.
    Contender("hand-written TPUEstimator, iterations_per_loop=100", _hand_written(100)),
]


class _StepTimer:
    """Times steps warmup+1 .. warmup+measure of one train() call (after_run of each step)."""

    def __init__(self, warmup, measure):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        class Hook(tf.compat.v1.train.SessionRunHook):
            def __init__(hook):
                hook.steps = 0
                hook.marks = {}

            def after_run(hook, run_context, run_values):
                del run_context, run_values
                hook.steps += 1
                if hook.steps in (warmup, warmup + measure):
                    hook.marks[hook.steps] = time.perf_counter()

        self.hook = Hook()
        self.warmup, self.measure = warmup, measure

    def steps_per_sec(self):
        marks = self.hook.marks
        return self.measure / (marks[self.warmup + self.measure] - marks[self.warmup])


def measure_training(contender, case, root):
    model_dir = tempfile.mkdtemp(dir=root)
    try:
        est, input_fn = contender.make(case, model_dir)
        timer = _StepTimer(case.warmup, case.measure)
        est.train(input_fn, steps=case.warmup + case.measure, hooks=[timer.hook])
        return timer.steps_per_sec(), type(est).__name__
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)


def bench_train(table, quick, report):
    _tf()
    reps = 2 if quick else 7
    root = tempfile.mkdtemp(prefix="tpushim-bench-train-")
    report["train"] = {}
    try:
        for case in model_cases(quick):
            rates = {c.name: [] for c in CONTENDERS}
            kinds = {}
            measure_training(CONTENDERS[0], case, root)  # warm-up, discarded: first-run costs
            for i in range(reps):  # interleaved: every contender once per repetition, rotating
                order = CONTENDERS[i % len(CONTENDERS):] + CONTENDERS[:i % len(CONTENDERS)]
                for contender in order:
                    rate, kind = measure_training(contender, case, root)
                    rates[contender.name].append(rate)
                    kinds[contender.name] = kind
            stock_rates = rates[CONTENDERS[0].name]
            label = f"{case.name}, batch {case.batch}, {case.measure} steps x{reps}"
            for contender in CONTENDERS:
                rate = median(rates[contender.name])
                # Paired: each repetition's ratio to stock in the same repetition, then the median,
                # so that a drift in machine load over the run cancels out.
                ratio = median([r / s for r, s in zip(rates[contender.name], stock_rates)])
                goal, ok = "", None
                if contender.expect:
                    goal, ok = contender.expect[1], ratio >= contender.expect[0]
                table.add("train throughput", label, f"{contender.name} [{kinds[contender.name]}]",
                          f"{rate:.0f} steps/s = {rate * case.batch:.0f} ex/s",
                          f"{ratio:.3f}x", goal, ok)
            report["train"][case.name] = rates
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ==================================================================================================
# 3b. legacy input: time to the first step, and steps/s of inputs tpushim recovers as a Dataset
# ==================================================================================================

class _FirstStepTimer:
    """Seconds from ``start()`` (just before ``train()``) to the end of the first training step."""

    def __init__(self):
        tf = _tf()
        timer = self

        class Hook(tf.compat.v1.train.SessionRunHook):
            def after_run(hook, run_context, run_values):
                del run_context, run_values
                if timer.first is None:
                    timer.first = time.perf_counter()

        self.hook, self.first, self.started = Hook(), None, None

    def start(self):
        self.started = time.perf_counter()

    def seconds(self):
        return self.first - self.started


def _write_tfrecords(path, case):
    tf = _tf()
    x, y = case.data()
    with tf.io.TFRecordWriter(path) as writer:
        for features, label in zip(x, y):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=features.ravel())),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=label)),
            })).SerializeToString())


def _tfrecord_input_fn(path, case):
    """The issue's pipeline: TFRecords, shuffle(10000), batch(B) without drop_remainder."""
    tf = _tf()
    spec = {"x": tf.io.FixedLenFeature(list(case.input_shape), tf.float32),
            "y": tf.io.FixedLenFeature([1], tf.int64)}

    def input_fn():
        ds = tf.data.TFRecordDataset(path).map(lambda r: tf.io.parse_single_example(r, spec))
        ds = ds.map(lambda e: (e["x"], e["y"])).shuffle(10000).repeat().batch(case.batch)
        return ds
    return input_fn


def _iterator_input_fn(case):
    tf = _tf()
    x, y = case.data()
    return lambda: tf.compat.v1.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(case.batch)).get_next()


def _numpy_input_fn(case):
    tf = _tf()
    x, y = case.data()
    return tf.compat.v1.estimator.inputs.numpy_input_fn(x, y, batch_size=case.batch, shuffle=False,
                                                        num_epochs=None)


def bench_input(table, quick, report):
    """Legacy input in cpu mode against stock: the first step's latency (TFRecords) and steady
    steps/s of iterator tensors and numpy_input_fn (both fed as a Dataset by tpushim)."""
    _tf()
    reps = 3 if quick else 7
    case = model_cases(quick)[0]
    root = tempfile.mkdtemp(prefix="tpushim-bench-input-")
    report["input"] = {}
    contenders = [("stock estimator", None), ("tpushim cpu mode", "cpu")]
    try:
        records = os.path.join(root, "train.tfrecord")
        _write_tfrecords(records, case)

        def first_step(mode):
            model_dir = tempfile.mkdtemp(dir=root)
            est, _ = _converted(mode)(case, model_dir)
            timer = _FirstStepTimer()
            timer.start()
            est.train(_tfrecord_input_fn(records, case), steps=1, hooks=[timer.hook])
            return timer.seconds()

        def steady(mode, make_input):
            model_dir = tempfile.mkdtemp(dir=root)
            est, _ = _converted(mode)(case, model_dir)
            timer = _StepTimer(case.warmup, case.measure)
            est.train(make_input(case), steps=case.warmup + case.measure, hooks=[timer.hook])
            return timer.steps_per_sec()

        rows = [("first step, TFRecords + shuffle(10000) + batch(B)", first_step, "s", (1.05, "<= 1.05x"),
                 lambda r, s: r / s)]
        for name, make_input in (("iterator tensors", _iterator_input_fn),
                                 ("numpy_input_fn", _numpy_input_fn)):
            rows.append((f"steps/s, {name}", lambda mode, m=make_input: steady(mode, m), "steps/s",
                         (0.98, ">= 0.98x"), lambda r, s: r / s))
        first_step(None)  # warm-up, discarded
        for label, measure, unit, (bound, goal), ratio_of in rows:
            values = {name: [] for name, _ in contenders}
            for i in range(reps):  # interleaved, alternating who goes first
                for name, mode in (contenders if i % 2 == 0 else contenders[::-1]):
                    values[name].append(measure(mode))
            stock = values[contenders[0][0]]
            for name, _ in contenders:
                ratio = median([ratio_of(v, s) for v, s in zip(values[name], stock)])
                is_shim = name != contenders[0][0]
                ok = (ratio <= bound if unit == "s" else ratio >= bound) if is_shim else None
                table.add("legacy input", f"{label}, {case.name}, batch {case.batch} x{reps}", name,
                          f"{median(values[name]):.3f} {unit}", f"{ratio:.3f}x",
                          goal if is_shim else "", ok)
            report["input"][label] = values
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ==================================================================================================
# 4. TPU train-step graph size
# ==================================================================================================

def _live_ops(outputs):
    seen, stack = set(), [t.op for t in outputs]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def count_replicated_train_step(case, step_fn_factory, per_replica=4):
    """(ops in graph, ops in the replicate cluster, live ops in the cluster) for one train step.

    ``step_fn_factory()`` runs outside the graph (e.g. builds the Keras model) and returns
    ``step(features, labels) -> (loss, train_op)``, called inside the replicated computation.
    """
    tf = _tf()
    step = step_fn_factory()
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()

        def computation():
            features = tf.zeros([per_replica, *case.input_shape])
            labels = tf.zeros([per_replica, 1], tf.int64)
            loss, train_op = step(features, labels)
            with tf.control_dependencies([train_op]):
                return tf.identity(loss)

        outputs = tf.compat.v1.tpu.replicate(computation, inputs=[[]] * REPLICAS)
    ops = graph.get_operations()
    cluster = [op for op in ops if "_tpu_replicate" in op.node_def.attr]
    live = _live_ops([t for replica in outputs for t in replica])
    return len(ops), len(cluster), sum(1 for op in cluster if op in live)


def _shim_step(optimizer_name):
    def factory_for(case):
        def factory():
            tf = _tf()
            from tpushim import _model_fn  # pylint: disable=import-outside-toplevel
            optimizer = (tf.compat.v1.train.GradientDescentOptimizer(case.lr)
                         if optimizer_name == "tf1" else tf.keras.optimizers.legacy.SGD(case.lr))
            model_fn = _model_fn.make_model_fn(case.keras_model(optimizer))

            def step(features, labels):
                spec = model_fn(features, labels, tf.estimator.ModeKeys.TRAIN,
                                params={"use_tpu": True, "batch_size": 4})
                return spec.loss, spec.train_op
            return step
        return factory
    return factory_for


def _hand_step(loss_kind):
    def factory_for(case):
        def factory():
            tf = _tf()
            tf.keras.backend.clear_session()

            def step(features, labels):
                probs = case.apply_layers(features)
                if loss_kind == "keras":
                    loss = tf.keras.losses.SparseCategoricalCrossentropy()(labels, probs)
                else:
                    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, probs))
                optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
                    tf.compat.v1.train.GradientDescentOptimizer(case.lr))
                return loss, optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
            return step
        return factory
    return factory_for


#: (name, factory_for(case), is_reference). Ratios are to the first reference.
GRAPH_CONTENDERS = [
    ("hand-written: Keras loss object + CrossShardOptimizer(GD)", _hand_step("keras"), True),
    ("hand-written: reduce_mean(crossentropy) + CrossShardOptimizer(GD)", _hand_step("mean"), False),
    ("tpushim, compiled with tf1 GradientDescentOptimizer", _shim_step("tf1"), False),
    ("tpushim, compiled with Keras legacy SGD", _shim_step("keras"), False),
]


def bench_graph(table, quick, report):
    del quick
    report["graph"] = {}
    for case in model_cases(True):
        counts = {}
        for name, factory_for, _ in GRAPH_CONTENDERS:
            try:
                counts[name] = count_replicated_train_step(case, factory_for(case))
            except Exception as e:  # pylint: disable=broad-except
                counts[name] = None
                table.notes.append(f"graph: {name} on {case.name} failed: {type(e).__name__}: {e}")
        ref_name = next(n for n, _, ref in GRAPH_CONTENDERS if ref)
        ref = counts.get(ref_name)
        for name, _, is_ref in GRAPH_CONTENDERS:
            got = counts.get(name)
            if got is None:
                continue
            total, cluster, live = got
            value = f"{total} graph / {cluster} cluster / {live} live"
            ratio, ok = "", None
            if ref and not is_ref:
                ratio = f"{total / ref[0]:.3f} / {cluster / ref[1]:.3f} / {live / ref[2]:.3f}"
                ok = cluster / ref[1] <= 1.02 if name.startswith("tpushim") else None
            table.add("TPU train-step ops", f"{case.name}, {REPLICAS} replicas", name, value, ratio,
                      "<= 1.02x (cluster)" if name.startswith("tpushim") else "", ok)
        report["graph"][case.name] = counts


# ==================================================================================================

SECTIONS = {"startup": bench_startup, "wrapper": bench_wrapper, "train": bench_train,
            "input": bench_input, "graph": bench_graph}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (< 60 s)")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections: {', '.join(SECTIONS)}")
    parser.add_argument("--json", help="also write raw measurements to this file")
    parser.add_argument("--compare-tree", metavar="DIR",
                        help="start-up: also time a prototype tpushim package in DIR (interleaved)")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    dropped = sorted(k for k in os.environ if k.startswith(_TPU_ENV))
    for key in dropped:  # "no TPU configured" must be true for the auto-mode rows
        del os.environ[key]
    table, report = Table(), {}
    start = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    for name in sections:  # start-up first: it must not compete with TensorFlow for the cores
        if name == "startup":
            bench_startup(table, args.quick, report, args.compare_tree)
        else:
            SECTIONS[name](table, args.quick, report)
    elapsed = time.perf_counter() - start
    tf_version = sys.modules["tensorflow"].__version__ if "tensorflow" in sys.modules else "not imported"
    print(f"tpushim benchmarks ({'quick' if args.quick else 'full'}): python {platform.python_version()}, "
          f"tensorflow {tf_version}, {os.cpu_count()} CPUs, load average {load:.2f} at start, "
          f"{elapsed:.0f} s"
          + (f"; removed from env: {', '.join(dropped)}" if dropped else ""))
    print()
    print(table.render())
    for note in table.notes:
        print()
        print(note)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
