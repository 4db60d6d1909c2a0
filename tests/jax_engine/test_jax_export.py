"""What the JAX engine's estimator saves and starts from, as stock's: ``export_saved_model`` (and
the v1 spelling's ``export_savedmodel``) writes the SavedModel stock's estimator writes from the
engine's checkpoint, serving what stock serves.

Stock here: tpushim's estimator API's stock path (TensorFlow >= 2.16, no TPU) in the same
process, the engine's runs in ``tpushim.patched(mode="cpu", engine="jax")`` scopes on 8 XLA CPU
devices; one subprocess for every case (TensorFlow and JAX start once).
"""

import json

import numpy as np
import procs
import pytest
from jax_scripts import JAX_TESTS, ROOT

pytestmark = JAX_TESTS

TOL = 1e-5
ENV = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PYTHONPATH": ROOT}

PROGRAM = r"""
import json, os, sys
import tpushim; tpushim.patch(quiet=True)  # stock's path (no TPU), the engine's in its scope
import numpy as np, tensorflow as tf
root = sys.argv[1]
rng = np.random.RandomState(0)
x = rng.rand(40, 4).astype(np.float32)
y = (x.sum(1, keepdims=True) > 2).astype(np.float32)
RUNS = (("engine", dict(mode="cpu", engine="jax")), ("stock", {}))

def train_input():
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(8).repeat()

def model(seed=1):
    tf.keras.utils.set_random_seed(seed)
    i = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(6, activation="relu", name="h")(i)
    m = tf.keras.Model(i, tf.keras.layers.Dense(1, activation="sigmoid", name="y")(h))
    m.compile(tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9), "binary_crossentropy")
    return m

def listing(path):
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)

out = {}
# export_saved_model (tf.keras.estimator's), and the v1 spelling's export_savedmodel with
# model_to_estimator's export_outputs: the SavedModel of the trained weights, stock's.
for case, v1 in (("v2", False), ("v1 export_outputs", True)):
    for run, scope in RUNS:
        m = model()
        initial = m.predict(x, verbose=0)
        model_dir = os.path.join(root, case, run)
        convert = (tf.compat.v1 if v1 else tf).keras.estimator.model_to_estimator
        extra = {"export_outputs": {"y": tf.estimator.export.PredictOutput}} if v1 else {}
        with tpushim.patched(**scope):
            est = convert(keras_model=m, config=tf.estimator.RunConfig(
                model_dir=model_dir, tf_random_seed=3), **extra)
        est.train(train_input, steps=5)
        receiver = tf.estimator.export.build_raw_serving_input_receiver_fn(
            {"x": tf.zeros([1, 4])})
        base = os.path.join(root, case, "export-" + run)
        if v1:
            path = est.export_savedmodel(base, receiver)
        else:
            path = est.export_saved_model(base, receiver)
        path = path.decode() if isinstance(path, bytes) else path
        loaded = tf.saved_model.load(path)
        signatures = {
            name: sorted(f.structured_outputs) for name, f in loaded.signatures.items()}
        served = loaded.signatures["serving_default"](x=tf.constant(x))
        served = {k: v.numpy().ravel().tolist() for k, v in served.items()}
        predicted = [float(p["y"][0]) for p in est.predict(
            lambda: tf.data.Dataset.from_tensor_slices({"x": x}).batch(8))]
        out.setdefault(case, {})[run] = dict(
            estimator=type(est).__name__, signatures=signatures, served=served,
            predicted=predicted, initial=initial.ravel().tolist(), files=listing(path),
            exports=os.listdir(base) == [os.path.basename(path)],
        )

def values(path):
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name).tolist()
            for name, dtype in reader.get_variable_to_dtype_map().items() if dtype.is_floating}

# model_to_estimator's own warm start: the trainable Keras weights as they were at conversion
# (saved in model_dir/keras), every other variable from its initializer (BatchNormalization's
# moving statistics after a Keras fit() too), as stock's tf.compat.v1.train.warm_start leaves them.
for run, scope in RUNS:
    tf.keras.utils.set_random_seed(1)
    i = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(6, activation="relu", name="h")(i)
    h = tf.keras.layers.BatchNormalization(name="bn")(h)
    m = tf.keras.Model(i, tf.keras.layers.Dense(1, activation="sigmoid", name="y")(h))
    m.compile(tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9), "binary_crossentropy")
    m.fit(x, y, batch_size=8, epochs=1, verbose=0)
    model_dir = os.path.join(root, "keras warm start", run)
    with tpushim.patched(**scope):
        est = tf.keras.estimator.model_to_estimator(keras_model=m, config=tf.estimator.RunConfig(
            model_dir=model_dir, tf_random_seed=3))
    keras = {w.name.split(":")[0]: w.numpy().tolist() for w in m.weights}
    m.get_layer("y").kernel.assign(tf.zeros([6, 1]))  # after conversion: stock never sees it
    est.train(lambda: train_input().map(lambda f, l: (f["x"], l)), steps=3)
    out.setdefault("keras warm start", {})[run] = dict(
        first=values(os.path.join(model_dir, "model.ckpt-0")), last=values(model_dir),
        keras=keras)

# tf.estimator.Estimator(model_fn=<converted>.model_fn, model_dir=, config=, warm_start_from=):
# the engine's estimator, warm-started from a checkpoint stock wrote (object-based, into the v1
# spelling's name-based one) as stock's is: a path (trainable variables), WarmStartSettings over
# every global variable (the momentum slots and the global step too), a vocabulary remapped by
# var_name_to_vocab_info; and with no warm start, every weight from its initializer.
def embedding_model():
    tf.keras.utils.set_random_seed(4)
    i = tf.keras.Input((1,), dtype=tf.int64, name="x")
    e = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(4, 2, name="emb")(i))
    m = tf.keras.Model(i, tf.keras.layers.Dense(1, name="y")(e))
    m.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    return m

ids = np.array([[0], [1], [2], [3]] * 4)
ids_input = lambda: tf.data.Dataset.from_tensor_slices((ids, ids.astype(np.float32))).batch(8).repeat()
for name, make, data in (("src", model, train_input), ("src-emb", embedding_model, ids_input)):
    src = tf.keras.estimator.model_to_estimator(  # stock's, outside the engine's scope
        keras_model=make(), model_dir=os.path.join(root, name))
    src.train(data, steps=3)
out["source embeddings"] = tf.train.load_variable(
    os.path.join(root, "src-emb"), "layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE"
).tolist()
with open(os.path.join(root, "old.txt"), "w") as f:
    f.write("a\nb\nc\nd\n")
with open(os.path.join(root, "new.txt"), "w") as f:
    f.write("d\nc\nx\na\n")
vocab = tf.estimator.VocabInfo(
    new_vocab=os.path.join(root, "new.txt"), new_vocab_size=4, num_oov_buckets=0,
    old_vocab=os.path.join(root, "old.txt"), backup_initializer=tf.compat.v1.ones_initializer())
CASES = (
    ("path", model, train_input, os.path.join(root, "src")),
    ("settings", model, train_input, tf.estimator.WarmStartSettings(
        os.path.join(root, "src"), vars_to_warm_start=[".*"])),
    ("vocabulary", embedding_model, ids_input, tf.estimator.WarmStartSettings(
        os.path.join(root, "src-emb"), vars_to_warm_start=".*",
        var_name_to_vocab_info={"emb/embeddings": vocab})),
    ("none", model, train_input, None),
)
class Subclass(tf.estimator.Estimator):
    pass
for run, scope in RUNS:
    for case, make, data, warm in CASES:
        m = make()
        with tpushim.patched(**scope):
            converted = tf.compat.v1.keras.estimator.model_to_estimator(
                keras_model=m, model_dir=os.path.join(root, "converted", case, run))
            model_dir = os.path.join(root, "rebuilt", case, run)
            est = tf.estimator.Estimator(
                model_fn=converted.model_fn, model_dir=model_dir,
                config=tf.estimator.RunConfig(tf_random_seed=2), warm_start_from=warm)
        est.train(data, steps=2)
        out.setdefault(case, {})[run] = dict(
            estimator=type(est).__name__, first=values(tf.train.get_checkpoint_state(
                model_dir).all_model_checkpoint_paths[0]), last=values(model_dir),
            steps=[os.path.basename(p) for p in tf.train.get_checkpoint_state(
                model_dir).all_model_checkpoint_paths],
            keras={w.name.split(":")[0]: w.numpy().tolist() for w in m.weights})
    # tf.estimator.add_metrics, then an Estimator built around that one's model_fn (warm-started
    # from stock's checkpoint): its evaluation has the added metrics, as stock's (41 rows: a
    # short last batch of 1, padded for the 8 devices).
    def added(labels, predictions, features):
        auc = tf.keras.metrics.AUC(name="auc")
        auc.update_state(labels, predictions["y"])
        return {"auc": auc, "mean_x": tf.compat.v1.metrics.mean(features["x"]),
                "loss_like": tf.compat.v1.metrics.mean(predictions["y"])}
    with tpushim.patched(**scope):
        converted = tf.compat.v1.keras.estimator.model_to_estimator(
            keras_model=model(), model_dir=os.path.join(root, "converted", "added", run))
        with_metrics = tf.estimator.add_metrics(converted, added)
        est = tf.estimator.Estimator(
            model_fn=with_metrics.model_fn, model_dir=os.path.join(root, "added", run),
            warm_start_from=os.path.join(root, "src"))
    est.train(train_input, steps=2)
    xs, ys = np.concatenate([x, x[:1]]), np.concatenate([y, y[:1]])
    got = est.evaluate(lambda: tf.data.Dataset.from_tensor_slices(({"x": xs}, ys)).batch(8))
    out.setdefault("added", {})[run] = dict(
        estimators=[type(with_metrics).__name__, type(est).__name__],
        results={k: float(v) for k, v in got.items()})
    with tpushim.patched(**scope):
        try:
            Subclass(model_fn=converted.model_fn, model_dir=os.path.join(root, "sub", run))
            out.setdefault("subclass", {})[run] = "built"
        except tpushim.ConversionError as e:
            out.setdefault("subclass", {})[run] = " ".join(str(e).split())
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    work = tmp_path_factory.mktemp("jax_export")
    proc = procs.python([work], code=PROGRAM, env=ENV, cwd=work, timeout=600)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.parametrize("case", ["v2", "v1 export_outputs"])
def test_export_saved_model_serves_what_stocks_serves(answers, case):
    engine, stock = answers[case]["engine"], answers[case]["stock"]
    assert engine["estimator"] == "JaxEstimator" and stock["estimator"] == "Estimator"
    # Stock's SavedModel: its files, signatures and output keys (export_outputs' too).
    assert engine["files"] == stock["files"]
    assert engine["signatures"] == stock["signatures"]
    if case == "v2":
        assert engine["signatures"] == {"serving_default": ["y"]}
    else:  # export_outputs' PredictOutput: a signature "y" too, its tensor's key "output"
        assert engine["signatures"] == {"serving_default": ["y"], "y": ["output"]}
    assert engine["exports"] and stock["exports"]  # one timestamped folder, as stock's
    served = next(iter(engine["served"].values()))
    # What stock serves after the same training, and what the engine predicts.
    np.testing.assert_allclose(served, next(iter(stock["served"].values())), atol=TOL)
    np.testing.assert_allclose(served, engine["predicted"], atol=TOL)
    np.testing.assert_allclose(stock["predicted"], engine["predicted"], atol=TOL)
    # Negative control: the untrained model's outputs are told apart (it exported the training).
    assert np.max(np.abs(np.array(served) - engine["initial"])) > 1e-3


def _largest_difference(got, want):
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    return max(float(np.max(np.abs(np.subtract(got[k], want[k])))) for k in want)


def test_model_to_estimators_warm_start_is_stocks(answers):
    # The Keras weights as saved at conversion, trainable ones only: model.ckpt-0 (the values
    # train() starts from) and the checkpoint after 3 steps equal stock's, slots and BatchNorm's
    # moving statistics included.
    engine, stock = answers["keras warm start"]["engine"], answers["keras warm start"]["stock"]
    assert _largest_difference(engine["first"], stock["first"]) <= TOL
    assert _largest_difference(engine["last"], stock["last"]) <= TOL
    # Negative control: starting from the Keras model's values then (its fit()'s moving
    # statistics, the kernel set after conversion) is told apart.
    first = {k.split("/.ATTRIBUTES")[0]: v for k, v in stock["first"].items()}
    assert (
        np.max(
            np.abs(
                np.subtract(
                    engine["keras"]["bn/moving_mean"], first["layer_with_weights-1/moving_mean"]
                )
            )
        )
        > 1e-3
    )
    assert np.max(np.abs(first["layer_with_weights-2/kernel"])) > 1e-3  # not the zeros set later


@pytest.mark.parametrize("case", ["path", "settings", "vocabulary"])
def test_an_estimator_built_around_it_warm_starts_as_stocks(answers, case):
    engine, stock = answers[case]["engine"], answers[case]["stock"]
    assert engine["estimator"] == "JaxEstimator" and stock["estimator"] == "Estimator"
    # The values the first step starts from, and those after 2 steps, are stock's.
    assert _largest_difference(engine["first"], stock["first"]) <= TOL
    assert _largest_difference(engine["last"], stock["last"]) <= TOL
    # The settings' list warm-starts the global step too: it goes on from stock's step 3.
    steps = (
        ["model.ckpt-3", "model.ckpt-5"] if case == "settings" else ["model.ckpt-0", "model.ckpt-2"]
    )
    assert engine["steps"] == stock["steps"] == steps
    # Negative control: the converted model's own Keras weights are not where it started.
    keras = np.ravel(engine["keras"]["emb/embeddings" if case == "vocabulary" else "h/kernel"])
    first = np.ravel(engine["first"]["emb/embeddings" if case == "vocabulary" else "h/kernel"])
    assert np.max(np.abs(keras - first)) > 1e-3
    if case == "vocabulary":  # remapped: rows d, c, x, a of a, b, c, d ("x" new: the backup)
        old = np.reshape(answers["source embeddings"], [4, 2])
        np.testing.assert_allclose(np.reshape(first, [4, 2]), [old[3], old[2], [1, 1], old[0]])


def test_an_estimator_built_around_it_without_warm_start_draws_fresh_weights(answers):
    # Stock draws every weight fresh in its graph; the engine draws its own from the same
    # initializers (biases 0, kernels not the Keras model's), and says so.
    for run in ("engine", "stock"):
        got = answers["none"][run]
        assert got["estimator"] == ("JaxEstimator" if run == "engine" else "Estimator")
        assert not np.any(got["first"]["h/bias"])
        assert (
            np.max(np.abs(np.subtract(got["first"]["h/kernel"], got["keras"]["h/kernel"]))) > 1e-3
        )


def test_a_subclass_built_around_it_is_refused_in_words(answers):
    assert answers["subclass"]["stock"] == "built"
    refused = answers["subclass"]["engine"]
    assert refused.startswith("tpushim's JAX engine does not run tf.estimator.Estimator(model_fn=")
    assert "from a subclass of tf.estimator.Estimator" in refused


def test_add_metrics_and_an_estimator_around_it_evaluate_as_stocks(answers):
    engine, stock = answers["added"]["engine"], answers["added"]["stock"]
    assert engine["estimators"] == ["JaxEstimator"] * 2 and stock["estimators"] == ["Estimator"] * 2
    assert {"auc", "mean_x", "loss_like", "loss", "global_step"} == set(stock["results"])
    assert engine["results"].keys() == stock["results"].keys()
    for key, value in stock["results"].items():
        assert abs(engine["results"][key] - value) <= TOL * max(1, abs(value)), key
