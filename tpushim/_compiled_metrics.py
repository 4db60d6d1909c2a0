"""A Keras model's compiled metrics updated as stock's evaluation graph updates them, for every
engine that updates them on the host (the strategy engine's, the JAX engine's): the metrics
picked as stock's graph picks them (:func:`tpushim._tfprivate.keras_compile.build_compiled_metrics`),
and labels of shape [batch] handed to each metric as stock's graph hands them
(:func:`as_in_stocks_graph` for a [batch, 1] output, :func:`given_as_is` for [batch, k > 1]). Call :func:`update` inside a ``tf.function``: an
eager tensor's static rank would let Keras's metrics container expand the label."""

import tensorflow as tf

from tpushim import _metric_names, _padding, _tfprivate


def as_in_stocks_graph(label, output):
    """A [batch] label of a [batch, 1] output without a static rank, so Keras's metrics container
    does not expand it to [batch, 1] as it does in ``model.evaluate``: stock's graph hands it to
    each metric as it is, and a metric reducing the last axis (``mae``) then gives one value per
    batch, which stock averages over the batches."""
    if _padding.row_labels(label, output) is label:
        return label
    return tf.compat.v1.placeholder_with_default(label, shape=None)


def given_as_is(label, output):
    """Whether ``label`` is [batch] for a [batch, k > 1] output: Keras's metrics container would
    expand it to [batch, 1], where stock's graph hands it to each metric as it is (a user's loss
    on k units: stock's ``accuracy`` is categorical, the argmax of the batch's labels)."""
    return (
        tf.is_tensor(label)
        and label.shape.rank == 1
        and output.shape.rank == 2
        and tf.compat.dimension_value(output.shape[-1]) != 1
    )


def one_or_list(values):
    """One output's value, or a list in the model's output order: Keras's metrics container zips
    it with its output names (a dict it would order by name: a model whose outputs are not named
    in alphabetical order had its metrics' names swapped, zeta_accuracy holding alpha's)."""
    return values[0] if len(values) == 1 else list(values)


def update(metrics_model, labels, outputs, weights, has_weight=None):
    """Updates ``metrics_model``'s compiled metrics with one batch's real rows as stock's graph
    does: ``labels``, ``outputs`` and ``weights`` lists in the model's output order (a weight
    None where there is none), ``has_weight`` which outputs the input gave a sample weight (all,
    when None). In a ``tf.function``."""
    _tfprivate.keras_compile.build_compiled_metrics(
        metrics_model, one_or_list(labels), one_or_list(outputs)
    )
    weighed = has_weight or [True] * len(labels)
    as_is = [given_as_is(y, o) for y, o in zip(labels, outputs)]
    if any(as_is):  # their metrics updated here, the other outputs' below
        _tfprivate.keras_compile.update_compiled_metrics_as_given(
            metrics_model,
            [y if a else None for y, a in zip(labels, as_is)],
            outputs,
            [w if a and given else None for w, a, given in zip(weights, as_is, weighed)],
        )
        if all(as_is):
            return
        labels = [None if a else y for y, a in zip(labels, as_is)]
    as_stock = [y if y is None else as_in_stocks_graph(y, o) for y, o in zip(labels, outputs)]
    update_state = metrics_model.compiled_metrics.update_state
    per_output = list(weights)
    carried, weights = one_or_list(outputs), one_or_list(weights)
    if all(a is y for a, y in zip(as_stock, labels)):
        update_state(one_or_list(labels), carried, weights)
        return
    # [batch] labels of a [batch, 1] output: weighted_metrics weigh each row, as Keras's
    # model.evaluate reads them ([batch, 1]; stock's estimator leaves them unweighted),
    # the others as stock's graph (one value per batch where they reduce the last axis).
    with _tfprivate.keras_compile.compiled_metrics_only(metrics_model, weighted=False):
        update_state(one_or_list(as_stock), carried, weights)
    # (an output without sample weights: as stock's graph, unweighted)
    rows = [
        a if y is None or not w else _padding.row_labels(y, o)
        for y, o, a, w in zip(labels, outputs, as_stock, weighed)
    ]
    if not all(weighed):
        weights = one_or_list([w if given else None for w, given in zip(per_output, weighed)])
    with _tfprivate.keras_compile.compiled_metrics_only(metrics_model, weighted=True):
        update_state(one_or_list(rows), carried, weights)


def stock_names(metrics_model):
    """The names stock's model_fn gives ``metrics_model``'s built compiled metrics, in the order
    of ``compiled_metrics.metrics`` (a weighted metric sharing an unweighted one's name:
    ``accuracy_1``, where Keras's container says ``weighted_accuracy``)."""
    return _metric_names.stock_unique_names(
        _tfprivate.keras_compile.compiled_metric_names_per_output(metrics_model)
    )
