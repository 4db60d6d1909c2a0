"""The JAX engine against a hand-written JAX training step of the same model, side by side on
the same 8 XLA CPU devices, in ONE process.

Both train the same Keras model from the same starting weights on the same batches of the same
input_fn (a ``Dataset`` of numpy arrays, ``batch(B).repeat()``): the engine through ``train()``
of the converted estimator (``tpushim.patched(mode="cpu", engine="jax")``: the input read in
TensorFlow on the host, the step converted with tf2jax), the hand-written step a ``jax.jit`` of
the same forward pass written in ``jax.numpy`` (the Keras weights' starting values), the same
loss (the mean of categorical crossentropy over the global batch), the same optimizer update
(legacy SGD with momentum: ``ResourceApplyKerasMomentum``), the same sharding (a one-axis mesh
over the 8 devices, the global batch split, weights replicated) and the same iterations per
call (``jax.lax.scan`` over ``PER_CALL`` stacked batches), its batches read from the same
Dataset with ``as_numpy_iterator()``.

Cases: the demo's MLP (20-32-3, batch 64), a larger one (784-1024-1024-1024-10, batch 256), and
that one with a seeded ``Dropout(0.5)`` after each hidden layer: the engine draws the masks on
the host with stock's TensorFlow ops and feeds them to the devices (stock's numbers); the
hand-written step draws them on the devices with ``jax.random`` (a threefry key split per step),
which is what drawing in JAX would cost instead.

Measured, per contender and round (contenders interleaved, the order rotating: hand-written,
hand-written again (the noise), the engine):

- steady steps/s: the steps of every compiled call after the first over the time those calls
  took, input included (the engine's: timed around its host reading and each
  :meth:`tpushim._jax._step.Trainer.train` call; the hand-written: around its reading, stacking
  and call). Goal: the engine >= 0.95x.
- first compile, seconds: what runs before the first step, timed ahead of time (each
  round's own model, so nothing is cached): the hand-written step's JAX trace and XLA
  compile; the engine's Keras step traced in TensorFlow, converted with tf2jax, traced by JAX
  and compiled (also shown: its XLA compile alone). Goal: the engine <= 1.2x.

Every round is in one process (the 8 XLA devices are fixed when jax starts), so the machine's
load drifts alike for all contenders; on a machine shared with other work, the interleaved
ratios are the numbers to read, not the absolute steps/s.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/bench_jax.py \\
        [--quick] [--rounds N] [--json FILE]
"""

import argparse
import json
import os
import sys
import tempfile
import time

if "jax" not in sys.modules:  # 8 XLA CPU devices, as 8 TPU cores
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree's
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib

STEP_GOAL, COMPILE_GOAL = 0.95, 1.2
PER_CALL = 10
HAND, HAND_AGAIN, ENGINE = "hand-written jax.jit", "hand-written again", "tpushim JAX engine"


class Case:
    """One model and its data: ``widths`` the Dense layers (relu, the last softmax)."""

    def __init__(self, name, features, widths, batch, calls, rows=4096, dropout=0.0):
        self.name, self.features, self.widths = name, features, widths
        self.batch, self.calls, self.rows, self.dropout = batch, calls, rows, dropout

    @property
    def steps(self):
        return self.calls * PER_CALL

    def data(self):
        import numpy as np

        rng = np.random.RandomState(0)
        x = rng.randn(self.rows, self.features).astype(np.float32)
        labels = rng.randint(0, self.widths[-1], self.rows)
        return x, np.eye(self.widths[-1], dtype=np.float32)[labels]

    def keras_model(self):
        tf = benchlib.tf()
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        layers = [tf.keras.Input((self.features,))]
        for i, width in enumerate(self.widths):
            last = i == len(self.widths) - 1
            layers.append(
                tf.keras.layers.Dense(
                    width, activation="softmax" if last else "relu", name=f"dense_{i}"
                )
            )
            if self.dropout and not last:
                layers.append(tf.keras.layers.Dropout(self.dropout, seed=i, name=f"drop_{i}"))
        model = tf.keras.Sequential(layers)
        model.compile(
            tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9), "categorical_crossentropy"
        )
        return model

    def input_fn(self):
        tf = benchlib.tf()
        x, y = self.data()
        return lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(self.batch).repeat()


def cases(quick, tiny=False, only=None):
    if tiny:  # the test's: seconds
        return [Case("MLP 8-16-3", 8, (16, 3), 16, 3, rows=256)]
    calls = 4 if quick else 20
    big = (784, (1024, 1024, 1024, 10), 256, max(calls // 2, 3))
    every = [
        Case("demo MLP 20-32-3, batch 64", 20, (32, 3), 64, calls),
        Case("MLP 784-1024x3-10, batch 256", *big),
        Case("MLP 784-1024x3-10 + Dropout(0.5), batch 256", *big, dropout=0.5),
    ]
    return [c for c in every if only is None or only in c.name]


# -- the hand-written step -----------------------------------------------------------------------


def hand_written(case, model):
    """``train(numpy batches iterator) -> [(steps, seconds) per call]``: the hand-written step
    (see the module), from ``model``'s starting weights."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.local_devices()), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    stacked = NamedSharding(mesh, PartitionSpec(None, "data"))
    dense = [d for d in model.layers if d.get_weights()]
    params = [(np.asarray(k), np.asarray(b)) for k, b in (d.get_weights() for d in dense)]
    lr, momentum = jnp.float32(0.05), jnp.float32(0.9)
    eps = 1e-7  # Keras's backend epsilon, clipping the probabilities as its crossentropy
    rate = case.dropout

    def loss_fn(params, x, y, key):
        h = x
        for i, (kernel, bias) in enumerate(params):
            h = h @ kernel + bias
            h = jax.nn.softmax(h) if i == len(params) - 1 else jax.nn.relu(h)
            if rate and i < len(params) - 1:  # drawn on the devices
                keep = jax.random.bernoulli(jax.random.fold_in(key, i), 1 - rate, h.shape)
                h = jnp.where(keep, h / (1 - rate), 0)
        p = jnp.clip(h / jnp.sum(h, -1, keepdims=True), eps, 1 - eps)
        return jnp.mean(-jnp.sum(y * jnp.log(p), -1))

    def step(carry, batch):
        params, accums, key = carry
        key, drawn = jax.random.split(key)
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch, drawn)
        accums = jax.tree.map(lambda a, g: a * momentum - lr * g, accums, grads)
        params = jax.tree.map(lambda p, a: p + a, params, accums)
        return (params, accums, key), loss

    loop = jax.jit(
        lambda params, accums, key, xs, ys: jax.lax.scan(step, (params, accums, key), (xs, ys)),
        in_shardings=(replicated, replicated, replicated, stacked, stacked),
        out_shardings=((replicated, replicated, replicated), replicated),
        donate_argnums=(0, 1),
    )

    def start():
        zeros = jax.tree.map(np.zeros_like, params)
        return jax.device_put((params, zeros, jax.random.key_data(jax.random.key(0))), replicated)

    def compile_seconds(batches):
        """Tracing and XLA's compile of the step, ahead of time (the first call's extra)."""
        state = start()
        chunk = [next(batches) for _ in range(PER_CALL)]
        xs, ys = np.stack([x for x, _ in chunk]), np.stack([y for _, y in chunk])
        began = time.perf_counter()
        loop.lower(*state, xs, ys).compile()
        return time.perf_counter() - began

    def train(batches, steps):
        state = start()
        calls = []
        for _ in range(steps // PER_CALL):
            began = time.perf_counter()
            chunk = [next(batches) for _ in range(PER_CALL)]
            xs, ys = np.stack([x for x, _ in chunk]), np.stack([y for _, y in chunk])
            state, losses = loop(*state, xs, ys)
            np.asarray(losses)  # the engine reads every call's losses (its loss lines)
            calls.append((PER_CALL, time.perf_counter() - began))
        return calls

    train.compile_seconds = compile_seconds
    return train


def _hand_run(case):
    """(steady steps/s, compile seconds, None)."""
    model = case.keras_model()
    train = hand_written(case, model)
    compile_seconds = train.compile_seconds(case.input_fn()().as_numpy_iterator())
    batches = case.input_fn()().as_numpy_iterator()
    return _steady(train(batches, case.steps)), compile_seconds, None


def _engine_compile(case):
    """(seconds of the engine's conversion and XLA compile of the step, of the XLA compile
    alone): what the engine does before its first step (:class:`tpushim._jax._step.Trainer`:
    the Keras step traced in TensorFlow, converted with tf2jax, traced by JAX and compiled)."""
    import jax
    import numpy as np

    from tpushim._jax import _step

    model = case.keras_model()
    batches = case.input_fn()().as_numpy_iterator()
    chunk = [next(batches) for _ in range(PER_CALL)]
    start = time.perf_counter()
    trainer = _step.Trainer(model, case.batch)
    padded = [_step.pad_batch(([x], [y], None), case.batch) for x, y in chunk]
    traced, loop = trainer._convert(padded[0])
    trainer._start(traced)
    if traced.draws:  # the host's draws, as the engine's first call makes them
        padded = [(*p, [np.zeros(d.shape, d.dtype) for d in traced.draws]) for p in padded]
    stacked = jax.tree_util.tree_map(lambda *a: np.stack(a), *padded)
    lowered = loop.lower(trainer.params, trainer.stats, trainer.opt_state, stacked)
    xla = time.perf_counter()
    lowered.compile()
    end = time.perf_counter()
    return end - start, end - xla


# -- the engine ----------------------------------------------------------------------------------


def _engine_run(case, workdir):
    """[(steps, seconds) per call] of the engine's ``train()``: each call's host input and its
    compiled step (the first call with the conversion and the compile)."""
    import tpushim
    from tpushim._jax import _step

    tf = benchlib.tf()
    calls = []
    original_train, original_check = _step.Trainer.train, _step.Trainer.check
    clock = {"since": None}

    def check(self, batch):  # the conversion: the first call's
        clock["since"] = time.perf_counter()
        return original_check(self, batch)

    def train(self, batches):
        losses = original_train(self, batches)
        now = time.perf_counter()
        calls.append((len(losses), now - clock["since"]))
        clock["since"] = now  # the next call's host reading counts in the next call
        return losses

    _step.Trainer.train, _step.Trainer.check = train, check
    try:
        with tpushim.patched(mode="cpu", engine="jax", iterations_per_loop=PER_CALL, quiet=True):
            estimator = tf.keras.estimator.model_to_estimator(
                keras_model=case.keras_model(),
                model_dir=tempfile.mkdtemp(dir=workdir),
                config=tf.estimator.RunConfig(
                    save_checkpoints_steps=None,
                    save_checkpoints_secs=None,
                    log_step_count_steps=None,
                ),
            )
        estimator.train(case.input_fn(), steps=case.steps)
    finally:
        _step.Trainer.train, _step.Trainer.check = original_train, original_check
    return calls


def _steady(calls):
    """Steady steps/s of [(steps, seconds) per call]: every call after the first."""
    steady = calls[1:]
    return sum(n for n, _ in steady) / sum(s for _, s in steady)


def measure(quick=False, rounds=3, tiny=False, only=None):
    """``{case name: {contender: [(steps/s, compile s, XLA compile s or None) per round]}}``,
    in this process."""
    import tpushim

    tpushim.patch()  # before TensorFlow: tf.keras is tf-keras, tf.estimator tpushim's
    benchlib.tf()
    import jax

    if jax.local_device_count() != 8:
        raise SystemExit(f"8 XLA devices wanted, jax sees {jax.local_device_count()}")
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench_jax_") as workdir:
        for case in cases(quick, tiny, only):
            contenders = [(HAND, "hand"), (HAND_AGAIN, "hand"), (ENGINE, "engine")]

            def one(kind, case=case):
                if kind == "hand":
                    return _hand_run(case)
                return (_steady(_engine_run(case, workdir)), *_engine_compile(case))

            out[case.name] = benchlib.interleaved(contenders, rounds, one)
    return out


def add_rows(table, results):
    """The table's rows: per case, steady steps/s and first compile, each against the
    hand-written step's, with the hand-written-again row as the noise."""
    for case, runs in results.items():
        steps = benchlib.Paired({n: [r[0] for r in v] for n, v in runs.items()}, HAND)
        compile_ = benchlib.Paired({n: [r[1] for r in v] for n, v in runs.items()}, HAND)
        for what, paired, fmt, goal, ok in (
            ("steady steps/s", steps, "{:.1f}", f">= {STEP_GOAL}x", lambda r: r >= STEP_GOAL),
            (
                "first compile s",
                compile_,
                "{:.2f}",
                f"<= {COMPILE_GOAL}x",
                lambda r: r <= COMPILE_GOAL,
            ),
        ):
            noise = paired.ratios(HAND_AGAIN)
            for name in runs:
                engine = name == ENGINE
                table.add(
                    "jax",
                    f"{case}, 8 devices, {PER_CALL} steps a call: {what}",
                    name,
                    fmt.format(benchlib.median(paired.values[name])),
                    f"{paired.ratio(name):.3f}x" if name != HAND else "",
                    goal=goal if engine else "",
                    ok=ok(paired.ratio(name)) if engine else None,
                    spread=paired.spread(name),
                    noise=(min(noise), max(noise)) if engine else None,
                )
        xla = [r[2] for r in runs[ENGINE]]
        table.add(
            "jax",
            f"{case}, 8 devices, {PER_CALL} steps a call: first compile s",
            f"{ENGINE}: XLA's compile alone",
            f"{benchlib.median(xla):.2f}",
            f"{benchlib.median([x / h[1] for x, h in zip(xla, runs[HAND])]):.3f}x",
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few calls per run")
    parser.add_argument("--tiny", action="store_true", help="one tiny model (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5)")
    parser.add_argument("--json", help="also write raw measurements to this file")
    parser.add_argument("--case", help="only the cases whose name has this text (e.g. Dropout)")
    opts = parser.parse_args(argv)
    rounds = opts.rounds or (2 if opts.quick or opts.tiny else 5)
    results = measure(opts.quick, rounds, opts.tiny, opts.case)
    table = benchlib.Table()
    add_rows(table, results)
    table.notes.append(
        f"jax: {rounds} round(s) in one process on 8 XLA CPU devices, contenders interleaved, "
        "order rotating; medians of the per-round ratios against the hand-written step."
    )
    print(
        f"tpushim JAX engine benchmark ({'tiny' if opts.tiny else 'quick' if opts.quick else 'full'}):"
    )
    print(table.render())
    missed = len(table.missed())
    print(f"goals missed: {missed}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
