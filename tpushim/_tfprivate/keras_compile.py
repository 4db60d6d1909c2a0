"""What Keras 2's ``compile()`` made of a model: its losses (term by term), metrics and
optimizers (Keras's and ``tf.compat.v1.train``'s), as a compiled v1-graph clone has them.
"""

import contextlib

import tensorflow as tf

from tpushim._tfprivate import graph, keras, modules


@graph.not_converted
def losses_utils():
    """Keras's ``losses_utils`` module (``compute_weighted_loss``, ``ReductionV2``)."""
    module = modules.keras_module("utils.losses_utils")
    return module


def compiled_user_metrics(keras_model):
    """The metrics passed to ``compile()``: (``metrics``, ``weighted_metrics``) as given, or
    ``(None, None)`` before the model is compiled."""
    compiled = getattr(keras_model, "compiled_metrics", None)
    if compiled is None:
        return None, None
    return (
        getattr(compiled, "_user_metrics", None),
        getattr(compiled, "_user_weighted_metrics", None),
    )


def build_compiled_metrics(keras_model, y_true, y_pred):
    """Builds the model's compiled metrics container on these labels and outputs, as its first
    ``update_state`` would, but with ``"accuracy"``, ``"acc"``, ``"crossentropy"`` and ``"ce"``
    resolved as stock's model_fn resolves them: it compiles its clone in a graph, where Keras
    (v1) picks the function by the output's last dimension and the output's loss alone
    (``get_metric_function``), not by the labels' shape as an eager compile does. They differ
    for a loss Keras cannot name (a user's function on 3 units: categorical, even for [batch, 1]
    labels, where the eager pick is sparse)."""

    compiled = keras_model.compiled_metrics
    if compiled._built:
        return
    training_utils_v1 = modules.keras_module("engine.training_utils_v1")
    names = keras_model.output_names
    losses = prepare_loss_functions(keras.compile_args(keras_model).get("loss"), names)
    if isinstance(y_pred, dict):  # (tf.nest would order a dict's outputs by name)
        outputs = [y_pred.get(name) for name in names]
    else:
        outputs = tf.nest.flatten(y_pred)
    loss_of = {id(output): loss for output, loss in zip(outputs, losses)}
    eager_pick = compiled._get_metric_object

    def stocks_pick(metric, y_t, y_p):
        by_name = isinstance(metric, str) and metric in ("accuracy", "acc", "crossentropy", "ce")
        if by_name and id(y_p) in loss_of:
            picked = training_utils_v1.get_metric_function(
                metric, output_shape=y_p.shape, loss_fn=loss_of[id(y_p)]
            )
            return modules.keras_module("metrics").MeanMetricWrapper(picked, name=metric)
        return eager_pick(metric, y_t, y_p)

    compiled._get_metric_object = stocks_pick
    try:
        compiled.build(y_pred, compiled._conform_to_outputs(y_pred, y_true))
    finally:
        del compiled._get_metric_object  # the class's own again


def update_compiled_metrics_as_given(keras_model, y_true, y_pred, sample_weight):
    """The built compiled metrics container's ``update_state`` (one list entry per output), but
    each label handed to its metrics as given, as stock's graph (Keras's v1 training) hands it:
    the container expands a [batch] label (and sample weight) of a [batch, k] output to
    [batch, 1] first, which changes what a metric reducing the last axis computes (a user's loss
    on k > 1 units: stock's categorical accuracy takes the argmax of the batch's [batch]
    labels). Otherwise as the container: labels cast to the output's dtype of their kind, the
    output's Keras mask as the metrics' weight, and applied to the sample weight."""
    import tensorflow as tf

    losses = losses_utils()
    compiled = keras_model.compiled_metrics
    for y_t, y_p, sw, metric_objs, weighted_objs in zip(
        y_true, y_pred, sample_weight, compiled._metrics, compiled._weighted_metrics
    ):
        if y_t is None:
            continue
        if (y_t.dtype.is_floating and y_p.dtype.is_floating) or (
            y_t.dtype.is_integer and y_p.dtype.is_integer
        ):
            y_t = tf.cast(y_t, y_p.dtype)
        if sw is not None:
            sw = tf.cast(sw, y_p.dtype)
        mask = losses.get_mask(y_p)
        sw = losses.apply_mask(y_p, sw, mask)
        for metric in metric_objs:
            if metric is not None:
                metric.update_state(y_t, y_p, sample_weight=mask)
        for metric in weighted_objs:
            if metric is not None:
                metric.update_state(y_t, y_p, sample_weight=sw)


@contextlib.contextmanager
def compiled_metrics_only(keras_model, weighted):
    """While open, the model's built compiled metrics container updates only its weighted
    metrics (``weighted``) or only its other ones, so each kind can be given its own labels."""
    compiled = keras_model.compiled_metrics
    saved = compiled._metrics, compiled._weighted_metrics
    hidden = [[] for _ in saved[0]]
    if weighted:
        compiled._metrics = hidden
    else:
        compiled._weighted_metrics = hidden
    try:
        yield
    finally:
        compiled._metrics, compiled._weighted_metrics = saved


def set_metric_name(metric, name):
    """Gives a rebuilt metric the unique name Keras gave the original (``from_config`` does not)."""
    metric._name = name


def make_train_function(model):
    """Builds a v1-graph clone's train function (``model.train_function.updates_op``)."""
    model._make_train_function()


def update_op(value):
    """A metric's ``update_state`` result as TPUEstimator's ``(value, update_op)`` wants it.

    Keras 2.14+ returns an Operation in graph mode; Keras 2.13 returns the variable its last
    ``assign_add`` produced (an unread ResourceVariable), which is neither Tensor nor Operation:
    its ``op`` is that assignment, which runs after the metric's other updates.
    """

    if isinstance(value, tf.Variable):
        return value.op
    return value


def training_endpoints(model):
    """Per-output (name, loss_fn, loss_weight, sample_weight) of a compiled v1-graph clone."""
    return model._training_endpoints


def settle_sample_weights(model):
    """What Keras's ``_make_test_function`` (called by stock's EVAL model_fn) does first: when
    sample weights cover only some outputs, the clone's weights and weight modes disagree and Keras
    recompiles its loss and weighted metrics WITHOUT any sample weights (stock then evaluates, as it
    trains, unweighted). Returns whether it recompiled."""
    return model._recompile_weights_loss_and_weighted_metrics()


def call_metric_function(metric_fn, y_true, y_pred, weights=None, mask=None):
    """Keras's v1-graph metric call: an output's mask weighs the metric, times any weights."""
    training_utils_v1 = modules.keras_module("engine.training_utils_v1")
    return training_utils_v1.call_metric_function(
        metric_fn, y_true, y_pred, weights=weights, mask=mask
    )


def per_output_metrics(model):
    """Per output: (unweighted {name: Metric}, weighted {name: Metric}) of a compiled clone."""
    return list(zip(model._per_output_metrics, model._per_output_weighted_metrics))


# --- the training loss, term by term (tpushim/_loss_kinds.py, tpushim/_losses.py) -------------


def prepare_loss_functions(loss, output_names):
    """The per-output Loss objects a v1-graph clone compiles ``loss`` into (Keras wraps every
    function in a ``LossFunctionWrapper`` with reduction AUTO), in ``output_names``' order."""
    training_utils_v1 = modules.keras_module("engine.training_utils_v1")
    return training_utils_v1.prepare_loss_functions(loss, output_names)


def name_metric_objects_as_a_compile(keras_model):
    """Names the Metric objects a multi-output model was compiled with as one more compile of a
    clone names them: Keras prefixes a shared object's name with its output's (training_v1's
    ``_set_per_output_metric_attributes``), so each of stock's train and evaluate model_fn calls
    adds one prefix (``reg_reg_reg_root_mean_squared_error`` at a first evaluate() after a first
    train()), and stock's evaluate() reports that name. Metrics given per output (a dict, or a
    list per output) only; strings and functions are made afresh each time."""
    args = keras.compile_args(keras_model)
    names = list(keras_model.output_names or ())
    if len(names) < 2:
        return
    Metric = modules.keras_module("metrics.base_metric").Metric
    for given in (args.get("metrics"), args.get("weighted_metrics")):
        if isinstance(given, dict):
            pairs = given.items()
        elif isinstance(given, (list, tuple)) and all(isinstance(m, (list, tuple)) for m in given):
            pairs = zip(names, given)
        else:
            continue
        for output, metrics in pairs:
            for metric in metrics if isinstance(metrics, (list, tuple)) else [metrics]:
                if isinstance(metric, Metric):
                    metric._name = f"{output}_{metric._name}"


def clone_metrics(metrics):
    """Keras's ``clone_metrics`` (as ``clone_and_build_model`` compiles its clone): each Metric
    object a fresh one from its config (a user's object may hold variables of another graph);
    strings and functions as they are; lists and dicts kept."""
    return modules.keras_module("metrics.base_metric").clone_metrics(metrics)


def keras_loss_modules():
    """The modules Keras's built-in losses live in (``tf.keras.losses``' functions and classes)."""

    return {tf.keras.losses.mean_squared_error.__module__, tf.keras.losses.Loss.__module__}


def loss_function_wrapper_class():
    """Keras's ``LossFunctionWrapper``: a Loss around a function (``fn``)."""
    LossFunctionWrapper = modules.keras_module("losses").LossFunctionWrapper
    return LossFunctionWrapper


def add_loss_layer_class():
    """The layer ``model.add_loss(symbolic tensor)`` becomes in a functional model."""
    AddLoss = modules.keras_module("engine.base_layer").AddLoss
    return AddLoss


@contextlib.contextmanager
def call_losses_kept(keras_model):
    """Each layer's losses from its last call (``add_loss`` of a tensor in ``call``) as they were
    before, after a trace of the model in a ``tf.function``: calling the model clears them and
    keeps the trace's, tensors of a graph that is never run."""
    kept = [(layer, layer._eager_losses) for layer in keras.all_layers(keras_model)]
    try:
        yield
    finally:
        for layer, losses in kept:
            layer._eager_losses = losses


def layer_input_losses(layer):
    """The losses a layer added from what it was called on (activity regularizers, ``add_loss``
    of a tensor): its own, not its sublayers'; weight regularizers are kept apart (callables)."""
    return list(layer._losses)


def activity_loss_count(layer):
    """How many of a graph network layer's input losses (:func:`layer_input_losses`) its
    activity regularizer added: one per output of each of its calls in the model's graph."""
    if getattr(layer, "activity_regularizer", None) is None:
        return 0

    return sum(len(tf.nest.flatten(node.outputs)) for node in layer._inbound_nodes)


def activity_losses(layer):
    """(index among :func:`layer_input_losses`, the loss, the output it regularized) for each
    loss a graph network layer's activity regularizer added in a graph: Keras adds one per
    output of each call, just before the call's node, so they pair with the layer's nodes in
    order. Empty where the layer added other input losses too (which pairing could not tell
    apart) or has no activity regularizer."""
    import tensorflow as tf

    losses = layer_input_losses(layer)
    if not losses or len(losses) != activity_loss_count(layer):
        return []
    outputs = [o for node in layer._inbound_nodes for o in tf.nest.flatten(node.outputs)]
    return [(i, loss, output) for i, (loss, output) in enumerate(zip(losses, outputs))]


@graph.not_converted
def layer_call_losses(layer):
    """The losses a layer added from its inputs in its latest call eagerly or in a
    ``tf.function`` (Keras keeps them per thread, apart from its construction's, which
    :func:`layer_input_losses` gives; cleared at each outermost call)."""
    return list(layer._eager_losses)


@graph.not_converted
def weight_regularizers(model, models_own=True):
    """The model's weight regularization terms, evaluated now (Keras's callable losses).
    ``models_own=False``: without those ``model.add_loss`` was given on a Model (nested ones
    too), which stock's clone of the model (Keras's ``clone_model``) does not carry: stock
    trains without them."""
    values = [
        fn()
        for layer in keras.all_layers(model)
        if models_own or not isinstance(layer, tf.keras.Model)
        for fn in layer._callable_losses
    ]
    return [value for value in values if value is not None]


def output_masks(model):
    """Per output, the Keras mask a compiled clone weights its loss with (None: no mask)."""
    return [getattr(output, "_keras_mask", None) for output in model.outputs]


def standardize_sample_weights(sample_weights, output_names):
    """``{"features", "sample_weights"}`` features' weights as one entry per output (None: no
    weight), as keras_lib maps them (``training_utils_v1.standardize_sample_weights``)."""
    return modules.keras_module("engine.training_utils_v1").standardize_sample_weights(
        sample_weights, output_names
    )


def added_losses(model):
    """The regularization and ``add_loss`` terms Keras adds to a compiled clone's total loss."""
    return model.get_losses_for(None) + model.get_losses_for(model.inputs)


def replace_total_loss(model, loss):
    """Makes ``loss`` what a compiled v1-graph clone's train function differentiates (set
    before ``make_train_function``, after :func:`settle_sample_weights`, so Keras does not
    recompile it)."""
    model.total_loss = loss


def create_optimizer_slots(optimizer, variables):
    """Creates a Keras (legacy) optimizer's slots and hyperparameters for ``variables`` now, so a
    checkpoint restores them at once rather than when the first step creates them."""
    optimizer._create_all_weights(variables)


def fresh_tf1_optimizer(optimizer):
    """A copy of a ``tf.compat.v1.train`` optimizer with its hyperparameters and none of its
    state (slots, non-slot variables such as Adam's ``beta1_power``, checkpoint dependencies):
    stock builds each call's graph afresh, so the user's optimizer never carries one call's
    variables into the next (in eager mode the optimizer would reuse them). The base class's
    ``__init__`` is what resets that state; a subclass's own attributes are its hyperparameters."""

    base = tf.compat.v1.train.Optimizer
    fresh = object.__new__(type(optimizer))
    # Trackable's own bookkeeping (``_self_*``) is left out: it is made afresh on first use.
    fresh.__dict__.update({k: v for k, v in vars(optimizer).items() if not k.startswith("_self_")})
    base.__init__(fresh, optimizer._use_locking, optimizer._name)
    return fresh


def keras_tf_optimizer(tf1_optimizer, iterations):
    """Keras's ``TFOptimizer`` around ``tf1_optimizer`` with ``iterations`` as its global step, as
    keras_lib's clone makes it (``clone_and_build_model(optimizer_iterations=global_step)``): it
    tracks the optimizer as ``optimizer`` and the step as ``global_step``."""
    return keras.keras_v1_tf_optimizer_class()(tf1_optimizer, iterations)


def create_tf1_optimizer_slots(optimizer, variables):
    """Creates a ``tf.compat.v1.train`` optimizer's slots and non-slot variables for
    ``variables`` now (its ``apply_gradients`` would on the first step), so a checkpoint restores
    them at once."""
    optimizer._create_slots(list(variables))


def tf1_optimizer_hyperparameters(optimizer):
    """``(name, value)`` of a ``tf.compat.v1.train`` optimizer's hyperparameters that stock
    evaluates in its model_fn's graph (a tensor, a variable or a callable: the optimizer's
    ``_call_if_callable``); plain numbers are left out. Names without their underscore."""

    return [
        (name.lstrip("_"), value)
        for name, value in vars(optimizer).items()
        if not name.startswith("_self_")
        and name not in ("_slots", "_non_slot_dict", "_deferred_slot_restorations")
        # what ``_prepare`` made of them at the last apply (replaced at the next): not inputs
        and not name.endswith(("_t", "_tensor"))
        and (isinstance(value, (tf.Tensor, tf.Variable)) or callable(value))
    ]


# --- what Keras's crossentropy metrics read from an output besides its values -----------------

#: Activations whose output Keras's crossentropies read the logits of, by the op's type.
LOGITS_OPS = ("Sigmoid", "Softmax")


def output_logits(output):
    """(how, logits) Keras's crossentropies would read from this output, or (None, None).

    A Keras activation leaves its input on the output as ``_keras_logits``, and an output made by
    a Sigmoid or Softmax op has its input (read in a graph only): Keras's crossentropy metrics
    (and the ``crossentropy`` alias) compute from those logits, not from the probabilities
    (``backend._get_logits``).
    """
    if hasattr(output, "_keras_logits"):
        return "keras_logits", output._keras_logits
    if hasattr(output, "op") and output.op.type in LOGITS_OPS:
        return output.op.type, output.op.inputs[0]
    return None, None


def with_output_logits(y_pred, how, logits):
    """``y_pred`` as a metric gets it (padding dropped, gathered from replicas, or outfed from a
    TPU: a new tensor), made to carry ``logits`` as the model's output carried them (see
    :func:`output_logits`). An op's type is read in a graph only: there it is rebuilt."""

    if how == "keras_logits":
        if not hasattr(y_pred, "_keras_logits"):
            y_pred = tf.identity(y_pred)
            y_pred._keras_logits = logits
        return y_pred
    if y_pred.op.type == how:
        return y_pred
    return {"Sigmoid": tf.math.sigmoid, "Softmax": tf.nn.softmax}[how](logits)


def loss_in_programs_shapes(loss):
    """A copy of a compiled Loss object whose own code (a wrapped function, a subclass's
    ``call``) runs as the program built it (:func:`in_programs_shapes`); the user's object is
    not changed."""
    import copy

    own = copy.copy(loss)
    if callable(getattr(own, "fn", None)):  # LossFunctionWrapper: a function given to compile
        own.fn = graph.in_programs_shapes(own.fn)
    else:  # a Loss subclass: its call
        own.call = graph.in_programs_shapes(own.call)
    return own


def v1_metric_names(keras_model):
    """The names of a model's compiled metrics as stock's estimator names them when the model
    was compiled in a graph (Keras's v1 training: ``acc`` for ``'accuracy'`` once v2 behaviour
    is disabled), in Keras's order; None where the model keeps none."""
    functions = getattr(keras_model, "_compile_metric_functions", None)
    return None if functions is None else [m.name for m in functions]


def compiled_metric_names_per_output(keras_model):
    """The names Keras's metrics container gave the built compiled metrics of ``keras_model``
    (an eager compile's): one ``(output_name, names, weighted_names)`` per output, in the order
    of ``compiled_metrics.metrics`` (``output_name`` None for a single-output model)."""
    compiled = keras_model.compiled_metrics
    outputs = compiled._output_names
    single = len(outputs) <= 1

    def named(metrics):
        return [m.name for m in tf.nest.flatten(metrics) if m is not None]

    return [
        (None if single else out, named(plain), named(weighted))
        for out, plain, weighted in zip(outputs, compiled._metrics, compiled._weighted_metrics)
    ]


def learning_rate_schedule(optimizer):
    """A Keras optimizer's ``LearningRateSchedule`` object (a legacy one keeps it among its
    hyperparameters, a new-style one as ``_learning_rate``), or None: a constant rate."""
    schedules = tf.keras.optimizers.schedules.LearningRateSchedule
    hyper = getattr(optimizer, "_hyper", None)
    value = hyper.get("learning_rate") if isinstance(hyper, dict) else None
    value = value if value is not None else getattr(optimizer, "_learning_rate", None)
    return value if isinstance(value, schedules) else None
