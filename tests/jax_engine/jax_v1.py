"""A program that disabled TensorFlow 2 behaviour, as 2019 estimator scripts are written, and
stock's numbers for it: a helper of tests/jax_engine/test_jax_v1.py, not a test module.

``import tensorflow.compat.v1 as tf``, ``tf.disable_v2_behavior()``, then two models, each
converted with ``tf.keras.estimator.model_to_estimator``, trained, evaluated, predicted and
exported with the v1 spelling ``export_savedmodel``, the export served in a session of its own:

* ``compat``: a functional model compiled with ``tf.compat.v1.train.MomentumOptimizer``, its
  weights set by the program (read in its session: stock warm-starts from them), a Dataset
  input_fn of 29 rows in batches of 8 (a short batch, padded on 8 devices);
* ``keras``: a Sequential model compiled with ``optimizer="adam"`` (Keras's v1 Adam), its
  weights never initialised (stock starts from its first checkpoint's fresh draws, seeded by
  ``tf_random_seed``), ``numpy_input_fn`` input.

Besides the numbers (every checkpointed variable's sum by stock's name, evaluate's metrics,
each prediction, what the export serves), after each call: whether the program executes
eagerly (it does not) and whether its default graph is still the one it had, with no op added.

Stock is the stock estimator on TensorFlow 2.15, recorded by

    python tests/jax_engine/jax_v1.py --record tests/reference/jax_v1_tf215.json

in a TF 2.15 venv. Run as ``python jax_v1.py WORKDIR`` (tpushim patched: the JAX engine's
test runs it so, in tests/jax_engine/jax_scripts.py's process) it prints ``RESULT {...}``.
"""

import json
import os
import sys

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()

ROWS, BATCH = 29, 8
rng = np.random.RandomState(11)
X = rng.rand(ROWS, 3).astype(np.float32)
Y = (X @ np.array([[0.5], [-1.0], [2.0]], np.float32) + 0.1).astype(np.float32)


def compat_model():
    x = tf.keras.layers.Input((3,), name="x")
    h = tf.keras.layers.Dense(6, activation="tanh", name="h")(x)
    model = tf.keras.Model(x, tf.keras.layers.Dense(1, name="y")(h))
    draw = np.random.RandomState(5)
    model.set_weights([draw.uniform(-0.5, 0.5, w.shape).astype(np.float32) for w in model.weights])
    model.compile(tf.train.MomentumOptimizer(0.05, 0.9), "mse", metrics=["mae"])
    return model


def keras_model():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(5, activation="relu", input_shape=(3,), name="hidden"),
            tf.keras.layers.Dense(1, name="out"),
        ]
    )
    model.compile(optimizer="adam", loss="mse", metrics=["mse"])
    return model


def dataset_input_fn(labels=True, repeat=1):
    def input_fn():
        data = ({"x": X}, Y) if labels else {"x": X}
        return tf.data.Dataset.from_tensor_slices(data).repeat(repeat).batch(BATCH)

    return input_fn


def numpy_input_fn(labels=True, epochs=1):
    return tf.estimator.inputs.numpy_input_fn(
        x={"hidden_input": X},
        y=Y if labels else None,
        batch_size=BATCH,
        num_epochs=epochs,
        shuffle=False,
    )


CASES = {
    # name: (model, input's feature key, input_fn(labels, repeat), steps)
    "compat": (compat_model, "x", dataset_input_fn, 7),
    "keras": (keras_model, "hidden_input", numpy_input_fn, 6),
}


def _served(export_dir, key):
    """What the SavedModel serves for X, loaded in a graph and session of its own."""
    with tf.Graph().as_default(), tf.Session() as session:
        meta = tf.saved_model.loader.load(session, ["serve"], export_dir)
        signature = meta.signature_def["serving_default"]
        (output,) = signature.outputs.values()
        return session.run(output.name, {signature.inputs[key].name: X})


def run(workdir):
    """Both models trained, evaluated, predicted and exported: {key: number}."""
    result = {}
    graph = tf.get_default_graph()
    for name, (make, key, input_fn, steps) in CASES.items():
        config = tf.estimator.RunConfig(model_dir=os.path.join(workdir, name), tf_random_seed=3)
        estimator = tf.keras.estimator.model_to_estimator(keras_model=make(), config=config)
        ops = len(graph.get_operations())
        estimator.train(input_fn(True, 2), steps=steps)
        metrics = estimator.evaluate(input_fn(True, 1))
        result.update({f"{name}_{k}": float(v) for k, v in metrics.items()})
        for i, p in enumerate(estimator.predict(input_fn(False, 1))):
            (value,) = p.values()
            result[f"{name}_prediction_{i}"] = float(value[0])
            result[f"{name}_eager_between_predictions"] = float(tf.executing_eagerly())
        receiver = tf.estimator.export.build_raw_serving_input_receiver_fn(
            {key: tf.placeholder(tf.float32, [None, 3], name=key)}
        )
        exported = estimator.export_savedmodel(os.path.join(workdir, f"{name}_export"), receiver)
        served = _served(exported.decode() if isinstance(exported, bytes) else exported, key)
        result.update({f"{name}_served_{i}": float(v[0]) for i, v in enumerate(served)})
        for var in estimator.get_variable_names():
            value = np.asarray(estimator.get_variable_value(var))
            if value.dtype.kind == "f" or var == "global_step":
                result[f"{name}/{var}"] = float(np.sum(value))
        # The program's graph mode, as it left it: no eager execution, its default graph.
        result[f"{name}_eager"] = float(tf.executing_eagerly())
        result[f"{name}_same_graph"] = float(tf.get_default_graph() is graph)
        result[f"{name}_ops_added"] = float(len(graph.get_operations()) - ops)
    return result


if __name__ == "__main__":
    if sys.argv[1] == "--record":
        import tempfile

        with tempfile.TemporaryDirectory() as work:
            numbers = run(work)
        with open(sys.argv[2], "w", encoding="utf-8") as f:
            json.dump(
                {"tensorflow": tf.__version__, "results": numbers}, f, indent=1, sort_keys=True
            )
    else:
        print("RESULT " + json.dumps(run(sys.argv[1])))
