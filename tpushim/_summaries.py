"""TensorBoard on a TPU: the training summaries stock writes, with its tags, at its steps.

Stock's estimator writes the loss (a ``tf.compat.v1.summary.scalar`` named ``loss``, whose tag is
that name made unique in its graph: ``loss_1`` next to Keras's ``loss`` name scope) and the
scalar summaries a model makes itself, every ``save_summary_steps`` steps (the first step of each
``train()`` call, then each ``save_summary_steps`` after the last write: SummarySaverHook's
schedule). On a TPU, TPUEstimator runs ``iterations_per_loop`` steps per ``session.run``: its
own ``loss`` summary is written once per loop, with the last step's loss, and summaries inside the
TPU computation cannot run at all.

tpushim's TPU training step passes a ``host_call`` instead: each step outfeeds the global step,
the global batch's loss (the reported one, :mod:`tpushim._losses`) and the values of the model's
scalar summaries; the host writes them on stock's schedule, under stock's tags (v2 summary ops
into ``model_dir``, as TPUEstimator's host calls must). :class:`DropLoopLossSummary` keeps
TPUEstimator's per-loop ``loss`` summary out of the event files, so each step has one value.
"""

import tensorflow as tf

LOSS_NAME = "loss"  # the summary name Estimator gives the loss (model_fn_lib.LOSS_METRIC_KEY)


def loss_tag(graph):
    """The tag stock's loss summary gets in a graph holding what the model_fn built: ``loss``
    made unique at the top level (Keras's loss is built under a ``loss`` name scope)."""
    with graph.name_scope(None):
        return graph.unique_name(LOSS_NAME, mark_as_used=False)


def carried(op):
    """Whether the TPU host call carries this summary op: a v1 scalar summary with a constant tag."""
    return (
        op.type == "ScalarSummary"
        and tf.get_static_value(op.inputs[0]) is not None
        and op.inputs[1].shape.num_elements() == 1
    )


def take_scalar_summaries(graph, before):
    """The model's own scalar summaries made since ``before`` (the SUMMARIES collection's length
    then), as ``[(tag, value)]``, taken out of the collection: inside a TPU computation they
    cannot run, and the host call writes them instead."""
    summaries = graph.get_collection_ref(tf.compat.v1.GraphKeys.SUMMARIES)
    taken = []
    for tensor in list(summaries[before:]):
        if not carried(tensor.op):
            continue  # left where it is: the preflight reports summaries inside the model
        summaries.remove(tensor)
        tag, value = tf.get_static_value(tensor.op.inputs[0]), tensor.op.inputs[1]
        tag = tag.item() if hasattr(tag, "item") else tag
        taken.append((tag.decode() if isinstance(tag, bytes) else str(tag), value))
    return taken


def host_call(step, loss, tag, carried, model_dir, every_steps, rows=None):
    """A TPUEstimatorSpec ``host_call`` writing the loss and the carried scalars as stock does.

    Args:
      step: the global step after this training step (int64 scalar).
      loss: the global batch's loss, the same on every shard.
      tag: the loss's tag (:func:`loss_tag`).
      carried: ``[(tag, value)]`` of the model's scalar summaries (:func:`take_scalar_summaries`).
      model_dir: where the event files go.
      every_steps: the RunConfig's ``save_summary_steps``.
      rows: the shard's real rows (its padding weights' sum) where the input is padded: a
        carried scalar is then each shard's value weighted by its real rows, so a shard holding
        only padding rows counts for nothing (None: every shard's rows are real).
    Returns:
      ``(host_fn, tensors)``: each tensor with a leading dimension of 1, which TPUEstimator
      concatenates over the shards.
    """
    tensors = {"step": tf.reshape(tf.cast(step, tf.int64), [1]), "loss": tf.reshape(loss, [1])}
    tags = {}
    for i, (summary_tag, value) in enumerate(carried):
        tensors[f"carried_{i}"] = tf.reshape(tf.cast(value, tf.float32), [1])
        tags[f"carried_{i}"] = summary_tag
    if rows is not None and carried:
        tensors["rows"] = tf.reshape(tf.cast(rows, tf.float32), [1])

    def mean(value, rows=None):
        if rows is None:
            return tf.reduce_mean(value)
        # Each shard's value weighted by its real rows: a shard of padding only weighs nothing,
        # whatever it computed (a mean over no rows is NaN).
        weighted = tf.where(rows > 0, value * rows, tf.zeros_like(value))
        return tf.reduce_sum(weighted) / tf.reduce_sum(rows)

    def host_fn(step, loss, rows=None, **values):
        step = step[0]
        # SummarySaverHook's schedule: the first step of the session, then every `every_steps`
        # steps after the step last written.
        last = tf.compat.v1.Variable(
            -1,
            dtype=tf.int64,
            trainable=False,
            collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
            name="tpushim_last_summary_step",
        )
        due = tf.logical_or(last < 0, step >= last + every_steps)
        writer = tf.compat.v2.summary.create_file_writer(model_dir)
        with (
            tf.compat.v1.get_default_graph().name_scope(None),  # tags exactly as given
            writer.as_default(),
            tf.compat.v2.summary.record_if(due),
        ):
            # Every shard reports the global loss; a model's scalar is averaged over the shards,
            # each weighted by its real rows (the global batch's value for a mean over examples,
            # as the strategy engine's replicas are: _strategy.step.scalar_weight).
            written = [tf.compat.v2.summary.scalar(tag, loss[0], step=step)]
            written += [
                tf.compat.v2.summary.scalar(tags[k], mean(v, rows), step=step)
                for k, v in sorted(values.items())
            ]
        with tf.control_dependencies(written):
            return tf.compat.v1.assign(last, tf.where(due, step, last))

    return host_fn, tensors


class DropLoopLossSummary(tf.compat.v1.train.SessionRunHook):
    """Takes TPUEstimator's once-per-loop ``loss`` summary out of what the SummarySaverHook
    writes (the host call writes the loss at every step stock does); other summaries stay.

    Hooks' ``begin()`` runs after Estimator added its summaries and before the session's
    scaffold merges them.
    """

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        losses = {t.ref() for t in graph.get_collection(tf.compat.v1.GraphKeys.LOSSES)}
        summaries = graph.get_collection_ref(tf.compat.v1.GraphKeys.SUMMARIES)
        for tensor in list(summaries):
            if tensor.op.type == "ScalarSummary" and tensor.op.inputs[1].ref() in losses:
                summaries.remove(tensor)
