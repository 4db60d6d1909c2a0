"""Serving input receivers and SavedModel export (tf.estimator.export on TensorFlow >= 2.16).

The export outputs and signature building are TensorFlow's own (saved_model.model_utils); the
SavedModel is written by ``tf.compat.v1.saved_model.Builder`` from the PREDICT graph restored from
a checkpoint, into a timestamped folder, as stock's export_saved_model writes it.
"""

import collections
import os

import tensorflow as tf

from tpushim._estimator_api import _tfprivate

ExportOutput = _tfprivate.export_output.ExportOutput
PredictOutput = _tfprivate.export_output.PredictOutput
ClassificationOutput = _tfprivate.export_output.ClassificationOutput
RegressionOutput = _tfprivate.export_output.RegressionOutput
EvalOutput = _tfprivate.export_output.EvalOutput


def _as_dict(value, default_key):
    if value is None or isinstance(value, dict):
        return value
    return {default_key: value}


class ServingInputReceiver(
    collections.namedtuple(
        "ServingInputReceiver", ["features", "receiver_tensors", "receiver_tensors_alternatives"]
    )
):
    """tf.estimator.export.ServingInputReceiver: the features a served model sees, and what
    serving feeds."""

    def __new__(cls, features, receiver_tensors, receiver_tensors_alternatives=None):
        if features is None:
            raise ValueError("features must be defined.")
        features = _as_dict(features, "feature")
        receiver_tensors = _as_dict(receiver_tensors, "input")
        if receiver_tensors is None:
            raise ValueError("receiver_tensors must be defined.")
        return super().__new__(cls, features, receiver_tensors, receiver_tensors_alternatives)


class TensorServingInputReceiver(ServingInputReceiver):
    """tf.estimator.export.TensorServingInputReceiver: a receiver whose features are one tensor
    (passed to the model_fn as it is, not in a dict)."""

    def __new__(cls, features, receiver_tensors, receiver_tensors_alternatives=None):
        if features is None:
            raise ValueError("features must be defined.")
        if not isinstance(features, (tf.Tensor, tf.SparseTensor)):
            raise ValueError(f"feature must be a Tensor or SparseTensor; got {features!r}.")
        receiver = ServingInputReceiver(features, receiver_tensors, receiver_tensors_alternatives)
        return super(ServingInputReceiver, cls).__new__(
            cls,
            receiver.features["feature"],
            receiver.receiver_tensors,
            receiver.receiver_tensors_alternatives,
        )


def _add_label_and_weight(parsing_spec, label_key, label_spec, weight_column):
    if label_key in parsing_spec:
        raise ValueError(
            "label should not be used as feature. "
            f"label_key: {label_key}, features: {parsing_spec.keys()}"
        )
    parsing_spec[label_key] = label_spec
    if weight_column is None:
        return parsing_spec
    if isinstance(weight_column, str):
        weight_column = tf.feature_column.numeric_column(weight_column)
    if type(weight_column).__name__ != "NumericColumn":
        raise ValueError(
            "weight_column should be an instance of tf.feature_column.numeric_column. "
            f"Given type: {type(weight_column)} value: {weight_column}"
        )
    if weight_column.key in parsing_spec:
        raise ValueError(
            "weight_column should not be used as feature. "
            f"weight_column: {weight_column.key}, features: {parsing_spec.keys()}"
        )
    parsing_spec.update(weight_column.parse_example_spec)
    return parsing_spec


def classifier_parse_example_spec(
    feature_columns, label_key, label_dtype=tf.int64, label_default=None, weight_column=None
):
    """tf.estimator.classifier_parse_example_spec: the parsing spec of ``feature_columns`` plus
    a one-value label (and a weight)."""
    spec = tf.compat.v1.feature_column.make_parse_example_spec(feature_columns)
    label = tf.io.FixedLenFeature((1,), label_dtype, label_default)
    return _add_label_and_weight(spec, label_key, label, weight_column)


def regressor_parse_example_spec(
    feature_columns,
    label_key,
    label_dtype=tf.float32,
    label_default=None,
    label_dimension=1,
    weight_column=None,
):
    """tf.estimator.regressor_parse_example_spec: the parsing spec of ``feature_columns`` plus a
    ``label_dimension``-value label (and a weight)."""
    spec = tf.compat.v1.feature_column.make_parse_example_spec(feature_columns)
    label = tf.io.FixedLenFeature((label_dimension,), label_dtype, label_default)
    return _add_label_and_weight(spec, label_key, label, weight_column)


def build_raw_serving_input_receiver_fn(features, default_batch_size=None):
    """A receiver fn feeding a placeholder per feature (like ``features``' dtypes and shapes)."""

    def serving_input_receiver_fn():
        receiver = {}
        for name, tensor in features.items():
            shape = [default_batch_size] + tensor.get_shape().as_list()[1:]
            receiver[name] = tf.compat.v1.placeholder(dtype=tensor.dtype, shape=shape, name=name)
        return ServingInputReceiver(receiver.copy(), receiver)

    return serving_input_receiver_fn


def build_parsing_serving_input_receiver_fn(feature_spec, default_batch_size=None):
    """A receiver fn parsing serialized tf.Example protos with ``feature_spec``."""

    def serving_input_receiver_fn():
        serialized = tf.compat.v1.placeholder(
            dtype=tf.string, shape=[default_batch_size], name="input_example_tensor"
        )
        features = tf.io.parse_example(serialized, feature_spec)
        return ServingInputReceiver(features, {"examples": serialized})

    return serving_input_receiver_fn


def export_saved_model(
    estimator, export_dir_base, receiver_fn, assets_extra, as_text, checkpoint_path, mode
):
    """The PREDICT graph of ``estimator`` as a SavedModel in ``export_dir_base/<timestamp>``."""
    from tpushim._estimator_api._config import ModeKeys

    if mode != ModeKeys.PREDICT:
        raise NotImplementedError(
            "tpushim's estimator API on TensorFlow >= 2.16 exports the PREDICT graph only."
        )
    if not receiver_fn:
        raise ValueError("An input_receiver_fn must be defined.")
    checkpoint_path = checkpoint_path or estimator.latest_checkpoint()
    if not checkpoint_path:
        raise ValueError(f"Couldn't find trained model at {estimator.model_dir}.")
    utils = _tfprivate.export_utils
    export_dir = utils.get_timestamped_export_dir(export_dir_base)
    temp_dir = utils.get_temp_export_dir(export_dir)
    builder = tf.compat.v1.saved_model.Builder(temp_dir)
    with tf.Graph().as_default() as graph:
        tf.compat.v1.random.set_random_seed(estimator.config.tf_random_seed)
        receiver = receiver_fn()
        tf.compat.v1.train.get_or_create_global_step(graph)
        spec = estimator._call_model_fn(receiver.features, None, mode)
        signatures = utils.build_all_signature_defs(
            receiver.receiver_tensors,
            spec.export_outputs,
            receiver.receiver_tensors_alternatives,
            serving_only=True,
        )
        with tf.compat.v1.Session(config=estimator.config.session_config) as session:
            saver = spec.scaffold.saver or tf.compat.v1.train.Saver(sharded=True)
            saver.restore(session, checkpoint_path)
            local_init = (
                spec.scaffold.local_init_op or tf.compat.v1.train.Scaffold.default_local_init_op()
            )
            builder.add_meta_graph_and_variables(
                session,
                [tf.saved_model.SERVING],
                signature_def_map=signatures,
                assets_collection=tf.compat.v1.get_collection(
                    tf.compat.v1.GraphKeys.ASSET_FILEPATHS
                ),
                main_op=local_init,
                saver=saver,
                strip_default_attrs=True,
            )
    builder.save(as_text)
    if assets_extra:
        extra_dir = os.path.join(tf.compat.as_bytes(temp_dir), b"assets.extra")
        for dest, source in assets_extra.items():
            dest_path = os.path.join(extra_dir, tf.compat.as_bytes(dest))
            tf.io.gfile.makedirs(os.path.dirname(dest_path))
            tf.io.gfile.copy(source, dest_path)
    tf.io.gfile.rename(temp_dir, export_dir)
    return export_dir
