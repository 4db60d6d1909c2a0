"""In-memory arrays (numpy_input_fn / pandas_input_fn data) fed to their Dataset, never embedded.

A Dataset made from the arrays themselves holds them as constants of the graph, which Estimator
writes into graph.pbtxt and every checkpoint's meta graph, copies with the graph, and refuses over
2 GB. :class:`Rows` puts placeholders in the graph instead, registered with their arrays, and the
arrays are fed wherever a session runs the ops that make the Dataset: the iterator initializer
hooks of Estimator (cpu mode) and TPUEstimator (TPU hosts), wrapped by :func:`feeding_hooks`; the
session tpushim reads an input's facts with; the JAX engine's input session
(:func:`tpushim._stock_graphs.input_session`); the faked TPU's host pipelines (:func:`fed_arrays`).
A feed is an argument of ``Session.run``, so it reaches a TPU node's host through the remote
session as well (up to 2 GB a run: :func:`check_remote_feed`).

No second copy of the arrays is kept. TensorFlow takes a fed numpy array without copying it only
when its data starts on a 64-byte boundary (its alignment), which large numpy arrays do not (they
start 16 bytes into their pages): each array is fed as an aligned 2-D view of its own memory plus a
few edge elements, from which each batch's rows are gathered (:meth:`Rows.gather`). And tf.data's
graph rewrites, which copy every tensor a pipeline captures, are left off for these pipelines
(:func:`no_rewrites`); the pipeline gathers whole batches, so it needs none of them.

The placeholders, the arrays registered for them and every place that feeds them must agree, so
they live together.
"""

import functools
import logging
import threading
import weakref

import numpy as np
import tensorflow as tf

from tpushim import _tfprivate
from tpushim._errors import ConversionError

logger = logging.getLogger("tpushim")

#: What one Session.run may send to a remote (``grpc://``) master: protobuf refuses messages over
#: 2 GB, and gRPC aborts the process on one; the margin leaves room for the rest of the request.
REMOTE_FEED_LIMIT = 2**31 - 2**26


class _Registry:
    """The arrays registered for each graph, by placeholder name (graphs held weakly)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self):
        with self._lock:
            self._graphs = weakref.WeakKeyDictionary()

    def add(self, placeholder, value):
        with self._lock:
            self._graphs.setdefault(placeholder.graph, {})[placeholder.op.name] = value

    def of(self, graph):
        with self._lock:
            return dict(self._graphs.get(graph, {}))


_registry = _Registry()


def reset():
    """Forgets every registered array (tests)."""
    _registry.reset()


def fed_arrays(graph):
    """``{placeholder name: array}`` of the arrays fed to ``graph``'s placeholders."""
    return _registry.of(graph)


@functools.cache
def _alignment():
    """The alignment (bytes) at which TensorFlow takes a fed array without copying it."""
    for flag in tf.sysconfig.get_compile_flags():
        if flag.startswith("-DEIGEN_MAX_ALIGN_BYTES="):
            return max(int(flag.split("=")[1]), 1)
    return 64


def _aligned_copy(array):
    """A C-contiguous, aligned copy of ``array`` (which a feed would have copied anyway)."""
    align = _alignment()
    buffer = np.empty(array.nbytes + align, np.uint8)
    start = (-buffer.ctypes.data) % align
    copy = buffer[start : start + array.nbytes].view(array.dtype.newbyteorder("="))
    copy = copy.reshape(array.shape)
    copy[...] = array
    return copy


def no_rewrites():
    """Dataset options without tf.data's static graph rewrites: a rewrite serializes the pipeline
    and makes it again, copying every tensor it captures (here: the arrays)."""
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    return options


class Rows:
    """Equally long columns (numpy arrays) readable by row from the graph being built, fed to it
    by placeholder.

    Args:
      columns: the arrays, each of at least one dimension; a ``range(rows)`` column is the row
        numbers themselves.
      dtypes: the ``tf.DType`` each column is read as (a string column's, say); None: the array's.
      name: a name scope for the placeholders.
    """

    def __init__(self, columns, dtypes=None, name="arrays"):
        dtypes = dtypes or [None] * len(columns)
        with tf.name_scope(name):
            self._readers = [
                _reader(column, dtype, f"column_{i}")
                for i, (column, dtype) in enumerate(zip(columns, dtypes))
            ]

    def gather(self, indices):
        """A tuple of the rows ``indices`` (an int64 vector) of each column, in order."""
        return tuple(read(indices) for read in self._readers)


def _placeholder(value, dtype, name):
    placeholder = tf.compat.v1.placeholder(dtype, value.shape, name=name)
    _registry.add(placeholder, value)
    return placeholder


def _reader(column, dtype, name):
    """A function of row indices -> those rows of ``column``, fed from placeholders."""
    if isinstance(column, range):
        return lambda indices: indices
    array = np.asarray(column)
    dtype = dtype or tf.as_dtype(array.dtype)
    numeric = array.dtype.kind in "biufc" and dtype == tf.as_dtype(array.dtype)
    if numeric and not (array.flags.c_contiguous and array.dtype.isnative):
        array = _aligned_copy(array)  # a feed would copy it on every run
    split = _aligned_split(array) if numeric else None
    if split is None:
        whole = _placeholder(array, dtype, name)
        return lambda indices: tf.gather(whole, indices)
    body, edges, first = split
    return _split_reader(
        _placeholder(body, dtype, name), _placeholder(edges, dtype, name + "_edges"), first, array
    )


def _aligned_split(array):
    """``(body, edges, k)`` for a C-contiguous array, None where that cannot be (too short, or
    not alignable on an element's boundary).

    Seen flat, the array's elements ``k`` onwards start on an aligned address: ``body`` is them
    cut into ``m`` "virtual rows" of a row's length ``E`` (a view: no copy), and ``edges`` (a
    copy of a few elements) holds the virtual rows on either side of it -- the ``q + 1`` before
    (where ``k = q * E + s``), zero-padded before the array's start, and the one after, holding
    the last elements. Real row ``i`` is the last ``s`` elements of virtual row ``i - q - 1``
    followed by the first ``E - s`` of virtual row ``i - q``.
    """
    if array.ndim == 0 or array.size == 0:
        return None
    offset = (-array.ctypes.data) % _alignment()
    if offset % array.itemsize:
        return None  # never alignable: a feed copies it
    k, width, total = offset // array.itemsize, array.size // len(array), array.size
    count = (total - k) // width
    if count < 1:
        return None  # fewer elements than a row past the aligned start: small, fed as it is
    flat = array.reshape(-1)
    body = flat[k : k + count * width].reshape(count, width)
    q = k // width
    virtual = np.concatenate([np.arange(-(q + 1), 0), [count]])
    positions = k + virtual[:, None] * width + np.arange(width)
    inside = (positions >= 0) & (positions < total)
    edges = np.zeros(positions.shape, array.dtype)
    edges[inside] = flat[positions[inside]]
    return body, edges, k


def _split_reader(body, edges, k, array):
    """Reads rows of ``array`` from its :func:`_aligned_split` parts (see there)."""
    width = array.size // len(array)
    count = body.shape[0]
    q, s = divmod(k, width)
    row_shape = list(array.shape[1:])

    def read(indices):
        # Both virtual rows of every row at once, by the same ops whatever the array's alignment
        # (s == 0 takes nothing from the row before): the graph does not depend on memory layout.
        rows = indices[None, :] - tf.constant([[q + 1], [q]], tf.int64)
        inside = (rows >= 0) & (rows < count)
        from_body = tf.gather(body, tf.clip_by_value(rows, 0, count - 1))
        from_edges = tf.gather(edges, tf.where(rows < 0, rows + q + 1, q + 1))
        both = tf.where(inside[..., None], from_body, from_edges)
        flat = tf.concat([both[0, :, width - s :], both[1, :, : width - s]], axis=1)
        return tf.reshape(flat, [-1] + row_shape)

    return read


# -- feeding ------------------------------------------------------------------------------------
def feeds_for(fetches, graph):
    """``{placeholder: array}`` for the registered placeholders the ``fetches`` depend on."""
    registered = _registry.of(graph)
    if not registered:
        return {}
    stack = [_op(f) for f in tf.nest.flatten(fetches)]
    seen, feeds = set(), {}
    while stack:
        op = stack.pop()
        if op is None or op.name in seen:
            continue
        seen.add(op.name)
        if op.name in registered:
            feeds[op.outputs[0]] = registered[op.name]
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return feeds


def _op(fetch):
    if isinstance(fetch, tf.Operation):
        return fetch
    return getattr(fetch, "op", None) if tf.is_tensor(fetch) else None


def check_remote_feed(session, feeds):
    """Raises before a run would send more than :data:`REMOTE_FEED_LIMIT` to a remote master (a
    TPU node's host): gRPC would abort the process instead of raising."""
    target = tf.compat.as_str(getattr(session, "sess_str", None) or "")
    size = sum(getattr(v, "nbytes", 0) for v in feeds.values())
    if target.startswith("grpc://") and size > REMOTE_FEED_LIMIT:
        raise ConversionError(
            f"the numpy_input_fn / pandas_input_fn arrays of one input pipeline hold "
            f"{size / 2**30:.2f} GB; a remote TPU host ({target}) is sent them in one Session.run, "
            f"and one run carries at most 2 GB. Use a TPU VM (its input pipeline runs in this "
            f"process, without that limit), or write the arrays to TFRecord files (on a TPU node: "
            f"in a gs:// bucket) and read them with tf.data.TFRecordDataset."
        )


class FeedingSession:
    """A session whose runs are fed the registered arrays their fetches read. A list of ops that
    read arrays (one iterator initializer per TPU host) is run op by op, each with its own feeds,
    so that a remote run carries one host's arrays, not every host's. Anything else is the
    session's own."""

    def __init__(self, session):
        self._session = session

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        graph = self._session.graph
        feeds = feeds_for(fetches, graph)
        many = isinstance(fetches, (list, tuple)) and len(fetches) > 1
        if feeds and many and all(isinstance(f, tf.Operation) for f in fetches):
            return [self.run(f, feed_dict, options, run_metadata) for f in fetches]
        check_remote_feed(self._session, feeds)
        feeds.update(feed_dict or {})
        return self._session.run(fetches, feeds or None, options, run_metadata)

    def __getattr__(self, name):
        return getattr(self._session, name)


class _FeedingHook(tf.compat.v1.train.SessionRunHook):
    """An iterator initializer hook, given a :class:`FeedingSession` when the session starts."""

    def __init__(self, hook):
        self.hook = hook

    def begin(self):
        self.hook.begin()

    def after_create_session(self, session, coord):
        self.hook.after_create_session(FeedingSession(session), coord)

    def before_run(self, run_context):
        return self.hook.before_run(run_context)

    def after_run(self, run_context, run_values):
        self.hook.after_run(run_context, run_values)

    def end(self, session):
        self.hook.end(session)


def feeding_hooks(hooks):
    """``hooks`` with the input iterator initializers among them fed the arrays registered for
    the graph being built (the same hooks when it has none)."""
    if not hooks or not _registry.of(tf.compat.v1.get_default_graph()):
        return hooks
    kinds = _tfprivate.estimator.dataset_initializer_hook_classes()
    fed = [_FeedingHook(h) if isinstance(h, kinds) else h for h in hooks]
    return type(hooks)(fed) if isinstance(hooks, tuple) else fed


def feeding_spec(spec):
    """An EstimatorSpec with its iterator initializer hooks fed (see :func:`feeding_hooks`)."""
    fields = ("training_hooks", "evaluation_hooks", "prediction_hooks")
    replaced = {f: feeding_hooks(getattr(spec, f)) for f in fields if getattr(spec, f, None)}
    changed = {f: h for f, h in replaced.items() if h is not getattr(spec, f)}
    return spec._replace(**changed) if changed else spec
