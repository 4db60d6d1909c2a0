"""The strategy engine's copy of the user's model, made in the current scope: a graph network
cloned, a subclassed model made and built as stock makes it, its loss plan made once its outputs
exist."""

import weakref

import tensorflow as tf

from tpushim import _host_part, _loss_kinds, _tfprivate


def _built_on_input(keras_model):
    """Whether the model's clone is built on the input's shapes, as stock's model_fn builds it: a
    subclassed model, or a Sequential declaring no input shape (``virtual_batch_size`` needs
    one: Keras's config of a built such layer cannot be cloned, by stock neither)."""
    return _tfprivate.keras.is_subclassed(keras_model) or not keras_model.built


def clone(plan, features=None):
    """A copy of the user's model, uncompiled: a graph network cloned, a subclassed model made
    as stock makes it (:func:`tpushim._tfprivate.keras.subclassed_clone`: fresh weights, stock's
    variable names) and built by a call on zeros shaped as ``features`` (a replica's feature
    specs), its outputs named as stock's (``output_1``, ...). In the current scope."""
    keras_model = plan.keras_model
    with tf.keras.utils.custom_object_scope(plan.custom_objects):
        if not _tfprivate.keras.is_subclassed(keras_model):
            # A Lambda of a graph program's model reads its shapes as the program's graph does.
            own = (
                _tfprivate.graph.for_graph_program()
                and _tfprivate.keras.clone_layer_in_programs_shapes
            )
            model = tf.keras.models.clone_model(keras_model, clone_function=own or None)
            if _built_on_input(keras_model):  # an unbuilt Sequential: built as stock's, below
                model(tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), features))
            if plan.host is not None:  # run from the host's tensors (_host_part)
                _host_part.install(plan.host, model)
            return model
        model = _tfprivate.keras.subclassed_clone(keras_model)
    zeros = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), features)
    outputs = model(zeros, training=False)
    model.output_names = _tfprivate.keras.generic_output_names(tf.nest.flatten(outputs))
    _BUILT_OUTPUTS[model] = [tf.TensorSpec(o.shape, o.dtype) for o in tf.nest.flatten(outputs)]
    if plan.added_degrees is None:  # the loss plan, once the model's outputs exist
        learned = plan.learned  # once per conversion, shared by its estimators
        learned.loss_kinds, learned.added_degrees = _subclassed_loss_plan(
            plan, model, outputs, features
        )
    return model


_BUILT_OUTPUTS = weakref.WeakKeyDictionary()  # a subclassed clone -> its outputs' specs


def output_specs(model):
    """The outputs of ``model`` (the engine's clone): a graph network's own, a subclassed
    model's specs from the call that built it (:func:`clone`)."""
    return model.outputs or _BUILT_OUTPUTS.get(model, [])


def _subclassed_loss_plan(plan, model, outputs, features):
    """(output name -> kind, added loss -> degree) of a subclassed model, from its built copy
    ``model`` and the ``outputs`` of its first call; losses its layers add from their inputs
    are classified on a copy in a graph (:func:`tpushim._loss_kinds.plan_subclassed`)."""
    names = model.output_names
    args = _tfprivate.keras.compile_args(plan.keras_model)
    with tf.keras.utils.custom_object_scope(plan.custom_objects):
        loss_fns = _tfprivate.keras_compile.prepare_loss_functions(args.get("loss"), names)
    flat = tf.nest.flatten(outputs)
    kinds = _loss_kinds.classify_outputs(
        names,
        loss_fns,
        [[None, *o.shape.as_list()[1:]] for o in flat],
        [o.dtype for o in flat],
        args.get("loss_weights"),
    )
    if not any(
        _tfprivate.keras_compile.layer_call_losses(layer)
        for layer in _tfprivate.keras.all_layers(model)
    ):
        return kinds, {}
    loss_plan = _loss_kinds.plan_subclassed(plan.keras_model, plan.custom_objects, features)
    _tfprivate.keras.restore_v2_classes(plan.keras_model)  # planned in a graph
    return kinds, loss_plan.added or {}
