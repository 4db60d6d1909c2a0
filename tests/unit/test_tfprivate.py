"""The private TensorFlow/Keras names tpushim relies on exist with the signatures it calls.

When a TensorFlow release moves one, this test names it; the module of its component in tpushim/_tfprivate/ is the one to edit.
"""

import inspect
import threading

import numpy as np
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

keras_lib = tpuestimator_import("tensorflow_estimator.python.estimator", "keras_lib")

_tfprivate = tpuestimator_import("tpushim._tfprivate")

pytestmark = pytest.mark.tpuestimator  # the TPU path (cpu mode's TPUEstimator) throughout


@pytest.mark.parametrize(
    "name,params",
    [
        (
            "_clone_and_build_model",
            ["mode", "keras_model", "custom_objects", "features", "labels", "optimizer_config"],
        ),
        ("_convert_estimator_io_to_keras", ["keras_model", "features", "labels"]),
        ("_save_first_checkpoint", ["keras_model", "custom_objects", "config", "save_object_ckpt"]),
        ("_any_weight_initialized", ["keras_model"]),
        ("_assert_valid_model", ["model", "custom_objects"]),
        (
            "model_to_estimator",
            [
                "keras_model",
                "keras_model_path",
                "custom_objects",
                "model_dir",
                "config",
                "checkpoint_format",
                "use_v2_estimator",
                "metric_names_map",
                "export_outputs",
            ],
        ),
    ],
)
def test_keras_lib_functions(name, params):
    assert list(inspect.signature(getattr(keras_lib, name)).parameters) == params


def test_other_private_names():
    assert _tfprivate.estimator.DEFAULT_SERVING_KEY == "serving_default"
    assert issubclass(_tfprivate.estimator.FormattedKeyError, KeyError)
    assert _tfprivate.keras.keras_v1_tf_optimizer_class().__name__ == "TFOptimizer"
    assert (
        _tfprivate.tpu.num_shards_in_replica_context() is None
    )  # outside a replicated computation
    assert _tfprivate.estimator.fn_args(lambda params, mode: None) == ("params", "mode")


def test_control_flow_context():
    """None at the top of a graph; a TPU computation being built has one of its own (the
    BatchNormalization layers of a TPU step share tensors only within one context)."""
    with tf.Graph().as_default() as graph:
        assert _tfprivate.graph.control_flow_context(graph) is None
        seen = []

        def computation():
            seen.append(_tfprivate.graph.control_flow_context(graph))
            return tf.constant(1.0)

        tf.compat.v1.tpu.replicate(computation, inputs=[[]])
        assert seen and seen[0] is not None


def test_compiled_clone_exposes_what_the_model_fn_reads():
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,), name="d")])
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse", metrics=["mae"])
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        clone = _tfprivate.keras.clone_and_build_model(
            tf.estimator.ModeKeys.EVAL,
            model,
            None,
            tf.zeros([4, 3]),
            tf.zeros([4, 2]),
            model.optimizer.get_config(),
        )
        endpoints = _tfprivate.keras_compile.training_endpoints(clone)
        assert len(endpoints) == 1 and not endpoints[0].should_skip_target()
        assert endpoints[0].training_target.target.shape.as_list() == [4, 2]
        assert [
            list(m) for pair in _tfprivate.keras_compile.per_output_metrics(clone) for m in pair
        ] == [
            ["mae"],
            [],
        ]
        assert (
            _tfprivate.keras_compile.settle_sample_weights(clone) is False
        )  # no sample weights: nothing to redo
        without = _tfprivate.keras.clone_and_build_model(
            tf.estimator.ModeKeys.TRAIN,
            model,
            None,
            tf.zeros([4, 3]),
            tf.zeros([4, 2]),
            model.optimizer.get_config(),
            compile_metrics=False,
        )
        assert [
            list(m) for pair in _tfprivate.keras_compile.per_output_metrics(without) for m in pair
        ] == [
            [],
            [],
        ]
    assert model._get_compile_args()["metrics"] == ["mae"]  # restored


def test_faked_tpu_system_names():
    """What tpushim/_preflight/faketpu.py replaces and reads (its own private names)."""
    from tensorflow.python.tpu import tpu_system_metadata
    from tensorflow.python.training import evaluation, monitored_session

    from tpushim._preflight import faketpu

    assert list(inspect.signature(tpu_system_metadata._query_tpu_system_metadata).parameters) == [
        "master_address",
        "cluster_def",
        "query_topology",
    ]
    creator = monitored_session._MonitoredSession._CoordinatedSessionCreator(
        monitored_session.ChiefSessionCreator(master="grpc://127.0.0.1:1"), ["hook"], 1
    )
    assert creator._hooks == ["hook"]
    assert creator._session_creator._master == "grpc://127.0.0.1:1"
    assert isinstance(creator._session_creator._scaffold, tf.compat.v1.train.Scaffold)
    assert faketpu.eval_steps_of([evaluation._StopAfterNEvalsHook(num_evals=7)]) == 7
    device = faketpu.device_attributes("/job:worker/replica:0/task:1/device:TPU:3", "TPU")
    assert (device.name, device.device_type) == ("/job:worker/replica:0/task:1/device:TPU:3", "TPU")
    config = _tfprivate.modules.tpu_config.RunConfig(
        cluster=tf.distribute.cluster_resolver.TPUClusterResolver(tpu="grpc://127.0.0.1:1")
    )
    assert config.cluster_spec.as_dict() == {"worker": ["127.0.0.1:1"]}
    _tfprivate.estimator.set_cluster_spec(config, tf.train.ClusterSpec({}))
    assert not config.cluster_spec and config.master == "grpc://127.0.0.1:1"


def test_replaced_tpu_system_query_is_none_until_someone_replaces_it():
    """The TPU check at conversion asks a replaced TPU system query (the faked TPU's) instead of
    the TPU: None while TensorFlow's own is in place."""
    from tpushim._preflight import faketpu

    assert _tfprivate.tpu.replaced_tpu_system_query() is None
    with faketpu.faked_tpu_system() as tpu:
        query = _tfprivate.tpu.replaced_tpu_system_query()
        assert query(tpu.master).num_cores == 8
    assert _tfprivate.tpu.replaced_tpu_system_query() is None


def test_deprecation_flag_is_ours_and_silence_still_works():
    """TensorFlow's flag for deprecation warnings, read per call site (tpushim's calls: off)."""
    from tensorflow.python.util import deprecation

    flag = deprecation._PRINT_DEPRECATION_WARNINGS
    assert isinstance(flag, _tfprivate.graph._WarnOutsideTpushim) and flag.value is True
    _tfprivate.graph.silence_own_deprecation_warnings()  # idempotent
    assert deprecation._PRINT_DEPRECATION_WARNINGS is flag
    with deprecation.silence():
        assert deprecation._PRINT_DEPRECATION_WARNINGS is False
    assert deprecation._PRINT_DEPRECATION_WARNINGS is flag


def test_version_fallbacks_find_each_releases_module():
    # Keras keeps its code in keras.src from 2.13; 2.12 has the same modules one level up.
    prefix = "keras.src." if tfcases.KERAS_VERSION >= (2, 13) else "keras."
    assert _tfprivate.keras_compile.losses_utils().__name__ == prefix + "utils.losses_utils"
    assert (
        _tfprivate.keras.keras_v1_tf_optimizer_class().__module__
        == prefix + "optimizers.optimizer_v1"
    )
    reduction = _tfprivate.keras_compile.losses_utils().ReductionV2
    assert (reduction.NONE, reduction.SUM, reduction.AUTO) == ("none", "sum", "auto")
    assert callable(_tfprivate.keras_compile.losses_utils().compute_weighted_loss)


def test_batchnorm_internals():
    prefix = "keras.src." if tfcases.KERAS_VERSION >= (2, 13) else "keras."
    base = _tfprivate.keras.batchnorm_base_class()
    assert base.__module__ == prefix + "layers.normalization.batch_normalization"
    for layer in (
        tf.keras.layers.BatchNormalization,
        tf.compat.v1.keras.layers.BatchNormalization,
        tf.keras.layers.experimental.SyncBatchNormalization,
    ):
        assert issubclass(layer, base)
    assert list(inspect.signature(base.call).parameters) == ["self", "inputs", "training", "mask"]
    assert list(inspect.signature(base._renorm_correction_and_moments).parameters) == [
        "self",
        "mean",
        "variance",
        "training",
        "inputs_size",
    ]
    own, seen = base.call, []
    with tf.Graph().as_default():
        layer = tf.keras.layers.BatchNormalization(renorm=True)
        frozen = tf.keras.layers.BatchNormalization(trainable=False)
        x = tf.ones([4, 3])
        with _tfprivate.keras.batchnorm_call_replaced(lambda *args: seen.append(args) or args[2]):
            assert layer(x, training=True) is x  # the replacement's result
            assert frozen(x, training=True) is x
            other = []  # another thread's call: Keras's own
            thread = threading.Thread(target=lambda: other.append(layer(x, training=True)))
            thread.start()
            thread.join()
            assert other[0] is not x
        assert base.call is own  # restored
        assert len(seen) == 2 and seen[0][0] is layer and seen[0][3] is True
        assert _tfprivate.keras.batchnorm_training_value(layer, True) is True
        assert (
            _tfprivate.keras.batchnorm_training_value(frozen, True) is False
        )  # frozen: moving stats
        tf.keras.backend.set_learning_phase(1)
        assert _tfprivate.keras.batchnorm_training_value(layer, None) is True
        r, d, mean, variance = _tfprivate.keras.batchnorm_renorm(
            layer, tf.zeros([3]), tf.ones([3]), tf.constant(4.0)
        )
        assert r.shape == d.shape == mean.shape == variance.shape == [3]


def test_model_and_metric_internals():
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,), name="d")])
    subclassed = type("Sub", (tf.keras.Model,), {"call": lambda self, x: x})()
    assert _tfprivate.keras.is_graph_network(model) and not _tfprivate.keras.is_graph_network(
        subclassed
    )
    assert _tfprivate.keras_compile.compiled_user_metrics(model) == (None, None)  # not compiled
    mae = tf.keras.metrics.MeanAbsoluteError(name="m")
    model.compile("sgd", "mse", metrics=[mae, "mse"], weighted_metrics=["mae"], loss_weights=[0.5])
    assert _tfprivate.keras_compile.compiled_user_metrics(model) == ([mae, "mse"], ["mae"])
    assert _tfprivate.keras.compile_args(model)["loss_weights"] == [0.5]
    clone = tf.keras.metrics.MeanAbsoluteError()
    _tfprivate.keras_compile.set_metric_name(clone, "renamed")
    assert clone.name == "renamed"


def test_an_optimizers_learning_rate_schedule():
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5)
    legacy, v2 = tf.keras.optimizers.legacy.Adam, tf.keras.optimizers.Adam
    for optimizer in (legacy(schedule), v2(schedule)):  # the legacy's hyper, the v2's attribute
        assert _tfprivate.keras_compile.learning_rate_schedule(optimizer) is schedule
    assert _tfprivate.keras_compile.learning_rate_schedule(legacy(0.1)) is None
    assert _tfprivate.keras_compile.learning_rate_schedule(v2(0.1)) is None


def test_graph_mode_metric_update_is_an_operation():
    # Keras 2.13's update_state returns an unread variable in graph mode, 2.14+ an Operation:
    # TPUEstimator's (value, update_op) takes the Operation, which must run the whole update.
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        metric = tf.keras.metrics.Mean()
        raw = metric.update_state(tf.constant([1.0, 2.0, 6.0]))
        op = _tfprivate.keras_compile.update_op(raw)
        assert isinstance(op, tf.Operation)
        session.run(tf.compat.v1.variables_initializer(metric.variables))
        session.run(op)
        assert session.run(metric.result()) == 3.0
        assert session.run(metric.variables) == [9.0, 3.0]  # total and count both updated


def test_keras_metric_call_weighs_by_the_mask():
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        metric = tf.keras.metrics.MeanSquaredError()
        update = _tfprivate.keras_compile.call_metric_function(
            metric.update_state,
            tf.zeros([2, 3, 1]),
            tf.ones([2, 3, 1]) * [[[1.0], [2.0], [3.0]]],
            weights=tf.constant([1.0, 0.0]),
            mask=tf.constant([[True, True, False], [True, True, True]]),
        )
        session.run(tf.compat.v1.variables_initializer(metric.variables))
        session.run(_tfprivate.keras_compile.update_op(update))
        assert session.run(metric.result()) == 2.5  # (1 + 4) / 2: the first row's first two steps


def test_add_metrics_internals(tmp_path):
    """tf.estimator.add_metrics builds its result as extenders.estimator_lib.Estimator(...) at
    call time, around a model_fn closing over the estimator and the metric_fn."""
    from tensorflow_estimator.python.estimator import extenders

    assert "estimator_lib" in inspect.unwrap(extenders.add_metrics).__code__.co_names
    made = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(extenders.estimator_lib, "Estimator", lambda **kwargs: made.append(kwargs))
        estimator = tf.estimator.Estimator(lambda features, labels, mode: None, str(tmp_path))
        metric_fn = lambda labels, predictions: {}
        tf.estimator.add_metrics(estimator, metric_fn)
    assert _tfprivate.estimator.add_metrics_parts(made[0]["model_fn"]) == (estimator, metric_fn)
    assert _tfprivate.estimator.add_metrics_parts(metric_fn) is None
    assert _tfprivate.data.leaf_paths({"features": {"a": 1, "b": [2]}}) == [
        "features/a",
        "features/b/0",
    ]
    assert made[0]["warm_start_from"] is _tfprivate.estimator.warm_start_settings(estimator)
    with tf.Graph().as_default():
        mean = tf.keras.metrics.Mean()
        mean.update_state(1.0)
        ops = _tfprivate.estimator.validate_eval_metric_ops({"mean": mean})
        assert isinstance(ops["mean"], tuple) and len(ops["mean"]) == 2
        local = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
        assert {v.ref() for v in mean.variables} <= {v.ref() for v in local}


def test_train_function_and_object_checkpoint_internals():
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,), name="d")])
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        clone = _tfprivate.keras.clone_and_build_model(
            tf.estimator.ModeKeys.TRAIN,
            model,
            None,
            tf.zeros([4, 3]),
            tf.zeros([4, 2]),
            model.optimizer.get_config(),
        )
        _tfprivate.keras_compile.make_train_function(clone)
        assert isinstance(clone.train_function.updates_op, tf.Operation)
        _tfprivate.keras.track_global_step(clone)
        names = {name for name, _ in tf.train.TrackableView(clone).children(clone).items()}
        assert "estimator_global_step" in names and step is not None
        saver = tf.compat.v1.train.Saver(var_list=clone.weights)
        _tfprivate.keras.set_object_restore_saver(saver, clone)
        assert saver._object_restore_saver is not None


def test_dataset_internals():
    with tf.Graph().as_default():
        dataset = tf.data.Dataset.range(10).batch(4)
        assert _tfprivate.data.dataset_variant_op(dataset).type in (
            "BatchDatasetV2",
            "BatchDataset",
        )
    # The input recorder wraps these as methods of the v1 Dataset class.
    for name in ("make_one_shot_iterator", "make_initializable_iterator"):
        assert callable(tf.compat.v1.data.Dataset.__dict__[name])


def test_estimator_methods_tpushim_overrides():
    estimator_cls = _tfprivate.modules.tpu_estimator.TPUEstimator
    assert list(inspect.signature(estimator_cls._call_input_fn).parameters) == [
        "self",
        "input_fn",
        "mode",
        "input_context",
    ]
    assert callable(estimator_cls._assert_members_are_not_overridden)
    # Where the input iterator initializer hooks are made (tpushim feeds them in-memory arrays).
    for name, params in (
        ("_get_features_and_labels_from_input_fn", ["self", "input_fn", "mode"]),
        ("_get_features_from_input_fn", ["self", "input_fn", "mode"]),
        ("_call_model_fn", ["self", "features", "labels", "mode", "config"]),
    ):
        assert list(inspect.signature(getattr(estimator_cls, name)).parameters) == params, name


def test_dataset_initializer_hooks_run_their_initializers_at_session_start():
    from tensorflow_estimator.python.estimator.util import parse_input_fn_result

    single, multi = _tfprivate.estimator.dataset_initializer_hook_classes()
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        features, _, hooks = parse_input_fn_result(tf.data.Dataset.range(3).map(lambda i: (i, i)))
        assert [type(h) for h in hooks] == [single]
        hooks[0].begin()
        hooks[0].after_create_session(session, None)
        assert session.run(features) == 0
        iterator = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.range(5, 7))
        element = iterator.get_next()
        multi([iterator.initializer]).after_create_session(session, None)
        assert session.run(element) == 5


def test_numpy_and_pandas_input_queue_filler():
    """tpushim's recorder wraps feeding_functions._enqueue_data and reads its arguments by name."""
    from tensorflow_estimator.python.estimator.inputs.queues import feeding_functions

    original = feeding_functions._enqueue_data
    assert list(inspect.signature(original).parameters) == [
        "data",
        "capacity",
        "shuffle",
        "min_after_dequeue",
        "num_threads",
        "seed",
        "name",
        "enqueue_size",
        "num_epochs",
        "pad_value",
    ]
    seen = []
    restore = _tfprivate.estimator.replace_enqueue_data(
        lambda real: lambda *a, **k: seen.append(real) or real(*a, **k)
    )
    try:
        with tf.Graph().as_default():
            tf.compat.v1.estimator.inputs.numpy_input_fn(
                {"x": np.zeros((4, 1))}, batch_size=2, shuffle=False
            )()
    finally:
        restore()
    assert seen == [original] and feeding_functions._enqueue_data is original


def test_tpu_context_like_takes_new_batch_sizes_and_keeps_the_system_answer(tmp_path):
    """A context for other global batch sizes, sharing the (cached) answer from the TPU system."""

    def model_fn(features, labels, mode, params):
        del labels, params
        return _tfprivate.modules.tpu_estimator.TPUEstimatorSpec(mode, predictions={"x": features})

    estimator = _tfprivate.modules.tpu_estimator.TPUEstimator(
        model_fn=model_fn,
        config=_tfprivate.modules.tpu_config.RunConfig(model_dir=str(tmp_path)),
        use_tpu=False,
        train_batch_size=8,
        eval_batch_size=8,
        predict_batch_size=8,
    )
    ctx = _tfprivate.tpu.tpu_context_like(estimator._ctx, 4, 5, 6)
    modes = tf.estimator.ModeKeys
    for mode, size in ((modes.TRAIN, 4), (modes.EVAL, 5), (modes.PREDICT, 6)):
        with ctx.with_mode(mode) as in_mode:
            assert in_mode.global_batch_size == size
    assert ctx._lazy_tpu_system_metadata_dict is estimator._ctx._lazy_tpu_system_metadata_dict
    config = _tfprivate.tpu.tpu_context_config(estimator._ctx)
    assert _tfprivate.tpu.tpu_context_config(ctx) is config
    sliced = config.replace(
        tpu_config=config.tpu_config._replace(
            eval_training_input_configuration=_tfprivate.modules.tpu_config.InputPipelineConfig.SLICED
        )
    )
    other = _tfprivate.tpu.tpu_context_like(ctx, 4, 5, 6, sliced)
    assert _tfprivate.tpu.tpu_context_config(other) is sliced
    with other.with_mode(modes.PREDICT) as in_mode:
        assert in_mode.is_input_slice_broadcast_to_all_cores()
    with ctx.with_mode(modes.TRAIN) as in_mode:
        context = _tfprivate.tpu.tpu_input_context(in_mode, "/job:worker/task:0/device:CPU:0")
    assert context.current_host == 0 and context._invocation_index == 0


def test_eval_step_hooks_and_function_defs():
    stop, iterations = _tfprivate.tpu.tpu_eval_steps_hooks(7)
    assert type(stop).__name__ == "_StopAfterNEvalsHook" and stop._num_evals == 7
    assert type(iterations).__name__ == "_SetEvalIterationsHook" and iterations._num_steps == 7
    with tf.Graph().as_default() as graph:
        dataset = tf.data.Dataset.range(3).map(lambda x: x + 1)
        names = [
            v.func.name
            for v in _tfprivate.data.dataset_variant_op(dataset).node_def.attr.values()
            if v.HasField("func")
        ]
        assert {n.op for n in _tfprivate.graph.function_def(graph, names[0]).node_def} >= {"AddV2"}


def test_loss_and_layer_names_the_training_loss_reads():
    """What tpushim/_loss_kinds.py and _losses.py read of Keras's v1 training loss."""
    assert _tfprivate.keras_compile.loss_function_wrapper_class().__name__ == "LossFunctionWrapper"
    assert _tfprivate.keras_compile.add_loss_layer_class().__name__ == "AddLoss"
    assert (
        tf.keras.losses.mean_squared_error.__module__
        in _tfprivate.keras_compile.keras_loss_modules()
    )
    model = tfcases.two_in_two_out()
    fns = _tfprivate.keras_compile.prepare_loss_functions(
        _tfprivate.keras.compile_args(model)["loss"], model.output_names
    )
    assert [type(f).__name__ for f in fns] == ["LossFunctionWrapper"] * 2
    assert _tfprivate.keras.all_layers(model)[0] is model
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2])
        dense = tf.keras.layers.Dense(1, activity_regularizer="l2")
        out = dense(x)
        assert (
            len(_tfprivate.keras_compile.layer_input_losses(dense)) == 1
        )  # its activity regularizer's
        assert _tfprivate.graph.reachable_from(
            [x], [out]
        ) and out in _tfprivate.graph.reachable_from([x], [out])
    import random

    with _tfprivate.keras.keras_random_state_kept():
        drawn = random.random()
    assert random.random() == drawn  # the state is put back


def test_pod_input_internals():
    """The graph seed and op-seed counter a random op is seeded from; rewiring a dataset op's
    input and setting its string attributes in a graph being built."""
    with tf.Graph().as_default() as graph:
        graph.seed = 3
        tf.random.uniform([])
        assert _tfprivate.graph.graph_seeds(graph) == (3, 1)
        first = tf.compat.v1.random.get_seed(None)
        _tfprivate.graph.set_graph_seeds(graph, (3, 1))
        assert tf.compat.v1.random.get_seed(None) == first
        _tfprivate.graph.set_graph_seeds(graph, (None, 5))
        assert tf.compat.v1.random.get_seed(None) == (None, None)
        assert _tfprivate.graph.graph_seeds(graph) == (None, 5)
        dataset = tf.data.Dataset.from_tensor_slices(tf.constant([1, 2, 3])).map(
            lambda x: x, num_parallel_calls=2, deterministic=False
        )
        slices = dataset._variant_tensor.op.inputs[0].op
        _tfprivate.graph.update_input(
            slices, 0, tf.raw_ops.PlaceholderWithDefault(input=tf.constant([7, 8]), shape=[None])
        )
        _tfprivate.graph.set_string_attr(dataset._variant_tensor.op, "deterministic", b"true")
        assert dataset._variant_tensor.op.get_attr("deterministic") == b"true"
        with tf.compat.v1.Session() as session:
            assert list(session.run(dataset.batch(5).get_single_element())) == [7, 8]


def test_a_control_input_added_to_an_op_already_made():
    """The input wait's timestamp, made after a batch read, runs before it (tpushim._input_wait)."""
    with tf.Graph().as_default():
        read = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(3)).get_next()
        before = tf.timestamp()
        _tfprivate.graph.add_control_input(read.op, before.op)
        assert before.op in read.op.control_inputs


def test_dense_features_internals():
    """What tpushim/_feature_columns.py reads of a DenseFeatures layer and its columns."""
    fc = tf.feature_column
    town = fc.categorical_column_with_hash_bucket("town", 4)
    columns = [fc.numeric_column("rm"), fc.embedding_column(town, 2)]
    inputs = {
        "rm": tf.keras.Input((1,), name="rm"),
        "town": tf.keras.Input((1,), name="town", dtype=tf.string),
    }
    layer = tf.keras.layers.DenseFeatures(columns)
    model = tf.keras.Model(inputs, layer(inputs))
    assert isinstance(layer, _tfprivate.keras.dense_features_class())
    assert isinstance(
        tf.compat.v1.keras.layers.DenseFeatures(columns), _tfprivate.keras.dense_features_class()
    )
    own = _tfprivate.keras.dense_features_columns(layer)
    assert [c.name for c in own] == ["rm", "town_embedding"]  # sorted by name, as concatenated
    table = _tfprivate.keras.dense_features_variable(layer, own[1], "embedding_weights")
    assert table.shape == (4, 2)
    assert [i.name for i in _tfprivate.keras.input_layers(model)] == model.input_names
    classes = _tfprivate.keras.feature_column_classes()
    assert isinstance(own[1], classes.EmbeddingColumn)
    assert isinstance(town, classes.SINGLE_KEY_CATEGORICAL)
    cache = _tfprivate.keras.feature_transformation_cache({"town": tf.constant([["a"]])})
    assert own[1].categorical_column.get_sparse_tensors(cache, None).id_tensor.values.shape == [1]
    # The layer's call is replaced only while the context is active, and only in it.
    seen, own_call = [], _tfprivate.keras.dense_features_class().call
    with _tfprivate.keras.dense_features_call_replaced(
        lambda *a: seen.append(a) or tf.zeros([1, 3])
    ):
        assert layer.call({"rm": tf.constant([[1.0]]), "town": tf.constant([["a"]])}).shape == (
            1,
            3,
        )
    assert len(seen) == 1
    assert layer.call({"rm": tf.constant([[1.0]]), "town": tf.constant([["a"]])}).shape == (1, 3)
    assert _tfprivate.keras.dense_features_class().call is own_call


def test_restore_v2_classes_after_a_clone_in_a_graph():
    """A functional model cloned in a graph (the loss plan's scratch clone) swaps Keras's
    ``Functional`` bases to their v1 twins for every instance: the user's eager model's
    ``get_weights`` then fails until they are swapped back."""
    x = tf.keras.Input((3,), name="x")
    h = tf.keras.layers.Dense(2, activity_regularizer="l2", name="h")(x)
    model = tf.keras.Model(x, tf.keras.layers.Dense(1)(h))
    with tf.Graph().as_default():
        tf.keras.models.clone_model(
            model, input_tensors=tf.compat.v1.placeholder(tf.float32, [None, 3])
        )
    with pytest.raises(AttributeError):
        model.get_weights()
    _tfprivate.keras.restore_v2_classes(model)
    assert len(model.get_weights()) == 4


def test_standardize_sample_weights_maps_them_per_output():
    assert _tfprivate.keras_compile.standardize_sample_weights(None, ["a", "b"]) == [None, None]
    w = np.ones(3)
    assert _tfprivate.keras_compile.standardize_sample_weights({"b": w}, ["a", "b"])[1] is w
