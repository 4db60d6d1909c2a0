"""Batching: a Dataset in the static, full batches a TPU needs, in stock's order.

:func:`fit_batches` gives stock's global batches with a static size (short ones padded, see
:mod:`tpushim._padding`); :func:`tpu_batches` cuts them into what TPUEstimator feeds each core or
host. The batch size a pipeline declares is read from its graph (:func:`declared_batch_size`).
"""

import logging

import tensorflow as tf

from tpushim import _batch_math, _observe, _padding, _tfprivate

logger = logging.getLogger("tpushim")

ModeKeys = _tfprivate.estimator.ModeKeys


def _batch_dim(dataset):
    # dimension_value: under disable_v2_behavior() shapes hold (unhashable) Dimension objects.
    dims = {
        tf.compat.dimension_value(component.shape[0]) if component.shape.rank else None
        for component in tf.nest.flatten(dataset.element_spec)
    }
    return dims.pop() if len(dims) == 1 else None


# Dataset ops that keep their input's batches as they are, between the user's batch op and the end.
_BATCH_PRESERVING = {
    "PrefetchDataset",
    "MapDataset",
    "ParallelMapDataset",
    "ParallelMapDatasetV2",
    "RepeatDataset",
    "CacheDataset",
    "CacheDatasetV2",
    "ShuffleDataset",
    "ShuffleDatasetV2",
    "ShuffleDatasetV3",
    "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2",
    "FilterDataset",
    "TakeDataset",
    "SkipDataset",
    "OptionsDataset",
    "ModelDataset",
    "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset",
    "AssertCardinalityDataset",
    "IgnoreErrorsDataset",
}
_BATCH_OPS = {
    "BatchDataset",
    "BatchDatasetV2",
    "ParallelBatchDataset",
    "PaddedBatchDataset",
    "PaddedBatchDatasetV2",
}


def _declared_batch(dataset):
    """The batch_size the pipeline's last batch op declares (a constant), or None if the graph does not say."""
    op = _tfprivate.data.dataset_variant_op(dataset)
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
_ONE_FOR_ONE = {
    "MapDataset",
    "ParallelMapDataset",
    "ParallelMapDatasetV2",
    "PrefetchDataset",
    "ShuffleDataset",
    "ShuffleDatasetV2",
    "ShuffleDatasetV3",
    "CacheDataset",
    "CacheDatasetV2",
    "OptionsDataset",
    "ModelDataset",
    "FilterDataset",
    "IgnoreErrorsDataset",
    "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset",
}


def _batches_always_full(dataset):
    """True when the graph shows the last batch op never makes a short batch: it drops remainders,
    or an infinite ``repeat()`` feeds it (``repeat().batch(B)``, the usual training pipeline)."""
    op = _tfprivate.data.dataset_variant_op(dataset)
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


# Batch ops whose last input is drop_remainder (the older ones have none).
_DROP_REMAINDER_LAST = {"BatchDatasetV2", "ParallelBatchDataset", "PaddedBatchDatasetV2"}

# Ops between the last batch op and the end that neither add nor drop batches: what the batch op
# makes is what the pipeline yields, so its count follows from the batch op's input.
_SAME_BATCHES = _ONE_FOR_ONE - {"FilterDataset"}


def batching_of(dataset):
    """``(rows, batch_size, drop_remainder)`` where the pipeline ends in ``batch(batch_size)`` of
    the Dataset ``rows`` (a variant tensor) followed only by ops that keep every batch
    (map, prefetch, ...); None when the graph shows no such batch op. Nothing is run."""
    op = _tfprivate.data.dataset_variant_op(dataset)
    while op is not None and op.type in _SAME_BATCHES and op.inputs:
        op = op.inputs[0].op
    if op is None or op.type not in _BATCH_OPS:
        return None
    size = tf.get_static_value(op.inputs[1])
    drop = tf.get_static_value(op.inputs[-1]) if op.type in _DROP_REMAINDER_LAST else False
    if size is None or drop is None:
        return None
    return op.inputs[0], int(size), bool(drop)


def declared_batch_size(dataset):
    """The batch size a Dataset's graph declares (static batch dimension or batch op), else None."""
    return _batch_dim(dataset) or _declared_batch(dataset)


def rows_held(dataset, session):
    """The examples a finite Dataset that ends in a batch op holds, read from its graph's
    cardinalities (no data read), or None where the graph does not say."""
    cardinality = int(session.run(dataset.cardinality()))
    batching = batching_of(dataset) if cardinality >= 0 else None
    if batching is None:
        return None
    rows_variant, size, drop_remainder = batching
    rows = int(session.run(tf.raw_ops.DatasetCardinality(input_dataset=rows_variant)))
    if rows < 0 or _batch_math.batches_of(rows, size, drop_remainder) != cardinality:
        return None  # ops after the batch change the count: the graph does not say
    return rows // size * size if drop_remainder else rows


def might_pad(dataset, batch_size):
    """True when :func:`fit_batches` pads ``dataset``'s batches of ``batch_size`` unless told that
    none is short: batched by that size without a static batch dimension, and the graph's shape
    alone does not say every batch is full (see :func:`none_short`)."""
    return (
        _batch_dim(dataset) is None
        and _declared_batch(dataset) == batch_size
        and not _batches_always_full(dataset)
    )


def none_short(dataset, session):
    """True when a finite Dataset that ends in ``batch(B)`` holds a multiple of B examples, read
    from its graph's cardinalities (no data read): every batch it makes is full, so a TPU needs no
    padding for it (``from_tensor_slices`` of 24 rows by 8). False where the graph does not say."""
    batching = batching_of(dataset)
    try:
        rows = rows_held(dataset, session) if batching is not None else None
    except tf.errors.OpError:  # a value the graph cannot give without data (a placeholder)
        return False
    return rows is not None and rows % batching[1] == 0


def too_few_rows(rows, declared, batch_size):
    """The refusal of a finite training input that holds fewer examples than one global batch:
    a TPU takes only full batches, so it would train 0 steps where stock trains every batch.
    Refused rather than warned: a run that trains nothing and returns normally leaves an
    untrained model that looks trained, and the warning would be one line among TensorFlow's."""
    batches = (
        f"{_batch_math.batches_of(rows, declared)} steps of {declared}"
        if declared
        else "its batches"
    )
    return (
        f"train(): the training input holds {rows} examples (stock trains them in {batches}), "
        f"fewer than the global batch size {batch_size} tpushim was given: a TPU takes only "
        f"full batches of {batch_size}, so training would run 0 steps. Set the batch size to "
        f"at most {rows} (tpushim.patch(batch_size=...) or TPUSHIM_BATCH_SIZE), or unset it "
        f"to use the input's own, or repeat the dataset (dataset.repeat())."
    )


def _rebatch(dataset, batch_size, drop_remainder):
    if hasattr(dataset, "rebatch"):  # TF >= 2.12: splits/merges batches without per-example work
        return dataset.rebatch(batch_size, drop_remainder=drop_remainder)
    return dataset.unbatch().batch(batch_size, drop_remainder=drop_remainder)


def fit_batches(dataset, batch_size, mode, padded_to=None, none_short=False):
    """The user's Dataset in batches of exactly ``batch_size`` (static shapes), as stock batches it.

    * already static and that size: as it is;
    * batched by that size with a short batch here and there (``batch(B)`` without
      ``drop_remainder``, at each epoch's end with ``batch(B).repeat()``): each short batch padded
      to ``batch_size`` with a padding weight, in every mode. Stock's batches stay as they are: the
      model_fn weights padding out of the training loss (so the mean is over the real rows, as
      stock's), of the eval loss and metrics, and the estimator drops it from predictions;
    * batched by another size (``batch_size`` set explicitly): re-batched; a training batch that
      would be short is filled from the next epoch's rows, as a TPU always gets full batches.

    With ``padded_to`` (a TPU's global batch when ``batch_size`` does not divide among its cores)
    every batch, full or short, is padded to ``padded_to`` rows: each step is still one of
    stock's batches. ``none_short``: the input is known to make no short batch (see
    :func:`none_short`): its batches get their static shape, no padding weight.
    """
    padded_to = padded_to or batch_size
    static = _batch_dim(dataset)
    if static == batch_size:
        full = dataset
    elif static is None and _declared_batch(dataset) == batch_size:
        if not none_short and not _batches_always_full(dataset):
            _observe.note(
                "padding",
                "short batches padded to %d rows, the padding weighted out of losses and metrics",
                padded_to,
            )
            return dataset.map(_padding.pad_batch(padded_to))
        full = _rebatch(dataset, batch_size, drop_remainder=True)  # only the static shape missing
    else:
        _observe.note(
            "rebatch",
            "input batched by %s re-batched to the global batch of %d",
            _declared_batch(dataset) or static or "a size its graph does not declare",
            batch_size,
        )
        if mode != ModeKeys.TRAIN:
            rebatched = _rebatch(dataset, batch_size, drop_remainder=False)
            return rebatched.map(_padding.pad_batch(padded_to))
        full = _rebatch(dataset, batch_size, drop_remainder=True)
    return full if padded_to == batch_size else full.map(_padding.pad_batch(padded_to))


def tpu_batches(
    dataset, global_batch, batch_size, mode, num_hosts=1, host=0, tpu_batch=None, none_short=False
):
    """One TPU input pipeline's input: the global batches stock would see (:func:`fit_batches`)
    cut, in order, into the ``batch_size`` pieces TPUEstimator feeds each core (PER_HOST_V2) or
    host (V1); invocation ``host`` of ``num_hosts`` (one per host, or one feeding every host with
    ``SLICED``) takes pieces ``h, h+H, ...``, so each step's global batch is the next of stock's
    batches. In EVAL every batch carries a padding weight and zero-weight batches follow forever,
    so no host runs dry before the last of the steps tpushim computes. ``tpu_batch``: the global
    batch the TPU runs when stock's does not divide among its cores, each of stock's batches
    padded to it (zero-weight rows). ``none_short``: as :func:`fit_batches`.
    """
    tpu_batch = tpu_batch or global_batch
    dataset = fit_batches(dataset, global_batch, mode, padded_to=tpu_batch, none_short=none_short)
    if mode == ModeKeys.EVAL and not _padding.has_padding(dataset):
        dataset = dataset.map(_padding.pad_batch(tpu_batch))  # all real: weights of one
    if batch_size != tpu_batch:
        dataset = _rebatch(dataset, batch_size, drop_remainder=True)  # divides: nothing dropped
    if num_hosts > 1:
        dataset = dataset.shard(num_hosts, host)
    if mode == ModeKeys.EVAL:
        dataset = _padding.then_zero_weight_batches(dataset)
    return dataset


def without_float64(dataset):
    """float64 features and labels (numpy's default, pandas') as float32: a TPU's infeed takes no
    float64, and the Keras model computes in float32 anyway (its layers cast their inputs)."""
    if not any(
        component.dtype == tf.float64 for component in tf.nest.flatten(dataset.element_spec)
    ):
        return dataset
    _observe.note(
        "float64",
        "float64 input cast to float32: a TPU cannot be fed float64, and the model "
        "computes in float32",
    )

    def cast(*element):
        element = element[0] if len(element) == 1 else element
        return tf.nest.map_structure(
            lambda t: tf.cast(t, tf.float32) if t.dtype == tf.float64 else t, element
        )

    return dataset.map(cast)
