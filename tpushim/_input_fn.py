"""Adapts a legacy input_fn to what TPUEstimator (and a TPU) demands, without the user's help.

TPUEstimator calls ``input_fn(params=...)`` and a TPU needs batches of one static size. A legacy
input_fn takes no ``params`` and ends its last batch short. :func:`adapt` wraps it: it is called
with the arguments it accepts; its ``tf.data.Dataset`` is re-batched to ``params['batch_size']``
(per shard on a TPU, global on CPU) with static shapes; in EVAL and PREDICT the last batch is padded
and a padding weight (1 real, 0 padding) rides along, so every example is evaluated or predicted
exactly once: the model_fn gives padding zero weight in every metric and in the loss, and the
estimator drops padded rows from predictions.
"""

import logging

import tensorflow as tf

from tpushim import _tfprivate
from tpushim._errors import ConversionError

logger = logging.getLogger("tpushim")

ModeKeys = tf.estimator.ModeKeys

PADDING_KEY = "__tpushim_padding_weight__"
FEATURES_KEY = "__tpushim_features__"

_REPLACEMENT = ("return a tf.data.Dataset instead, e.g. replace numpy_input_fn(x, y, batch_size=B, ...) "
                "with `lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(B)`")


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


class _IteratorRecorder:
    """While the user's input_fn runs, notes every one-shot / initializable iterator it makes over a
    Dataset and the tensors each get_next() returns, so those tensors can be traced back to it."""

    def __init__(self):
        self.made = []  # (dataset, [flat get_next outputs, per call])

    def __enter__(self):
        from tensorflow.python.data.ops import dataset_ops  # pylint: disable=import-outside-toplevel
        self._saved = []
        module = tf.compat.v1.data
        for name in ("make_one_shot_iterator", "make_initializable_iterator"):
            self._wrap(module, name, getattr(module, name), method=False)
            self._wrap(dataset_ops.DatasetV1, name, dataset_ops.DatasetV1.__dict__[name], method=True)
        return self

    def _wrap(self, owner, name, original, method):
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

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)

    def dataset_for(self, result):
        """The recorded Dataset mapped to ``result``'s structure, if every tensor in it came from
        one get_next() of one iterator; else None."""
        flat = tf.nest.flatten(result)
        for dataset, calls in self.made:
            for outputs in calls:
                ids = [next((i for i, t in enumerate(outputs) if t is x), None) for x in flat]
                if flat and None not in ids:
                    def rearrange(*element, _ids=tuple(ids)):
                        element = tf.nest.flatten(element)
                        return tf.nest.pack_sequence_as(result, [element[i] for i in _ids])
                    # Dataset.map (v2), not the v1 method: v1's map forgets the cardinality, and
                    # evaluate() on a TPU must know whether the input ends.
                    return tf.data.Dataset.map(dataset, rearrange)
        return None


def call_and_recover(input_fn, mode, params, config, input_context=None):
    """Calls the input_fn; iterator tensors traced to the Dataset they come from become that Dataset."""
    with _IteratorRecorder() as recorder:
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
        f"(tensors), not a tf.data.Dataset. A TPU reads its input from a Dataset "
        f"(tf.compat.v1.estimator.inputs.numpy_input_fn and pandas_input_fn return queue tensors): "
        f"{_REPLACEMENT}.")


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
    try:
        op = dataset._variant_tensor.op  # pylint: disable=protected-access
    except (AttributeError, ValueError):
        return None
    for _ in range(64):
        if op.type in _BATCH_OPS:
            value = tf.get_static_value(op.inputs[1])
            return int(value) if value is not None and int(value) > 0 else None
        if op.type not in _BATCH_PRESERVING or not op.inputs:
            return None
        op = op.inputs[0].op
    return None


def _first_batch_size(result):
    """The batch size the input declares (static shape, or its batch op), else its first batch's size."""
    if isinstance(result, tf.data.Dataset):
        static = _batch_dim(result) or _declared_batch(result)
        if static:
            return static
        result = tf.compat.v1.data.make_one_shot_iterator(result.take(1)).get_next()
    first = tf.nest.flatten(result)[0]
    if first.shape.rank and tf.compat.dimension_value(first.shape[0]):
        return int(tf.compat.dimension_value(first.shape[0]))
    # A MonitoredSession also starts the queue runners of numpy_input_fn / pandas_input_fn.
    with tf.compat.v1.train.MonitoredSession() as sess:
        return int(sess.run(first).shape[0])


def inspect_input(input_fn, mode, config, count=False, count_unknown=True):
    """(global batch size, finite, examples) of the user's input, read in one scratch graph.

    The batch size is the static batch dimension or the size of the first batch; ``finite`` says
    whether a Dataset ends; ``examples`` is how many it holds when ``count`` is asked for and it
    ends (None otherwise); with ``count_unknown=False`` only when its cardinality says it ends (an
    unknown one may repeat forever). The real pipeline is never touched.
    """
    with tf.Graph().as_default():
        result = check_result(input_fn, call_and_recover(input_fn, mode, {}, config))
        finite, examples = False, None
        if isinstance(result, tf.data.Dataset):
            with tf.compat.v1.Session() as sess:
                cardinality = int(sess.run(result.cardinality()))
                finite = cardinality >= 0  # known to end; UNKNOWN (filter, generators) is not
                if count and (finite or count_unknown and cardinality != tf.data.INFINITE_CARDINALITY):
                    sizes = result.map(lambda *e: tf.shape(tf.nest.flatten(e)[0], out_type=tf.int64)[0])
                    examples = int(sess.run(sizes.reduce(tf.constant(0, tf.int64), lambda t, n: t + n)))
        elif count:
            raise tensors_error(input_fn, result)
        return _first_batch_size(result), finite, examples


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


def rebatch(dataset, batch_size, mode):
    """Batches of exactly ``batch_size`` with static shapes; padded (and weighted) in EVAL/PREDICT."""
    if mode == ModeKeys.TRAIN:
        dataset = _rebatch(dataset, batch_size, drop_remainder=True)
    else:
        dataset = _rebatch(dataset, batch_size, drop_remainder=False).map(_pad_batch(batch_size))
    return dataset.prefetch(tf.data.AUTOTUNE)


def tpu_eval_batches(dataset, batch_size, num_hosts=1, host=0):
    """One TPU host's evaluation input: per-core batches of the global sequence, then padding.

    A TPU evaluation step takes one batch per core from every host, for exactly ``steps`` steps,
    and cannot stop at the end of the input. The input is cut into padded per-core batches in
    order, host ``h`` of ``H`` takes batches ``h, h+H, ...`` (so each step's global batch is the
    next run of examples, as stock batches them), and zero-weight batches follow forever: a host
    whose share ran out, or a last step with fewer real batches than cores, is fed padding.
    """
    padded = _rebatch(dataset, batch_size, drop_remainder=False).map(_pad_batch(batch_size))
    filler = padded.take(1).map(lambda *e: tf.nest.map_structure(
        tf.zeros_like, e[0] if len(e) == 1 else e)).repeat()
    if num_hosts > 1:
        padded = padded.shard(num_hosts, host)
    return padded.concatenate(filler).prefetch(tf.data.AUTOTUNE)


def adapt(input_fn):
    """Wraps a user's input_fn into one TPUEstimator accepts (``params`` and static batches)."""

    def tpushim_input_fn(params, mode=None, config=None, input_context=None):
        result = check_result(input_fn, call_and_recover(input_fn, mode, params, config, input_context))
        context = params.get("context")  # present only when the input feeds a TPU
        if not isinstance(result, tf.data.Dataset):
            if context is not None:
                raise tensors_error(input_fn, result)
            # On CPU TPUEstimator takes tensors as Estimator does; cpu mode says what a TPU would do.
            logger.warning("%s Running it as it is on CPU.", tensors_error(input_fn, result))
            return result
        batch_size = params["batch_size"]
        num_hosts = getattr(context, "num_hosts", 1) if context is not None else 1
        if context is not None and mode == ModeKeys.EVAL:
            return tpu_eval_batches(result, batch_size, num_hosts, context.current_host)
        if num_hosts > 1 and mode != ModeKeys.PREDICT:
            # Multi-host pod: each host reads its own shard of the input.
            result = result.shard(num_hosts, context.current_host)
        if _batch_dim(result) == batch_size:  # already static and the right size
            return result.prefetch(tf.data.AUTOTUNE)  # a no-op on top of the user's own prefetch
        return rebatch(result, batch_size, mode)

    tpushim_input_fn.__wrapped__ = input_fn
    return tpushim_input_fn


def eval_loss(model, padding_weight, cross_replica=False):
    """The eval loss of the real (unpadded) rows of the *global* batch, as stock computes it per batch.

    Stock's eval "loss" is the mean over batches of each batch's loss. On a TPU each shard sees a
    slice of the global batch (and the last one may hold only padding), and TPUEstimator reports
    shard 0's loss; with ``cross_replica`` each output's weighted sum and real element count are
    summed over all shards first, so every shard's loss is that of the whole global batch.
    """
    if padding_weight is None and not cross_replica:
        return model.total_loss
    from keras.src.utils import losses_utils  # pylint: disable=import-outside-toplevel
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
