"""``tf.estimator.add_metrics`` on the strategy and JAX engines' estimators: the added
``metric_fn``'s metrics, with stock's names and values.

Stock calls ``metric_fn(labels=, predictions=, features=, config=)`` once in its evaluation graph
and runs every metric's update op once per batch, then the values once at the end. Here the same
happens on the host, in a ``tf.Graph`` of its own: ``metric_fn`` is called once on placeholders
shaped as the input's (batch dimension unknown, as stock's), and a ``tf.compat.v1.Session`` runs
the update ops with each step's rows -- gathered from the replicas (the strategy engine's) or the
host's batch (the JAX engine's) in order, padding rows dropped, so it sees exactly the rows of
stock's batch -- and the values after the last step. It is stock's
own metric code (``tf.compat.v1.metrics``' streaming variables, or Keras ``Metric`` objects,
checked and converted as stock's ``EstimatorSpec`` does), so the numbers are stock's.

Why not the replicas: ``tf.compat.v1.metrics`` (the common form in legacy scripts) need a graph's
collections and cannot run in the replicas' ``tf.function``; a Keras metric object would need its
variables made under the strategy and synchronised on read. The engine's evaluation already brings
each step's predictions and labels to the host for the compiled metrics; the added metrics add one
session run per step there, and bring the features only when ``metric_fn`` asks for them.
"""

import logging

import numpy as np
import tensorflow as tf

from tpushim import _tfprivate


def added(metric_fns, config, predictions, given):
    """The :class:`Added` of ``metric_fns`` (None where there are none).

    Args:
      predictions: {output name: its ``tf.TensorSpec``} (stock's Keras predictions).
      given: {"features", "labels"}: a replica's element spec of each, as the input gave them.
    """
    if not metric_fns:
        return None
    takes = {name for fn in metric_fns for name in _tfprivate.estimator.fn_args(fn)}
    specs = {part: given[part] for part in ("features", "labels") if part in takes}
    return Added(metric_fns, config, dict(specs, predictions=predictions))


def real_rows(structure, real):
    """``structure``'s arrays, only the rows where ``real`` (a [rows] bool array) holds."""
    return tf.nest.map_structure(lambda x: np.asarray(x)[real], structure)


def _placeholder(spec):
    """A placeholder of ``spec``'s batch (its first dimension unknown); a ``SparseTensorSpec``'s
    a sparse placeholder, fed a ``SparseTensorValue``."""
    shape = None if spec.shape.rank is None else [None, *spec.shape[1:]]
    if isinstance(spec, tf.SparseTensorSpec):
        return tf.compat.v1.sparse_placeholder(spec.dtype, shape)
    return tf.compat.v1.placeholder(spec.dtype, shape)


def _consumed(placeholder):
    """Whether a metric reads ``placeholder`` (a sparse one: any of its parts)."""
    if isinstance(placeholder, tf.SparseTensor):
        parts = (placeholder.indices, placeholder.values, placeholder.dense_shape)
        return any(t.consumers() for t in parts)
    return bool(placeholder.consumers())


class Added:
    """The ``metric_fn``s of one evaluation, in the order they were added (a later one's metric
    replaces an earlier one's of the same name, as stock's chained ``add_metrics`` do), built at
    once in a graph of their own.

    Attributes:
      used: per part (``predictions``, ``features``, ``labels``), the positions (in
        ``tf.nest.flatten`` order) of the tensors the metrics read: only those come to the host.
    """

    def __init__(self, metric_fns, config, specs):
        """``specs``: per part, the ``tf.TensorSpec``s of a replica's batch (as the model_fn gets
        them: predictions by output name); a part no ``metric_fn`` takes is not passed."""
        graph = tf.Graph()
        with graph.as_default():
            placeholders = {
                part: [_placeholder(spec) for spec in tf.nest.flatten(structure)]
                for part, structure in specs.items()
            }
            inputs = {
                part: tf.nest.pack_sequence_as(specs[part], placeholders[part]) for part in specs
            }
            inputs["config"] = config
            metrics = {}
            for metric_fn in metric_fns:
                args = _tfprivate.estimator.fn_args(metric_fn)
                added = metric_fn(**{k: v for k, v in inputs.items() if k in args})
                # Stock's checks and texts; Keras Metric objects become (result, update_op).
                metrics.update(_tfprivate.estimator.validate_eval_metric_ops(dict(added)))
            if "loss" in metrics:  # stock's Estimator refuses it at evaluate(), in these words
                raise ValueError(
                    'Metric with name "loss" is not allowed, because Estimator already defines '
                    "a default metric with the same name."
                )
            self._values = {name: value for name, (value, _) in metrics.items()}
            self._updates = [
                _tfprivate.keras_compile.update_op(update) for _, update in metrics.values()
            ]
            initialize = [
                tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.local_variables_initializer(),
                tf.compat.v1.tables_initializer(),
            ]
        graph.finalize()
        self.used = {
            part: [i for i, p in enumerate(flat) if _consumed(p)]
            for part, flat in placeholders.items()
        }
        self._placeholders = {
            part: [placeholders[part][i] for i in used] for part, used in self.used.items()
        }
        self._session = tf.compat.v1.Session(graph=graph)
        self._session.run(initialize)

    def update(self, batch):
        """Runs every metric's update op on ``batch``: per part, one step's real rows of the
        tensors :attr:`used` names (arrays, in that order)."""
        feed = {
            placeholder: value if isinstance(placeholder, tf.SparseTensor) else np.asarray(value)
            for part, values in batch.items()
            for placeholder, value in zip(self._placeholders[part], values)
        }
        self._session.run(self._updates, feed)

    def results(self):
        """{name: value} of every added metric (as stock's, after the last step's update)."""
        try:
            return self._session.run(self._values)
        finally:
            self._session.close()


def derived(made, estimator, model_fn, metric_fn, engine):
    """``made`` (the strategy or JAX ``engine``'s estimator that ``tf.estimator.add_metrics``
    returns around ``estimator``) with ``metric_fn`` added to the estimator's, told to observers
    and said in one line; returned."""
    from tpushim import _observe

    made._tpushim_metric_fns = (*estimator._tpushim_metric_fns, metric_fn)
    _observe.derived(made, estimator, model_fn)
    logging.getLogger("tpushim").info(
        "tf.estimator.add_metrics -> %s's estimator with the metrics of %s",
        engine,
        getattr(metric_fn, "__name__", metric_fn),
    )
    return made
