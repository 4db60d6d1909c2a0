"""Every private TensorFlow / Keras name the core uses, in one place.

These are internals of tensorflow_estimator and Keras 2 in TensorFlow 2.12-2.15 (the range in
tpushim/version.py), pinned by tests/unit/test_tfprivate.py on each of them: when a release moves one,
this file is the one to edit. Where the releases differ, the fallback says which has what. The
few names only the tooling reaches (the faked TPU system's) live in tpushim/_preflight/faketpu.py.
"""

import contextlib
import contextvars
import functools
import os
import sys
import threading

import tensorflow as tf
from tensorflow.python.tpu import tpu_function  # number of shards inside a replicated computation

try:
    from tensorflow_estimator.python.estimator import estimator as estimator_lib
    from tensorflow_estimator.python.estimator import extenders, keras_lib
    from tensorflow_estimator.python.estimator.export import export_lib
    from tensorflow_estimator.python.estimator.tpu import (
        tpu_config,
        tpu_context,
        tpu_estimator,
    )
except ImportError:
    # TensorFlow >= 2.16: no tensorflow_estimator. Only the strategy engine's modules import this
    # file there (tpushim._estimator_api gives the estimator); their Keras names come from tf_keras.
    ON_TF_KERAS = True
    estimator_lib = extenders = keras_lib = export_lib = None
    tpu_config = tpu_context = tpu_estimator = None
else:
    ON_TF_KERAS = False

if keras_lib is not None:
    # keras_lib helpers, reused so that tpushim clones, feeds and warm-starts exactly as stock does.
    convert_estimator_io_to_keras = keras_lib._convert_estimator_io_to_keras
    # Stock's check that a subclassed model rebuilds from its config (its errors, verbatim).
    assert_valid_model = keras_lib._assert_valid_model
    any_weight_initialized = keras_lib._any_weight_initialized
    FormattedKeyError = keras_lib.FormattedKeyError
    DEFAULT_SERVING_KEY = keras_lib._DEFAULT_SERVING_KEY
    maybe_overwrite_model_dir_and_session_config = (
        estimator_lib.maybe_overwrite_model_dir_and_session_config
    )
    from tensorflow_estimator.python.estimator.mode_keys import ModeKeys  # tf.estimator.ModeKeys

    EstimatorBase = estimator_lib.EstimatorV2  # tf.estimator.Estimator
else:  # the estimator API's twins (tpushim/_estimator_api/_keras.py wrote them from stock's)
    from tpushim._estimator_api import _config as _api_config
    from tpushim._estimator_api import _estimator as _api_estimator
    from tpushim._estimator_api import _keras as _api_keras

    convert_estimator_io_to_keras = _api_keras.keras_io
    assert_valid_model = _api_keras._assert_valid_model
    any_weight_initialized = _api_keras._any_weight_initialized
    DEFAULT_SERVING_KEY = _api_keras._SERVING_KEY
    maybe_overwrite_model_dir_and_session_config = (
        _api_config.overwrite_model_dir_and_session_config
    )
    ModeKeys = _api_config.ModeKeys
    EstimatorBase = _api_estimator.Estimator  # tf.estimator.Estimator there, with tpushim on


@tf.autograph.experimental.do_not_convert
def _keras(module):
    """Keras 2's private module ``module`` (e.g. ``engine.training_utils_v1``): in ``keras.src``
    (Keras 2.13-2.15), ``keras`` (Keras 2.12), or ``tf_keras.src`` (TensorFlow >= 2.16, where
    ``keras`` is Keras 3).

    Not converted by AutoGraph: the strategy engine's step (a ``tf.function``) reaches it through
    the loss helpers, and AutoGraph would follow ``importlib.import_module`` into the frozen
    ``_gcd_import`` and warn that it cannot (once per trace) -- there is nothing to convert.
    """
    import importlib

    if ON_TF_KERAS:
        return importlib.import_module(f"tf_keras.src.{module}")
    try:
        return importlib.import_module(f"keras.src.{module}")  # Keras >= 2.13 keeps it in keras.src
    except ImportError:
        return importlib.import_module(f"keras.{module}")  # Keras 2.12


def not_converted(function):
    """``function`` (tpushim's own graph-building code) marked as AutoGraph's own artifact: a
    ``tf.function``, ``Dataset.map``, ``strategy.run`` or ``tf.map_fn`` that reaches it calls it
    as it is, without converting its Python, and AutoGraph's status beneath it stays what it
    was. Not ``tf.autograph.experimental.do_not_convert``: that disables the status beneath, and
    Keras converts a user's layer ``call`` and loss function by the status, so the user's
    ``if tf.reduce_sum(x) > 0:`` would fail where stock converts it.

    Converting tpushim's functions cost the strategy engine most of its time to the first
    checkpoint (95 conversions, about 2 s for an MLP on TF 2.21: ``bench_first_checkpoint``).
    A marked function has no Python control flow on tensors (nor a builtin such as ``len`` or
    ``range`` given one), and calls the user's Python only through Keras (a model, layer, loss
    or metric object's call, which converts it by the status) or :func:`user_code`; so do the
    functions it calls, which run unconverted too. Where TensorFlow lacks the marker, the
    function is returned as it is (converted, as before)."""
    try:
        from tensorflow.python.autograph.impl.api import autograph_artifact
    except ImportError:
        return function
    return autograph_artifact(function)


def user_code(function):
    """The user's ``function`` (a loss object's ``call``) as converted code calls it, for a
    :func:`not_converted` function that calls it directly: converted by AutoGraph where its
    status is enabled (inside the engine's ``tf.function``s, and in the replica functions a
    strategy runs there, which keep their status: they are not marked), Keras's own code left as
    it is; called as it is elsewhere (the TPUEstimator path's graph, where no AutoGraph runs)."""
    autograph = tf.__internal__.autograph
    ctx = autograph.control_status_ctx()
    if ctx.status.name != "ENABLED":
        return function
    return autograph.tf_convert(function, ctx)


def save_first_checkpoint(keras_model, custom_objects, config, save_object_ckpt, on_graph=None):
    """keras_lib's ``_save_first_checkpoint`` (the Keras weights in ``model_dir/keras``, the warm
    start), step by step as stock, with every variable of its graph initialised before the save.
    ``on_graph``: called with the clone and the global step in that graph (stock's training
    graph) after the save, where it was built: the strategy engine reads its checkpoint names there.

    Keras initialises the variables it knows of: the model's and those its optimizer lists. A
    ``tf.compat.v1.train`` optimizer that wraps another (a gradient-clipping wrapper delegating
    ``compute_gradients`` / ``apply_gradients``) lists none of the inner one's slots, and stock's
    Saver then fails on them (``FailedPreconditionError: ... /Adagrad``). Their initial values
    are what the training graph gives them anyway: the warm start restores only what it finds.
    """
    import os

    import tensorflow as tf

    keras_model_dir = os.path.join(config.model_dir, "keras")
    latest_path = tf.train.latest_checkpoint(keras_model_dir)
    if latest_path:
        return latest_path
    keras_weights = keras_model.get_weights() if any_weight_initialized(keras_model) else None
    if not tf.compat.v1.gfile.IsDirectory(keras_model_dir):
        tf.compat.v1.gfile.MakeDirs(keras_model_dir)
    latest_path = os.path.join(keras_model_dir, "keras_model.ckpt")
    with tf.Graph().as_default():
        tf.compat.v1.random.set_random_seed(config.tf_random_seed)
        tf.compat.v1.train.create_global_step()
        model = keras_lib._clone_and_build_model(
            tf.estimator.ModeKeys.TRAIN, keras_model, custom_objects
        )
        model._make_train_function()  # before the session: it adds to the graph
        with tf.compat.v1.Session(config=config.session_config) as sess:
            if keras_weights:
                model.set_weights(keras_weights)
            keras_backend = getattr(tf.compat.v2.keras, "__internal__", None)
            if keras_backend is not None:  # stock's step (the graph's other variables: below)
                keras_backend.backend.initialize_variables(sess)
            variables = tf.compat.v1.global_variables()
            ready = sess.run([tf.compat.v1.is_variable_initialized(v) for v in variables])
            left = [v for v, done in zip(variables, ready) if not done]
            if left:  # made by an optimizer Keras does not see into
                sess.run(tf.compat.v1.variables_initializer(left))
            if save_object_ckpt:
                model._track_trackable(
                    tf.compat.v1.train.get_global_step(), "estimator_global_step"
                )
                model.save_weights(latest_path)
            else:
                tf.compat.v1.train.Saver().save(sess, latest_path)
        if on_graph is not None:
            on_graph(model, tf.compat.v1.train.get_global_step())
    return latest_path


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
            return keras_lib._clone_and_build_model(
                mode, keras_model, custom_objects, features, labels, optimizer_config
            )
        compile_args = keras_model._get_compile_args()
        keras_model._get_compile_args = lambda: dict(
            compile_args, metrics=None, weighted_metrics=None
        )
        try:
            return keras_lib._clone_and_build_model(
                mode, keras_model, custom_objects, features, labels, optimizer_config
            )
        finally:
            keras_model._get_compile_args = lambda: compile_args


# --- BatchNormalization layers: their call replaced while tpushim builds a clone ------------------

_batchnorm_call = contextvars.ContextVar("tpushim_batchnorm_call", default=None)


def batchnorm_base_class():
    """The base class of every Keras 2 BatchNormalization layer (v1, v2, SyncBatchNormalization)."""
    module = _keras("layers.normalization.batch_normalization")
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
    cloning = _keras("models.cloning")
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


@not_converted
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


@contextlib.contextmanager
def v1_summaries_skipped(skipped, on_scalar=None):
    """While active, TensorFlow's v1 summary functions (``tf.compat.v1.summary.scalar``,
    ``histogram``, ``image``, ``audio``, ``text``, ``tensor_summary``) make no op, in every
    thread (a strategy's replica threads too): their ``skip_summary`` check, the one a
    strategy's replicas after the first take, answers True. A ``scalar`` call's (name, tensor)
    goes to ``on_scalar`` where given; each call it does not take (returns falsy for) adds its
    (function, name) to the set ``skipped``."""
    from tensorflow.python.distribute import summary_op_util

    own = summary_op_util.skip_summary

    def skip():
        caller = sys._getframe(1)
        kind, name = caller.f_code.co_name, caller.f_locals.get("name")
        if (
            kind == "scalar"
            and on_scalar is not None
            and on_scalar(name, caller.f_locals["tensor"])
        ):
            return True
        skipped.add((kind, str(name)))
        return True

    summary_op_util.skip_summary = skip
    try:
        yield
    finally:
        if summary_op_util.skip_summary is skip:  # only ours: someone may have replaced it since
            summary_op_util.skip_summary = own


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
    return _keras("feature_column.dense_features").DenseFeatures


def dense_features_columns(layer):
    """A ``DenseFeatures`` layer's feature columns, in the order it concatenates them."""
    return layer._feature_columns


def dense_features_variable(layer, column, name):
    """The variable ``name`` a ``DenseFeatures`` layer made for ``column`` (one of its own)."""
    return layer._state_manager.get_variable(column, name)


def lookup_layer_classes():
    """Keras 2's preprocessing layers that look up or hash (a vocabulary table, string hashing):
    ops no TPU step compiles (the strategy engine runs them on the host, _strategy_host)."""
    return (
        _keras("layers.preprocessing.index_lookup").IndexLookup,
        _keras("layers.preprocessing.hashing").Hashing,
        _keras("layers.preprocessing.text_vectorization").TextVectorization,
    )


def random_layer_class():
    """The base class of Keras 2's layers that draw random numbers (Dropout, GaussianNoise, the
    random preprocessing layers)."""
    return _keras("engine.base_layer").BaseRandomLayer


def reads_training_mode(layer):
    """True when a layer's call takes the training mode (a ``Lambda``: its function does)."""
    lambda_class = _keras("layers.core.lambda_layer").Lambda
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
    import tensorflow as tf
    from tensorflow.python.eager import context

    keras_tensor = _keras("engine.keras_tensor").KerasTensor
    if all(isinstance(t, keras_tensor) for t in keras_model.inputs):
        return context.eager_mode()
    return tf.Graph().as_default() if graph else contextlib.nullcontext()


def functional_nodes(keras_model):
    """A functional model's call nodes (not its inputs), in the order its call runs them:
    ``(layer, input KerasTensors, output KerasTensors, node)``."""
    import tensorflow as tf

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
    import tensorflow as tf

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
    import tensorflow as tf

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
    import tensorflow as tf

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
    import tensorflow as tf

    return not (keras_model._is_graph_network or isinstance(keras_model, tf.keras.Sequential))


def subclassed_clone(keras_model):
    """A fresh copy of a subclassed model, made as stock's model_fn makes it (Keras's cloning:
    ``cls.from_config(model.get_config())``, unbuilt), its layers named as in stock's fresh
    graph (``dense``, ``dense_1``, ...) so its variables get stock's names under the model's;
    the names Keras gives the user's later layers are left as they were."""
    import collections

    import tensorflow as tf

    # A clone made in a graph (stock's, the loss plan's) leaves the class on its v1 bases:
    # the copy is an eager model, as Keras's next eager construction would make it.
    restore_v2_classes(keras_model)
    backend = _keras("backend")
    uids = backend.PER_GRAPH_OBJECT_NAME_UIDS
    # Keras numbers names per graph: layers' in the default graph's map, models' in its own
    # graph's (get_uid); stock's clone is made in a fresh graph, where both start from 0.
    graphs = {tf.compat.v1.get_default_graph(), backend.get_graph()}
    kept = {graph: uids.get(graph) for graph in graphs}
    for graph in graphs:
        uids[graph] = collections.defaultdict(int)
    try:
        return keras_model.__class__.from_config(keras_model.get_config())
    finally:
        for graph, map_ in kept.items():
            if map_ is None:
                del uids[graph]
            else:
                uids[graph] = map_


def generic_output_names(outputs):
    """The names stock's clone gives a subclassed model's outputs (``output_1``, ...)."""
    return _keras("engine.training_utils_v1").generic_output_names(outputs)


def overrides_step(keras_model):
    """The names of ``train_step`` / ``test_step`` / ``predict_step`` the model's class
    overrides (stock's estimator calls none of them: it builds its own graph from the model)."""
    import tensorflow as tf

    return [
        name
        for name in ("train_step", "test_step", "predict_step")
        if getattr(type(keras_model), name) is not getattr(tf.keras.Model, name)
    ]


def restore_subclassed_model_state(keras_model):
    """Undoes the in-place reset Keras applies to a subclassed model it cannot clone from its
    config, as stock's model_fn does after building (the user's model keeps its layers/optimizer)."""
    import tensorflow as tf

    if (
        not keras_model._is_graph_network
        and getattr(keras_model, "_original_attributes_cache", None) is not None
    ):
        tf.compat.v2.keras.__internal__.models.in_place_subclassed_model_state_restoration(
            keras_model
        )


def log_every_step_count_steps_on_cpu(estimator, config):
    """TPUEstimator(use_tpu=False) logs examples/sec every log_step_count_steps steps, as Estimator.

    TPUEstimator divides log_step_count_steps by iterations_per_loop, as one session.run is
    iterations_per_loop steps on a TPU. On CPU one run is one step, so with iterations_per_loop
    100 its ExamplesPerSecondHook fired at every step: one more session.run (the global step) and
    two summaries written to the event file per step. This touches only that hook's period.
    """
    if config is not None and estimator._log_every_n_steps is not None:
        estimator._log_every_n_steps = config.log_step_count_steps


def set_cluster_spec(run_config, cluster_spec):
    """Sets a RunConfig's ``cluster_spec`` (read-only in its API; the constructor derives it)."""
    run_config._cluster_spec = cluster_spec


def tpu_context_like(ctx, train_batch_size, eval_batch_size, predict_batch_size, config=None):
    """A TPU context (TPUEstimator's ``_ctx``) as ``ctx`` but for these global batch sizes (and
    ``config``, a ``tpu_config.RunConfig``, when given), sharing ``ctx``'s answer from the TPU
    system (asked once per master, then cached)."""
    new = tpu_context._get_tpu_context(
        ctx._config if config is None else config,
        train_batch_size,
        eval_batch_size,
        predict_batch_size,
        ctx._use_tpu,
        ctx._eval_on_tpu,
        None,
    )
    new._lazy_tpu_system_metadata_dict = ctx._lazy_tpu_system_metadata_dict
    return new


def place_ops(ops, device):
    """Places ``ops`` on ``device`` as if made in ``tf.device(device)``: what an op's own device
    says (e.g. ``/device:CPU:0``) is kept, the rest filled in from ``device``."""
    import tensorflow as tf

    outer = tf.DeviceSpec.from_string(device)
    for op in ops:
        op._set_device(outer.make_merged_spec(tf.DeviceSpec.from_string(op.device)))


def skip_batch_validation(ctx):
    """Marks a TPU context as validated, for every mode: its batch sizes are placeholders that no
    graph is built with (each call builds with a context made by :func:`tpu_context_like`, which
    TPUEstimator validates as usual)."""
    import tensorflow as tf

    modes = tf.estimator.ModeKeys
    ctx._lazy_validation_dict.update({modes.TRAIN: True, modes.EVAL: True, modes.PREDICT: True})


def tpu_context_config(ctx):
    """The ``tpu_config.RunConfig`` a TPU context builds with."""
    return ctx._config


def tpu_input_context(ctx, device):
    """The ``params['context']`` TPUEstimator gives the first input_fn invocation (host 0's)."""
    return tpu_context.TPUContext(
        internal_ctx=ctx, input_device=device, invocation_index=0, host_id=0
    )


def tpu_eval_steps_hooks(steps):
    """The session hooks with which TPUEstimator runs ``steps`` evaluation steps on a TPU (what
    its ``_convert_eval_steps_to_hooks`` returns)."""
    from tensorflow.python.training import evaluation

    return [
        evaluation._StopAfterNEvalsHook(num_evals=steps),
        tpu_estimator._SetEvalIterationsHook(steps),
    ]


def num_shards_in_replica_context():
    """The number of shards of the TPU computation being built (None outside one)."""
    return tpu_function.get_tpu_context().number_of_shards


def control_flow_context(graph):
    """The control-flow context ops are being built in (a loop, a cond branch, a TPU replicate
    computation): tensors made in one are usable only inside it. None at the top of a graph."""
    return graph._get_control_flow_context()


def keras_v1_tf_optimizer_class():
    """Keras's wrapper for a tf.compat.v1.train optimizer (``model.compile(optimizer=tf1_opt)``)."""
    optimizer_v1 = _keras("optimizers.optimizer_v1")
    return optimizer_v1.TFOptimizer


@not_converted
def losses_utils():
    """Keras's ``losses_utils`` module (``compute_weighted_loss``, ``ReductionV2``)."""
    module = _keras("utils.losses_utils")
    return module


def is_graph_network(keras_model):
    """True for a functional model (Sequential included once built); False for a subclassed one."""
    return keras_model._is_graph_network


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
    import tensorflow as tf

    compiled = keras_model.compiled_metrics
    if compiled._built:
        return
    training_utils_v1 = _keras("engine.training_utils_v1")
    names = keras_model.output_names
    losses = prepare_loss_functions(compile_args(keras_model).get("loss"), names)
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
            return _keras("metrics").MeanMetricWrapper(picked, name=metric)
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


def track_global_step(model):
    """Adds the global step to the model's object graph, under the name keras_lib's checkpoints use."""
    import tensorflow as tf

    model._track_trackable(tf.compat.v1.train.get_global_step(), "estimator_global_step")


def set_object_restore_saver(saver, model):
    """Lets a name-based Saver restore object-based checkpoints of ``model``, as keras_lib does."""
    from tensorflow.python.checkpoint import checkpoint

    saver._object_restore_saver = checkpoint.frozen_saver(model)


def update_op(value):
    """A metric's ``update_state`` result as TPUEstimator's ``(value, update_op)`` wants it.

    Keras 2.14+ returns an Operation in graph mode; Keras 2.13 returns the variable its last
    ``assign_add`` produced (an unread ResourceVariable), which is neither Tensor nor Operation:
    its ``op`` is that assignment, which runs after the metric's other updates.
    """
    import tensorflow as tf

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
    training_utils_v1 = _keras("engine.training_utils_v1")
    return training_utils_v1.call_metric_function(
        metric_fn, y_true, y_pred, weights=weights, mask=mask
    )


def add_metrics_parts(model_fn):
    """``(estimator, metric_fn)`` when ``model_fn`` is the one ``tf.estimator.add_metrics`` makes
    (extenders.py's ``new_model_fn``, a closure over both), else None."""
    code = getattr(model_fn, "__code__", None)
    if (
        code is None
        or code.co_name != "new_model_fn"
        or getattr(model_fn, "__module__", None) != extenders.__name__
    ):
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in model_fn.__closure__ or ())))
    if "estimator" not in cells or "metric_fn" not in cells:
        return None
    return cells["estimator"], cells["metric_fn"]


def estimator_of_model_fn(model_fn):
    """``(estimator, partial's args, partial's keywords)`` when ``model_fn`` is an estimator's own:
    ``estimator.model_fn`` (estimator.py's ``public_model_fn``, a closure over it) or a
    TPUEstimator's ``estimator._model_fn`` (tpu_estimator.py's ``_model_fn``), alone or in a
    ``functools.partial``; else None."""
    import functools

    args, keywords = (), {}
    if isinstance(model_fn, functools.partial):  # nested partials are flattened by partial itself
        model_fn, args, keywords = model_fn.func, model_fn.args, model_fn.keywords
    code = getattr(model_fn, "__code__", None)
    own = {("public_model_fn", estimator_lib.__name__), ("_model_fn", tpu_estimator.__name__)}
    if code is None or (code.co_name, getattr(model_fn, "__module__", None)) not in own:
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in model_fn.__closure__ or ())))
    estimator = cells.get("self")
    return None if estimator is None else (estimator, args, keywords)


def estimator_classes():
    """{class: its public name} of the estimator classes a script constructs."""
    return {
        estimator_lib.EstimatorV2: "tf.estimator.Estimator",
        estimator_lib.Estimator: "tf.compat.v1.estimator.Estimator",
        tpu_estimator.TPUEstimator: "tf.compat.v1.estimator.tpu.TPUEstimator",
    }


def leaf_paths(structure):
    """A readable path ("features/age") for every leaf of ``structure``, in ``tf.nest.flatten``
    order (the public ``tf.nest`` has no paths)."""
    from tensorflow.python.util import nest

    return [path for path, _ in nest.flatten_with_joined_string_paths(structure)]


def validate_eval_metric_ops(eval_metric_ops):
    """Stock's checks of ``eval_metric_ops`` (its errors, verbatim); Keras ``Metric`` objects
    become ``(result, update_op)`` and their variables local metric variables, as
    ``EstimatorSpec`` makes them (TensorFlow >= 2.16: tpushim's own ``EstimatorSpec``'s)."""
    if keras_lib is None:
        import tensorflow as tf

        spec = _api_config.EstimatorSpec(
            mode=ModeKeys.EVAL, loss=tf.constant(0.0), eval_metric_ops=eval_metric_ops
        )
        return spec.eval_metric_ops
    from tensorflow_estimator.python.estimator import model_fn as model_fn_lib

    return model_fn_lib._validate_eval_metric_ops(eval_metric_ops)


def warm_start_settings(estimator):
    """An estimator's ``WarmStartSettings`` (or None), as ``tf.estimator.add_metrics`` reads it."""
    return estimator._warm_start_settings


def per_output_metrics(model):
    """Per output: (unweighted {name: Metric}, weighted {name: Metric}) of a compiled clone."""
    return list(zip(model._per_output_metrics, model._per_output_weighted_metrics))


def fn_args(fn):
    """Argument names of a function, as Estimator reads them (functools.partial aware)."""
    from tensorflow.python.util import function_utils

    return function_utils.fn_args(fn)


def object_checkpoint_keys(keras_model):
    """{object-based checkpoint key: shape} of the model's own variables, computed in memory
    (the keys ``save_weights(save_format='tf')`` writes; optimizer state left out)."""
    import tensorflow as tf
    from tensorflow.python.checkpoint import graph_view, util

    objects, _, _, _, names = util.objects_ids_and_slot_variables_and_paths(
        graph_view.ObjectGraphView(keras_model)
    )
    return {
        names[o] + "/.ATTRIBUTES/VARIABLE_VALUE": o.shape.as_list()
        for o in objects
        if isinstance(o, tf.Variable) and names[o].split("/")[0] != "optimizer"
    }


def replace_enqueue_data(make_wrapper):
    """Sets ``make_wrapper(original)`` as ``feeding_functions._enqueue_data``, which fills
    numpy_input_fn's / pandas_input_fn's queues (both look it up by attribute at call time);
    returns a function that restores the original (unless someone replaced the wrapper since).
    On TensorFlow >= 2.16 the same for tpushim's own input_fns (tpushim/_estimator_api/_inputs.py):
    their ``_enqueue``, which takes the arguments of the same names (no ``seed``, ``pad_value``)."""
    if ON_TF_KERAS:
        from tpushim._estimator_api import _inputs as module

        name = "_enqueue"
    else:
        from tensorflow_estimator.python.estimator.inputs.queues import feeding_functions as module

        name = "_enqueue_data"
    original = getattr(module, name)
    wrapper = make_wrapper(original)
    setattr(module, name, wrapper)

    def restore():
        if getattr(module, name) is wrapper:
            setattr(module, name, original)

    return restore


def feeding_start_rows(runner):
    """The row each feeding thread of a numpy_input_fn / pandas_input_fn queue runner starts at
    (drawn when the input_fn built it; the runner never started), or [] for another runner."""
    if ON_TF_KERAS:
        from tpushim._estimator_api import _inputs

        if not isinstance(runner, _inputs._FeedingQueueRunner):
            return []
        return [feeder.start for feeder in runner._feeds.values()]
    from tensorflow_estimator.python.estimator.inputs.queues import feeding_queue_runner

    if not isinstance(runner, feeding_queue_runner._FeedingQueueRunner):
        return []
    return [getattr(feed_fn, "_trav", None) for feed_fn in runner._feed_fns]


def dataset_initializer_hook_classes():
    """The session hooks that initialise an estimator's input iterator when its session starts:
    Estimator's (``parse_input_fn_result``, on CPU) and TPUEstimator's (one for every TPU host's
    iterator, made in ``_InputPipeline``). Both run the initializer without a feed."""
    from tensorflow_estimator.python.estimator import util as estimator_util
    from tensorflow_estimator.python.estimator.tpu import util as tpu_util

    return (estimator_util._DatasetInitializerHook, tpu_util.MultiHostDatasetInitializerHook)


def function_def(graph, name):
    """The FunctionDef of function ``name`` in ``graph``'s library (a Dataset's map function,
    say), or None."""
    function = graph._get_function(name) if graph is not None else None
    return getattr(function, "definition", None) if function is not None else None


def dataset_variant_op(dataset):
    """The graph op that makes ``dataset`` (its last transformation), or None where there is none."""
    try:
        return dataset._variant_tensor.op
    except (AttributeError, ValueError):
        return None


# --- the training loss, term by term (tpushim/_loss_kinds.py, tpushim/_losses.py) -------------


def prepare_loss_functions(loss, output_names):
    """The per-output Loss objects a v1-graph clone compiles ``loss`` into (Keras wraps every
    function in a ``LossFunctionWrapper`` with reduction AUTO), in ``output_names``' order."""
    training_utils_v1 = _keras("engine.training_utils_v1")
    return training_utils_v1.prepare_loss_functions(loss, output_names)


def compile_args(keras_model):
    """The arguments ``compile()`` was given (``loss``, ``loss_weights``, ...), as cloning reads them."""
    with _clone_lock:  # not the metric-less ones another thread's clone pins for its block
        return keras_model._get_compile_args()


def name_metric_objects_as_a_compile(keras_model):
    """Names the Metric objects a multi-output model was compiled with as one more compile of a
    clone names them: Keras prefixes a shared object's name with its output's (training_v1's
    ``_set_per_output_metric_attributes``), so each of stock's train and evaluate model_fn calls
    adds one prefix (``reg_reg_reg_root_mean_squared_error`` at a first evaluate() after a first
    train()), and stock's evaluate() reports that name. Metrics given per output (a dict, or a
    list per output) only; strings and functions are made afresh each time."""
    args = compile_args(keras_model)
    names = list(keras_model.output_names or ())
    if len(names) < 2:
        return
    Metric = _keras("metrics.base_metric").Metric
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
    return _keras("metrics.base_metric").clone_metrics(metrics)


def keras_loss_modules():
    """The modules Keras's built-in losses live in (``tf.keras.losses``' functions and classes)."""
    import tensorflow as tf

    return {tf.keras.losses.mean_squared_error.__module__, tf.keras.losses.Loss.__module__}


def loss_function_wrapper_class():
    """Keras's ``LossFunctionWrapper``: a Loss around a function (``fn``)."""
    LossFunctionWrapper = _keras("losses").LossFunctionWrapper
    return LossFunctionWrapper


def add_loss_layer_class():
    """The layer ``model.add_loss(symbolic tensor)`` becomes in a functional model."""
    AddLoss = _keras("engine.base_layer").AddLoss
    return AddLoss


@not_converted
def all_layers(keras_model):
    """The model and every layer in it, nested models' layers included, in Keras's order."""
    return list(keras_model._flatten_layers(include_self=True, recursive=True))


@contextlib.contextmanager
def call_losses_kept(keras_model):
    """Each layer's losses from its last call (``add_loss`` of a tensor in ``call``) as they were
    before, after a trace of the model in a ``tf.function``: calling the model clears them and
    keeps the trace's, tensors of a graph that is never run."""
    kept = [(layer, layer._eager_losses) for layer in all_layers(keras_model)]
    try:
        yield
    finally:
        for layer, losses in kept:
            layer._eager_losses = losses


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
    version_utils = _keras("utils.version_utils")
    models = (_keras("engine.training").Model, _keras("engine.training_v1").Model)
    layers = (_keras("engine.base_layer").Layer, _keras("engine.base_layer_v1").Layer)
    for layer in all_layers(keras_model):
        if isinstance(layer, models):  # a Model's class swaps its Model base, then its Layer base
            version_utils.swap_class(type(layer), *models, use_v2=True)
        version_utils.swap_class(type(layer), *layers, use_v2=True)


def layer_input_losses(layer):
    """The losses a layer added from what it was called on (activity regularizers, ``add_loss``
    of a tensor): its own, not its sublayers'; weight regularizers are kept apart (callables)."""
    return list(layer._losses)


def activity_loss_count(layer):
    """How many of a graph network layer's input losses (:func:`layer_input_losses`) its
    activity regularizer added: one per output of each of its calls in the model's graph."""
    if getattr(layer, "activity_regularizer", None) is None:
        return 0
    import tensorflow as tf

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


@not_converted
def layer_call_losses(layer):
    """The losses a layer added from its inputs in its latest call eagerly or in a
    ``tf.function`` (Keras keeps them per thread, apart from its construction's, which
    :func:`layer_input_losses` gives; cleared at each outermost call)."""
    return list(layer._eager_losses)


@not_converted
def weight_regularizers(model):
    """The model's weight regularization terms, evaluated now (Keras's callable losses)."""
    values = [fn() for layer in all_layers(model) for fn in layer._callable_losses]
    return [value for value in values if value is not None]


def clone_for_inspection(keras_model, custom_objects, input_tensors=None):
    """An uncompiled clone in the current (scratch) graph, built as the model_fn's clone is
    (keras_lib's cloning): a functional model on fresh placeholders; a subclassed model called
    on ``input_tensors`` (Keras may reset it in place: see :func:`restore_subclassed_model_state`).

    As Keras's cloning does for a compiled clone (which stock's conversion makes next), the
    model's compile arguments are pinned first: cloning in a graph can turn the model's class
    into its v1 twin, whose own ``_get_compile_args`` then fails.
    """
    import tensorflow as tf

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


def output_masks(model):
    """Per output, the Keras mask a compiled clone weights its loss with (None: no mask)."""
    return [getattr(output, "_keras_mask", None) for output in model.outputs]


def restore_v2_classes(keras_model, v1=False):
    """Undoes what a clone in a graph does to an eager model's classes: Keras makes a model or
    layer in a graph by swapping its class's bases to their v1 twins in place
    (``version_utils.swap_class``), for every instance of the class, the user's eager model too,
    until the next one is made eagerly (whose v1 ``get_weights`` then fails, for one). Swaps them
    back, as Keras's own next eager construction would. ``v1``: the other way, for a model made
    in a graph (a program that disabled v2 behaviour) after a clone made eagerly."""
    version_utils = _keras("utils.version_utils")
    model_classes = (_keras("engine.training").Model, _keras("engine.training_v1").Model)
    layer_classes = (_keras("engine.base_layer").Layer, _keras("engine.base_layer_v1").Layer)
    for layer in all_layers(keras_model):
        if isinstance(layer, model_classes[0]):
            version_utils.swap_class(type(layer), *model_classes, not v1)
        # A model's too: the v1 swap reaches Model's own base Layer (a subclassed model's clone).
        version_utils.swap_class(type(layer), *layer_classes, not v1)


def standardize_sample_weights(sample_weights, output_names):
    """``{"features", "sample_weights"}`` features' weights as one entry per output (None: no
    weight), as keras_lib maps them (``training_utils_v1.standardize_sample_weights``)."""
    return _keras("engine.training_utils_v1").standardize_sample_weights(
        sample_weights, output_names
    )


def added_losses(model):
    """The regularization and ``add_loss`` terms Keras adds to a compiled clone's total loss."""
    return model.get_losses_for(None) + model.get_losses_for(model.inputs)


def reachable_from(inputs, targets):
    """The tensors and ops of ``targets`` that depend on ``inputs`` (a graph walk, as Keras's
    ``get_losses_for`` does it)."""
    keras_tf_utils = _keras("utils.tf_utils")
    return keras_tf_utils.get_reachable_from_inputs(inputs, targets)


def replace_total_loss(model, loss):
    """Makes ``loss`` what a compiled v1-graph clone's train function differentiates (set
    before ``make_train_function``, after :func:`settle_sample_weights`, so Keras does not
    recompile it)."""
    model.total_loss = loss


_random_state_lock = threading.RLock()


class keras_random_state_kept:
    """A context in which Keras may make layers (each draws a seed for its initializers and
    dropout from Keras's seed generator, or Python's ``random``) without moving the seeds the
    layers made afterwards get: an inspection must not change what a seeded run trains.

    Keras's seed generator is per thread; Python's ``random`` is per process, so tpushim's blocks
    in different threads take turns (a lock), and only nest within one thread.
    """

    def __enter__(self):
        import random

        backend = _keras("backend")
        _random_state_lock.acquire()
        self._generator = getattr(backend._SEED_GENERATOR, "generator", None)
        self._states = (
            random.getstate(),
            None if self._generator is None else self._generator.getstate(),
        )
        return self

    def __exit__(self, *exc):
        import random

        try:
            random.setstate(self._states[0])
            if self._generator is not None:
                self._generator.setstate(self._states[1])
        finally:
            _random_state_lock.release()


def compiler_ir(function, *args, stage="hlo"):
    """``function``'s (a ``jit_compile`` ``tf.function``) compiler IR for ``args``, for the
    device an eager op runs on, without taking an op seed from the program's random state.

    Asked for no device, ``experimental_get_compiler_ir`` finds it by running an unseeded
    ``random_normal([])`` eagerly (``compiler_ir.maybe_get_device_name``, TF 2.15 and 2.21): in
    a program that called ``tf.random.set_seed`` that takes the eager context's next op seed
    (the one the program's next unseeded random op would get), and leaves that seed's kernel,
    its stream advanced, in the context's cache. A stateless op finds the same device and
    draws nothing. (TF >= 2.16 calls ``device_name`` deprecated, in favour of a
    ``platform_name`` that still runs the random op: its warning is left out.)
    """
    import warnings

    import tensorflow as tf

    device = tf.random.stateless_normal([], seed=[0, 0]).device
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "device_name is being deprecated", UserWarning)
        return function.experimental_get_compiler_ir(*args)(stage=stage, device_name=device)


# --- a pod's input (tpushim/_pods.py) ----------------------------------------------------------


def graph_seeds(graph):
    """``(graph seed, op-seed counter)`` of a graph: what the next random op made in it without a
    seed of its own is seeded from (``random_seed.get_seed``). The counter is None where this
    TensorFlow keeps none to read (ops then derive their seeds from graph state no one can reset).
    """
    from tensorflow.python.framework import random_seed

    counters = getattr(random_seed, "_graph_to_seed_dict", None)  # TF >= 2.5
    return graph.seed, None if counters is None else counters.get(graph, 0)


def set_graph_seeds(graph, seeds):
    """Sets what :func:`graph_seeds` reads: the random ops made next are seeded as they would
    have been when the graph was in that state."""
    from tensorflow.python.framework import random_seed

    seed, counter = seeds
    graph.seed = seed
    counters = getattr(random_seed, "_graph_to_seed_dict", None)
    if counters is not None and counter is not None:
        counters[graph] = counter


def update_input(op, index, tensor):
    """Makes ``tensor`` input ``index`` of ``op`` (a graph being built): a host's copy of a
    pipeline then reads that host's file names."""
    op._update_input(index, tensor)


def add_control_input(op, control):
    """Makes ``op`` (a graph being built) wait for ``control`` to run first: the input wait's
    timestamp before a batch read made earlier (:mod:`tpushim._input_wait`)."""
    op._add_control_input(control)


def set_string_attr(op, name, value):
    """Sets a string attribute (bytes) of an op in a graph being built (e.g. a dataset op's
    ``deterministic``)."""
    from tensorflow.core.framework import attr_value_pb2

    op._set_attr(name, attr_value_pb2.AttrValue(s=value))


def global_step_read():
    """The read of the global step that Estimator's hooks fetch with each training step (created
    and cached in the graph when missing)."""
    from tensorflow.python.training import training_util

    return training_util._get_or_create_global_step_read()


def replaced_tpu_system_query():
    """TensorFlow's TPU system query (``tpu_system_metadata._query_tpu_system_metadata``, which
    TPUEstimator's TPU context sends to its master) when someone replaced it -- the preflight's
    faked TPU system answers it for its own masters --, or None while it is TensorFlow's own."""
    from tensorflow.python.tpu import tpu_system_metadata as module

    query = module._query_tpu_system_metadata
    return None if getattr(query, "__module__", None) == module.__name__ else query


# --- TensorFlow's deprecation warnings, for tpushim's own calls -----------------------------------

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


class _WarnOutsideTpushim:
    """What ``tensorflow.python.util.deprecation._PRINT_DEPRECATION_WARNINGS`` becomes: true (as
    TensorFlow had it) except where the deprecated name is called from tpushim's own code.

    Every deprecated TensorFlow name checks that flag, in its wrapper, before it logs its
    ``From <caller>: X is deprecated`` lines and marks X as warned (once per process): so a call
    tpushim makes (``TPUConfig``, ``TPUEstimator``, ``TPUEstimatorSpec``, ...: about 70 lines a
    run) neither prints nor uses up the warning a user's own call of X then gets, exactly as
    without tpushim. Per call site, as the wrapper's own ``_call_location`` reads it -- not
    ``deprecation.silence()``, which turns the flag off for every thread (and the user's model
    code run inside tpushim's model_fn) while it is held; ``silence()`` still works over this.
    """

    def __init__(self, value):
        self.value = value

    def __bool__(self):
        if not self.value:
            return False
        # 0: here, 1: the deprecation wrapper testing the flag, 2: the code that called X.
        try:
            caller = sys._getframe(2)
        except ValueError:  # read from the top of a stack: no caller of ours
            return True
        return not caller.f_code.co_filename.startswith(_PACKAGE)

    def __repr__(self):
        return f"{type(self).__name__}({self.value!r})"


def silence_own_deprecation_warnings():
    """Installs :class:`_WarnOutsideTpushim` (once; idempotent)."""
    from tensorflow.python.util import deprecation

    current = deprecation._PRINT_DEPRECATION_WARNINGS
    if not isinstance(current, _WarnOutsideTpushim):
        deprecation._PRINT_DEPRECATION_WARNINGS = _WarnOutsideTpushim(current)


# Before any of tpushim's calls: importing this module is the first thing a conversion does.
silence_own_deprecation_warnings()
# --- the strategy engine (tpushim/_strategy/) ---------------------------------------------------

# Stock's Keras model_fn: the strategy engine's estimator keeps it as its model_fn, so that what
# the base Estimator builds from it (export_saved_model, add_metrics) is stock's.
create_keras_model_fn = (
    keras_lib._create_keras_model_fn if keras_lib is not None else _api_keras._model_fn_for
)


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
    import tensorflow as tf

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
    return keras_v1_tf_optimizer_class()(tf1_optimizer, iterations)


def create_tf1_optimizer_slots(optimizer, variables):
    """Creates a ``tf.compat.v1.train`` optimizer's slots and non-slot variables for
    ``variables`` now (its ``apply_gradients`` would on the first step), so a checkpoint restores
    them at once."""
    optimizer._create_slots(list(variables))


def tf1_optimizer_hyperparameters(optimizer):
    """``(name, value)`` of a ``tf.compat.v1.train`` optimizer's hyperparameters that stock
    evaluates in its model_fn's graph (a tensor, a variable or a callable: the optimizer's
    ``_call_if_callable``); plain numbers are left out. Names without their underscore."""
    import tensorflow as tf

    return [
        (name.lstrip("_"), value)
        for name, value in vars(optimizer).items()
        if not name.startswith("_self_")
        and name not in ("_slots", "_non_slot_dict", "_deferred_slot_restorations")
        # what ``_prepare`` made of them at the last apply (replaced at the next): not inputs
        and not name.endswith(("_t", "_tensor"))
        and (isinstance(value, (tf.Tensor, tf.Variable)) or callable(value))
    ]


def track_estimator_step(model, step):
    """Adds ``step`` to the model's object graph under the name keras_lib's checkpoints give the
    global step (an eager variable; :func:`track_global_step` takes the graph's)."""
    model._track_trackable(step, "estimator_global_step")


def input_replicas(strategy, options):
    """Per input pipeline (one per TPU host), the replicas it feeds, as indices into the
    strategy's replica order: each input worker feeds the TPU devices of its host
    (``TPUExtended._get_input_workers``), and ``worker_devices`` lists every replica's device in
    replica order. None where this TensorFlow keeps neither."""
    extended = strategy.extended
    try:
        workers = extended._get_input_workers(options)
        devices = list(extended.worker_devices)
        return tuple(
            tuple(devices.index(d) for d in workers.compute_devices_for_worker(w))
            for w in range(workers.num_workers)
        )
    except (AttributeError, ValueError, TypeError):
        return None


def serialized_dataset(dataset):
    """The GraphDef (a string tensor, in ``dataset``'s graph) of a Dataset built in a graph: read
    by a session, ``tf.raw_ops.DatasetFromGraph`` makes the same Dataset eagerly (how tf.data
    moves a pipeline between hosts and to its service)."""
    return dataset._as_serialized_graph()


# --- SessionRunHooks on the strategy engine (tpushim/_strategy/events.py foresees their stops) -------


def stop_at_step_last(hook):
    """The step a ``tf.compat.v1.train.StopAtStepHook`` stops at (known after its
    ``after_create_session``), or None for any other hook."""
    import tensorflow as tf

    if isinstance(hook, tf.compat.v1.train.StopAtStepHook):
        return hook._last_step
    return None


def early_stopping_timer(hook):
    """The ``SecondOrStepTimer`` on which ``tf.estimator.experimental``'s early-stopping hook
    (``_StopOnPredicateHook``, stock's or tpushim's) checks its predicate, and whether it
    runs on a clock (``run_every_secs``); (None, None) for any other hook."""
    if type(hook).__name__ != "_StopOnPredicateHook":
        return None, None
    timer = hook._timer
    return timer, timer._every_secs is not None


# --- the strategy engine's checkpoints in stock's names (tpushim/_strategy_checkpoint.py) --------


def checkpoint_variables(root):
    """{object path: variable} of every variable a ``tf.train.Checkpoint(root)`` saves, optimizer
    slots included, each at the path that makes its key (``layer_with_weights-0/kernel``, then
    ``/.ATTRIBUTES/VARIABLE_VALUE``): TensorFlow's own traversal for a checkpoint."""
    import tensorflow as tf
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


def stock_training_graph(keras_model, custom_objects, features=None, object_based=True):
    """:func:`stock_checkpoint_names`'s two values, then that graph (its model, optimizer and
    global step) and its MetaGraphDef carrying the Saver stock's Keras estimator restores with
    (keras_lib's: an object-based one over the model's saveables, or the Scaffold's default
    name-based one): what ``graph.pbtxt``, the events' graph and ``model.ckpt-N.meta`` hold;
    then the tags of the model's own v1 scalar summaries there, in the order it made them, and
    its compiled metrics' names (:func:`graph_facts`). Built with its optimizer's variables, not its gradients, where the
    optimizer allows (:func:`make_train_variables`)."""
    import tensorflow as tf

    with tf.Graph().as_default():
        step = tf.compat.v1.train.create_global_step()
        if features is not None:
            features = tf.nest.map_structure(
                lambda s: tf.compat.v1.placeholder(s.dtype, [None, *s.shape[1:]]), features
            )
        if keras_lib is not None:
            model = clone_and_build_model(ModeKeys.TRAIN, keras_model, custom_objects, features)
        else:
            model = _api_keras._clone(ModeKeys.TRAIN, keras_model, custom_objects, features)
        make_train_variables(model)
        facts = graph_facts(model, step, object_based)
    restore_v2_classes(keras_model)  # the clone in a graph swapped the eager classes' bases
    return facts


def graph_facts(model, step, object_based):
    """In the graph of a clone ``model`` in stock's training graph (``step``: its global step):
    :func:`graph_checkpoint_names`'s two values, the graph, its MetaGraphDef carrying the Saver
    stock's Keras estimator restores with (keras_lib's: an object-based one over the model's
    saveables, or the Scaffold's default name-based one), the tags of the model's own v1
    scalar summaries there, in the order it made them, and the names stock's model_fn gives
    the clone's compiled metrics (``metric_names_map``'s keys), in Keras's order."""
    import tensorflow as tf
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
    metrics = [m.name for m in getattr(model, "_compile_metric_functions", None) or ()]
    return names, unmatched, graph, meta, scalars, metrics


def make_train_variables(model):
    """Creates in a compiled clone's graph the variables Keras's train function creates (the
    optimizer's slots and hyperparameters), as it names them, without its gradients and updates
    where the optimizer allows: a Keras optimizer whose ``get_updates`` and ``apply_gradients``
    are the base class's creates them all in ``apply_gradients``, by ``_create_all_weights`` of
    the trainable weights under ``training/`` and its own name scope (optimizer_v2.py). Any other
    (a loss-scale wrapper, a ``tf.compat.v1.train`` optimizer) gets the whole train function."""
    import tensorflow as tf

    base = _keras("optimizers.legacy.optimizer_v2").OptimizerV2
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
    import tensorflow as tf

    track_estimator_step(model, step)
    names = {path: v.op.name for path, v in checkpoint_variables(model).items()}
    unmatched = {v.op.name for v in tf.compat.v1.global_variables()} - set(names.values())
    return names, sorted(unmatched)


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
    import tensorflow as tf

    if how == "keras_logits":
        if not hasattr(y_pred, "_keras_logits"):
            y_pred = tf.identity(y_pred)
            y_pred._keras_logits = logits
        return y_pred
    if y_pred.op.type == how:
        return y_pred
    return {"Sigmoid": tf.math.sigmoid, "Softmax": tf.nn.softmax}[how](logits)


def feature_column_layers(keras_model):
    """Names of the model's ``DenseFeatures`` layers with a column that looks up or hashes its
    feature (a vocabulary table, string hashing, a cross): ops no TPU step compiles."""
    from tensorflow.python.feature_column import feature_column_v2 as fc

    dense_features = _keras("feature_column.dense_features").DenseFeatures
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


_PROGRAM_SHAPES = []  # the program's TensorShape behaviour, per eager_runtime entered


@contextlib.contextmanager
def eager_runtime():
    """A context in which TensorFlow executes eagerly although the program disabled it
    (``tf.compat.v1.disable_v2_behavior()``), with TF2's TensorShape (``shape[0]`` an int, as
    the engine reads it): ``context.eager_mode()`` and the v2 TensorShape switch, both as the
    program had them on exit. The program's other v1 behaviours stay; its own code (an
    input_fn) sees its TensorShape again within :func:`programs_shapes`."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import tensor_shape

    before = tensor_shape._TENSORSHAPE_V2_OVERRIDE
    _PROGRAM_SHAPES.append(before)
    tensor_shape._TENSORSHAPE_V2_OVERRIDE = True
    try:
        with context.eager_mode():
            yield
    finally:
        tensor_shape._TENSORSHAPE_V2_OVERRIDE = before
        _PROGRAM_SHAPES.pop()


def for_graph_program():
    """True within :func:`eager_runtime`: the engine runs for a program that disabled v2
    behaviour."""
    return bool(_PROGRAM_SHAPES)


@contextlib.contextmanager
def programs_shapes():
    """Within :func:`eager_runtime`, the program's own TensorShape behaviour (``Dimension``s
    where it disabled v2 behaviour: ``shape[1].value``), for its code; elsewhere nothing."""
    from tensorflow.python.framework import tensor_shape

    if not _PROGRAM_SHAPES:
        yield
        return
    inside = tensor_shape._TENSORSHAPE_V2_OVERRIDE
    tensor_shape._TENSORSHAPE_V2_OVERRIDE = _PROGRAM_SHAPES[-1]
    try:
        yield
    finally:
        tensor_shape._TENSORSHAPE_V2_OVERRIDE = inside


def in_programs_shapes(fn):
    """``fn`` run within :func:`programs_shapes`: the program's own code (a ``Lambda``'s
    function, a loss function) sees the TensorShape its program had (``shape[1].value``) where
    the engine's eager clone calls it; elsewhere ``fn`` as it is."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with programs_shapes():
            return fn(*args, **kwargs)

    return run


def clone_layer_in_programs_shapes(layer):
    """``tf.keras.models.clone_model``'s ``clone_function`` for the engine's clone of a graph
    program's model: each layer copied from its config as Keras copies it, a ``Lambda``'s
    function run as the program built it (:func:`in_programs_shapes`: its ``shape[1].value``
    reads a Dimension), from the clone's first call on."""
    copy = layer.__class__.from_config(layer.get_config())
    if type(copy).__name__ == "Lambda" and callable(getattr(copy, "function", None)):
        copy.function = in_programs_shapes(copy.function)
    return copy


def loss_in_programs_shapes(loss):
    """A copy of a compiled Loss object whose own code (a wrapped function, a subclass's
    ``call``) runs as the program built it (:func:`in_programs_shapes`); the user's object is
    not changed."""
    import copy

    own = copy.copy(loss)
    if callable(getattr(own, "fn", None)):  # LossFunctionWrapper: a function given to compile
        own.fn = in_programs_shapes(own.fn)
    else:  # a Loss subclass: its call
        own.call = in_programs_shapes(own.call)
    return own


def first_checkpoint_values(keras_model, custom_objects, path):
    """The trainable weights' values in the warm-start checkpoint at ``path`` (stock's first
    checkpoint, :func:`save_first_checkpoint`'s, either format), read into a clone built as
    stock builds it, in a graph and session of its own (the program's Keras session untouched).
    """
    import tensorflow as tf

    clone = keras_lib._clone_and_build_model if keras_lib is not None else _api_keras._clone
    with tf.Graph().as_default():
        tf.compat.v1.train.create_global_step()
        model = clone(ModeKeys.TRAIN, keras_model, custom_objects)
        model._make_train_function()  # the optimizer's variables, as in the checkpoint
        with tf.compat.v1.Session() as session:
            # Saver reads a name-based checkpoint, and an object-based one by its object graph.
            tf.compat.v1.train.Saver().restore(session, path)
            return session.run(model.trainable_weights)


def v1_metric_names(keras_model):
    """The names of a model's compiled metrics as stock's estimator names them when the model
    was compiled in a graph (Keras's v1 training: ``acc`` for ``'accuracy'`` once v2 behaviour
    is disabled), in Keras's order; None where the model keeps none."""
    functions = getattr(keras_model, "_compile_metric_functions", None)
    return None if functions is None else [m.name for m in functions]
