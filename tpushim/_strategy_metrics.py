"""``tf.estimator.add_metrics`` on the strategy engine's estimator: the added ``metric_fn``'s
metrics, with stock's names and values.

Stock calls ``metric_fn(labels=, predictions=, features=, config=)`` once in its evaluation graph
and runs every metric's update op once per batch, then the values once at the end. Here the same
happens on the host, in a ``tf.Graph`` of its own: ``metric_fn`` is called once on placeholders
shaped as the input's (batch dimension unknown, as stock's), and a ``tf.compat.v1.Session`` runs
the update ops with each step's rows -- gathered from the replicas in order, padding rows dropped,
so it sees exactly the rows of stock's batch -- and the values after the last step. It is stock's
own metric code (``tf.compat.v1.metrics``' streaming variables, or Keras ``Metric`` objects,
checked and converted as stock's ``EstimatorSpec`` does), so the numbers are stock's.

Why not the replicas: ``tf.compat.v1.metrics`` (the common form in legacy scripts) need a graph's
collections and cannot run in the replicas' ``tf.function``; a Keras metric object would need its
variables made under the strategy and synchronised on read. The engine's evaluation already brings
each step's predictions and labels to the host for the compiled metrics; the added metrics add one
session run per step there, and bring the features only when ``metric_fn`` asks for them.
"""

import numpy as np
import tensorflow as tf

from tpushim import _tfprivate

#: The arguments ``tf.estimator.add_metrics`` lets a ``metric_fn`` take (its own check has run).
ARGUMENTS = ("labels", "predictions", "features", "config")


def wanted(metric_fns):
    """The parts of each batch (``features``, ``labels``) the ``metric_fn``s read."""
    names = {name for fn in metric_fns for name in _tfprivate.fn_args(fn)}
    return tuple(part for part in ("features", "labels") if part in names)


def real_rows(structure, real):
    """``structure``'s tensors, only the rows where ``real`` (a [rows] bool array) holds."""
    return tf.nest.map_structure(lambda x: np.asarray(x)[real], structure)


class Added:
    """The ``metric_fn``s of one evaluation, in the order they were added (a later one's metric
    replaces an earlier one's of the same name, as stock's chained ``add_metrics`` do)."""

    def __init__(self, metric_fns, config):
        self._fns, self._config = tuple(metric_fns), config
        self._session = None

    def update(self, batch):
        """Runs every metric's update op on ``batch``: ``{"predictions", "labels", "features"}``
        of one step's real rows (numpy arrays, in the structures the model_fn gets)."""
        batch = tf.nest.map_structure(np.asarray, batch)
        if self._session is None:
            self._build(batch)
        leaves = tf.nest.flatten(batch)
        self._session.run(self._updates, dict(zip(self._placeholders, leaves)))

    def results(self):
        """{name: value} of every added metric (none when no step ran)."""
        if self._session is None:
            return {}
        try:
            return self._session.run(self._values)
        finally:
            self._session.close()

    def _build(self, batch):
        graph = tf.Graph()
        with graph.as_default():
            self._placeholders = [
                tf.compat.v1.placeholder(
                    tf.as_dtype(leaf.dtype) if leaf.dtype != object else tf.string,
                    [None, *leaf.shape[1:]],
                )
                for leaf in tf.nest.flatten(batch)
            ]
            inputs = tf.nest.pack_sequence_as(batch, self._placeholders)
            inputs["config"] = self._config
            metrics = {}
            for metric_fn in self._fns:
                args = _tfprivate.fn_args(metric_fn)
                added = metric_fn(**{k: v for k, v in inputs.items() if k in args})
                # Stock's checks and texts; Keras Metric objects become (result, update_op).
                metrics.update(_tfprivate.validate_eval_metric_ops(dict(added)))
            if "loss" in metrics:  # stock's Estimator refuses it at evaluate(), in these words
                raise ValueError(
                    'Metric with name "loss" is not allowed, because Estimator already defines '
                    "a default metric with the same name."
                )
            self._values = {name: value for name, (value, _) in metrics.items()}
            self._updates = [_tfprivate.update_op(update) for _, update in metrics.values()]
            initialize = [
                tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.local_variables_initializer(),
                tf.compat.v1.tables_initializer(),
            ]
        graph.finalize()
        self._session = tf.compat.v1.Session(graph=graph)
        self._session.run(initialize)
