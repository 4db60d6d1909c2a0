"""Stock TensorFlow 2.15's behaviour for tpushim's estimator API on TensorFlow >= 2.16: scenarios
run on stock 2.15 (recorded into tests/reference/tf215_api.json by running this file with a
TensorFlow 2.15 environment) and, in tests/estimator_api/test_tf216_api.py, on TensorFlow >= 2.16 under tpushim.

Each scenario is the source of a program that prints ``RESULT <json>``; ``{patch}`` is where the
tpushim test puts ``import tpushim; tpushim.patch()`` (empty on stock).
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "reference", "tf215_api.json")

# What tests/estimator_api/test_tf216_api.py checks against: RESULT of each scenario ("results") and TF 2.15's
# estimator API names ("names").

# numpy_input_fn / pandas_input_fn with shuffle=True. Stock starts each reader at a random row
# drawn after random.seed(None) (OS entropy): the program pins that entropy (the environment), so
# stock's order is reproducible where its queue closes before the first read (<= 250 rows).
SHUFFLE = """
import json, random, sys
{patch}
_seed = random.seed
random.seed = lambda a=None, *args, **kwargs: _seed(1234 if a is None else a)
import numpy as np, pandas as pd, tensorflow as tf

def model_fn(features, labels, mode):
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={{"row": features["x"]}})
    x = tf.reshape(tf.cast(features["x"], tf.float32), [-1, 1])
    w = tf.compat.v1.get_variable("w", [1, 1], initializer=tf.compat.v1.zeros_initializer())
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
    target = tf.reshape(tf.cast(labels, tf.float32), [-1, 1])
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - target))
    step = tf.compat.v1.train.get_global_step()
    train = tf.compat.v1.train.GradientDescentOptimizer(0.3).minimize(loss, step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)

inputs = tf.compat.v1.estimator.inputs
rows = np.arange(100, dtype=np.float32)
x = np.linspace(0, 1, 60).astype(np.float32)
y = (3 * x + 1 + np.sin(37 * x)).astype(np.float32)
out = {{}}
for kind in ("numpy", "pandas"):
    est = tf.estimator.Estimator(model_fn, model_dir=sys.argv[1] + "/" + kind,
                                 config=tf.estimator.RunConfig(tf_random_seed=7))
    if kind == "numpy":
        make = lambda x, y=None, **kw: inputs.numpy_input_fn({{"x": x}}, y, batch_size=8, **kw)
    else:
        make = lambda x, y=None, **kw: inputs.pandas_input_fn(
            pd.DataFrame({{"x": x}}), None if y is None else pd.Series(y), batch_size=8, **kw)
    est.train(make(x, y, num_epochs=3, shuffle=True))
    metrics = est.evaluate(make(x[:50], y[:50], num_epochs=1, shuffle=True))
    order = [int(p["row"]) for p in est.predict(make(rows, num_epochs=2, shuffle=True))]
    out[kind] = dict(w=float(est.get_variable_value("w")[0, 0]),
                     b=float(est.get_variable_value("b")[0]),
                     loss=float(metrics["loss"]), global_step=int(metrics["global_step"]),
                     order=order)
print("RESULT " + json.dumps(out))
"""

# train_and_evaluate with BestExporter (default: loss; and a compare_fn on another metric),
# LatestExporter (exports_to_keep=2), FinalExporter and stop_if_no_decrease_hook reading the eval
# dir; then each hook of the family on that eval history (steps trained before it stops).
EXPORTERS = """
import json, os, sys
{patch}
import numpy as np, tensorflow as tf

def model_fn(features, labels, mode):
    x = tf.reshape(features["x"], [-1, 1])
    w = tf.compat.v1.get_variable("w", [1, 1], initializer=tf.compat.v1.zeros_initializer())
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
    pred = tf.matmul(x, w) + b
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={{"y": pred}})
    loss = tf.reduce_mean(tf.square(pred - labels))
    step = tf.compat.v1.train.get_global_step()
    train = tf.compat.v1.train.GradientDescentOptimizer(0.2).minimize(loss, step)
    mae = tf.compat.v1.metrics.mean_absolute_error(labels, pred)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train,
                                      eval_metric_ops={{"mae": mae}})

model_dir = os.path.join(sys.argv[1], "model")
x = np.linspace(0, 1, 64).astype(np.float32)
train_fn = lambda: tf.data.Dataset.from_tensor_slices(
    ({{"x": x}}, (3 * x + 1)[:, None])).repeat().batch(16)
eval_fn = lambda: tf.data.Dataset.from_tensor_slices(
    ({{"x": x}}, (1.5 * x + 1.2)[:, None])).batch(64)
receiver = tf.estimator.export.build_raw_serving_input_receiver_fn({{"x": tf.constant([0.0])}})
config = tf.estimator.RunConfig(tf_random_seed=7, save_checkpoints_steps=10,
                                log_step_count_steps=1000)
est = tf.estimator.Estimator(model_fn, model_dir=model_dir, config=config)
for kept in ("notes", "12345"):  # a user's folders: not an export's, never deleted
    os.makedirs(os.path.join(model_dir, "export", "latest", kept))
mae_smaller = lambda best_eval_result, current_eval_result: (
    current_eval_result["mae"] < best_eval_result["mae"])
exporters = [
    tf.estimator.BestExporter(serving_input_receiver_fn=receiver, exports_to_keep=3),
    tf.estimator.BestExporter("best_mae", receiver, compare_fn=mae_smaller, exports_to_keep=None),
    tf.estimator.LatestExporter("latest", receiver, exports_to_keep=2),
    tf.estimator.FinalExporter("final", receiver),
]
hook = tf.estimator.experimental.stop_if_no_decrease_hook(
    est, "loss", 20, run_every_secs=None, run_every_steps=10)
metrics, exports = tf.estimator.train_and_evaluate(
    est,
    tf.estimator.TrainSpec(train_fn, max_steps=200, hooks=[hook]),
    tf.estimator.EvalSpec(eval_fn, steps=None, exporters=exporters, throttle_secs=0),
)
out = dict(metrics={{k: float(v) for k, v in metrics.items()}},
           returned=[e is not None for e in exports])
history = {{}}
for name in tf.io.gfile.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(name):
        for value in event.summary.value:
            kind = value.WhichOneof("value")
            got = round(value.simple_value, 6) if kind == "simple_value" else (
                os.path.basename(value.tensor.string_val[0].decode()))
            history.setdefault(str(event.step), {{}})[value.tag] = got
out["history"] = history
for name in ("best_exporter", "best_mae", "latest", "final"):
    base = os.path.join(model_dir, "export", name)
    folders = sorted(tf.io.gfile.listdir(base)) if tf.io.gfile.exists(base) else []
    out[name] = [
        int(tf.train.load_variable(os.path.join(base, f, "variables", "variables"), "global_step"))
        if len(f.strip("/")) == 10 else f.strip("/") for f in folders]
out["stop_var"] = bool(est.get_variable_value("signal_early_stopping/STOP"))
# A restarted job: a new BestExporter starts from the best loss in the eval dir's event files.
exporters = [
    tf.estimator.BestExporter(serving_input_receiver_fn=receiver, exports_to_keep=3),
    tf.estimator.FinalExporter("final", receiver),
]
metrics, exports = tf.estimator.train_and_evaluate(
    est,
    tf.estimator.TrainSpec(train_fn, max_steps=70, hooks=[  # keeps the STOP variable
        tf.estimator.experimental.stop_if_no_decrease_hook(est, "loss", 1000)]),
    tf.estimator.EvalSpec(eval_fn, steps=None, exporters=exporters, throttle_secs=0),
)
out["restarted"] = dict(metrics={{k: float(v) for k, v in metrics.items()}},
                        returned=[e is not None for e in exports])
for name in ("best_exporter", "final"):
    base = os.path.join(model_dir, "export", name)
    out["restarted"][name] = [
        int(tf.train.load_variable(os.path.join(base, f, "variables", "variables"), "global_step"))
        for f in sorted(tf.io.gfile.listdir(base))]
exp = tf.estimator.experimental
family = dict(
    higher_stops=lambda: exp.stop_if_higher_hook(est, "loss", 0.0, run_every_steps=1,
                                                 run_every_secs=None),
    higher_runs=lambda: exp.stop_if_higher_hook(est, "loss", 1e9, run_every_steps=1,
                                                run_every_secs=None),
    lower_stops=lambda: exp.stop_if_lower_hook(est, "mae", 1e9, run_every_steps=1,
                                               run_every_secs=None),
    lower_min_steps=lambda: exp.stop_if_lower_hook(est, "mae", 1e9, min_steps=10**6,
                                                   run_every_steps=1, run_every_secs=None),
    no_increase=lambda: exp.stop_if_no_increase_hook(est, "mae", 10, run_every_steps=1,
                                                     run_every_secs=None),
    no_decrease_other_dir=lambda: exp.stop_if_no_decrease_hook(
        est, "loss", 1, eval_dir=os.path.join(sys.argv[1], "empty"), run_every_steps=1,
        run_every_secs=None),
    custom_every_2=lambda: exp.make_early_stopping_hook(est, lambda: True, run_every_secs=None,
                                                        run_every_steps=2),
)
trained = {{}}
for name, make in family.items():
    before = int(est.get_variable_value("global_step"))
    est.train(train_fn, steps=4, hooks=[make()])
    trained[name] = int(est.get_variable_value("global_step")) - before
out["family"] = trained
errors = []
for bad in (lambda: exp.make_early_stopping_hook(object(), lambda: True),
            lambda: exp.make_early_stopping_hook(est, lambda: True, 1, 1),
            lambda: exp.make_early_stopping_hook(est, 3),
            lambda: tf.estimator.BestExporter(compare_fn=None),
            lambda: tf.estimator.BestExporter(compare_fn=lambda a, b: True),
            lambda: tf.estimator.BestExporter(exports_to_keep=0),
            lambda: tf.estimator.LatestExporter("l", receiver, exports_to_keep=0)):
    try:
        bad()
        errors.append(None)
    except (TypeError, ValueError) as e:
        errors.append(type(e).__name__)
out["errors"] = errors
print("RESULT " + json.dumps(out))
"""

# RunConfig(train_distribute=, eval_distribute=) with a strategy of one replica (a CPU machine:
# MirroredStrategy() takes CPU:0 alone), and TF_CONFIG as a job launcher sets it for one process
# (a cluster of one "chief"): train(), evaluate(), train_and_evaluate() (whose chief trains and
# returns None: evaluation is an evaluator task's); clusters stock refuses, with its errors.
DISTRIBUTE = """
import json, os, random, sys
{patch}
import numpy as np, tensorflow as tf

def model():
    random.seed(0); np.random.seed(0); tf.random.set_seed(0)
    m = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="tanh", input_shape=(4,)),
                             tf.keras.layers.Dense(1)])
    m.compile(tf.keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    return m

rng = np.random.RandomState(0)
x = rng.normal(size=(100, 4)).astype("float32")
y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 0.1).astype("float32")
train = lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
test = lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(32)

def numbers(est):
    out = {{k: float(v) for k, v in est.evaluate(test).items()}}
    out["predictions"] = [float(next(iter(p.values()))[0]) for p in est.predict(test)][:5]
    return out

def run(name, **config):
    model_dir = os.path.join(sys.argv[1], name)
    conf = tf.estimator.RunConfig(tf_random_seed=1, model_dir=model_dir, **config)
    est = tf.keras.estimator.model_to_estimator(model(), config=conf)
    return conf, est, model_dir

out = {{}}
_, est, _ = run("plain")
est.train(train, steps=10)
out["plain"] = numbers(est)
conf, est, _ = run("one_replica", train_distribute=tf.distribute.MirroredStrategy(),
                   eval_distribute=tf.distribute.MirroredStrategy())
est.train(train, steps=10)
out["one_replica"] = numbers(est)

os.environ["TF_CONFIG"] = json.dumps({{"cluster": {{"chief": ["localhost:2222"]}},
                                       "task": {{"type": "chief", "index": 0}}}})
conf, est, _ = run("chief")
out["chief_config"] = [conf.task_type, conf.task_id, conf.is_chief, conf.master,
                       conf.num_worker_replicas, conf.num_ps_replicas,
                       conf.cluster_spec.as_dict()]
est.train(train, steps=10)
out["chief"] = numbers(est)
conf, est, model_dir = run("chief_tae")
returned = tf.estimator.train_and_evaluate(
    est, tf.estimator.TrainSpec(train, max_steps=10), tf.estimator.EvalSpec(test, throttle_secs=0))
out["chief_tae"] = dict(returned=repr(returned),
                        evaluated=os.path.isdir(os.path.join(model_dir, "eval")),
                        step=int(tf.train.latest_checkpoint(model_dir).rsplit("-", 1)[1]))
errors = {{}}
for name, cluster, task in (
    ("workers_only", {{"worker": ["localhost:1", "localhost:2"]}}, {{"type": "worker", "index": 0}}),
    ("two_chiefs", {{"chief": ["localhost:1", "localhost:2"]}}, {{"type": "chief", "index": 0}}),
    ("no_cluster_chief", None, {{"type": "chief", "index": 0}}),
):
    os.environ["TF_CONFIG"] = json.dumps(dict(task=task, **({{"cluster": cluster}} if cluster else {{}})))
    try:
        tf.estimator.RunConfig()
        errors[name] = None
    except ValueError as e:
        errors[name] = str(e)
out["errors"] = errors
print("RESULT " + json.dumps(out))
"""

# RunConfig(train_distribute=, eval_distribute=) with a MirroredStrategy of several replicas (2 and
# 4 logical CPU devices, made before TensorFlow initialises; the session's device_count gives a
# tf.compat.v1 session those devices), model_to_estimator's v1 spelling (name-based checkpoints:
# stock's v2 spelling fails there, building its Saver inside a replica) and the v1 strategy class:
# and a one-worker MultiWorkerMirroredStrategy over 2 devices, either API's class (stock trains it as
# the Mirrored one):
# each replica takes its own batch of the input_fn's Dataset (a step reads replicas x 8 rows),
# BatchNormalization's statistics are each replica's, the evaluated loss is the replicas' mean of
# each one's loss divided by the replicas (stock's).
REPLICAS = """
import json, os, random, sys
{patch}
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

def model():
    random.seed(0); np.random.seed(0); tf.random.set_seed(0)
    m = tf.keras.Sequential([tf.keras.layers.Dense(8, input_shape=(4,), name="hidden"),
                             tf.keras.layers.BatchNormalization(name="norm"),
                             tf.keras.layers.Activation("tanh", name="tanh"),
                             tf.keras.layers.Dense(1, name="out")])
    m.compile(tf.keras.optimizers.SGD(0.05, momentum=0.5), "mse", metrics=["mae"])
    return m

rng = np.random.RandomState(0)
x = rng.normal(size=(100, 4)).astype("float32")
y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 0.1).astype("float32")
contexts = []

def train(input_context=None):
    if input_context is not None:
        contexts.append([input_context.num_input_pipelines, input_context.input_pipeline_id,
                         input_context.num_replicas_in_sync])
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()

test = lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
session = tf.compat.v1.ConfigProto(allow_soft_placement=True, device_count={{"CPU": 4}})

def run(name, convert=tf.compat.v1.keras.estimator.model_to_estimator, **config):
    conf = tf.estimator.RunConfig(tf_random_seed=1, session_config=session,
                                  model_dir=os.path.join(sys.argv[1], name), **config)
    est = convert(model(), config=conf)
    est.train(train, steps=6)
    out = {{k: float(v) for k, v in est.evaluate(test).items()}}
    out["predictions"] = [float(p["out"][0]) for p in est.predict(test)][:5]
    out["weights"] = {{n: float(np.sum(est.get_variable_value(n)))
                      for n in est.get_variable_names() if n.split("/")[0] in ("hidden", "norm", "out")
                      and "momentum" not in n.lower()}}
    return out

devices = lambda n: ["/cpu:%d" % i for i in range(n)]
if os.environ.get("REPLICAS_ONLY"):  # one case of the scenario (a test's negative control)
    n = int(os.environ["REPLICAS_ONLY"])
    strategy = tf.distribute.MirroredStrategy(devices(n))
    out = {{"mirrored%d" % n: run("m%d" % n, train_distribute=strategy, eval_distribute=strategy)}}
    print("RESULT " + json.dumps(out))
    sys.exit(0)
out = {{"plain": run("plain")}}
for n in (2, 4):
    strategy = tf.distribute.MirroredStrategy(devices(n))
    out["mirrored%d" % n] = run("m%d" % n, train_distribute=strategy, eval_distribute=strategy)
out["input_contexts"] = contexts
out["v1_mirrored2"] = run("v1", train_distribute=tf.compat.v1.distribute.MirroredStrategy(devices(2)),
                          eval_distribute=tf.compat.v1.distribute.MirroredStrategy(devices(2)))
out["train_only4"] = run("t4", train_distribute=tf.distribute.MirroredStrategy(devices(4)))
try:
    run("v2", convert=tf.keras.estimator.model_to_estimator,
        train_distribute=tf.distribute.MirroredStrategy(devices(2)))
    out["v2_object_checkpoints"] = None
except Exception as e:
    out["v2_object_checkpoints"] = type(e).__name__
    written = os.path.join(sys.argv[1], "v2")
    out["v2_object_checkpoints_written"] = sorted(os.listdir(written)) if os.path.isdir(written) else []
# A MultiWorkerMirroredStrategy of one worker over 2 devices (a machine with 2 GPUs: made from
# the devices, as TensorFlow's own tests make one), last: it turns on collective ops.
collective = tf.distribute.MultiWorkerMirroredStrategy._from_local_devices(devices(2))
out["multi_worker2"] = run("mw2", train_distribute=collective, eval_distribute=collective)
from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver
collective = tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy()  # its v1 class
collective.extended._initialize_local(TFConfigClusterResolver(), devices=devices(2))
out["v1_multi_worker2"] = run("v1mw2", train_distribute=collective, eval_distribute=collective)
print("RESULT " + json.dumps(out))
"""


# Labels of shape [batch] (a legacy script's own: one class id per row) for a 3-unit softmax:
# a user's loss function with metrics=["accuracy"] and weighted_metrics=["acc"] (stock compiles its clone in a graph,
# where Keras picks categorical accuracy for a loss it cannot name, and hands it the [batch]
# labels as they are: argmax over the batch's labels), and the sparse loss by name with the
# same metrics; 52 rows in batches of 8 (the last one short).
LABELS_1D = """
import json, os, random, sys
{patch}
import numpy as np, tensorflow as tf

def users_loss(y_true, y_pred):
    return tf.keras.losses.sparse_categorical_crossentropy(y_true, y_pred)

def model(loss):
    random.seed(0); np.random.seed(0); tf.random.set_seed(0)
    m = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)),
                             tf.keras.layers.Dense(3, activation="softmax")])
    m.compile(tf.keras.optimizers.SGD(0.1), loss, metrics=["accuracy"], weighted_metrics=["acc"])
    return m

rng = np.random.RandomState(0)
x = rng.rand(52, 4).astype("float32")
y = rng.randint(0, 3, size=52).astype("int64")
data = lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(8)

out = {{}}
for name, loss in (("users_loss", users_loss), ("sparse_by_name", "sparse_categorical_crossentropy")):
    conf = tf.estimator.RunConfig(tf_random_seed=1, model_dir=os.path.join(sys.argv[1], name))
    est = tf.keras.estimator.model_to_estimator(model(loss), config=conf)
    est.train(data, steps=3)
    out[name] = {{k: float(v) for k, v in est.evaluate(data).items()}}
print("RESULT " + json.dumps(out))
"""

SCENARIOS = {
    "shuffle": SHUFFLE,
    "exporters": EXPORTERS,
    "distribute": DISTRIBUTE,
    "replicas": REPLICAS,
    "labels_1d": LABELS_1D,
}


def run(name, workdir, patch="", python=sys.executable, env=None):
    """Runs scenario ``name`` in a subprocess with ``patch`` in place; returns its RESULT."""
    import procs  # (tests/: on sys.path under pytest, and beside this file when run)

    code = SCENARIOS[name].format(patch=patch)
    environment = dict(os.environ, PYTHONPATH=ROOT, TPUSHIM_AUTOPATCH="0", TF_CPP_MIN_LOG_LEVEL="2")
    environment.update(env or {})
    proc = subprocess.run(
        [python, "-c", code, str(workdir)],
        capture_output=True,
        text=True,
        env=environment,
        cwd=str(workdir),
        timeout=procs.scaled(600),
        check=False,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise AssertionError(f"scenario {name} failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def close(got, want, rel=1e-4):
    """``got`` equals ``want``: the same structure, floats within ``rel`` (another TF release)."""
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and set(got) == set(want)
            and all(close(got[k], want[k], rel) for k in want)
        )
    if isinstance(want, list):
        return (
            isinstance(got, list)
            and len(got) == len(want)
            and all(close(a, b, rel) for a, b in zip(got, want))
        )
    if isinstance(want, float):
        return abs(got - want) <= rel * abs(want) + 1e-6
    return got == want


def estimator_names():
    """Every public name of TensorFlow 2.15's ``tf.estimator`` and ``tf.compat.v1.estimator``
    (their submodules walked), as dotted paths."""
    import types

    import tensorflow as tf

    def walk(module, prefix):
        for name in sorted(dir(module)):
            if name.startswith("_"):
                continue
            value = getattr(module, name)
            if isinstance(value, types.ModuleType):
                yield from walk(value, f"{prefix}.{name}")
            else:
                yield f"{prefix}.{name}"

    return [
        *walk(tf.estimator, "tf.estimator"),
        *walk(tf.compat.v1.estimator, "tf.compat.v1.estimator"),
    ]


def record():
    """Runs every scenario on this (stock 2.15) TensorFlow and writes tests/reference/tf215_api.json."""
    import tempfile

    import tensorflow as tf

    out = {"tensorflow": tf.__version__, "python": sys.version.split()[0], "results": {}}
    out["names"] = estimator_names()
    for name in SCENARIOS:
        with tempfile.TemporaryDirectory() as tmp:
            out["results"][name] = run(name, tmp)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    record()
