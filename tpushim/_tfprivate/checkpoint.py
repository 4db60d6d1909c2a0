"""Stock's checkpoints: the variables a ``tf.train.Checkpoint`` saves, and the names stock's
training graph gives them (the strategy engine writes its checkpoints in those names).
"""

import tensorflow as tf

from tpushim._tfprivate import estimator, keras, modules


def object_checkpoint_keys(keras_model):
    """{object-based checkpoint key: shape} of the model's own variables, computed in memory
    (the keys ``save_weights(save_format='tf')`` writes; optimizer state left out)."""
    from tensorflow.python.checkpoint import graph_view, util

    objects, _, _, _, names = util.objects_ids_and_slot_variables_and_paths(
        graph_view.ObjectGraphView(keras_model)
    )
    return {
        names[o] + "/.ATTRIBUTES/VARIABLE_VALUE": o.shape.as_list()
        for o in objects
        if isinstance(o, tf.Variable) and names[o].split("/")[0] != "optimizer"
    }


# --- the strategy engine's checkpoints in stock's names (tpushim/_strategy_checkpoint.py) --------


def checkpoint_variables(root):
    """{object path: variable} of every variable a ``tf.train.Checkpoint(root)`` saves, optimizer
    slots included, each at the path that makes its key (``layer_with_weights-0/kernel``, then
    ``/.ATTRIBUTES/VARIABLE_VALUE``): TensorFlow's own traversal for a checkpoint."""
    from tensorflow.python.checkpoint import graph_view
    from tensorflow.python.checkpoint import util as checkpoint_util

    objects = checkpoint_util.objects_ids_and_slot_variables_and_paths(
        graph_view.ObjectGraphView(root)
    )[4]
    return {path: obj for obj, path in objects.items() if isinstance(obj, tf.Variable)}


def stock_checkpoint_names(keras_model, custom_objects, features=None):
    """Stock's training graph, built as keras_lib's ``_save_first_checkpoint`` builds it (the
    clone with the global step as its optimizer's iterations, then the variables of Keras's train
    function): ({object path: the variable's name there}, names of variables stock's Saver saves that have
    no object path). ``features``: the input's feature specs, on which stock's model_fn builds a
    subclassed model (a graph network is built on its own inputs)."""
    return stock_training_graph(keras_model, custom_objects, features)[:2]


#: The collection of :func:`stock_training_graph`'s graph holding the model's loss tensor as
#: stock's model_fn names it (``loss/mul:0``): what a user's hook fetches the loss by.
STOCK_LOSS = "tpushim_stock_loss"


def stock_training_graph(keras_model, custom_objects, features=None, object_based=True):
    """:func:`stock_checkpoint_names`'s two values, then that graph (its model, optimizer and
    global step) and its MetaGraphDef carrying the Saver stock's Keras estimator restores with
    (keras_lib's: an object-based one over the model's saveables, or the Scaffold's default
    name-based one): what ``graph.pbtxt``, the events' graph and ``model.ckpt-N.meta`` hold;
    then the tags of the model's own v1 scalar summaries there, in the order it made them, and
    its compiled metrics' names (:func:`graph_facts`). Built with its optimizer's variables, not its gradients, where the
    optimizer allows (:func:`make_train_variables`)."""

    with tf.Graph().as_default():
        step = tf.compat.v1.train.create_global_step()
        if features is not None:
            features = tf.nest.map_structure(
                lambda s: tf.compat.v1.placeholder(s.dtype, [None, *s.shape[1:]]), features
            )
        if modules.keras_lib is not None:
            model = keras.clone_and_build_model(
                estimator.ModeKeys.TRAIN, keras_model, custom_objects, features
            )
        else:
            model = estimator._api_keras._clone(
                estimator.ModeKeys.TRAIN, keras_model, custom_objects, features
            )
        make_train_variables(model)
        facts = graph_facts(model, step, object_based)
        loss = getattr(model, "total_loss", None)  # after the MetaGraphDef: not in its files
        if loss is not None:
            tf.compat.v1.add_to_collection(STOCK_LOSS, loss)
    keras.restore_v2_classes(keras_model)  # the clone in a graph swapped the eager classes' bases
    return facts


def graph_facts(model, step, object_based):
    """In the graph of a clone ``model`` in stock's training graph (``step``: its global step):
    :func:`graph_checkpoint_names`'s two values, the graph, its MetaGraphDef carrying the Saver
    stock's Keras estimator restores with (keras_lib's: an object-based one over the model's
    saveables, or the Scaffold's default name-based one), the tags of the model's own v1
    scalar summaries there, in the order it made them, the names stock's model_fn gives
    the clone's compiled metrics (``metric_names_map``'s keys), in Keras's order, and every
    summary op of the model's (:data:`SUMMARY_OPS`) in the order it made them."""
    from tensorflow.python.checkpoint import graph_view

    graph = step.graph
    with graph.as_default():
        names, unmatched = graph_checkpoint_names(model, step)
        if object_based:
            saveables = graph_view.ObjectGraphView(model).frozen_saveable_objects()
            saver = tf.compat.v1.train.Saver(var_list=saveables, sharded=True)
        else:
            saver = tf.compat.v1.train.Saver(sharded=True, save_relative_paths=True)
        meta = tf.compat.v1.train.export_meta_graph(graph=graph, saver_def=saver.as_saver_def())
        scalars = [  # the tags of the model's own scalar summaries, in the order it made them
            tf.get_static_value(t.op.inputs[0]).item().decode()
            for t in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
            if t.op.type == "ScalarSummary" and tf.get_static_value(t.op.inputs[0]) is not None
        ]
        # every summary op of the model's, in the order it made them (merge_all's)
        summaries = [
            t.op
            for t in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
            if t.op.type in SUMMARY_OPS
        ]
    metrics = [m.name for m in getattr(model, "_compile_metric_functions", None) or ()]
    return names, unmatched, graph, meta, scalars, metrics, summaries


#: The v1 summary functions' ops, by the function (its ``skip_summary`` frame's name: ``text``
#: makes a ``tensor_summary``) that makes each. Every op's input 1 is the summarized tensor.
SUMMARY_OPS = {
    "ScalarSummary": "scalar",
    "HistogramSummary": "histogram",
    "ImageSummary": "image",
    "AudioSummaryV2": "audio",
    "TensorSummaryV2": "tensor_summary",
}


def make_train_variables(model):
    """Creates in a compiled clone's graph the variables Keras's train function creates (the
    optimizer's slots and hyperparameters), as it names them, without its gradients and updates
    where the optimizer allows: a Keras optimizer whose ``get_updates`` and ``apply_gradients``
    are the base class's creates them all in ``apply_gradients``, by ``_create_all_weights`` of
    the trainable weights under ``training/`` and its own name scope (optimizer_v2.py). Any other
    (a loss-scale wrapper, a ``tf.compat.v1.train`` optimizer) gets the whole train function."""

    base = modules.keras_module("optimizers.legacy.optimizer_v2").OptimizerV2
    optimizer = model.optimizer
    kind = type(optimizer)
    if not (
        isinstance(optimizer, base)
        and all(
            getattr(kind, name) is getattr(base, name)
            for name in ("get_updates", "get_gradients", "apply_gradients")
        )
    ):
        model._make_train_function()
        return
    # _make_train_function's scopes: "training", then apply_gradients' own.
    with tf.compat.v1.name_scope("training"), tf.name_scope(optimizer._name), tf.init_scope():
        optimizer._create_all_weights(model._collected_trainable_weights)


def graph_checkpoint_names(model, step):
    """({object path: name in the graph}, names of the graph's global variables with no object
    path) of a clone in stock's training graph, ``step`` (the graph's global step) tracked as
    keras_lib's object-based checkpoints track it."""

    estimator.track_estimator_step(model, step)
    names = {path: v.op.name for path, v in checkpoint_variables(model).items()}
    unmatched = {v.op.name for v in tf.compat.v1.global_variables()} - set(names.values())
    return names, sorted(unmatched)
