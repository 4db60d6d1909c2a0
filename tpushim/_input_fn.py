"""Adapts a legacy input_fn to what TPUEstimator (and a TPU) demands, without the user's help.

TPUEstimator calls ``input_fn(params=...)`` and a TPU needs batches of one static size. A legacy
input_fn takes no ``params``, returns iterator or queue tensors, ends epochs on a short batch.
:func:`adapt` wraps it:

1. *source*: it is called with the arguments it accepts; tensors it returns from an iterator's
   ``get_next()`` or from numpy_input_fn / pandas_input_fn queues are traced back to a Dataset
   (:class:`_SourceRecorder`); numpy values become a repeated Dataset;
2. *batches*: stock's global batches, made static -- short ones padded with a padding weight
   (:func:`fit_batches`) -- and on a TPU cut into per-core pieces per host (:func:`tpu_batches`);
3. *padding arithmetic*: the model_fn weights padding out of the training loss (to stock's mean),
   of the eval loss and of every metric; the estimator drops it from predictions.

One module over ~300 lines because these three steps share one contract (the padding keys and
what a padded batch means); the layout issue splits them into source, batching and padding modules.
"""

import collections
import logging

import tensorflow as tf

from tpushim import _tfprivate
from tpushim._errors import ConversionError

logger = logging.getLogger("tpushim")

ModeKeys = tf.estimator.ModeKeys

PADDING_KEY = "__tpushim_padding_weight__"
FEATURES_KEY = "__tpushim_features__"

_REPLACEMENT = ("return a tf.data.Dataset instead, e.g. "
                "`lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(B)`")


def split_padding(features):
    """(features, padding weight or None) from what the adapted input_fn produced."""
    if isinstance(features, dict) and PADDING_KEY in features:
        return features[FEATURES_KEY], features[PADDING_KEY]
    return features, None


def call_user_input_fn(input_fn, mode, params, config, input_context=None):
    """Calls a user's input_fn with the arguments it accepts, as Estimator does."""
    args = _tfprivate.fn_args(input_fn)
    kwargs = {}
    if "params" in args:
        kwargs["params"] = params
    if "mode" in args:
        kwargs["mode"] = mode
    if "config" in args:
        kwargs["config"] = config
    if "input_context" in args:
        kwargs["input_context"] = input_context
    return input_fn(**kwargs)


class _SourceRecorder:
    """While the user's input_fn runs, notes where its tensors can come from, so that tensors it
    returns can be traced back to data a ``tf.data.Dataset`` can feed:

    * every one-shot / initializable iterator it makes over a Dataset, and what each ``get_next()``
      returns (``make_one_shot_iterator(ds).get_next()``);
    * every queue ``numpy_input_fn`` / ``pandas_input_fn`` fill from arrays or a DataFrame
      (``feeding_functions._enqueue_data``), with how they fill it.

    Names are swapped in TensorFlow's modules only while the input_fn runs.
    """

    def __init__(self):
        self.made = []  # (dataset, [flat get_next outputs, per call])
        self.queues = []  # _QueueSource

    def __enter__(self):
        self._saved = []
        module = tf.compat.v1.data
        for name in ("make_one_shot_iterator", "make_initializable_iterator"):
            self._wrap_iterator(module, name, getattr(module, name))
            self._wrap_iterator(tf.compat.v1.data.Dataset, name,  # their method forms
                                tf.compat.v1.data.Dataset.__dict__[name])
        self._restore_enqueue = _tfprivate.replace_enqueue_data(self._recording_enqueue)
        return self

    def _wrap_iterator(self, owner, name, original):
        made = self.made

        def wrapper(dataset, *args, **kwargs):
            iterator = original(dataset, *args, **kwargs)
            calls = []
            made.append((dataset, calls))
            get_next = iterator.get_next

            def recorded_get_next(*a, **k):
                out = get_next(*a, **k)
                calls.append(tf.nest.flatten(out))
                return out
            iterator.get_next = recorded_get_next
            return iterator
        self._saved.append((owner, name, original))
        setattr(owner, name, wrapper)

    def _recording_enqueue(self, original):
        import inspect  # pylint: disable=import-outside-toplevel
        signature = inspect.signature(original)

        def enqueue_data(*args, **kwargs):
            graph = tf.compat.v1.get_default_graph()
            before = {key: list(graph.get_collection(key)) for key in _QUEUE_SIDE_EFFECTS}
            queue = original(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            added = {key: [x for x in graph.get_collection(key) if not any(x is y for y in before[key])]
                     for key in _QUEUE_SIDE_EFFECTS}
            self.queues.append(_QueueSource(queue, dict(bound.arguments), added))
            return queue
        return enqueue_data

    def __exit__(self, *exc):
        self._restore_enqueue()
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)

    def dataset_for(self, result):
        """The recorded source mapped to ``result``'s structure, if every tensor in it came from
        one get_next() of one iterator or one dequeue of one recorded queue; else None."""
        flat = tf.nest.flatten(result)
        if not flat:
            return None
        for dataset, calls in self.made:
            for outputs in calls:
                ids = [next((i for i, t in enumerate(outputs) if t is x), None) for x in flat]
                if None not in ids:
                    # Dataset.map (v2), not the v1 method: v1's map forgets the cardinality, and
                    # evaluate() on a TPU must know whether the input ends.
                    return tf.data.Dataset.map(dataset, _rearrange(result, ids))
        for source in self.queues:
            dataset = source.dataset_for(result, flat)
            if dataset is not None:
                return dataset
        return None


# What feeding_functions._enqueue_data adds to the graph besides the queue: a queue runner (threads
# filling it) and a summary of how full it is. Dropped when the queue is replaced by a Dataset.
_QUEUE_SIDE_EFFECTS = (tf.compat.v1.GraphKeys.QUEUE_RUNNERS, tf.compat.v1.GraphKeys.SUMMARIES)

_DEQUEUE_OPS = {"QueueDequeueManyV2": True, "QueueDequeueUpToV2": False}  # -> full batches only


def _rearrange(result, ids):
    def rearrange(*element):
        element = tf.nest.flatten(element)
        return tf.nest.pack_sequence_as(result, [element[i] for i in ids])
    return rearrange


class _QueueSource:
    """A queue numpy_input_fn / pandas_input_fn fill, and the Dataset that feeds the same rows.

    The queue holds, per row, its number (or the DataFrame's index) and then one column per array.
    ``shuffle=False`` with one thread: the same rows in the same order and batches as stock
    (``repeat(num_epochs).batch(B)``, batches running on across epochs as the queue's do; a last
    short batch only when ``num_epochs`` is set). ``shuffle=True``: stock's order depends on
    queue-filling threads and is not reproducible; the Dataset shuffles with a buffer of the queue's
    capacity, reshuffled every epoch, every row once per epoch, seeded by the graph's seed
    (``RunConfig(tf_random_seed=...)``), so two runs see the same order.
    """

    def __init__(self, queue, arguments, side_effects):
        self.queue, self.arguments, self.side_effects = queue, arguments, side_effects

    def columns(self):
        import collections  # pylint: disable=import-outside-toplevel
        import numpy as np  # pylint: disable=import-outside-toplevel
        data = self.arguments["data"]
        if isinstance(data, np.ndarray):
            return [np.arange(len(data), dtype=np.int64), data]
        if isinstance(data, collections.OrderedDict):
            values = list(data.values())
            return [np.arange(len(values[0]), dtype=np.int64)] + values
        if type(data).__name__ == "DataFrame" and hasattr(data, "columns"):
            return [data.index.values] + [data[c].values for c in data.columns]
        return None  # a generator: no fixed rows to slice

    def dataset_for(self, result, flat):
        ops = {x.op for x in flat}
        if len(ops) != 1:
            return None
        op = ops.pop()
        if op.type not in _DEQUEUE_OPS or op.inputs[0] is not self.queue.queue_ref:
            return None
        columns, batch_size = self.columns(), tf.get_static_value(op.inputs[1])
        if columns is None or batch_size is None or self.arguments.get("pad_value") is not None:
            return None
        args = self.arguments
        dataset = tf.data.Dataset.from_tensor_slices(tuple(columns))
        if args["shuffle"]:
            dataset = dataset.shuffle(min(int(args["capacity"]), len(columns[0])),
                                      seed=args["seed"], reshuffle_each_iteration=True)
        epochs = args["num_epochs"]
        # Each of num_threads feeding threads counts its own epochs (stock warns about it).
        dataset = dataset.repeat(None if epochs is None else epochs * args["num_threads"])
        dataset = dataset.batch(int(batch_size), drop_remainder=_DEQUEUE_OPS[op.type])
        dataset = dataset.map(_rearrange(result, [x.value_index for x in flat]))
        self._undo_side_effects()
        logger.info("numpy/pandas queue input (%d rows, batch %d%s) fed as a tf.data.Dataset",
                    len(columns[0]), batch_size, ", shuffled" if args["shuffle"] else "")
        return dataset

    def _undo_side_effects(self):
        # The queue is never read now: its runner must not start threads filling it (on a TPU host
        # they would copy the arrays for nothing), nor its summary report it empty.
        graph = self.queue.queue_ref.graph
        for key, added in self.side_effects.items():
            collection = graph.get_collection_ref(key)
            collection[:] = [x for x in collection if not any(x is a for a in added)]


def call_and_recover(input_fn, mode, params, config, input_context=None):
    """Calls the input_fn; iterator or queue tensors traced to their source become a Dataset."""
    with _SourceRecorder() as recorder:
        result = call_user_input_fn(input_fn, mode, params, config, input_context)
    if result is not None and not isinstance(result, tf.data.Dataset):
        flat = tf.nest.flatten(result)
        if flat and all(tf.is_tensor(x) for x in flat):
            dataset = recorder.dataset_for(result)
            if dataset is not None:
                return dataset
    return result


def tensors_error(input_fn, result):
    return ConversionError(
        f"input_fn {getattr(input_fn, '__name__', input_fn)!r} returned {type(result).__name__} "
        f"(tensors) that tpushim cannot trace back to a tf.data.Dataset, an iterator's get_next() "
        f"or numpy_input_fn / pandas_input_fn arrays (e.g. they were computed from those). A TPU "
        f"reads its input from a Dataset: {_REPLACEMENT}, and do any computation in dataset.map.")


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
        return tf.data.Dataset.from_tensors(tf.nest.map_structure(tf.convert_to_tensor, result)).repeat()
    if flat and not isinstance(result, list) and all(tf.is_tensor(x) or _is_value(x) for x in flat):
        result = tf.nest.map_structure(
            lambda x: x if tf.is_tensor(x) else tf.convert_to_tensor(x), result)
        flat = tf.nest.flatten(result)
    if not flat or not all(tf.is_tensor(x) for x in flat):
        raise ConversionError(
            f"input_fn {getattr(input_fn, '__name__', input_fn)!r} returned {result!r:.100}; it must "
            f"return a tf.data.Dataset of (features, labels) or of features, or (features, labels) "
            f"tensors. {_REPLACEMENT[0].upper()}{_REPLACEMENT[1:]}.")
    return result


def _is_value(x):
    import numpy as np  # pylint: disable=import-outside-toplevel
    return isinstance(x, (np.ndarray, np.generic, int, float, bool))


def _batch_dim(dataset):
    # dimension_value: under disable_v2_behavior() shapes hold (unhashable) Dimension objects.
    dims = {tf.compat.dimension_value(spec.shape[0]) if spec.shape.rank else None for spec in tf.nest.flatten(dataset.element_spec)}
    return dims.pop() if len(dims) == 1 else None


# Dataset ops that keep their input's batches as they are, between the user's batch op and the end.
_BATCH_PRESERVING = {
    "PrefetchDataset", "MapDataset", "ParallelMapDataset", "ParallelMapDatasetV2", "RepeatDataset",
    "CacheDataset", "CacheDatasetV2", "ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3",
    "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2", "FilterDataset", "TakeDataset",
    "SkipDataset", "OptionsDataset", "ModelDataset", "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset", "AssertCardinalityDataset", "IgnoreErrorsDataset"}
_BATCH_OPS = {"BatchDataset", "BatchDatasetV2", "ParallelBatchDataset", "PaddedBatchDataset",
              "PaddedBatchDatasetV2"}


def _declared_batch(dataset):
    """The batch_size the pipeline's last batch op declares (a constant), or None if the graph does not say."""
    op = _tfprivate.dataset_variant_op(dataset)
    for _ in range(64 if op is not None else 0):
        if op.type in _BATCH_OPS:
            value = tf.get_static_value(op.inputs[1])
            return int(value) if value is not None and int(value) > 0 else None
        if op.type not in _BATCH_PRESERVING or not op.inputs:
            return None
        op = op.inputs[0].op
    return None


# Ops a Dataset's elements pass through one for one, beneath a batch op: an infinite repeat below
# them means the batch op never sees the end of its input, so never makes a short batch.
_ONE_FOR_ONE = {"MapDataset", "ParallelMapDataset", "ParallelMapDatasetV2", "PrefetchDataset",
                "ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3", "CacheDataset",
                "CacheDatasetV2", "OptionsDataset", "ModelDataset", "FilterDataset",
                "IgnoreErrorsDataset", "MaxIntraOpParallelismDataset", "PrivateThreadPoolDataset"}


def _batches_always_full(dataset):
    """True when the graph shows the last batch op never makes a short batch: it drops remainders,
    or an infinite ``repeat()`` feeds it (``repeat().batch(B)``, the usual training pipeline)."""
    op = _tfprivate.dataset_variant_op(dataset)
    while op is not None and op.type in _BATCH_PRESERVING and op.inputs:
        op = op.inputs[0].op
    if op is None or op.type not in _BATCH_OPS:
        return False
    drop = tf.get_static_value(op.inputs[-1]) if op.type == "BatchDatasetV2" else None
    if drop is True or (drop is not None and bool(drop)):
        return True
    op = op.inputs[0].op
    while op.type in _ONE_FOR_ONE and op.inputs:
        op = op.inputs[0].op
    if op.type in ("RepeatDataset", "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2"):
        count = tf.get_static_value(op.inputs[-1] if op.type == "RepeatDataset" else op.inputs[-2])
        return count is not None and int(count) == -1
    return False


def declared_batch_size(dataset):
    """The batch size a Dataset's graph declares (static batch dimension or batch op), else None."""
    return _batch_dim(dataset) or _declared_batch(dataset)


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
        result = check_result(input_fn, call_and_recover(input_fn, mode, {}, config))
        finite, batches, examples, declared = False, None, None, None
        if isinstance(result, tf.data.Dataset):
            declared = declared_batch_size(result)
            cardinality = int(sess.run(result.cardinality()))
            finite = cardinality >= 0  # known to end; UNKNOWN (filter, generators) is not
            if count and (finite or count_unknown and cardinality != tf.data.INFINITE_CARDINALITY):
                sess.run(tf.compat.v1.tables_initializer())
                sizes = result.map(lambda *e: tf.shape(tf.nest.flatten(e)[0], out_type=tf.int64)[0])
                batches, examples = (int(n) for n in sess.run(sizes.reduce(
                    (tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
                    lambda total, n: (total[0] + 1, total[1] + n))))
        elif count:
            raise tensors_error(input_fn, result)
        size = declared or _first_batch_size(result, sess)
        return InputFacts(size, declared, finite, batches, examples)


def _pad_batch(batch_size):
    def pad(*element):
        element = element[0] if len(element) == 1 else element
        flat = tf.nest.flatten(element)
        real = tf.shape(flat[0])[0]
        missing = batch_size - real

        def pad_one(x):
            paddings = [[0, missing]] + [[0, 0]] * (x.shape.rank - 1)
            padded = tf.pad(x, paddings, constant_values=tf.zeros([], x.dtype))
            padded.set_shape([batch_size] + x.shape.as_list()[1:])
            return padded

        weight = tf.pad(tf.ones([real], tf.float32), [[0, missing]])
        weight.set_shape([batch_size])
        padded = tf.nest.map_structure(pad_one, element)
        if isinstance(padded, tuple) and len(padded) == 2:  # (features, labels), as Estimator reads it
            features, labels = padded
            return {FEATURES_KEY: features, PADDING_KEY: weight}, labels
        return {FEATURES_KEY: padded, PADDING_KEY: weight}
    return pad


def _rebatch(dataset, batch_size, drop_remainder):
    if hasattr(dataset, "rebatch"):  # TF >= 2.12: splits/merges batches without per-example work
        return dataset.rebatch(batch_size, drop_remainder=drop_remainder)
    return dataset.unbatch().batch(batch_size, drop_remainder=drop_remainder)


def fit_batches(dataset, batch_size, mode):
    """The user's Dataset in batches of exactly ``batch_size`` (static shapes), as stock batches it.

    * already static and that size: as it is;
    * batched by that size with a short batch here and there (``batch(B)`` without
      ``drop_remainder``, at each epoch's end with ``batch(B).repeat()``): each short batch padded
      to ``batch_size`` with a padding weight, in every mode. Stock's batches stay as they are: the
      model_fn weights padding out of the training loss (so the mean is over the real rows, as
      stock's), of the eval loss and metrics, and the estimator drops it from predictions;
    * batched by another size (``batch_size`` set explicitly): re-batched; a training batch that
      would be short is filled from the next epoch's rows, as a TPU always gets full batches.
    """
    static = _batch_dim(dataset)
    if static == batch_size:
        return dataset
    if static is None and _declared_batch(dataset) == batch_size:
        if _batches_always_full(dataset):  # nothing to pad: only the static shape is missing
            return _rebatch(dataset, batch_size, drop_remainder=True)
        return dataset.map(_pad_batch(batch_size))
    if mode == ModeKeys.TRAIN:
        return _rebatch(dataset, batch_size, drop_remainder=True)
    return _rebatch(dataset, batch_size, drop_remainder=False).map(_pad_batch(batch_size))


def _padding_filler(dataset):
    """Zero-weight batches like ``dataset``'s, forever: what a TPU evaluation, which runs exactly
    ``steps`` steps and cannot stop at the end of the input, reads once a host's share ran out."""
    return dataset.take(1).map(lambda *e: tf.nest.map_structure(
        tf.zeros_like, e[0] if len(e) == 1 else e)).repeat()


def tpu_batches(dataset, global_batch, batch_size, mode, num_hosts=1, host=0):
    """One TPU host's input: the global batches stock would see (:func:`fit_batches`) cut, in order,
    into the ``batch_size`` pieces TPUEstimator feeds each core (PER_HOST_V2) or host (V1); host
    ``h`` of ``H`` takes pieces ``h, h+H, ...``, so each step's global batch is the next of stock's
    batches. In EVAL every batch carries a padding weight and zero-weight batches follow forever,
    so no host runs dry before the last of the steps tpushim computes.
    """
    dataset = fit_batches(dataset, global_batch, mode)
    if mode == ModeKeys.EVAL and not _has_padding(dataset):
        dataset = dataset.map(_pad_batch(global_batch))  # all real: weights of one
    if batch_size != global_batch:
        dataset = _rebatch(dataset, batch_size, drop_remainder=True)  # divides: nothing dropped
    if num_hosts > 1 and mode != ModeKeys.PREDICT:
        dataset = dataset.shard(num_hosts, host)
    if mode == ModeKeys.EVAL:
        dataset = dataset.concatenate(_padding_filler(dataset))
    return dataset


def _has_padding(dataset):
    features = dataset.element_spec
    features = features[0] if isinstance(features, tuple) and len(features) == 2 else features
    return isinstance(features, dict) and PADDING_KEY in features


def _without_float64(dataset):
    """float64 features and labels (numpy's default, pandas') as float32: a TPU's infeed takes no
    float64, and the Keras model computes in float32 anyway (its layers cast their inputs)."""
    flat = tf.nest.flatten(dataset.element_spec)
    if not any(spec.dtype == tf.float64 for spec in flat):
        return dataset
    logger.info("float64 input cast to float32: a TPU cannot be fed float64, and the model "
                "computes in float32")

    def cast(*element):
        element = element[0] if len(element) == 1 else element
        return tf.nest.map_structure(
            lambda t: tf.cast(t, tf.float32) if t.dtype == tf.float64 else t, element)
    return dataset.map(cast)


def adapt(input_fn, global_batch=None):
    """Wraps a user's input_fn into one TPUEstimator accepts (``params`` and static batches).

    ``global_batch``: the global batch size of this mode; ``params['batch_size']`` (per core on a
    TPU, global on CPU) when not given.
    """

    def tpushim_input_fn(params, mode=None, config=None, input_context=None):
        result = check_result(input_fn, call_and_recover(input_fn, mode, params, config, input_context))
        context = params.get("context")  # present only when the input feeds a TPU
        if not isinstance(result, tf.data.Dataset):
            if context is not None:
                raise tensors_error(input_fn, result)
            # On CPU TPUEstimator takes tensors as Estimator does; cpu mode says what a TPU would do.
            logger.warning("%s Running it as it is on CPU.", tensors_error(input_fn, result))
            return result
        result = _without_float64(result)
        batch_size = params["batch_size"]
        if context is None:
            return fit_batches(result, batch_size, mode).prefetch(tf.data.AUTOTUNE)
        return tpu_batches(result, global_batch or batch_size, batch_size, mode,
                           getattr(context, "num_hosts", 1),
                           getattr(context, "current_host", 0)).prefetch(tf.data.AUTOTUNE)

    tpushim_input_fn.__wrapped__ = input_fn
    return tpushim_input_fn


def _row_labels(label, output):
    """Labels [batch] for an output [batch, 1] as [batch, 1]: Keras would reduce the loss over the
    batch inside the loss function (stock's loss is then the batch mean), leaving no per-row loss
    to weight padding out of; per row, the mean is the same."""
    if (tf.is_tensor(label) and label.shape.rank is not None and output.shape.rank is not None
            and label.shape.rank == output.shape.rank - 1
            and tf.compat.dimension_value(output.shape[-1]) == 1):
        return tf.expand_dims(label, -1)
    return label


def labels_for_padded_training(keras_model, labels):
    """The labels of a padded TRAIN batch, with one loss per row for every output (see _row_labels)."""
    if not keras_model.outputs:
        # A subclassed model's outputs are known only once cloned: any [batch] label becomes
        # [batch, 1], which every built-in loss reads as the same rows (Keras squeezes it back
        # for a [batch] output).
        return tf.nest.map_structure(
            lambda l: tf.expand_dims(l, -1) if tf.is_tensor(l) and l.shape.rank == 1 else l, labels)
    outputs = dict(zip(keras_model.output_names, keras_model.outputs))
    if isinstance(labels, dict):
        return {k: _row_labels(v, outputs[k]) if k in outputs else v for k, v in labels.items()}
    if isinstance(labels, (list, tuple)) and len(labels) == len(keras_model.outputs):
        return type(labels)(_row_labels(l, o) for l, o in zip(labels, keras_model.outputs))
    if len(keras_model.outputs) == 1:
        return _row_labels(labels, keras_model.outputs[0])
    return labels


def weight_out_padding_in_training(model, padding_weight, cross_replica=False):
    """Recompiles a TRAIN clone's loss so padding rows count for nothing and the mean is the real rows'.

    Keras divides a weighted loss by the batch's element count, padding included; weighting each
    real row by (global batch / real rows in the global batch) makes that the mean over the real
    rows -- stock's loss on its short batch. On a TPU the counts are summed across shards, so after
    the cross-shard mean of the gradients every real row of the global batch weighs the same.
    A full batch gets weights of exactly 1.
    """
    # Stock first drops sample weights that cover only some outputs (Keras recompiles the loss
    # unweighted when weights and weight modes disagree); so does tpushim, before adding its own.
    _tfprivate.settle_sample_weights(model)
    pad = tf.cast(padding_weight, tf.keras.backend.floatx())
    counts = tf.stack([tf.reduce_sum(pad), tf.cast(tf.size(pad), pad.dtype)])
    if cross_replica:
        counts = tf.compat.v1.tpu.cross_replica_sum(counts)
    mean_weight = pad * tf.stop_gradient(tf.math.divide_no_nan(counts[1], counts[0]))
    weights = []
    for endpoint in _tfprivate.training_endpoints(model):
        # A loss reduced by SUM adds its rows up: padding rows just weigh 0.
        is_sum = getattr(endpoint.loss_fn, "reduction", None) == tf.keras.losses.Reduction.SUM
        weight = pad if is_sum else mean_weight
        own = endpoint.sample_weight
        weights.append(weight if own is None else tf.cast(own, weight.dtype) * weight)
    _tfprivate.recompile_loss_with_sample_weights(model, weights)


def eval_loss(model, padding_weight, cross_replica=False):
    """The eval loss of the real (unpadded) rows of the *global* batch, as stock computes it per batch.

    Stock's eval "loss" is the mean over batches of each batch's loss. On a TPU each shard sees a
    slice of the global batch (and the last one may hold only padding), and TPUEstimator reports
    shard 0's loss; with ``cross_replica`` each output's weighted sum and real element count are
    summed over all shards first, so every shard's loss is that of the whole global batch.
    """
    if padding_weight is None and not cross_replica:
        return model.total_loss
    losses_utils = _tfprivate.losses_utils()
    total = 0.0
    for endpoint in _tfprivate.training_endpoints(model):
        if endpoint.should_skip_target():
            continue
        y_pred, y_true = endpoint.output, endpoint.training_target.target
        if (y_true.shape.rank is not None and y_pred.shape.rank is not None
                and y_true.shape.rank == y_pred.shape.rank - 1
                and tf.compat.dimension_value(y_pred.shape[-1]) == 1):
            # Labels [batch] for an output [batch, 1]: Keras squeezes the output and its mean over
            # the last axis becomes the batch mean; expanding the labels keeps one loss per row
            # (same mean) so padding rows can be weighted out.
            y_true = tf.expand_dims(y_true, -1)
        per_sample = endpoint.loss_fn.call(y_true, y_pred)
        rows = (tf.ones(tf.shape(per_sample)[:1], per_sample.dtype) if padding_weight is None
                else tf.cast(padding_weight, per_sample.dtype))
        weight = rows
        if endpoint.sample_weight is not None:
            weight = weight * tf.cast(endpoint.sample_weight, per_sample.dtype)
        weighted = losses_utils.compute_weighted_loss(
            per_sample, sample_weight=weight, reduction=losses_utils.ReductionV2.NONE)
        per_row = tf.cast(tf.size(per_sample) // tf.shape(per_sample)[0], per_sample.dtype)
        sums = tf.stack([tf.reduce_sum(weighted), tf.reduce_sum(rows) * per_row])
        if cross_replica:
            sums = tf.compat.v1.tpu.cross_replica_sum(sums)
        reduction = getattr(endpoint.loss_fn, "reduction", losses_utils.ReductionV2.AUTO)
        if reduction == losses_utils.ReductionV2.SUM:
            output_loss = sums[0]
        else:  # AUTO / SUM_OVER_BATCH_SIZE: divide by the real rows' element count
            output_loss = tf.math.divide_no_nan(sums[0], sums[1])
        total += endpoint.loss_weight * output_loss
    regularization = model.get_losses_for(None) + model.get_losses_for(model.inputs)
    if regularization:
        total += tf.add_n(regularization)
    return total
