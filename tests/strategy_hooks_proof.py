"""The user's SessionRunHooks on the strategy engine, against the stock estimator's from the same
runs: ``python strategy_hooks_proof.py DIR`` prints one JSON object (run as its own process: the
8 logical devices must be made before TensorFlow initialises).

Cases, each run by stock and by the engine on 8 logical CPU devices with steps_per_execution 3
(so a tf.function call spans the steps at which hooks stop), on a repeated input:

* ``stop_at``: ``StopAtStepHook(last_step=5)``, then ``StopAtStepHook(num_steps=4)`` with a
  hand-written hook that fetches the global step in before_run and records every call;
* ``request_stop``: a hand-written hook that fetches nothing and calls ``request_stop()`` in its
  4th after_run (the engine runs one step per call: it cannot foresee that stop);
* ``early``: ``train_and_evaluate`` (an evaluation at each save) with
  ``tf.estimator.experimental.stop_if_no_increase_hook`` on the eval loss (read from
  model_dir/eval) checked every step;
* ``early_steps``: ``make_early_stopping_hook`` checked every 2 steps, stopping at its 3rd check
  (in a new model_dir: stock's Keras estimator cannot restore a checkpoint beside an
  early-stopping hook: "Variables not initialized: signal_early_stopping/STOP");
* ``clock``: ``make_early_stopping_hook`` on a clock (``run_every_secs=0``: every step) that
  stops at its 4th check (in these three, stock's hook reads the global step variable in the
  session.run that increments it, a race: a stock run whose hook read a step after its
  increment is run again, see ``stock_case``);
* ``eval_predict``: evaluate() and predict() with the recording hook, and with the stopping
  hook (stock's evaluation and prediction end at the batch it stops at);
* ``counter``: ``StepCounterHook(every_n_steps=2)`` into its own directory and
  ``LoggingTensorHook({"step": "global_step"}, every_n_iter=3)`` over 7 steps.

Each records the hooks' calls with the global step they saw, the step each train() call ended
at, and the weights. Stock is stock TensorFlow 2.15's, recorded by ``python
strategy_hooks_proof.py --record tests/reference/strategy_hooks_tf215.json DIR`` (on 2.15 it
runs live with ``TPUSHIM_TEST_EVERY_PROOF=1``).
A helper run by tests/proofs/test_strategy_hooks.py, not a test module.
"""

import json
import logging
import os
import re
import sys

import eight_devices  # first: 8 logical CPU devices, before TensorFlow initialises
import numpy as np
import tensorflow as tf

import tpushim

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "reference", "strategy_hooks_tf215.json")
#: Stock's side from its recording: on TensorFlow >= 2.16 (no stock estimator), and on 2.15 too
#: unless TPUSHIM_TEST_EVERY_PROOF=1 (the recording is stock 2.15's run of this program, the one
#: without its hooks' race; a live one costs about 60 CPU-seconds, retries included). The engine
#: runs live on every TensorFlow, on 2.15 inside stock's own estimator and MonitoredSession.
NO_STOCK = eight_devices.NO_STOCK or os.environ.get("TPUSHIM_TEST_EVERY_PROOF") != "1"

ROWS, BATCH = 60, 6
CASES = ("stop_at", "request_stop", "early", "early_steps", "clock", "counter", "eval_predict")


def data():
    rng = np.random.RandomState(0)
    x = rng.randn(ROWS, 4).astype(np.float32)
    y = (x[:, :1] * 2 - x[:, 1:2]).astype(np.float32)
    return x, y


def model():
    tf.keras.utils.set_random_seed(1)
    m = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(3, input_shape=(4,), activation="tanh", name="hidden"),
            tf.keras.layers.Dense(1, name="out"),
        ]
    )
    m.compile(tf.keras.optimizers.legacy.SGD(0.1), loss="mse")
    return m


class Recorder(tf.compat.v1.train.SessionRunHook):
    """A hand-written hook: every call, with the global step its fetch read."""

    def __init__(self, calls):
        self.calls = calls

    def begin(self):
        self.calls.append(["begin", None])
        self._step = tf.compat.v1.train.get_global_step()

    def after_create_session(self, session, coord):
        self.calls.append(["create", int(session.run(self._step))])

    def before_run(self, run_context):
        self.calls.append(["before", None])
        return tf.compat.v1.train.SessionRunArgs(self._step)

    def after_run(self, run_context, run_values):
        self.calls.append(["after", int(run_values.results)])

    def end(self, session):
        self.calls.append(["end", int(session.run(self._step))])


class Stopper(tf.compat.v1.train.SessionRunHook):
    """A hand-written hook that fetches nothing: stops in its ``at``-th after_run."""

    def __init__(self, at, calls):
        self.at, self.seen, self.calls = at, 0, calls

    def begin(self):
        self.calls.append(["begin", None])

    def after_run(self, run_context, run_values):
        self.seen += 1
        self.calls.append(["after", self.seen])
        if self.seen == self.at:
            run_context.request_stop()

    def end(self, session):
        self.calls.append(["end", self.seen])


def read_steps(hook, reads):
    """``hook`` with the global step each of its after_run calls read appended to ``reads``:
    stock's early-stopping hooks fetch it in the session.run that increments it, with no order
    between the two, so now and then they read the step after (and check and log at other
    steps)."""
    after = hook.after_run

    def after_run(run_context, run_values):
        reads.append(int(run_values.results))
        return after(run_context, run_values)

    hook.after_run = after_run
    return hook


def raced(out):
    """Whether a stock run's early-stopping hook read a global step after its step's increment
    (each train() here starts at step 0 in a new model_dir: its k-th read is k without a race)."""
    reads = out.get("reads")
    return reads is not None and reads != list(range(len(reads)))


def stops_at_check(count, calls):
    """A should_stop_fn that is True at its ``count``-th check."""

    def should_stop():
        calls.append(["check", len(calls)])
        return sum(1 for c in calls if c[0] == "check") >= count

    return should_stop


class Lines(logging.Handler):
    """The lines hooks write: LoggingTensorHook's ``step = S``, early stopping's request."""

    PATTERNS = (
        ("step", re.compile(r"^step = ")),  # the variable's handle: the schedule is compared
        ("early", re.compile(r"^Requesting early stopping at global step (\d+)")),
        ("rate", re.compile(r"^global_step/sec: ")),
    )

    def __init__(self):
        super().__init__()
        self.seen = []

    def emit(self, record):
        text = record.getMessage()
        for kind, pattern in self.PATTERNS:
            found = pattern.search(text)
            if found:
                self.seen.append([kind, int(found.group(1)) if found.groups() else None])


def estimator(model_dir, config, stock):
    settings = {"mode": "off"} if stock else {"mode": "cpu", "engine": "strategy"}
    settings.update(quiet=True) if stock else settings.update(quiet=True, iterations_per_loop=3)
    with tpushim.patched(**settings):
        return tf.keras.estimator.model_to_estimator(
            keras_model=model(), model_dir=model_dir, config=config
        )


def estimator_api():
    if hasattr(tf, "estimator"):
        return tf.estimator
    with tpushim.patched(mode="off", quiet=True):
        return tf.estimator


def tagged(directory, tag):
    """[step, value] of every scalar ``tag`` in ``directory``'s event files."""
    out = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("events.out.tfevents"):
            for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
                out += [[event.step, v.simple_value] for v in event.summary.value if v.tag == tag]
    return out


def case(name, root, stock):
    api = estimator_api()
    model_dir = os.path.join(root, name, "stock" if stock else "engine")
    x, y = data()

    def repeated():
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()

    def once():
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)

    lines = Lines()
    tf_logger = logging.getLogger("tensorflow")
    tf_logger.addHandler(lines)
    tf_logger.setLevel(logging.INFO)
    calls, ended, reads = [], [], []
    config = api.RunConfig(tf_random_seed=3, save_checkpoints_steps=3, log_step_count_steps=None)
    out = {}
    try:
        e = estimator(model_dir, config, stock)

        def train(hooks, **kwargs):
            e.train(repeated, hooks=hooks, **kwargs)
            ended.append(int(e.latest_checkpoint().rsplit("-", 1)[1]))

        if name == "stop_at":
            train([tf.compat.v1.train.StopAtStepHook(last_step=5)])
            train([Recorder(calls), tf.compat.v1.train.StopAtStepHook(num_steps=4)])
        elif name == "request_stop":
            train([Stopper(4, calls)], steps=10)
        elif name == "early":  # as scripts use it: evaluations at each save, in one call
            increase = api.experimental.stop_if_no_increase_hook(
                e, "loss", 3, run_every_secs=None, run_every_steps=1
            )
            api.train_and_evaluate(
                e,
                api.TrainSpec(repeated, max_steps=30, hooks=[read_steps(increase, reads)]),
                api.EvalSpec(once, steps=None, start_delay_secs=0, throttle_secs=0),
            )
            ended.append(int(e.latest_checkpoint().rsplit("-", 1)[1]))
            tf.compat.v1.summary.FileWriterCache.clear()
            out["evals"] = tagged(e.eval_dir(), "loss")
            out["reads"] = reads
        elif name == "early_steps":
            third = api.experimental.make_early_stopping_hook(
                e, stops_at_check(3, calls), run_every_secs=None, run_every_steps=2
            )
            train([read_steps(third, reads)], steps=10)
            out["reads"] = reads
        elif name == "clock":
            fourth = api.experimental.make_early_stopping_hook(
                e, stops_at_check(4, calls), run_every_secs=0, run_every_steps=None
            )
            train([read_steps(fourth, reads)], steps=10)
            out["reads"] = reads
        elif name == "eval_predict":
            train(None, steps=4)
            out["eval"] = [
                float(e.evaluate(once, hooks=[Recorder(calls)])["loss"]),
                float(e.evaluate(once, hooks=[Stopper(3, calls)])["loss"]),
            ]
            out["predicted"] = [
                len(list(e.predict(once, hooks=[Recorder(calls)]))),
                len(list(e.predict(once, hooks=[Stopper(2, calls)]))),
            ]
        else:
            counter_dir = os.path.join(model_dir, "counter")
            hooks = [
                tf.compat.v1.train.StepCounterHook(every_n_steps=2, output_dir=counter_dir),
                tf.compat.v1.train.LoggingTensorHook({"step": "global_step"}, every_n_iter=3),
            ]
            train(hooks, steps=7)
            tf.compat.v1.summary.FileWriterCache.clear()
            out["counter"] = [step for step, _ in tagged(counter_dir, "global_step/sec")]
        reader = tf.train.load_checkpoint(model_dir)
        out["weights"] = {
            n: reader.get_tensor(n).tolist()
            for n, _ in tf.train.list_variables(model_dir)
            if "layer_with_weights" in n and "OPTIMIZER" not in n
        }
    finally:
        tf_logger.removeHandler(lines)
    out.update(calls=calls, ended=ended, lines=lines.seen)
    return out


def stock_cases(root):
    if NO_STOCK:
        with open(RECORD, encoding="utf-8") as f:
            return json.load(f)
    return {"tensorflow": tf.__version__, **{name: stock_case(name, root) for name in CASES}}


def stock_case(name, root, tries=5):
    """Stock's run of ``name``; where its early-stopping hook's read raced with the step's
    increment (see ``read_steps``), run again in a new folder, up to ``tries`` runs: stock's
    run without the race is the one compared (the engine reads the step before it runs, as
    stock's StopAtStepHook does). ``retried`` counts the runs set aside."""
    for attempt in range(tries):
        out = case(name, os.path.join(root, f"run{attempt}") if attempt else root, True)
        if not raced(out):
            break
    out["retried"] = attempt
    return out


def main(root):
    stock = stock_cases(root)
    out = {
        "tensorflow": tf.__version__,
        "stock_tensorflow": stock["tensorflow"],
        "stock": {name: stock[name] for name in CASES},
        "engine": {name: case(name, root, False) for name in CASES},
    }
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--record":
        recorded = stock_cases(sys.argv[3])
        with open(sys.argv[2], "w", encoding="utf-8") as f:
            json.dump(recorded, f, indent=1, sort_keys=True)
            f.write("\n")
    else:
        main(sys.argv[1])
