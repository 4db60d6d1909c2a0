"""The model's compiled metrics in a strategy engine evaluation: an undistributed copy of the
user's model, compiled as the user compiled it, updated on the host with each gathered batch's
real rows and what stock's graph gives Keras's metrics (masks, logits, [batch] labels as stock
reads them)."""

import tensorflow as tf

from tpushim import _padding, _tfprivate
from tpushim._strategy.clone import clone


def _metrics_model(plan, features=None):
    """An undistributed copy of the user's model compiled as the user compiled it: its compiled
    metrics (Keras's names and kinds) are updated on the host with each gathered batch. A copy
    stock does not make: the seeds its weights draw are put back (stock's evaluation draws one
    clone's, the engine's :class:`_Run`'s), so the model a program builds next starts from
    stock's initial weights."""
    with _tfprivate.keras_random_state_kept():
        model = clone(plan, features)
    with tf.keras.utils.custom_object_scope(plan.custom_objects):
        args = _tfprivate.compile_args(plan.keras_model)
        model.compile(
            loss=args.get("loss"),
            metrics=_tfprivate.clone_metrics(args.get("metrics")),
            weighted_metrics=_tfprivate.clone_metrics(args.get("weighted_metrics")),
            loss_weights=args.get("loss_weights"),
        )
    return model


def _metrics_update(metrics_model, logits_how, has_mask, has_weight=None):
    """A ``tf.function`` updating ``metrics_model``'s compiled metrics with one gathered batch's
    real rows (those whose padding weight ``pad`` is not 0; an output without a mask or logits
    has an empty one), the outputs carrying what stock's graph outputs carry to Keras's
    metrics: their Keras mask and their logits (a softmax or sigmoid output's crossentropy metrics are computed
    from its logits in stock's graph; an eager tensor would lose them). In a graph, as stock's
    metrics run, so an op's type can be read too."""

    @tf.function(reduce_retracing=True)
    def update(labels, outputs, logits, weights, masks, pad):
        real = pad > 0  # the rows kept, in the function: eagerly, a dozen ops' dispatch a batch
        labels, outputs, weights = (
            [tf.boolean_mask(x, real) for x in xs] for xs in (labels, outputs, weights)
        )
        logits = [
            lg if how is None else tf.boolean_mask(lg, real) for lg, how in zip(logits, logits_how)
        ]
        masks = [tf.boolean_mask(m, real) if masked else m for m, masked in zip(masks, has_mask)]
        carried = []
        for output, how, lg, mask, masked in zip(outputs, logits_how, logits, masks, has_mask):
            if how is not None:
                output = _tfprivate.with_output_logits(output, how, lg)
            if masked:  # Keras's metrics read an output's mask from the output
                output = tf.identity(output) if how is None else output
                output._keras_mask = mask
            carried.append(output)
        _tfprivate.build_compiled_metrics(
            metrics_model, _one_or_list(labels), _one_or_list(carried)
        )
        weighed = has_weight or [True] * len(labels)
        as_is = [_given_as_is(y, o) for y, o in zip(labels, carried)]
        if any(as_is):  # their metrics updated here, the other outputs' below
            _tfprivate.update_compiled_metrics_as_given(
                metrics_model,
                [y if a else None for y, a in zip(labels, as_is)],
                carried,
                [w if a and given else None for w, a, given in zip(weights, as_is, weighed)],
            )
            if all(as_is):
                return
            labels = [None if a else y for y, a in zip(labels, as_is)]
        as_stock = [y if y is None else _as_in_stocks_graph(y, o) for y, o in zip(labels, carried)]
        per_output = list(weights)
        update = metrics_model.compiled_metrics.update_state
        outputs, weights = _one_or_list(carried), _one_or_list(weights)
        if all(a is y for a, y in zip(as_stock, labels)):
            update(_one_or_list(labels), outputs, weights)
            return
        # [batch] labels of a [batch, 1] output: weighted_metrics weigh each row, as Keras's
        # model.evaluate reads them ([batch, 1]; stock's estimator leaves them unweighted),
        # the others as stock's graph (one value per batch where they reduce the last axis).
        with _tfprivate.compiled_metrics_only(metrics_model, weighted=False):
            update(_one_or_list(as_stock), outputs, weights)
        # (an output without sample weights: as stock's graph, unweighted)
        rows = [
            a if y is None or not w else _padding.row_labels(y, o)
            for y, o, a, w in zip(labels, carried, as_stock, weighed)
        ]
        if not all(weighed):
            weights = _one_or_list([w if given else None for w, given in zip(per_output, weighed)])
        with _tfprivate.compiled_metrics_only(metrics_model, weighted=True):
            update(_one_or_list(rows), outputs, weights)

    return update


def _as_in_stocks_graph(label, output):
    """A [batch] label of a [batch, 1] output without a static rank, so Keras's metrics container
    does not expand it to [batch, 1] as it does in ``model.evaluate``: stock's graph hands it to
    each metric as it is, and a metric reducing the last axis (``mae``) then gives one value per
    batch, which stock averages over the batches."""
    if _padding.row_labels(label, output) is label:
        return label
    return tf.compat.v1.placeholder_with_default(label, shape=None)


def _given_as_is(label, output):
    """Whether ``label`` is [batch] for a [batch, k > 1] output: Keras's metrics container would
    expand it to [batch, 1], where stock's graph hands it to each metric as it is (a user's loss
    on k units: stock's ``accuracy`` is categorical, the argmax of the batch's labels)."""
    return (
        tf.is_tensor(label)
        and label.shape.rank == 1
        and output.shape.rank == 2
        and tf.compat.dimension_value(output.shape[-1]) != 1
    )


def _one_or_list(values):
    """One output's value, or a list in the model's output order: Keras's metrics container zips
    it with its output names (a dict it would order by name: a model whose outputs are not named
    in alphabetical order had its metrics' names swapped, zeta_accuracy holding alpha's)."""
    return values[0] if len(values) == 1 else list(values)
