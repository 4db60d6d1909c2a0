"""The model's compiled metrics in a strategy engine evaluation: an undistributed copy of the
user's model, compiled as the user compiled it, updated on the host with each gathered batch's
real rows and what stock's graph gives Keras's metrics (masks, logits, [batch] labels as stock
reads them)."""

import tensorflow as tf

from tpushim import _compiled_metrics, _tfprivate
from tpushim._strategy.clone import clone


def _metrics_model(plan, features=None):
    """An undistributed copy of the user's model compiled as the user compiled it: its compiled
    metrics (Keras's names and kinds) are updated on the host with each gathered batch. A copy
    stock does not make: the seeds its weights draw are put back (stock's evaluation draws one
    clone's, the engine's :class:`_Run`'s), so the model a program builds next starts from
    stock's initial weights."""
    with _tfprivate.keras.keras_random_state_kept():
        model = clone(plan, features)
    with tf.keras.utils.custom_object_scope(plan.custom_objects):
        args = _tfprivate.keras.compile_args(plan.keras_model)
        model.compile(
            loss=args.get("loss"),
            metrics=_tfprivate.keras_compile.clone_metrics(args.get("metrics")),
            weighted_metrics=_tfprivate.keras_compile.clone_metrics(args.get("weighted_metrics")),
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
                output = _tfprivate.keras_compile.with_output_logits(output, how, lg)
            if masked:  # Keras's metrics read an output's mask from the output
                output = tf.identity(output) if how is None else output
                output._keras_mask = mask
            carried.append(output)
        _compiled_metrics.update(metrics_model, labels, carried, weights, has_weight)

    return update
