"""Which of the project's models tf2jax converts: the training-mode forward pass and the
compiled loss of every model that tests/scripts/ converts (and tests/tfcases.py's small ones),
traced in TensorFlow and converted with ``tf2jax.convert``; for those that convert, the loss and
``jax.grad`` of it against TensorFlow's loss and ``GradientTape``'s gradients.

Each script runs in a process of its own on TensorFlow >= 2.16 with tpushim patched; its
``model_to_estimator`` call hands the Keras model over and stops the script there (nothing after
it runs). Needs jax and tf2jax (the ``jax`` extra). Prints one table:

    python benchmarks/jax_coverage.py [SCRIPT ...]
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "tests", "scripts")
SKIPPED = {"record_reference.py"}  # records stock's numbers; builds no model of its own
CASES = ("sequential", "batchnorm_variants", "ghost_batchnorm", "two_in_two_out", "subclassed")
ROWS = 8


class _Captured(Exception):
    pass


def _synthetic(spec, rng):
    """ROWS rows of ``spec`` (a Keras tensor or TensorSpec): unknown sizes 4."""
    import numpy as np
    import tensorflow as tf

    shape = [ROWS] + [4 if d is None else d for d in list(spec.shape)[1:]]
    dtype = tf.as_dtype(spec.dtype)
    if dtype == tf.string:
        return np.full(shape, b"a", dtype=object)
    if dtype.is_integer or dtype.is_bool:
        return np.ones(shape, dtype.as_numpy_dtype)
    return rng.uniform(0.05, 0.95, shape).astype(dtype.as_numpy_dtype)


def _labels(model, rng):
    """Label candidates per output: like the output, or integer class ids [rows, 1] / [rows]."""

    forms = []
    for out in model.outputs:
        shape = [ROWS] + [4 if d is None else d for d in list(out.shape)[1:]]
        classes = shape[-1] if len(shape) > 1 and shape[-1] > 1 else 2
        forms.append(
            [
                rng.uniform(0.05, 0.95, shape).astype("float32"),
                rng.randint(0, classes, [*shape[:-1], 1]).astype("int64"),
                rng.randint(0, classes, shape[:-1]).astype("int64"),
            ]
        )
    return forms


def _short(e):
    return f"{type(e).__name__}: {' '.join(str(e).split())[:150]}"


def _unsupported(e):
    """The ops tf2jax names, else the error in short."""
    text = " ".join(str(e).split())
    if "Unsupported operations in graph:" in text:
        return "ops " + text.split("Unsupported operations in graph:")[1].split("]")[0].strip(" [")
    if "ResourceHandle" in text or "resource" in text.lower():
        return "a captured resource (a lookup table)"
    return _short(e)


def measure(model, batch=None):
    """One row of the table for a compiled Keras model (``batch``: (features, labels) to trace
    it on, else synthetic rows): its training-mode forward pass converted alone, then the JAX
    engine's training step (:mod:`tpushim._jax._trace`: forward pass and loss) converted, its loss
    and ``jax.grad`` against TensorFlow's loss and ``GradientTape``'s gradients."""
    import jax
    import numpy as np
    import tensorflow as tf
    import tf2jax

    from tpushim._jax import _draws, _trace
    from tpushim._tfprivate import keras as _keras

    rng = np.random.RandomState(0)
    # Keras's own walk of its layers, not tf.Module's ``submodules``: that one also walks every
    # attribute, and a recurrent cell's dropout-mask cache, keyed by the graphs it was built in
    # (the model's and its loop body's with ``recurrent_dropout``), cannot be sorted.
    layers = sorted({type(layer).__name__ for layer in _keras.all_layers(model)[1:]})
    row = {"layers": ", ".join(x for x in layers if x not in ("InputLayer",))}
    if not model.outputs:  # subclassed, or a Sequential declaring no input shape
        row["forward"] = row["step"] = "no symbolic outputs (subclassed or unbuilt): not traced"
        return row
    if batch is not None:
        features, labels = batch
    else:
        features = [_synthetic(i, rng) for i in model.inputs]
        labels = None
    rows = len(features[0])
    pad = np.ones([rows], "float32")
    weights = [np.ones([rows], "float32") for _ in model.outputs]
    if labels is None:  # the first form of labels the step accepts in TensorFlow
        forms = _labels(model, rng)
        labels = [f[0] for f in forms]
        for k in range(3):
            try:
                train = _trace.training_function(model)
                train(
                    *tf.nest.map_structure(
                        tf.constant, (features, [f[k] for f in forms], weights, pad)
                    )
                )
                labels = [f[k] for f in forms]
                break
            except Exception:
                continue

    forward = tf.function(
        lambda xs: tf.nest.flatten(model(tf.nest.pack_sequence_as(model.input, xs), training=True))
    )
    start = time.perf_counter()
    try:
        tf2jax.convert(forward, features)
        row["forward"] = "converts"
    except Exception as e:
        row["forward"] = _unsupported(e)
    try:
        train = _trace.training_function(model)
        traced = _trace.convert(model, train, features, labels, weights, pad)
    except Exception as e:
        text = " ".join(str(e).split())
        if "cannot convert this model's training step to JAX" in text:
            row["step"] = _unsupported(e.__cause__ or e)
        else:
            row["step"] = "refused: " + text.split(": ", 1)[-1][:150]
        return row
    row["convert_s"] = round(time.perf_counter() - start, 2)
    params = traced.params
    trainable = {k: np.asarray(params[k]) for k in traced.trainable}
    # A step with random draws (Dropout, a recurrent layer's dropout masks) takes them as its
    # last input, made on the host by stock's ops as the engine makes them; TensorFlow's step
    # is given the same ones.
    draws = []
    if traced.draws:
        host = _draws.HostDraws(traced.draws, rows)
        draws = [host.draw(rows)]
        host.close()
    try:
        (jax_loss, _), grads = jax.jit(  # compiled as the engine's step (a scan op by op: slow)
            jax.value_and_grad(
                lambda p: traced.fn({**params, **p}, features, labels, weights, pad, *draws)[0],
                has_aux=True,
            )
        )(trainable)
    except Exception as e:
        row["step"] = "JAX run fails: " + _short(e)
        return row
    variables = {v.name.split(":")[0]: v for v in model.trainable_variables}
    with tf.GradientTape() as tape:
        tf_loss, _ = train(
            *tf.nest.map_structure(tf.constant, (features, labels, weights, pad, *draws))
        )
    tf_grads = tape.gradient(tf_loss, list(variables.values()))
    row["grad_diff"] = max(
        (
            float(np.max(np.abs(np.asarray(grads[name]) - tf.convert_to_tensor(g).numpy())))
            for name, g in zip(variables, tf_grads)
            if name in grads and g is not None
        ),
        default=float("nan"),
    )
    row["loss_diff"] = abs(float(jax_loss) - float(tf_loss))
    row["step"] = "converts"
    return row


class _Stand:
    """What the script's ``model_to_estimator`` returns here: its first ``train`` call hands the
    input_fn over and stops the script."""

    def __init__(self, captured):
        self._captured = captured

    def train(self, input_fn, *args, **kwargs):
        self._captured["input_fn"] = input_fn
        raise _Captured()

    def __getattr__(self, name):
        raise _Captured()


def _first_batch(model, input_fn):
    """(features in the model's input order, labels in its output order) of the input_fn's
    first training batch, or None where it gives none in eager (queues, TF1 graphs)."""
    import inspect

    import numpy as np
    import tensorflow as tf

    wanted = inspect.signature(input_fn).parameters
    given = {"mode": "train", "params": {}, "config": None}
    result = input_fn(**{k: v for k, v in given.items() if k in wanted})
    if isinstance(result, tf.data.Dataset):
        result = next(iter(result))
    features, labels = result if isinstance(result, tuple) else (result, None)
    if labels is None or not all(hasattr(t, "numpy") for t in tf.nest.flatten((features, labels))):
        return None
    if isinstance(features, dict):
        features = [features[name] for name in model.input_names]
    if isinstance(labels, dict):
        labels = [labels[name] for name in model.output_names]
    as_np = lambda t: np.asarray(t.numpy())
    return [as_np(t) for t in tf.nest.flatten(features)], [
        as_np(t) for t in tf.nest.flatten(labels)
    ]


def child(target):
    """In a process of its own: the model of ``target`` (a script path or a tfcases name)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    sys.path.insert(0, os.path.join(REPO, "tests"))
    if target in CASES:
        import tfcases

        model = getattr(tfcases, target)()
        return measure(model)
    import tpushim
    from tpushim import _convert

    captured = {}

    def capture(wrapped, args, kwargs, settings):
        del settings
        if "model" not in captured:
            captured["model"] = _convert.arguments_by_name(wrapped, args, kwargs)["keras_model"]
        return _Stand(captured), True

    _convert.convert = capture
    tpushim.patch(mode="cpu", quiet=True)
    import tensorflow as tf

    def train_and_evaluate(estimator, train_spec, eval_spec):
        captured["input_fn"] = train_spec.input_fn
        raise _Captured()

    tf.estimator.train_and_evaluate = train_and_evaluate
    # A TF1 script's disable_v2_behavior() kept from switching eager off: the model is the same,
    # and the measurement compares in eager.
    tf.compat.v1.disable_v2_behavior = tf.compat.v1.disable_eager_execution = lambda: None
    workdir = tempfile.mkdtemp(prefix="jax-coverage-")
    sys.argv = [target, workdir]
    try:
        with open(target) as f:
            code = compile(f.read(), target, "exec")
        exec(code, {"__name__": "__main__", "__file__": target})
    except Exception:  # _Captured, or the script using what the stand-in lacks
        pass
    if "model" not in captured:
        return {"result": "no model_to_estimator call reached"}
    batch, source = None, "synthetic rows"
    if "input_fn" in captured:
        try:
            batch = _first_batch(captured["model"], captured["input_fn"])
            source = "its input_fn's first batch" if batch else source
        except Exception:
            pass
    row = measure(captured["model"], batch)
    row["input"] = source
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="scripts (tests/scripts/*.py) or tfcases names")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print("ROW " + json.dumps(child(opts.child)), flush=True)
        return
    targets = opts.targets or [
        *sorted(
            p
            for p in glob.glob(os.path.join(SCRIPTS, "*.py"))
            if os.path.basename(p) not in SKIPPED
        ),
        *CASES,
    ]
    print(f"{'model':36} {'forward':9} {'step':9} {'loss diff':>9} {'grad diff':>9}  why / layers")
    for target in targets:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", target],
            capture_output=True,
            check=False,
            text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO},
        )
        rows = [line[4:] for line in proc.stdout.splitlines() if line.startswith("ROW ")]
        row = json.loads(rows[-1]) if rows else {"step": "crashed: " + proc.stderr[-300:]}
        name = os.path.basename(target) + (" *" if row.get("input") == "synthetic rows" else "")
        forward = row.get("forward", "-")
        step = row.get("step", "-")
        ok = lambda text: "converts" if text == "converts" else "NO"
        diffs = (
            f"{row['loss_diff']:9.1e} {row['grad_diff']:9.1e}"
            if step == "converts"
            else f"{'':9} {'':9}"
        )
        why = [w for w in (forward, step) if w not in ("converts", "-")]
        print(
            f"{name:36} {ok(forward):9} {ok(step):9} {diffs}  {'; '.join(dict.fromkeys(why)) or row.get('layers', '')}"
        )
        sys.stdout.flush()
    print("* traced on synthetic rows (its input_fn gave no eager batch)")


if __name__ == "__main__":
    main()
