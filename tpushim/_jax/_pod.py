"""A pod on the JAX engine: one process per TPU host, joined by ``jax.distributed``, the compiled
step running over every process's devices, each process feeding its own rows of every global
batch from its own copy of the input pipeline.

* **Joining** (:func:`initialize`, before the engine's first JAX call: ``jax.distributed`` must
  start before JAX opens a device). tpushim uses a distributed system the program started itself
  (``jax.distributed.initialize()`` before ``tpushim.patch()``); else it starts one where the
  environment says this process is one of several: ``JAX_COORDINATOR_ADDRESS`` (JAX's own name)
  with ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (tpushim passes them), or a TPU VM of several
  hosts (``TPU_WORKER_HOSTNAMES`` naming more than one, ``MEGASCALE_COORDINATOR_ADDRESS``), where
  JAX's Cloud TPU detection finds the rest. On CPU devices the collectives are gloo's.
* **The step**: the mesh is every process's devices, process by process (:class:`Pod`), so
  process ``p`` holds rows ``[p*B/P, (p+1)*B/P)`` of each global batch of ``B`` rows; its rows
  become one global array (``jax.make_array_from_process_local_data``) and the step is the one
  board's step on the global batch (:mod:`._step`).
* **The input** (:func:`host_batches`): the two paths of :mod:`tpushim._pods`, decided from each
  process's copy of the pipeline, built in a graph seeded as stock's with one seed for every
  process (the user's ``tf_random_seed``, else process 0's drawn seed): **exact**, every process
  runs the whole pipeline and keeps its rows of each (padded) global batch, so the global batch
  is one board's; **files**, shuffled endless input read from files, each process reading only
  its own files, ``B/P`` rows a step.
  A ``numpy_input_fn`` / ``pandas_input_fn`` queue is read from the Dataset of its arrays in
  stock's order, every process from process 0's start row (:func:`_called`).
* **Random draws** (:mod:`._draws`): every process makes stock's draws for the whole global
  batch (the same seeds: one graph seed for every process) and feeds its devices its own rows.
* **Evaluation**: each process's rows of each global batch (the exact path), the step over
  every process's devices, the real rows' outputs and labels gathered to every process
  (:func:`gathered`) for the metrics; **prediction**: each process its own rows, on its own
  devices (a JAX pod has a client per host; TPUEstimator's one client yields every row).
* **Checkpoints**: written by process 0 alone (stock's chief); every process reads them.
"""

import dataclasses
import itertools
import logging
import os
import pickle
import random

import numpy as np

from tpushim import _observe
from tpushim._errors import ConversionError

logger = logging.getLogger("tpushim")

#: Negative controls (the proof's), never set outside it: ``"whole_input"`` -- every process
#: reads the whole input (the files path's shares ignored; on the exact path it feeds the global
#: batch's first rows); ``"other_share"`` -- each process but 0 feeds the previous process's
#: rows (files: its files), so some rows are fed twice and others never; ``"first_draws"`` --
#: each process feeds its rows the random draws of the global batch's first rows (what a
#: process drawing for its own rows alone, from stock's seeds, would feed); ``"own_starts"`` --
#: each process's numpy_input_fn queue starts at the row it drew itself.
CONTROLS = ("whole_input", "other_share", "first_draws", "own_starts")


class _State:
    """The process's pod (None: one process) and the proof's control."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.joined = False  # initialize() ran
        self.control = None


STATE = _State()


def _hosts_named(environ):
    names = environ.get("TPU_WORKER_HOSTNAMES", "")
    return len([n for n in names.split(",") if n.strip()])


def wanted(environ=None):
    """How the environment asks for ``jax.distributed``: ``"explicit"`` (JAX_COORDINATOR_ADDRESS
    with JAX_NUM_PROCESSES and JAX_PROCESS_ID), ``"tpu"`` (a TPU VM of several hosts), or None.
    Reads the environment only."""
    environ = os.environ if environ is None else environ
    if environ.get("JAX_COORDINATOR_ADDRESS"):
        missing = [v for v in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if not environ.get(v)]
        if missing:
            raise ConversionError(
                f"JAX_COORDINATOR_ADDRESS is set but {' and '.join(missing)} not: tpushim's JAX "
                "engine joins a pod of JAX_NUM_PROCESSES processes as process JAX_PROCESS_ID. "
                "Set both (or unset JAX_COORDINATOR_ADDRESS for one process)."
            )
        return "explicit"
    if _hosts_named(environ) > 1 or environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return "tpu"
    return None


def initialize(environ=None):
    """Starts ``jax.distributed`` where the environment asks for it (see the module), once per
    process, before any other JAX call of the engine's. Idempotent."""
    import jax

    if STATE.joined:
        return
    environ = os.environ if environ is None else environ
    how = None if jax.distributed.is_initialized() else wanted(environ)
    if how is not None:
        from jax._src import xla_bridge  # the one way to ask without opening a device

        if xla_bridge.backends_are_initialized():
            raise ConversionError(
                "this process is one of a pod's (the environment says so), but JAX already "
                "opened its devices before tpushim could join the others with "
                "jax.distributed.initialize(). Call jax.distributed.initialize() yourself at the "
                "top of the script, before anything uses JAX."
            )
        kwargs = {}
        if how == "explicit":
            kwargs = dict(
                coordinator_address=environ["JAX_COORDINATOR_ADDRESS"],
                num_processes=int(environ["JAX_NUM_PROCESSES"]),
                process_id=int(environ["JAX_PROCESS_ID"]),
            )
        if jax.config.jax_cpu_collectives_implementation in (None, "none"):
            # CPU devices' collectives across processes (TPUs have their own): gloo's.
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(**kwargs)
        logger.info(
            "the JAX engine joined a pod: process %d of %d (jax.distributed, from %s)",
            jax.process_index(),
            jax.process_count(),
            "JAX_COORDINATOR_ADDRESS" if how == "explicit" else "the TPU VM's hosts",
        )
    STATE.joined = True


@dataclasses.dataclass(frozen=True)
class Pod:
    """This process in a pod: ``index`` of ``count`` processes, and every process's devices in
    mesh order (process by process: process ``p``'s rows of a global batch are the ``p``-th
    block)."""

    index: int
    count: int
    devices: tuple

    def rows(self, global_batch):
        """The rows of a global batch this process feeds."""
        return global_batch // self.count


def current():
    """The :class:`Pod` this process is in, or None (one process)."""
    import jax

    if jax.process_count() <= 1:
        return None
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Pod(jax.process_index(), jax.process_count(), tuple(devices))


def own_rows(global_rows, index, rows):
    """Process ``index``'s ``rows`` rows of an array of the global batch's rows (a draw's)."""
    if STATE.control == "first_draws":
        index = 0
    return global_rows[index * rows : (index + 1) * rows]


def gathered(tree):
    """Every process's rows of each array of ``tree`` (numbers), in process order, on every
    process: its global batch."""
    import jax
    from jax.experimental import multihost_utils

    def one(local):
        if _is_sparse(local):  # (a SparseTensor feature's, for add_metrics)
            return _gathered_sparse(_every_process(local))
        local = np.asarray(local)
        if local.dtype.kind not in "biuf":  # strings (a lookup's, a feature column's)
            return np.concatenate(_every_process(local))
        return np.asarray(multihost_utils.process_allgather(local, tiled=True))

    return jax.tree_util.tree_map(one, tree, is_leaf=_is_sparse)


def _every_process(local):
    """Every process's ``local`` (strings, other objects), in process order: each process's
    pickled, padded to the longest, gathered as bytes and read back."""
    from jax.experimental import multihost_utils

    mine = np.frombuffer(pickle.dumps(local, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([len(mine)]), tiled=True))
    padded = np.zeros([int(sizes.max())], np.uint8)
    padded[: len(mine)] = mine
    every = np.asarray(multihost_utils.process_allgather(padded[None], tiled=True))
    return [pickle.loads(every[p, : int(n)].tobytes()) for p, n in enumerate(sizes)]


def _gathered_sparse(parts):
    """One ``SparseTensorValue`` of every process's rows, in process order: each one's entries
    moved down by the rows before it, as wide as the widest."""
    import tensorflow as tf

    indices, values, start = [], [], 0
    for part in parts:
        at = np.asarray(part.indices, np.int64).copy()
        at[:, 0] += start
        indices.append(at)
        values.append(np.asarray(part.values))
        start += int(part.dense_shape[0])
    shape = np.max([np.asarray(p.dense_shape, np.int64) for p in parts], 0)
    shape[0] = start
    return tf.compat.v1.SparseTensorValue(np.concatenate(indices), np.concatenate(values), shape)


def sparse_rows(value, rows):
    """A ``SparseTensorValue``'s first ``rows`` rows."""
    import tensorflow as tf

    indices = np.asarray(value.indices)
    mine = indices[:, 0] < rows
    shape = np.array(value.dense_shape, np.int64)
    shape[0] = min(rows, shape[0])
    return tf.compat.v1.SparseTensorValue(indices[mine], np.asarray(value.values)[mine], shape)


def is_chief():
    """Whether this process writes (process 0, or one process)."""
    import jax

    return jax.process_index() == 0


def barrier(name):
    """Every process waits here for the others (a no-op in one process)."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def common_seed(seed):
    """The graph seed every process builds its copy of the input with: ``seed`` (the user's
    ``tf_random_seed``), else one process 0 draws (each call differs from the last, as stock's
    unseeded runs do; the processes agree)."""
    if seed is not None:
        return seed
    from jax.experimental import multihost_utils

    drawn = np.int32(random.SystemRandom().randrange(1, 2**31 - 1))
    return int(multihost_utils.broadcast_one_to_all(drawn))


def replicated(tree, sharding):
    """Host values (the same in every process) as global arrays of ``sharding``."""
    import jax

    def one(value):
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    return jax.tree_util.tree_map(one, tree)


def global_arrays(tree, sharding, axis, count):
    """This process's block of each array (its rows along ``axis``) as the global arrays of
    ``sharding``, ``count`` processes' blocks long."""
    import jax

    def one(local):
        local = np.asarray(local)
        shape = list(local.shape)
        shape[axis] *= count
        return jax.make_array_from_process_local_data(sharding, local, tuple(shape))

    return jax.tree_util.tree_map(one, tree)


# --- the input ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Share:
    """This process's rows of one global batch: ``batch`` (the input_fn's structure, numpy), its
    ``pad`` (1 a real row, 0 padding), ``global_batch`` (the rows of the global batch) and
    ``real`` (the global batch's real rows, its first ones); ``stock_batch``: the global batch
    as the input gives it, before padding (0: not known)."""

    batch: object
    pad: np.ndarray
    global_batch: int
    real: int = 0
    stock_batch: int = 0


def padded_rows(a, size):
    """``a`` padded to ``size`` rows with copies of its first row, as
    :func:`tpushim._padding.pad_batch` pads: values the model already accepts (a row of zeros
    may not be: the log of a size, a string), weighed 0 by the caller's ``pad``."""
    a = np.asarray(a)
    if len(a) >= size:
        return a
    return np.concatenate([a, np.repeat(a[:1], size - len(a), axis=0)])


def _is_sparse(value):
    """Whether ``value`` is a session's reading of a ``SparseTensor`` (its components)."""
    import tensorflow as tf

    return isinstance(value, tf.compat.v1.SparseTensorValue)


def _rows_of(batch):
    import jax

    first = jax.tree_util.tree_leaves(batch, is_leaf=_is_sparse)[0]
    return int(first.dense_shape[0]) if _is_sparse(first) else len(np.asarray(first))


def _sparse_rows(value, size, start, count):
    """Rows ``start`` to ``start + count`` of a ``SparseTensorValue`` whose rows are padded to
    ``size`` with copies of its first row (as :func:`padded_rows` pads an array): its entries in
    those rows, renumbered from 0, its dense_shape ``count`` rows."""
    import tensorflow as tf

    indices, values = np.asarray(value.indices), np.asarray(value.values)
    shape = np.array(value.dense_shape, np.int64)
    first = indices[:, 0] == 0
    pads = range(int(shape[0]), size)
    added = [np.concatenate([np.full([first.sum(), 1], r), indices[first, 1:]], 1) for r in pads]
    indices = np.concatenate([indices, *added]).astype(np.int64) if added else indices
    values = np.concatenate([values] + [values[first]] * len(added))
    mine = (indices[:, 0] >= start) & (indices[:, 0] < start + count)
    indices = indices[mine] - np.array([start] + [0] * (shape.size - 1), np.int64)
    shape[0] = count
    return tf.compat.v1.SparseTensorValue(indices, values[mine], shape)


def _share_of(batch, size, start, count):
    """Rows ``start`` to ``start + count`` of ``batch`` padded to ``size`` rows (copies of its
    first row); a sparse feature's too (:func:`_sparse_rows`)."""
    import jax

    def one(a):
        if _is_sparse(a):
            return _sparse_rows(a, size, start, count)
        return padded_rows(a, size)[start : start + count]

    return jax.tree_util.tree_map(one, batch, is_leaf=_is_sparse)


def _called(input_fn, mode, config, seed):
    """``(graph, result)`` of the input_fn called in a graph seeded ``seed`` as stock's; a
    numpy_input_fn / pandas_input_fn queue's rows from the Dataset that feeds them, in stock's
    order as one process reads them: every process with process 0's start rows (its feeding
    threads draw them from the operating system's entropy) and the one graph seed."""
    from jax.experimental import multihost_utils

    from tpushim import _input_fn, _source, _stock_graphs

    def call(starts):
        with _stock_graphs.input_graph(mode, seed) as graph, _source.same_start_rows(starts):
            result = _source.call_and_recover(input_fn, mode, {}, config, queues_only=True)
            return graph, _input_fn.check_result(input_fn, result)

    starts = []
    graph, result = call(starts)
    if starts and STATE.control != "own_starts":  # (every process made as many queues)
        first = multihost_utils.broadcast_one_to_all(np.asarray(starts, np.int64))
        first = [int(v) for v in np.asarray(first)]
        if first != starts:
            graph, result = call(first)
    return graph, result


#: Each input read from queues on a pod, counted alike in every process (the same calls, in the
#: same order): its batches' keys in the coordinator's key-value store.
_QUEUED_CALLS = itertools.count()
#: How long a process waits for process 0's next batch of a queue (milliseconds: a day).
_WAIT_MS = 24 * 3600 * 1000


def _handed(batches, pod, call):
    """Queue-read input on a pod: process 0 reads ``batches`` (its queues, threads and all, as
    one board reads them) and hands every other process each batch through the coordinator's
    key-value store (not a collective: the training's steps run beside it); the others yield
    what it handed them, so every process holds the same global batches. Each batch's key is
    deleted by the process that read it."""
    from jax._src import distributed

    client = distributed.global_state.client
    prefix = f"tpushim/queued/{call}"
    if pod.index == 0:
        k, ended = 0, False
        try:
            for batch in batches:
                message = pickle.dumps(("batch", batch), protocol=pickle.HIGHEST_PROTOCOL)
                for p in range(1, pod.count):
                    client.key_value_set_bytes(f"{prefix}/{k}/{p}", message)
                k += 1
                yield batch
            ended = True
        finally:
            last = ("end", None) if ended else ("error", "process 0's input stopped early")
            message = pickle.dumps(last)
            for p in range(1, pod.count):
                client.key_value_set_bytes(f"{prefix}/{k}/{p}", message)
        return
    for k in itertools.count():
        key = f"{prefix}/{k}/{pod.index}"
        kind, batch = pickle.loads(client.blocking_key_value_get_bytes(key, _WAIT_MS))
        client.key_value_delete(key)
        if kind == "end":
            return
        if kind == "error":
            raise ConversionError(
                f"reading the input's queues on process 0 of the pod failed ({batch}); this "
                "process had its batches from there. See process 0's error."
            )
        yield batch


def host_batches(input_fn, mode, config, pod, batch_size, pod_input, seen=None, multiple=None):
    """This process's :class:`Share` of every global batch, read as stock reads an input (a
    ``MonitoredSession`` over the input_fn's graph), on the path :mod:`tpushim._pods` decides.
    ``seen`` (a dict): given the input graph's ``seeds`` (the common graph seed, the op-seed
    counter after the input_fn), what every process's copy of stock's draws seeds from.
    ``multiple``: the global batch padded to a multiple of it (an evaluation's or prediction's:
    the pod's devices, as one board pads to its own)."""
    import tensorflow as tf

    from tpushim import _arrays, _batching, _pods, _stock_graphs, _tfprivate

    seed = common_seed(config.tf_random_seed)
    graph, result = _called(input_fn, mode, config, seed)
    if seen is not None:
        seen["seeds"] = _tfprivate.graph.graph_seeds(graph)
    control, index = STATE.control, pod.index
    if control == "other_share":
        index = max(pod.index - 1, 0)
    path, size = _pods.Path("exact", "the input_fn returns tensors, not a Dataset"), batch_size
    hooks = []
    with graph.as_default():
        queued = bool(graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS))
        if queued:  # (shuffle_batch & co.: threads fill them, no two processes alike)
            path = _pods.Path(
                "exact",
                "the input_fn reads queues filled by threads (tf.compat.v1.train.batch, "
                "shuffle_batch, ...): process 0 reads them as one board does and hands every "
                "process each global batch",
            )
        if isinstance(result, tf.data.Dataset):
            found = _pods.analyse(result, _pods.needs_files(mode, pod_input))
            size = size or _batching.declared_batch_size(result)
            path = _pods.decide(found, mode, pod_input, pod.count)
            if path.name == "files" and (not size or size % len(pod.devices)):
                path = _pods.Path(
                    "exact",
                    f"{path.why}; but the global batch ({size or 'unknown'}) does not split "
                    f"evenly over {len(pod.devices)} devices: the exact path instead",
                    fallback=True,
                )
            if path.name == "files" and control == "whole_input":
                pass  # the control: this process reads every file
            else:
                _pods.prepare(result, path, index)
            if path.name == "files":
                result = result.unbatch().batch(pod.rows(size), drop_remainder=True)
            feeds = {}
            if _arrays.fed_arrays(graph):  # (a recovered queue's arrays)
                feeds = _arrays.feeds_for(tf.data.experimental.to_variant(result), graph)
            if feeds:  # (a one-shot iterator cannot capture the arrays' placeholders)
                iterator = tf.compat.v1.data.make_initializable_iterator(result)
                hooks.append(_stock_graphs.FedInitializer(iterator.initializer, feeds))
            else:
                iterator = tf.compat.v1.data.make_one_shot_iterator(result)
            result = iterator.get_next()
        if isinstance(result, list):
            result = tuple(result)
        session = None
        if not queued or pod.index == 0:
            session = tf.compat.v1.train.MonitoredSession(
                session_creator=tf.compat.v1.train.ChiefSessionCreator(
                    config=config.session_config
                ),
                hooks=hooks,
            )
    _observe.note(
        "pod",
        "%s on %d processes (process %d): %s path: %s",
        mode,
        pod.count,
        pod.index,
        path.name,
        path.why,
    )
    # None: a process handed its batches reads none itself
    batches = () if session is None else _stock_graphs.read_batches(session, result)
    if queued:
        batches = _handed(batches, pod, next(_QUEUED_CALLS))
    stock = None
    try:
        for batch in batches:
            rows = _rows_of(batch)
            if path.name == "files":
                yield Share(batch, np.ones([rows], np.float32), rows * pod.count, rows * pod.count)
                continue
            size = size or rows
            stock = stock or size  # (before padding)
            if multiple:
                size = -(-size // multiple) * multiple
            if rows > size:
                raise ValueError(f"a batch of {rows} rows is larger than the global batch {size}")
            mine = pod.rows(size)
            if size % pod.count:
                raise ConversionError(
                    f"a global batch of {size} rows does not split evenly over {pod.count} "
                    "processes: use a batch size divisible by the number of devices."
                )
            start = 0 if control == "whole_input" else index * mine
            pad = np.zeros([size], np.float32)
            pad[:rows] = 1
            piece = _share_of(batch, size, start, mine)
            yield Share(piece, pad[start : start + mine], size, rows, stock)
    finally:
        batches.close()
