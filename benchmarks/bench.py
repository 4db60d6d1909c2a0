"""tpushim benchmarks: every ratio measured side by side in one run, interleaved, median reported.

    python benchmarks/bench.py            # full run, about 4-5 minutes on 2 CPU cores
    python benchmarks/bench.py --quick    # smoke run, under a minute
    python benchmarks/bench.py --only train,graph --json /tmp/bench.json

Sections (``--only`` takes their names):

* ``startup``: ``import tpushim; tpushim.patch()`` before TensorFlow against a bare interpreter
  (``python -c pass``), in fresh subprocesses, interleaved; whether TensorFlow got imported; and a
  ``python -X importtime`` breakdown of what the import costs. Goal: <= 5 ms added, no TensorFlow.
* ``wrapper``: ``model_to_estimator`` patched in auto mode with no TPU against the unpatched call
  (same model, fresh model_dir per call), interleaved; plus the wrapper alone around a no-op
  stand-in, which is the part of the difference that is the wrapper's own. Goal: <= 1% added.
* ``train``: steady-state training steps/s and examples/s of the stock estimator, tpushim auto mode
  (no TPU: must be stock), tpushim cpu mode and a hand-written TPUEstimator(use_tpu=False) model_fn,
  on a tiny MLP and an MNIST-sized CNN (synthetic data). Graph building, session start and the
  final checkpoint are excluded: a hook times steps W+1 .. W+M inside one ``train()`` call.
  Goals: auto >= 0.99x stock, cpu >= 0.9x stock.
* ``graph``: ops of tpushim's TRAIN model_fn (``params['use_tpu']=True``) replicated over 8
  replicas with ``tf.compat.v1.tpu.replicate`` (built on CPU, never run) against a hand-written
  minimal TPU model_fn for the same model: ops in the whole graph, ops inside the replicate
  cluster, and the cluster's live ops (those the replicated outputs depend on). Goal: <= 1.02x.

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
              "'numpy') if m in sys.modules)))")


def _repo_of_tpushim():
    return os.path.dirname(os.path.dirname(importlib.util.find_spec("tpushim").origin))


def _cached_env(pycache, pythonpath=None, no_site=False):
    """An environment whose imports read bytecode from ``pycache`` (written there on a warm-up
    run, never into the source tree), as after ``pip install``, whatever PYTHONDONTWRITEBYTECODE
    says here. ``no_site``: PYTHONPATH for ``python -S`` (the tree holding tpushim, and wrapt's)."""
    env = _clean_env({"PYTHONPYCACHEPREFIX": pycache})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    paths = [pythonpath] if pythonpath else []
    if no_site:
        paths.append(pythonpath or _repo_of_tpushim())
        paths.append(os.path.dirname(os.path.dirname(importlib.util.find_spec("wrapt").origin)))
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _time_subprocess(cmd, env):
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _interleaved_startup(variants, reps):
    """variants: name -> (argv, env). Each repetition runs every variant once, rotating the order."""
    times = {name: [] for name in variants}
    names = list(variants)
    for i in range(reps):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            times[name].append(_time_subprocess(*variants[name]))
    return times


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
    per_module = {}
    order = None
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-c", SHIM_CODE], env=env,
                              capture_output=True, text=True, check=True)
        rows = parse_importtime(proc.stderr)
        if order is None:
            order = rows
        for name, _, self_us, cum_us in rows:
            per_module.setdefault(name, []).append((self_us, cum_us))
    summary = [(name, depth, median([s for s, _ in per_module[name]]),
                median([c for _, c in per_module[name]])) for name, depth, _, _ in order]
    return summary


def _startup_rows(table, case, variants, reps, env, goal_rows):
    """Times ``variants`` (label -> argv, or (argv, env)) interleaved, the first being the
    baseline; adds the rows."""
    variants = {k: (v if isinstance(v, tuple) else (v, env)) for k, v in variants.items()}
    for argv, var_env in variants.values():  # warm-up: writes the bytecode cache, fills file caches
        for _ in range(2):
            subprocess.run(argv, env=var_env, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    times = _interleaved_startup(variants, reps)
    labels = list(variants)
    base = median(times[labels[0]]) * 1e3
    table.add("start-up", case, labels[0], f"{base:.1f} ms")
    for label in labels[1:]:
        ms = median(times[label]) * 1e3
        goal = label in goal_rows
        table.add("start-up", case, label, f"{ms:.1f} ms", f"+{ms - base:.1f} ms",
                  "<= +5 ms" if goal else "", (ms - base <= 5.0) if goal else None)
    return times


def bench_startup(table, quick, report, compare_tree=None):
    reps = 15 if quick else 60
    pycache = tempfile.mkdtemp(prefix="tpushim-bench-pycache-")
    try:
        env = _cached_env(pycache)
        check = subprocess.run([sys.executable, "-c", CHECK_CODE], env=env, capture_output=True,
                               text=True, check=True).stdout.strip()
        heavy_modules = json.loads(check.splitlines()[-1])
        tf_imported = "tensorflow" in heavy_modules
        py = sys.executable
        variants = {"python -c pass": [py, "-c", "pass"],
                    "import tpushim": [py, "-c", IMPORT_CODE],
                    SHIM_CODE: [py, "-c", SHIM_CODE]}
        goal_rows = {SHIM_CODE}
        if compare_tree:
            # A prototype tree, interleaved with the rest: PYTHONPATH puts it before the install.
            proto = f"PYTHONPATH={compare_tree} {SHIM_CODE}"
            variants[proto] = ([py, "-c", SHIM_CODE], _cached_env(pycache, compare_tree))
            goal_rows.add(proto)
        times = _startup_rows(table, f"bytecode cached, {reps} runs", variants, reps, env, goal_rows)
        report["startup"] = {"reps": reps, "heavy_modules": heavy_modules, "times_s": times}
        table.add("start-up", "modules after patch()", SHIM_CODE,
                  ", ".join(heavy_modules) or "no tensorflow/keras/numpy", "", "no tensorflow",
                  not tf_imported)
        # No .pth file preloads stdlib modules under -S (this machine's site imports certifi, and
        # with it pathlib, typing, re, ...): the cost on a lean interpreter.
        ns_variants = {"python -S -c pass": [py, "-S", "-c", "pass"],
                       "python -S: " + SHIM_CODE: [py, "-S", "-c", SHIM_CODE]}
        ns_env = _cached_env(pycache, no_site=True)
        if compare_tree:
            ns_variants[f"python -S, PYTHONPATH={compare_tree}"] = (
                [py, "-S", "-c", SHIM_CODE], _cached_env(pycache, compare_tree, no_site=True))
        _startup_rows(table, f"python -S (no site), {reps} runs", ns_variants, reps, ns_env,
                      set(list(ns_variants)[1:]))
        # As this checkout runs by default when PYTHONDONTWRITEBYTECODE is set (as on this
        # machine): an editable install with no bytecode compiles tpushim at every start.
        raw_env = _clean_env()
        if raw_env.get("PYTHONDONTWRITEBYTECODE"):
            _startup_rows(table, f"PYTHONDONTWRITEBYTECODE=1, no tpushim bytecode, {reps} runs",
                          {"python -c pass": [py, "-c", "pass"], SHIM_CODE: [py, "-c", SHIM_CODE]},
                          reps, raw_env, set())
        breakdown = importtime_breakdown(3 if quick else 7, env)
    finally:
        shutil.rmtree(pycache, ignore_errors=True)
    report["startup_importtime"] = breakdown
    lines = ["python -X importtime -c \"import tpushim; tpushim.patch()\" (bytecode cached; median "
             "of runs; us; only the imports after site):",
             f"  {'self':>7} {'cumul':>7}  module"]
    for name, depth, self_us, cum_us in breakdown:
        if depth <= 2 or self_us >= 300:
            lines.append(f"  {self_us:7.0f} {cum_us:7.0f}  {'  ' * depth}{name}")
    top = sorted(breakdown, key=lambda r: -r[2])[:8]
    lines.append("  largest self times: " + ", ".join(f"{n} {s:.0f}us" for n, _, s, _ in top))
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
                  warmup=10 if quick else 20, measure=40 if quick else 200),
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
    reps = 6 if quick else 30
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
    table.add("model_to_estimator", case_name, "tpushim auto, no TPU", f"{auto:.1f} ms/call",
              f"{auto / stock:.3f}x", "<= 1.01x", auto / stock <= 1.01)
    table.add("model_to_estimator", case_name, "  median of paired differences",
              f"{median(diffs) * 1e3:+.2f} ms", f"{median(diffs) * 1e3 / stock * 100:+.2f}%")
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


def _hand_written(case, model_dir):
    tf = _tf()
    tpu = tf.compat.v1.estimator.tpu
    est = tpu.TPUEstimator(model_fn=hand_model_fn(case), use_tpu=False,
                           train_batch_size=case.batch, eval_batch_size=case.batch,
                           predict_batch_size=case.batch,
                           config=tpu.RunConfig(tf_random_seed=SEED, model_dir=model_dir))
    return est, case.params_input_fn()


CONTENDERS = [
    Contender("stock estimator", _converted(None)),
    Contender("tpushim auto (no TPU)", _converted("auto"), (0.99, ">= 0.99x")),
    Contender("tpushim cpu mode", _converted("cpu"), (0.90, ">= 0.90x")),
    Contender("hand-written TPUEstimator(use_tpu=False)", _hand_written),
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
    reps = 2 if quick else 5
    root = tempfile.mkdtemp(prefix="tpushim-bench-train-")
    report["train"] = {}
    try:
        for case in model_cases(quick):
            rates = {c.name: [] for c in CONTENDERS}
            kinds = {}
            for i in range(reps):  # interleaved: every contender once per repetition, rotating
                order = CONTENDERS[i % len(CONTENDERS):] + CONTENDERS[:i % len(CONTENDERS)]
                for contender in order:
                    rate, kind = measure_training(contender, case, root)
                    rates[contender.name].append(rate)
                    kinds[contender.name] = kind
            stock = median(rates[CONTENDERS[0].name])
            label = f"{case.name}, batch {case.batch}, {case.measure} steps x{reps}"
            for contender in CONTENDERS:
                rate = median(rates[contender.name])
                ratio = rate / stock
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
            "graph": bench_graph}


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
