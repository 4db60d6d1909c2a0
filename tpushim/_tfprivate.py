"""Every private TensorFlow / Keras name tpushim uses, in one place.

These are internals of TensorFlow 2.15's estimator and Keras 2 (checked by tests/test_tfprivate.py
on the installed version): when a TensorFlow release moves one, this file is the only one to edit.
"""

# pylint: disable=unused-import,protected-access
from tensorflow.python.tpu import tpu_function  # number of shards inside a replicated computation
from tensorflow_estimator.python.estimator import estimator as estimator_lib
from tensorflow_estimator.python.estimator import keras_lib
from tensorflow_estimator.python.estimator.export import export_lib
from tensorflow_estimator.python.estimator.tpu import tpu_config, tpu_context, tpu_estimator

# keras_lib helpers, reused so that tpushim clones, feeds and warm-starts exactly as stock does.
clone_and_build_model = keras_lib._clone_and_build_model
convert_estimator_io_to_keras = keras_lib._convert_estimator_io_to_keras
save_first_checkpoint = keras_lib._save_first_checkpoint
assert_valid_model = keras_lib._assert_valid_model
any_weight_initialized = keras_lib._any_weight_initialized
FormattedKeyError = keras_lib.FormattedKeyError
DEFAULT_SERVING_KEY = keras_lib._DEFAULT_SERVING_KEY
maybe_overwrite_model_dir_and_session_config = estimator_lib.maybe_overwrite_model_dir_and_session_config


def get_tpu_context(config, train_batch_size, eval_batch_size, predict_batch_size, use_tpu,
                    eval_on_tpu):
    """TPUEstimator's internal context, rebuilt when batch sizes are known only at train time."""
    return tpu_context._get_tpu_context(config, train_batch_size, eval_batch_size,
                                        predict_batch_size, use_tpu, eval_on_tpu, None)


def num_shards_in_replica_context():
    """The number of shards of the TPU computation being built (None outside one)."""
    return tpu_function.get_tpu_context().number_of_shards


def keras_v1_tf_optimizer_class():
    """Keras's wrapper for a tf.compat.v1.train optimizer (``model.compile(optimizer=tf1_opt)``)."""
    from keras.src.optimizers import optimizer_v1  # pylint: disable=import-outside-toplevel
    return optimizer_v1.TFOptimizer


def training_endpoints(model):
    """Per-output (name, loss_fn, loss_weight, sample_weight) of a compiled v1-graph clone."""
    return model._training_endpoints


def per_output_metrics(model):
    """Per output: (unweighted {name: Metric}, weighted {name: Metric}) of a compiled clone."""
    return list(zip(model._per_output_metrics, model._per_output_weighted_metrics))


def fn_args(fn):
    """Argument names of a function, as Estimator reads them (functools.partial aware)."""
    from tensorflow.python.util import function_utils  # pylint: disable=import-outside-toplevel
    return function_utils.fn_args(fn)
