"""The JAX engine on a pod, proven on CPU (tests/jax_engine/test_jax_pods.py reads its answers):
processes joined by ``jax.distributed`` on a loopback coordinator, each with its share of 8 XLA
CPU devices and gloo's collectives, each reading its own share of the input
(tpushim/_jax/_pod.py); beside them one process with all 8 devices (one board) and the stock
estimator (tpushim's estimator API, stock 2.15's numbers).

Roles (argv[1]):
  worker ROOT   one process of the pod (the environment names its place: JAX_COORDINATOR_ADDRESS,
                JAX_NUM_PROCESSES, JAX_PROCESS_ID): every input's share it feeds, the training's
                weights, and with the negative controls; writes ROOT/worker-<id>.json.
  board ROOT    one process, 8 devices: every input's global batches as one board reads them,
                and the same training; writes ROOT/board.json.
  stock ROOT    the same training on the stock estimator (TPUSHIM_MODE=off); ROOT/stock.json.
"""

import collections
import contextlib
import json
import logging
import os
import random
import re
import sys

ROLE, ROOT = sys.argv[1], sys.argv[2]
if ROLE == "board":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import numpy as np
import tensorflow as tf

import tpushim

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax_engine"))
import jax_recurrent  # (a recurrent_dropout classifier, stock 2.15's numbers recorded)
import sparse_program  # (tests/: the sparse-input program, stock 2.15's numbers recorded)

SIZES = (12, 4, 11, 5, 10, 6, 9, 7)  # 64 records in 8 files of unequal size (even by size on 2)
BATCH = 16
TRAIN_ROWS = 56
#: train()'s global batch: 20, 20, 16, each padded to 24 on 8 devices (8 do not divide 20; the
#: last batch short too), 12 rows a process on a pod of 2
TRAIN_BATCH = 20
PARSED = collections.Counter()  # records parsed, by id


def write_files(directory):
    paths, start = [], 0
    os.makedirs(directory, exist_ok=True)
    for k, size in enumerate(SIZES):
        paths.append(os.path.join(directory, f"part-{k}.tfrecord"))
        if not os.path.exists(paths[-1]):
            part = f"{paths[-1]}.{os.getpid()}.tmp"  # (the pod's processes write them at once)
            with tf.io.TFRecordWriter(part) as writer:
                for i in range(start, start + size):
                    writer.write(str(i).encode())
            os.replace(part, paths[-1])
        start += size
    return paths


def _count(ids):
    PARSED.update(int(i) for i in ids.numpy().reshape([-1]))
    return ids


def parse(record):
    i = tf.strings.to_number(record, tf.float32)
    i = tf.py_function(_count, [i], tf.float32)
    i.set_shape([])
    return {"id": i}, tf.cast(i, tf.int64) % 3


def xy(i):
    i = tf.cast(i, tf.float32)
    x = tf.stack([tf.sin(i), tf.cos(0.7 * i), i / 64.0 - 0.5, tf.sin(1.3 * i + 1.0)])
    return x, 2.0 * x[:1] - x[1:2] + 0.1 * x[3:]


def read_ahead_fixed(dataset):
    """``dataset`` without tf.data's autotuned prefetch: the records parsed per record fed
    (<= 1.05) count what the files path parses, not how far tf.data's own injected prefetch
    reads ahead, which grows on a loaded machine (1353 parsed for 1280 fed, seen once)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    return dataset.with_options(options)


def inputs(paths):
    """The inputs whose shares are compared, by name (each a global batch of 16)."""
    pattern = os.path.join(os.path.dirname(paths[0]), "*.tfrecord")
    return {
        # from_tensor_slices, shuffled by the graph seed: the exact path (it reads no files)
        "shuffle": lambda: (
            tf.data.Dataset.from_tensor_slices({"id": np.arange(60.0)})
            .shuffle(60)
            .map(lambda f: (f, tf.cast(f["id"], tf.int64) % 3))
            .batch(BATCH)
        ),
        # list_files (its own shuffle of the file names), asked for the exact path
        "list_files": lambda: read_ahead_fixed(
            tf.data.Dataset.list_files(pattern)
            .interleave(tf.data.TFRecordDataset, cycle_length=2)
            .map(parse)
            .batch(BATCH)
        ),
        # shuffled, endless, from files: the files path
        "files": lambda: read_ahead_fixed(
            tf.data.Dataset.list_files(pattern)
            .interleave(tf.data.TFRecordDataset, cycle_length=2)
            .map(parse)
            .shuffle(BATCH)
            .repeat()
            .batch(BATCH)
        ),
    }


class Config:
    def __init__(self, seed):
        self.tf_random_seed = seed
        self.session_config = None


def ids_of(batch):
    features = batch[0] if isinstance(batch, tuple) else batch
    return [int(i) for i in np.asarray(features["id"]).reshape([-1])]


def shares(input_fn, seed, pod_input, steps, control=None, rows_of=ids_of):
    """This process's rows of each global batch (``rows_of`` a batch's: their ids), its real
    rows' per step, and records parsed."""
    from tpushim._jax import _pod

    _pod.STATE.control = control
    PARSED.clear()
    out = []
    try:
        batches = _pod.host_batches(
            input_fn, "train", Config(seed), _pod.current(), None, pod_input
        )
        for k, share in enumerate(batches):
            if k >= steps:
                break
            real = [int(p) for p in share.pad]
            out.append([i for i, r in zip(rows_of(share.batch), real) if r])
        batches.close()
    finally:
        _pod.STATE.control = None
    return {"steps": out, "parsed": sum(PARSED.values())}


def numpy_input():
    """A shuffled numpy_input_fn (a queue its feeding thread fills from a start row it draws from
    the operating system's entropy): the exact path, its rows in stock's order."""
    estimator = getattr(tf.compat.v1, "estimator", None)
    if estimator is None or not hasattr(estimator, "inputs"):  # tpushim's on TF >= 2.16
        from tpushim._estimator_api import _api

        estimator = _api.build("tf.compat.v1.estimator")
    values = np.arange(60.0)
    return estimator.inputs.numpy_input_fn(
        {"id": values}, values.astype(np.int64) % 3, batch_size=BATCH, shuffle=True, num_epochs=1
    )


def queue_input(shuffled):
    """60 ids through stock's queues (a slice_input_producer, one epoch, in order), batched 16 by
    ``tf.compat.v1.train.batch`` (FIFO: one board's order is fixed) or ``shuffle_batch`` (a
    random order each run), the short last batch kept."""

    def input_fn():
        (i,) = tf.compat.v1.train.slice_input_producer(
            [tf.constant(np.arange(60.0))], num_epochs=1, shuffle=False
        )
        one = {"id": i, "y": tf.cast(i, tf.int64) % 3}
        kwargs = dict(batch_size=BATCH, num_threads=1, allow_smaller_final_batch=True)
        if shuffled:
            b = tf.compat.v1.train.shuffle_batch(
                one, capacity=40, min_after_dequeue=10, seed=7, **kwargs
            )
        else:
            b = tf.compat.v1.train.batch(one, capacity=40, **kwargs)
        return {"id": b["id"]}, b["y"]

    return input_fn


def queue_train_input():
    """The training's 56 rows through a FIFO queue (``tf.compat.v1.train.batch``): batches of
    16, 16, 16, 8 in order (the second train() call reads the first 2)."""
    rng = np.random.RandomState(3)
    x = rng.normal(size=(TRAIN_ROWS, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [0.25]], np.float32) + 0.1).astype(np.float32)

    def input_fn():
        row = tf.compat.v1.train.slice_input_producer([x, y], num_epochs=1, shuffle=False)
        bx, by = tf.compat.v1.train.batch(
            row, batch_size=BATCH, num_threads=1, capacity=40, allow_smaller_final_batch=True
        )
        return {"x": bx}, by

    return input_fn


CITIES = np.array([b"oslo", b"lima", b"pune", b"kobe"])  # "kobe": out of the vocabulary


def city_input(rows, batch, seed):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    city = CITIES[rng.randint(0, 4, size=(rows, 1))]
    y = (x[:, :1] - 0.5 * (city == b"lima") + 0.1).astype(np.float32)
    return lambda: tf.data.Dataset.from_tensor_slices(({"x": x, "city": city}, y)).batch(batch)


def city_metrics(labels, predictions, features):
    """A metric that reads the string feature: the mean prediction and error of "lima" rows."""
    lima = tf.cast(tf.equal(features["city"], "lima"), tf.float32)
    return {
        "lima_y": tf.compat.v1.metrics.mean(predictions["y"], weights=lima),
        "lima_error": tf.compat.v1.metrics.mean_absolute_error(
            labels, predictions["y"], weights=lima
        ),
    }


def strings_evaluated(model_dir):
    """A string feature through a ``StringLookup`` (on the host), trained 2 steps, then evaluate()
    over 44 rows (16, 16, 12) with ``add_metrics`` reading the strings: the metrics."""
    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input((4,), name="x")
    city = tf.keras.Input((1,), name="city", dtype=tf.string)
    ids = tf.keras.layers.StringLookup(vocabulary=["oslo", "lima", "pune"], name="lookup")(city)
    e = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(4, 2, name="emb")(ids))
    out = tf.keras.layers.Dense(1, name="y")(tf.keras.layers.Concatenate()([x, e]))
    model = tf.keras.Model([x, city], out)
    model.compile(tf.keras.optimizers.SGD(0.05), "mse")
    config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=11)
    estimator = tf.keras.estimator.model_to_estimator(model, config=config)
    estimator = tf.estimator.add_metrics(estimator, city_metrics)
    estimator.train(city_input(32, BATCH, 1), steps=2)
    metrics = estimator.evaluate(city_input(44, BATCH, 5))
    return {k: float(v) for k, v in metrics.items()}


def pinned_entropy(value):
    """The operating-system entropy Python's ``random.seed()`` takes, pinned to ``value`` (the
    feeding thread's start row: one per process, as on machines of their own)."""
    original = random.seed
    random.seed = lambda a=None, *args: original(value if a is None else a, *args)


def board_batches(input_fn, seed, steps, rows_of=ids_of):
    from tpushim import _stock_graphs

    _, result, session = _stock_graphs.input_session(
        input_fn, "train", Config(seed), queues_as_datasets=True
    )
    out = []
    with session:
        while len(out) < steps and not session.should_stop():
            try:
                out.append(rows_of(session.run(result)))
            except tf.errors.OutOfRangeError:
                break
    return out


def train_input():
    rng = np.random.RandomState(3)
    x = rng.normal(size=(TRAIN_ROWS, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [0.25]], np.float32) + 0.1).astype(np.float32)
    return lambda: tf.data.Dataset.from_tensor_slices(({"x": x}, y)).shuffle(64).batch(TRAIN_BATCH)


def eval_input(rows, batch):
    """``rows`` examples of the training's kind in batches of ``batch`` (the last one short)."""
    rng = np.random.RandomState(5)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [0.25]], np.float32) + 0.1).astype(np.float32)
    return lambda: tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(batch)


def _files(directory):
    """The files in ``directory``, events files named by time, host and process cut to their
    kind: one per writer (a pod's process 0 only)."""
    return sorted(re.sub(r"^(events\.out\.tfevents)\..*", r"\1", n) for n in os.listdir(directory))


def evaluated(estimator):
    """evaluate() over 44 rows (batches of 16, 16, 12) and predict() over 20 rows (batches of
    8, 8, 4): the metrics, the rows this process's predict() yields, the eval events' files."""
    metrics = estimator.evaluate(eval_input(44, 16))
    predicted = [p["y"].tolist() for p in estimator.predict(eval_input(20, 8))]
    if "jax" in sys.modules:  # on a pod, process 0 has written its eval events before any lists
        from tpushim._jax import _pod

        _pod.barrier("tpushim-proof-evaluated")
    return {
        "metrics": {k: float(v) for k, v in metrics.items()},
        "predictions": predicted,
        "eval_files": _files(estimator.eval_dir()) if os.path.isdir(estimator.eval_dir()) else [],
    }


class PaddingNotes(logging.Handler):
    """The padding notes tpushim logs (a global batch the devices do not divide), in order."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.said = []

    def emit(self, record):
        if "does not divide" in record.getMessage():
            self.said.append(record.getMessage())


def padded_calls(estimator):
    """evaluate() (one step) and predict() over global batches of 10, which 8 devices do not
    divide; the padding notes said in train(), then in these."""
    estimator.evaluate(eval_input(20, 10), steps=1)
    return len(list(estimator.predict(eval_input(10, 10))))


def recurrent(model_dir, evaluate=True):
    """:func:`jax_recurrent.classifier` (LSTM, GRU and SimpleRNN with ``recurrent_dropout``: a
    mask drawn per time step on the host) on the JAX engine: (metrics, weights); not
    ``evaluate``: trained only (no metrics)."""
    return jax_recurrent.classifier(model_dir, evaluate=evaluate, mode="cpu", engine="jax")


def train(model_dir, evaluate=False, again=True):
    """A Dense -> BatchNormalization -> Dropout (unseeded: stock's seeds from tf_random_seed and
    the op-seed counter) -> Dense model trained over the shuffled input to its end, then 2 more
    steps from a FIFO queue (:func:`queue_train_input`) in a second call (which reads process 0's checkpoint; not ``again``: none); its
    weights (``evaluate``: and :func:`evaluated`'s answers)."""
    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input((4,), name="x")
    h = tf.keras.layers.Dense(8, activation="relu", name="hidden")(x)
    h = tf.keras.layers.BatchNormalization(momentum=0.8, name="bn")(h)
    h = tf.keras.layers.Dropout(0.25, name="drop")(h)
    model = tf.keras.Model(x, tf.keras.layers.Dense(1, name="y")(h))
    model.compile(tf.keras.optimizers.SGD(0.05, momentum=0.9), "mse", metrics=["mae"])
    config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=11)
    estimator = tf.keras.estimator.model_to_estimator(model, config=config)
    estimator.train(train_input())
    if again:  # from a FIFO queue (tf.compat.v1.train.batch): its first 2 batches
        estimator.train(queue_train_input(), steps=2)
    names = [n for n in estimator.get_variable_names() if "global_step" not in n]
    names = [n for n in names if not n.startswith("_CHECKPOINTABLE")]
    (step,) = [n for n in estimator.get_variable_names() if "global_step" in n]
    out = evaluated(estimator) if evaluate else {}
    if evaluate and "jax" in sys.modules:  # (stock's logs no such note)
        out["padded_rows"] = padded_calls(estimator)
    if evaluate:  # the same checkpoint evaluated with a process feeding another's share
        from tpushim._jax import _pod

        if _pod.current() is not None:
            _pod.STATE.control = "other_share"
            try:
                out["control"] = evaluated(estimator)
            finally:
                _pod.STATE.control = None
    return {
        **out,
        "type": type(estimator).__name__,
        "weights": {n: np.asarray(estimator.get_variable_value(n)).tolist() for n in names},
        "step": int(estimator.get_variable_value(step)),
        # events files named by time, host and process: one per writer (a pod's process 0 only)
        "files": _files(model_dir),
    }


def sparse_rows(batch):
    """Each row of a batch of the sparse-input program's rows (tests/sparse_program.py): its number, then its sparse features'
    entries (absent ones -1)."""
    features = batch[0]
    dense = [
        tf.sparse.to_dense(tf.SparseTensor(*features[k]), default_value=-1).numpy()
        for k in ("ids", "x")
    ]
    return [[int(i), *a.tolist(), *b.tolist()] for i, a, b in zip(features["id"], *dense)]


def _sparse_weights(estimator):
    names = [n for n in estimator.get_variable_names() if "layer_with_weights" in n]
    return {n: np.asarray(estimator.get_variable_value(n)).tolist() for n in names}


def sparse_metrics(labels, predictions, features):
    """``add_metrics``' metrics reading the ``SparseTensor`` features: the mean over rows of a
    row's ``x`` entries summed times its prediction, and of its count of ``ids``."""
    x = tf.sparse.reduce_sum(features["x"], 1) * tf.reshape(predictions["y"], [-1])
    ids = tf.sparse.reduce_sum(tf.sparse.map_values(tf.ones_like, features["ids"]), 1)
    return {
        "x_y": tf.compat.v1.metrics.mean(x),
        "ids_count": tf.compat.v1.metrics.mean(tf.cast(ids, tf.float32)),
    }


def sparse_trained(model_dir, files=None):
    """The sparse-input program (tests/sparse_program.py) trained 4 steps and evaluated: its
    weights, metrics (:func:`sparse_metrics` added) and predictions. On tpushim's engines the 4 steps are 2 from its Dataset,
    then its last 2 batches (rows 16 to 26) from a FIFO queue of its ``SparseTensor`` rows
    (:func:`sparse_queue_input`): stock's 4 batches. ``files`` (a pattern): then 3 more steps on
    the sparse files (:func:`sparse_files_input`: a pod's files path), evaluated again
    (``"files"``)."""
    model = sparse_program.model()
    config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=1)
    estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
    if ROLE == "stock":
        estimator.train(sparse_program.input_fn(), steps=4)
    else:
        estimator.train(sparse_program.input_fn(), steps=2)
        estimator.train(sparse_queue_input(start=16), steps=2)
    estimator = tf.estimator.add_metrics(estimator, sparse_metrics)
    metrics = estimator.evaluate(sparse_program.input_fn())
    out = {
        "metrics": {k: float(v) for k, v in metrics.items()},
        "weights": _sparse_weights(estimator),
        "predictions": sparse_predicted(estimator),
    }
    if ROLE == "worker":  # the control: process 1 predicting process 0's rows
        from tpushim._jax import _pod

        _pod.STATE.control = "other_share"
        try:
            out["control_predictions"] = sparse_predicted(estimator)
        finally:
            _pod.STATE.control = None
    if files is not None:
        estimator.train(sparse_files_input(files), steps=3)
        metrics = estimator.evaluate(sparse_program.input_fn())
        out["files"] = {
            "metrics": {k: float(v) for k, v in metrics.items()},
            "weights": _sparse_weights(estimator),
        }
    return out


def sparse_predicted(estimator):
    """predict() of the sparse-input program's 27 rows (batches of 8, the last of 3): this
    process's predictions, in order."""
    return [p["y"].tolist() for p in estimator.predict(sparse_program.input_fn())]


def sparse_queue_input(with_id=False, start=0, shuffled=False):
    """The sparse-input program's rows from ``start`` on and their ``SparseTensor`` features
    through a FIFO queue (``tf.compat.v1.train.batch`` of each row's entries, one epoch, in
    order): all 27 in batches of 8, 8, 8, 3, its Dataset's (``with_id``: each row's number
    beside them, as ``"id"``; ``shuffled``: ``shuffle_batch``, in an order of its own)."""
    make, y = sparse_program.features()

    def input_fn():
        i, label = tf.compat.v1.train.slice_input_producer(
            [np.arange(start, sparse_program.ROWS, dtype=np.int64), y[start:]],
            num_epochs=1,
            shuffle=False,
        )
        row = {"y": label, "i": i}
        for name, s in make().items():
            columns = int(s.shape[1])
            one = tf.sparse.slice(s, tf.stack([i, tf.constant(0, tf.int64)]), [1, columns])
            row[name] = tf.sparse.reshape(one, [columns])
        kwargs = dict(batch_size=8, num_threads=1, capacity=32, allow_smaller_final_batch=True)
        if shuffled:
            b = tf.compat.v1.train.shuffle_batch(row, min_after_dequeue=8, seed=7, **kwargs)
        else:
            b = tf.compat.v1.train.batch(row, **kwargs)
        features = {"ids": b["ids"], "x": b["x"]}
        if with_id:
            features["id"] = tf.cast(b["i"], tf.float32)
        return features, b["y"]

    return input_fn


#: The sparse files: the sparse-input program's first 16 rows as tf.Examples, 4 files of 4
SPARSE_FILES, SPARSE_ROWS = 4, 16


def write_sparse_files(directory):
    """The sparse-input program's first 16 rows as tf.Examples in 4 files (4 rows each): its
    ids as a list of the present ones (read back by ``tf.io.VarLenFeature``), its floats as
    (index, value) lists (``tf.io.SparseFeature``), the row's number and label."""
    make, y = sparse_program.features()
    dense = {
        k: tf.sparse.to_dense(s, default_value=-1).numpy() for k, s in make().items()
    }  # (x's absent entries: 0 in the program, -1 here)
    os.makedirs(directory, exist_ok=True)
    paths = []
    for k in range(SPARSE_FILES):
        paths.append(os.path.join(directory, f"sparse-{k}.tfrecord"))
        if os.path.exists(paths[-1]):
            continue
        part = f"{paths[-1]}.{os.getpid()}.tmp"  # (both workers write them)
        with tf.io.TFRecordWriter(part) as writer:
            for r in range(k * 4, k * 4 + 4):
                ids = [int(v) for v in dense["ids"][r] if v != -1]
                (where,) = np.nonzero(dense["x"][r] != -1)
                feature = {
                    "id": tf.train.Feature(float_list=tf.train.FloatList(value=[r])),
                    "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                    "x_index": tf.train.Feature(int64_list=tf.train.Int64List(value=where)),
                    "x_value": tf.train.Feature(
                        float_list=tf.train.FloatList(value=dense["x"][r][where])
                    ),
                    "y": tf.train.Feature(float_list=tf.train.FloatList(value=y[r])),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
        os.replace(part, paths[-1])
    return os.path.join(directory, "sparse-*.tfrecord")


def sparse_files_input(pattern, with_id=False):
    """The sparse files shuffled and repeated forever, in global batches of 16 (each one every
    row once: the shuffle is before the repeat): a pod's files path."""

    def parse_sparse(record):
        spec = {
            "id": tf.io.FixedLenFeature([], tf.float32),
            "ids": tf.io.VarLenFeature(tf.int64),
            "x": tf.io.SparseFeature("x_index", "x_value", tf.float32, 5),
            "y": tf.io.FixedLenFeature([1], tf.float32),
        }
        parsed = tf.io.parse_single_example(record, spec)
        # (ids: a batch's as wide as its longest list, on a pod each process's own batch's)
        features = {"ids": parsed["ids"], "x": parsed["x"]}
        if with_id:
            i = tf.py_function(_count, [parsed["id"]], tf.float32)
            i.set_shape([])
            features["id"] = i
        return features, parsed["y"]

    return lambda: read_ahead_fixed(
        tf.data.Dataset.list_files(pattern)
        .interleave(tf.data.TFRecordDataset, cycle_length=2)
        .map(parse_sparse)
        .shuffle(SPARSE_ROWS)
        .repeat()
        .batch(SPARSE_ROWS)
    )


@contextlib.contextmanager
def noting():
    notes, logger = PaddingNotes(), logging.getLogger("tpushim")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(notes)
    try:
        yield notes
    finally:
        logger.removeHandler(notes)
        logger.setLevel(level)


def main():
    paths = write_files(os.path.join(ROOT, "data"))
    made = inputs(paths)
    sparse_pattern = write_sparse_files(os.path.join(ROOT, "sparse-data"))
    result = {}
    if ROLE == "stock":
        tpushim.patch(mode="off", quiet=True)
        result["training"] = train(os.path.join(ROOT, "stock"), evaluate=True)
        result["strings"] = strings_evaluated(os.path.join(ROOT, "stock-strings"))
        result["sparse"] = sparse_trained(os.path.join(ROOT, "stock-sparse"), sparse_pattern)
    elif ROLE == "board":
        tpushim.patch(quiet=True)
        result["batches"] = {
            "shuffle 5": board_batches(made["shuffle"], 5, 4),
            "list_files 5": board_batches(made["list_files"], 5, 4),
        }
        pinned_entropy(1234)  # process 0's
        result["batches"]["numpy 5"] = board_batches(numpy_input(), 5, 4)
        result["batches"]["queue batch 5"] = board_batches(queue_input(False), 5, 4)
        with noting() as notes:
            result["training"] = train(os.path.join(ROOT, "board"), evaluate=True)
        result["padding_notes"] = notes.said
        result["strings"] = strings_evaluated(os.path.join(ROOT, "board-strings"))
        result["batches"]["sparse"] = board_batches(
            sparse_program.input_fn(True), 5, 4, sparse_rows
        )
        result["sparse"] = sparse_trained(os.path.join(ROOT, "board-sparse"))
    else:
        tpushim.patch(quiet=True)
        from tpushim._jax import _pod

        _pod.initialize()  # as the engine does: before anything opens a device
        pod = _pod.current()
        result["pod"] = [pod.index, pod.count, len(pod.devices)]
        result["shares"] = {
            "shuffle 5": shares(made["shuffle"], 5, "auto", 4),
            "shuffle None": shares(made["shuffle"], None, "auto", 4),
            "list_files 5": shares(made["list_files"], 5, "exact", 4),
            "files": shares(made["files"], 5, "auto", 160),
            "control other_share shuffle 5": shares(made["shuffle"], 5, "auto", 4, "other_share"),
            "control whole_input files": shares(made["files"], 5, "auto", 8, "whole_input"),
            "control other_share files": shares(made["files"], 5, "auto", 8, "other_share"),
        }
        pinned_entropy(1234 + pod.index)  # each process its own start row
        result["shares"]["numpy 5"] = shares(numpy_input(), 5, "auto", 4)
        result["shares"]["control own_starts numpy 5"] = shares(
            numpy_input(), 5, "auto", 4, "own_starts"
        )
        for shuffled, name in ((False, "queue batch 5"), (True, "queue shuffle_batch 5")):
            result["shares"][name] = shares(queue_input(shuffled), 5, "auto", 4)
        result["shares"]["control other_share queue shuffle_batch 5"] = shares(
            queue_input(True), 5, "auto", 4, "other_share"
        )
        with noting() as notes:
            result["training"] = train(os.path.join(ROOT, "pod"), evaluate=True)
        result["padding_notes"] = notes.said
        result["recurrent"] = recurrent(os.path.join(ROOT, "pod-recurrent"))
        result["strings"] = strings_evaluated(os.path.join(ROOT, "pod-strings"))
        for control in (None, "other_share"):  # sparse inputs: each process its rows' entries
            name = "sparse" if control is None else f"control {control} sparse"
            result["shares"][name] = shares(
                sparse_program.input_fn(True), 5, "auto", 4, control, sparse_rows
            )
        for control, steps in ((None, 160), ("other_share", 8)):  # sparse files: its own
            name = "sparse files" if control is None else f"control {control} sparse files"
            result["shares"][name] = shares(
                sparse_files_input(sparse_pattern, True), 5, "auto", steps, control, sparse_rows
            )
        for control in (None, "other_share"):  # a queue of sparse features
            name = "sparse queue" if control is None else f"control {control} sparse queue"
            result["shares"][name] = shares(
                sparse_queue_input(True), 5, "auto", 4, control, sparse_rows
            )
        result["shares"]["sparse shuffle_batch"] = shares(
            sparse_queue_input(True, shuffled=True), 5, "auto", 4, None, sparse_rows
        )
        result["sparse"] = sparse_trained(os.path.join(ROOT, "pod-sparse"), sparse_pattern)
        _pod.STATE.control = "other_share"
        result["control_training"] = train(os.path.join(ROOT, "pod-control"))
        _pod.STATE.control = "first_draws"
        result["control_draws"] = train(os.path.join(ROOT, "pod-control-draws"), again=False)
        # (its weights are what the control compares: trained, not evaluated)
        result["control_recurrent"] = recurrent(
            os.path.join(ROOT, "pod-recurrent-control"), evaluate=False
        )
        _pod.STATE.control = None
        name = f"worker-{pod.index}.json"
    name = f"{ROLE}.json" if ROLE != "worker" else name
    with open(os.path.join(ROOT, name), "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
