"""Adapts a legacy input_fn to what TPUEstimator (and a TPU) demands, without the user's help.

TPUEstimator calls ``input_fn(params=...)`` and a TPU needs batches of one static size. A legacy
input_fn takes no ``params``, returns iterator or queue tensors, ends epochs on a short batch.
The estimator calls it exactly as often as stock does (once per train/evaluate/predict; on a TPU
once per input pipeline TPUEstimator builds) and works on what that one call built:

1. :func:`call`: the input_fn is called with the arguments it accepts; tensors from an iterator's
   ``get_next()`` or from numpy_input_fn / pandas_input_fn queues are traced back to a Dataset
   (:mod:`tpushim._source`); numpy values become a repeated Dataset;
2. :func:`read_facts`: what the estimator must know before TPUEstimator builds the rest (the
   batch size, and on a TPU how much an evaluation holds), read from the graph that call built;
3. :func:`adapt`: stock's global batches, made static, and on a TPU cut into per-core pieces per
   host (:mod:`tpushim._batching`), short batches padded with a weight (:mod:`tpushim._padding`).
"""

import contextlib
import dataclasses
import logging
from typing import Optional

import tensorflow as tf

from tpushim import (
    _arrays,
    _batch_math,
    _batching,
    _feature_columns,
    _host_part,
    _observe,
    _shapes,
    _source,
    _sparse_inputs,
)
from tpushim._errors import ConversionError

logger = logging.getLogger("tpushim")

_REPLACEMENT = (
    "return a tf.data.Dataset instead, e.g. "
    "`lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(B)`"
)


def tensors_error(input_fn, result):
    """The error for tensors a TPU cannot be fed from, naming the Dataset that would do."""
    return ConversionError(
        f"input_fn {getattr(input_fn, '__name__', input_fn)!r} returned {type(result).__name__} "
        f"(tensors) that tpushim cannot trace back to a tf.data.Dataset, an iterator's get_next() "
        f"or numpy_input_fn / pandas_input_fn arrays (e.g. they were computed from those). A TPU "
        f"reads its input from a Dataset: {_REPLACEMENT}, and do any computation in dataset.map."
    )


def check_result(input_fn, result):
    """A Dataset, or (features[, labels]) tensors as Estimator takes them; anything else is an error.

    Features and labels may hold Python lists wherever Keras takes them (``([a, b, text], [y1,
    y2])`` for a model of three inputs and two outputs): tf.data and TPUEstimator are given them
    as tuples (:func:`tpushim._source.tuples`)."""
    if isinstance(result, tf.data.Dataset):
        return result
    # (features, labels) or features: a tuple (a list of two, as Estimator reads it), a dict or
    # one array.
    result = _source.tuples(result)
    flat = tf.nest.flatten(result) if result is not None else []
    if flat and all(_is_value(x) for x in flat):
        # numpy arrays / Python values: stock feeds them as constants, the same batch every step;
        # a Dataset repeating that one element feeds a TPU (and cpu mode) exactly that.
        return tf.data.Dataset.from_tensors(
            tf.nest.map_structure(tf.convert_to_tensor, result)
        ).repeat()
    if flat and all(tf.is_tensor(x) or _is_value(x) for x in flat):
        result = tf.nest.map_structure(
            lambda x: x if tf.is_tensor(x) else tf.convert_to_tensor(x), result
        )
        flat = tf.nest.flatten(result)
    if not flat or not all(tf.is_tensor(x) for x in flat):
        raise ConversionError(
            f"input_fn {getattr(input_fn, '__name__', input_fn)!r} returned {result!r:.100}; it must "
            f"return a tf.data.Dataset of (features, labels) or of features, or (features, labels) "
            f"tensors. {_REPLACEMENT[0].upper()}{_REPLACEMENT[1:]}."
        )
    return result


def _is_value(x):
    import numpy as np

    return isinstance(x, (np.ndarray, np.generic, int, float, bool))


class UserParams(dict):
    """The ``params`` a user's input_fn is called with.

    Stock ``model_to_estimator`` passes its estimator's params, ``{}``; tpushim adds
    ``batch_size`` (the global batch) when it was given one, and on a TPU TPUEstimator's
    ``context``. Asking for a batch size nobody set says what to do instead of a bare KeyError.
    """

    def __missing__(self, key):
        if key == "batch_size":
            raise ConversionError(
                "the input_fn reads params['batch_size'], which model_to_estimator never sets; "
                "tpushim sets it (to the global batch size) only when it is given one: set "
                "tpushim.patch(batch_size=...) or TPUSHIM_BATCH_SIZE, or batch the dataset "
                "inside the input_fn."
            )
        raise KeyError(key)


def call(input_fn, mode, params, config, input_context=None):
    """Calls the user's input_fn once and returns what it built, traced back to its source:
    a Dataset, or (features[, labels]) tensors (see :func:`check_result`)."""
    return check_result(
        input_fn, _source.call_and_recover(input_fn, mode, params, config, input_context)
    )


@dataclasses.dataclass(frozen=True)
class InputFacts:
    """What tpushim reads of an input before TPUEstimator builds the rest of the graph.

    Attributes:
      batch_size: the global batch size the input gives (declared, else its first batch's size).
      declared: the batch size the Dataset's graph declares (static dimension or batch op), or None.
      batches, examples: how many batches and examples a finite input holds, when counted (see
        :func:`read_facts`); None otherwise, and None for an input that repeats forever.
    """

    batch_size: int
    declared: Optional[int] = None
    batches: Optional[int] = None
    examples: Optional[int] = None


@contextlib.contextmanager
def graph_session():
    """A session over the graph being built, for the few values tpushim must read before
    TPUEstimator builds the rest of it (the estimator's own session comes later). Soft placement:
    on a TPU the input's ops are placed on the TPU hosts, which this process reads as its CPU.
    The ops it runs are added to that graph and never run by the estimator.

    Every lookup table in the graph is initialised first, as stock's Scaffold initialises them
    before its dataset initializer runs: a table the input_fn looks up in its own graph, outside
    any ``Dataset.map`` (``from_tensor_slices(table.lookup(...))``), feeds what the Dataset holds,
    and even its cardinality cannot be read without it. Its runs are fed the in-memory arrays they
    read (:class:`tpushim._arrays.FeedingSession`)."""
    graph = tf.compat.v1.get_default_graph()
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        initializers = graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)
        if initializers:
            session.run(initializers)
        yield _arrays.FeedingSession(session)


def _read_first_batch_size(result, session):
    """The size of the input's first batch, read: the one case in which
    tpushim reads data before the estimator does, when the graph does not declare the size."""
    if isinstance(result, tf.data.Dataset):
        # An initializable iterator: a one-shot iterator refuses datasets that capture a table.
        iterator = tf.compat.v1.data.make_initializable_iterator(result.take(1))
        session.run(iterator.initializer)
        return int(tf.nest.flatten(session.run(iterator.get_next()))[0].shape[0])
    # Tensors tpushim could not trace back to their source: their queues need runner threads.
    coordinator = tf.compat.v1.train.Coordinator()
    threads = tf.compat.v1.train.start_queue_runners(session, coord=coordinator)
    try:
        return int(session.run(tf.nest.flatten(result)[0]).shape[0])
    finally:
        coordinator.request_stop()
        coordinator.join(threads, stop_grace_period_secs=5)


def _static_batch_size(result):
    first = tf.nest.flatten(result)[0]
    if first.shape.rank:
        return tf.compat.dimension_value(first.shape[0])
    return None


def cardinality(result):
    """The Dataset's cardinality as its graph gives it: the number of elements,
    ``tf.data.INFINITE_CARDINALITY`` or ``tf.data.UNKNOWN_CARDINALITY`` (filter, generators,
    text files). Reads no data."""
    with graph_session() as session:
        return int(session.run(result.cardinality()))


def is_finite(result):
    """True when the Dataset is known to end (UNKNOWN cardinality -- filter, generators -- is not)."""
    return cardinality(result) >= 0


def _count(result, session, count_unknown):
    """``(batches, examples)`` of a finite Dataset, else ``(None, None)``: from the graph's
    cardinalities where the pipeline ends in a batch op, by reading it otherwise (an input of
    unknown cardinality only when ``count_unknown``: it may repeat forever)."""
    cardinality = int(session.run(result.cardinality()))
    if cardinality == tf.data.INFINITE_CARDINALITY:
        return None, None
    batching = _batching.batching_of(result) if cardinality >= 0 else None
    if batching is not None:
        rows_variant, size, drop_remainder = batching
        rows = int(session.run(tf.raw_ops.DatasetCardinality(input_dataset=rows_variant)))
        if rows >= 0:
            batches = _batch_math.batches_of(rows, size, drop_remainder)
            if batches == cardinality:
                return batches, batches * size if drop_remainder else rows
    if cardinality < 0 and not count_unknown:
        return None, None
    _observe.note(
        "count",
        "counting the evaluation input by reading it once: its graph does not say how many "
        "examples it holds, and a TPU must know how many steps to run (pass steps= to skip this)",
    )
    sizes = result.map(lambda *e: tf.shape(tf.nest.flatten(e)[0], out_type=tf.int64)[0])
    zero = tf.constant(0, tf.int64)
    batches, examples = session.run(
        sizes.reduce((zero, zero), lambda total, n: (total[0] + 1, total[1] + n))
    )
    return int(batches), int(examples)


def read_facts(result, count=False, count_unknown=True, input_fn=None):
    """:class:`InputFacts` of what one input_fn call built, read in the graph it built.

    Reads no data when the graph declares the batch size (the usual ``batch(B)``), and, with
    ``count``, when the graph says how many examples a finite input holds. ``count`` counts a
    finite input's batches and examples (a TPU evaluation must know its steps); an input of unknown
    cardinality is read to its end only when ``count_unknown``.

    Raises:
      ConversionError: ``count`` on tensors tpushim could not trace back to a Dataset.
    """
    if not isinstance(result, tf.data.Dataset):
        if count:
            raise tensors_error(input_fn, result)
        size = _static_batch_size(result)
        if not size:
            with graph_session() as session:
                size = _read_first_batch_size(result, session)
        return InputFacts(size)
    declared = _batching.declared_batch_size(result)
    if declared and not count:
        return InputFacts(declared, declared)
    with graph_session() as session:
        size = declared or _read_first_batch_size(result, session)
        batches, examples = _count(result, session, count_unknown) if count else (None, None)
    return InputFacts(size, declared, batches, examples)


def deployment(context):
    """``(index, count)`` of the input_fn invocation TPUEstimator makes with this
    ``params['context']``: one invocation per host (``PER_HOST_V2``), or one in all (``SLICED``,
    ``BROADCAST``). A context without TPUEstimator's method is read as host of hosts."""
    if hasattr(context, "current_input_fn_deployment"):
        _, index, count, _ = context.current_input_fn_deployment()
        return index, count
    return getattr(context, "current_host", 0), getattr(context, "num_hosts", 1)


def adapt(
    result,
    mode,
    global_batch,
    params,
    input_fn=None,
    shard=None,
    *,
    tpu_batch=None,
    model_inputs=None,
):
    """What one input_fn call built, as TPUEstimator must be given it: static global batches on
    CPU; on a TPU (``params['context']`` present) this invocation's per-core pieces of those
    batches.

    Args:
      result: what :func:`call` returned.
      mode: the ``ModeKeys`` value.
      global_batch: this call's global batch size (stock's).
      params: TPUEstimator's params for this invocation (``batch_size`` per core on a TPU).
      input_fn: the user's input_fn, named in errors.
      shard: ``(index, count)``: this invocation keeps pieces ``index, index + count, ...`` of
        the global batches; None: as TPUEstimator deploys it (:func:`deployment`). ``(0, 1)``
        keeps every piece (a pod host reading only its own files, :mod:`tpushim._pods`).
      tpu_batch: the global batch a TPU runs, ``global_batch`` padded to a multiple of its
        cores (see :func:`tpushim._batching.tpu_batches`); ``global_batch`` when None.
      model_inputs: the :class:`tpushim._shapes.ModelInputs` of the model, whose declared shapes
        complete the features' (see :mod:`tpushim._shapes`).
    """
    context = params.get("context")  # present only when the input feeds a TPU
    if not isinstance(result, tf.data.Dataset):
        if context is not None:
            raise tensors_error(input_fn, result)
        # On CPU TPUEstimator takes tensors as Estimator does; cpu mode says what a TPU would do.
        logger.warning("%s Running it as it is on CPU.", tensors_error(input_fn, result))
        return result
    # An input whose batches are all full (its graph says so) needs no padding machinery.
    none_short = False
    if _batching.might_pad(result, global_batch):
        try:
            with graph_session() as session:
                none_short = _batching.none_short(result, session)
        except tf.errors.OpError:  # not readable here (e.g. a lookup table placed on a TPU host's
            pass  # job): the padding machinery stays, which is right for any input, only dearer

    result = _batching.without_float64(result)
    sparse = getattr(model_inputs, "sparse_part", None)
    if sparse is not None:  # no TPU is fed a SparseTensor: made dense, or read, on the host
        result = result.map(_host_part.element_function(sparse, mode))
    if model_inputs is None:  # a subclassed model: its call would read a SparseTensor on a TPU
        _sparse_inputs.refuse_fed(result, "tpushim's TPUEstimator path")
    result = _shapes.with_declared_shapes(result, model_inputs)
    split = getattr(model_inputs, "feature_split", None)
    if context is None:
        result = _batching.fit_batches(result, global_batch, mode, none_short=none_short)
    else:
        index, count = shard if shard is not None else deployment(context)
        result = _batching.tpu_batches(
            result,
            global_batch,
            params["batch_size"],
            mode,
            count,
            index,
            tpu_batch=tpu_batch,
            none_short=none_short,
        )
    if split is not None:  # the feature columns' weight-free part, on the host
        host = split.host_function()
        result = result.map(lambda *element: _feature_columns.on_element(host, element))
    return result.prefetch(tf.data.AUTOTUNE)
