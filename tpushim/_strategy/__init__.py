"""The strategy engine: the converted estimator trains, evaluates and predicts the Keras model
under a ``tf.distribute`` strategy in TF2 (``tf.function`` on the eager runtime), where
TPUEstimator (TF1 sessions) cannot run: PJRT TPU runtimes and TensorFlow >= 2.16.

One concern, the engine's run of a call, in about 900 lines: building the clone in the strategy's
scope, the per-replica loss, the step, the input split over replicas, and stock-format
checkpoints depend on one another (the loss is normalised by the rows the input split carries,
the checkpoint names are the clone's object graph), so they stay together.

Why the result subclasses the stock ``tf.estimator.Estimator``: a script reads ``model_dir``,
``config``, ``latest_checkpoint()``, ``get_variable_value()``; ``train_and_evaluate`` calls
``train``/``evaluate``; ``export_saved_model`` builds stock's Keras model_fn and restores the
latest checkpoint. Those all come from the base class unchanged, because the checkpoints this
engine writes are the stock estimator's, in the format ``checkpoint_format`` asked for, with
stock's keys and names (:mod:`tpushim._strategy_checkpoint`). Only ``train``, ``evaluate`` and
``predict`` are replaced.

Gradients: replica r differentiates ``L_r``, its rows' share of stock's loss on the global
batch (a mean's sum over its rows divided by the global batch's real rows; a sum as it is; a
custom one-number term per row, scaled by its degree: :mod:`tpushim._loss_kinds`); the Keras
optimizer sums the replicas' gradients (``all_reduce_sum_gradients``), so the applied gradient
is stock's on the global batch. Padding rows (a short batch padded to the global batch,
:mod:`tpushim._padding`) weigh 0 everywhere.
"""

import contextlib
import dataclasses
import functools
import logging
import math
import os
import threading
import time
import types
import weakref

import numpy as np
import tensorflow as tf

from tpushim import (
    _batchnorm,
    _input_wait,
    _loss_kinds,
    _losses,
    _observe,
    _padding,
    _plan,
    _shapes,
    _tfprivate,
)
from tpushim._errors import ConversionError
from tpushim._strategy import checkpoint as _strategy_checkpoint
from tpushim._strategy import events as _step_events
from tpushim._strategy import host as _strategy_host
from tpushim._strategy import input as _strategy_input
from tpushim._strategy import metrics as _strategy_metrics
from tpushim._strategy.input import batch_size_of, distributed_input  # noqa: F401  (its names)

logger = logging.getLogger("tpushim")

ModeKeys = _tfprivate.ModeKeys
SUM = tf.distribute.ReduceOp.SUM
Reduction = tf.keras.losses.Reduction

_TPU_STRATEGIES = {}  # master -> TPUStrategy: a TPU system is initialised once per process
_CPU_STRATEGIES = {}  # device names -> MirroredStrategy (see cpu_strategy)


def cpu_strategy():
    """TPUStrategy's data-parallel semantics here: a MirroredStrategy over every GPU, else every
    logical CPU device (8 of them where ``tf.config.set_logical_device_configuration`` made 8).

    One per process and device set, as the TPU's: each strategy numbers its collective ops from
    1, and TensorFlow keeps the shape of each (group, instance) it has run, so a second strategy
    whose calls trace in another order (train twice, where the first evaluated) reuses a number
    with another shape and fails ("Shape mismatch in the collective instance")."""
    names = tuple(
        d.name
        for d in tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
    )
    if names not in _CPU_STRATEGIES:
        _CPU_STRATEGIES[names] = tf.distribute.MirroredStrategy(list(names))
    return _CPU_STRATEGIES[names]


def tpu_strategy(resolver):
    """``tf.distribute.TPUStrategy`` on ``resolver``'s TPU, set up as TensorFlow's migration
    guide (guide/migrate/tpu_estimator) does; once per TPU in a process."""
    key = resolver.master()
    if key not in _TPU_STRATEGIES:
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        _TPU_STRATEGIES[key] = tf.distribute.TPUStrategy(resolver)
    return _TPU_STRATEGIES[key]


class Plan:
    """What the engine takes from a conversion (fixed when it is made).

    Attributes:
      keras_model: the user's compiled Keras model (a graph network).
      optimizer: its optimizer as stock trains it (Keras's legacy optimizer).
      custom_objects: as given to ``model_to_estimator``.
      loss_kinds: output name -> ``ROWS`` or a degree (:func:`tpushim._loss_kinds.plan`).
      added_degrees: (layer name, index) -> degree of each loss a layer adds from its inputs
        (absent: 0, a mean).
      warm_start: the trainable weights' values at conversion (stock warm-starts the trainable
        variables from the Keras weights), or None.
      batch_size: the global batch size, or None (read from the input).
      steps_per_execution: training steps per ``tf.function`` call (iterations_per_loop).
      jit_compile: check, where the strategy is not a TPU's, that a replica's training step
        compiles with XLA (on a TPU, TPUStrategy compiles every step with XLA itself).
      make_strategy: a function returning the strategy (built at the first call).
      conversion: the :class:`tpushim._plan.ConversionPlan` both engines take (settings, TPU,
        loss plan, warm start): ``batch_size``, ``steps_per_execution`` and ``loss_kinds`` are
        read from it; its TPU and warm start are added once the conversion has them.
      pod_input: how a pod's hosts read the input (``auto``, ``exact``, ``files``:
        :mod:`tpushim._strategy_input`).
      name_based_checkpoints: write stock's name-based checkpoints (``checkpoint_format='saver'``)
        rather than object-based ones (:mod:`tpushim._strategy_checkpoint`); set by the estimator.
      host: the :class:`tpushim._strategy_host.HostPart` (strings, lookups), or None.
      metric_names_map: model_to_estimator's (None: stock's names), set by the conversion.
    """

    def __init__(
        self,
        keras_model,
        optimizer,
        custom_objects,
        loss_kinds,
        added_degrees,
        warm_start,
        batch_size,
        steps_per_execution,
        jit_compile,
        make_strategy,
        pod_input="auto",
    ):
        self.keras_model = keras_model
        self.optimizer = optimizer
        self.custom_objects = custom_objects or {}
        self.loss_kinds = loss_kinds
        self.added_degrees = added_degrees
        self.warm_start = warm_start
        self.batch_size = batch_size
        self.steps_per_execution = steps_per_execution
        self.jit_compile = jit_compile
        self.make_strategy = make_strategy
        self.pod_input = pod_input
        self.name_based_checkpoints = False  # the estimator's checkpoint_format is 'saver'
        self.host = None  # strings and lookups run on the host (:mod:`tpushim._strategy_host`)


def make_plan(keras_model, optimizer, custom_objects, settings, make_strategy):
    """The :class:`Plan` of one conversion; refuses what the engine cannot run yet, before
    anything is written."""
    graph_mode = not tf.executing_eagerly()
    if isinstance(optimizer, _tfprivate.keras_v1_tf_optimizer_class()):
        check_tf1_optimizer(optimizer.optimizer)
    elif not isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
        raise ConversionError(
            f"the strategy engine trains with Keras optimizers and tf.compat.v1.train ones; "
            f"{type(optimizer).__name__} is neither. Compile the model with a tf.keras optimizer, "
            "or use engine='tpuestimator'."
        )
    # A loss a layer adds in its call (add_loss) is evaluated by running the model on each row
    # alone, where BatchNormalization would normalise by that row's own moments (and update its
    # moving statistics once per row): refused rather than trained to other numbers. An
    # activity regularizer is read from the model's own forward pass (:func:`input_losses`).
    adding = [
        layer.name
        for layer in _tfprivate.all_layers(keras_model)
        if len(_tfprivate.layer_input_losses(layer)) > _tfprivate.activity_loss_count(layer)
    ]
    normalizing = [
        layer.name
        for layer in _tfprivate.all_layers(keras_model)
        if isinstance(layer, _tfprivate.batchnorm_base_class())
    ]
    if adding and normalizing:
        raise ConversionError(
            "the strategy engine cannot take a loss a layer adds in its call from its inputs "
            f"(add_loss, model.add_loss of a tensor: {', '.join(adding)}) in a model with "
            f"BatchNormalization ({', '.join(normalizing)}) yet: it evaluates such a loss on "
            "each example alone, where BatchNormalization would normalise by that example "
            "alone. Compute it as an activity_regularizer of the layer whose output it reads "
            "(taken from the model's own forward pass), or use a weight regularizer or a loss "
            "on an output, or engine='tpuestimator' (TPUSHIM_ENGINE=tpuestimator) where "
            "TPUEstimator runs."
        )
    # Strings and lookups run on the host (refused here, naming the layer, where they cannot).
    host = _strategy_host.plan(keras_model, custom_objects)
    loss_plan = _loss_kinds.plan(keras_model, custom_objects)
    # The plan may clone it in a graph (a model made in one, by a program that disabled v2
    # behaviour, keeps its v1 classes).
    _tfprivate.restore_v2_classes(keras_model, v1=graph_mode)
    conversion = _plan.ConversionPlan(settings=settings, loss_plan=loss_plan)
    warm = None
    if _tfprivate.is_graph_network(keras_model):
        if not graph_mode:
            warm = [w.numpy() for w in keras_model.trainable_weights] if keras_model.built else None
        elif _tfprivate.any_weight_initialized(keras_model):  # read in the program's session
            warm = tf.compat.v1.keras.backend.batch_get_value(keras_model.trainable_weights)
        # else stock starts from its first checkpoint's freshly initialised clone: read from it
        # once written (:func:`warm_from_first_checkpoint`), the program's variables untouched.
    elif _tfprivate.is_subclassed(keras_model):
        said_subclassed(keras_model)
    plan = Plan(
        keras_model,
        optimizer,
        custom_objects,
        loss_plan.outputs,
        # A subclassed model's losses are planned once it is built (:func:`clone`).
        None if _tfprivate.is_subclassed(keras_model) else loss_plan.added or {},
        warm,
        conversion.batch_size,
        conversion.iterations_per_loop,
        True,
        make_strategy,
        settings.pod_input,
    )
    plan.conversion = conversion
    plan.host = host
    if host is not None:
        logger.info("the strategy engine's host part: %s", host.describe())
    plan.graph_mode = graph_mode
    # Its metrics as stock names them (the program's v1 names), where the eager copy's differ.
    plan.metric_names = _tfprivate.v1_metric_names(keras_model) if graph_mode else None
    return plan


def check_metric_names_map(plan):
    """Stock's errors for a ``metric_names_map`` whose keys are not the names stock's model_fn
    gives the model's compiled metrics (raised by its train() and evaluate() calls alike)."""
    if getattr(plan, "metric_names_map", None):
        _strategy_metrics.mapped_metric_names(
            _strategy_checkpoint.stock_metric_names(plan), plan.metric_names_map
        )


def warm_from_first_checkpoint(plan, path):
    """A program that disabled v2 behaviour and never initialised its model's variables: stock
    warm-starts from the clone its first checkpoint (``path``) initialised, seeded with the
    config's ``tf_random_seed``; the engine starts from those values too."""
    if plan.graph_mode and plan.warm_start is None and path is not None:
        plan.warm_start = _tfprivate.first_checkpoint_values(
            plan.keras_model, plan.custom_objects, path
        )


def check_tf1_optimizer(optimizer):
    """Refuses, before anything is written, a ``tf.compat.v1.train`` optimizer the engine cannot
    train with exactly as stock does.

    Stock builds each call's graph and evaluates the optimizer's hyperparameters in it, with the
    estimator's global step as ``tf.compat.v1.train.get_global_step()``: a tensor or variable
    made eagerly before the conversion fails there ("Attempting to capture an EagerTensor"), a
    callable computing the rate from that global step trains (the engine binds its own step
    the same way: :func:`bind_global_step`). So each hyperparameter is evaluated here as stock
    would, in a fresh graph with a global step. An optimizer that replaces ``apply_gradients``
    (``SyncReplicasOptimizer``, ``CrossShardOptimizer``, a clipping wrapper) combines gradients
    across workers or TPU shards itself: under ``tf.distribute`` it would do so twice, or not.
    """
    name = f"tf.compat.v1.train optimizer {type(optimizer).__name__}"
    fix = (
        "Compile the model with a Keras optimizer (tf.keras.optimizers.legacy.SGD / Adam ...; "
        "a decaying rate as a tf.keras.optimizers.schedules.LearningRateSchedule, which steps "
        "with the estimator's global step), or use engine='tpuestimator' "
        "(TPUSHIM_ENGINE=tpuestimator) where TPUEstimator runs."
    )
    if type(optimizer).apply_gradients is not tf.compat.v1.train.Optimizer.apply_gradients:
        raise ConversionError(
            f"the strategy engine cannot train with {name}: it replaces apply_gradients, and "
            "tf.distribute sums the replicas' gradients in the base class's apply_gradients. " + fix
        )
    for hyper, value in _tfprivate.tf1_optimizer_hyperparameters(optimizer):
        with tf.Graph().as_default() as graph:
            tf.compat.v1.train.create_global_step()
            try:
                tf.convert_to_tensor(value() if callable(value) else value)
            except Exception as e:  # what stock's graph would raise, whatever it is
                raise ConversionError(
                    f"the strategy engine cannot train with {name}: its {hyper} "
                    f"({type(value).__name__}) cannot be evaluated in the estimator's graph, so "
                    f"the stock estimator cannot train with it either ({type(e).__name__}: "
                    f"{str(e)[:200]}); a tensor made before the conversion (a "
                    "tf.compat.v1.train.exponential_decay of a global step made eagerly) "
                    "is fixed at that value. " + fix
                ) from e
            made = [
                v.op.name for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
            ]
        if made != ["global_step"]:
            raise ConversionError(
                f"the strategy engine cannot train with {name}: its {hyper} makes variables "
                f"({', '.join(made[1:])}) each time it is evaluated. " + fix
            )


@_tfprivate.not_converted
def bind_global_step(step):
    """Makes ``step`` what ``tf.compat.v1.train.get_global_step()`` returns in the
    ``tf.function`` being traced, as the estimator's global step is in stock's model_fn graph: a
    ``tf.compat.v1.train`` optimizer's rate computed from the global step (a callable around
    ``tf.compat.v1.train.exponential_decay``) then steps once per global step."""
    graph = tf.compat.v1.get_default_graph()
    del graph.get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_STEP)[:]
    graph.add_to_collection(tf.compat.v1.GraphKeys.GLOBAL_STEP, step)


def said_subclassed(keras_model):
    """What stock does with a subclassed model, said: its estimator starts from a freshly
    initialised copy (no warm start), and calls none of the model's own step methods."""
    if keras_model.built:
        logger.warning(
            "%s is a subclassed Keras model that already has weights; as the stock "
            "model_to_estimator, the estimator starts from a freshly initialised copy "
            "(its weights are not carried over). The model you passed is unchanged.",
            type(keras_model).__name__,
        )
    steps = _tfprivate.overrides_step(keras_model)
    if steps:
        logger.warning(
            "%s overrides %s; as the stock model_to_estimator, the estimator trains, evaluates "
            "and predicts with the model's call, compiled loss, metrics and optimizer, and never "
            "calls %s.",
            type(keras_model).__name__,
            " and ".join(steps),
            "them" if len(steps) > 1 else "it",
        )


def features_spec(element_spec):
    """The features of a replica's element (:func:`_unpack`'s), as specs."""
    features = element_spec[0] if isinstance(element_spec, tuple) else element_spec
    features = features[_padding.FEATURES_KEY]
    if isinstance(features, dict) and set(features) == {"features", "sample_weights"}:
        features = features["features"]
    return features


def _built_on_input(keras_model):
    """Whether the model's clone is built on the input's shapes, as stock's model_fn builds it: a
    subclassed model, or a Sequential declaring no input shape (``virtual_batch_size`` needs
    one: Keras's config of a built such layer cannot be cloned, by stock neither)."""
    return _tfprivate.is_subclassed(keras_model) or not keras_model.built


def clone(plan, features=None):
    """A copy of the user's model, uncompiled: a graph network cloned, a subclassed model made
    as stock makes it (:func:`tpushim._tfprivate.subclassed_clone`: fresh weights, stock's
    variable names) and built by a call on zeros shaped as ``features`` (a replica's feature
    specs), its outputs named as stock's (``output_1``, ...). In the current scope."""
    keras_model = plan.keras_model
    with tf.keras.utils.custom_object_scope(plan.custom_objects):
        if not _tfprivate.is_subclassed(keras_model):
            # A Lambda of a graph program's model reads its shapes as the program's graph does.
            own = _tfprivate.for_graph_program() and _tfprivate.clone_layer_in_programs_shapes
            model = tf.keras.models.clone_model(keras_model, clone_function=own or None)
            if _built_on_input(keras_model):  # an unbuilt Sequential: built as stock's, below
                model(tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), features))
            if plan.host is not None:  # run from the host's tensors (_strategy_host)
                _strategy_host.install(plan.host, model)
            return model
        model = _tfprivate.subclassed_clone(keras_model)
    zeros = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), features)
    outputs = model(zeros, training=False)
    model.output_names = _tfprivate.generic_output_names(tf.nest.flatten(outputs))
    _BUILT_OUTPUTS[model] = [tf.TensorSpec(o.shape, o.dtype) for o in tf.nest.flatten(outputs)]
    if plan.added_degrees is None:  # the loss plan, once the model's outputs exist
        plan.loss_kinds, plan.added_degrees = _subclassed_loss_plan(plan, model, outputs, features)
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
    args = _tfprivate.compile_args(plan.keras_model)
    with tf.keras.utils.custom_object_scope(plan.custom_objects):
        loss_fns = _tfprivate.prepare_loss_functions(args.get("loss"), names)
    flat = tf.nest.flatten(outputs)
    kinds = _loss_kinds.classify_outputs(
        names,
        loss_fns,
        [[None, *o.shape.as_list()[1:]] for o in flat],
        [o.dtype for o in flat],
        args.get("loss_weights"),
    )
    if not any(_tfprivate.layer_call_losses(layer) for layer in _tfprivate.all_layers(model)):
        return kinds, {}
    loss_plan = _loss_kinds.plan_subclassed(plan.keras_model, plan.custom_objects, features)
    _tfprivate.restore_v2_classes(plan.keras_model)  # planned in a graph
    return kinds, loss_plan.added or {}


# --- the loss of one replica --------------------------------------------------------------------


def _loss_objects(keras_model, custom_objects, names=None, host_outputs=None):
    """Per output (``names``: the model's), the Loss object stock's clone compiles (None: no
    loss), and its weight."""
    args = _tfprivate.compile_args(keras_model)
    names = names or keras_model.output_names
    with tf.keras.utils.custom_object_scope(custom_objects):
        losses = _tfprivate.prepare_loss_functions(args.get("loss"), names)
    weights = args.get("loss_weights")
    if weights is None:
        weights = [1.0] * len(names)
    elif isinstance(weights, dict):
        weights = [weights.get(name, 1.0) for name in names]
    if _tfprivate.for_graph_program():  # its shape[-1].value, as the program's graph sees
        losses = [None if x is None else _tfprivate.loss_in_programs_shapes(x) for x in losses]
    host = host_outputs or ()  # computed on the host, weighing 0 (_strategy_host)
    return [(n, None if n in host else loss, w) for n, loss, w in zip(names, losses, weights)]


class _Endpoint:
    """One output's loss as :func:`tpushim._losses.shard_loss` reads a Keras training endpoint:
    the TPU path's arithmetic, on the strategy engine's eager tensors."""

    def __init__(self, name, loss_fn, loss_weight, y_true, y_pred, sample_weight):
        self.output_name, self.loss_fn, self.loss_weight = name, loss_fn, loss_weight
        self.output, self.sample_weight = y_pred, sample_weight
        self.training_target = types.SimpleNamespace(target=y_true)


@_tfprivate.not_converted
def all_reduce_sum(value):
    """``value`` summed over the replicas (the replica context's all-reduce)."""
    return tf.distribute.get_replica_context().all_reduce(SUM, value)


@_tfprivate.not_converted
def host_sum(strategy, per_replica):
    """A per-replica value summed on the host, outside the replicas' step: what a
    ``TPUStrategy``'s ``reduce`` does (each core's value copied to the host and added). Another
    strategy's ``reduce`` all-reduces (a MirroredStrategy's: every replica's collective, a
    rendezvous of them all, for one number it then reads on one device); here its values are
    copied and added alike."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return strategy.reduce(SUM, per_replica, axis=None)
    return tf.add_n(list(strategy.experimental_local_results(per_replica)))


@_tfprivate.not_converted
def scalar_weight(element):
    """A replica's weight in the mean of a model's scalar summary: its real rows."""
    features = element[0] if isinstance(element, tuple) else element
    return tf.reduce_sum(tf.cast(features[_padding.PADDING_KEY], tf.float32))


@_tfprivate.not_converted
def real_rows(element):
    """Inside :func:`tpushim._tfprivate.batchnorm_call_hooked`, while a replica's training step
    calls the model: its BatchNormalization layers' batch statistics over the replica's real rows
    (:mod:`tpushim._batchnorm`, as a TPUEstimator shard's; a synchronized layer's summed across
    the replicas), not the padding rows."""
    features = element[0] if isinstance(element, tuple) else element
    pad = features[_padding.PADDING_KEY]
    return _tfprivate.batchnorm_call_using(_batchnorm.real_rows_call(pad, True, all_reduce_sum))


@_tfprivate.not_converted
def replica_loss(
    terms,
    kinds,
    outputs,
    labels,
    pad,
    replicas,
    model_losses,
    sample_weights=None,
    input_losses=(),
    sum_replicas=all_reduce_sum,
    known_rows=None,
):
    """``L_r``: the sum over replicas of these is stock's training loss on the global batch.

    The outputs' terms are the TPU path's ``L_s`` (:func:`tpushim._losses.shard_loss`: padding
    rows weigh 0, a mean divides by the global batch's real rows or unmasked elements, a sample
    weight and a mask weigh as Keras weighs them, a custom one-number loss is evaluated per row
    and scaled by its degree), whose mean over the replicas is stock's: ``L_r = L_s / S``.

    Args:
      terms: ``(output name, Loss object or None, weight)`` per output (:func:`_loss_objects`).
      kinds: output name -> kind (:class:`Plan`).
      outputs, labels: the replica's model outputs and labels (lists, in output order); an
        output's Keras mask is its ``_keras_mask``.
      pad: the replica's [rows] padding weights.
      replicas: replicas in sync.
      model_losses: the model's weight regularizers (stock adds them once).
      sample_weights: per output, the replica's sample weights or None.
      input_losses: ``(degree, [rows] values)`` per loss a layer adds from its inputs, each row's
        value that of a batch of that row alone (:meth:`_Run.input_losses`).
      sum_replicas: sums a tensor over the replicas (the identity on one replica alone).
      known_rows: the global batch's real rows where the input carries them
        (:func:`known_rows`), else None: counted by ``sum_replicas``.
    """
    sample_weights = sample_weights or [None] * len(terms)
    endpoints, term_kinds, masks = [], [], []
    for (name, loss_obj, weight), y_pred, y_true, sample_weight in zip(
        terms, outputs, labels, sample_weights
    ):
        if loss_obj is None:
            continue
        kind = kinds.get(name, _loss_kinds.ROWS)
        y_true, kind = row_label_term(name, loss_obj, kind, y_true, y_pred, sample_weight)
        endpoints.append(_Endpoint(name, loss_obj, weight, y_true, y_pred, sample_weight))
        term_kinds.append(kind)
        masks.append(getattr(y_pred, "_keras_mask", None))
    # The rows' count and the terms' counts: one collective, none where the input says them all.
    totals = _losses.Totals(known_rows)
    real_rows = totals.add(tf.reduce_sum(pad), known_rows)
    total = _losses.shard_loss(
        endpoints, term_kinds, masks, [], {}, pad, replicas, sum_replicas, totals
    ) / float(replicas)
    total = tf.cast(total, tf.float32)
    for added in model_losses:
        total += tf.cast(added, tf.float32) / replicas
    rows = real_rows(tf.float32)
    # The loss reads the counts' collective even where no term needs it (a SUM loss): every
    # step's collectives, in one chain, issued in the same order on every device.
    with tf.control_dependencies([rows]):
        total = tf.identity(total)
    if input_losses:  # T(n rows) = n**(degree - 1) * the sum of its rows' values, n global
        for degree, values in input_losses:
            total += rows ** float(degree - 1) * tf.reduce_sum(tf.cast(values, tf.float32) * pad)
    return total


def _weighted_row_labels(name, loss_obj):
    # Stock's weighted_loss squeezes the [batch] weights to the loss's rank and fails at its
    # first step ("Can not squeeze dim[0], expected a dimension of 1, got 8").
    return ConversionError(
        f"output {name!r} has [batch] labels for its [batch, 1] output and sample weights: "
        f"Keras squeezes the output to [batch], so its loss "
        f"({getattr(loss_obj, 'name', type(loss_obj).__name__)}) is one number for the "
        "whole batch, which no per-example weight can weigh; the stock estimator fails on "
        'it too ("Can not squeeze dim[0], expected a dimension of 1"). Give the labels '
        "the output's shape, [batch, 1] (labels[:, None] in the input_fn)."
    )


def check_input_keys(plan, model, element_spec):
    """Refuses, before anything is written or traced, features (and labels) whose keys do not
    cover the model's inputs (outputs), with stock's error: keras_lib's
    ``_convert_estimator_io_to_keras``, run on placeholders of the input's specs (a trace of the
    step would bury it in its own error). A model fed by layers on the host takes their outputs:
    their check is the host's."""
    if plan.host is not None:
        return
    features, labels, _, _ = _unpack(element_spec, model.output_names)
    with tf.Graph().as_default():
        features, labels = (
            None
            if part is None
            else tf.nest.map_structure(
                lambda spec: tf.compat.v1.placeholder(spec.dtype, spec.shape), part
            )
            for part in (features, labels)
        )
        _tfprivate.convert_estimator_io_to_keras(model, features, labels)


def check_row_labels(model, terms, element_spec):
    """Refuses, before anything is written, sample weights stock's graph refuses (stock's error:
    :func:`tpushim._padding.check_sample_weight_shapes`), and sample weights on a loss that
    [batch] labels of a [batch, 1] output make one number for the batch
    (:func:`row_label_term`)."""
    _, labels, _, weights = _unpack(element_spec, model.output_names)
    if weights is not None:
        _padding.check_sample_weight_shapes(weights)
    outputs = output_specs(model)
    if labels is None or weights is None or not outputs:
        return
    labels = _labels_list(labels, model.output_names)
    for (name, loss_obj, _), output, label, weight in zip(terms, outputs, labels, weights):
        if loss_obj is None or weight is None or not isinstance(label, tf.TensorSpec):
            continue
        y_true = tf.zeros([2] + [d or 1 for d in label.shape.as_list()[1:]], label.dtype)
        y_pred = tf.zeros([2] + [d or 1 for d in output.shape.as_list()[1:]], output.dtype)
        if _padding.row_labels(y_true, y_pred) is y_true:
            continue
        if loss_obj.call(y_true, y_pred).shape.rank == 0:
            raise _weighted_row_labels(name, loss_obj)


@_tfprivate.not_converted
def row_label_term(name, loss_obj, kind, y_true, y_pred, sample_weight):
    """(labels, kind) of an output's loss term as stock's graph computes it, for [batch] labels
    of a [batch, 1] output: Keras squeezes the output to [batch] before the loss function.

    A loss giving one value per row there (``lambda t, p: tf.abs(t - p)``) reads the labels as
    [batch, 1] (the same rows; padding weighs them out). One that reduces the last axis
    (``mse``, ``binary_crossentropy``, a SUM loss) gives one number for the batch: a term of
    the degree its value has on [batch] labels (:func:`tpushim._loss_kinds.row_label_kind`),
    evaluated per real row; a SUM loss is then the rows' mean, as stock's. Such a number times
    per-example sample weights is refused, as stock fails on it.
    """
    if _padding.row_labels(y_true, y_pred) is y_true or kind in (
        _loss_kinds.CONSTANT,
        _loss_kinds.UNWEIGHTED,
    ):
        return _padding.row_labels(y_true, y_pred), kind
    if _tfprivate.user_code(loss_obj.call)(y_true, y_pred).shape.rank != 0:  # one value per row
        return _padding.row_labels(y_true, y_pred), kind
    if sample_weight is not None:  # refused before the trace: check_row_labels
        raise _weighted_row_labels(name, loss_obj)
    shape = [None, *y_pred.shape.as_list()[1:]]
    where = f"loss of output {name!r} ({getattr(loss_obj, 'name', type(loss_obj).__name__)})"
    return y_true, _loss_kinds.row_label_kind(where, loss_obj, shape, y_pred.dtype)


@_tfprivate.not_converted
def global_rows(pad):
    """Real rows of the global batch, summed over the replicas (each replica holds a slice)."""
    return all_reduce_sum(tf.reduce_sum(pad))


# --- the input, as the replicas read it: tpushim/_strategy_input.py --------------------------


@_tfprivate.not_converted
def known_rows(element):
    """The global batch's real rows a replica's element carries (:func:`tpushim._padding.
    pad_batch`'s ``counted``: every input the engine makes), or None: then an all-reduce."""
    return _padding.global_rows(element[0] if isinstance(element, tuple) else element)


@_tfprivate.not_converted
def _unpack(element, names):
    """(features, labels or None, padding weight, per output sample weights or None) of a
    padded element: ``{"features", "sample_weights"}`` features as keras_lib splits them."""
    features, labels = element if isinstance(element, tuple) else (element, None)
    pad, features = features[_padding.PADDING_KEY], features[_padding.FEATURES_KEY]
    weights = None
    if isinstance(features, dict) and set(features) == {"features", "sample_weights"}:
        features, weights = features["features"], features["sample_weights"]
        weights = _tfprivate.standardize_sample_weights(weights, names)
    return features, labels, pad, weights


class _ActivityRecorder:
    """A layer's activity regularizer that also notes each output it is called on, with the
    index the loss Keras then adds from it takes among the layer's call losses: the engine
    reads those outputs, from the model's own forward pass, to evaluate the loss per row.

    Per thread: a MirroredStrategy runs each replica's function in a thread of its own, and
    they take turns at every all-reduce (a SyncBatchNormalization's among them)."""

    def __init__(self, layer, regularizer):
        self.layer, self.regularizer, self._local = layer, regularizer, threading.local()

    @property
    def outputs(self):
        if not hasattr(self._local, "outputs"):
            self._local.outputs = []
        return self._local.outputs

    def __call__(self, output):
        self.outputs.append((len(_tfprivate.layer_call_losses(self.layer)), output))
        return self.regularizer(output)


@_tfprivate.not_converted
def _recorders(model):
    """The :class:`_ActivityRecorder` of every layer of ``model`` with an activity regularizer
    (installed on the engine's own clone at the first call)."""
    found = []
    for layer in _tfprivate.all_layers(model):
        regularizer = getattr(layer, "activity_regularizer", None)
        if regularizer is None:
            continue
        if not isinstance(regularizer, _ActivityRecorder):
            regularizer = _ActivityRecorder(layer, regularizer)
            layer.activity_regularizer = regularizer
        found.append(regularizer)
    return found


@_tfprivate.not_converted
def _called(model, features, training):
    """The model's outputs (a list), its weight regularizers, whether its layers added losses
    from their inputs in this call, and (layer name, index) -> (activity regularizer, the
    output it regularized) for those an activity regularizer added."""
    recorders = _recorders(model)
    for recorder in recorders:
        recorder.outputs.clear()
    outputs = _outputs_list(model(features, training=training))
    adds = any(_tfprivate.layer_call_losses(layer) for layer in _tfprivate.all_layers(model))
    activity = {
        (recorder.layer.name, index): (recorder.regularizer, output)
        for recorder in recorders
        for index, output in recorder.outputs
    }
    return outputs, _tfprivate.weight_regularizers(model), adds, activity


_BUILTIN_ACTIVITY = (tf.keras.regularizers.L1, tf.keras.regularizers.L2, tf.keras.regularizers.L1L2)


@_tfprivate.not_converted
def _per_row_activity(regularizer, output):
    """[rows] values of an activity regularizer's term, each row's that of a batch of that row
    alone: ``regularizer(row) / 1``, as Keras divides by the batch size."""
    output = tf.cast(output, tf.float32)
    if type(regularizer) in _BUILTIN_ACTIVITY:  # sums over a row's elements: no loop
        axes = list(range(1, output.shape.rank))
        value = tf.zeros(tf.shape(output)[:1])
        if getattr(regularizer, "l1", 0.0):
            value += float(regularizer.l1) * tf.reduce_sum(tf.abs(output), axes)
        if getattr(regularizer, "l2", 0.0):
            value += float(regularizer.l2) * tf.reduce_sum(tf.square(output), axes)
        return value
    return tf.map_fn(
        lambda row: tf.reshape(tf.cast(regularizer(row[None]), tf.float32), []),
        output,
        fn_output_signature=tf.float32,
    )


@_tfprivate.not_converted
def input_losses(model, features, training, degrees, activity=None):
    """``(degree, [rows] values)`` per loss a layer of ``model`` adds from its inputs (right after
    a call of ``model``): each row's value that of the model called on that row alone, so
    padding rows weigh 0 and a replica's rows add up to the global batch's term whatever their
    number (Keras's own value is a mean over the replica's rows, padding included).

    An activity regularizer's term is read from ``activity`` (:func:`_called`): the regularizer
    applied to each row of the output the call itself regularized, so BatchNormalization before
    it keeps the call's batch moments and no second forward pass is run. Any other term
    (``add_loss`` in a call) comes from running the model on each row alone."""
    activity = activity or {}
    keys = [
        (layer.name, i)
        for layer in _tfprivate.all_layers(model)
        for i, _ in enumerate(_tfprivate.layer_call_losses(layer))
    ]
    values = {key: _per_row_activity(*activity[key]) for key in keys if key in activity}
    rest = [key for key in keys if key not in values]
    if rest:

        def per_row(row):
            # One row alone: the replica's padding weight does not fit it (a model that has
            # BatchNormalization is refused this path: make_plan).
            with _tfprivate.batchnorm_call_using(None):
                model(tf.nest.map_structure(lambda x: x[None], row), training=training)
            return [
                tf.reshape(tf.cast(t, tf.float32), [])
                for layer in _tfprivate.all_layers(model)
                for i, t in enumerate(_tfprivate.layer_call_losses(layer))
                if (layer.name, i) in rest
            ]

        # tf.map_fn, not tf.vectorized_map: regularizers use ops pfor cannot vectorise
        # (L2Loss), and its while-loop fallback does not compile with XLA; map_fn's static row
        # count does.
        rows = tf.map_fn(per_row, features, fn_output_signature=[tf.float32] * len(rest))
        values.update(zip(rest, rows))
    return [(degrees.get(key, 0), values[key]) for key in keys]


@_tfprivate.not_converted
def _loss_of(
    plan, terms, model, features, labels, pad, weights, training, replicas, summed, rows=None
):
    """(the replica's ``L_r``, its outputs): :func:`replica_loss` of a call of ``model``
    (``rows``: the global batch's real rows the element carries, :func:`known_rows`)."""
    outputs, regularizers, adds, activity = _called(model, features, training)
    added = input_losses(model, features, training, plan.added_degrees, activity) if adds else ()
    loss = replica_loss(
        terms,
        plan.loss_kinds,
        outputs,
        _labels_list(labels, model.output_names),
        pad,
        replicas,
        regularizers,
        weights,
        added,
        summed,
        rows,
    )
    return loss, outputs


def _mask_or_empty(output):
    """An output's Keras mask, or an empty tensor where it has none (a replica's results are
    tensors)."""
    mask = getattr(output, "_keras_mask", None)
    return tf.zeros([0], tf.bool) if mask is None else mask


@_tfprivate.not_converted
def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


@_tfprivate.not_converted
def _outputs_list(outputs):
    """A model call's outputs as a list in ``model.outputs`` order: a dict of outputs (a
    functional model built with ``outputs={...}``) flattened as Keras flattens it (sorted keys)."""
    return tf.nest.flatten(outputs) if isinstance(outputs, dict) else _as_list(outputs)


@_tfprivate.not_converted
def _labels_list(labels, names):
    if isinstance(labels, dict):
        return [labels[n] for n in names]
    return _as_list(labels)


def _outs(plan):
    return plan.host.outputs if plan.host is not None else ()


# --- XLA, where no TPU compiles the step ---------------------------------------------------------


_SAID_SUMMARIES = set()  # ids of the plans whose model's summaries were said left out (and why)


@contextlib.contextmanager
def model_summaries_left_out(plan, on_scalar=lambda name, tensor: True):
    """Around a trace of the model's call: the ``tf.compat.v1.summary`` ops it makes are left out
    (their string ops no TPU step compiles). A scalar's (name, tensor) goes to ``on_scalar``
    (by default taken and dropped: stock's evaluation and prediction write none); the others,
    which stock writes every save_summary_steps, are said once per conversion with their
    names."""
    skipped = set()
    with _tfprivate.v1_summaries_skipped(skipped, on_scalar):
        yield
    if skipped and id(plan) not in _SAID_SUMMARIES:
        _SAID_SUMMARIES.add(id(plan))
        named = ", ".join(f"{kind} {name!r}" for kind, name in sorted(skipped))
        logger.warning(
            "tpushim: the model makes summaries itself (tf.compat.v1.summary: %s): the strategy "
            "engine does not write them (stock writes them every save_summary_steps): a TPU step "
            "computes no strings, which those ops make; it writes a model's one-number "
            "tf.compat.v1.summary.scalar. Summarize a scalar, or use engine='tpuestimator' where "
            "TPUEstimator runs.",
            named,
        )


def check_xla(plan, element_spec, replicas):
    """Compiles one replica's training step (forward, loss, gradients) with XLA, as a TPU would,
    without running it: an op XLA cannot compile raises here, naming it.

    Outside the strategy: XLA-compiled functions inside a MirroredStrategy's multi-device step
    hung now and then on CPU (about 1 run in 4 on 8 logical devices, TF 2.15), so the replicated
    step itself runs uncompiled off a TPU. On the user's model itself where it can be traced as
    it is (:func:`_as_is`: the step is compiled, never run, so nothing is written to it), else on
    a copy (cloning ResNet50 cost as much as lowering its step to HLO).

    An inspection stock does not make: the seeds its copy and trace draw are put back, so the
    model a program builds next starts from stock's initial weights.
    """
    with _tfprivate.keras_random_state_kept():
        _check_xla(plan, element_spec, replicas)


def _check_xla(plan, element_spec, replicas):
    model = _as_is(plan) or clone(plan, features_spec(element_spec))
    terms = _loss_objects(plan.keras_model, plan.custom_objects, model.output_names, _outs(plan))
    lookups = _tfprivate.feature_column_layers(model) if plan.host is None else ()
    if lookups:
        raise ConversionError(
            "the training step cannot run on a TPU: the model's feature-column layers "
            f"({', '.join(lookups)}) look up, hash or cross their features with ops no TPU "
            "step compiles, and the strategy engine does not move them to the host yet (the "
            "TPUEstimator path does). Apply the feature columns in the input_fn "
            "(tf.keras.layers.DenseFeatures in Dataset.map) and feed the model numbers, use "
            "engine='tpuestimator' where TPUEstimator runs, or train without tpushim "
            "(TPUSHIM_MODE=off)."
        )

    strings = _string_parts(element_spec)
    if strings:
        raise ConversionError(
            f"the training step cannot run on a TPU: its input carries strings ({strings}), and "
            "no TPU computes strings (XLA has no string type). Turn them into numbers in the "
            "input_fn (a lookup or tf.strings.to_number in Dataset.map), or train without "
            "tpushim (TPUSHIM_MODE=off)."
        )

    def step(element):
        features, labels, pad, weights = _unpack(element, model.output_names)
        with tf.GradientTape() as tape, real_rows(element):
            loss, _ = _loss_of(
                plan,
                terms,
                model,
                features,
                labels,
                pad,
                weights,
                True,
                replicas,
                lambda x: x,
                known_rows(element),
            )
        return loss, tape.gradient(loss, model.trainable_variables)

    sample = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), element_spec)
    try:
        with (
            _tfprivate.batchnorm_call_hooked(),
            model_summaries_left_out(plan),
            _tfprivate.call_losses_kept(model),  # the user's model, traced as it is
        ):
            _tfprivate.compiler_ir(tf.function(step, jit_compile=True), sample)
    except (ValueError, tf.errors.OpError) as e:
        raise ConversionError(
            "the training step does not compile with XLA, as a TPU compiles it (compiled here "
            f"with jit_compile=True): {str(e)[:1500]}. Replace the op it names with TensorFlow "
            "ops XLA supports, or train without tpushim (TPUSHIM_MODE=off)."
        ) from e


def _as_is(plan):
    """The user's model, where :func:`check_xla` traces the same step on it as on a clone: a
    built graph network (no subclassed or unbuilt one, which a clone builds on the input), no
    layer run on the host (a clone's, :mod:`tpushim._strategy_host`), its variables eager ones
    (not a graph-mode program's), no activity regularizer (the step installs a recorder in its
    place: :func:`_recorders`, on a clone only). Else None."""
    if plan.host is not None or not traceable_as_is(plan.keras_model):
        return None
    return plan.keras_model


def traceable_as_is(keras_model):
    """Whether an XLA check may trace its step on ``keras_model`` itself instead of a clone
    (:func:`_as_is`, and the TPUEstimator path's :func:`tpushim._preflight.model_checks.check_xla`):
    a built graph network with eager variables and no activity regularizer."""
    if _built_on_input(keras_model) or not tf.executing_eagerly():
        return False
    layers = _tfprivate.all_layers(keras_model)
    if any(getattr(layer, "activity_regularizer", None) is not None for layer in layers):
        return False
    return not any(getattr(v, "_in_graph_mode", True) for v in keras_model.weights)


_XLA_CHECKED = weakref.WeakKeyDictionary()  # plan -> [(element spec, replicas)] that compiled


def check_xla_once(plan, element_spec, replicas):
    """:func:`check_xla`, once per conversion and input shape: a later ``train()`` call's step
    is the same computation (for MobileNetV2 the check costs about what tracing the step does)."""
    checked = _XLA_CHECKED.setdefault(plan, [])
    if (element_spec, replicas) not in checked:
        check_xla(plan, element_spec, replicas)
        checked.append((element_spec, replicas))


def _paths(value, path=""):
    """(path, leaf) of a nest of dicts, lists and tuples: "text", "a/b", "[0]"."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, f"{path}/{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _paths(item, f"{path}[{i}]")
    else:
        yield path, value


def _string_parts(element_spec):
    """Where a padded element's spec holds strings: "feature 'text', label 'key'" ("" if none)."""
    features, labels = element_spec if isinstance(element_spec, tuple) else (element_spec, None)
    found = []
    for part, value in (("feature", features[_padding.FEATURES_KEY]), ("label", labels)):
        if value is None:
            continue
        for path, spec in _paths(value):
            if spec.dtype == tf.string:
                found.append(f"{part} {path!r}" if path else part)
    return ", ".join(found)


# --- one call's model, under the strategy -------------------------------------------------------


def _optimizer(user, step, model, plan):
    """The clone's optimizer as keras_lib's clone makes it, with ``step`` as its iterations,
    set on ``model`` (tracked as ``optimizer``), its slots made: a Keras optimizer from its
    config; a ``tf.compat.v1.train`` one (Keras's ``TFOptimizer``) a fresh copy of the user's,
    wrapped again with ``step`` as its global step (stock reuses the user's object in each new
    graph, where its variables are new; eagerly they would be the last call's)."""
    if isinstance(user, _tfprivate.keras_v1_tf_optimizer_class()):
        inner = _tfprivate.fresh_tf1_optimizer(user.optimizer)
        optimizer = _tfprivate.keras_tf_optimizer(inner, step)
        model.optimizer = optimizer
        # Slots exist before a restore: every value is restored at once.
        _tfprivate.create_tf1_optimizer_slots(inner, model.trainable_variables)
        return optimizer
    optimizer = type(user).from_config(user.get_config())
    optimizer.iterations = step  # as keras_lib binds it
    model.optimizer = optimizer
    # Named as stock's graph names them: checkpoints record the names.
    with _strategy_checkpoint.optimizer_scope(plan):
        _tfprivate.create_optimizer_slots(optimizer, model.trainable_variables)
    return optimizer


class _Run:
    """The clone, its optimizer and global step, built in the strategy's scope for one call."""

    def __init__(self, plan, strategy, mode, model_dir, checkpoint_path=None, features=None):
        self.plan, self.strategy, self.mode = plan, strategy, mode
        with strategy.scope(), tf.keras.utils.custom_object_scope(plan.custom_objects):
            self.model = clone(plan, features)  # features: a subclassed model is built on them
            self.step = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="global_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
            self.optimizer = None
            if features is not None:  # stock's graph builds a subclassed model on them too
                plan.features_spec = features
            if mode == ModeKeys.TRAIN:
                self.optimizer = _optimizer(plan.optimizer, self.step, self.model, plan)
            _tfprivate.track_estimator_step(self.model, self.step)
        self.terms = _loss_objects(
            plan.keras_model, plan.custom_objects, self.model.output_names, _outs(plan)
        )
        self.checkpoints = _strategy_checkpoint.Checkpoints(
            plan, self.model, plan.name_based_checkpoints, writes=mode == ModeKeys.TRAIN
        )
        self.model_dir = model_dir
        latest = checkpoint_path or tf.train.latest_checkpoint(model_dir)
        if latest:
            self.checkpoints.read(latest)
        elif mode != ModeKeys.TRAIN and plan.warm_start is None:
            raise ValueError(f"Could not find trained model in model_dir: {model_dir}.")
        elif plan.warm_start is not None:  # as stock evaluates before training: warm-started
            for variable, value in zip(self.model.trainable_variables, plan.warm_start):
                variable.assign(value)
        self.restored = latest

    def save(self, kept, meta=None):
        """Writes ``model.ckpt-STEP`` as stock names it, in stock's format, and lists it in
        ``checkpoint`` as stock's Saver does (``kept``: a :class:`tpushim._step_events.Kept`;
        ``meta``: the bytes of its ``.meta``, or None)."""
        step = int(self.step.numpy())
        tf.compat.v1.logging.info(
            "Saving checkpoints for %d into %s.", step, os.path.join(self.model_dir, "model.ckpt")
        )
        path = self.checkpoints.write(os.path.join(self.model_dir, f"model.ckpt-{step}"), meta)
        kept.saved(path, relative=self.checkpoints.name_based)  # stock's Saver's paths
        return path

    # -- the replica functions ----------------------------------------------------------------
    @_tfprivate.not_converted
    def _loss(self, element, training):
        features, labels, pad, weights = _unpack(element, self.model.output_names)
        loss, outputs = _loss_of(
            self.plan,
            self.terms,
            self.model,
            features,
            labels,
            pad,
            weights,
            training,
            self.strategy.num_replicas_in_sync,
            all_reduce_sum,
            known_rows(element),
        )
        return loss, outputs, labels, pad, weights

    def train_function(self, checked=True):
        """A ``tf.function`` running up to ``n`` steps from ``iterator`` (``checked``: it may hold
        fewer, each step asks; else the caller knows it holds ``n``); returns (steps run,
        each step's global loss: stock's hooks see every step's, :mod:`tpushim._step_events`;
        each step's values of the model's one-number ``tf.compat.v1.summary.scalar`` calls,
        averaged over the replicas weighted by their real rows, in one vector:
        ``self.scalar_count`` a step, known once traced). Stock's value of a mean over the
        global batch's rows where each replica's rows are all real or all padding (padding
        rows come last: only a short batch's last real replica may hold both)."""
        recording = threading.local()  # a replica's scalars, in its own thread
        self.scalar_count = 0

        def on_scalar(name, tensor):
            values = getattr(recording, "values", None)
            if values is None or tensor is None or tensor.shape.num_elements() != 1:
                return False
            values.append(tf.reshape(tf.cast(tensor, tf.float32), []))
            return True

        def replica_step(element):
            recording.values = []
            try:
                with tf.GradientTape() as tape, real_rows(element):
                    loss = self._loss(element, True)[0]
            finally:
                scalars, recording.values = recording.values, None
            self.scalar_count = len(scalars)  # (here: an attribute set in the loop is a tensor)
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
            rows = scalar_weight(element)
            # A replica of padding rows only weighs nothing (its value may be NaN).
            weighted = [tf.where(rows > 0, v * rows, 0.0) for v in scalars]
            return loss, weighted, rows

        @_tfprivate.not_converted
        def step(element, ran, losses, scalars):
            bind_global_step(self.step)
            hooked = _tfprivate.batchnorm_call_hooked()  # at the trace
            with hooked, model_summaries_left_out(self.plan, on_scalar):
                loss, values, rows = self.strategy.run(replica_step, args=(element,))
            losses = losses.write(tf.cast(ran, tf.int32), host_sum(self.strategy, loss))
            real = host_sum(self.strategy, rows) if values else None
            for k, value in enumerate(values):
                mean = host_sum(self.strategy, value) / real
                scalars = scalars.write(tf.cast(ran, tf.int32) * len(values) + k, mean)
            return ran + 1, losses, scalars

        @_tfprivate.not_converted
        def start():
            ran = tf.constant(0, tf.int64)
            losses, scalars = (
                tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=[])
                for _ in range(2)
            )  # their shape known: a call that finds the input exhausted stacks none
            return ran, losses, scalars

        @tf.function
        def run_checked(iterator, n):  # each step asks whether a batch is left
            ran, losses, scalars = start()
            for _ in tf.range(n):
                optional = _input_wait.next_input(iterator)  # timed (the run summary)
                if not optional.has_value():
                    break
                ran, losses, scalars = step(optional.get_value(), ran, losses, scalars)
            return ran, losses.stack(), scalars.stack()

        @tf.function
        def run(iterator, n):  # the caller knows that n batches are left
            ran, losses, scalars = start()
            for _ in tf.range(n):
                element = _input_wait.next_input(iterator, checked=False)  # timed
                ran, losses, scalars = step(element, ran, losses, scalars)
            return ran, losses.stack(), scalars.stack()

        return run_checked if checked else run

    def eval_function(self, parts=None):
        """A ``tf.function`` of one global batch: (global loss, per replica (outputs, labels,
        padding weight, sample weights, masks)); an output without a mask has an empty one.
        ``parts``: {``features`` or ``labels``: positions}: per replica also those of the
        tensors the input gave (``tf.nest.flatten`` order), for the metric_fns
        ``tf.estimator.add_metrics`` added (:mod:`tpushim._strategy_metrics`)."""

        def replica_step(element):
            loss, outputs, labels, pad, weights = self._loss(element, False)
            given = {p: tf.nest.flatten(v) for p, v in given_parts(element).items()}
            labels = _labels_list(labels, self.model.output_names)
            masks = [_mask_or_empty(o) for o in outputs]
            weights = [
                tf.ones_like(pad) if w is None else w for w in weights or [None] * len(outputs)
            ]
            # What Keras's crossentropy metrics read besides the values (known at the trace).
            read = [_tfprivate.output_logits(o) for o in outputs]
            self.logits_how = [how for how, _ in read]
            logits = [tf.zeros([0]) if how is None else lg for how, lg in read]
            if parts is not None:
                chosen = {p: [given[p][i] for i in positions] for p, positions in parts.items()}
                return loss, outputs, labels, pad, weights, masks, logits, chosen
            return loss, outputs, labels, pad, weights, masks, logits

        @tf.function
        def run(element):
            with model_summaries_left_out(self.plan):  # at the trace
                loss, *rest = self.strategy.run(replica_step, args=(element,))
            return (host_sum(self.strategy, loss), *rest)

        return run

    def predict_function(self):
        def replica_step(element):
            features, _, pad, _ = _unpack(element, self.model.output_names)
            return _outputs_list(self.model(features, training=False)), pad

        @tf.function
        def run(element):
            with model_summaries_left_out(self.plan):  # at the trace
                return self.strategy.run(replica_step, args=(element,))

        return run

    def gathered(self, per_replica):
        """The replicas' values, concatenated in replica order (the global batch's rows)."""
        return tf.nest.map_structure(
            lambda *parts: tf.concat(parts, 0),
            *self.strategy.experimental_local_results(per_replica),
        )


def given_parts(element):
    """{"features", "labels"} of a padded element (or its spec) as the input_fn gave them
    (stock's ``{"features", "sample_weights"}`` features too), without the padding weight."""
    features, labels = element if isinstance(element, tuple) else (element, None)
    return {"features": features[_padding.FEATURES_KEY], "labels": labels}


def _metrics_model(plan, features=None):
    """An undistributed copy of the user's model compiled as the user compiled it: its compiled
    metrics (Keras's names and kinds) are updated on the host with each gathered batch. A copy
    stock does not make: the seeds its weights draw are put back (stock's evaluation draws one
    clone's, the engine's :class:`_Run`'s), so the model a program builds next starts from
    stock's initial weights."""
    with _tfprivate.keras_random_state_kept():
        model = clone(plan, features)
    with tf.keras.utils.custom_object_scope(plan.custom_objects):
        args = _tfprivate.compile_args(plan.keras_model)
        model.compile(
            loss=args.get("loss"),
            metrics=_tfprivate.clone_metrics(args.get("metrics")),
            weighted_metrics=_tfprivate.clone_metrics(args.get("weighted_metrics")),
            loss_weights=args.get("loss_weights"),
        )
    return model


def _metrics_update(metrics_model, logits_how, has_mask, has_weight=None):
    """A ``tf.function`` updating ``metrics_model``'s compiled metrics with one gathered batch's
    real rows (those whose padding weight ``pad`` is not 0; an output without a mask or logits
    has an empty one), the outputs carrying what stock's graph outputs carry to Keras's
    metrics: their Keras mask and their logits (a softmax or sigmoid output's crossentropy metrics are computed
    from its logits in stock's graph; an eager tensor would lose them). In a graph, as stock's
    metrics run, so an op's type can be read too."""

    @tf.function(reduce_retracing=True)
    def update(labels, outputs, logits, weights, masks, pad):
        real = pad > 0  # the rows kept, in the function: eagerly, a dozen ops' dispatch a batch
        labels, outputs, weights = (
            [tf.boolean_mask(x, real) for x in xs] for xs in (labels, outputs, weights)
        )
        logits = [
            lg if how is None else tf.boolean_mask(lg, real) for lg, how in zip(logits, logits_how)
        ]
        masks = [tf.boolean_mask(m, real) if masked else m for m, masked in zip(masks, has_mask)]
        carried = []
        for output, how, lg, mask, masked in zip(outputs, logits_how, logits, masks, has_mask):
            if how is not None:
                output = _tfprivate.with_output_logits(output, how, lg)
            if masked:  # Keras's metrics read an output's mask from the output
                output = tf.identity(output) if how is None else output
                output._keras_mask = mask
            carried.append(output)
        _tfprivate.build_compiled_metrics(
            metrics_model, _one_or_list(labels), _one_or_list(carried)
        )
        as_stock = [_as_in_stocks_graph(y, o) for y, o in zip(labels, carried)]
        update = metrics_model.compiled_metrics.update_state
        per_output = list(weights)
        outputs, weights = _one_or_list(carried), _one_or_list(weights)
        if all(a is y for a, y in zip(as_stock, labels)):
            update(_one_or_list(labels), outputs, weights)
            return
        # [batch] labels of a [batch, 1] output: weighted_metrics weigh each row, as Keras's
        # model.evaluate reads them ([batch, 1]; stock's estimator leaves them unweighted),
        # the others as stock's graph (one value per batch where they reduce the last axis).
        with _tfprivate.compiled_metrics_only(metrics_model, weighted=False):
            update(_one_or_list(as_stock), outputs, weights)
        # (an output without sample weights: as stock's graph, unweighted)
        weighed = has_weight or [True] * len(labels)
        rows = [
            _padding.row_labels(y, o) if w else a
            for y, o, a, w in zip(labels, carried, as_stock, weighed)
        ]
        if not all(weighed):
            weights = _one_or_list([w if given else None for w, given in zip(per_output, weighed)])
        with _tfprivate.compiled_metrics_only(metrics_model, weighted=True):
            update(_one_or_list(rows), outputs, weights)

    return update


def _as_in_stocks_graph(label, output):
    """A [batch] label of a [batch, 1] output without a static rank, so Keras's metrics container
    does not expand it to [batch, 1] as it does in ``model.evaluate``: stock's graph hands it to
    each metric as it is, and a metric reducing the last axis (``mae``) then gives one value per
    batch, which stock averages over the batches."""
    if _padding.row_labels(label, output) is label:
        return label
    return tf.compat.v1.placeholder_with_default(label, shape=None)


class StrategyEstimator(_tfprivate.EstimatorBase):
    """The stock Estimator whose ``train``, ``evaluate`` and ``predict`` run the Keras model under
    a ``tf.distribute`` strategy (see the module's docstring for why it subclasses Estimator)."""

    #: The metric_fns ``tf.estimator.add_metrics`` added to its evaluation, in order (:func:`add_metrics`).
    _tpushim_metric_fns = ()

    def __init__(
        self, model_fn, config, warm_start_from, plan, object_checkpoints=True, v1_api=False
    ):
        super().__init__(model_fn=model_fn, config=config, warm_start_from=warm_start_from)
        self._tpushim_plan = plan
        self._tpushim_v1_api = v1_api  # made through tf.compat.v1's model_to_estimator
        plan.name_based_checkpoints = not object_checkpoints  # stock's 'saver' format
        self._tpushim_strategy = None
        # The checkpoints stock keeps: its Keras estimator's object-based Saver keeps 5, whatever
        # keep_checkpoint_max says; a name-based one (the v1 spelling) keep_checkpoint_max.
        self._tpushim_keep = (
            _step_events.OBJECT_CHECKPOINTS_KEPT
            if object_checkpoints
            else self.config.keep_checkpoint_max
        )

    def _assert_members_are_not_overridden(self):
        # Estimator forbids overriding train/evaluate/predict; this engine replaces exactly those.
        pass

    # What tpushim's estimator API (TF >= 2.16) asks of an engine's estimator (tpushim/_legacy).
    def _tpushim_add_metrics(self, metric_fn, model_fn):
        """``tf.estimator.add_metrics(self, metric_fn)``: this engine's, with ``model_fn``."""
        return add_metrics(self, metric_fn, model_fn)

    def _tpushim_built_around(self, called):
        """A stock estimator was built around this one's ``model_fn``: said."""
        return said_stock_around(self, called)

    def export_savedmodel(self, export_dir_base, serving_input_receiver_fn, **kwargs):
        """Through tf.compat.v1's model_to_estimator stock returns a v1 Estimator, whose
        deprecated ``export_savedmodel`` exports (a v1 script calls it); through the v2 one,
        stock's EstimatorV2 refuses it with its own error (2.12 - 2.15)."""
        base = _tfprivate.EstimatorBase
        if self._tpushim_v1_api and _tfprivate.estimator_lib is not None:
            base = _tfprivate.estimator_lib.Estimator  # the v1 class, EstimatorV2's base
        return base.export_savedmodel(self, export_dir_base, serving_input_receiver_fn, **kwargs)

    @property
    def strategy(self):
        """The ``tf.distribute`` strategy this estimator runs under (made at the first call)."""
        if self._tpushim_strategy is None:
            self._tpushim_strategy = self._tpushim_plan.make_strategy()
        return self._tpushim_strategy

    def _input(self, input_fn, mode):
        plan = self._tpushim_plan
        made = distributed_input(
            self.strategy,
            input_fn,
            mode,
            self.config,
            plan.batch_size,
            plan.pod_input,
            # Shape-from-model, as the TPU path's (a subclassed model declares no inputs).
            None
            if _tfprivate.is_subclassed(plan.keras_model)
            else _shapes.ModelInputs.of(plan.keras_model, feature_split=False),
            plan.host,
        )
        # Evaluation and prediction read it in Python: each batch's wait timed (the run summary).
        if mode == ModeKeys.TRAIN or isinstance(made.dataset, _strategy_input.WithHostOutputs):
            return made
        return made._replace(dataset=_input_wait.timed(made.dataset))

    def _input_first(self, input_fn, mode):
        """A subclassed model's clone is built on the input's shapes, so its input is made
        before its :class:`_Run` (``input``: a :class:`tpushim._strategy_input.Made`,
        ``features``: a replica's feature specs); a graph network's after (both None)."""
        if not _built_on_input(self._tpushim_plan.keras_model):
            return types.SimpleNamespace(input=None, features=None)
        made = self._input(input_fn, mode)
        return types.SimpleNamespace(input=made, features=features_spec(made[1]))

    def _runtime(self):
        return runtime(self._tpushim_plan)

    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        # Observers (the run summary, the preflight) hear of the call and may cap its steps.
        with (
            self._runtime(),
            _observe.calling(_observe.Call("train", self, input_fn, steps, max_steps)) as call,
        ):
            started = time.monotonic()
            with _input_wait.strategy_timing() as wait:  # observed or not: the same function
                ran, first = self._train(
                    input_fn, hooks, call.steps, call.max_steps, saving_listeners
                )
            _observe.input_waited(call, wait.seconds)
            _observe.finished(call, time.monotonic() - started, ran, first)
            return self

    def _train(self, input_fn, hooks, steps, max_steps, saving_listeners):
        """Trains as stock; returns (steps run, the first tf.function call's seconds)."""
        # One check for both engines, and stock's read of the saved step.
        from tpushim._legacy._estimator import check_train_steps, global_step_saved

        check_train_steps(steps, max_steps)
        listeners = list(saving_listeners or ())
        early = self._input_first(input_fn, ModeKeys.TRAIN)
        run = _Run(
            self._tpushim_plan, self.strategy, ModeKeys.TRAIN, self.model_dir, None, early.features
        )
        start = int(run.step.numpy())
        # StopAtStepHook stops at the first global step >= max_steps (or start + steps): a float
        # from `epochs * rows / batch` runs to its ceiling, as stock's does.
        last = math.ceil(max_steps) if max_steps is not None else None
        if last is not None and start >= last:
            if max_steps <= global_step_saved(self.model_dir):
                logging.getLogger("tensorflow").info(
                    "Skipping training since max_steps has already saved."
                )
                return 0, None
            # Stock's skip reads 0 from an object-based checkpoint (no `global_step` name in
            # it): it trains, and its StopAtStepHook stops after the one step it runs.
            last = start + 1
        # The input first, as stock calls its input_fn first: an input refused (tensors on a
        # pod) refuses before anything is written (events, model.ckpt-0), hooks begun.
        made = early.input or self._input(input_fn, ModeKeys.TRAIN)
        check_input_keys(self._tpushim_plan, run.model, made.spec)
        check_row_labels(run.model, run.terms, made.spec)
        check_metric_names_map(self._tpushim_plan)  # stock's model_fn checks it at train() too
        # Stock's model_fn compiles a clone here, naming the user's metric objects once more.
        _tfprivate.name_metric_objects_as_a_compile(self._tpushim_plan.keras_model)
        strategy = self.strategy
        if self._tpushim_plan.jit_compile and not isinstance(strategy, tf.distribute.TPUStrategy):
            # What a TPU could not compile is refused before anything is written.
            check_xla_once(self._tpushim_plan, made[1], strategy.num_replicas_in_sync)
        # The user's hooks begin, and see their first step, before anything is written.
        user_hooks = _step_events.SessionHooks(hooks, start) if hooks else None
        try:
            return self._train_steps(run, made, user_hooks, start, steps, last, listeners)
        finally:
            if user_hooks is not None:
                user_hooks.close()

    def _train_steps(self, run, made, user_hooks, start, steps, last, listeners):
        config = self.config
        # Stock's graph in the events, and where RunConfig's checkpoint_save_graph_def says
        # (True by default) in graph.pbtxt and model.ckpt-N.meta: the one graph built per
        # conversion for the checkpoints' names (_strategy_checkpoint.stock_meta_graph).
        plan = self._tpushim_plan
        meta_bytes, graph_text = None, None
        if getattr(config, "checkpoint_save_graph_def", True):
            meta_bytes, graph_text = _strategy_checkpoint.stock_graph_files(plan)
        tags = _strategy_checkpoint.stock_scalar_tags(plan)  # the model's scalars' tags
        events = _step_events.StepEvents(
            config,
            self.model_dir,
            _strategy_checkpoint.stock_graph(plan),
            _strategy_checkpoint.stock_meta_graph(plan),
            graph_text,
        )
        kept = _step_events.Kept(self.model_dir, self._tpushim_keep)
        for listener in listeners:
            listener.begin()
        # CheckpointSaverHook's timer: the step and time of the last save (the next one falls
        # save_checkpoints_steps after it, or save_checkpoints_secs after it, at a call's end).
        saved = {"step": start, "at": time.monotonic()}

        def save():
            # CheckpointSaverListeners as stock's saver calls them (train_and_evaluate evaluates
            # in after_save); they get no session: this engine has none.
            step = int(run.step.numpy())
            for listener in listeners:
                listener.before_save(None, step)
            run.save(kept, meta_bytes)
            events.checkpoint(step)
            saved.update(step=step, at=time.monotonic())
            return any([listener.after_save(None, step) for listener in listeners])

        stopped = False
        if not run.restored:
            stopped = save()  # stock's model.ckpt-0
        else:  # stock saves the restored step again (the same values): said, not rewritten
            events.checkpoint(start)
        stop = start + math.ceil(steps) if steps is not None else last
        iterator = iter(made.dataset)
        left = made.steps  # the batches left where known: each call reads no further
        loop = run.train_function(checked=left is None)
        every = config.save_checkpoints_steps
        every_secs = config.save_checkpoints_secs
        per_call = self._tpushim_plan.steps_per_execution
        step, first = start, None
        try:
            while not stopped and (stop is None or step < stop):
                n = per_call if stop is None else min(per_call, stop - step)
                if every:  # a checkpoint falls at the end of a call
                    n = min(n, max(saved["step"] + every - step, 1))
                if user_hooks is not None:  # a hook's stop falls at the end of a call
                    n = user_hooks.per_call(step, n)
                began = time.monotonic()
                reads = n if left is None else min(n, left)  # fewer: the input ends in this call
                ran, losses, scalars = loop(iterator, tf.constant(reads, tf.int64))
                left = None if left is None else left - int(ran)
                ended = time.monotonic()
                first = ended - began if first is None else first
                ran, losses = int(ran), losses.numpy()
                scalars = scalars.numpy().reshape(ran, -1) if ran else None
                label, step = step, int(run.step.numpy())
                # Stock's hooks after each step; at a save step the checkpoint comes first.
                times = _step_events.step_times(began, ended, ran)
                for k in range(ran):
                    if user_hooks is not None:
                        user_hooks.before(label + k)  # before the step's checkpoint, as stock's
                    if k == ran - 1 and (
                        (every and step >= saved["step"] + every)
                        or (every_secs and ended - saved["at"] >= every_secs)
                    ):
                        stopped = save()
                    given = None
                    if scalars is not None and run.scalar_count == len(tags):
                        given = list(zip(tags, scalars[k].tolist()))
                    elif scalars is not None and (id(plan), "tags") not in _SAID_SUMMARIES:
                        _SAID_SUMMARIES.add((id(plan), "tags"))
                        logger.warning(
                            "tpushim: the model made %d tf.compat.v1.summary.scalar calls in "
                            "the engine's step and %d in stock's graph (%s): not written.",
                            run.scalar_count,
                            len(tags),
                            ", ".join(tags),
                        )
                    stopped = (
                        events.step(losses[k], label + k, times[k], user_hooks, given) or stopped
                    )
                if ran < n:  # the input ran out
                    if user_hooks is not None:  # stock's last session.run: before_run, then
                        user_hooks.before(step)  # OutOfRangeError
                    break
            if tf.train.latest_checkpoint(self.model_dir) != os.path.join(
                self.model_dir, f"model.ckpt-{step}"
            ):
                save()
            if user_hooks is not None:
                user_hooks.end(step)  # after the last checkpoint, as stock's hooks' end()
        finally:
            events.close()
        events.end()
        for listener in listeners:
            listener.end(None, step)
        return step - start, first

    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
        with (
            self._runtime(),
            _observe.calling(_observe.Call("evaluate", self, input_fn, steps)) as call,
        ):
            started = time.monotonic()
            with _input_wait.strategy_timing() as wait:
                results = self._evaluate(input_fn, call.steps, hooks, checkpoint_path, name)
            _observe.input_waited(call, wait.seconds)
            _observe.finished(call, time.monotonic() - started)
            return results

    def _evaluate(self, input_fn, steps, hooks, checkpoint_path, name):
        results = self._evaluate_named(input_fn, steps, hooks, checkpoint_path, name)
        # Stock's model_fn compiled a clone for this evaluation, naming the user's metric
        # objects once more (the engine's metrics model named its copies so: see _metrics_model).
        _tfprivate.name_metric_objects_as_a_compile(self._tpushim_plan.keras_model)
        return results

    def _evaluate_named(self, input_fn, steps, hooks, checkpoint_path, name):
        early = self._input_first(input_fn, ModeKeys.EVAL)
        check_metric_names_map(self._tpushim_plan)
        run = _Run(
            self._tpushim_plan,
            self.strategy,
            ModeKeys.EVAL,
            self.model_dir,
            checkpoint_path,
            early.features,
        )
        user_hooks = _step_events.SessionHooks(hooks, int(run.step.numpy())) if hooks else None
        try:
            return self._evaluate_batches(
                run, early, input_fn, steps, user_hooks, checkpoint_path, name
            )
        finally:
            if user_hooks is not None:
                user_hooks.close()

    def _evaluate_batches(self, run, early, input_fn, steps, user_hooks, checkpoint_path, name):
        dataset, element_spec, _ = early.input or self._input(input_fn, ModeKeys.EVAL)
        check_input_keys(self._tpushim_plan, run.model, element_spec)
        check_row_labels(run.model, run.terms, element_spec)
        names = run.model.output_names
        added = _strategy_metrics.added(
            self._tpushim_metric_fns,
            self.config,
            # (a subclassed model has no symbolic outputs: its metric_fns see no output specs)
            {n: tf.TensorSpec(o.shape, o.dtype) for n, o in zip(names, run.model.outputs or ())},
            given_parts(element_spec),
        )
        if added is None:
            forward = run.eval_function()
        else:  # only what the metrics read comes to the host
            forward = run.eval_function({p: u for p, u in added.used.items() if p != "predictions"})
        metrics_model = _metrics_model(self._tpushim_plan, early.features)
        update = None  # made at the first batch
        losses = []
        ran_out = True
        for i, element in enumerate(dataset):
            if steps is not None and i >= steps:
                ran_out = False
                break
            if user_hooks is not None:
                user_hooks.before(int(run.step.numpy()))
            loss, *per_replica = forward(element)
            losses.append(float(loss))
            given = run.gathered(per_replica.pop()) if added is not None else {}
            outputs, labels, pad, weights, masks, logits = run.gathered(tuple(per_replica))
            # Keras weighs only weighted_metrics by a sample weight: padding rows are left out
            # (by the update, which keeps the rows whose padding weight is not 0).
            if added is not None:  # stock's predictions: the outputs by name
                predictions = tf.nest.flatten(dict(zip(names, outputs)))
                given["predictions"] = [predictions[i] for i in added.used["predictions"]]
                added.update(_strategy_metrics.real_rows(given, pad.numpy() > 0))
            if update is None:
                has_mask = [bool(mask.shape[0]) for mask in masks]
                given = _unpack(element_spec, names)[3] or [None] * len(masks)
                has_weight = [w is not None for w in given]
                update = _metrics_update(metrics_model, run.logits_how, has_mask, has_weight)
            update(labels, outputs, logits, weights, masks, pad)
            if user_hooks is not None and user_hooks.after(int(run.step.numpy()), False):
                ran_out = False
                break  # a hook's request_stop(): stock's evaluation ends there too
        if user_hooks is not None:
            if ran_out:  # stock's last session.run: before_run, then OutOfRangeError
                user_hooks.before(int(run.step.numpy()))
            user_hooks.end(int(run.step.numpy()))
        # In stock's order: the loss, the metrics, the global step.
        results = {"loss": np.float32(np.mean(losses)) if losses else np.float32(np.nan)}
        compiled = [m for m in metrics_model.compiled_metrics.metrics if m.name != "loss"]
        stock_names = getattr(self._tpushim_plan, "metric_names", None)
        if stock_names is None or len(stock_names) != len(compiled):
            stock_names = [m.name for m in compiled]
        # model_to_estimator's metric_names_map, checked as stock before anything is written
        mapped = _strategy_metrics.mapped_metric_names(
            stock_names, getattr(self._tpushim_plan, "metric_names_map", None)
        )
        for stock_name, m in zip(mapped, compiled):
            results[stock_name] = np.float32(m.result().numpy())
        if added is not None:  # stock's add_metrics: an added name replaces a compiled one
            results.update(added.results())
        results[tf.compat.v1.GraphKeys.GLOBAL_STEP] = int(run.step.numpy())
        evaluated = checkpoint_path or run.restored or self._tpushim_plan.conversion.warm_start
        _step_events.write_evaluation(
            self.eval_dir(name),
            results,
            evaluated,
            _strategy_checkpoint.stock_graph(self._tpushim_plan),
        )
        return results

    def predict(
        self,
        input_fn,
        predict_keys=None,
        hooks=None,
        checkpoint_path=None,
        yield_single_examples=True,
    ):
        # Each prediction computed in the engine's runtime, the caller's code between two in
        # its own (a program's graph mode).
        yield from _each_resumed_in(
            self._runtime,
            self._predict_observed(
                input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples
            ),
        )

    def _predict_observed(
        self, input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples
    ):
        with _observe.calling(_observe.Call("predict", self, input_fn)) as call:
            started = time.monotonic()
            with _input_wait.strategy_timing() as wait:
                yield from self._predict(
                    input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples
                )
            _observe.input_waited(call, wait.seconds)
            _observe.finished(call, time.monotonic() - started)

    def _predict(self, input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples):
        early = self._input_first(input_fn, ModeKeys.PREDICT)
        run = _Run(
            self._tpushim_plan,
            self.strategy,
            ModeKeys.PREDICT,
            self.model_dir,
            checkpoint_path,
            early.features,
        )
        step = int(run.step.numpy())
        user_hooks = _step_events.SessionHooks(hooks, step) if hooks else None
        try:
            yield from self._predict_batches(
                run, early, input_fn, predict_keys, user_hooks, yield_single_examples
            )
            if user_hooks is not None:
                user_hooks.end(step)
        finally:
            if user_hooks is not None:
                user_hooks.close()

    def _predict_batches(
        self, run, early, input_fn, predict_keys, user_hooks, yield_single_examples
    ):
        made = early.input or self._input(input_fn, ModeKeys.PREDICT)
        check_input_keys(self._tpushim_plan, run.model, made.spec)
        dataset = made.dataset
        forward = run.predict_function()
        names = run.model.output_names
        step = int(run.step.numpy())
        for element in dataset:
            outs = {}
            if isinstance(dataset, _strategy_input.WithHostOutputs):
                element, outs = element  # the outputs the host made (a key passed through)
            if user_hooks is not None:
                user_hooks.before(step)
            outputs, pad = run.gathered(forward(element))
            real = pad.numpy() > 0
            batch = {n: outs.get(n, o).numpy()[real] for n, o in zip(names, outputs)}
            if predict_keys:
                batch = {k: v for k, v in batch.items() if k in predict_keys}
            stop = user_hooks is not None and user_hooks.after(step, False)
            if not yield_single_examples:
                yield batch
            else:
                for i in range(int(real.sum())):
                    yield {k: v[i] for k, v in batch.items()}
            if stop:  # stock's predict() ends after the batch a hook stopped at
                return
        if user_hooks is not None:  # stock's last session.run: before_run, then OutOfRangeError
            user_hooks.before(step)


def runtime(plan):
    """Where the engine runs ``plan``'s calls: on the eager runtime, also for a program that
    disabled it (:func:`tpushim._tfprivate.eager_runtime`; its graph mode back after a call)."""
    if getattr(plan, "graph_mode", False):
        return _eager_runtime(plan.keras_model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _eager_runtime(keras_model):
    """The eager runtime for a program that disabled it, left as that program had it: its
    graph mode back, and its model's v1 classes (the eager clones swapped them to v2)."""
    try:
        with _tfprivate.eager_runtime():
            yield
    finally:
        _tfprivate.restore_v2_classes(keras_model, v1=True)


def _each_resumed_in(context, generator):
    """``generator``'s items, each computed within a fresh ``context()`` left before it is
    yielded: the caller's code between two predictions runs in its own world (its graph mode)."""
    try:
        while True:
            with context():
                try:
                    item = next(generator)
                except StopIteration:
                    return
            yield item
    finally:
        with context():
            generator.close()


def _one_or_list(values):
    """One output's value, or a list in the model's output order: Keras's metrics container zips
    it with its output names (a dict it would order by name: a model whose outputs are not named
    in alphabetical order had its metrics' names swapped, zeta_accuracy holding alpha's)."""
    return values[0] if len(values) == 1 else list(values)


# --- the conversion ------------------------------------------------------------------------------


def describe(plan, settings, tpu, why):
    """The conversion line's description of this engine's estimator: where it runs and why."""
    return (
        "the strategy engine: "
        + (
            f"tf.distribute.TPUStrategy on TPU {tpu.describe()} [TPU from {tpu.source}]"
            if tpu is not None
            else "tf.distribute.MirroredStrategy over this machine's devices "
            f"[mode cpu from {settings.sources.get('mode')}]"
        )
        + f", global batch {settings.batch_size or 'from input'}"
        + f", steps_per_execution {plan.steps_per_execution} [engine: {why}]"
    )


def build_on_engine(arguments, settings, tpu, why):
    """The strategy engine's estimator on TensorFlow >= 2.16 (no tensorflow_estimator): built on
    tpushim's own Estimator (:mod:`tpushim._legacy`) as on 2.12-2.15 it is built on stock's, with
    that engine's Keras model_fn (export) and warm-start checkpoint, which are stock 2.15's.

    Args:
      arguments: the ``model_to_estimator`` call's arguments by name.
      settings: the resolved :class:`tpushim._settings.Settings`.
      tpu: the :class:`tpushim._detect.TPUSpec` to run on, or None (cpu mode).
      why: why the strategy engine runs (:func:`tpushim._engines.choose`).
    """
    from tpushim import _detect
    from tpushim._legacy import _keras as engine_keras

    with _observe.converting(arguments) as arguments:
        keras_model = arguments["keras_model"]
        if keras_model is not None and arguments["keras_model_path"]:
            raise ValueError(
                "Please specity either `keras_model` or `keras_model_path`, but not both."
            )
        if keras_model is None:
            path = arguments["keras_model_path"]
            if not path:
                raise ValueError("Either `keras_model` or `keras_model_path` needs to be provided.")
            if path.startswith("gs://") or "storage.googleapis.com" in path:
                raise ConversionError(
                    f"tpushim loads keras_model_path from local or mounted paths; copy {path} "
                    "locally first (gsutil cp) and pass that path."
                )
            keras_model = tf.keras.models.load_model(
                path, custom_objects=arguments["custom_objects"]
            )
        custom_objects = arguments["custom_objects"]
        engine_keras._assert_valid_model(keras_model, custom_objects)
        checkpoint_format = arguments["checkpoint_format"]
        if checkpoint_format not in (None, "checkpoint", "saver"):
            raise ValueError(
                f'Checkpoint format must be one of "checkpoint" or "saver". Got {checkpoint_format}'
            )
        if checkpoint_format != "saver" and _tfprivate.is_subclassed(keras_model):
            raise ValueError(
                "Object-based checkpoints are currently not supported with "
                "subclassed models."  # stock's text, then how to get past it
                " Pass checkpoint_format='saver' to model_to_estimator."
            )
        if not getattr(keras_model, "optimizer", None):
            raise ValueError(
                "The given keras model has not been compiled yet. Please compile the model with "
                "`model.compile()` before calling `model_to_estimator()`."
            )
        optimizer = keras_model.optimizer
        if not isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer) and isinstance(
            optimizer, tf.keras.optimizers.Optimizer
        ):  # as stock: a new-style optimizer becomes its legacy twin (estimators need one)
            optimizer = tf.keras.__internal__.optimizers.convert_to_legacy_optimizer(optimizer)
        cluster = _detect.cluster_resolver(tpu) if tpu is not None else None
        plan = make_plan(
            keras_model,
            optimizer,
            custom_objects,
            settings,
            lambda: tpu_strategy(cluster) if cluster is not None else cpu_strategy(),
        )
        if cluster is not None:  # a TPU that does not answer fails now, before anything is written
            _detect.check_tpu_answers(cluster, tpu.source)
        config = _tfprivate.maybe_overwrite_model_dir_and_session_config(
            arguments["config"], arguments["model_dir"]
        )
        if optimizer is not keras_model.optimizer:
            logger.warning(
                "converting optimizer %s to tf.keras.optimizers.legacy, as the stock "
                "model_to_estimator does.",
                type(keras_model.optimizer).__name__,
            )
            keras_model.optimizer = optimizer
        save_object_ckpt = checkpoint_format != "saver"
        model_fn = engine_keras._model_fn_for(
            keras_model,
            custom_objects,
            save_object_ckpt,
            arguments["metric_names_map"],
            arguments["export_outputs"],
        )
        warm_start_path = None
        if _tfprivate.is_graph_network(keras_model) and config.is_chief:  # as stock
            warm_start_path = engine_keras._save_first_checkpoint(
                keras_model,
                custom_objects,
                config,
                save_object_ckpt,
                on_graph=functools.partial(
                    _strategy_checkpoint.remember, plan, object_based=save_object_ckpt
                ),
            )
        built = (model_fn, config, warm_start_path, save_object_ckpt)
        return made(keras_model, plan, arguments, settings, (tpu, why), built)


def made(keras_model, plan, arguments, settings, tpu_why, built):
    """The conversion's last step on either TensorFlow: the plan completed (its TPU, its
    warm-start checkpoint, read into its weights), the :class:`StrategyEstimator`, its line,
    and the observers told. ``tpu_why``: the TPU (or None) and why this engine; ``built``:
    ``(model_fn, config, warm-start checkpoint, object-based checkpoints?)``."""
    from tpushim import _log

    tpu, why = tpu_why
    model_fn, config, warm_start_path, save_object_ckpt = built
    plan.conversion = dataclasses.replace(plan.conversion, tpu=tpu, warm_start=warm_start_path)
    plan.metric_names_map = arguments["metric_names_map"]
    warm_from_first_checkpoint(plan, warm_start_path)
    estimator = StrategyEstimator(
        model_fn,
        config,
        warm_start_path,
        plan,
        object_checkpoints=save_object_ckpt,
        # (on TF >= 2.16 one Estimator class: its export_savedmodel exports either way)
        v1_api=not arguments.get("use_v2_estimator", True),
    )
    description = describe(plan, settings, tpu, why)
    _log.conversion(description, settings.quiet)
    _observe.converted(
        _observe.Conversion(estimator, keras_model, arguments, settings, model_fn, description)
    )
    return estimator


def add_metrics(estimator, metric_fn, model_fn):
    """The strategy engine's estimator ``tf.estimator.add_metrics(estimator, metric_fn)`` returns:
    ``estimator`` (its conversion, config, model_dir, warm start) whose evaluation also computes
    ``metric_fn``'s metrics as stock's does (:mod:`tpushim._strategy_metrics`).

    Args:
      estimator: a :class:`StrategyEstimator` (one add_metrics made, too: the metrics add up).
      metric_fn: the user's, its arguments checked by ``add_metrics`` (stock's check).
      model_fn: the model_fn stock's ``add_metrics`` made (the estimator's, with the metrics in
        EVAL mode): the new estimator's, so that what a script builds from it is stock's.
    """
    added = StrategyEstimator(
        model_fn,
        estimator.config,
        _tfprivate.warm_start_settings(estimator),
        estimator._tpushim_plan,
    )
    added._tpushim_keep = estimator._tpushim_keep
    added._tpushim_v1_api = estimator._tpushim_v1_api
    added._tpushim_strategy = estimator._tpushim_strategy
    added._tpushim_metric_fns = (*estimator._tpushim_metric_fns, metric_fn)
    _observe.derived(added, estimator, model_fn)
    logger.info(
        "tf.estimator.add_metrics -> the strategy engine's estimator with the metrics of %s",
        getattr(metric_fn, "__name__", metric_fn),
    )
    return added


def said_stock_around(estimator, called):
    """True, said in one line and told to observers, when ``estimator`` is the strategy engine's
    and ``called`` (an estimator constructor) builds stock's estimator around its model_fn: the
    engine does not take an estimator made from its model_fn (never silent)."""
    if not isinstance(estimator, StrategyEstimator):
        return False
    why = "the strategy engine does not take an estimator made from its model_fn"
    logger.warning(
        "%s -> stock Estimator, which runs stock's model_fn "
        "(on a TPU nothing would run on it): %s. To add metrics, use "
        "tf.estimator.add_metrics(<the converted estimator>, metric_fn), which keeps the engine; "
        "for another model_dir or config, give them to model_to_estimator; or use "
        "engine='tpuestimator' where TPUEstimator runs.",
        called,
        why,
    )
    _observe.bypassed(estimator, f"{called}: {why}")
    return True
