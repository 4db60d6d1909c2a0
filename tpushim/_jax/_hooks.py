"""The JAX engine's part in what stock's hooks do (:mod:`tpushim._stock_hooks`, shared with the
strategy engine): the user's ``SessionRunHook``\\ s, the TensorBoard events and the step-rate lines
of its training, its evaluation's events, and what ``train_and_evaluate`` asks of it.

The user's hooks see a TF1 session holding the global step and the step's loss under stock's
name for it (``loss/mul:0``, read from the conversion's stock training graph): stock's stop,
early-stopping, counter and logging hooks on the loss or the global step run unchanged, and a
hook fetching another tensor of the model's graph (a weight, an activation) is refused naming
it, before anything is written (the JAX step gives no tensor of a TensorFlow graph).
"""

import tensorflow as tf

from tpushim import _stock_hooks, _tfprivate
from tpushim._jax import _pod

ModeKeys = _tfprivate.estimator.ModeKeys


def loss_name(conversion):
    """Stock's name of the model's loss tensor (its model_fn's ``total_loss``), or None."""
    found = conversion.checkpoints.graph.get_collection(_tfprivate.checkpoint.STOCK_LOSS)
    return found[0].name if found else None


def user_hooks(hooks, step, conversion, mode):
    """The user's ``hooks`` of one call (train, evaluate or predict) starting at global ``step``:
    a :class:`tpushim._stock_hooks.SessionHooks` (begun, its first fetches checked), or None."""
    if not hooks:
        return None
    loss = None if mode == ModeKeys.PREDICT else loss_name(conversion)
    return _stock_hooks.SessionHooks(
        hooks, step, engine="jax", loss=loss, training=mode == ModeKeys.TRAIN
    )


def train_events(conversion, config, model_dir):
    """Stock's training hooks' events and lines for one ``train()`` call
    (:class:`tpushim._stock_hooks.StepEvents`): the events record stock's training graph of the
    model (the graph the engine's checkpoints are saved from), and ``graph.pbtxt`` holds it
    where RunConfig's ``checkpoint_save_graph_def`` says (True by default), as stock's."""
    graph_text = None
    if getattr(config, "checkpoint_save_graph_def", True):
        graph_text = graph_pbtxt(conversion)
    checkpoints = conversion.checkpoints
    return _stock_hooks.StepEvents(
        config,
        model_dir,
        checkpoints.graph,
        checkpoints.meta,
        graph_text,
        writes=_pod.is_chief(),  # on a pod, process 0 writes (stock's chief)
    )


def graph_pbtxt(conversion):
    """``graph.pbtxt``'s text, made once per conversion."""
    checkpoints = conversion.checkpoints
    text = getattr(checkpoints, "_graph_pbtxt", None)
    if text is None:
        from google.protobuf import text_format

        text = text_format.MessageToString(checkpoints.meta.graph_def)  # as tf.io.write_graph
        checkpoints._graph_pbtxt = text
    return text


def write_evaluation(conversion, eval_dir, results, checkpoint_path):
    """Stock's evaluation events in ``eval_dir`` (the metrics at the global step, the evaluated
    checkpoint's path) and its lines."""
    if not _pod.is_chief():  # on a pod, process 0 writes (stock's chief)
        return
    _stock_hooks.write_evaluation(
        eval_dir, results, checkpoint_path or "", conversion.checkpoints.graph
    )


def check_listeners(listeners):
    """The saving listeners as stock checks them, before anything is written."""
    for listener in listeners:
        if not isinstance(listener, tf.compat.v1.train.CheckpointSaverListener):
            raise TypeError(
                f"saving_listeners must be a list of CheckpointSaverListener, given: {listener}"
            )
