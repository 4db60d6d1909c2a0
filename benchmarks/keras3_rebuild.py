"""The other design measured: each of the project's models rebuilt in Keras 3 (JAX backend) from
its tf-keras config, against the JAX engine's tf2jax conversion.

For every model that tests/scripts/ and tests/tfcases.py build (captured as
``benchmarks/jax_coverage.py`` captures them, on the same batch: the input_fn's first batch, else
synthetic rows), in a process of its own:

- the engine's design: the training step converted with tf2jax (``jax_coverage.measure``: its
  loss and ``jax.grad`` against TensorFlow's);
- the other design: ``keras.Model.from_config`` / ``keras.Sequential.from_config`` of the
  tf-keras model's ``get_config()`` (Keras 3, ``KERAS_BACKEND=jax``; what fails is named layer by
  layer), tf-keras's weights copied layer by layer by name, compiled with the tf-keras model's
  losses and loss weights (by their serialized names). Its training-mode forward pass, loss
  (``compute_loss_and_updates``) and ``jax.grad`` against tf-keras's forward pass, ``compute_loss``
  and ``GradientTape``'s gradients (tolerance 1e-6);
- one compiled training step of each on one CPU device (forward, loss, gradients, the optimizer's
  update), the median of ``--repeats`` calls after the first: the engine's
  (:class:`tpushim._jax._step.Trainer`, one step per call) and Keras 3's (``jax.jit`` of
  ``compute_loss_and_updates``'s ``value_and_grad`` and ``optimizer.stateless_apply``; the
  optimizer deserialized from the tf-keras one's config, else SGD, marked).

tf-keras stays the scripts' Keras (``TF_USE_LEGACY_KERAS=1``); ``import keras`` is Keras 3. Needs
the jax venv (TF >= 2.16 with tf-keras, jax, tf2jax). Prints one table:

    python benchmarks/keras3_rebuild.py [SCRIPT_OR_CASE ...] [--repeats N] [--json FILE]
    python benchmarks/keras3_rebuild.py --table FILE   # a --json file's table again
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TOLERANCE = 1e-6


# -- pure helpers (tested without TensorFlow) ----------------------------------------------------
def max_difference(a, b, relative=False):
    """The largest absolute difference of two equal nests of arrays (lists/tuples/dicts), NaN
    where the structures differ or nothing is compared; ``relative``: each divided by
    ``max(1, |b|)`` (outputs of magnitude 20 differ by float32's rounding, 2e-6)."""
    import numpy as np

    def flat(x):
        if isinstance(x, dict):
            return [v for k in sorted(x) for v in flat(x[k])]
        if isinstance(x, (list, tuple)):
            return [v for item in x for v in flat(item)]
        return [np.asarray(x, np.float64)]

    fa, fb = flat(a), flat(b)
    if not fa or len(fa) != len(fb) or any(x.shape != y.shape for x, y in zip(fa, fb)):
        return float("nan")
    scale = (lambda y: np.maximum(1.0, np.abs(y))) if relative else (lambda y: 1.0)
    return max(float(np.max(np.abs(x - y) / scale(y), initial=0.0)) for x, y in zip(fa, fb))


def why_not(error, layer=None):
    """A short reason from a rebuild error: the layer's class and Keras 3's words."""
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(error)).split())  # no terminal bold
    if "could not automatically infer the shape of the Lambda" in text:
        return "Lambda: TensorFlow ops in its function (Keras 3 on JAX cannot run them)"
    if "Exception encountered: " in text:  # Keras 3's deserializer: its cause is last
        text = text.rsplit("Exception encountered: ", 1)[1]
    for marker in ("Could not locate class '", "Unknown layer: '", "Could not interpret "):
        if marker in text:
            name = text.split(marker, 1)[1].split("'")[0]
            return f"{layer or name}: no Keras 3 class ({name})"
    where = f"{layer}: " if layer else ""
    return f"{where}{type(error).__name__}: {text[:110]}"


def verdict(row):
    """'rebuilds' where the Keras 3 model's forward pass, loss and gradients are within
    TOLERANCE of tf-keras's, 'differs' where it runs but is not, else 'NO'."""
    if row.get("k3") != "runs":
        return "NO"
    diffs = [row.get(k, float("nan")) for k in ("k3_forward", "k3_loss", "k3_grad")]
    return "rebuilds" if all(d <= TOLERANCE for d in diffs) else "differs"  # NaN: differs


def line(name, row):
    """One row of the printed table."""
    step = "converts" if row.get("step") == "converts" else "NO"
    engine = f"{row['loss_diff']:8.1e} {row['grad_diff']:8.1e}" if step == "converts" else " " * 17
    k3 = verdict(row)
    diffs = (
        f"{row['k3_forward']:8.1e} {row['k3_loss']:8.1e} {row['k3_grad']:8.1e}"
        if row.get("k3") == "runs"
        else " " * 26
    )
    ms = lambda k: f"{row[k]:7.2f}" if isinstance(row.get(k), float) else f"{'-':>7}"
    why = [w for w in (row.get("step"), row.get("k3_why")) if w and w != "converts"]
    return (
        f"{name:34} {step:8} {engine}  {k3:8} {diffs} {ms('engine_ms')} {ms('k3_ms')}  "
        + "; ".join(dict.fromkeys(why))
    )


HEADER = (
    f"{'model':34} {'tf2jax':8} {'loss':>8} {'grad':>8}  {'Keras 3':8} {'forward':>8} "
    f"{'loss':>8} {'grad':>8} {'eng ms':>7} {'k3 ms':>7}  why not (layer/op)"
)


# -- in the child process ------------------------------------------------------------------------
def _loss3(keras, tf_keras, loss):
    """The tf-keras compile ``loss`` in Keras 3: names and Loss objects by their config."""
    if loss is None or isinstance(loss, str):
        return loss
    if isinstance(loss, dict):
        return {k: _loss3(keras, tf_keras, v) for k, v in loss.items()}
    if isinstance(loss, (list, tuple)):
        return [_loss3(keras, tf_keras, v) for v in loss]
    if isinstance(loss, tf_keras.losses.Loss):
        config = tf_keras.losses.serialize(loss)
        config = {"class_name": config["class_name"], "config": dict(config["config"])}
        if config["config"].get("reduction") == "auto":
            config["config"]["reduction"] = "sum_over_batch_size"
        return keras.losses.deserialize(config)
    name = getattr(loss, "__name__", None)
    if name and hasattr(keras.losses, name) and getattr(tf_keras.losses, name, None) is loss:
        return getattr(keras.losses, name)
    raise ValueError(f"the loss {name or loss!r} is TensorFlow code, not a Keras 3 loss")


def _optimizer3(keras, tf_keras, optimizer):
    """(the tf-keras optimizer in Keras 3, its name or 'SGD*' where it fell back)."""
    try:
        config = tf_keras.optimizers.serialize(optimizer)
        name = config["class_name"].split(">")[-1]
        keep = {"learning_rate", "momentum", "nesterov", "beta_1", "beta_2", "epsilon", "rho"}
        kwargs = {k: v for k, v in config["config"].items() if k in keep}
        if not isinstance(kwargs.get("learning_rate", 0.0), (int, float)):
            kwargs.pop("learning_rate")
        return getattr(keras.optimizers, name)(**kwargs), name
    except Exception:
        return keras.optimizers.SGD(0.01), "SGD*"


def _rebuild(keras, model):
    """(the tf-keras model rebuilt in Keras 3 from its config, how): ``from_config`` as it is,
    else Keras 3's own reader of tf-keras configs (the one ``keras.models.load_model`` uses for a
    tf-keras ``.h5`` file); raises naming the first layer neither rebuilds."""
    import copy

    from keras.src.legacy.saving import saving_utils

    config = model.get_config()
    sequential = type(model).__name__ == "Sequential"
    cls = keras.Sequential if sequential else keras.Model
    keras.config.enable_unsafe_deserialization()  # a Lambda's code, as tf-keras stores it
    try:
        return cls.from_config(copy.deepcopy(config)), "from_config"
    except Exception:
        pass
    # Without "module" (and a Lambda's code a list, as a tf-keras .h5 file's JSON holds it),
    # Keras 3 then reads each layer's config as a tf-keras one (its legacy reader:
    # batch_input_shape, axis lists, a Lambda's code).
    legacy = copy.deepcopy(config)
    legacy["layers"] = [
        {k: v for k, v in layer.items() if k not in ("module", "registered_name")}
        for layer in legacy.get("layers", [])
    ]
    for layer in legacy["layers"]:
        if layer["class_name"] == "Lambda":
            code = layer["config"].get("function")
            layer["config"]["function"] = json.loads(json.dumps(code, default=_json_default))
    try:
        return cls.from_config(copy.deepcopy(legacy)), "tf-keras config reader"
    except Exception:
        pass
    try:
        return _layer_by_layer(keras, saving_utils, model, legacy["layers"]), "layer by layer"
    except _Named:
        raise
    except Exception as error:
        for layer in legacy.get("layers", []):
            try:
                saving_utils.model_from_config(
                    {"class_name": layer["class_name"], "config": copy.deepcopy(layer["config"])}
                )
            except Exception as e:
                raise RuntimeError(why_not(e, layer["class_name"])) from e
        raise RuntimeError(why_not(error)) from error


class _Named(RuntimeError):
    """A rebuild's failure, its layer named."""


def _layer_by_layer(keras, saving_utils, model, layers):
    """The functional graph rebuilt node by node: each layer made from its config (Keras 3's
    reader of tf-keras configs) and called on the Keras 3 tensors of its tf-keras inputs, in
    the same nesting (a dict of tensors too, which Keras 3's config reader does not read)."""
    import copy

    import tensorflow as tf

    configs = {layer["config"]["name"]: layer for layer in layers}
    tensors, made = {}, {}
    for t in model.inputs:
        tensors[id(t)] = keras.Input(
            batch_shape=tuple(t.shape), dtype=t.dtype.name, name=t._keras_history.layer.name
        )
    mapped = lambda x: tensors.get(id(x), x)
    for depth in sorted(model._nodes_by_depth, reverse=True):
        for node in model._nodes_by_depth[depth]:
            layer = node.layer
            if type(layer).__name__ == "InputLayer":
                continue
            try:
                if layer.name not in made:
                    made[layer.name] = saving_utils.model_from_config(
                        copy.deepcopy(configs[layer.name])
                    )
                args = tf.nest.map_structure(mapped, node.call_args)
                kwargs = tf.nest.map_structure(mapped, node.call_kwargs)
                out = made[layer.name](*args, **kwargs)
            except Exception as e:
                raise _Named(why_not(e, type(layer).__name__)) from e
            for t, t3 in zip(tf.nest.flatten(node.outputs), tf.nest.flatten(out)):
                tensors[id(t)] = t3
    return keras.Model(
        [tensors[id(t)] for t in model.inputs], [tensors[id(t)] for t in model.outputs]
    )


def _json_default(value):
    """What ``model.to_json()`` writes for a value JSON lacks (numpy scalars and arrays)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def _median_ms(fn, repeats):
    fn()  # compiled
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return round(1000 * times[len(times) // 2], 3)


def _labels_that_train(model, features, rng):
    """The first form of synthetic labels tf-keras's compute_loss accepts for the model."""
    import jax_coverage
    import tensorflow as tf

    forms = jax_coverage._labels(model, rng)
    for form in forms:  # soft labels summing to 1 per row, as a crossentropy's labels do
        if form[0].ndim > 1 and form[0].shape[-1] > 1:
            form[0] = form[0] / form[0].sum(axis=-1, keepdims=True)
    x = features if len(features) > 1 else features[0]
    for k in range(3):
        labels = [f[k] for f in forms]
        try:
            tx, ty = tf.nest.map_structure(
                tf.constant, (x, labels if len(labels) > 1 else labels[0])
            )
            model.compute_loss(x=tx, y=ty, y_pred=model(tx, training=False))
            return labels
        except Exception:
            continue
    return [f[0] for f in forms]


def keras3_measure(model, features, labels, repeats):
    """The Keras 3 half of a row (and the engine's step timed) for a compiled tf-keras model."""
    import jax
    import keras
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from tpushim import _tfprivate

    row = {}
    x = features if len(features) > 1 else features[0]
    y = labels if len(labels) > 1 else labels[0]
    try:  # the engine's compiled step, one device, one step per call
        from tpushim._jax import _step

        trainer = _step.Trainer(model, len(features[0]), devices=jax.devices()[:1])
        batch = (list(features), list(labels), None)
        trainer.compile(batch)
        row["engine_ms"] = float(_median_ms(lambda: trainer.train([batch]), repeats))
    except Exception as e:
        row["engine_ms_why"] = why_not(e)
    try:
        k3, row["k3_route"] = _rebuild(keras, model)
    except Exception as e:
        row["k3"], row["k3_why"] = "no", str(e)
        return row
    try:
        for layer in model.layers:
            if layer.weights:
                k3.get_layer(layer.name).set_weights(layer.get_weights())
        args = _tfprivate.keras.compile_args(model)
        optimizer, row["k3_optimizer"] = _optimizer3(keras, tf_keras, model.optimizer)
        k3.compile(
            optimizer=optimizer,
            loss=_loss3(keras, tf_keras, args.get("loss")),
            loss_weights=args.get("loss_weights"),
        )
    except Exception as e:
        row["k3"], row["k3_why"] = "no", "weights/compile: " + why_not(e)
        return row

    # tf-keras: training-mode forward pass, compute_loss, GradientTape
    tx, ty = tf.nest.map_structure(tf.constant, (x, y))
    with tf.GradientTape() as tape:
        tf_pred = model(tx, training=True)
        tf_loss = model.compute_loss(x=tx, y=ty, y_pred=tf_pred)
    tf_grads = tape.gradient(tf_loss, model.trainable_weights)
    try:
        trainable = [v.value for v in k3.trainable_variables]
        non_trainable = [v.value for v in k3.non_trainable_variables]
        metrics = [v.value for v in k3.metrics_variables]
        k3.optimizer.build(k3.trainable_variables)
        opt_vars = [v.value for v in k3.optimizer.variables]

        def loss_fn(tv, ntv, xs, ys, ov=opt_vars):
            return k3.compute_loss_and_updates(
                tv, ntv, metrics, xs, ys, None, training=True, optimizer_variables=ov
            )

        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            trainable, non_trainable, x, y
        )
    except Exception as e:
        traceback.print_exc()
        row["k3"], row["k3_why"] = "no", "its step: " + why_not(e)
        return row
    row["k3"] = "runs"
    row["k3_forward"] = max_difference(
        tf.nest.map_structure(lambda t: t.numpy(), tf.nest.flatten(tf_pred)),
        [np.asarray(a) for a in jax.tree_util.tree_leaves(aux[1])],
        relative=True,
    )
    row["k3_loss"] = abs(float(loss) - float(tf_loss))
    # paired layer by layer (by the layer's name), each layer's trainable weights in order
    tf_grad = {id(w): g for w, g in zip(model.trainable_weights, tf_grads)}
    k3_grad = {id(v): g for v, g in zip(k3.trainable_variables, grads)}
    paired = []
    for layer in model.layers:
        if not layer.trainable_weights:
            continue
        for w, v in zip(layer.trainable_weights, k3.get_layer(layer.name).trainable_weights):
            if id(w) in tf_grad and id(v) in k3_grad and tf_grad[id(w)] is not None:
                g = tf.convert_to_tensor(tf_grad[id(w)]).numpy()
                paired.append((np.asarray(k3_grad[id(v)]), g))
    count = len(k3.trainable_variables)
    row["k3_grad"] = (
        max_difference([a for a, _ in paired], [b for _, b in paired])
        if len(paired) == count
        else float("nan")
    )
    if len(paired) != count:
        row["k3_why"] = f"gradients not paired by layer ({len(paired)} of {count})"
    random = sorted(
        {type(la).__name__ for la in model.layers if "Dropout" in type(la).__name__}
        | {type(la).__name__ for la in model.layers if "Noise" in type(la).__name__}
    )
    if random and verdict(row) != "rebuilds":
        row["k3_why"] = f"{', '.join(random)}: Keras 3's own random draws, not stock's"

    @jax.jit
    def step(tv, ntv, ov, xs, ys):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(tv, ntv, xs, ys, ov)
        tv, ov = k3.optimizer.stateless_apply(ov, grads, tv)
        return tv, aux[2], ov, loss

    try:
        row["k3_ms"] = float(
            _median_ms(
                lambda: jax.block_until_ready(step(trainable, non_trainable, opt_vars, x, y)),
                repeats,
            )
        )
    except Exception as e:
        row["k3_ms_why"] = why_not(e)
    return row


def child(target, repeats):
    """The row of ``target`` (a script path or a tfcases name), in this process."""
    os.environ.setdefault("KERAS_BACKEND", "jax")  # before Keras 3 is imported
    sys.path.insert(0, HERE)
    import jax_coverage
    import numpy as np

    engine_measure, synthetic = jax_coverage.measure, []

    def measure(model, batch=None):
        if batch is None and model.outputs:  # both halves on the same synthetic rows
            rng = np.random.RandomState(0)
            features = [jax_coverage._synthetic(i, rng) for i in model.inputs]
            synthetic[:] = features, _labels_that_train(model, features, rng)
        row = engine_measure(model, batch if batch is not None or not synthetic else synthetic)
        if not model.outputs:
            row["k3"], row["k3_why"] = (
                "no",
                "no symbolic outputs (subclassed): no config to rebuild",
            )
            return row
        if batch is not None:
            features, labels = batch
        else:
            features, labels = synthetic
        row.update(keras3_measure(model, features, labels, repeats))
        return row

    jax_coverage.measure = measure
    return jax_coverage.child(target)


def targets_of(given):
    """The given targets, else every script of tests/scripts and every tfcases case."""
    import jax_coverage

    if given:
        return given
    return [
        *sorted(
            p
            for p in glob.glob(os.path.join(jax_coverage.SCRIPTS, "*.py"))
            if os.path.basename(p) not in jax_coverage.SKIPPED
        ),
        *jax_coverage.CASES,
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="scripts (tests/scripts/*.py) or tfcases names")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per step")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--table", help="print the table of a --json file, measuring nothing")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print("ROW " + json.dumps(child(opts.child, opts.repeats)), flush=True)
        return
    if opts.table:
        with open(opts.table) as f:
            print(HEADER, *(line(name, row) for name, row in json.load(f).items()), sep="\n")
        return
    sys.path.insert(0, HERE)
    print(HEADER)
    rows = {}
    for target in targets_of(opts.targets):
        proc = subprocess.run(
            [sys.executable, __file__, "--child", target, "--repeats", str(opts.repeats)],
            capture_output=True,
            check=False,
            text=True,
            env={
                **os.environ,
                "TF_CPP_MIN_LOG_LEVEL": "3",
                "PYTHONPATH": REPO,
                "KERAS_BACKEND": "jax",
                "TF_USE_LEGACY_KERAS": "1",
            },
        )
        found = [text[4:] for text in proc.stdout.splitlines() if text.startswith("ROW ")]
        row = json.loads(found[-1]) if found else {"step": "crashed: " + proc.stderr[-300:]}
        name = os.path.basename(target) + (" *" if row.get("input") == "synthetic rows" else "")
        rows[name] = row
        print(line(name, row), flush=True)
    print("* traced on synthetic rows (its input_fn gave no eager batch)")
    print(
        f"rebuilds: within {TOLERANCE:g} of tf-keras: forward (relative to max(1, |output|)), "
        "loss, gradients; ms: one compiled step on one CPU device, median"
    )
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
