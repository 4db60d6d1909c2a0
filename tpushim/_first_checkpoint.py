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
"""

import os

import tensorflow as tf


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
    if not tf.io.gfile.isdir(keras_dir):
        tf.io.gfile.makedirs(keras_dir)
    path = os.path.join(keras_dir, "keras_model.ckpt")
    with tf.Graph().as_default():
        tf.compat.v1.random.set_random_seed(config.tf_random_seed)
        tf.compat.v1.train.create_global_step()
        model = clone(keras_model)
        model._make_train_function()  # before the session: it adds to the graph
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
                model.save_weights(path)
            else:
                tf.compat.v1.train.Saver().save(session, path)
        if on_graph is not None:
            on_graph(model, tf.compat.v1.train.get_global_step())
    return path
