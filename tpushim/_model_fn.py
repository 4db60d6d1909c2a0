"""The model_fn factory: a compiled Keras model -> a TPUEstimator model_fn.

The model_fn mirrors keras_lib's (clone and build per mode, warm-startable variable names) and
differs where a TPU needs it to:

* TRAIN: gradients are averaged across shards -- for a Keras optimizer through the clone's
  ``gradient_aggregator`` (set on the clone, before its train function is made: it is not part of
  ``get_config``), for a ``tf.compat.v1.train`` optimizer through ``CrossShardOptimizer``; each of
  a WideDeepModel's two optimizers on its own sub-model's gradients. Each shard differentiates
  the loss :mod:`tpushim._losses` builds, so that average is the global batch's gradient for
  every kind of loss, and the step reports the global batch's loss; on a TPU a ``host_call``
  writes stock's training summaries (:mod:`tpushim._summaries`) and each step records its loss
  for stock's log line and NaN check (:mod:`tpushim._step_losses`). Nothing TPU-only is emitted
  when ``params['use_tpu']`` is false (CrossReplicaSum has no CPU kernel).
* EVAL: ``eval_metrics=(metric_fn, tensors)``; ``metric_fn`` rebuilds every compiled metric from
  its config and returns ``(value, update_op)`` pairs, which is what TPUEstimator needs on a TPU.
* Checkpoints through ``scaffold_fn``: TPUEstimator ignores ``scaffold`` on a TPU.
"""

import contextlib
import dataclasses

import tensorflow as tf

from tpushim import (
    _batchnorm,
    _feature_columns,
    _first_checkpoint,
    _host_part,
    _loss_kinds,
    _losses,
    _metric_names,
    _padding,
    _step_losses,
    _summaries,
    _tfprivate,
)
from tpushim._errors import ConversionError

ModeKeys = _tfprivate.estimator.ModeKeys  # (tf.estimator on TensorFlow >= 2.16 once patched)
#: How this path's refusals name it.
ENGINE = "tpushim's TPUEstimator path"


def optimizer_kind(optimizer):
    """``"keras"`` (aggregated by gradient_aggregator) or ``"tf1"`` (CrossShardOptimizer).

    Raises:
      ConversionError: the optimizer cannot have its gradients averaged across TPU shards.
    """
    if isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
        return "keras"
    if isinstance(optimizer, _tfprivate.keras.keras_v1_tf_optimizer_class()):
        return "tf1"
    raise ConversionError(
        f"tpushim cannot average the gradients of optimizer {type(optimizer).__module__}."
        f"{type(optimizer).__name__} across TPU shards. Compile the model with a Keras optimizer "
        f"(e.g. tf.keras.optimizers.legacy.SGD / Adam) or a tf.compat.v1.train optimizer."
    )


def _cross_shard_mean(grads_and_vars):
    """gradient_aggregator for a TPU: the mean of every gradient over all shards."""
    num_shards = _tfprivate.tpu.num_shards_in_replica_context() or 1
    out = []
    for grad, var in grads_and_vars:
        if grad is not None:
            grad = tf.compat.v1.tpu.cross_replica_sum(tf.convert_to_tensor(grad)) * (
                1.0 / num_shards
            )
        out.append((grad, var))
    return out


def _no_aggregation(grads_and_vars):
    return list(grads_and_vars)


def _set_aggregation(model, use_tpu):
    """Every optimizer of the clone averages its gradients across shards: a WideDeepModel compiled
    with two (linear, dnn) applies each to its own sub-model's variables."""
    optimizers = (
        model.optimizer if isinstance(model.optimizer, (list, tuple)) else [model.optimizer]
    )
    for optimizer in optimizers:
        if optimizer_kind(optimizer) == "keras":
            optimizer.gradient_aggregator = _cross_shard_mean if use_tpu else _no_aggregation
        elif use_tpu:
            optimizer.optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer.optimizer)


def _clone_metric(metric):
    clone = metric.__class__.from_config(metric.get_config())
    _tfprivate.keras_compile.set_metric_name(clone, metric.name)
    return clone


def stable_metric_name(name, output_names):
    """Undoes Keras 2's growing prefix: on a multi-output model, a Metric object passed to
    compile() gains its output's name once more every time the model is cloned, so the stock
    estimator reports ``reg_reg_reg_rmse`` after three clones and one ``reg_`` more on each
    evaluate(). tpushim reports the name Keras's own ``model.evaluate`` uses: ``reg_rmse``."""
    if len(output_names) > 1:
        for out in output_names:
            prefix = out + "_"
            while name.startswith(prefix + prefix):
                name = name[len(prefix) :]
    return name


def _metric_plan(model, metric_names_map):
    """[(reported name, output index, weighted, Metric)] for every compiled metric of the clone."""
    plan = []
    for index, (unweighted, weighted) in enumerate(
        _tfprivate.keras_compile.per_output_metrics(model)
    ):
        for is_weighted, metrics in ((False, unweighted), (True, weighted)):
            for metric in metrics.values():
                name = stable_metric_name(metric.name, model.output_names)
                plan.append((name, index, is_weighted, metric))
    names = _metric_names.mapped_metric_names([name for name, _, _, _ in plan], metric_names_map)
    return [(name, i, w, m) for name, (_, i, w, m) in zip(names, plan)]


def _eval_metrics(model, metric_names_map, padding_weight):
    """(metric_fn, tensors) computing every compiled metric, per output, as stock names them.

    On a TPU, TPUEstimator runs ``metric_fn`` on the host, over the tensors of all shards
    concatenated: there it can drop the padding rows, so every metric sees exactly the rows of
    stock's batch -- including metrics that reduce a batch to one value (a custom function, or
    [batch] labels for a [batch, 1] output, which Keras averages per batch). What Keras's metrics
    read from the output tensor itself besides its values -- its logits, its Keras mask -- goes
    to ``metric_fn`` as tensors of their own.
    """
    plan = _metric_plan(model, metric_names_map)
    if not plan:
        return None
    tensors, logits_how = {}, {}
    for index, endpoint in enumerate(_tfprivate.keras_compile.training_endpoints(model)):
        if endpoint.should_skip_target():
            continue
        output = endpoint.output
        tensors[f"y_true_{index}"] = endpoint.training_target.target
        tensors[f"y_pred_{index}"] = output
        how, logits = _tfprivate.keras_compile.output_logits(output)
        if how is not None:
            logits_how[index] = how
            tensors[f"logits_{index}"] = logits
        mask = getattr(output, "_keras_mask", None)
        if mask is not None:
            tensors[f"mask_{index}"] = mask
        if endpoint.sample_weight is not None and any(w and i == index for _, i, w, _ in plan):
            batch = tf.compat.v1.shape(output)[0]
            tensors[f"sample_weight_{index}"] = tf.broadcast_to(endpoint.sample_weight, [batch])
    if padding_weight is not None:
        tensors["padding_weight"] = padding_weight

    def metric_fn(**tensors):
        weight = tensors.pop("padding_weight", None)
        tensors = _padding.real_rows(tensors, weight)
        metric_ops, new_vars = {}, []
        for name, index, weighted, metric in plan:
            metric = _clone_metric(metric)
            y_pred = tensors[f"y_pred_{index}"]
            if index in logits_how:
                y_pred = _tfprivate.keras_compile.with_output_logits(
                    y_pred, logits_how[index], tensors[f"logits_{index}"]
                )
            y_true = tensors[f"y_true_{index}"]
            weights = tensors.get(f"sample_weight_{index}") if weighted else None
            if weights is not None:  # [batch] labels of a [batch, 1] output: each row weighed,
                y_true = _padding.row_labels(y_true, y_pred)  # as model.evaluate weighs them
            # Keras's own call: the output's mask weighs the metric (times any sample weight).
            update_op = _tfprivate.keras_compile.update_op(
                _tfprivate.keras_compile.call_metric_function(
                    metric.update_state,
                    y_true,
                    y_pred,
                    weights=weights,
                    mask=tensors.get(f"mask_{index}"),
                )
            )
            metric_ops[name] = (metric.result(), update_op)
            new_vars.extend(metric.variables)
        for collection in (
            tf.compat.v1.GraphKeys.LOCAL_VARIABLES,
            tf.compat.v1.GraphKeys.METRIC_VARIABLES,
        ):
            for var in new_vars:
                tf.compat.v1.add_to_collection(collection, var)
        return metric_ops

    return metric_fn, tensors


def _export_outputs(model, predictions, export_outputs):
    final = {
        _tfprivate.estimator.DEFAULT_SERVING_KEY: _tfprivate.modules.export_lib.PredictOutput(
            predictions
        )
    }
    if export_outputs is not None:
        different = set(export_outputs) - set(model.output_names)
        if different:
            raise _tfprivate.estimator.FormattedKeyError(  # stock keras_lib's text, verbatim
                f"The list passed into {model.output_names} does not cover requested "
                f"{export_outputs} keys defined in the keras model."
                f"\n\tExpected keys: {set(export_outputs.keys())}"
                f"\n\t{model.output_names} keys: {set(model.output_names)}"
                f"\n\tMissed keys: {different}"
            )
        for key, export_output_cls in export_outputs.items():
            final[key] = export_output_cls(predictions[key])
    return final


def _training_host_call(graph, summaries_before, train_op, loss, config, padding_weight=None):
    """The TPU train step's host call: stock's training summaries at stock's steps (see
    :mod:`tpushim._summaries`); a model's scalars weighted by each shard's real rows."""
    with tf.control_dependencies([train_op]):  # the step stock labels this step's summaries with
        step = tf.identity(tf.compat.v1.train.get_global_step())
    return _summaries.host_call(
        step,
        loss,
        _summaries.loss_tag(graph),
        _summaries.take_scalar_summaries(graph, summaries_before),
        config.model_dir,
        config.save_summary_steps,
        None if padding_weight is None else tf.reduce_sum(tf.cast(padding_weight, tf.float32)),
    )


def _scaffold_fn(model):
    """Object-based (tf.train.Checkpoint) saving, as stock does for the v2 spelling."""

    def scaffold_fn():
        _tfprivate.keras.track_global_step(model)
        _first_checkpoint.track_graph_variables(model)  # a v1 optimizer's rate's variable
        var_list = tf.compat.v2.__internal__.tracking.ObjectGraphView(
            model
        ).frozen_saveable_objects()
        saver = tf.compat.v1.train.Saver(var_list=var_list, sharded=True)
        _tfprivate.keras.set_object_restore_saver(saver, model)
        return tf.compat.v1.train.Scaffold(saver=saver)

    return scaffold_fn


def _refuse_weighted_one_number(features, names, one_number):
    """Sample weights stock's graph refuses (:func:`tpushim._padding.check_sample_weight_shapes`:
    stock's error), and sample weights on a loss that [batch] labels make one number for the batch
    (:func:`tpushim._padding.one_number_outputs`): stock's first step fails on them ("Can not
    squeeze dim[0]"), so they are refused, naming the fix, before anything is written."""
    if not (isinstance(features, dict) and set(features) == {"features", "sample_weights"}):
        return
    weights = _tfprivate.keras_compile.standardize_sample_weights(features["sample_weights"], names)
    _padding.check_sample_weight_shapes(weights)
    for name, weight in zip(names, weights):
        if name in one_number and weight is not None:
            raise ConversionError(
                f"output {name!r} has [batch] labels for its [batch, 1] output and sample "
                "weights: Keras squeezes the output to [batch], so its loss is one number for "
                "the whole batch, which no per-example weight can weigh; the stock estimator "
                'fails on it too ("Can not squeeze dim[0], expected a dimension of 1"). Give '
                "the labels the output's shape, [batch, 1] (labels[:, None] in the input_fn)."
            )


def _weights_of_any_batch(features, labels):
    """EVAL's sample weights with an unknown batch size where some labels are [batch]: Keras
    compiles a weighted metric of a [batch, 1] output's [batch] labels as one value for the
    batch, then squeezes the weights to its rank, which a static batch size refuses while
    building ("Can not squeeze dim[0]"; stock's input has none). The clone's own metric ops are
    never run: :func:`_eval_metrics` weighs each row."""
    if not (isinstance(features, dict) and set(features) == {"features", "sample_weights"}):
        return features
    if not any(tf.is_tensor(y) and y.shape.rank == 1 for y in tf.nest.flatten(labels)):
        return features
    weights = tf.nest.map_structure(
        lambda w: (
            tf.compat.v1.placeholder_with_default(w, [None, *w.shape[1:]])
            if tf.is_tensor(w) and w.shape.rank
            else w
        ),
        features["sample_weights"],
    )
    return {"features": features["features"], "sample_weights": weights}


def _from_host(part, features):
    """(the features without the tensors the host fed, a block in which the clone's copies of
    the host layers give those tensors): a sparse input's readers, run in the input pipeline
    (:func:`tpushim._host_part.sparse_only`)."""
    fed = {k: v for k, v in features.items() if k.startswith(_host_part.HOST_PREFIX)}
    rest = {k: v for k, v in features.items() if k not in fed}

    def call(layer, inputs, *args, **kwargs):
        tensors = [t for t in tf.nest.flatten(inputs, expand_composites=True) if tf.is_tensor(t)]
        value = fed[_host_part.fed_key(part, layer.name)]
        # tied to the layer's inputs, so that what follows stays reachable from the model's
        return tf.identity_n([value, *tensors], name="tied_to_inputs")[0] if tensors else value

    return rest, _tfprivate.keras.cloned_layers_call_replaced(part.layers, call)


def make_model_fn(
    keras_model,
    custom_objects=None,
    save_object_ckpt=False,
    metric_names_map=None,
    export_outputs=None,
):
    """Returns a TPUEstimator model_fn for a compiled Keras model (Sequential, functional or
    subclassed, including the premade LinearModel / WideDeepModel)."""
    try:
        if isinstance(keras_model.optimizer, (list, tuple)):
            optimizer_config = [opt.get_config() for opt in keras_model.optimizer]
        else:
            optimizer_config = keras_model.optimizer.get_config()
    except (NotImplementedError, AttributeError):
        optimizer_config = None

    # DenseFeatures layers whose weight-free part the input pipeline computes (refused here, before
    # any checkpoint is written, where that cannot be done).
    split = _feature_columns.plan(keras_model, custom_objects)
    # SparseTensor inputs, which no TPU is fed: made dense, or their readers run, on the host.
    sparse = _host_part.sparse_only(keras_model, custom_objects, ENGINE)
    if sparse is not None and split is not None:
        raise ConversionError(
            f"{ENGINE} does not yet run a model with both DenseFeatures layers and "
            "SparseTensor inputs on a TPU: use engine='strategy', or give the model dense "
            "Inputs and make the values dense in the input_fn (tf.sparse.to_dense). Nothing "
            "was written."
        )
    plans = []  # the model's LossPlan, once known (a subclassed model's: at its first TRAIN call)

    def loss_plan(features):
        if not plans:
            plan = _loss_kinds.plan(keras_model, custom_objects)
            if plan.added is None:  # a subclassed model: known once called, before it is cloned
                plan = _loss_kinds.plan_subclassed(keras_model, custom_objects, features)
            plans.append(plan)
        return plans[0]

    def model_fn(features, labels, mode, params, config=None):
        use_tpu = bool(params.get("use_tpu", False))
        graph = tf.compat.v1.get_default_graph()
        summaries_before = len(graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES))
        features, padding_weight = _padding.split_padding(features)
        moved = contextlib.nullcontext()
        if split is not None and isinstance(features, dict):
            features, blocks = split.model_features(features)
            moved = _feature_columns.device_layers(split, blocks)
        if sparse is not None and isinstance(features, dict):
            features, moved = _from_host(sparse, features)
        # EVAL reads it too, where a custom scalar loss is combined over padding or shards.
        plan = (
            loss_plan(features)
            if mode == ModeKeys.TRAIN
            or (mode == ModeKeys.EVAL and (use_tpu or padding_weight is not None))
            else None
        )
        if plan is not None and labels is not None:
            # [batch] labels making an output's loss one number for the batch: its degree
            # (a subclassed model's outputs: from its plan's call)
            specs = plan.output_specs
            one_number = _padding.one_number_outputs(keras_model, labels, custom_objects, specs)
            names = keras_model.output_names or list(specs or ())
            _refuse_weighted_one_number(features, names, one_number)
            if one_number:
                plan = dataclasses.replace(plan, outputs={**plan.outputs, **one_number})
        else:
            one_number, specs = {}, None
        if mode == ModeKeys.TRAIN and padding_weight is not None and labels is not None:
            labels = _padding.labels_for_padded_training(keras_model, labels, one_number, specs)
        if mode == ModeKeys.EVAL:
            features = _weights_of_any_batch(features, labels)
        with moved:
            model = _tfprivate.keras.clone_and_build_model(
                mode=mode,
                keras_model=keras_model,
                custom_objects=custom_objects,
                features=features,
                labels=labels,
                optimizer_config=optimizer_config,
                # A TRAIN step never reads the metrics; compiled in, their update ops would sit in the
                # TPU computation as dead (stateful) ops.
                compile_metrics=mode != ModeKeys.TRAIN,
                # BatchNormalization's batch statistics over the real rows of a padded batch.
                batchnorm_call=(
                    _batchnorm.real_rows_call(padding_weight, cross_replica=use_tpu)
                    if mode == ModeKeys.TRAIN
                    else None
                ),
            )
        predictions = dict(zip(model.output_names, model.outputs))
        loss = train_op = eval_metrics = host_call = training_hooks = None
        if mode == ModeKeys.TRAIN:
            # As stock's train function does first: sample weights that cover only some outputs
            # are dropped (Keras then recompiles its loss without any).
            _tfprivate.keras_compile.settle_sample_weights(model)
            shards = (_tfprivate.tpu.num_shards_in_replica_context() or 1) if use_tpu else 1
            shard_loss, loss = _losses.training_loss(
                model, plan, padding_weight, shards, cross_replica=use_tpu
            )
            _tfprivate.keras_compile.replace_total_loss(model, shard_loss)
            _set_aggregation(model, use_tpu)
            iterations = _step_losses.iterations_counted(config) if use_tpu else None
            if iterations:
                # The step stock's log line and NaN check label this step's loss with: the global
                # step before it (the step's increments ordered after the read; a two-optimizer
                # model advances it twice).
                before = tf.identity(tf.compat.v1.train.get_global_step())
                with tf.control_dependencies([before]):
                    _tfprivate.keras_compile.make_train_function(model)
            elif use_tpu:
                _tfprivate.keras_compile.make_train_function(model)
            else:
                # The step's global-step increment after the read the hooks fetch with it, so
                # SummarySaverHook and the step counter see the step before it (stock's
                # model_to_estimator leaves the two unordered: its summaries can land a step off).
                with tf.control_dependencies([_tfprivate.estimator.global_step_read()]):
                    _tfprivate.keras_compile.make_train_function(model)
            train_op = model.train_function.updates_op
            if use_tpu and config is not None and config.save_summary_steps:
                host_call = _training_host_call(
                    graph, summaries_before, train_op, loss, config, padding_weight
                )
                training_hooks = [_summaries.DropLoopLossSummary()]
            if iterations:
                train_op = tf.group(train_op, _step_losses.record(loss, before, iterations))
        elif mode == ModeKeys.EVAL:
            _tfprivate.keras_compile.settle_sample_weights(
                model
            )  # as stock's _make_test_function does
            loss = _padding.eval_loss(
                model,
                padding_weight,
                cross_replica=use_tpu,
                kinds=plan and plan.outputs,
                added=plan and plan.added,
            )
            eval_metrics = _eval_metrics(model, metric_names_map, padding_weight)
        # A subclassed model Keras could not clone was reset in place: give the user theirs back.
        _tfprivate.keras.restore_subclassed_model_state(keras_model)
        return _tfprivate.modules.tpu_estimator.TPUEstimatorSpec(
            mode=mode,
            predictions=(
                _padding.with_padding_weight(predictions, padding_weight)
                if mode == ModeKeys.PREDICT
                else predictions
            ),
            loss=loss,
            train_op=train_op,
            eval_metrics=eval_metrics,
            host_call=host_call,
            training_hooks=training_hooks,
            export_outputs=_export_outputs(model, predictions, export_outputs),
            scaffold_fn=_scaffold_fn(model) if save_object_ckpt else None,
        )

    return model_fn
