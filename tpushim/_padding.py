"""Padding, in one place: a TPU needs full batches, stock's last batch is often short.

The contract: a padded batch's features are ``{FEATURES_KEY: features, PADDING_KEY: weight}``,
weight 1 for a real row and 0 for a padding row. Every step of that contract lives here:

* pack: :func:`pad_batch` pads a short batch (with copies of a real row) and adds the weight;
  :func:`then_zero_weight_batches` adds what a TPU evaluation reads once a host's input ran out;
* unpack: :func:`split_padding` in the model_fn;
* weight: padding counts for nothing in the training loss (:func:`labels_for_padded_training`;
  the loss itself weighs the padding weight in :mod:`tpushim._losses`), the eval loss
  (:func:`eval_loss`) and the metrics (:func:`real_rows`);
* drop: predictions carry the weight out of the model_fn (:func:`with_padding_weight`) and the
  estimator drops padding rows from what it yields (:func:`drop_padding`).
"""

import tensorflow as tf

from tpushim import _loss_kinds, _losses, _tfprivate

PADDING_KEY = "__tpushim_padding_weight__"
FEATURES_KEY = "__tpushim_features__"
#: The strategy engine's: the global batch's real rows, one copy per row (:func:`pad_batch`).
ROWS_KEY = "__tpushim_global_rows__"


# --- pack ------------------------------------------------------------------------------------


def pad_batch(batch_size, counted=False, global_count=None):
    """A ``Dataset.map`` function: each batch padded to ``batch_size`` rows, with its padding weight.

    ``counted`` (the strategy engine's): the features also carry the global batch's real rows
    (``global_count`` where every global batch holds that many, else this batch's own), one
    copy per row under :data:`ROWS_KEY`, so that each replica reads the global count from its
    own slice (:func:`global_rows`) and its loss needs no all-reduce to count them.

    The padding rows are copies of the batch's first row: values the model already accepts, of
    every dtype (an empty string, a zero id or a zero in a log may not be accepted: a model's
    ``tf.strings.to_number`` fails on ``""``, a lookup without OOV buckets on an unknown id, a
    ``log`` gives -inf, and 0 * inf in a weighted loss is NaN). Weighted 0, they count nowhere.
    """

    @_tfprivate.graph.not_converted
    def pad(*element):
        element = element[0] if len(element) == 1 else element
        flat = tf.nest.flatten(element)
        real = tf.shape(flat[0])[0]
        missing = batch_size - real
        rows = tf.concat([tf.range(real), tf.zeros([missing], tf.int32)], 0)

        def pad_one(x):
            padded = tf.gather(x, rows)
            padded.set_shape([batch_size] + x.shape.as_list()[1:])
            return padded

        weight = tf.pad(tf.ones([real], tf.float32), [[0, missing]])
        weight.set_shape([batch_size])
        padded = tf.nest.map_structure(pad_one, element)
        made = {PADDING_KEY: weight}
        if counted:
            count = tf.cast(real, tf.float32) if global_count is None else float(global_count)
            made[ROWS_KEY] = tf.fill([batch_size], count)
        if (
            isinstance(padded, tuple) and len(padded) == 2
        ):  # (features, labels), as Estimator reads it
            features, labels = padded
            return {FEATURES_KEY: features, **made}, labels
        return {FEATURES_KEY: padded, **made}

    return pad


@_tfprivate.graph.not_converted
def global_rows(features):
    """The global batch's real rows a replica's padded features carry, or None (see
    :func:`pad_batch`'s ``counted``)."""
    if isinstance(features, dict) and ROWS_KEY in features:
        return features[ROWS_KEY][0]
    return None


def has_padding(dataset):
    """True when the Dataset's elements carry a padding weight (made by :func:`pad_batch`)."""
    features = dataset.element_spec
    features = features[0] if isinstance(features, tuple) and len(features) == 2 else features
    return isinstance(features, dict) and PADDING_KEY in features


def _with_weight(element, weight):
    """A padded element (see :func:`pad_batch`) with its padding weight replaced by ``weight``."""
    if isinstance(element, tuple):
        features, labels = element
        return dict(features, **{PADDING_KEY: weight(features[PADDING_KEY])}), labels
    return dict(element, **{PADDING_KEY: weight(element[PADDING_KEY])})


def then_zero_weight_batches(dataset):
    """``dataset``'s padded batches, then its last batch again, forever, with weight 0: what a TPU
    evaluation, which runs exactly ``steps`` steps and cannot stop at the end of the input, reads
    once a host's share ran out. Copies of real rows, as :func:`pad_batch` pads; the input is
    not read again for them (a one-shot feed could not be). Zeros only for a host fed nothing."""
    spec = dataset.element_spec
    nothing_yet = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), spec)
    filler = tf.data.Dataset.from_tensors((False, nothing_yet)).repeat()

    def keep_last(last, tagged):
        real, element = tagged
        return tf.cond(
            real, lambda: (element, element), lambda: (last, _with_weight(last, tf.zeros_like))
        )

    tagged = dataset.map(lambda *e: (True, e[0] if len(e) == 1 else e))
    return tagged.concatenate(filler).scan(nothing_yet, keep_last)


# --- unpack ----------------------------------------------------------------------------------


def split_padding(features):
    """(features, padding weight or None) from what the adapted input_fn produced."""
    if isinstance(features, dict) and PADDING_KEY in features:
        return features[FEATURES_KEY], features[PADDING_KEY]
    return features, None


# --- weight ----------------------------------------------------------------------------------


@_tfprivate.graph.not_converted
def row_labels(label, output):
    """Labels [batch] for an output [batch, 1] as [batch, 1]: Keras would reduce the loss over the
    batch inside the loss function (stock's loss is then the batch mean), leaving no per-row loss
    to weight padding out of; per row, the mean is the same."""
    if (
        tf.is_tensor(label)
        and label.shape.rank is not None
        and output.shape.rank is not None
        and label.shape.rank == output.shape.rank - 1
        and tf.compat.dimension_value(output.shape[-1]) == 1
    ):
        return tf.expand_dims(label, -1)
    return label


def check_sample_weight_shapes(weights):
    """Raises stock's error, before anything is written, for a sample weight whose shape Keras's
    graph refuses (training_v1's ``populate_sample_weight``): [batch] per output only. Stock
    compiles its clone with the model's ``_get_compile_args()``, which carry no
    ``sample_weight_mode``: a model compiled ``sample_weight_mode="temporal"`` fails there on its
    [batch, time] weights too, as a [batch, 1] or [batch, k] weight does.

    Args:
      weights: per output, its sample weight (a tensor or ``tf.TensorSpec``) or None.
    """
    for weight in weights:
        if weight is None or weight.shape.rank is None:
            continue
        if not weight.shape.is_compatible_with([None]):
            # as stock's input gives it: any batch size
            shape = tf.TensorShape([None, *weight.shape[1:]]) if weight.shape.rank else weight.shape
            raise ValueError(f"Received sample weight with shape {shape}. Expected shape [None].")


def _outputs_of(keras_model, output_specs=None):
    """output name -> its output (a tensor or ``tf.TensorSpec``): a graph network's own, a
    subclassed model's from ``output_specs`` (:class:`tpushim._loss_kinds.LossPlan`'s); {} if
    neither is known."""
    if keras_model.outputs:
        return dict(zip(keras_model.output_names, keras_model.outputs))
    return dict(output_specs or {})


def one_number_outputs(keras_model, labels, custom_objects=None, output_specs=None):
    """output name -> the :class:`tpushim._loss_kinds.Degree` of its loss
    (:func:`tpushim._loss_kinds.row_label_kind`), for each output whose [batch] labels of its
    [batch, 1] output make that loss one number for the batch (Keras squeezes the output first:
    ``mse``, a SUM loss), as stock's graph computes it; probed in a graph of its own. Its labels stay [batch]: read per row, a SUM loss would sum
    the rows where stock takes their mean. ``output_specs``: a subclassed model's outputs
    (:func:`_outputs_of`)."""
    known = _outputs_of(keras_model, output_specs)
    if not known or labels is None:
        return {}
    names = list(known)
    if isinstance(labels, dict):
        given = [labels.get(n) for n in names]
    elif isinstance(labels, (list, tuple)) and len(labels) == len(names):
        given = list(labels)
    elif len(names) == 1:
        given = [labels]
    else:
        return {}
    args = _tfprivate.keras.compile_args(keras_model)
    with tf.keras.utils.custom_object_scope(custom_objects or {}):
        loss_fns = _tfprivate.keras_compile.prepare_loss_functions(args.get("loss"), names)
    found = {}
    for name, loss_fn, output, label in zip(names, loss_fns, known.values(), given):
        if loss_fn is None or not tf.is_tensor(label) or row_labels(label, output) is label:
            continue
        with tf.Graph().as_default():
            y_true = tf.compat.v1.placeholder(label.dtype, [None])
            y_pred = tf.compat.v1.placeholder(output.dtype, [None, *output.shape[1:]])
            rank = loss_fn.call(y_true, y_pred).shape.rank
        if rank == 0:
            where = f"loss of output {name!r} ({getattr(loss_fn, 'name', type(loss_fn).__name__)})"
            shape = [None, *output.shape.as_list()[1:]]
            found[name] = _loss_kinds.row_label_kind(where, loss_fn, shape, output.dtype)
    return found


def labels_for_padded_training(keras_model, labels, keep=(), output_specs=None):
    """The labels of a padded TRAIN batch, with one loss per row for every output (see row_labels)
    but those named in ``keep`` (:func:`one_number_outputs`); ``output_specs`` as there."""
    known = _outputs_of(keras_model, output_specs)
    names = list(known)
    outputs = {k: o for k, o in known.items() if k not in keep}
    if isinstance(labels, dict):
        return {k: row_labels(v, outputs[k]) if k in outputs else v for k, v in labels.items()}
    if isinstance(labels, (list, tuple)) and len(labels) == len(names):
        return type(labels)(
            row_labels(label, outputs[n]) if n in outputs else label
            for label, n in zip(labels, names)
        )
    if len(names) == 1:
        return row_labels(labels, known[names[0]]) if outputs else labels
    return labels


def eval_loss(model, padding_weight, cross_replica=False, kinds=None, added=None):
    """The eval loss of the real (unpadded) rows of the *global* batch, as stock computes it per batch.

    Stock's eval "loss" is the mean over batches of each batch's loss. On a TPU each shard sees a
    slice of the global batch (and the last one may hold only padding), and TPUEstimator reports
    shard 0's loss; with ``cross_replica`` each output's weighted sum and real element count are
    summed over all shards first, so every shard's loss is that of the whole global batch.
    ``kinds`` (output name -> :class:`tpushim._loss_kinds.LossKind`) tells a custom scalar loss,
    or one weighted 0, from one value per example (the default). An activity regularizer's term
    is the real rows' (:func:`tpushim._losses.activity_term`, its degree from ``added``: (layer
    name, index) -> :class:`tpushim._loss_kinds.Degree`), not Keras's mean over the padded batch.
    """
    if padding_weight is None and not cross_replica:
        return model.total_loss
    total = 0.0
    for endpoint in _tfprivate.keras_compile.training_endpoints(model):
        if endpoint.should_skip_target():
            continue
        kind = (kinds or {}).get(endpoint.output_name, _loss_kinds.ROWS)
        output_loss = kind.term(  # (a one-number term: the training step's, over all the rows)
            per_example=lambda: _per_example_eval_loss(endpoint, padding_weight, cross_replica),
            one_number=lambda degree, per_row: _losses.global_output_loss(
                endpoint, kind, padding_weight, cross_replica
            ),
        )
        if output_loss is not None:  # None: weighted 0
            total += endpoint.loss_weight * output_loss
    regularization = model.get_losses_for(None) + model.get_losses_for(model.inputs)
    for layer in _tfprivate.keras.all_layers(model):  # over the real rows, not the padded batch
        for index, loss, output in _tfprivate.keras_compile.activity_losses(layer):
            if not any(loss is t for t in regularization):
                continue  # a call outside this model's graph (a nested model's own)
            regularization = [t for t in regularization if t is not loss]
            degree = (added or {}).get((layer.name, index), _loss_kinds.MEAN)
            term = _losses.activity_term(
                layer.activity_regularizer, output, degree, padding_weight, cross_replica
            )
            total += tf.cast(term, loss.dtype)
    if regularization:
        total += tf.add_n(regularization)
    return total


def _per_example_eval_loss(endpoint, padding_weight, cross_replica):
    """:func:`eval_loss`'s term of an output whose loss gives one value per example, over the real
    rows of the global batch, unweighted by its loss weight."""
    losses_utils = _tfprivate.keras_compile.losses_utils()
    y_pred = endpoint.output
    y_true = row_labels(endpoint.training_target.target, y_pred)
    per_sample = endpoint.loss_fn.call(y_true, y_pred)
    rows = (
        tf.ones(tf.shape(per_sample)[:1], per_sample.dtype)
        if padding_weight is None
        else tf.cast(padding_weight, per_sample.dtype)
    )
    weight = rows
    if endpoint.sample_weight is not None:
        weight = weight * tf.cast(endpoint.sample_weight, per_sample.dtype)
    weighted = losses_utils.compute_weighted_loss(
        per_sample, sample_weight=weight, reduction=losses_utils.ReductionV2.NONE
    )
    per_row = tf.cast(tf.size(per_sample) // tf.shape(per_sample)[0], per_sample.dtype)
    count = tf.reduce_sum(rows) * per_row
    mask = getattr(y_pred, "_keras_mask", None)
    if mask is not None:  # as Keras: the mean is over the elements the mask keeps
        mask, _, rows = losses_utils.squeeze_or_expand_dimensions(
            tf.cast(mask, per_sample.dtype), None, rows
        )
        weighted = weighted * mask
        count = tf.reduce_sum(rows * mask)
    sums = tf.stack([tf.reduce_sum(weighted), count])
    if cross_replica:
        sums = tf.compat.v1.tpu.cross_replica_sum(sums)
    reduction = getattr(endpoint.loss_fn, "reduction", losses_utils.ReductionV2.AUTO)
    if reduction == losses_utils.ReductionV2.SUM:
        output_loss = sums[0]
    else:  # AUTO / SUM_OVER_BATCH_SIZE: divide by the real rows' element count
        output_loss = tf.math.divide_no_nan(sums[0], sums[1])
    return output_loss


def real_rows(tensors, padding_weight):
    """``tensors`` (a dict of [batch, ...] tensors) without their padding rows: what every metric
    reads, so each sees exactly the rows of stock's batch -- including metrics that reduce a batch
    to one value (a custom function, or [batch] labels for a [batch, 1] output)."""
    if padding_weight is None:
        return tensors
    real = tf.greater(padding_weight, 0)
    return {k: tf.boolean_mask(v, real) for k, v in tensors.items()}


# --- drop ------------------------------------------------------------------------------------


def with_padding_weight(predictions, padding_weight):
    """A PREDICT model_fn's predictions, carrying the padding weight out to the estimator."""
    if padding_weight is None:
        return predictions
    return dict(predictions, **{PADDING_KEY: padding_weight})


def predict_keys_with_padding(predict_keys):
    """The user's ``predict_keys`` plus the padding weight, which :func:`drop_padding` reads."""
    return None if predict_keys is None else list(predict_keys) + [PADDING_KEY]


def drop_padding(outputs, yield_single_examples):
    """TPUEstimator.predict's outputs without padding rows and without the padding weight."""
    for out in outputs:
        weight = out.pop(PADDING_KEY, None)
        if weight is None:
            yield out
        elif yield_single_examples:
            if weight > 0:
                yield out
        else:
            keep = weight > 0
            yield {k: v[keep] for k, v in out.items()}
