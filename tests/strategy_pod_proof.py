"""Pods on the strategy engine, run as its own process (8 logical CPU devices must be made before
TensorFlow initialises): ``python strategy_pod_proof.py DIR`` prints one JSON object.

Each host's input is the function TPUStrategy calls once per host
(``distribute_datasets_from_function``), called here for every host id with a real
``tf.distribute.InputContext(num_input_pipelines=H, input_pipeline_id=h,
num_replicas_in_sync=8)``; host h feeds replicas ``[h*8/H, (h+1)*8/H)``. Every example's id
travels in feature 0. Reported, for 2 and 4 hosts:

* the exact path: each step's rows, per replica (padding weighted out), pooled over the hosts,
  against one board's (the same input on one host, the same seed), and every example fed once per
  epoch; also for unseeded input (every host's copy must still agree) and an evaluation with a
  partial last batch;
* the files path: the files each host reads (whole files of its own, on no other host), every
  example once per global epoch, and records parsed per record fed (the exact path's, H, beside);
* negative controls: host 1 feeding host 0's share (the checks above must fail);
* strings and lookups (a key passed through, a StringLookup) on 8 replicas, a faked 2-host pod
  and one board: numbers and keys against stock's, and the host layers' copies per pipeline;
* training on the engine with 8 replicas on a faked 2-host pod, every host feeding its share
  (``_strategy_input.emulated_hosts``): weights, evaluation and predictions against the stock
  estimator's (on TensorFlow >= 2.16: stock 2.15's numbers, recorded by ``--record FILE DIR`` in a
  TF 2.15 venv), and with host 1 feeding host 0's share (a negative control);
* training on the files path, 8 replicas on 2 and 4 emulated hosts each reading only its own
  files, against one board (the same model, files and seed on one input pipeline), and with each
  host's rows counted as its own batch's, not the global batch's (a negative control: every
  host's gradient hosts x one board's);
* the sparse-input program (tests/sparse_program.py: SparseTensor inputs, their readers run on
  each host) trained by 8 replicas on a faked 2-host pod: the rows the hosts feed, pooled, against
  one board's batches and stock's layers, weights and evaluate() against stock's, and host 1
  feeding host 0's share (a negative control).

``--tpu-strategy DIR`` (a process of its own): ``distributed_input`` on a real
``tf.distribute.TPUStrategy`` for a faked TPU system of 2 and 4 hosts (:func:`tpu_strategy_pods`).

A helper run by tests/proofs/test_strategy_pods.py, not a test module.
"""

import collections
import contextlib
import json
import logging
import os
import sys

import eight_devices  # first: 8 logical CPU devices, before TensorFlow initialises
import numpy as np
import sparse_program
import tensorflow as tf

import tpushim
from tpushim import _padding
from tpushim._strategy import input as _strategy_input

REPLICAS = 8
SIZES = (12, 4, 11, 5, 10, 6, 9, 7)  # 64 records in files of unequal size: even by size on 2, 4
EVAL_SIZES = (12, 4, 11, 5, 10, 6, 9, 13)  # 70: the last eval batch of 12 is partial
HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "reference", "strategy_pods_tf215.json")
NO_STOCK = eight_devices.NO_STOCK
PARSED = collections.Counter()  # records parsed, by id (the parse function counts them)


def write(directory, sizes):
    os.makedirs(directory)
    paths, start = [], 0
    for k, size in enumerate(sizes):
        paths.append(os.path.join(directory, f"part-{k}.tfrecord"))
        with tf.io.TFRecordWriter(paths[-1]) as writer:
            for i in range(start, start + size):
                writer.write(str(i).encode())
        start += size
    return paths


def _count(ids):
    PARSED.update(int(i) for i in ids.numpy().reshape([-1]))
    return ids


def parse(record):
    i = tf.strings.to_number(record, tf.float32)
    i = tf.py_function(_count, [i], tf.float32)  # a host-side op, as input pipelines have
    i.set_shape([])
    return tf.stack([i, 0.5, 0.5, 0.5]), tf.cast(i, tf.int64) % 3


def inputs(paths, batch, repeat=True, shuffle_buffer=1000):
    pattern = os.path.join(os.path.dirname(paths[0]), "*.tfrecord")
    again = (lambda ds: ds.repeat()) if repeat else (lambda ds: ds)
    return {
        "no shuffle": lambda: again(tf.data.TFRecordDataset(paths).map(parse)).batch(batch),
        "shuffle": lambda: again(
            tf.data.TFRecordDataset(paths).map(parse).shuffle(shuffle_buffer)
        ).batch(batch),
        "list_files": lambda: again(
            tf.data.Dataset.list_files(pattern)  # shuffles the file names by default
            .interleave(tf.data.TFRecordDataset, cycle_length=2)
            .map(parse)
        ).batch(batch),
        "files shuffled": lambda: (
            tf.data.Dataset.list_files(pattern)
            .interleave(tf.data.TFRecordDataset, cycle_length=2)
            .map(parse)
            .shuffle(shuffle_buffer)
            .repeat()
            .batch(batch)
        ),
    }


class Config:
    def __init__(self, seed):
        self.tf_random_seed = seed
        self.session_config = None


def host_input(input_fn, hosts, seed, mode="train", pod_input="auto"):
    feeds = _strategy_input._blocks(REPLICAS, hosts)
    return _strategy_input.HostInput(input_fn, mode, Config(seed), None, feeds, pod_input)


class Unpinned(_strategy_input.HostInput):
    """A negative control: every host's copy built with a seed drawn for it alone."""

    def _build(self):
        self.seed = np.random.randint(1, 2**31 - 1)
        return super()._build()


def fed(pod, steps, who=lambda h: h):
    """Per step, per replica, the real ids it is fed, and per host the ids it fed;
    ``who(h)``: the pipeline id host h's function is called with (a negative control changes it)."""
    hosts = len(pod.feeds)
    per_host = []
    for h in range(hosts):
        context = tf.distribute.InputContext(hosts, who(h), REPLICAS)
        pieces = []
        for element in pod(context).take(steps * len(pod.feeds[h])):
            features = element[0]
            ids = features[_padding.FEATURES_KEY][:, 0].numpy()
            weight = features[_padding.PADDING_KEY].numpy()
            pieces.append([int(i) for i, w in zip(ids, weight) if w > 0])
        per_host.append(pieces)
    per_step = []
    for s in range(steps):
        step = []
        for h in range(hosts):
            k = len(pod.feeds[h])
            step += per_host[h][s * k : (s + 1) * k]
        per_step.append(step)
    return per_step, [sorted({i for p in pieces for i in p}) for pieces in per_host]


def every_once(per_step, n, epochs):
    ids = sorted(i for step in per_step for replica in step for i in replica)
    return ids == sorted(list(range(n)) * epochs)


def exact_checks(files):
    out = {}
    # 12 rows a step: padded to 16 for 8 replicas; 16 steps of 12 are 3 epochs of 64.
    cases = [
        ("no shuffle", 1, "auto"),
        ("shuffle", 1, "exact"),
        ("shuffle", None, "exact"),
        ("list_files", None, "exact"),
        ("list_files", 3, "exact"),
    ]
    for hosts in (2, 4):
        for name, seed, pod_input in cases:
            input_fn = inputs(files["train"], 12)[name]
            pod = host_input(input_fn, hosts, seed, pod_input=pod_input)
            steps, _ = fed(pod, 16)
            result = {"path": pod.path.name, "every_once": every_once(steps, 64, 3)}
            result["real_rows"] = sorted({sum(len(r) for r in step) for step in steps})
            if seed is not None:
                board, _ = fed(host_input(input_fn, 1, seed, pod_input=pod_input), 16)
                result["equals_one_board"] = steps == board
            control, _ = fed(pod, 16, who=lambda h: 0 if h == 1 else h)
            result["control_every_once"] = every_once(control, 64, 3)
            if seed is not None:
                result["control_equals_one_board"] = control == board
            else:  # each host's copy with a seed of its own: the copies disagree
                unpinned = host_input(input_fn, hosts, seed, pod_input=pod_input)
                unpinned.__class__ = Unpinned
                unpinned._first = None  # every copy, host 0's too, built anew
                result["unpinned_every_once"] = every_once(fed(unpinned, 16)[0], 64, 3)
            out[f"{hosts} {name} {seed}"] = result
        # evaluate(): 70 examples in batches of 12, the last partial, each evaluated once.
        input_fn = inputs(files["eval"], 12, repeat=False)["list_files"]
        pod = host_input(input_fn, hosts, None, mode="eval")
        steps, _ = fed(pod, 6)
        out[f"{hosts} evaluate"] = {
            "path": pod.path.name,
            "every_once": every_once(steps, 70, 1),
            "real_rows": [sum(len(r) for r in step) for step in steps],
        }
    return out


def files_checks(files):
    out = {}
    starts = np.cumsum((0, *SIZES))
    owner = {i: k for k in range(len(SIZES)) for i in range(starts[k], starts[k + 1])}
    for hosts in (2, 4):
        input_fn = inputs(files["train"], 16, shuffle_buffer=16)["files shuffled"]
        pod = host_input(input_fn, hosts, None)
        steps, per_host = fed(pod, 4 * 4)  # 16 steps of 16 rows: 4 global epochs
        host_files = [sorted({owner[i] for i in ids}) for ids in per_host]
        whole = all(
            ids == sorted(i for k in fs for i in range(starts[k], starts[k + 1]))
            for ids, fs in zip(per_host, host_files)
        )
        mine = [sorted(os.path.basename(p) for p in share) for share in pod.path.shares]
        control, control_hosts = fed(pod, 16, who=lambda h: 0 if h == 1 else h)
        result = {
            "path": pod.path.name,
            "whole_files": whole,
            "reads_its_share": [
                [f"part-{k}.tfrecord" for k in fs] == share for fs, share in zip(host_files, mine)
            ],
            "files_on_two_hosts": sum(len(f) for f in host_files)
            - len({k for f in host_files for k in f}),
            "every_once_per_epoch": every_once(steps[:4], 64, 1) and every_once(steps, 64, 4),
            "real_rows": sorted({sum(len(r) for r in step) for step in steps}),
            "control_every_once_per_epoch": every_once(control, 64, 4),
            "control_files_on_two_hosts": len(control_hosts[0])
            + len(control_hosts[1])
            - len({*control_hosts[0], *control_hosts[1]}),
        }
        # Records parsed per record fed, over a longer run (read-ahead: shuffle buffer, batch).
        for name, pod_input in (("files", "auto"), ("exact", "exact")):
            pod = host_input(input_fn, hosts, None, pod_input=pod_input)
            PARSED.clear()
            steps, _ = fed(pod, 200)
            rows = sum(len(r) for step in steps for r in step)
            result[f"parsed_per_fed_{name}"] = sum(PARSED.values()) / rows
        out[str(hosts)] = result
    return out


# --- training on the engine: 8 replicas, a faked 2-host pod ---------------------------------------

ROWS, BATCH, STEPS = 45, 10, 5
rng = np.random.RandomState(0)
X = rng.randn(ROWS, 4).astype(np.float32)
Y = (X[:, :1] * 2 - X[:, 1:2] + 0.1 * rng.randn(ROWS, 1)).astype(np.float32)


def model():
    tf.keras.utils.set_random_seed(1)
    m = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(5, input_shape=(4,), activation="tanh", name="hidden"),
            tf.keras.layers.Dense(1, name="out"),
        ]
    )
    m.compile(tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9), loss="mse", metrics=["mae"])
    return m


def train_input():  # shuffled (seeded by tf_random_seed): stock's batches only if each host agrees
    return tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(100).batch(BATCH)


def eval_input():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(BATCH)


def predict_input():
    return tf.data.Dataset.from_tensor_slices(X).batch(BATCH)


def config(model_dir):
    with tpushim.patched(mode="off", quiet=True):
        return tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=7)


def run(estimator, train_only=False):
    """(metrics, predictions, checkpoint values); ``train_only``: (None, None, values), what a
    negative control's assertion (its weights) reads."""
    estimator.train(train_input, steps=STEPS)
    metrics = predictions = None
    if not train_only:
        metrics = {k: float(v) for k, v in estimator.evaluate(eval_input).items()}
        predictions = np.array([p["out"] for p in estimator.predict(predict_input)])
    values = {
        n: np.asarray(estimator.get_variable_value(n), np.float64)
        for n in estimator.get_variable_names()
        if n != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }
    return metrics, predictions, values


def stock_run(root):
    if NO_STOCK:
        with open(RECORD) as f:
            recorded = json.load(f)
        return (
            recorded["metrics"],
            np.array(recorded["predictions"], np.float64),
            {n: np.array(v, np.float64) for n, v in recorded["values"].items()},
        )
    directory = os.path.join(root, "stock")
    with tpushim.patched(mode="off", quiet=True):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=model(), config=config(directory)
        )
    return run(estimator)


def engine_run(root, name, hosts=2, train_only=False):
    directory = os.path.join(root, name)
    with tpushim.patched(mode="cpu", engine="strategy", quiet=True):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=model(), config=config(directory)
        )
    if hosts is None:  # one input pipeline: one board
        return run(estimator, train_only), estimator.strategy.num_replicas_in_sync
    with _strategy_input.emulated_hosts(hosts):
        out = run(estimator, train_only)
    return out, estimator.strategy.num_replicas_in_sync


def differences(ours, stock):
    def rel(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))

    (m1, p1, v1), (m2, p2, v2) = ours, stock
    out = {"names_equal": sorted(v1) == sorted(v2), "weights": max(rel(v1[n], v2[n]) for n in v2)}
    if m1 is None:  # trained only
        return out
    return {
        **out,
        "metrics": max(rel(m1[k], m2[k]) for k in m2),
        "predictions": rel(p1, p2) if p1.shape == p2.shape else float("inf"),
    }


def training(root):
    stock = stock_run(root)
    ours, replicas = engine_run(root, "pod")
    board, _ = engine_run(root, "board", hosts=None)  # the shuffle seeded as stock's on one host
    original = _strategy_input.HostInput.__call__

    def host_one_feeds_host_zeros_share(self, context):
        if context.input_pipeline_id == 1:
            context = tf.distribute.InputContext(context.num_input_pipelines, 0, REPLICAS)
        return original(self, context)

    _strategy_input.HostInput.__call__ = host_one_feeds_host_zeros_share
    try:
        control, _ = engine_run(root, "control", train_only=True)
    finally:
        _strategy_input.HostInput.__call__ = original
    return {
        "replicas": replicas,
        "pod": differences(ours, stock),
        "board": differences(board, stock),
        "control": differences(control, stock),
    }


# --- training on the files path: 2 and 4 hosts, each reading only its own files -----------------

#: Every step one whole epoch of the files (64 records, each host's share of them even by size
#: on 2 and 4 hosts): the shares' own shuffles cannot change a step's rows, so one board's weights
#: are the pod's to float rounding. Two steps: a step's gradient and the next's, through momentum.
FILES_BATCH, FILES_STEPS = 64, 2


def parse_xy(record):
    """A record's id as 4 features (the same on any host) and a regression label."""
    i = tf.strings.to_number(record, tf.float32)
    x = tf.stack([tf.sin(i), tf.cos(0.7 * i), i / 64.0 - 0.5, tf.sin(1.3 * i + 1.0)])
    return x, 2.0 * x[:1] - x[1:2] + 0.1 * x[3:]


def files_input(paths):
    """Shuffled, endless input read from files (``list_files``): the files path, on a pod."""
    pattern = os.path.join(os.path.dirname(paths[0]), "*.tfrecord")

    def input_fn():
        return (
            tf.data.Dataset.list_files(pattern)
            .interleave(tf.data.TFRecordDataset, cycle_length=2)
            .map(parse_xy)
            .shuffle(FILES_BATCH)
            .repeat()
            .batch(FILES_BATCH)
        )

    return input_fn


class _Paths(logging.Handler):
    """The path each pod call's input took (the engine's INFO line)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        message = record.getMessage()
        if "TPU hosts:" in message:
            self.lines.append(message)


def files_run(root, name, paths, hosts):
    """Weights after FILES_STEPS steps of the engine: on ``hosts`` emulated hosts (None: one
    board), and the path line of each pod call."""
    with tpushim.patched(mode="cpu", engine="strategy", quiet=True):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=model(), config=config(os.path.join(root, name))
        )
    logger = logging.getLogger("tpushim")
    handler, level = _Paths(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with _strategy_input.emulated_hosts(hosts) if hosts else contextlib.nullcontext():
            estimator.train(files_input(paths), steps=FILES_STEPS)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    values = {
        n: np.asarray(estimator.get_variable_value(n), np.float64)
        for n in estimator.get_variable_names()
        if n != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }
    return (None, None, values), handler.lines


def files_training(root, paths):
    """8 replicas trained on the files path of 2 and 4 emulated hosts against one board (the
    same model, files and seed on one input pipeline); and, the negative control, each host's
    rows counted as its own batch's (the global count left out: every host's gradient hosts x
    one board's)."""
    board, _ = files_run(root, "files_board", paths, None)
    original = _padding.pad_batch

    def own_count(batch_size, counted=False, global_count=None):
        return original(batch_size, counted)

    out = {}
    for hosts in (2, 4):
        ours, lines = files_run(root, f"files_pod{hosts}", paths, hosts)
        _padding.pad_batch = own_count
        try:
            control, control_lines = files_run(root, f"files_control{hosts}", paths, hosts)
        finally:
            _padding.pad_batch = original
        out[str(hosts)] = {
            "paths": [line.split(": ")[1] for line in lines],
            "pod": differences(ours, board),
            "control_paths": [line.split(": ")[1] for line in control_lines],
            "control": differences(control, board),
        }
    return out


# --- strings and lookups on a faked 2-host pod (tpushim/_host_part.py) -------------------

CITIES = ["oslo", "lima", "pune"]
KEYS = np.array([[f"row-{i}"] for i in range(ROWS)])
CITY = np.array([[CITIES[i % 3]] for i in range(ROWS)])


def strings_model():
    """A key passed through to an output (its loss weighed 0) and a StringLookup: run on each
    host, the replicas see numbers only."""
    tf.keras.utils.set_random_seed(1)
    x = tf.keras.Input((4,), name="x")
    key = tf.keras.Input((1,), dtype=tf.string, name="key")
    city = tf.keras.Input((1,), dtype=tf.string, name="city")
    ids = tf.keras.layers.StringLookup(vocabulary=CITIES, name="city_id")(city)
    vec = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(4, 2, name="city_vec")(ids))
    hidden = tf.keras.layers.Dense(5, activation="tanh", name="hidden")(
        tf.keras.layers.Concatenate()([x, vec])
    )
    out = tf.keras.layers.Dense(1, name="out")(hidden)
    key_out = tf.keras.layers.Lambda(tf.identity, name="key_out")(key)
    m = tf.keras.Model([x, key, city], {"out": out, "key_out": key_out})
    m.compile(
        tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9),
        loss={"out": "mse", "key_out": lambda y_true, y_pred: tf.constant(0.0)},
        loss_weights={"out": 1.0, "key_out": 0.0},
        metrics={"out": ["mae"]},
    )
    return m


def _strings_data(labels=True):
    features = {"x": X, "key": KEYS, "city": CITY}
    return tf.data.Dataset.from_tensor_slices(
        (features, {"out": Y, "key_out": KEYS}) if labels else features
    )


def strings_run(estimator):
    estimator.train(lambda: _strings_data().shuffle(100).batch(BATCH), steps=STEPS)
    metrics = {
        k: float(v) for k, v in estimator.evaluate(lambda: _strings_data().batch(BATCH)).items()
    }
    predicted = list(estimator.predict(lambda: _strings_data(False).batch(BATCH)))
    values = {
        n: np.asarray(estimator.get_variable_value(n), np.float64)
        for n in estimator.get_variable_names()
        if n != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }
    keys = [p["key_out"][0].decode() for p in predicted]
    return (metrics, np.array([p["out"] for p in predicted]), values), keys


def strings_stock(root):
    if NO_STOCK:
        with open(RECORD) as f:
            recorded = json.load(f)["strings"]
        return (
            recorded["metrics"],
            np.array(recorded["predictions"], np.float64),
            {n: np.array(v, np.float64) for n, v in recorded["values"].items()},
        ), recorded["keys"]
    with tpushim.patched(mode="off", quiet=True):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=strings_model(), config=config(os.path.join(root, "strings_stock"))
        )
    return strings_run(estimator)


def strings(root):
    """8 replicas on a faked 2-host pod and on one board: numbers and keys against stock's, and
    the host layers' copies made (one per host's pipeline per call)."""
    from tpushim import _host_part

    stock, stock_keys = strings_stock(root)
    copies = []
    original = _host_part._copy

    def counted(part):
        copies.append(part)
        return original(part)

    out = {}
    _host_part._copy = counted
    try:
        for name, hosts in (("pod", 2), ("board", None)):
            with tpushim.patched(mode="cpu", engine="strategy", quiet=True):
                estimator = tf.keras.estimator.model_to_estimator(
                    keras_model=strings_model(),
                    config=config(os.path.join(root, "strings_" + name)),
                )
            del copies[:]
            if hosts is None:
                ours, keys = strings_run(estimator)
            else:
                with _strategy_input.emulated_hosts(hosts):
                    ours, keys = strings_run(estimator)
            out[name] = dict(
                differences(ours, stock),
                keys_equal=keys == stock_keys,
                keys=len(keys),
                copies=len(copies),
                replicas=estimator.strategy.num_replicas_in_sync,
            )
    finally:
        _host_part._copy = original
    return out


# --- SparseTensor inputs (tests/sparse_program.py) on a faked 2-host pod ------------------------


def sparse_host_values(layers):
    """Per row of the sparse-input program, what stock's own layers compute from its
    SparseTensors (the host part each host runs), and the x input made dense: {name: [rows, n]}."""
    features, _ = sparse_program.features()
    made = features()
    return {
        "multi": layers["multi"](made["ids"]).numpy(),
        "count": layers["count"](made["ids"]).numpy(),
        "ops": layers["ops"](made["x"]).numpy(),
        "x": tf.sparse.to_dense(made["x"]).numpy(),
    }


def sparse_run(root, name, control=False):
    """The sparse-input program on the engine, 8 replicas on 2 emulated hosts: 4 steps (every
    batch once, the last of 3) and evaluate(), every host's training input recorded;
    ``control``: host 1 feeding host 0's share (trained only). Returns (metrics, weights, fed),
    fed: per step, the (id, {feature: row}) of every real row the hosts fed, pooled in host
    order."""
    with tpushim.patched(mode="off", quiet=True):
        run_config = tf.estimator.RunConfig(model_dir=os.path.join(root, name), tf_random_seed=1)
    with tpushim.patched(mode="cpu", engine="strategy", quiet=True):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=sparse_program.model(), config=run_config
        )
    made, original = [], _strategy_input.HostInput.__call__

    def recorded(self, context):
        host = context.input_pipeline_id
        if control and host == 1:
            context = tf.distribute.InputContext(context.num_input_pipelines, 0, REPLICAS)
        dataset = original(self, context)
        if self.mode == "train":
            made.append((host, len(self.feeds[host]), dataset))
        return dataset

    metrics = None
    _strategy_input.HostInput.__call__ = recorded
    try:
        with _strategy_input.emulated_hosts(2):
            estimator.train(sparse_program.input_fn(with_id=True), steps=4)
            if not control:
                metrics = estimator.evaluate(sparse_program.input_fn())
    finally:
        _strategy_input.HostInput.__call__ = original
    fed = [[] for _ in range(4)]
    for _, feeds, dataset in sorted(made, key=lambda m: m[0]):
        for k, (element, _) in enumerate(dataset.take(4 * feeds)):
            values = element[_padding.FEATURES_KEY]
            weight = element[_padding.PADDING_KEY].numpy()
            for r in np.flatnonzero(weight > 0):
                row = {
                    key.split("/")[1] if "/" in key else key: v.numpy()[r].tolist()
                    for key, v in values.items()
                }
                fed[k // feeds].append((int(row.pop("id")), row))
    return metrics, sparse_program.trained_weights(estimator), fed


def sparse_fed_as_one_board(fed, stock_rows):
    """Each step's pooled rows are one board's batch (rows 8s.. of the input, in order: every
    row once) and each row's host values stock's layers' on its SparseTensors within 1e-6."""
    for step, rows in enumerate(fed):
        if [i for i, _ in rows] != list(range(8 * step, min(8 * step + 8, sparse_program.ROWS))):
            return False
        for i, row in rows:
            for key, expected in stock_rows.items():
                if np.max(np.abs(np.asarray(row[key]) - expected[i])) > 1e-6:
                    return False
    return True


def sparse_stock(root):
    """Stock's weights after the sparse-input program's 4 steps: its estimator live (TensorFlow
    <= 2.15), else stock 2.15's recording."""
    if NO_STOCK:
        return sparse_program.stock_weights()
    with tpushim.patched(mode="off", quiet=True):
        run_config = tf.estimator.RunConfig(
            model_dir=os.path.join(root, "sparse_stock"), tf_random_seed=1
        )
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=sparse_program.model(), config=run_config
        )
    estimator.train(sparse_program.input_fn(), steps=4)
    return sparse_program.trained_weights(estimator)


def sparse(root):
    """The sparse-input program trained by 8 replicas on a faked 2-host pod (exact path: each
    host runs the host part, CategoryEncoding, the Lambda, the Dense input made dense, on its
    copy, and keeps its replicas' rows): the rows fed against one board's batches and stock's
    layers, the weights against stock's, evaluate() against stock 2.15's recording; and the
    negative control (host 1 feeding host 0's share)."""
    stock_rows = sparse_host_values({layer.name: layer for layer in sparse_program.model().layers})
    stock = sparse_stock(root)
    metrics, weights, fed = sparse_run(root, "sparse_pod")
    _, control_weights, control_fed = sparse_run(root, "sparse_control", control=True)

    def off(values):
        if sorted(values) != sorted(stock):
            return float("inf")
        return max(float(np.max(np.abs(values[n] - v))) for n, v in stock.items())

    return {
        "fed_as_one_board": sparse_fed_as_one_board(fed, stock_rows),
        "fed_rows": sorted(i for rows in fed for i, _ in rows),
        "weights": off(weights),
        "weights_compared": len(stock),
        "metrics": {k: abs(float(metrics[k]) - v) for k, v in sparse_program.STOCK_2_15.items()},
        "control_fed_as_one_board": sparse_fed_as_one_board(control_fed, stock_rows),
        "control_weights": off(control_weights),
    }


# --- distributed_input's pod branch on a real TPUStrategy (a process of its own) -------------


def tpu_strategy_pods(root):
    """``distributed_input`` on a ``tf.distribute.TPUStrategy`` for a faked TPU system of 2 and
    4 hosts (tpushim/_preflight/faketpu.py answers TensorFlow's TPU system query), its hosts
    in-process servers on loopback (``tf.config.experimental_connect_to_cluster``: each host's
    pipeline is made on its host's CPU, which must exist): the contexts TPUStrategy calls the
    dataset function with, the path, and the specs. Its TPU cores exist nowhere, so the
    distributed dataset is not read (its iterators fetch to them). Run by ``--tpu-strategy
    DIR``: connecting to a cluster changes the process's eager context for good."""
    import socket

    from tpushim._preflight import faketpu

    ports = []
    for _ in range(4):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    cluster = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{p}" for p in ports]})
    servers = [tf.distribute.Server(cluster, "worker", task_index=i) for i in range(4)]
    tf.config.experimental_connect_to_cluster(cluster)
    paths = write(os.path.join(root, "train"), SIZES)
    input_fn = inputs(paths, 16, shuffle_buffer=16)["files shuffled"]
    original = _strategy_input.HostInput.__call__
    out = {"servers": len(servers)}
    for hosts in (2, 4):
        with faketpu.faked_tpu_system(hosts=hosts, cores_per_host=REPLICAS // hosts) as fake:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(fake.master)
            strategy = tf.distribute.TPUStrategy(resolver)
        calls = []

        def recorded(self, context):
            calls.append((context.num_input_pipelines, context.input_pipeline_id))
            self.path_name = self.path.name
            pods.append(self)
            return original(self, context)

        pods = []
        _strategy_input.HostInput.__call__ = recorded
        try:
            made = _strategy_input.distributed_input(
                strategy, input_fn, "train", Config(None), None
            )
        finally:
            _strategy_input.HostInput.__call__ = original
        labels = tf.nest.flatten(made.dataset.element_spec[1], expand_composites=True)
        out[str(hosts)] = {
            "strategy": type(strategy).__name__,
            "calls": sorted(calls),
            "paths": sorted({pod.path_name for pod in pods}),
            "spec_rows": [int(made.spec[1].shape[0])],
            "steps": made.steps,
            "replica_label_specs": [s.shape.as_list() for s in labels],
        }
    return out


def record(path, root):
    metrics, predictions, values = stock_run(root)
    (s_metrics, s_predictions, s_values), s_keys = strings_stock(root)
    with open(path, "w") as f:
        json.dump(
            {
                "tensorflow": tf.__version__,
                "metrics": metrics,
                "predictions": predictions.tolist(),
                "values": {n: v.tolist() for n, v in values.items()},
                "strings": {
                    "metrics": s_metrics,
                    "predictions": s_predictions.tolist(),
                    "values": {n: v.tolist() for n, v in s_values.items()},
                    "keys": s_keys,
                },
            },
            f,
            indent=1,
            sort_keys=True,
        )
        f.write("\n")


def main(root):
    files = {
        "train": write(os.path.join(root, "train"), SIZES),
        "eval": write(os.path.join(root, "eval"), EVAL_SIZES),
    }
    out = {"tensorflow": tf.__version__, "stock_from": RECORD if NO_STOCK else "live"}
    out["exact"] = exact_checks(files)
    out["files"] = files_checks(files)
    out["training"] = training(root)
    out["files_training"] = files_training(root, files["train"])
    out["strings"] = strings(root)
    out["sparse"] = sparse(root)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--record":
        record(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "--tpu-strategy":
        print("RESULT " + json.dumps(tpu_strategy_pods(sys.argv[2])))
    else:
        main(sys.argv[1])
