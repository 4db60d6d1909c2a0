"""model_to_estimator on TensorFlow >= 2.16: a compiled tf_keras model as an Estimator.

What stock 2.15 does, on the same public tf_keras pieces: the model is cloned into each
estimator graph with ``clone_and_build_model`` (the global step as the optimizer's iterations),
trained by Keras's graph-mode train function, and warm-started from the user's weights, written
once to ``model_dir/keras/keras_model.ckpt``. The v2 spelling keeps object-based checkpoints, v1
name-based ones, as stock.
"""

import re

import tensorflow as tf

from tpushim import _first_checkpoint
from tpushim._estimator_api import _tfprivate
from tpushim._estimator_api._config import (
    EstimatorSpec,
    ModeKeys,
    overwrite_model_dir_and_session_config,
)
from tpushim._estimator_api._estimator import Estimator, replicated

_SERVING_KEY = "serving_default"


def _internal():
    return tf.compat.v2.keras.__internal__


def _any_weight_initialized(keras_model):
    if tf.compat.v1.executing_eagerly_outside_functions():
        return True
    return any(
        hasattr(w, "_keras_initialized") for layer in keras_model.layers for w in layer.weights
    )


def _tensor(x):
    """``x`` as a tensor; a ``SparseTensor`` as it is (an ``Input(sparse=True)``'s, or a
    subclassed model's feature, as stock's ``_convert_tensor``)."""
    return x if isinstance(x, tf.SparseTensor) else tf.convert_to_tensor(x)


def _to_list(obj, order, what, order_name):
    if obj is None:
        return None
    if isinstance(obj, (list, tuple)):
        return [_tensor(x) for x in obj]
    if isinstance(obj, dict):
        missing = set(order) - set(obj)
        if missing:
            raise KeyError(
                f"The dictionary passed into {what} does not cover requested {order_name} keys "
                f"defined in the keras model.\n\tExpected keys: {set(order)}\n\t{what} keys: "
                f"{set(obj)}\n\tMissed keys: {missing}"
            )
        return [_tensor(obj[k]) for k in order]
    return [_tensor(obj)]


def keras_io(keras_model, features, labels):
    """(inputs, targets, sample weights) in the model's order, as stock hands them to Keras."""
    weights = None
    if isinstance(features, dict) and set(features) == {"features", "sample_weights"}:
        features, weights = features["features"], features["sample_weights"]
    graph_network = keras_model._is_graph_network
    input_names = output_names = None
    if isinstance(features, dict):
        input_names = (
            keras_model.input_names
            if graph_network
            else ["input_%d" % i for i in range(1, len(features) + 1)]
        )
    if isinstance(labels, dict):
        output_names = (
            keras_model.output_names
            if graph_network
            else ["output_%d" % i for i in range(1, len(labels) + 1)]
        )
    if isinstance(keras_model.inputs, dict):
        inputs = {k: _tensor(features[k]) for k in keras_model.inputs}
    elif keras_model.inputs is None and isinstance(features, dict):
        inputs = {k: _tensor(v) for k, v in features.items()}
    else:
        inputs = _to_list(features, input_names, "features", "inputs")
    return inputs, _to_list(labels, output_names, "labels", "outputs"), weights


def _unpin_targets(keras_model):
    """Keras's cloning pins the compile arguments it read on the model
    (``model._get_compile_args = lambda: compile_args``) and then adds that clone's labels to
    them (``target_tensors``): a later clone without labels (the first checkpoint's, the JAX
    engine's graph of stock's names) would compile on the labels of an earlier estimator's
    graph ("must be from the same graph"). A clone with labels replaces them; one without
    drops them, as a model never cloned has none."""
    pinned = vars(keras_model).get("_get_compile_args")
    if pinned is None:
        return
    args = pinned()
    if "target_tensors" in args:
        args = {k: v for k, v in args.items() if k != "target_tensors"}
        keras_model._get_compile_args = lambda: args


def _clone(mode, keras_model, custom_objects, features=None, labels=None, optimizer_config=None):
    """The model rebuilt in this graph on these tensors, compiled unless predicting."""
    tf.compat.v1.keras.backend.set_learning_phase(mode == ModeKeys.TRAIN)
    inputs, targets, weights = keras_io(keras_model, features, labels)
    compile_clone = mode != ModeKeys.PREDICT
    global_step = None
    if compile_clone:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        _internal().backend.track_variable(global_step)
    if compile_clone and targets is None:
        _unpin_targets(keras_model)
    clone = _internal().models.clone_and_build_model(
        keras_model,
        inputs,
        targets,
        custom_objects,
        compile_clone=compile_clone,
        in_place_reset=not keras_model._is_graph_network,
        optimizer_iterations=global_step,
        optimizer_config=optimizer_config,
    )
    if weights is not None:
        names = clone.output_names
        if not isinstance(weights, (list, tuple, dict)):
            weights = [weights]
        elif isinstance(weights, dict):
            weights = [weights.get(n) for n in names]
        clone._compile_weights_loss_and_weighted_metrics(list(weights))
    return clone


def _model_fn_for(keras_model, custom_objects, save_object_ckpt, metric_names_map, export_outputs):
    if not isinstance(keras_model.optimizer, tf.keras.optimizers.legacy.Optimizer) and isinstance(
        keras_model.optimizer, tf.keras.optimizers.Optimizer
    ):
        if not tf.executing_eagerly():
            raise ValueError(
                "Please set your optimizer as an instance of "
                "`tf.keras.optimizers.legacy.Optimizer`, e.g., `tf.keras.optimizers.legacy.Adam`."
                f" Received optimizer type: {type(keras_model.optimizer)}."
            )
        tf.compat.v1.logging.warning(
            "You are using `tf.keras.optimizers.experimental.Optimizer` in TF estimator, which "
            "only supports `tf.keras.optimizers.legacy.Optimizer`. Automatically converting your "
            "optimizer to `tf.keras.optimizers.legacy.Optimizer`."
        )
        keras_model.optimizer = _internal().optimizers.convert_to_legacy_optimizer(
            keras_model.optimizer
        )
    try:
        if isinstance(keras_model.optimizer, (tuple, list)):
            optimizer_config = [o.get_config() for o in keras_model.optimizer]
        else:
            optimizer_config = keras_model.optimizer.get_config()
    except (NotImplementedError, AttributeError):
        optimizer_config = None  # a TFOptimizer or a custom one: no config

    def model_fn(features, labels, mode):
        model = _clone(mode, keras_model, custom_objects, features, labels, optimizer_config)
        names = model.output_names
        if tf.distribute.has_strategy():  # stock's: every replica's clone names them alike
            names = [re.sub(r"_\d$", "", name) for name in names]
        predictions = dict(zip(names, model.outputs))
        loss = train_op = metrics = None
        if mode != ModeKeys.PREDICT:
            if mode == ModeKeys.TRAIN:
                model._make_train_function()
            else:
                model._make_test_function()
            loss = model.total_loss
            metrics = _keras_metrics(model, metric_names_map)
        if mode == ModeKeys.TRAIN:
            train_op = model.train_function.updates_op
        if (
            not model._is_graph_network
            and getattr(keras_model, "_original_attributes_cache", None) is not None
        ):
            _internal().models.in_place_subclassed_model_state_restoration(keras_model)
        scaffold = None
        if save_object_ckpt:
            model._track_trackable(tf.compat.v1.train.get_global_step(), "estimator_global_step")
            _first_checkpoint.track_graph_variables(model)  # a v1 optimizer's rate's variable
            saveables = _tfprivate.ObjectGraphView(model).frozen_saveable_objects()
            saver = tf.compat.v1.train.Saver(var_list=saveables, sharded=True)
            saver._object_restore_saver = _tfprivate.frozen_saver(model)
            scaffold = tf.compat.v1.train.Scaffold(saver=saver)
        outputs = {_SERVING_KEY: _tfprivate.export_output.PredictOutput(predictions)}
        for key, output_class in (export_outputs or {}).items():
            if key not in model.output_names:
                raise KeyError(
                    f"export_outputs key {key!r} is not an output of the keras model "
                    f"({model.output_names})."
                )
            outputs[key] = output_class(predictions[key])
        return EstimatorSpec(
            mode=mode,
            predictions=predictions,
            loss=loss,
            train_op=train_op,
            eval_metric_ops=metrics,
            export_outputs=outputs,
            scaffold=scaffold,
        )

    return model_fn


def _keras_metrics(model, metric_names_map):
    if not getattr(model, "_compile_metrics", None):
        return None
    compiled = model._compile_metric_functions  # not add_metric()'s, as stock
    if metric_names_map:
        names = {m.name for m in compiled}
        if names != set(metric_names_map):
            raise ValueError(
                "Invalid `metric_names_map`: its keys must be exactly the model's metric names "
                f"{sorted(names)}; got {sorted(metric_names_map)}."
            )
        return {metric_names_map[m.name]: m for m in compiled}
    return {m.name: m for m in compiled}


def _save_first_checkpoint(keras_model, custom_objects, config, save_object_ckpt, on_graph=None):
    """The user's weights as ``model_dir/keras/keras_model.ckpt``, where the estimator starts
    (:func:`tpushim._first_checkpoint.save`, with this API's clone)."""
    return _first_checkpoint.save(
        keras_model,
        config,
        save_object_ckpt,
        lambda model: _clone(ModeKeys.TRAIN, model, custom_objects),
        keras_model.get_weights() if _any_weight_initialized(keras_model) else None,
        on_graph,
    )


def _assert_valid_model(model, custom_objects):
    if not model._is_graph_network and not isinstance(model, tf.keras.models.Sequential):
        try:
            with tf.keras.utils.CustomObjectScope(custom_objects or {}):
                model.__class__.from_config(model.get_config())
        except NotImplementedError as e:
            raise ValueError(
                "Subclassed `Model`s passed to `model_to_estimator` must implement "
                "`Model.get_config` and `Model.from_config`."
            ) from e


def model_to_estimator(
    keras_model=None,
    keras_model_path=None,
    custom_objects=None,
    model_dir=None,
    config=None,
    checkpoint_format=None,
    use_v2_estimator=False,
    metric_names_map=None,
    export_outputs=None,
):
    """An Estimator from a compiled tf_keras model (``tf.keras.estimator.model_to_estimator``)."""
    if not (keras_model or keras_model_path):
        raise ValueError("Either `keras_model` or `keras_model_path` needs to be provided.")
    if keras_model and keras_model_path:
        raise ValueError("Please specity either `keras_model` or `keras_model_path`, but not both.")
    if keras_model:
        _assert_valid_model(keras_model, custom_objects)
    config = overwrite_model_dir_and_session_config(config, model_dir)
    if not keras_model:
        if keras_model_path.startswith("gs://") or "storage.googleapis.com" in keras_model_path:
            raise ValueError(
                "keras_model_path on Google Cloud Storage is not supported by tpushim on "
                "TensorFlow >= 2.16: copy the file locally, or load the model and pass keras_model."
            )
        keras_model = tf.keras.models.load_model(keras_model_path)
    if checkpoint_format in (None, "checkpoint"):
        if not (keras_model._is_graph_network or isinstance(keras_model, tf.keras.Sequential)):
            raise ValueError(  # stock's text, then how to get past it (as on the TPU path)
                "Object-based checkpoints are currently not supported with subclassed models."
                " Pass checkpoint_format='saver' to model_to_estimator."
            )
        save_object_ckpt = True
    elif checkpoint_format == "saver":
        save_object_ckpt = False
    else:
        raise ValueError(
            f'Checkpoint format must be one of "checkpoint" or "saver". Got {checkpoint_format}'
        )
    if save_object_ckpt:
        _refuse_object_checkpoints_over_replicas(config)
    if not getattr(keras_model, "optimizer", None):
        raise ValueError(
            "The given keras model has not been compiled yet. Please compile the model with "
            "`model.compile()` before calling `model_to_estimator()`."
        )
    model_fn = _model_fn_for(
        keras_model, custom_objects, save_object_ckpt, metric_names_map, export_outputs
    )
    if not _any_weight_initialized(keras_model):
        tf.compat.v1.keras.backend.set_session(tf.compat.v1.Session(config=config.session_config))
    warm_start = None
    if keras_model._is_graph_network:
        warm_start = _save_first_checkpoint(keras_model, custom_objects, config, save_object_ckpt)
    elif keras_model.built:
        tf.compat.v1.logging.warning(
            "You are creating an Estimator from a Keras model manually subclassed from `Model`, "
            "that was already called on some inputs (and thus already had weights). Its weights "
            "are not preserved: the estimator starts from a freshly initialized copy."
        )
    del use_v2_estimator  # one Estimator class here; checkpoint_format tells them apart
    estimator = Estimator(model_fn, config=config, warm_start_from=warm_start)
    estimator._tpushim_keras_model = keras_model  # for observers (the preflight's model checks)
    return estimator


def _refuse_object_checkpoints_over_replicas(config):
    """Object-based checkpoints (model_to_estimator's default in its v2 spelling) over a
    strategy of several replicas: stock 2.15 fails at ``train()`` / ``evaluate()``, having
    written its first checkpoint, because the model_fn builds its Saver inside each replica
    (``RuntimeError: Method requires being in cross-replica context``). Refused here, before
    anything is written, naming the spelling stock trains with."""
    for key in ("train_distribute", "eval_distribute"):
        strategy = getattr(config, key)
        if replicated(strategy):
            raise ValueError(
                f"model_to_estimator's object-based checkpoints (checkpoint_format="
                f"'checkpoint', the default of tf.keras.estimator.model_to_estimator) cannot be "
                f"written over RunConfig({key}={type(strategy).__name__}) of "
                f"{strategy.num_replicas_in_sync} replicas: stock TensorFlow 2.15 fails there "
                "too, at train(), building the checkpoint's Saver inside each replica. Pass "
                "checkpoint_format='saver' to model_to_estimator, or convert with "
                "tf.compat.v1.keras.estimator.model_to_estimator (name-based checkpoints, "
                "trained over every replica as stock trains them)."
            )


#: Where a conversion on tpushim's estimator API runs, as the run summary's table says it.
RUNS_ON = "CPU/GPU (tpushim's estimator API)"


def conversion(estimator, arguments, settings, v2):
    """The :class:`tpushim._observe.Conversion` observers hear of for ``estimator``, made by
    :func:`model_to_estimator` from ``arguments`` under ``settings`` (``v2``: the v2 spelling)."""
    from tpushim import _observe

    v2 = "EstimatorV2" if v2 else "Estimator"
    return _observe.Conversion(
        estimator=estimator,
        keras_model=estimator._tpushim_keras_model,
        arguments=arguments,
        settings=settings,
        model_fn=estimator._model_fn,
        description=(
            f"tpushim's {v2} on TensorFlow {tf.__version__} with tf-keras "
            f"{_tf_keras_version()}: stock 2.15's path on {RUNS_ON}; the TPU path there is "
            f"the strategy engine (mode cpu / tpu)"
        ),
    )


def _tf_keras_version():
    import sys

    return getattr(sys.modules.get("tf_keras"), "__version__", None) or "(unknown)"
