"""The estimator API names legacy scripts use, as module objects for ``tf.estimator`` and
``tf.compat.v1.estimator`` on TensorFlow >= 2.16.

Each namespace is a module whose ``__getattr__`` answers a name tpushim does not provide with an
AttributeError naming it and what to use instead, rather than Python's bare "no attribute".
"""

import types

_UNSUPPORTED_HINT = (
    "tpushim provides on TensorFlow >= 2.16 only the estimator names legacy model_to_estimator "
    "scripts use (docs/reference/versions.md lists them). Use TensorFlow <= 2.15 (Python <= 3.11) "
    "for the rest of tf.estimator, or move that part of the script to Keras (model.fit)."
)
#: Names tf.estimator had that have a known replacement.
_INSTEAD = {
    "DNNClassifier": "a tf.keras model converted with tf.keras.estimator.model_to_estimator",
    "DNNRegressor": "a tf.keras model converted with tf.keras.estimator.model_to_estimator",
    "LinearClassifier": "a tf.keras model converted with tf.keras.estimator.model_to_estimator",
    "LinearRegressor": "a tf.keras model converted with tf.keras.estimator.model_to_estimator",
    "BoostedTreesClassifier": "TensorFlow Decision Forests",
    "tpu": "TensorFlow <= 2.15 for TPUEstimator (on TensorFlow >= 2.16 tpushim's TPU path is the "
    "strategy engine: model_to_estimator under tpushim with a TPU, mode='cpu' or engine='strategy')",
}


class _Namespace(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        instead = _INSTEAD.get(name)
        raise AttributeError(
            f"{self.__name__}.{name} is not provided by tpushim on TensorFlow >= 2.16"
            + (f"; use {instead} instead" if instead else "")
            + f". {_UNSUPPORTED_HINT}"
        )


def _namespace(name, doc, **attributes):
    module = _Namespace(name, doc)
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def build(spelling):
    """A fresh estimator namespace as ``spelling`` (``tf.estimator``, ``tf.compat.v1.estimator``)."""
    import tensorflow as tf

    from tpushim._legacy import _config, _estimator, _export, _inputs, _training

    inputs = _namespace(
        f"{spelling}.inputs",
        "numpy_input_fn and pandas_input_fn (tpushim's engine).",
        numpy_input_fn=_inputs.numpy_input_fn,
        pandas_input_fn=_inputs.pandas_input_fn,
    )
    export = _namespace(
        f"{spelling}.export",
        "Serving input receivers and export outputs (tpushim's engine).",
        ServingInputReceiver=_export.ServingInputReceiver,
        build_raw_serving_input_receiver_fn=_export.build_raw_serving_input_receiver_fn,
        build_parsing_serving_input_receiver_fn=_export.build_parsing_serving_input_receiver_fn,
        PredictOutput=_export.PredictOutput,
        ClassificationOutput=_export.ClassificationOutput,
        RegressionOutput=_export.RegressionOutput,
        ExportOutput=_export.ExportOutput,
    )
    experimental = _namespace(
        f"{spelling}.experimental",
        "tf.estimator.experimental (tpushim's engine).",
        stop_if_no_decrease_hook=_training.stop_if_no_decrease_hook,
    )
    namespace = _namespace(
        spelling,
        "The tf.estimator names legacy model_to_estimator scripts use, provided by tpushim on "
        "TensorFlow >= 2.16 (its engine: tf.compat.v1 graphs and sessions).",
        Estimator=_estimator.Estimator,
        EstimatorSpec=_config.EstimatorSpec,
        ModeKeys=_config.ModeKeys,
        RunConfig=_config.RunConfig,
        WarmStartSettings=_estimator.WarmStartSettings,
        TrainSpec=_training.TrainSpec,
        EvalSpec=_training.EvalSpec,
        train_and_evaluate=_training.train_and_evaluate,
        FinalExporter=_training.FinalExporter,
        LatestExporter=_training.LatestExporter,
        Exporter=_training.Exporter,
        add_metrics=_training.add_metrics,
        inputs=inputs,
        export=export,
        experimental=experimental,
        # The hooks scripts pass are TensorFlow's own.
        SessionRunHook=tf.compat.v1.train.SessionRunHook,
        SessionRunArgs=tf.compat.v1.train.SessionRunArgs,
        SessionRunContext=tf.compat.v1.train.SessionRunContext,
        SessionRunValues=tf.compat.v1.train.SessionRunValues,
        LoggingTensorHook=tf.compat.v1.train.LoggingTensorHook,
        StopAtStepHook=tf.compat.v1.train.StopAtStepHook,
        CheckpointSaverHook=tf.compat.v1.train.CheckpointSaverHook,
        CheckpointSaverListener=tf.compat.v1.train.CheckpointSaverListener,
        NanTensorHook=tf.compat.v1.train.NanTensorHook,
        StepCounterHook=tf.compat.v1.train.StepCounterHook,
        SummarySaverHook=tf.compat.v1.train.SummarySaverHook,
        FinalOpsHook=tf.compat.v1.train.FinalOpsHook,
        FeedFnHook=tf.compat.v1.train.FeedFnHook,
        GlobalStepWaiterHook=tf.compat.v1.train.GlobalStepWaiterHook,
        ProfilerHook=tf.compat.v1.train.ProfilerHook,
        SecondOrStepTimer=tf.compat.v1.train.SecondOrStepTimer,
    )
    return namespace
