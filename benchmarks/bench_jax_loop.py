"""The JAX engine's steps per call on XLA CPU: one compiled ``lax.scan`` against one compiled
step per batch dispatched from Python (the engine's choice on CPU devices), beside Keras 3's
own compiled step, on convolution models, side by side on the same 8 XLA CPU devices in ONE
process.

Contenders, per case and round (interleaved, the order rotating), each training the same
tf-keras model from the same weights on the same ready numpy batches (no host input), 10
steps a call (``iterations_per_loop`` 10), ``--calls`` calls after a first (compiling) one:

- ``engine, scan``: :class:`tpushim._jax._step.Trainer` with ``loop = "scan"`` (what a TPU runs);
- ``engine, its choice``: the same ``Trainer`` as it chooses on CPU devices (``loop_of``: one
  compiled step per batch where the step convolves, else the scan);
- ``Keras 3 step``: the model rebuilt in Keras 3 (JAX backend) from its tf-keras config and
  weights (``keras3_rebuild._rebuild``), its ``compute_loss_and_updates``'s gradient and
  ``optimizer.stateless_apply`` in one ``jax.jit``, called once per step as ``fit`` calls it
  (``steps_per_execution=1``), the batch split over the same mesh.

Steps/s of each; the ratios against ``engine, its choice`` are what to read on a loaded machine.

    python benchmarks/bench_jax_loop.py [--rounds N] [--calls N] [--json FILE]
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PER_CALL = 10
CHOSEN = "engine, its choice"


def _env():
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    )
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def cases():
    """(name, tf-keras model builder, input shape, labels' classes or 0 (binary), batch)."""
    import tensorflow as tf

    def shapes_cnn():  # tests/scripts/shapes_cnn_shuffled_numpy.py's model
        model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(32, 32, 1))])
        for filters in (8, 16, 16):
            model.add(tf.keras.layers.Conv2D(filters, 3, padding="same", use_bias=False))
            model.add(tf.keras.layers.BatchNormalization())
            model.add(tf.keras.layers.Activation("relu"))
            model.add(tf.keras.layers.MaxPooling2D())
        model.add(tf.keras.layers.Flatten())
        model.add(tf.keras.layers.Dense(3, activation="softmax"))
        model.compile(tf.keras.optimizers.legacy.Adam(0.01), "sparse_categorical_crossentropy")
        return model

    def jpeg_pairs():  # tests/scripts/jpeg_pairs_224.py's model
        image = tf.keras.Input((224, 224, 3))
        x = tf.keras.layers.Conv2D(4, 8, strides=8, activation="tanh")(image)
        x = tf.keras.layers.Conv2D(4, 3, strides=2, activation="tanh")(x)
        x = tf.keras.layers.GlobalAveragePooling2D()(x)
        model = tf.keras.Model(image, tf.keras.layers.Dense(1, activation="sigmoid")(x))
        model.compile(tf.keras.optimizers.legacy.Adam(0.05), "binary_crossentropy")
        return model

    def mlp():  # the demo's MLP (benchmarks/bench_jax.py's first case): no convolution
        x = tf.keras.Input((20,))
        h = tf.keras.layers.Dense(32, activation="relu")(x)
        model = tf.keras.Model(x, tf.keras.layers.Dense(3, activation="softmax")(h))
        model.compile(tf.keras.optimizers.legacy.Adam(0.01), "sparse_categorical_crossentropy")
        return model

    return [
        ("demo MLP 20-32-3 (no convolution), batch 64", mlp, (20,), 3, 64),
        (
            "shapes_cnn_shuffled_numpy's layers (3 Conv+BN blocks) at 32x32x1, batch 32",
            shapes_cnn,
            (32, 32, 1),
            3,
            32,
        ),
        ("jpeg_pairs_224 (2 Conv, 224x224x3), batch 16", jpeg_pairs, (224, 224, 3), 0, 16),
    ]


def _batches(shape, classes, batch, count, seed=0):
    import numpy as np

    rng = np.random.RandomState(seed)
    out = []
    for _ in range(count):
        x = rng.rand(batch, *shape).astype("float32")
        if classes:
            y = rng.randint(0, classes, (batch, 1)).astype("int64")
        else:
            y = rng.randint(0, 2, (batch, 1)).astype("float32")
        out.append(([x], [y], None))
    return out


def _engine(build, batches, loop):
    """Steps/s of the engine's Trainer with ``loop`` (None: its own choice)."""
    import jax

    from tpushim._jax import _step

    trainer = _step.Trainer(build(), len(batches[0][0][0]), devices=jax.local_devices()[:8])
    if loop is not None:
        trainer.loop = loop
    trainer.train(batches[:PER_CALL])  # compiled
    start = time.perf_counter()
    for k in range(PER_CALL, len(batches), PER_CALL):
        trainer.train(batches[k : k + PER_CALL])
    return (len(batches) - PER_CALL) / (time.perf_counter() - start), trainer.loop


def _keras3(build, batches):
    """Steps/s of Keras 3's compiled step, once per batch, on the same 8 devices."""
    import jax
    import keras
    import numpy as np
    import tf_keras
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sys.path.insert(0, HERE)
    import keras3_rebuild as k3r

    from tpushim import _tfprivate

    model = build()
    k3, _ = k3r._rebuild(keras, model)
    for layer in model.layers:
        if layer.weights:
            k3.get_layer(layer.name).set_weights(layer.get_weights())
    args = _tfprivate.keras.compile_args(model)
    k3.compile(
        optimizer=k3r._optimizer3(keras, tf_keras, model.optimizer)[0],
        loss=k3r._loss3(keras, tf_keras, args.get("loss")),
    )
    mesh = Mesh(np.array(jax.local_devices()[:8]), ("data",))
    split, whole = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    tv = jax.device_put([v.value for v in k3.trainable_variables], whole)
    ntv = jax.device_put([v.value for v in k3.non_trainable_variables], whole)
    metrics = [v.value for v in k3.metrics_variables]
    k3.optimizer.build(k3.trainable_variables)
    ov = jax.device_put([v.value for v in k3.optimizer.variables], whole)

    def loss_fn(tv, ntv, xs, ys, ov):
        return k3.compute_loss_and_updates(
            tv, ntv, metrics, xs, ys, None, training=True, optimizer_variables=ov
        )

    @jax.jit
    def step(tv, ntv, ov, xs, ys):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(tv, ntv, xs, ys, ov)
        tv, ov = k3.optimizer.stateless_apply(ov, grads, tv)
        return tv, aux[2], ov, loss

    def run(part):
        nonlocal tv, ntv, ov
        for (x,), (y,), _ in part:
            tv, ntv, ov, loss = step(
                tv, ntv, ov, jax.device_put(x, split), jax.device_put(y, split)
            )
        jax.block_until_ready(loss)

    run(batches[:PER_CALL])  # compiled
    start = time.perf_counter()
    run(batches[PER_CALL:])
    return (len(batches) - PER_CALL) / (time.perf_counter() - start), "per step"


def measure(rounds, calls, only=None):
    _env()
    import tpushim

    tpushim.patch()  # before TensorFlow: tf.keras is tf-keras
    sys.path.insert(0, HERE)
    import benchlib

    benchlib.tf()
    import jax

    if jax.local_device_count() != 8:
        raise SystemExit(f"8 XLA devices wanted, jax sees {jax.local_device_count()}")
    out = {}
    for name, build, shape, classes, batch in cases():
        if only and only not in name:
            continue
        batches = _batches(shape, classes, batch, PER_CALL * (calls + 1))
        contenders = [("engine, scan", "scan"), (CHOSEN, None), ("Keras 3 step", "k3")]

        chosen = set()

        def one(loop, build=build, batches=batches, chosen=chosen):
            if loop == "k3":
                return _keras3(build, batches)[0]
            rate, ran = _engine(build, batches, loop)
            if loop is None:
                chosen.add(ran)
            return rate

        out[name] = benchlib.interleaved(contenders, rounds, one)
        out[name]["chosen"] = sorted(chosen)
        print(name, json.dumps(out[name]), flush=True)
    return out


def table(results):
    import benchlib

    lines = [f"{'case':66} {'contender':18} {'steps/s':>8} {'vs choice':>11}  spread"]
    for name, runs in results.items():
        runs = dict(runs)
        chosen = ", ".join(runs.pop("chosen"))
        paired = benchlib.Paired(runs, CHOSEN)
        for who in runs:
            ratio = f"{paired.ratio(who):.2f}x" if who != CHOSEN else ""
            spread = paired.spread(who, fmt="{:.2f}") if who != CHOSEN else ""
            lines.append(
                f"{name:66} {who:18} {benchlib.median(runs[who]):8.1f} {ratio:>11}  {spread}"
                + (f"  ({chosen})" if who == CHOSEN else "")
            )
    return "\n".join(lines)


def main(argv=None):
    sys.path.insert(0, HERE)
    import benchlib

    benchlib.interleaved_cli(__doc__, measure, table, 3, 3, argv)


if __name__ == "__main__":
    main()
