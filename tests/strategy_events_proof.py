"""What the strategy engine writes and says around its steps, against the stock estimator's from
the same runs: ``python strategy_events_proof.py DIR`` prints one JSON object (run as its own
process: the 8 logical devices must be made before TensorFlow initialises).

Cases, each run by stock and by the engine on 8 logical CPU devices with steps_per_execution 3
(so a tf.function call spans stock's logging and summary steps):

* ``schedule``: two train() calls (7 steps, then 3), log_step_count_steps 3, save_summary_steps
  2, save_checkpoints_steps 4, then evaluate(): the log lines (``loss = L, step = S``,
  ``global_step/sec``, saves), the events in model_dir and model_dir/eval, the checkpoint state;
* ``nan``: a NaN in the 4th batch: the error, the lines, the events, the checkpoints after it;
* ``keep``: a checkpoint every step over two calls (keep_checkpoint_max 2, which stock's Keras
  estimator does not read: it keeps 5);
* ``secs``: save_checkpoints_secs instead of steps (a tiny interval: a save after every call,
  steps_per_execution 1, so after every step as stock's);
* ``summaries``: ``schedule``'s calls on a model whose layer makes a
  ``tf.compat.v1.summary.scalar`` of its input's mean (stock's tag ``probe/mean_1``) and a
  ``histogram`` of its values (``probe/values``), a scalar of its range (``probe/spread``)
  and histograms of its column means (``probe/columns``), of its rows less their column means
  (``probe/centred``) and of their cumulative sums (``probe/running``), computed across the
  rows: the global batch of 6 is one row on each of 6 replicas and padding on 2. Negative
  control (``summaries_control``, the engine only): each replica weighing 1 in the scalars'
  means, the padding replicas' rows gathered, and each replica's rows gathered as it computed
  them even where it mixed them.
* ``reported_control`` (the engine only): ``schedule``'s calls with replica 0's loss reported
  as the step's (times the replicas, as a TPU's shard 0's loss would be): the logged and written
  losses must then differ from stock's.

On TensorFlow >= 2.16 stock is stock TensorFlow 2.15's, recorded by
``python strategy_events_proof.py --record tests/reference/strategy_events_tf215.json DIR``.
A helper run by tests/proofs/test_strategy_events.py, not a test module.
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
from tpushim._strategy import step as _strategy_step
from tpushim._strategy import summary_walk as _summary_walk

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "reference", "strategy_events_tf215.json")
NO_STOCK = eight_devices.NO_STOCK

ROWS, BATCH = 60, 6
CASES = ("schedule", "nan", "keep", "secs", "summaries")


def data(nan_batch=None):
    rng = np.random.RandomState(0)
    x = rng.randn(ROWS, 4).astype(np.float32)
    y = (x[:, :1] * 2 - x[:, 1:2]).astype(np.float32)
    if nan_batch is not None:
        x[BATCH * nan_batch + 1, 0] = np.nan
    return x, y


class Probe(tf.keras.layers.Layer):
    """A layer making v1 summaries of its input (stock writes them in training): a scalar of
    its mean, a histogram of its values; a scalar of its range and histograms of its column
    means, of its rows less those, and of its rows' running sums, computed across the batch."""

    def call(self, inputs):
        tf.compat.v1.summary.scalar("mean", tf.reduce_mean(inputs))
        tf.compat.v1.summary.histogram("values", inputs)
        tf.compat.v1.summary.scalar("spread", tf.reduce_max(inputs) - tf.reduce_min(inputs))
        tf.compat.v1.summary.histogram("columns", tf.reduce_mean(inputs, 0))
        tf.compat.v1.summary.histogram("centred", inputs - tf.reduce_mean(inputs, 0))
        tf.compat.v1.summary.histogram("running", tf.cumsum(inputs, 0))
        return inputs


def model(probe=False):
    tf.keras.utils.set_random_seed(1)
    m = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(3, input_shape=(4,), activation="tanh", name="hidden"),
            *([Probe(name="probe")] if probe else []),
            tf.keras.layers.Dense(1, name="out"),
        ]
    )
    m.compile(tf.keras.optimizers.legacy.SGD(0.1), loss="mse", metrics=["mae"])
    return m


class Lines(logging.Handler):
    """TensorFlow's log lines stock's hooks write, as (kind, step, value)."""

    PATTERNS = (
        ("loss", re.compile(r"^loss = (\S+), step = (\d+)")),
        ("rate", re.compile(r"^global_step/sec: ")),
        ("save", re.compile(r"^Saving checkpoints for (\d+) ")),
        ("nan", re.compile(r"^Model diverged with loss = NaN")),
        ("final", re.compile(r"^Loss for final step: (\S+)\.$")),
        ("eval", re.compile(r"^Saving dict for global step (\d+): ")),
    )

    def __init__(self):
        super().__init__()
        self.seen = []

    def emit(self, record):
        text = record.getMessage()
        for kind, pattern in self.PATTERNS:
            found = pattern.search(text)
            if not found:
                continue
            groups = found.groups()
            if kind == "loss":
                self.seen.append([kind, int(groups[1]), float(groups[0])])
            elif kind in ("save", "eval"):
                self.seen.append([kind, int(groups[0]), None])
            elif kind == "final":
                self.seen.append([kind, None, float(groups[0])])
            else:
                self.seen.append([kind, None, None])


def events(directory):
    """Every event file's records in ``directory`` (not below), in order, as
    [kind, step, tag or path, value]; graphs and the file version left out."""
    out = []
    for name in sorted(os.listdir(directory)):
        if not name.startswith("events.out.tfevents"):
            continue
        for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
            what = event.WhichOneof("what")
            if what == "summary":
                for value in event.summary.value:
                    if value.HasField("simple_value"):
                        out.append(["scalar", event.step, value.tag, value.simple_value])
                    elif value.HasField("histo"):  # each number an entry: tag:field
                        h = value.histo
                        fields = {f: getattr(h, f) for f in ("min", "max", "num", "sum")}
                        fields["sum_squares"] = h.sum_squares
                        for i, (limit, count) in enumerate(zip(h.bucket_limit, h.bucket)):
                            if count:  # the buckets holding values (their index: the range's)
                                fields.update({f"limit{i}": limit, f"bucket{i}": count})
                        for field, number in fields.items():
                            out.append(["histo", event.step, f"{value.tag}:{field}", number])
                    else:
                        text = tf.make_ndarray(value.tensor).item().decode()
                        out.append(["text", event.step, value.tag, os.path.basename(text)])
            elif what == "session_log":
                log = event.session_log
                path = os.path.basename(log.checkpoint_path) if log.checkpoint_path else ""
                out.append(["session_log", event.step, int(log.status), path])
    return out


def checkpoints(model_dir):
    state = tf.train.get_checkpoint_state(model_dir)
    listed = [os.path.basename(p) for p in state.all_model_checkpoint_paths]
    return {"latest": os.path.basename(state.model_checkpoint_path), "listed": listed}


def estimator(model_dir, config, stock, probe=False):
    given = {"keras_model": model(probe), "model_dir": model_dir, "config": config}
    if probe:
        given["custom_objects"] = {"Probe": Probe}
    if stock:
        with tpushim.patched(mode="off", quiet=True):
            return tf.keras.estimator.model_to_estimator(**given)
    spe = 1 if config.save_checkpoints_secs else 3
    with tpushim.patched(mode="cpu", engine="strategy", iterations_per_loop=spe, quiet=True):
        return tf.keras.estimator.model_to_estimator(**given)


def run_config(**kwargs):
    estimator_api = tf.estimator if hasattr(tf, "estimator") else None
    if estimator_api is None:
        with tpushim.patched(mode="off", quiet=True):
            estimator_api = tf.estimator
    return estimator_api.RunConfig(tf_random_seed=3, **kwargs)


def case(name, root, stock):
    model_dir = os.path.join(root, name, "stock" if stock else "engine")
    lines = Lines()
    tf_logger = logging.getLogger("tensorflow")
    tf_logger.addHandler(lines)
    tf_logger.setLevel(logging.INFO)
    out = {"error": None}
    try:
        if name in ("schedule", "summaries", "summaries_control", "reported_control"):
            config = run_config(
                log_step_count_steps=3, save_summary_steps=2, save_checkpoints_steps=4
            )
            x, y = data()
        elif name == "nan":
            config = run_config(
                log_step_count_steps=3, save_summary_steps=2, save_checkpoints_steps=4
            )
            x, y = data(nan_batch=3)
        elif name == "keep":
            config = run_config(save_checkpoints_steps=1, keep_checkpoint_max=2)
            x, y = data()
        else:
            config = run_config(save_checkpoints_secs=1e-6, save_checkpoints_steps=None)
            x, y = data()

        def input_fn():
            return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)

        e = estimator(model_dir, config, stock, probe=name.startswith("summaries"))
        try:
            if name in ("schedule", "nan", "summaries", "summaries_control", "reported_control"):
                e.train(input_fn, steps=7)
                e.train(input_fn, steps=3)
                e.evaluate(input_fn)
            elif name == "keep":
                e.train(input_fn, steps=4)
                e.train(input_fn, steps=4)
            else:
                e.train(input_fn, steps=6)
        except Exception as error:  # the NaN case's: compared with stock's
            out["error"] = type(error).__name__
            out["message"] = str(error)[:2000]
    finally:
        tf_logger.removeHandler(lines)
    out["lines"] = lines.seen
    # Stock's writers flush every 120 s, and not when a hook raises: closed before reading.
    tf.compat.v1.summary.FileWriterCache.clear()
    out["events"] = events(model_dir)
    eval_dir = os.path.join(model_dir, "eval")
    out["eval_events"] = events(eval_dir) if os.path.isdir(eval_dir) else []
    out["checkpoints"] = checkpoints(model_dir)
    out["files"] = sorted(
        n[: -len(".index")] for n in os.listdir(model_dir) if n.endswith(".index")
    )
    return out


def stock_cases(root):
    if NO_STOCK:
        with open(RECORD, encoding="utf-8") as f:
            return json.load(f)
    return {"tensorflow": tf.__version__, **{name: case(name, root, True) for name in CASES}}


def main(root):
    stock = stock_cases(root)
    out = {
        "tensorflow": tf.__version__,
        "stock_tensorflow": stock["tensorflow"],
        "stock": {name: stock[name] for name in CASES},
        "engine": {name: case(name, root, False) for name in CASES},
    }
    weight, rows = _strategy_step.scalar_weight, _strategy_step.summary_rows
    keeps = _summary_walk.keeps_rows
    _strategy_step.scalar_weight = lambda element: tf.constant(1.0)  # every replica counts
    _strategy_step.summary_rows = lambda values, pad: values  # every replica's rows
    _summary_walk.keeps_rows = lambda *args: True  # a replica's rows as it computed them
    try:
        out["engine"]["summaries_control"] = case("summaries_control", root, False)
    finally:
        _strategy_step.scalar_weight, _strategy_step.summary_rows = weight, rows
        _summary_walk.keeps_rows = keeps
    host_sum = _strategy_step.host_sum
    # replica 0's loss as the step's: its share of the global loss times the replicas
    _strategy_step.host_sum = lambda strategy, value: (
        strategy.experimental_local_results(value)[0] * strategy.num_replicas_in_sync
    )
    try:
        out["engine"]["reported_control"] = case("reported_control", root, False)
    finally:
        _strategy_step.host_sum = host_sum
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--record":
        recorded = stock_cases(sys.argv[3])
        with open(sys.argv[2], "w", encoding="utf-8") as f:
            json.dump(recorded, f, indent=1, sort_keys=True)
            f.write("\n")
    else:
        main(sys.argv[1])
