"""Keras 2's models and layers: the clone stock's model_fn makes, BatchNormalization's and
DenseFeatures' calls replaced while tpushim builds a clone, functional nodes, subclassed models,
Keras's classes and random state kept.
"""

import contextlib
import contextvars
import functools
import threading

import tensorflow as tf

from tpushim._tfprivate import graph, modules

# Held while a model's compile arguments are pinned or stripped, or BatchNormalization's call is
# replaced (clone_and_build_model, clone_for_inspection, compile_args). Reentrant: a clone may nest.
_clone_lock = threading.RLock()


def clone_and_build_model(
    mode,
    keras_model,
    custom_objects,
    features=None,
    labels=None,
    optimizer_config=None,
    compile_metrics=True,
    batchnorm_call=None,
):
    """keras_lib's clone and compile; ``compile_metrics=False`` compiles the clone without metrics.

    ``batchnorm_call``: a replacement for the call of the clone's BatchNormalization layers (see
    :func:`batchnorm_call_replaced`), or None for Keras's own.

    Keras's cloning reads the compile arguments through ``keras_model._get_compile_args()`` and
    pins that method on the model to what it read (keras/src/models/cloning.py); with
    ``compile_metrics=False`` the full arguments are pinned back afterwards, which is the state
    stock cloning leaves. The lock keeps a concurrent clone of the same model (another thread's
    evaluate) from seeing the stripped ones.
    """
    with (
        _clone_lock,
        batchnorm_call_replaced(batchnorm_call) if batchnorm_call else contextlib.nullcontext(),
    ):
        if compile_metrics:
            return modules.keras_lib._clone_and_build_model(
                mode, keras_model, custom_objects, features, labels, optimizer_config
            )
        compile_args = keras_model._get_compile_args()
        keras_model._get_compile_args = lambda: dict(
            compile_args, metrics=None, weighted_metrics=None
        )
        try:
            return modules.keras_lib._clone_and_build_model(
                mode, keras_model, custom_objects, features, labels, optimizer_config
            )
        finally:
            keras_model._get_compile_args = lambda: compile_args


# --- BatchNormalization layers: their call replaced while tpushim builds a clone ------------------

_batchnorm_call = contextvars.ContextVar("tpushim_batchnorm_call", default=None)


def batchnorm_base_class():
    """The base class of every Keras 2 BatchNormalization layer (v1, v2, SyncBatchNormalization)."""
    module = modules.keras_module("layers.normalization.batch_normalization")
    return module.BatchNormalizationBase


@contextlib.contextmanager
def batchnorm_call_replaced(replacement):
    """While active, in this thread (context), a BatchNormalization layer's ``call(inputs,
    training=None, mask=None)`` is ``replacement(layer, own_call, inputs, training, mask)``, with
    ``own_call`` the layer's own bound ``call``.

    The class attribute is replaced for the block only, and other threads calling a layer then
    get Keras's own ``call``: a context variable says whose block it is. Blocks do not overlap
    (callers hold the clone lock).
    """
    with batchnorm_call_hooked(), batchnorm_call_using(replacement):
        yield


_cloned_layer_call = contextvars.ContextVar("tpushim_cloned_layer_call", default=None)


@contextlib.contextmanager
def cloned_layers_call_replaced(names, replacement):
    """While active, in this thread (context), the copy Keras's cloning makes of a layer named
    in ``names`` calls ``replacement(layer, inputs, *args, **kwargs)`` (``layer``: the one
    copied) instead of its own ``call`` (set
    on the copy alone: the layer's class and the user's layer keep theirs). Keras's cloning makes
    each layer's copy through its module's ``_clone_layer``, looked up at each clone; it is
    replaced for the block only, and another thread's clone gets Keras's own copy (a context
    variable says whose block it is; a wrapper that overlapping blocks leave behind passes
    every copy through unchanged)."""
    cloning = modules.keras_module("models.cloning")
    own = cloning._clone_layer

    def clone_layer(layer):
        made = own(layer)
        active = _cloned_layer_call.get()
        if active is not None and layer.name in active[0]:
            made.call = functools.partial(active[1], layer)
        return made

    token = _cloned_layer_call.set((frozenset(names), replacement))
    cloning._clone_layer = clone_layer
    try:
        yield
    finally:
        if cloning.__dict__.get("_clone_layer") is clone_layer:  # only ours
            cloning._clone_layer = own
        _cloned_layer_call.reset(token)


def learning_phase_as_stock(training):
    """A block in which ``tf.keras.backend.learning_phase()`` is ``training`` (True in training,
    False in evaluation and prediction), as stock's model_fn sets it for its graph: set for the
    calls made inside the block only, not globally (Keras's eager learning phase scope; a
    layer's ``training`` left to Keras stays None, as in stock's graph). Keras keeps it per
    thread: a strategy's replica threads each enter their own."""
    return modules.keras_module("backend").eager_learning_phase_scope(bool(training))


@graph.not_converted
def call_as_stock(model, inputs, training):
    """``model(inputs)`` as stock's model_fn calls its clone of the model: no ``training`` given
    (a layer whose call takes one gets None, as stock's graph gives it; Keras's own layers then
    read the learning phase), in :func:`learning_phase_as_stock`. A subclassed model whose call
    takes ``training`` is given the mode, as stock's v1 ``Model._set_inputs`` gives it the
    graph's learning phase (so is a stand-in around one: ``passes_training``)."""
    with learning_phase_as_stock(training):
        if getattr(model, PASSES_TRAINING, False) or (
            is_subclassed(model) and model._expects_training_arg
        ):
            return model(inputs, training=bool(training))
        return model(inputs)


#: The attribute marking a functional model built around a subclassed one (the JAX engine's
#: stand-in): :func:`call_as_stock` gives it the mode as stock gives the subclassed model.
PASSES_TRAINING = "_tpushim_passes_training"


@graph.not_converted
@contextlib.contextmanager
def batchnorm_call_hooked():
    """While active, a BatchNormalization layer's ``call`` is the replacement
    :func:`batchnorm_call_using` set in the calling thread, Keras's own where none is set (a
    strategy's replica threads each set theirs inside one hooked block of the main thread)."""
    base = batchnorm_base_class()
    own = base.call

    def call(self, inputs, training=None, mask=None):
        active = _batchnorm_call.get()
        bound = own.__get__(self, type(self))
        if active is None:
            return bound(inputs, training=training, mask=mask)
        return active(self, bound, inputs, training, mask)

    base.call = call
    try:
        yield
    finally:
        if base.__dict__.get("call") is call:  # only ours: someone may have replaced it since
            base.call = own


def batchnorm_call_active():
    """The replacement :func:`batchnorm_call_using` set in this thread (context), or None."""
    return _batchnorm_call.get()


@contextlib.contextmanager
def batchnorm_call_using(replacement):
    """In this thread (context), inside :func:`batchnorm_call_hooked`: BatchNormalization's call is
    ``replacement`` (see :func:`batchnorm_call_replaced`)."""
    token = _batchnorm_call.set(replacement)
    try:
        yield
    finally:
        _batchnorm_call.reset(token)


# --- DenseFeatures layers: the columns Keras reads, and their call replaced while tpushim builds a
# clone (tpushim/_feature_columns.py) ---------------------------------------------------------------

_dense_features_call = contextvars.ContextVar("tpushim_dense_features_call", default=None)


def dense_features_class():
    """The base class of Keras 2's ``DenseFeatures`` layers (``tf.compat.v1.keras.layers`` and
    ``tf.keras.layers``: the v2 layer subclasses the v1 one and keeps its ``call``)."""
    return modules.keras_module("feature_column.dense_features").DenseFeatures


def dense_features_columns(layer):
    """A ``DenseFeatures`` layer's feature columns, in the order it concatenates them."""
    return layer._feature_columns


def dense_features_variable(layer, column, name):
    """The variable ``name`` a ``DenseFeatures`` layer made for ``column`` (one of its own)."""
    return layer._state_manager.get_variable(column, name)


def lookup_layer_classes():
    """Keras 2's preprocessing layers that look up or hash (a vocabulary table, string hashing):
    ops no TPU step compiles (the strategy and JAX engines run them on the host, _host_part)."""
    return (
        modules.keras_module("layers.preprocessing.index_lookup").IndexLookup,
        modules.keras_module("layers.preprocessing.hashing").Hashing,
        modules.keras_module("layers.preprocessing.text_vectorization").TextVectorization,
    )


def random_layer_class():
    """The base class of Keras 2's layers that draw random numbers (Dropout, GaussianNoise, the
    random preprocessing layers)."""
    return modules.keras_module("engine.base_layer").BaseRandomLayer


@contextlib.contextmanager
def legacy_seeds_as_configured(keras_model):
    """Inside, each of the model's layers that draws with Keras's legacy stateful ops (its
    ``RandomGenerator`` advances its ``_seed`` at every draw it makes) draws from the seed its
    config gives, as a fresh clone of it (stock's) does at its first call; restored after, so a
    trace neither reads nor moves what earlier calls left."""
    kept = []
    for layer in all_layers(keras_model):
        generator = getattr(layer, "_random_generator", None)
        if generator is None or not hasattr(generator, "_seed") or not hasattr(layer, "seed"):
            continue
        if getattr(generator, "_rng_type", None) != getattr(
            generator, "RNG_LEGACY_STATEFUL", "legacy_stateful"
        ):
            continue
        kept.append((generator, generator._seed))
        generator._seed = layer.seed
    try:
        yield
    finally:
        for generator, seed in kept:
            generator._seed = seed


def input_dropout_loops(keras_model):
    """The names of the model's recurrent layers that loop over their time steps (not unrolled)
    with ``dropout`` on their inputs, in Keras's order: stock's graph draws that mask inside the
    loop, at each step."""
    return [
        layer.name
        for layer in all_layers(keras_model)
        if isinstance(layer, tf.keras.layers.RNN)
        and not layer.unroll
        and getattr(layer.cell, "dropout", 0)
    ]


@contextlib.contextmanager
def input_dropout_in_loops(keras_model):
    """Inside, each LSTM or GRU layer with ``dropout`` on its inputs runs its cell in the loop
    over time steps, as stock's clone (built in a graph) does: its input mask drawn inside the
    loop, at each step. Built executing eagerly, Keras's v2 layers take their fused path where
    they can (``_could_use_gpu_kernel``), which draws one mask for all the steps before the
    loop. Restored after."""
    kept = [
        layer
        for layer in all_layers(keras_model)
        if getattr(layer, "_could_use_gpu_kernel", False)
        and getattr(getattr(layer, "cell", None), "dropout", 0)
    ]
    for layer in kept:
        layer._could_use_gpu_kernel = False
    try:
        yield
    finally:
        for layer in kept:
            layer._could_use_gpu_kernel = True


def reads_training_mode(layer):
    """True when a layer's call takes the training mode (a ``Lambda``: its function does)."""
    lambda_class = modules.keras_module("layers.core.lambda_layer").Lambda
    if isinstance(layer, lambda_class):
        return bool(layer._fn_expects_training_arg)
    return bool(layer._expects_training_arg)


def node_features_argument(node):
    """The first argument of a functional node's call (a ``DenseFeatures`` layer's features:
    a dict of KerasTensors)."""
    if node.call_args:
        return node.call_args[0]
    return next(iter(node.call_kwargs.values()))


def keras_tensors_mode(keras_model, graph=False):
    """A context for making models of ``keras_model``'s tensors: executing eagerly even inside a
    graph's ``as_default()`` where its tensors are KerasTensors (Keras then makes models and
    layers of its v2 classes, as theirs); in a v1 program (graph tensors) as it is, or with
    ``graph`` in a graph of its own."""
    from tensorflow.python.eager import context

    keras_tensor = modules.keras_module("engine.keras_tensor").KerasTensor
    if all(isinstance(t, keras_tensor) for t in keras_model.inputs):
        return context.eager_mode()
    return tf.Graph().as_default() if graph else contextlib.nullcontext()


def functional_nodes(keras_model):
    """A functional model's call nodes (not its inputs), in the order its call runs them:
    ``(layer, input KerasTensors, output KerasTensors, node)``."""

    found = []
    for depth in sorted(keras_model._nodes_by_depth, reverse=True):
        for node in keras_model._nodes_by_depth[depth]:
            if not node.is_input:
                found.append(
                    (
                        node.layer,
                        tf.nest.flatten(node.keras_inputs),
                        tf.nest.flatten(node.outputs),
                        node,
                    )
                )
    return found


def input_tensor_name(keras_tensor):
    """The name of the InputLayer a model input KerasTensor comes from."""
    return keras_tensor._keras_history.layer.name


def run_functional_from(keras_model, inputs, seeded, skip, replace, fill):
    """A functional model's call (what ``Functional._run_internal_graph`` runs) from chosen
    values: ``inputs`` (input name -> value, conformed as Keras conforms them; an input absent
    is not fed) and ``seeded`` ((KerasTensor, value) pairs, taken as that tensor's value).
    A node for which ``skip(layer)`` is true is not run. ``replace(node)`` returns a function computing that node's outputs
    instead of its layer, or None; ``fill(tensor)`` gives a model output nothing computed.
    Nodes whose inputs are not all known are skipped, as Keras skips them."""

    counts = keras_model._tensor_usage_count
    values = {}
    for x in keras_model.inputs:
        name = input_tensor_name(x)
        if name in inputs:
            y = keras_model._conform_to_reference_input(inputs[name], ref_input=x)
            values[str(id(x))] = [y] * counts[str(id(x))]
    for x, y in seeded:
        values[str(id(x))] = [y] * max(counts.get(str(id(x)), 1), 1)
    for layer, _, _, node in functional_nodes(keras_model):
        if skip(layer):
            continue
        instead = replace(node)
        if instead is not None:
            outputs = instead()
        elif any(i not in values for i in node.flat_input_ids):
            continue
        else:
            args, kwargs = node.map_arguments(values)
            outputs = layer(*args, **kwargs)
        for x_id, y in zip(node.flat_output_ids, tf.nest.flatten(outputs)):
            values[x_id] = [y] * counts[x_id]
    outputs = []
    for x in keras_model.outputs:
        x_id = str(id(x))
        outputs.append(values[x_id].pop() if values.get(x_id) else fill(x))
    return tf.nest.pack_sequence_as(keras_model._nested_outputs, outputs)


def replace_functional_run(keras_model, run):
    """Makes ``run(inputs, training, mask)`` the functional model's ``_run_internal_graph`` (on
    this object only: tpushim's own clone); ``run`` gets Keras's own as ``own``."""
    own = keras_model._run_internal_graph

    def replaced(inputs, training=None, mask=None):
        return run(inputs, training, mask, own)

    keras_model._run_internal_graph = replaced


@contextlib.contextmanager
def functional_run_replaced(keras_model, run):
    """:func:`replace_functional_run` while the block runs (the JAX engine traces the user's own
    model so); Keras's own restored after it, only if still ours."""
    had = keras_model.__dict__.get("_run_internal_graph")
    replace_functional_run(keras_model, run)
    ours = keras_model.__dict__["_run_internal_graph"]
    try:
        yield
    finally:
        if keras_model.__dict__.get("_run_internal_graph") is ours:
            if had is None:
                del keras_model.__dict__["_run_internal_graph"]
            else:
                keras_model.__dict__["_run_internal_graph"] = had


def input_layers(keras_model):
    """A functional model's InputLayers, in its inputs' order."""
    return keras_model._input_layers


def feature_column_classes():
    """The feature column classes tpushim tells apart (tensorflow/python/feature_column)."""
    import types

    from tensorflow.python.feature_column import feature_column_v2 as fc

    return types.SimpleNamespace(
        CrossedColumn=fc.CrossedColumn,
        WeightedCategoricalColumn=fc.WeightedCategoricalColumn,
        BucketizedColumn=fc.BucketizedColumn,
        EmbeddingColumn=fc.EmbeddingColumn,
        SequenceCategoricalColumn=fc.SequenceCategoricalColumn,
        SINGLE_KEY_CATEGORICAL=(
            fc.VocabularyListCategoricalColumn,
            fc.VocabularyFileCategoricalColumn,
            fc.HashedCategoricalColumn,
            fc.IdentityCategoricalColumn,
        ),
        WEIGHT_FREE_DENSE=(fc.NumericColumn, fc.BucketizedColumn, fc.IndicatorColumn),
    )


def feature_transformation_cache(features):
    """A feature column ``FeatureTransformationCache`` over ``features`` (what DenseFeatures makes)."""

    return tf.__internal__.feature_column.FeatureTransformationCache(features)


@contextlib.contextmanager
def dense_features_call_replaced(replacement):
    """While active, in this thread (context), a ``DenseFeatures`` layer's ``call(features, ...)``
    is ``replacement(layer, own_call, features, cols_to_output_tensors, training)`` (as
    :func:`batchnorm_call_replaced` does for BatchNormalization); Keras reads the call's
    signature, which stays the layer's own."""
    base = dense_features_class()
    own = base.call

    def call(self, features, cols_to_output_tensors=None, training=None):
        active = _dense_features_call.get()
        bound = own.__get__(self, type(self))
        if active is None:
            return bound(features, cols_to_output_tensors, training)
        return active(self, bound, features, cols_to_output_tensors, training)

    token = _dense_features_call.set(replacement)
    base.call = call
    try:
        yield
    finally:
        if base.__dict__.get("call") is call:
            base.call = own
        _dense_features_call.reset(token)


def batchnorm_training_value(layer, training):
    """True, False or None (not known while building): whether a BatchNormalization layer uses
    batch statistics in this call, as Keras decides (the learning phase; a frozen layer never)."""

    value = layer._get_training_value(training)
    if tf.is_tensor(value):
        value = tf.get_static_value(value)
    return None if value is None else bool(value)


def batchnorm_renorm(layer, mean, variance, inputs_size):
    """Keras's batch renormalization for these batch moments: ``(r, d, mean, variance)``, the
    renorm moving averages updated (not where ``inputs_size`` is 0)."""
    return layer._renorm_correction_and_moments(mean, variance, True, inputs_size)


def is_subclassed(keras_model):
    """Neither functional nor Sequential: stock clones it from its config, or resets it in place."""

    return not (keras_model._is_graph_network or isinstance(keras_model, tf.keras.Sequential))


def subclassed_clone(keras_model):
    """A fresh copy of a subclassed model, made as stock's model_fn makes it (Keras's cloning:
    ``cls.from_config(model.get_config())``, unbuilt), its layers named as in stock's fresh
    graph (``dense``, ``dense_1``, ...) so its variables get stock's names under the model's;
    the names Keras gives the user's later layers are left as they were."""
    import collections

    # A clone made in a graph (stock's, the loss plan's) leaves the class on its v1 bases:
    # the copy is an eager model, as Keras's next eager construction would make it.
    restore_v2_classes(keras_model)
    backend = modules.keras_module("backend")
    uids = backend.PER_GRAPH_OBJECT_NAME_UIDS
    # Keras numbers names per graph: layers' in the default graph's map, models' in its own
    # graph's (get_uid); stock's clone is made in a fresh graph, where both start from 0.
    graphs = {tf.compat.v1.get_default_graph(), backend.get_graph()}
    kept = {g: uids.get(g) for g in graphs}
    for g in graphs:
        uids[g] = collections.defaultdict(int)
    try:
        return keras_model.__class__.from_config(keras_model.get_config())
    finally:
        for g, map_ in kept.items():
            if map_ is None:
                del uids[g]
            else:
                uids[g] = map_


def generic_output_names(outputs):
    """The names stock's clone gives a subclassed model's outputs (``output_1``, ...)."""
    return modules.keras_module("engine.training_utils_v1").generic_output_names(outputs)


def overrides_step(keras_model):
    """The names of ``train_step`` / ``test_step`` / ``predict_step`` the model's class
    overrides (stock's estimator calls none of them: it builds its own graph from the model)."""

    return [
        name
        for name in ("train_step", "test_step", "predict_step")
        if getattr(type(keras_model), name) is not getattr(tf.keras.Model, name)
    ]


def restore_subclassed_model_state(keras_model):
    """Undoes the in-place reset Keras applies to a subclassed model it cannot clone from its
    config, as stock's model_fn does after building (the user's model keeps its layers/optimizer)."""

    if (
        not keras_model._is_graph_network
        and getattr(keras_model, "_original_attributes_cache", None) is not None
    ):
        tf.compat.v2.keras.__internal__.models.in_place_subclassed_model_state_restoration(
            keras_model
        )


def keras_v1_tf_optimizer_class():
    """Keras's wrapper for a tf.compat.v1.train optimizer (``model.compile(optimizer=tf1_opt)``)."""
    optimizer_v1 = modules.keras_module("optimizers.optimizer_v1")
    return optimizer_v1.TFOptimizer


def is_graph_network(keras_model):
    """True for a functional model (Sequential included once built); False for a subclassed one."""
    return keras_model._is_graph_network


def track_global_step(model):
    """Adds the global step to the model's object graph, under the name keras_lib's checkpoints use."""

    model._track_trackable(tf.compat.v1.train.get_global_step(), "estimator_global_step")


def set_object_restore_saver(saver, model):
    """Lets a name-based Saver restore object-based checkpoints of ``model``, as keras_lib does."""
    from tensorflow.python.checkpoint import checkpoint

    saver._object_restore_saver = checkpoint.frozen_saver(model)


def compile_args(keras_model):
    """The arguments ``compile()`` was given (``loss``, ``loss_weights``, ...), as cloning reads them."""
    with _clone_lock:  # not the metric-less ones another thread's clone pins for its block
        return keras_model._get_compile_args()


@graph.not_converted
def all_layers(keras_model):
    """The model and every layer in it, nested models' layers included, in Keras's order."""
    return list(keras_model._flatten_layers(include_self=True, recursive=True))


@contextlib.contextmanager
def keras_classes_kept(keras_model):
    """The classes of ``keras_model`` and its layers left as they were by a clone made in a
    graph: making a layer in a graph swaps its class's bases to Keras's v1 ``Layer`` and
    ``Model`` (Keras's ``LayerVersionSelector``), and a v1 class refuses a model built as v2
    (``get_weights``: "no attribute '_compile_time_distribution_strategy'"). Stock makes its
    first graph clone after it has read the weights; tpushim's scratch clones come before."""
    classes = {
        cls for layer in all_layers(keras_model) for cls in type(layer).__mro__ if cls is not object
    }
    kept = [(cls, cls.__bases__) for cls in classes]
    try:
        yield
    finally:
        for cls, bases in kept:
            if cls.__bases__ != bases:
                cls.__bases__ = bases


def as_v2_classes(keras_model):
    """The classes of ``keras_model`` and its layers made Keras's v2 ones again, as making one
    of each in eager mode makes them (Keras's ``LayerVersionSelector``: it swaps a class's
    bases between the v1 and v2 ``Layer`` and ``Model`` for the mode it is made in). A
    conversion leaves them v1 (``model_to_estimator`` clones the model in a graph), and a v1
    class refuses a model built as v2 ("Your Layer or Model is in an invalid state"); cloning
    the model in eager mode would swap them back the same way."""
    version_utils = modules.keras_module("utils.version_utils")
    models = (
        modules.keras_module("engine.training").Model,
        modules.keras_module("engine.training_v1").Model,
    )
    layers = (
        modules.keras_module("engine.base_layer").Layer,
        modules.keras_module("engine.base_layer_v1").Layer,
    )
    for layer in all_layers(keras_model):
        if isinstance(layer, models):  # a Model's class swaps its Model base, then its Layer base
            version_utils.swap_class(type(layer), *models, use_v2=True)
        version_utils.swap_class(type(layer), *layers, use_v2=True)


def clone_for_inspection(keras_model, custom_objects, input_tensors=None):
    """An uncompiled clone in the current (scratch) graph, built as the model_fn's clone is
    (keras_lib's cloning): a functional model on fresh placeholders; a subclassed model called
    on ``input_tensors`` (Keras may reset it in place: see :func:`restore_subclassed_model_state`).

    As Keras's cloning does for a compiled clone (which stock's conversion makes next), the
    model's compile arguments are pinned first: cloning in a graph can turn the model's class
    into its v1 twin, whose own ``_get_compile_args`` then fails.
    """

    if getattr(keras_model, "optimizer", None) is not None:
        with _clone_lock:  # a clone in another thread may have stripped the metrics for its block
            compile_args = keras_model._get_compile_args()
            keras_model._get_compile_args = lambda: compile_args
    return tf.compat.v2.keras.__internal__.models.clone_and_build_model(
        keras_model,
        input_tensors,
        None,
        custom_objects,
        compile_clone=False,
        in_place_reset=not keras_model._is_graph_network,
    )


def restore_v2_classes(keras_model, v1=False):
    """Undoes what a clone in a graph does to an eager model's classes: Keras makes a model or
    layer in a graph by swapping its class's bases to their v1 twins in place
    (``version_utils.swap_class``), for every instance of the class, the user's eager model too,
    until the next one is made eagerly (whose v1 ``get_weights`` then fails, for one). Swaps them
    back, as Keras's own next eager construction would. ``v1``: the other way, for a model made
    in a graph (a program that disabled v2 behaviour) after a clone made eagerly."""
    version_utils = modules.keras_module("utils.version_utils")
    model_classes = (
        modules.keras_module("engine.training").Model,
        modules.keras_module("engine.training_v1").Model,
    )
    layer_classes = (
        modules.keras_module("engine.base_layer").Layer,
        modules.keras_module("engine.base_layer_v1").Layer,
    )
    for layer in all_layers(keras_model):
        if isinstance(layer, model_classes[0]):
            version_utils.swap_class(type(layer), *model_classes, not v1)
        # A model's too: the v1 swap reaches Model's own base Layer (a subclassed model's clone).
        version_utils.swap_class(type(layer), *layer_classes, not v1)


_random_state_lock = threading.RLock()


class keras_random_state_kept:
    """A context in which Keras may make layers (each draws a seed for its initializers and
    dropout from Keras's seed generator, or Python's ``random``) without moving the seeds the
    layers made afterwards get: an inspection must not change what a seeded run trains.

    Keras's seed generator is per thread; Python's ``random`` is per process, so tpushim's blocks
    in different threads take turns (a lock), and only nest within one thread.

    ``counted``: the seeds Keras draws in the block are counted (``draws``), each still drawn
    from where Keras draws it (its seed generator, else Python's ``random``): how many a clone
    stock makes draws, for :func:`draw_keras_seeds`.
    """

    def __init__(self, counted=False):
        self._counted, self.draws = counted, 0

    def __enter__(self):
        import random

        backend = modules.keras_module("backend")
        _random_state_lock.acquire()
        self._generator = getattr(backend._SEED_GENERATOR, "generator", None)
        self._states = (
            random.getstate(),
            None if self._generator is None else self._generator.getstate(),
        )
        if self._counted:
            self._had = hasattr(backend._SEED_GENERATOR, "generator")
            backend._SEED_GENERATOR.generator = _CountedSeeds(self._generator or random, self)
        return self

    def __exit__(self, *exc):
        import random

        try:
            if self._counted:
                backend = modules.keras_module("backend")
                if self._had:
                    backend._SEED_GENERATOR.generator = self._generator
                else:
                    del backend._SEED_GENERATOR.generator
            random.setstate(self._states[0])
            if self._generator is not None:
                self._generator.setstate(self._states[1])
        finally:
            _random_state_lock.release()


class _CountedSeeds:
    """Keras's seed generator in a counted :class:`keras_random_state_kept` block: each draw
    made from ``source`` (the generator it stands in for, or Python's ``random``) and counted."""

    def __init__(self, source, block):
        self._source, self._block = source, block

    def randint(self, low, high):
        self._block.draws += 1
        return self._source.randint(low, high)

    def getstate(self):
        return self._source.getstate()

    def setstate(self, state):
        self._source.setstate(state)

    def __getattr__(self, name):  # any other draw: the source's own (Keras makes only randint's)
        return getattr(self._source, name)


def draw_keras_seeds(count):
    """Draws ``count`` seeds as Keras draws a layer's unseeded initializer's (its seed generator,
    else Python's ``random``): the program's random state then moves as a clone that draws
    them (counted by :class:`keras_random_state_kept`) moves it."""
    backend = modules.keras_module("backend")
    generator = backend.RandomGenerator(None, rng_type="stateless")
    for _ in range(count):
        generator._create_seed(None)


def feature_column_layers(keras_model):
    """Names of the model's ``DenseFeatures`` layers with a column that looks up or hashes its
    feature (a vocabulary table, string hashing, a cross): ops no TPU step compiles."""
    from tensorflow.python.feature_column import feature_column_v2 as fc

    dense_features = modules.keras_module("feature_column.dense_features").DenseFeatures
    lookups = (
        fc.VocabularyListCategoricalColumn,
        fc.VocabularyFileCategoricalColumn,
        fc.HashedCategoricalColumn,
        fc.CrossedColumn,
    )

    def sources(column):
        yield column
        for parent in getattr(column, "parents", None) or ():
            yield from sources(parent)

    return [
        layer.name
        for layer in all_layers(keras_model)
        if isinstance(layer, dense_features)
        and any(
            isinstance(source, lookups)
            for column in dense_features_columns(layer)
            for source in sources(column)
        )
    ]


def clone_layer_in_programs_shapes(layer):
    """``tf.keras.models.clone_model``'s ``clone_function`` for the engine's clone of a graph
    program's model: each layer copied from its config as Keras copies it, a ``Lambda``'s
    function run as the program built it (:func:`in_programs_shapes`: its ``shape[1].value``
    reads a Dimension), from the clone's first call on."""
    copy = layer.__class__.from_config(layer.get_config())
    if type(copy).__name__ == "Lambda" and callable(getattr(copy, "function", None)):
        copy.function = graph.in_programs_shapes(copy.function)
    return copy
