"""The user's hooks, saving listeners, train_and_evaluate and TensorBoard events on the JAX engine
(``--mode cpu --engine jax``, 8 XLA CPU devices, ``iterations_per_loop`` 4) against stock's own
estimator on this TensorFlow (tpushim's estimator API's stock path, mode off), both in this one
process: hooks as legacy scripts write them (a StopAtStepHook, a LoggingTensorHook on the loss, a
hand-written hook recording its calls and the loss it fetched, a listener recording its saves),
the weights, metrics and predictions, the step-rate and logging lines, and the events files of
model_dir and model_dir/eval read back with ``summary_iterator``; and what the engine refuses
(a hook fetching a weight), with the files it left; train_and_evaluate with an exporter.

A helper run by tests/jax_engine/test_jax_hooks.py (``jax_hooks_proof.py ROOT``), not a test
module. Prints one ``RESULT {json}`` line.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import glob
import json
import logging
import sys

import numpy as np
import tensorflow as tf

import tpushim

ROOT = sys.argv[1]
ROWS, BATCH = 96, 16  # 6 batches an epoch; 8 devices take 2 rows each
RNG = np.random.RandomState(0)
X = RNG.rand(ROWS, 4).astype("float32")
Y = RNG.randint(0, 3, size=(ROWS, 1)).astype("int64")
ENGINES = {"stock": {"mode": "off"}, "jax": {"mode": "cpu", "engine": "jax"}}


def model():
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    m = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(8, activation="relu", input_shape=(4,), name="hidden"),
            tf.keras.layers.Dense(3, activation="softmax", name="out"),
        ]
    )
    m.compile(
        tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return m


def input_fn(repeat=True, labels=True):
    def fn():
        ds = tf.data.Dataset.from_tensor_slices((X, Y) if labels else X)
        return (ds.repeat() if repeat else ds).batch(BATCH)

    return fn


def convert(engine, model_dir, **config):
    config.setdefault("log_step_count_steps", 2)
    config.setdefault("save_summary_steps", 2)
    run_config = tf.estimator.RunConfig(**config) if hasattr(tf, "estimator") else None
    tpushim.patch(quiet=True, iterations_per_loop=4, **ENGINES[engine])
    try:
        if run_config is None:
            run_config = tf.estimator.RunConfig(**config)
        return tf.keras.estimator.model_to_estimator(
            keras_model=model(), model_dir=model_dir, config=run_config
        )
    finally:
        tpushim.unpatch()


def api():
    """tf.estimator: stock's, or tpushim's estimator API's where TensorFlow has none."""
    if hasattr(tf, "estimator"):
        return tf.estimator
    with tpushim.patched(mode="off", quiet=True):
        return tf.estimator


class Recorder(tf.compat.v1.train.SessionRunHook):
    """Records every call in order, and the loss it fetched per step (in training by stock's
    collection, in evaluation by its name); stops after ``stop_after`` after_runs."""

    def __init__(self, stop_after=None):
        self.calls, self.losses, self.stop_after, self.seen = [], [], stop_after, 0

    def begin(self):
        self.calls.append("begin")
        losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
        graph = tf.compat.v1.get_default_graph()
        self._loss = losses[0] if losses else graph.get_tensor_by_name("loss/mul:0")

    def after_create_session(self, session, coord):
        self.calls.append("after_create_session")

    def before_run(self, run_context):
        self.calls.append("before_run")
        return tf.compat.v1.train.SessionRunArgs(self._loss)

    def after_run(self, run_context, run_values):
        self.calls.append("after_run")
        self.losses.append(float(run_values.results))
        self.seen += 1
        if self.stop_after is not None and self.seen >= self.stop_after:
            run_context.request_stop()

    def end(self, session):
        self.calls.append("end")


class Listener(tf.compat.v1.train.CheckpointSaverListener):
    def __init__(self):
        self.calls = []

    def begin(self):
        self.calls.append(["begin"])

    def before_save(self, session, step):
        self.calls.append(["before_save", int(step)])

    def after_save(self, session, step):
        self.calls.append(["after_save", int(step)])

    def end(self, session, step):
        self.calls.append(["end", int(step)])


class Lines(logging.Handler):
    """TensorFlow's log lines: the user's LoggingTensorHook's, the step-rate lines."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def user_lines(lines):
    return [float(x.split(" = ")[1].split(" ")[0]) for x in lines if x.startswith("user_loss = ")]


def events(directory):
    """[(wall-time-free) what, tag or status, step, value] of every events file in ``directory``."""
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            if event.HasField("summary"):
                for value in event.summary.value:
                    simple = value.simple_value if value.HasField("simple_value") else None
                    out.append(["summary", value.tag, int(event.step), simple])
            elif event.HasField("session_log"):
                out.append(["session_log", int(event.session_log.status), int(event.step), None])
            elif event.HasField("graph_def"):
                out.append(["graph", "", int(event.step), None])
            elif event.HasField("meta_graph_def"):
                out.append(["meta_graph", "", int(event.step), None])
    return out


def weights(model_dir):
    reader = tf.train.load_checkpoint(model_dir)
    return {
        name: reader.get_tensor(name).tolist()
        for name in reader.get_variable_to_shape_map()
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH"  # weights, slots, step, hyperparameters
    }


def floats(results):
    return {k: float(v) for k, v in results.items()}


def run(engine, root):
    lines = Lines()
    logging.getLogger("tensorflow").addHandler(lines)
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    out = {}
    try:
        # train(): a StopAtStepHook, a LoggingTensorHook on the loss, the recorder, a listener.
        model_dir = os.path.join(root, engine, "train")
        estimator = convert(engine, model_dir, save_checkpoints_steps=3)
        recorder, listener = Recorder(), Listener()
        logging_hook = tf.compat.v1.train.LoggingTensorHook(
            {"user_loss": "loss/mul:0"}, every_n_iter=3
        )
        del lines.lines[:]
        estimator.train(
            input_fn(),
            steps=50,
            hooks=[tf.compat.v1.train.StopAtStepHook(last_step=7), logging_hook, recorder],
            saving_listeners=[listener],
        )
        out["train"] = {
            "calls": recorder.calls,
            "losses": recorder.losses,
            "listener": listener.calls,
            "user_lines": user_lines(lines.lines),
            "rate_lines": sum(x.startswith("global_step/sec: ") for x in lines.lines),
            "step": int(estimator.latest_checkpoint().rsplit("-", 1)[1]),
            "weights": weights(model_dir),
            "events": events(model_dir),
            "graph_pbtxt": os.path.exists(os.path.join(model_dir, "graph.pbtxt")),
        }
        # evaluate(): the recorder stops after 4 batches; a LoggingTensorHook on the loss.
        recorder = Recorder(stop_after=4)
        logging_hook = tf.compat.v1.train.LoggingTensorHook(
            {"user_loss": "loss/mul:0"}, every_n_iter=1
        )
        del lines.lines[:]
        results = estimator.evaluate(input_fn(repeat=False), hooks=[recorder, logging_hook])
        out["evaluate"] = {
            "results": floats(results),
            "calls": recorder.calls,
            "losses": recorder.losses,
            "user_lines": user_lines(lines.lines),
            "events": events(os.path.join(model_dir, "eval")),
        }
        # predict(): the recorder (no loss in predict: a hook of its own) stops after 2 batches.
        counter = _PredictCounter(stop_after=2)
        predictions = list(estimator.predict(input_fn(False, False), hooks=[counter]))
        out["predict"] = {
            "calls": counter.calls,
            "count": len(predictions),
            "last": predictions[-1]["out"].tolist(),
        }
        # train_and_evaluate: saves every 4 steps; throttle 0: evaluated at each save after the
        # first, and at the end; the specs' hooks.
        model_dir = os.path.join(root, engine, "tae")
        estimator = convert(engine, model_dir, save_checkpoints_steps=4)
        train_recorder, eval_recorder = Recorder(), Recorder()
        estimator_api = api()
        result, exports = estimator_api.train_and_evaluate(
            estimator,
            estimator_api.TrainSpec(input_fn(), max_steps=9, hooks=[train_recorder]),
            estimator_api.EvalSpec(
                input_fn(repeat=False), steps=2, throttle_secs=0, hooks=[eval_recorder]
            ),
        )
        out["train_and_evaluate"] = {
            "result": floats(result),
            "exports": list(exports or []),
            "train_calls": train_recorder.calls.count("after_run"),
            "eval_calls": eval_recorder.calls,
            "eval_losses": eval_recorder.losses,
            "weights": weights(model_dir),
            "events": events(model_dir),
            "eval_events": events(os.path.join(model_dir, "eval")),
        }
        if engine == "jax":
            out["refused"] = refusals(root)
    finally:
        logging.getLogger("tensorflow").removeHandler(lines)
    return out


class _PredictCounter(Recorder):
    def begin(self):
        self.calls.append("begin")
        self._loss = None

    def before_run(self, run_context):
        self.calls.append("before_run")

    def after_run(self, run_context, run_values):
        self.calls.append("after_run")
        self.seen += 1
        if self.seen >= self.stop_after:
            run_context.request_stop()


def files(directory):
    return sorted(
        os.path.relpath(os.path.join(d, f), directory)
        for d, _, names in os.walk(directory)
        for f in names
    )


def refusals(root):
    """The engine's refusals: (message, the files of model_dir before, after)."""
    model_dir = os.path.join(root, "jax", "refused")
    estimator = convert("jax", model_dir)
    before = files(model_dir)
    out = {}
    hook = tf.compat.v1.train.LoggingTensorHook({"w": "hidden/kernel:0"}, every_n_iter=1)
    try:
        estimator.train(input_fn(), steps=2, hooks=[hook])
        out["weight"] = None
    except tpushim.ConversionError as error:
        out["weight"] = [str(error), before, files(model_dir)]
    estimator_api = api()

    def serving_input_fn():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        return estimator_api.export.ServingInputReceiver({"hidden_input": x}, {"x": x})

    # train_and_evaluate with an exporter (after the refusal above: nothing was written) exports
    # stock's SavedModel from the engine's checkpoint at its evaluation.
    exporter = estimator_api.LatestExporter("latest", serving_input_fn)
    estimator_api.train_and_evaluate(
        estimator,
        estimator_api.TrainSpec(input_fn(), max_steps=2),
        estimator_api.EvalSpec(input_fn(repeat=False), steps=1, exporters=[exporter]),
    )
    exported = os.path.join(model_dir, "export", "latest")
    out["exporter"] = [
        sorted(os.listdir(os.path.join(exported, d))) for d in sorted(os.listdir(exported))
    ]
    return out


if __name__ == "__main__":
    got = {"tensorflow": tf.__version__}
    for name in ENGINES:
        got[name] = run(name, ROOT)
    print("RESULT " + json.dumps(got))
