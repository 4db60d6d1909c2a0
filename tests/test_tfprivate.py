"""The private TensorFlow/Keras names tpushim relies on exist with the signatures it calls.

When a TensorFlow release moves one, this test names it; tpushim/_tfprivate.py is the one file to edit.
"""

import inspect

import pytest
import tensorflow as tf

from tpushim import _tfprivate
from tensorflow_estimator.python.estimator import keras_lib


@pytest.mark.parametrize("name,params", [
    ("_clone_and_build_model", ["mode", "keras_model", "custom_objects", "features", "labels", "optimizer_config"]),
    ("_convert_estimator_io_to_keras", ["keras_model", "features", "labels"]),
    ("_save_first_checkpoint", ["keras_model", "custom_objects", "config", "save_object_ckpt"]),
    ("_any_weight_initialized", ["keras_model"]),
    ("_assert_valid_model", ["model", "custom_objects"]),
    ("model_to_estimator", ["keras_model", "keras_model_path", "custom_objects", "model_dir", "config",
                            "checkpoint_format", "use_v2_estimator", "metric_names_map", "export_outputs"]),
])
def test_keras_lib_functions(name, params):
    assert list(inspect.signature(getattr(keras_lib, name)).parameters) == params


def test_other_private_names():
    assert _tfprivate.DEFAULT_SERVING_KEY == "serving_default"
    assert issubclass(_tfprivate.FormattedKeyError, KeyError)
    assert _tfprivate.keras_v1_tf_optimizer_class().__name__ == "TFOptimizer"
    assert _tfprivate.num_shards_in_replica_context() is None  # outside a replicated computation
    assert _tfprivate.fn_args(lambda params, mode: None) == ("params", "mode")
    ctx = _tfprivate.get_tpu_context(_tfprivate.tpu_config.RunConfig(), 8, 16, 24, False, True)
    for mode, size in ((tf.estimator.ModeKeys.TRAIN, 8), (tf.estimator.ModeKeys.EVAL, 16),
                       (tf.estimator.ModeKeys.PREDICT, 24)):
        with ctx.with_mode(mode) as moded:
            assert moded.batch_size_for_input_fn == size
    estimator = _tfprivate.tpu_estimator.TPUEstimator(
        model_fn=lambda features, labels, mode, params: None, config=_tfprivate.tpu_config.RunConfig(),
        use_tpu=False, train_batch_size=8)
    assert hasattr(estimator, "_log_every_n_steps") and hasattr(estimator, "_ctx")
    assert hasattr(estimator._ctx, "_eval_on_tpu")  # pylint: disable=protected-access


def test_compiled_clone_exposes_what_the_model_fn_reads():
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,), name="d")])
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse", metrics=["mae"])
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        clone = _tfprivate.clone_and_build_model(
            tf.estimator.ModeKeys.EVAL, model, None, tf.zeros([4, 3]), tf.zeros([4, 2]),
            model.optimizer.get_config())
        endpoints = _tfprivate.training_endpoints(clone)
        assert len(endpoints) == 1 and not endpoints[0].should_skip_target()
        assert endpoints[0].training_target.target.shape.as_list() == [4, 2]
        assert [list(m) for pair in _tfprivate.per_output_metrics(clone) for m in pair] == [["mae"], []]
        assert _tfprivate.settle_sample_weights(clone) is False  # no sample weights: nothing to redo
        without = _tfprivate.clone_and_build_model(
            tf.estimator.ModeKeys.TRAIN, model, None, tf.zeros([4, 3]), tf.zeros([4, 2]),
            model.optimizer.get_config(), compile_metrics=False)
        assert [list(m) for pair in _tfprivate.per_output_metrics(without) for m in pair] == [[], []]
    assert model._get_compile_args()["metrics"] == ["mae"]  # pylint: disable=protected-access  # restored


def test_faked_tpu_system_names():
    """What tpushim/_faketpu.py replaces and reads (through _tfprivate)."""
    from tensorflow.python.tpu import tpu_system_metadata  # pylint: disable=import-outside-toplevel
    from tensorflow.python.training import evaluation, monitored_session  # pylint: disable=import-outside-toplevel
    assert list(inspect.signature(tpu_system_metadata._query_tpu_system_metadata).parameters) == [  # pylint: disable=protected-access
        "master_address", "cluster_def", "query_topology"]
    creator = monitored_session._MonitoredSession._CoordinatedSessionCreator(  # pylint: disable=protected-access
        monitored_session.ChiefSessionCreator(master="grpc://127.0.0.1:1"), ["hook"], 1)
    assert creator._hooks == ["hook"]  # pylint: disable=protected-access
    assert creator._session_creator._master == "grpc://127.0.0.1:1"  # pylint: disable=protected-access
    assert isinstance(creator._session_creator._scaffold, tf.compat.v1.train.Scaffold)  # pylint: disable=protected-access
    assert _tfprivate.eval_steps_of([evaluation._StopAfterNEvalsHook(num_evals=7)]) == 7  # pylint: disable=protected-access
    device = _tfprivate.tpu_device_attributes("/job:worker/replica:0/task:1/device:TPU:3", "TPU")
    assert (device.name, device.device_type) == ("/job:worker/replica:0/task:1/device:TPU:3", "TPU")
    config = _tfprivate.tpu_config.RunConfig(
        cluster=tf.distribute.cluster_resolver.TPUClusterResolver(tpu="grpc://127.0.0.1:1"))
    assert config.cluster_spec.as_dict() == {"worker": ["127.0.0.1:1"]}
    _tfprivate.set_cluster_spec(config, tf.train.ClusterSpec({}))
    assert not config.cluster_spec and config.master == "grpc://127.0.0.1:1"
