"""The estimator API names legacy scripts use, as module objects for ``tf.estimator`` and
``tf.compat.v1.estimator`` on TensorFlow >= 2.16.

Each namespace is a module whose ``__getattr__`` answers a name tpushim does not provide with an
AttributeError naming it and what to use instead, rather than Python's bare "no attribute".
"""

import types

_UNSUPPORTED_HINT = (
    "tpushim provides on TensorFlow >= 2.16 the estimator names legacy model_to_estimator "
    "scripts use (docs/reference/estimator-api.md lists them). Use TensorFlow <= 2.15 "
    "(Python <= 3.11) for the rest of tf.estimator, or move that part of the script to Keras."
)
_CANNED = "a tf.keras model converted with tf.keras.estimator.model_to_estimator"
_HEAD = "the Keras model's loss and metrics (model.compile), converted with model_to_estimator"
#: What to use instead of each name TensorFlow 2.15's tf.estimator had and tpushim does not provide.
_INSTEAD = {
    **dict.fromkeys(
        [
            "BaselineClassifier",
            "BaselineEstimator",
            "BaselineRegressor",
            "DNNClassifier",
            "DNNEstimator",
            "DNNLinearCombinedClassifier",
            "DNNLinearCombinedEstimator",
            "DNNLinearCombinedRegressor",
            "DNNRegressor",
            "LinearClassifier",
            "LinearEstimator",
            "LinearRegressor",
            "LinearSDCA",
            "RNNClassifier",
            "RNNEstimator",
        ],
        _CANNED,
    ),
    **dict.fromkeys(
        [
            "Head",
            "BinaryClassHead",
            "LogisticRegressionHead",
            "MultiClassHead",
            "MultiHead",
            "MultiLabelHead",
            "PoissonRegressionHead",
            "RegressionHead",
        ],
        _HEAD,
    ),
    **dict.fromkeys(
        ["call_logit_fn", "dnn_logit_fn_builder", "linear_logit_fn_builder"],
        "Keras layers in a tf.keras model converted with model_to_estimator",
    ),
    "BoostedTreesClassifier": "TensorFlow Decision Forests",
    "BoostedTreesRegressor": "TensorFlow Decision Forests",
    "KMeans": "a clustering library (e.g. scikit-learn's KMeans) or TensorFlow <= 2.15",
    "InMemoryEvaluatorHook": (
        "tf.estimator.train_and_evaluate with an EvalSpec (it evaluates on each new checkpoint)"
    ),
    "build_raw_supervised_input_receiver_fn": (
        "export.build_raw_serving_input_receiver_fn (tpushim exports the PREDICT graph only)"
    ),
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

    from tpushim._estimator_api import (
        _config,
        _early_stopping,
        _estimator,
        _export,
        _inputs,
        _training,
    )

    train = tf.compat.v1.train
    inputs = _namespace(
        f"{spelling}.inputs",
        "numpy_input_fn and pandas_input_fn (tpushim's estimator API).",
        numpy_input_fn=_inputs.numpy_input_fn,
        pandas_input_fn=_inputs.pandas_input_fn,
    )
    export = _namespace(
        f"{spelling}.export",
        "Serving input receivers and export outputs (tpushim's estimator API).",
        ServingInputReceiver=_export.ServingInputReceiver,
        TensorServingInputReceiver=_export.TensorServingInputReceiver,
        build_raw_serving_input_receiver_fn=_export.build_raw_serving_input_receiver_fn,
        build_parsing_serving_input_receiver_fn=_export.build_parsing_serving_input_receiver_fn,
        PredictOutput=_export.PredictOutput,
        ClassificationOutput=_export.ClassificationOutput,
        RegressionOutput=_export.RegressionOutput,
        EvalOutput=_export.EvalOutput,
        ExportOutput=_export.ExportOutput,
    )
    experimental = _namespace(
        f"{spelling}.experimental",
        "tf.estimator.experimental (tpushim's estimator API).",
        make_early_stopping_hook=_early_stopping.make_early_stopping_hook,
        stop_if_higher_hook=_early_stopping.stop_if_higher_hook,
        stop_if_lower_hook=_early_stopping.stop_if_lower_hook,
        stop_if_no_increase_hook=_early_stopping.stop_if_no_increase_hook,
        stop_if_no_decrease_hook=_early_stopping.stop_if_no_decrease_hook,
        make_stop_at_checkpoint_step_hook=_training.make_stop_at_checkpoint_step_hook,
    )
    namespace = _namespace(
        spelling,
        "The tf.estimator names legacy model_to_estimator scripts use, provided by tpushim on "
        "TensorFlow >= 2.16 (on tf.compat.v1 graphs and sessions).",
        Estimator=_estimator.Estimator,
        EstimatorSpec=_config.EstimatorSpec,
        ModeKeys=_config.ModeKeys,
        RunConfig=_config.RunConfig,
        WarmStartSettings=_estimator.WarmStartSettings,
        VocabInfo=train.VocabInfo,
        TrainSpec=_training.TrainSpec,
        EvalSpec=_training.EvalSpec,
        train_and_evaluate=_training.train_and_evaluate,
        BestExporter=_training.BestExporter,
        FinalExporter=_training.FinalExporter,
        LatestExporter=_training.LatestExporter,
        Exporter=_training.Exporter,
        add_metrics=_training.add_metrics,
        classifier_parse_example_spec=_export.classifier_parse_example_spec,
        regressor_parse_example_spec=_export.regressor_parse_example_spec,
        inputs=inputs,
        export=export,
        experimental=experimental,
        # The hooks scripts pass are TensorFlow's own.
        SessionRunHook=train.SessionRunHook,
        SessionRunArgs=train.SessionRunArgs,
        SessionRunContext=train.SessionRunContext,
        SessionRunValues=train.SessionRunValues,
        LoggingTensorHook=train.LoggingTensorHook,
        StopAtStepHook=train.StopAtStepHook,
        CheckpointSaverHook=train.CheckpointSaverHook,
        CheckpointSaverListener=train.CheckpointSaverListener,
        NanTensorHook=train.NanTensorHook,
        NanLossDuringTrainingError=train.NanLossDuringTrainingError,
        StepCounterHook=train.StepCounterHook,
        SummarySaverHook=train.SummarySaverHook,
        FinalOpsHook=train.FinalOpsHook,
        FeedFnHook=train.FeedFnHook,
        GlobalStepWaiterHook=train.GlobalStepWaiterHook,
        ProfilerHook=train.ProfilerHook,
        SecondOrStepTimer=train.SecondOrStepTimer,
    )
    return namespace
