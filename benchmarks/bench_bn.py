"""BatchNormalization-heavy models on a finite input (issue 36): MobileNetV2, ResNet50 and
EfficientNetB0 from ``keras.applications`` (``weights=None``, 64x64x3, 10 classes, Keras Adam),
trained by ``train(steps=3)`` on ``from_tensor_slices(...).batch(8)`` -- 20 rows (the third batch
short: tpushim pads it) and 24 rows (every batch full: not padded since #36's second round) --
by the stock estimator, the stock estimator again and tpushim's cpu mode, then evaluated on the
same rows.

Per run: the whole ``train()`` call's wall time and its parts (building the graph -- the model_fn
and the hooks --, creating the session, the 3 steps, closing the session and the last
checkpoint), the nodes of the graph.pbtxt written to model_dir counted with every function body,
its size, and the evaluated loss. Goals: cpu mode's train() <= 1.2x stock's, its graph's nodes
<= 1.2x, its loss within rel 1e-5 of stock's. The row "stock, short batch's pixels 1 float
apart" is stock trained on the same rows with the short batch's pixels moved to the next float:
the loss difference rounding alone makes on that model and optimizer (the noise floor a loss
comparison is judged against: with Adam, the biases before a BatchNormalization -- ResNet50's
convolutions have them -- have a gradient of 0 in exact arithmetic, and Adam steps them by the
sign of the rounding noise).

The TPU train step of each model (8 replicas, built on CPU with the tests' replica harness, never
run): live ops inside the replicate cluster -- what XLA compiles -- of tpushim's model_fn fed batches
with a padding weight and without, against a hand-written TPUEstimator model_fn for the same
Keras model fed with ``drop_remainder=True``. Goal: <= 1.05x. Exact counts, no rounds.

The same step's XLA compile time on CPU: the step (one shard's computation, 8 shards in its
shard context, the cross-replica sums an identity: the same for every contender) compiled by
``tf.xla.experimental.compile`` and run twice in a session, fed the same random batch; the first
run less the second is the compile, in wall seconds and in the process's CPU seconds (what the
compile itself spends, hardly moved by other processes on a shared machine, where the wall time
can double). Goal: <= 1.2x the hand-written's, rounds interleaved. Then the compiled step's run
time (the median of the runs after the compile: XLA's CPU code, for want of a TPU), reported
without a goal. MobileNetV2 only (one compile takes minutes on a shared 2-core machine).

``python -m tpushim check`` on a legacy script (MobileNetV2 as above, 20 rows by 8, ``train(steps=3)``
then ``evaluate``), against ``python script.py`` (stock) and ``python -m tpushim --mode cpu
script.py``, each a fresh process, interleaved. Goal: the check <= 1.5x stock's wall time.
"""

import os
import subprocess
import sys
import time

import benchlib

SECTION = "BatchNormalization models"
STOCK, STOCK_AGAIN, NUDGED, CPU = (
    "stock estimator",
    "stock estimator again",
    "stock, short batch's pixels 1 float apart",
    "tpushim cpu mode",
)
MODELS = ("MobileNetV2", "ResNet50", "EfficientNetB0")
SHAPE, CLASSES, BATCH, STEPS = (64, 64, 3), 10, 8, 3


def _model(name, optimizer=None):
    tf = benchlib.tf()
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = getattr(tf.keras.applications, name)(weights=None, input_shape=SHAPE, classes=CLASSES)
    optimizer = optimizer or tf.keras.optimizers.legacy.Adam(1e-3)
    model.compile(optimizer, "sparse_categorical_crossentropy")
    return model


def _data(rows, nudged=False):
    import numpy as np

    rng = np.random.RandomState(0)
    x = rng.rand(rows, *SHAPE).astype("float32")
    y = rng.randint(0, CLASSES, (rows, 1)).astype("int64")
    if nudged:
        short = rows - rows % BATCH
        x[short:] = np.nextafter(x[short:], np.float32(2))
    return x, y


def _input_fn(x, y):
    tf = benchlib.tf()
    return lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


class _Phases:
    """A training hook's timestamps: the graph built, the session created, the steps done."""

    def __init__(self):
        tf = benchlib.tf()
        times = self.times = {}

        class Hook(tf.estimator.SessionRunHook):
            def begin(self):
                times["built"] = time.perf_counter()

            def after_create_session(self, session, coord):
                times["session"] = time.perf_counter()

            def end(self, session):
                times["steps"] = time.perf_counter()

        self.hook = Hook()


def graph_nodes(model_dir):
    """(nodes incl. function bodies, bytes) of the graph.pbtxt an estimator wrote."""
    import glob
    import os

    from google.protobuf import text_format

    tf = benchlib.tf()
    path = glob.glob(os.path.join(model_dir, "graph.pbtxt"))[0]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    graph_def = text_format.Parse(text, tf.compat.v1.GraphDef())
    nodes = len(graph_def.node) + sum(len(fn.node_def) for fn in graph_def.library.function)
    return nodes, len(text.encode())


def measure(name, rows, contender, scratch):
    import tpushim

    tf = benchlib.tf()
    x, y = _data(rows, nudged=contender == NUDGED)
    model_dir = scratch.new()
    if contender == CPU:
        tpushim.patch(mode="cpu")
    try:
        est = tf.keras.estimator.model_to_estimator(
            keras_model=_model(name),
            model_dir=model_dir,
            config=tf.estimator.RunConfig(tf_random_seed=benchlib.SEED),
        )
    finally:
        if contender == CPU:
            tpushim.unpatch()
    phases = _Phases()
    start = time.perf_counter()
    est.train(_input_fn(x, y), steps=STEPS, hooks=[phases.hook])
    done = time.perf_counter()
    t = phases.times
    loss = est.evaluate(_input_fn(*_data(rows)))["loss"]
    nodes, size = graph_nodes(model_dir)
    return {
        "train": done - start,
        "build": t["built"] - start,
        "session": t["session"] - t["built"],
        "steps": t["steps"] - t["session"],
        "close": done - t["steps"],
        "nodes": nodes,
        "bytes": size,
        "loss": float(loss),
    }


HAND, SHIM_FULL, SHIM_PADDED = (
    "hand-written model_fn, drop_remainder=True",
    "tpushim, batches without padding",
    "tpushim, padded batches (a finite input)",
)


def tpu_step_ops(name, contender):
    """Live ops inside the replicate cluster of one TPU train step (8 replicas, 8 rows a core, built
    on CPU with the tests' replica harness, never run): a hand-written TPUEstimator model_fn (the
    Keras model, its loss object, CrossShardOptimizer(GradientDescent), the layers' updates) or
    tpushim's model_fn for the model compiled with GradientDescent, fed batches with or without
    a padding weight."""
    tf = benchlib.tf()
    replicas = benchlib.import_tests_helper("replicas")
    from tpushim import _model_fn, _padding

    if contender != HAND:
        gd = tf.compat.v1.train.GradientDescentOptimizer(0.01)
        model_fn = _model_fn.make_model_fn(_model(name, gd))
    else:
        tf.keras.backend.clear_session()

    def computation():
        features = tf.zeros([BATCH, *SHAPE])
        labels = tf.zeros([BATCH, 1], tf.int64)
        if contender == HAND:
            tf.keras.utils.set_random_seed(0)
            model = getattr(tf.keras.applications, name)(
                weights=None, input_shape=SHAPE, classes=CLASSES
            )
            loss = tf.keras.losses.SparseCategoricalCrossentropy()(
                labels, model(features, training=True)
            )
            optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(0.01)
            )
            minimize = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
            train_op = tf.group(minimize, *model.get_updates_for(features))
            loss = tf.compat.v1.tpu.cross_replica_sum(loss) / float(replicas.REPLICAS)
        else:
            if contender == SHIM_PADDED:
                weight = tf.ones([BATCH])
                features = {_padding.FEATURES_KEY: features, _padding.PADDING_KEY: weight}
            spec = model_fn(
                features,
                labels,
                tf.estimator.ModeKeys.TRAIN,
                params={"use_tpu": True, "batch_size": BATCH},
            )
            loss, train_op = spec.loss, spec.train_op
        with tf.control_dependencies([train_op]):
            return tf.identity(loss)

    graph, outputs = replicas.replicate(computation)
    live = replicas.live_ops([t for replica in outputs for t in replica])
    return sum(1 for op in replicas.cluster_ops(graph) if op in live)


class _ShardStep:
    """One shard's TPU train step as XLA compiles it (see the module), for :func:`xla_compile`."""

    def __init__(self, name, contender):
        from unittest import mock

        from tensorflow.python.tpu import tpu_function
        from tensorflow.python.tpu.ops import tpu_ops

        from tpushim import _model_fn, _padding

        tf = benchlib.tf()
        tf.keras.backend.clear_session()
        if contender != HAND:  # tpushim's model_fn clones the model in the step's graph
            gd = tf.compat.v1.train.GradientDescentOptimizer(0.01)
            model_fn = _model_fn.make_model_fn(_model(name, gd))
        self.graph = tf.Graph()
        one_shard = lambda x, *args, **kwargs: tf.identity(x)
        with (
            self.graph.as_default(),
            tpu_function.tpu_shard_context(8),
            mock.patch.object(tpu_ops, "cross_replica_sum", one_shard),
            mock.patch.object(tf.compat.v1.tpu, "cross_replica_sum", one_shard),
        ):
            tf.compat.v1.train.get_or_create_global_step()
            self.inputs = [
                tf.compat.v1.placeholder(tf.float32, [BATCH, *SHAPE]),
                tf.compat.v1.placeholder(tf.int64, [BATCH, 1]),
                tf.compat.v1.placeholder(tf.float32, [BATCH]),
            ]
            if contender == HAND:
                tf.keras.utils.set_random_seed(0)
                model = getattr(tf.keras.applications, name)(
                    weights=None, input_shape=SHAPE, classes=CLASSES
                )

            def computation(features, labels, weight):
                if contender == HAND:
                    loss = tf.keras.losses.SparseCategoricalCrossentropy()(
                        labels, model(features, training=True)
                    )
                    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
                        tf.compat.v1.train.GradientDescentOptimizer(0.01)
                    )
                    minimize = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
                    train_op = tf.group(minimize, *model.get_updates_for(features))
                else:
                    if contender == SHIM_PADDED:
                        features = {_padding.FEATURES_KEY: features, _padding.PADDING_KEY: weight}
                    spec = model_fn(
                        features,
                        labels,
                        tf.estimator.ModeKeys.TRAIN,
                        params={"use_tpu": True, "batch_size": BATCH},
                    )
                    loss, train_op = spec.loss, spec.train_op
                with tf.control_dependencies([train_op]):
                    return tf.identity(loss)

            self.outputs = tf.xla.experimental.compile(computation, self.inputs)
            self.init = tf.compat.v1.global_variables_initializer()

    def compile_seconds(self):
        """``(wall s, CPU s)`` of the compile: the first run's less the second's; then the
        compiled step's wall seconds, the median of the later runs (XLA's code on CPU: what the
        step's compiled form costs to run, for want of a TPU)."""
        import numpy as np

        tf = benchlib.tf()
        rng = np.random.RandomState(0)
        values = [
            rng.rand(BATCH, *SHAPE).astype("float32"),
            rng.randint(0, CLASSES, (BATCH, 1)).astype("int64"),
            np.array([1.0] * (BATCH - 3) + [0.0] * 3, np.float32),  # a short batch's weight
        ]
        feed = dict(zip(self.inputs, values))
        with tf.compat.v1.Session(graph=self.graph) as session:
            session.run(self.init)
            runs = []
            for _ in range(2 + STEP_RUNS):
                start, cpu = time.perf_counter(), time.process_time()
                session.run(self.outputs, feed)
                runs.append((time.perf_counter() - start, time.process_time() - cpu))
        step = sorted(wall for wall, _ in runs[1:])[len(runs[1:]) // 2]
        return runs[0][0] - runs[1][0], runs[0][1] - runs[1][1], step


def _xla_warm_up():
    tf = benchlib.tf()
    with tf.Graph().as_default() as graph:
        out = tf.xla.experimental.compile(lambda: tf.constant(1.0) + 1.0)
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(out)


#: Runs of the compiled step after the compile, for its run time (the median, the second run on).
STEP_RUNS = 8


def xla_compile(name, contender):
    """``(wall s, CPU s)`` XLA takes to compile one shard's TPU train step on CPU (see the
    module), and the compiled step's run time in wall seconds."""
    return _ShardStep(name, contender).compile_seconds()


SCRIPT = '''"""A legacy script: a Keras application on a finite input, converted and trained."""
import sys

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(0)
model = getattr(tf.keras.applications, sys.argv[2])(
    weights=None, input_shape=(64, 64, 3), classes=10
)
model.compile(tf.keras.optimizers.legacy.Adam(1e-3), "sparse_categorical_crossentropy")
rng = np.random.RandomState(0)
x = rng.rand(20, 64, 64, 3).astype("float32")
y = rng.randint(0, 10, (20, 1)).astype("int64")


def input_fn():
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8)


estimator = tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=sys.argv[1])
estimator.train(input_fn, steps=3)
print(estimator.evaluate(input_fn))
'''

SCRIPT_STOCK, SCRIPT_CPU, SCRIPT_CHECK = (
    "python script.py (stock)",
    "python -m tpushim --mode cpu script.py",
    "python -m tpushim check script.py",
)


def script_seconds(name, contender, scratch):
    """Wall seconds of one fresh process running the legacy script on model ``name``."""
    folder = scratch.new()
    script = os.path.join(folder, "script.py")
    with open(script, "w", encoding="utf-8") as f:
        f.write(SCRIPT)
    prefix = {
        SCRIPT_STOCK: [],
        SCRIPT_CPU: ["-m", "tpushim", "--mode", "cpu"],
        SCRIPT_CHECK: ["-m", "tpushim", "check"],
    }[contender]
    argv = [sys.executable, *prefix, script, os.path.join(folder, "model"), name]
    start = time.perf_counter()
    subprocess.run(
        argv, env=benchlib.clean_env(), cwd=folder, check=True, capture_output=True, text=True
    )
    return time.perf_counter() - start


def run(table, opts, report):
    """The ``bn`` section: training on CPU, then :func:`run_step` and :func:`run_check`."""
    reps = benchlib.rounds(opts, full=2, quick=1)
    report.setdefault("bn", {})
    with benchlib.ScratchDir("tpushim-bench-bn-") as scratch:
        for name in _models(opts):
            for rows in (20, 24):
                contenders = [STOCK, STOCK_AGAIN, CPU] + ([NUDGED] if rows % BATCH else [])
                values = benchlib.interleaved(
                    [(c, c) for c in contenders],
                    reps,
                    lambda c, name=name, rows=rows: measure(name, rows, c, scratch),
                )
                report["bn"][f"{name} {rows}"] = values
                _rows(table, name, rows, contenders, values)
    run_step(table, opts, report)
    run_check(table, opts, report)


def _models(opts):
    return MODELS[:1] if opts.quick else MODELS


def run_step(table, opts, report):
    """Part ``bn-step``: the TPU train step's ops (exact) and its XLA compile time."""
    report.setdefault("bn", {})
    models = _models(opts)
    for name in models:
        ops = {c: tpu_step_ops(name, c) for c in (HAND, SHIM_FULL, SHIM_PADDED)}
        report["bn"][f"{name} TPU step"] = ops
        label = f"{name} 64x64, TPU train step, 8 replicas x {BATCH} rows"
        for c, n in ops.items():
            ratio = n / ops[HAND]
            goal = c != HAND
            table.add(
                SECTION,
                label,
                f"{c}: live ops in the replicate cluster",
                str(n),
                f"{ratio:.3f}x",
                "<= 1.05x" if goal else "",
                (ratio <= 1.05) if goal else None,
            )
    # MobileNetV2 only: one compile of a step takes minutes on a shared 2-core machine.
    _xla_rows(table, opts, report, models[:1])


def run_check(table, opts, report):
    """Part ``bn-check``: ``python -m tpushim check`` against the script run as it is."""
    report.setdefault("bn", {})
    with benchlib.ScratchDir("tpushim-bench-bn-check-") as scratch:
        _check_rows(table, opts, report, scratch)


def _xla_rows(table, opts, report, models):
    _xla_warm_up()  # XLA's own start-up, once, before anything is timed
    for name in models:
        contenders = (HAND, SHIM_FULL, SHIM_PADDED)
        both = benchlib.interleaved(
            [(c, c) for c in contenders],
            benchlib.rounds(opts, full=3, quick=1),
            lambda c, name=name: xla_compile(name, c),
        )
        label = f"{name} 64x64, one shard's TPU train step compiled by XLA on CPU"
        for i, what in enumerate(("XLA compile s", "XLA compile CPU s", "compiled step s")):
            values = {c: [pair[i] for pair in both[c]] for c in contenders}
            report["bn"][f"{name} {what}"] = values
            paired = benchlib.Paired(values, HAND)
            for c in contenders:
                goal = c != HAND and what != "compiled step s"  # the step's run: reported only
                table.add(
                    SECTION,
                    label,
                    f"{c}: {what}",
                    f"{benchlib.median(values[c]):.3f}",
                    f"{paired.ratio(c):.2f}x",
                    "<= 1.2x" if goal else "",
                    (paired.ratio(c) <= 1.2) if goal else None,
                    spread=paired.spread(c, fmt="{:.2f}"),
                )


def _check_rows(table, opts, report, scratch):
    name = MODELS[0]
    contenders = (SCRIPT_STOCK, SCRIPT_CPU, SCRIPT_CHECK)
    values = benchlib.interleaved(
        [(c, c) for c in contenders],
        benchlib.rounds(opts, full=3, quick=1),
        lambda c: script_seconds(name, c, scratch),
    )
    report["bn"][f"{name} check"] = values
    paired = benchlib.Paired(values, SCRIPT_STOCK)
    label = f"{name} 64x64 script, 20 rows by 8, train(steps=3) + evaluate, a fresh process"
    for c in contenders:
        goal = c == SCRIPT_CHECK
        table.add(
            SECTION,
            label,
            f"{c}: wall s",
            f"{benchlib.median(values[c]):.1f}",
            f"{paired.ratio(c):.2f}x",
            "<= 1.5x" if goal else "",
            (paired.ratio(c) <= 1.5) if goal else None,
            spread=paired.spread(c, fmt="{:.2f}"),
        )


def _rows(table, name, rows, contenders, values):
    median = benchlib.median
    short = f"{rows % BATCH}-row last batch" if rows % BATCH else "all batches full"
    label = f"{name} 64x64, {rows} rows by {BATCH} ({short}), train(steps={STEPS})"
    walls = benchlib.Paired({c: [v["train"] for v in values[c]] for c in contenders}, STOCK)
    noise = walls.ratios(STOCK_AGAIN)
    stock = values[STOCK][0]
    for c in contenders:
        runs = values[c]
        parts = "/".join(
            f"{median([r[k] for r in runs]):.1f}" for k in ("build", "session", "steps", "close")
        )
        wall_ratio = walls.ratio(c)
        nodes = runs[0]["nodes"]
        loss = runs[0]["loss"]
        rel = abs(loss - stock["loss"]) / abs(stock["loss"])
        goal = c == CPU
        table.add(
            SECTION,
            label,
            f"{c}: train() s (build/session/steps/close s)",
            f"{median([r['train'] for r in runs]):.1f} ({parts})",
            f"{wall_ratio:.2f}x",
            "<= 1.2x" if goal else "",
            (wall_ratio <= 1.2) if goal else None,
            spread=walls.spread(c),
            noise=(min(noise), max(noise)),
        )
        table.add(
            SECTION,
            label,
            f"{c}: graph.pbtxt nodes incl. functions (MB)",
            f"{nodes} ({runs[0]['bytes'] / 1e6:.1f} MB)",
            f"{nodes / stock['nodes']:.2f}x",
            "<= 1.2x" if goal else "",
            (nodes / stock["nodes"] <= 1.2) if goal else None,
        )
        table.add(
            SECTION,
            label,
            f"{c}: evaluated loss",
            f"{loss:.7g}",
            f"rel {rel:.1e}",
            "<= 1e-5" if goal else "",
            (rel <= 1e-5) if goal else None,
        )
