"""The JAX engine's warm start: what a ``train()`` (an ``evaluate()``, a ``predict()``) with no
checkpoint to restore starts from, as stock's ``tf.compat.v1.train.warm_start`` leaves it.

Stock warm-starts in its training graph, once the model_fn built it: ``warm_start`` with the
estimator's ``WarmStartSettings`` replaces the chosen variables' initializers with reads of the
checkpoint (a regular expression over the trainable variables, or a list of them over every
global one -- the optimizer's slots and the global step too; a vocabulary remapped by
``var_name_to_vocab_info``; a variable read under another name by ``var_name_to_prev_var_name``),
and every other variable keeps its initializer. model_to_estimator's own warm start is one such
``WarmStartSettings``: the Keras weights it saved at conversion (``model_dir/keras``), the
trainable ones only. Here stock's own function runs in a copy of stock's training graph (the
conversion's, from its MetaGraphDef: :mod:`tpushim._jax._checkpoint`), and the values its
initializers give are read out by stock's names: stock's code decides what each variable starts
from. A trainable weight the settings leave out starts from its initializer, as stock's does, but
from another draw than stock's (stock draws it in the graph its input_fn was built in first):
said in one line.
"""

import logging

import tensorflow as tf

logger = logging.getLogger("tpushim")


def warm_started(checkpoints, settings):
    """``(step, weights, slots)`` (:meth:`tpushim._jax._checkpoint.StockCheckpoints.assigned`)
    of stock's training graph of ``checkpoints`` warm-started with ``settings`` (a
    ``tf.estimator.WarmStartSettings``; None: none, every variable from its initializer)."""
    with tf.Graph().as_default() as graph:
        tf.compat.v1.train.import_meta_graph(checkpoints.meta, clear_devices=True)
        variables = tf.compat.v1.global_variables()
        before = {v.op.name: v.initializer.name for v in variables}
        if settings is not None:
            tf.compat.v1.train.warm_start(*settings)
        fresh = sorted(
            v.op.name
            for v in tf.compat.v1.trainable_variables()
            if v.initializer.name == before[v.op.name]
        )
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            values = dict(zip([v.op.name for v in variables], session.run(variables)))
    if fresh:
        logger.warning(
            "No warm start for %s: drawn from %s initializer by the JAX engine, as stock draws "
            "it, but not stock's draw (stock draws in the graph its input_fn was built in).",
            ", ".join(fresh),
            "its" if len(fresh) == 1 else "each one's",
        )
    step, weights, slots, _ = checkpoints.assigned(lambda name, _: values.get(name))
    return step, weights, slots
