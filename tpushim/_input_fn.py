"""Adapts a legacy input_fn to what TPUEstimator (and a TPU) demands, without the user's help.

TPUEstimator calls ``input_fn(params=...)`` and a TPU needs batches of one static size. A legacy
input_fn takes no ``params``, returns iterator or queue tensors, ends epochs on a short batch.
:func:`adapt` wraps it in three steps, each in its own module:

1. *source* (:mod:`tpushim._source`): it is called with the arguments it accepts; tensors from an
   iterator's ``get_next()`` or from numpy_input_fn / pandas_input_fn queues are traced back to a
   Dataset; numpy values become a repeated Dataset (:func:`check_result`, here);
2. *batches* (:mod:`tpushim._batching`): stock's global batches, made static, and on a TPU cut into
   per-core pieces per host;
3. *padding* (:mod:`tpushim._padding`): short batches padded with a weight that the model_fn uses
   to leave padding out of losses and metrics, and the estimator to drop it from predictions.

:func:`inspect_input` reads what the estimator needs to know of an input before TPUEstimator
builds anything (its batch size, whether it ends, how many examples it holds).
"""

import collections
import logging

import tensorflow as tf

from tpushim import _batching, _source
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
    """A Dataset, or (features[, labels]) tensors as Estimator takes them; anything else is an error."""
    if isinstance(result, tf.data.Dataset):
        return result
    # (features, labels) or features: a tuple, a dict or one array; a bare list is no such structure.
    flat = tf.nest.flatten(result) if result is not None else []
    values = flat and not isinstance(result, list) and all(_is_value(x) for x in flat)
    if values:
        # numpy arrays / Python values: stock feeds them as constants, the same batch every step;
        # a Dataset repeating that one element feeds a TPU (and cpu mode) exactly that.
        return tf.data.Dataset.from_tensors(
            tf.nest.map_structure(tf.convert_to_tensor, result)
        ).repeat()
    if flat and not isinstance(result, list) and all(tf.is_tensor(x) or _is_value(x) for x in flat):
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


def _first_batch_size(result, sess):
    """The size of the input's first batch, read in ``sess`` (tables initialised first)."""
    if isinstance(result, tf.data.Dataset):
        # An initializable iterator: a one-shot iterator refuses datasets that capture a lookup table.
        iterator = tf.compat.v1.data.make_initializable_iterator(result.take(1))
        sess.run(tf.compat.v1.tables_initializer())
        sess.run(iterator.initializer)
        return int(tf.nest.flatten(sess.run(iterator.get_next()))[0].shape[0])
    first = tf.nest.flatten(result)[0]
    if first.shape.rank and tf.compat.dimension_value(first.shape[0]):
        return int(tf.compat.dimension_value(first.shape[0]))
    # A MonitoredSession initialises tables and starts the queue runners of tensors tpushim could
    # not trace back to their source.
    with tf.compat.v1.train.MonitoredSession() as monitored:
        return int(monitored.run(first).shape[0])


InputFacts = collections.namedtuple("InputFacts", "batch_size declared finite batches examples")
InputFacts.__doc__ = """What tpushim reads of an input before TPUEstimator builds anything.

batch_size: the global batch size the input gives (declared, else its first batch's size).
declared: the batch size the Dataset's graph declares (static dimension or batch op), else None.
finite: the Dataset is known to end (UNKNOWN cardinality -- filter, generators -- is not finite).
batches, examples: how many batches and examples it holds, when counted (see inspect_input);
else None.
"""


def inspect_input(input_fn, mode, config, count=False, count_unknown=True):
    """:class:`InputFacts` of the user's input, read in one scratch graph; the real pipeline is
    never touched. No data is read when the graph declares the batch size (unless ``count``).
    With ``count``, a finite input's batches and examples are counted; one of unknown cardinality
    too unless ``count_unknown`` is False (it may repeat forever)."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        result = check_result(input_fn, _source.call_and_recover(input_fn, mode, {}, config))
        finite, batches, examples, declared = False, None, None, None
        if isinstance(result, tf.data.Dataset):
            declared = _batching.declared_batch_size(result)
            cardinality = int(sess.run(result.cardinality()))
            finite = cardinality >= 0  # known to end; UNKNOWN (filter, generators) is not
            if count and (
                finite or (count_unknown and cardinality != tf.data.INFINITE_CARDINALITY)
            ):
                sess.run(tf.compat.v1.tables_initializer())
                sizes = result.map(lambda *e: tf.shape(tf.nest.flatten(e)[0], out_type=tf.int64)[0])
                batches, examples = (
                    int(n)
                    for n in sess.run(
                        sizes.reduce(
                            (tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
                            lambda total, n: (total[0] + 1, total[1] + n),
                        )
                    )
                )
        elif count:
            raise tensors_error(input_fn, result)
        size = declared or _first_batch_size(result, sess)
        return InputFacts(size, declared, finite, batches, examples)


def adapt(input_fn, global_batch=None):
    """Wraps a user's input_fn into one TPUEstimator accepts (``params`` and static batches).

    ``global_batch``: the global batch size of this mode; ``params['batch_size']`` (per core on a
    TPU, global on CPU) when not given.
    """

    def tpushim_input_fn(params, mode=None, config=None, input_context=None):
        result = check_result(
            input_fn, _source.call_and_recover(input_fn, mode, params, config, input_context)
        )
        context = params.get("context")  # present only when the input feeds a TPU
        if not isinstance(result, tf.data.Dataset):
            if context is not None:
                raise tensors_error(input_fn, result)
            # On CPU TPUEstimator takes tensors as Estimator does; cpu mode says what a TPU would do.
            logger.warning("%s Running it as it is on CPU.", tensors_error(input_fn, result))
            return result
        result = _batching.without_float64(result)
        batch_size = params["batch_size"]
        if context is None:
            return _batching.fit_batches(result, batch_size, mode).prefetch(tf.data.AUTOTUNE)
        return _batching.tpu_batches(
            result,
            global_batch or batch_size,
            batch_size,
            mode,
            getattr(context, "num_hosts", 1),
            getattr(context, "current_host", 0),
        ).prefetch(tf.data.AUTOTUNE)

    tpushim_input_fn.__wrapped__ = input_fn
    return tpushim_input_fn
