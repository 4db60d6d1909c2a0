"""The JAX engine's step on a full batch: the padded step (a padding weight per row, read by the
loss and BatchNormalization's statistics) against its variant without padding rows (the
Trainer's ``full_step``), A/B in ONE process on the same 8 XLA CPU devices.

Per case, two :class:`tpushim._jax._step.Trainer` of the same tf-keras model from the same
weights, ``full_step`` False (A: every call the padded step) and True (B: the variant), each
compiled by a first call (its seconds reported), then ``--rounds`` rounds of ``--calls`` timed
calls of 10 full batches each (``iterations_per_loop`` 10), A and B interleaved, the order
rotating. Steps/s per round; the median of B/A round by round is what to read on a loaded
machine. Also checked: after the same batches, B's weights equal A's (largest difference).

    python benchmarks/bench_jax_full.py [--rounds N] [--calls N] [--case TEXT] [--json FILE]
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PER_CALL = 10


def cases():
    """(name, tf-keras model builder, input shape, labels' classes (one-hot if ``onehot``), batch,
    one-hot labels)."""
    sys.path.insert(0, HERE)
    import bench_jax_loop
    import tensorflow as tf

    loop_cases = {name.split(" ")[0]: c for name, *c in bench_jax_loop.cases()}

    def big_mlp():  # benchmarks/bench_jax.py's "MLP 784-1024x3-10"
        layers = [tf.keras.Input((784,))]
        layers += [tf.keras.layers.Dense(w, activation="relu") for w in (1024, 1024, 1024)]
        model = tf.keras.Sequential([*layers, tf.keras.layers.Dense(10, activation="softmax")])
        model.compile(
            tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9), "categorical_crossentropy"
        )
        return model

    demo, shapes = loop_cases["demo"], loop_cases["shapes_cnn_shuffled_numpy's"]
    return [
        ("demo MLP 20-32-3, batch 64", *demo, False),
        ("shapes CNN (3 Conv+BN blocks) 32x32x1, batch 32", *shapes, False),
        ("MLP 784-1024x3-10, batch 256", big_mlp, (784,), 10, 256, True),
    ]


def _batches(shape, classes, batch, count, onehot, seed=0):
    import numpy as np

    rng = np.random.RandomState(seed)
    out = []
    for _ in range(count):
        x = rng.rand(batch, *shape).astype("float32")
        y = rng.randint(0, classes, (batch, 1)).astype("int64")
        if onehot:
            y = np.eye(classes, dtype="float32")[y[:, 0]]
        out.append(([x], [y], None))
    return out


def measure(rounds, calls, only=None):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    )
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tpushim

    tpushim.patch()
    sys.path.insert(0, HERE)
    import benchlib

    benchlib.tf()
    import jax
    import numpy as np

    from tpushim._jax import _step

    if jax.local_device_count() != 8:
        raise SystemExit(f"8 XLA devices wanted, jax sees {jax.local_device_count()}")
    out = {}
    for name, build, shape, classes, batch, onehot in cases():
        if only and only not in name:
            continue
        batches = _batches(shape, classes, batch, PER_CALL * (calls + 1), onehot)
        model = build()
        trainers, compiled = {}, {}
        for who, full in (("padded", False), ("full", True)):
            trainer = _step.Trainer(model, batch, devices=jax.local_devices()[:8])
            trainer.full_step = full
            start = time.perf_counter()
            trainer.train(batches[:PER_CALL])
            compiled[who] = time.perf_counter() - start
            trainers[who] = trainer
        same = max(
            float(np.max(np.abs(trainers["full"].weights()[k] - v)))
            for k, v in trainers["padded"].weights().items()
        )
        compiles = {who: len(t._traced) for who, t in trainers.items()}

        steps = PER_CALL * calls

        def timed(who):
            trainer = trainers[who]
            start = time.perf_counter()
            for k in range(PER_CALL, len(batches), PER_CALL):
                trainer.train(batches[k : k + PER_CALL])
            return (len(batches) - PER_CALL) / (time.perf_counter() - start)

        runs = benchlib.interleaved([("padded", "padded"), ("full", "full")], rounds, timed)
        paired = benchlib.Paired(runs, "padded")
        direct = {who: _direct(t, batches) for who, t in trainers.items()}
        blocks = benchlib.interleaved(
            [("padded", "padded"), ("full", "full")], 2 * rounds, lambda who: direct[who](steps)
        )
        out[name] = {
            "direct": {
                "steps/s": blocks,
                "median full/padded": benchlib.Paired(blocks, "padded").ratio("full"),
                "cost": {who: d.cost for who, d in direct.items()},
            },
            **runs,
            "full/padded": paired.ratios("full"),
            "median full/padded": paired.ratio("full"),
            "first call s": compiled,
            "steps traced": compiles,
            "largest weight difference after the first call": same,
            "loop": trainers["full"].loop,
            "load": os.getloadavg(),
        }
        print(name, json.dumps(out[name]), flush=True)
    return out


def _direct(trainer, batches):
    """``run(n) -> steps/s`` of ``trainer``'s compiled step (its only one) called ``n`` times
    on one batch already on the devices (no host input, no Python loop of the Trainer), and
    its XLA ``cost_analysis()`` (``run.cost``: flops and bytes accessed a step, per device)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from tpushim._jax import _step

    ((_, loop),) = trainer._traced.values()
    padded = [_step.pad_batch(b, trainer.global_batch) for b in batches[:PER_CALL]]
    if trainer.loop == "per step":
        fn, spec = loop.step, PartitionSpec("data")
        fed = padded[0]
    else:
        fn, spec = loop, PartitionSpec(None, "data")
        fed = jax.tree_util.tree_map(lambda *a: np.stack(a), *padded)
    fed = jax.device_put(fed, NamedSharding(trainer.mesh, spec))
    per_call = 1 if trainer.loop == "per step" else PER_CALL
    carry = (trainer.params, trainer.stats, trainer.opt_state)
    cost = fn.lower(*carry, fed).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    # (XLA counts a loop's body once: a scan's cost is one step's)
    cost = {k: float(cost[k]) for k in ("flops", "bytes accessed") if k in cost}

    def run(n):
        nonlocal carry
        start = time.perf_counter()
        for _ in range(max(1, n // per_call)):
            carry, loss = fn(*carry, fed)
        jax.block_until_ready(loss)
        trainer.params, trainer.stats, trainer.opt_state = carry  # (donated: kept current)
        return max(1, n // per_call) * per_call / (time.perf_counter() - start)

    run.cost = cost
    return run


def table(results):
    import benchlib

    lines = [f"{'case':50} {'padded':>8} {'full':>8} {'full/padded':>12}  spread, first calls"]
    for name, r in results.items():
        ratios = sorted(r["full/padded"])
        lines.append(
            f"{name:50} {benchlib.median(r['padded']):8.1f} {benchlib.median(r['full']):8.1f} "
            f"{r['median full/padded']:11.3f}x  {ratios[0]:.3f}-{ratios[-1]:.3f}, "
            + ", ".join(f"{k} {v:.1f} s" for k, v in r["first call s"].items())
        )
        d = r["direct"]
        cost = ", ".join(
            f"{who} {c.get('flops', 0) / 1e6:.2f} MFLOP {c.get('bytes accessed', 0) / 1e6:.2f} MB"
            for who, c in d["cost"].items()
        )
        lines.append(
            f"{'  compiled step alone':50} {benchlib.median(d['steps/s']['padded']):8.1f} "
            f"{benchlib.median(d['steps/s']['full']):8.1f} {d['median full/padded']:11.3f}x  "
            f"per step and device: {cost}"
        )
    return "\n".join(lines)


def main(argv=None):
    sys.path.insert(0, HERE)
    import benchlib

    benchlib.interleaved_cli(__doc__, measure, table, 7, 5, argv)


if __name__ == "__main__":
    main()
