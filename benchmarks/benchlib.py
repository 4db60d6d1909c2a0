"""What every benchmark section shares: the one table writer, paired statistics, the clean
environment, and the models, data and estimator makers each contender gets identically."""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SEED = 7
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def median(values):
    return statistics.median(values) if values else float("nan")


def rounds(opts, full, quick):
    """Rounds for a section: ``--rounds`` if given, else ``quick`` or ``full``."""
    return opts.rounds or (quick if opts.quick else full)


def interleaved_cli(doc, measure, table, rounds, calls, argv=None):
    """The command line of a benchmark of interleaved rounds of timed calls (``--rounds``,
    ``--calls``, ``--case``, ``--json``): prints ``table(measure(rounds, calls, case))``."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=calls, help="timed calls of 10 steps each")
    parser.add_argument("--case", help="only the cases whose name has this text")
    parser.add_argument("--json", help="also write raw measurements to this file")
    opts = parser.parse_args(argv)
    results = measure(opts.rounds, opts.calls, opts.case)
    print(table(results))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)


def tpu_env_vars():
    """Every variable that configures tpushim or names a TPU (tpushim's own lists)."""
    from tpushim import _detect, _settings

    return tuple(
        dict.fromkeys((*_settings.ENV_VARS.values(), "TPUSHIM_AUTOPATCH", *_detect.TPU_ENV_VARS))
    )


def clean_env(extra=None):
    """``os.environ`` without tpushim or TPU variables ("no TPU configured"), TF's C++ logs quiet."""
    drop = tpu_env_vars()
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.update(extra or {})
    return env


class Paired:
    """Per-round measurements of contenders run interleaved: ratios are taken round by round
    against the baseline's measurement in the same round, so drift in machine load cancels."""

    def __init__(self, values, baseline):
        self.values, self.baseline, self.base = values, baseline, values[baseline]

    def ratios(self, name, of=lambda v, b: v / b):
        return [of(v, b) for v, b in zip(self.values[name], self.base)]

    def ratio(self, name, of=lambda v, b: v / b):
        return median(self.ratios(name, of))

    def spread(self, name, of=lambda v, b: v / b, fmt="{:.3f}"):
        """The range of the per-round ratios, as text: the noise a median ratio sits in."""
        r = self.ratios(name, of)
        return (
            f"{fmt.format(min(r))}..{fmt.format(max(r))}"
            if len(r) > 1 and name != self.baseline
            else ""
        )


class Table:
    """Rows of (section, case, contender, median, ratio, spread, goal, verdict), rendered as one
    aligned text table; ``missed()`` lists the rows whose goal was not met."""

    HEAD = ("benchmark", "case", "contender", "median", "ratio", "spread", "goal", "ok")

    def __init__(self):
        self.rows = []
        self.notes = []

    def add(self, bench, case, contender, value, ratio="", goal="", ok=None, spread="", noise=None):
        """``ok``: None (no goal), True or False. ``noise``: for a missed goal, the stock-vs-stock
        spread (low, high) of the same case; a median inside it is marked as within the noise."""
        verdict = "" if ok is None else ("yes" if ok else "NO")
        if ok is False and noise and noise[0] <= _number(ratio) <= noise[1]:
            verdict = "NO (within stock-vs-stock spread)"
        self.rows.append((bench, case, contender, value, ratio, spread, goal, verdict))

    def missed(self):
        return [r for r in self.rows if r[-1].startswith("NO")]

    def render(self):
        widths = [
            max(len(str(r[i])) for r in self.rows + [self.HEAD]) for i in range(len(self.HEAD))
        ]
        line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
        out = [line(self.HEAD), line(["-" * w for w in widths])]
        last = None
        for row in self.rows:
            if last is not None and row[0] != last:
                out.append("")
            last = row[0]
            out.append(line(row))
        return "\n".join(out)


def _number(text):
    """The number a ratio cell starts with ("1.02x", "+0.5%", "+3.1 ms")."""
    m = re.match(r"\s*([-+]?[0-9.]+)", str(text))
    return float(m.group(1)) if m else float("nan")


def interleaved(contenders, reps, measure):
    """``{name: [value per round]}``: every contender once per round, the order rotating."""
    values = {name: [] for name, _ in contenders}
    for i in range(reps):
        shift = i % len(contenders)
        for name, arg in contenders[shift:] + contenders[:shift]:
            values[name].append(measure(arg))
    return values


def drive(script, *args, timeout=1800):
    """One run of a benchmark's driver in a fresh process: ``python SCRIPT WORKDIR ARGS`` (in a
    new temporary directory, WORKDIR, removed after; the clean environment; the repository on
    ``PYTHONPATH``). Returns the JSON of the last ``BENCH `` line it printed; raises, with its
    stderr's tail, if it failed or printed none."""
    name = os.path.splitext(os.path.basename(script))[0]
    with tempfile.TemporaryDirectory(prefix=f"{name}_") as workdir:
        proc = subprocess.run(
            [sys.executable, os.path.abspath(script), workdir, *map(str, args)],
            check=False,
            capture_output=True,
            text=True,
            env=clean_env({"PYTHONPATH": REPO}),
            cwd=workdir,
            timeout=timeout,
        )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("BENCH ")]
    if proc.returncode != 0 or not lines:
        what = " ".join(map(str, args))
        raise RuntimeError(f"{name} {what} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("BENCH ") :])


def time_engine_loop(record):
    """The strategy engine's training loop timed in this process (a driver's): after each call
    of the loop's ``tf.function``, ``record(its result, seconds)`` (its first call traces)."""
    from tpushim._strategy import step as _strategy_step

    original = _strategy_step._Run.train_function

    def train_function(self, *args, **kwargs):
        loop = original(self, *args, **kwargs)

        def timed(*args):
            start = time.perf_counter()
            result = loop(*args)
            record(result, time.perf_counter() - start)
            return result

        return timed

    _strategy_step._Run.train_function = train_function


# -- TensorFlow side: models, data, estimators ------------------------------------------------------


def tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow

    tensorflow.get_logger().setLevel("ERROR")
    import warnings

    warnings.filterwarnings("ignore", module="keras")
    return tensorflow


class ModelCase:
    """One model, its data and its training lengths; identical for every contender.

    ``metrics``: what the model is compiled with. ``only``: contender names run on this case
    (None: all).
    """

    def __init__(
        self,
        name,
        build_layers,
        input_shape,
        classes,
        n,
        batch,
        lr,
        warmup,
        measure,
        metrics=("accuracy",),
        only=None,
    ):
        self.name, self.build_layers, self.input_shape = name, build_layers, input_shape
        self.classes, self.n, self.batch, self.lr = classes, n, batch, lr
        self.warmup, self.measure, self.metrics, self.only = warmup, measure, metrics, only
        self._data = None

    def data(self):
        if self._data is None:
            import numpy as np

            rng = np.random.RandomState(0)
            x = rng.rand(self.n, *self.input_shape).astype("float32")
            y = rng.randint(0, self.classes, size=(self.n, 1)).astype("int64")
            self._data = (x, y)
        return self._data

    def keras_model(self, optimizer=None):
        t = tf()
        t.keras.backend.clear_session()
        t.keras.utils.set_random_seed(0)
        model = t.keras.Sequential([t.keras.Input(self.input_shape)] + self.build_layers())
        model.compile(
            optimizer=optimizer or t.keras.optimizers.legacy.SGD(self.lr),
            loss="sparse_categorical_crossentropy",
            metrics=list(self.metrics),
        )
        return model

    def apply_layers(self, features):
        """The same layers applied to a tensor, for the hand-written model_fns."""
        out = features
        for layer in self.build_layers():
            out = layer(out)
        return out

    def legacy_input_fn(self):
        """What a legacy script passes: no params, batches with a dynamic batch dimension."""
        t = tf()
        x, y = self.data()
        batch = self.batch
        return lambda: t.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)

    def params_input_fn(self):
        """What a hand-written TPUEstimator takes: params['batch_size'], static batches."""
        t = tf()
        x, y = self.data()

        def input_fn(params):
            return (
                t.data.Dataset.from_tensor_slices((x, y))
                .repeat()
                .batch(params["batch_size"], drop_remainder=True)
            )

        return input_fn


def _mlp_layers():
    L = tf().keras.layers
    return [
        L.Dense(16, activation="relu", name="hidden"),
        L.Dense(3, activation="softmax", name="probs"),
    ]


def _cnn_layers():
    L = tf().keras.layers
    return [
        L.Conv2D(16, 3, activation="relu", name="conv1"),
        L.MaxPooling2D(name="pool1"),
        L.Conv2D(32, 3, activation="relu", name="conv2"),
        L.MaxPooling2D(name="pool2"),
        L.Flatten(name="flat"),
        L.Dense(64, activation="relu", name="dense"),
        L.Dense(10, activation="softmax", name="probs"),
    ]


def mlp(quick, **kwargs):
    return ModelCase(
        "tiny MLP 4-16-3",
        _mlp_layers,
        (4,),
        3,
        4096,
        32,
        0.05,
        warmup=50 if quick else 100,
        measure=400 if quick else 2500,
        **kwargs,
    )


def cnn(quick):
    return ModelCase(
        "CNN 28x28x1 (MNIST-sized)",
        _cnn_layers,
        (28, 28, 1),
        10,
        2048,
        32,
        0.01,
        warmup=10 if quick else 20,
        measure=40 if quick else 300,
    )


def converted(mode):
    """``make(case, model_dir) -> (estimator, legacy input_fn)``: model_to_estimator with tpushim
    in ``mode`` (None: unpatched, the stock estimator)."""

    def make(case, model_dir):
        t = tf()
        import tpushim

        if mode is None:
            tpushim.unpatch()
        else:
            tpushim.patch(mode=mode)
        try:
            est = t.keras.estimator.model_to_estimator(
                keras_model=case.keras_model(),
                model_dir=model_dir,
                config=t.estimator.RunConfig(tf_random_seed=SEED),
            )
        finally:
            tpushim.unpatch()
        return est, case.legacy_input_fn()

    return make


class StepTimer:
    """Times steps warmup+1 .. warmup+measure of one train() call (after_run of each step)."""

    def __init__(self, warmup, measure):
        timer = self

        class Hook(tf().compat.v1.train.SessionRunHook):
            def after_run(hook, run_context, run_values):
                del run_context, run_values
                timer.steps += 1
                if timer.steps in (warmup, warmup + measure):
                    timer.marks[timer.steps] = time.perf_counter()

        self.hook, self.steps, self.marks = Hook(), 0, {}
        self.warmup, self.measure = warmup, measure

    def steps_per_sec(self):
        return self.measure / (self.marks[self.warmup + self.measure] - self.marks[self.warmup])


class ScratchDir:
    """A temporary folder this run creates and removes (model_dirs live in it)."""

    def __init__(self, prefix):
        self.path = tempfile.mkdtemp(prefix=prefix)

    def new(self):
        return tempfile.mkdtemp(dir=self.path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)


def import_tests_helper(name):
    """A helper module of ``tests/`` (e.g. the replica harness), imported from the repository."""
    tests = os.path.join(REPO, "tests")
    if tests not in sys.path:
        sys.path.append(tests)
    return __import__(name)
