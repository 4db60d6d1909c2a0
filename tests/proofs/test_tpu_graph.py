"""Rung 2: the TPU computations, built for 8 replicas by TPU replication on CPU (never run)."""

import pytest
import replicas
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import
from replicas import PER as PER_REPLICA
from replicas import REPLICAS

_model_fn = tpuestimator_import("tpushim._model_fn")
_padding = tpuestimator_import("tpushim._padding")

pytestmark = pytest.mark.tpuestimator  # the TPU path (cpu mode's TPUEstimator) throughout

ModeKeys = tfcases.ModeKeys


def _features():
    return tf.zeros([PER_REPLICA, 4])


def _labels():
    return tf.zeros([PER_REPLICA, 1], tf.int64)


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9),
        lambda: tf.keras.optimizers.legacy.Adam(0.01),
        lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    ],
    ids=["keras-sgd", "keras-adam", "tf1-sgd"],
)
def test_train_step_one_cross_replica_sum_per_variable_and_for_the_reported_loss(optimizer):
    model = tfcases.sequential(
        optimizer(), extra_layers=(tf.keras.layers.BatchNormalization(name="bn"),)
    )

    def out(spec):
        with tf.control_dependencies([spec.train_op]):
            return tf.identity(spec.loss)

    graph, spec, outputs = replicas.replicated_model_fn(
        model, ModeKeys.TRAIN, _features, _labels, out
    )
    trainable = graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    sums = replicas.ops_of_type(graph, "CrossReplicaSum")
    assert len(trainable) == 6  # hidden, bn (gamma, beta), probs
    # One per gradient, and the cores' losses summed into the loss the step reports (a mean
    # loss needs no global counts: no "loss totals").
    purposes = replicas.cross_replica_sums(op.name for op in sums)
    assert purposes == {"gradient": len(trainable), "reported loss": 1, "loss totals": 0}
    for op in sums:  # every aggregated gradient has a static shape
        assert op.inputs[0].shape.is_fully_defined(), op.name
    assert spec.loss.shape.is_fully_defined()
    assert len(outputs) == REPLICAS
    # The train step carries no (dead, stateful) metric updates into the TPU computation.
    assert not [
        op.name
        for op in graph.get_operations()
        if "/metrics/" in op.name or op.name.startswith("metrics/")
    ]


@pytest.mark.parametrize(
    "loss, padded, totals",
    [
        (tf.keras.losses.MeanSquaredError(reduction=tf.keras.losses.Reduction.SUM), False, 0),
        ("mse", True, 1),
    ],
    ids=["sum-reduction", "mean-padded"],
)
def test_train_step_sums_global_counts_once_where_a_term_needs_them(loss, padded, totals):
    """A summed loss is scaled, not counted (no totals); a padded batch's mean divides by the
    real rows of the global batch: one more all-reduce, however many counts it carries."""
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(4,))])
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), loss=loss)

    def features():
        if not padded:
            return _features()
        return {
            _padding.FEATURES_KEY: _features(),
            _padding.PADDING_KEY: tf.ones([PER_REPLICA]),
        }

    graph, _, _ = replicas.replicated_model_fn(
        model,
        ModeKeys.TRAIN,
        features,
        lambda: tf.zeros([PER_REPLICA, 2]),
        replicas.train_step_outputs,
    )
    sums = replicas.ops_of_type(graph, "CrossReplicaSum")
    purposes = replicas.cross_replica_sums(op.name for op in sums)
    assert purposes == {"gradient": 2, "reported loss": 1, "loss totals": totals}


def test_cpu_path_emits_nothing_tpu_only():
    model = tfcases.sequential()
    with tf.Graph().as_default() as graph:
        tf.compat.v1.train.get_or_create_global_step()
        _model_fn.make_model_fn(model)(
            _features(),
            _labels(),
            ModeKeys.TRAIN,
            params={"use_tpu": False, "batch_size": PER_REPLICA},
        )
    assert not replicas.ops_of_type(graph, "CrossReplicaSum")
    assert not [op for op in graph.get_operations() if op.type.startswith("TPU")]


def test_eval_metric_fn_tensors_and_values_as_tpu_requires():
    model = tfcases.two_in_two_out()
    features = lambda: {"a": tf.zeros([PER_REPLICA, 4]), "b": tf.zeros([PER_REPLICA, 2])}
    labels = lambda: {
        "cls": tf.zeros([PER_REPLICA, 1], tf.int64),
        "reg": tf.zeros([PER_REPLICA, 1]),
    }
    graph, spec, _ = replicas.replicated_model_fn(
        model, ModeKeys.EVAL, features, labels, lambda s: tf.identity(s.loss)
    )
    # The loss is that of the whole global batch on every shard: one all-reduce per output.
    assert len(replicas.ops_of_type(graph, "CrossReplicaSum")) == 2
    assert spec.loss.shape.rank == 0
    metric_fn, tensors = spec.eval_metrics
    for (
        name,
        tensor,
    ) in tensors.items():  # outfed from the TPU: static, with the batch dimension first
        assert tensor.shape.is_fully_defined(), name
        assert tensor.shape[0] == PER_REPLICA, name
    with graph.as_default():  # metric_fn runs on the host, outside the replicated computation
        host = {
            k: tf.zeros([PER_REPLICA * REPLICAS] + v.shape.as_list()[1:], v.dtype)
            for k, v in tensors.items()
        }
        metrics = metric_fn(**host)
        local = graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
        metric_vars = graph.get_collection(tf.compat.v1.GraphKeys.METRIC_VARIABLES)
    assert set(metrics) == {"cls_accuracy", "reg_mae", "reg_root_mean_squared_error"}
    for name, pair in metrics.items():
        assert isinstance(pair, tuple) and len(pair) == 2, name  # (value, update_op)
        value, update_op = pair
        assert isinstance(value, tf.Tensor) and value.shape.rank == 0
        assert isinstance(update_op, (tf.Tensor, tf.Operation))
    assert len(metric_vars) == 6  # total/count for each of the three metrics
    assert {v.ref() for v in metric_vars} <= {v.ref() for v in local}


def test_predict_outputs_static_batch():
    model = tfcases.two_in_two_out()
    features = lambda: {"a": tf.zeros([PER_REPLICA, 4]), "b": tf.zeros([PER_REPLICA, 2])}
    _, spec, outputs = replicas.replicated_model_fn(
        model,
        ModeKeys.PREDICT,
        features,
        lambda: None,
        lambda s: [s.predictions[k] for k in sorted(s.predictions)],
    )
    assert set(spec.predictions) == {"cls", "reg"}
    for name, tensor in spec.predictions.items():
        assert tensor.shape.is_fully_defined() and tensor.shape[0] == PER_REPLICA, name
    assert len(outputs) == REPLICAS


@pytest.mark.parametrize("use_tpu", [False, True], ids=["cpu", "tpu"])
def test_batchnorm_takes_kerass_own_code_unless_the_batch_is_padded(use_tpu):
    """A batch without padding trains a BatchNormalization by Keras's own code (the fused kernel,
    for 4-D inputs), as stock; a padded batch off a TPU by Keras's own code on its real rows, on
    a TPU by the fused kernel's normalisation written out over the real rows (no kernel: XLA
    would expand it into reductions over every row) -- never a conditional (#36)."""
    model = tfcases.sequential(
        extra_layers=(
            tf.keras.layers.Reshape((2, 2, 2)),
            tf.keras.layers.BatchNormalization(name="bn"),
            tf.keras.layers.Flatten(),
        )
    )
    for padded in (False, True):

        def features(padded=padded):
            if padded:
                weight = tf.constant([1.0] * (PER_REPLICA - 1) + [0.0])
                return {_padding.FEATURES_KEY: _features(), _padding.PADDING_KEY: weight}
            return _features()

        if use_tpu:
            graph, _, _ = replicas.replicated_model_fn(
                model, ModeKeys.TRAIN, features, _labels, replicas.train_step_outputs
            )
        else:
            with tf.Graph().as_default() as graph:
                tf.compat.v1.train.get_or_create_global_step()
                _model_fn.make_model_fn(model)(
                    features(),
                    _labels(),
                    ModeKeys.TRAIN,
                    params={"use_tpu": False, "batch_size": PER_REPLICA},
                )
        fused = replicas.ops_of_type(graph, "FusedBatchNormV3")
        conds = [
            op
            for op in graph.get_operations()
            if op.type in ("If", "StatelessIf") and not op.name.startswith("global_step/")
        ]  # Estimator's global-step read (is it initialised?) is a cond of its own
        assert (len(fused), conds) == (0 if padded and use_tpu else 1, []), padded
