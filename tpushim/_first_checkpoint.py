"""keras_lib's ``_save_first_checkpoint``, once for both estimators: the Keras weights written
as ``model_dir/keras/keras_model.ckpt`` (the estimator's warm start), step by step as stock, with
every variable of its graph initialised before the save. Stock's estimator on TensorFlow <= 2.15
(:func:`tpushim._tfprivate.estimator.save_first_checkpoint`) and tpushim's estimator API on >= 2.16
(:mod:`tpushim._estimator_api._keras`) each pass their own clone of the model.

Keras initialises the variables it knows of: the model's and those its optimizer lists. A
``tf.compat.v1.train`` optimizer that wraps another (a gradient-clipping wrapper delegating
``compute_gradients`` / ``apply_gradients``) lists none of the inner one's slots, and stock's
Saver then fails on them (``FailedPreconditionError: ... /Adagrad``). Their initial values are
what the training graph gives them anyway: the warm start restores only what it finds.

An object-based checkpoint holds only what the model's object graph reaches. A variable the
graph makes outside it (a ``tf.compat.v1.train`` optimizer's learning rate given as a callable
that calls ``tf.compat.v1.get_variable``) is left out, and stock's warm start then fails on it
(``the checkpoint did not contain values for all variables``), as does a later ``train()``
restoring a checkpoint without it. :func:`track_graph_variables` adds such variables to the
model's object graph, in the first checkpoint and in the training graph's Saver, so the
object-based checkpoints hold every variable of the graph, as the name-based ones do.
"""

import os

import tensorflow as tf

from tpushim._errors import ConversionError

#: Why a model whose optimizer reads an eagerly made value is refused, and what to do.
_EAGER_VALUE = (
    "The model's optimizer reads a tensor or variable made eagerly, outside the estimator's "
    "graphs ({error}): a tf.compat.v1.train optimizer's learning rate (or another of its "
    "arguments) given as a tf.Variable or a tensor, or as tf.compat.v1.train.exponential_decay "
    "(or another decay) called at the script's top level on an eagerly made global step. The "
    "estimator builds the model in graphs of its own, where that value cannot be read: stock "
    "TensorFlow 2.15 fails on it too, at its first checkpoint. Nothing was written. Give the "
    "rate as a Python number, as a callable that builds it in the estimator's graph (e.g. "
    "lambda: tf.compat.v1.train.exponential_decay(0.1, tf.compat.v1.train.get_global_step(), "
    "1000, 0.96)), or compile the model with a Keras optimizer and a "
    "tf.keras.optimizers.schedules.LearningRateSchedule."
)


def save(keras_model, config, save_object_ckpt, clone, weights, on_graph=None):
    """The first checkpoint's path (the one already in ``model_dir/keras``, else written).

    Args:
      keras_model: the user's model.
      config: the estimator's RunConfig (``model_dir``, ``tf_random_seed``, ``session_config``).
      save_object_ckpt: write an object-based checkpoint (else a name-based Saver's).
      clone: ``clone(keras_model)``: the TRAIN clone, built in the current graph as stock's.
      weights: the model's weights to set on the clone, or None (freshly initialised).
      on_graph: called with the clone and the global step in that graph (stock's training graph)
        after the save, where it was built: the strategy engine reads its checkpoint names there.
    """
    keras_dir = os.path.join(config.model_dir, "keras")
    latest = tf.train.latest_checkpoint(keras_dir)
    if latest:
        return latest
    path = os.path.join(keras_dir, "keras_model.ckpt")
    with tf.Graph().as_default():
        tf.compat.v1.random.set_random_seed(config.tf_random_seed)
        tf.compat.v1.train.create_global_step()
        try:
            model = clone(keras_model)
            model._make_train_function()  # before the session: it adds to the graph
        except RuntimeError as e:
            if "capture an EagerTensor" not in str(e):
                raise
            raise ConversionError(_EAGER_VALUE.format(error=e)) from e
        if not tf.io.gfile.isdir(keras_dir):  # once the graph is built: nothing written before
            tf.io.gfile.makedirs(keras_dir)
        with tf.compat.v1.Session(config=config.session_config) as session:
            if weights:
                model.set_weights(weights)
            internal = getattr(tf.compat.v2.keras, "__internal__", None)
            if internal is not None:  # stock's step (the graph's other variables: below)
                internal.backend.initialize_variables(session)
            variables = tf.compat.v1.global_variables()
            ready = session.run([tf.compat.v1.is_variable_initialized(v) for v in variables])
            left = [v for v, done in zip(variables, ready) if not done]
            if left:  # made by an optimizer Keras does not see into
                session.run(tf.compat.v1.variables_initializer(left))
            if save_object_ckpt:
                model._track_trackable(
                    tf.compat.v1.train.get_global_step(), "estimator_global_step"
                )
                track_graph_variables(model)
                model.save_weights(path)
            else:
                tf.compat.v1.train.Saver().save(session, path)
        if on_graph is not None:
            on_graph(model, tf.compat.v1.train.get_global_step())
    return path


#: The prefix of the object-graph names :func:`track_graph_variables` gives.
GRAPH_VARIABLE = "graph_variable:"


def track_graph_variables(model):
    """Tracks on ``model`` every global variable of the current graph its object graph does
    not reach (as ``graph_variable:<the variable's name>``), after the global step's tracking,
    so an object-based checkpoint of the model holds them. Returns their names."""
    view = tf.compat.v2.__internal__.tracking.ObjectGraphView(model)
    held = {s.op.ref() for s in view.frozen_saveable_objects() if isinstance(s.op, tf.Variable)}
    extra = [v for v in tf.compat.v1.global_variables() if v.ref() not in held]
    for variable in extra:
        model._track_trackable(variable, GRAPH_VARIABLE + variable.op.name)
    return [v.op.name for v in extra]
