"""RunConfig, ModeKeys and EstimatorSpec as tf.estimator (2.15) defines them, for tpushim's own
Estimator.

Written from tf.estimator's documented behaviour: the same defaults (checkpoints every 600
seconds, summaries every 100 steps, five checkpoints kept, one session config) because they decide
what a run writes and when, and a script's numbers and model_dir should not change with TF.
"""

import collections
import copy
import json
import logging
import os

import tensorflow as tf

logger = logging.getLogger("tpushim")


class ModeKeys:
    """tf.estimator.ModeKeys: the three modes a model_fn is called in."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


def default_session_config():
    """tf.estimator's session config: soft placement, one round of graph rewrites."""
    from tensorflow.core.protobuf import rewriter_config_pb2

    rewrite = rewriter_config_pb2.RewriterConfig(
        meta_optimizer_iterations=rewriter_config_pb2.RewriterConfig.ONE
    )
    return tf.compat.v1.ConfigProto(
        allow_soft_placement=True, graph_options=tf.compat.v1.GraphOptions(rewrite_options=rewrite)
    )


_DEFAULTS = {
    "model_dir": None,
    "tf_random_seed": None,
    "save_summary_steps": 100,
    "save_checkpoints_steps": None,
    "save_checkpoints_secs": 600,
    "session_config": None,
    "keep_checkpoint_max": 5,
    "keep_checkpoint_every_n_hours": 10000,
    "log_step_count_steps": 100,
    "train_distribute": None,
    "device_fn": None,
    "protocol": None,
    "eval_distribute": None,
    "experimental_distribute": None,
    "experimental_max_worker_delay_secs": None,
    "session_creation_timeout_secs": 7200,
    "checkpoint_save_graph_def": True,
}


class RunConfig:
    """tf.estimator.RunConfig for one local process (no ``TF_CONFIG`` cluster)."""

    def __init__(self, **kwargs):
        unknown = set(kwargs) - set(_DEFAULTS)
        if unknown:
            raise TypeError(f"RunConfig got unexpected arguments {sorted(unknown)}")
        values = dict(_DEFAULTS, **kwargs)
        if values["save_checkpoints_steps"] is not None and "save_checkpoints_secs" not in kwargs:
            values["save_checkpoints_secs"] = None  # stock: steps given, seconds not
        if values["save_checkpoints_steps"] and values["save_checkpoints_secs"]:
            raise ValueError(
                "Can not specify both save_checkpoints_steps and save_checkpoints_secs."
            )
        if values["model_dir"] is not None:
            values["model_dir"] = os.fspath(values["model_dir"])
        _check_distribution(values)
        self.__dict__.update(_task_from_tf_config())
        for key, value in values.items():
            setattr(self, "_" + key, value)

    def __getattr__(self, name):
        if "_" + name in _DEFAULTS or name in _DEFAULTS:
            return self.__dict__["_" + name]
        raise AttributeError(f"'RunConfig' object has no attribute {name!r}")

    # One local process (set per instance from TF_CONFIG: _task_from_tf_config).
    service = None

    def replace(self, **kwargs):
        """A copy with these properties replaced (tf.estimator.RunConfig.replace)."""
        unknown = set(kwargs) - set(_DEFAULTS)
        if unknown:
            raise ValueError(f"{sorted(unknown)} are not allowed to be replaced.")
        _check_distribution(kwargs)
        new = copy.copy(self)
        for key, value in kwargs.items():
            setattr(new, "_" + key, value)
        return new

    def __repr__(self):
        return "RunConfig(%s)" % ", ".join(f"{k}={getattr(self, k)!r}" for k in _DEFAULTS)


def _check_distribution(values):
    """A tf.distribute strategy in RunConfig, as tpushim's Estimator honours it: one replica on one
    worker (``MirroredStrategy()`` on a machine with at most one GPU, ``OneDeviceStrategy``, a
    one-worker ``MultiWorkerMirroredStrategy``) computes what one graph computes, so the model
    trains in one graph with stock's numbers (placed by TensorFlow's default placement); a
    ``MirroredStrategy`` (either API's) or a one-worker ``MultiWorkerMirroredStrategy`` of several
    replicas runs over them as stock ran it (each replica its own batch of the input_fn's); other
    strategies of several replicas (``CentralStorageStrategy``: stock fails or has numbers of its
    own) are refused by name, before anything runs (never trained on one device as if the
    strategy were there)."""
    if values.get("experimental_distribute") is not None:
        raise NotImplementedError(
            "RunConfig(experimental_distribute=...) is not supported by tpushim's estimator "
            "API on TensorFlow >= 2.16. Leave it unset, or run this script with TensorFlow "
            "<= 2.15 (Python <= 3.11)."
        )
    for key in ("train_distribute", "eval_distribute"):
        strategy = values.get(key)
        if strategy is None:
            continue
        replicas = getattr(strategy, "num_replicas_in_sync", None)
        name = type(strategy).__name__
        if replicas == 1:
            logger.info(
                "tpushim: RunConfig(%s=%s) has one replica: trained in one graph, with the "
                "numbers the strategy gives (TensorFlow's default placement).",
                key,
                name,
            )
            continue
        if isinstance(strategy, (tf.distribute.MirroredStrategy, _MIRRORED_V1)):
            continue  # stock's way over every replica: _estimator.Estimator's distributed path
        if _one_worker_collective(strategy):
            continue  # the same path: one worker's replicas, their gradients summed as Mirrored's
        raise NotImplementedError(
            f"RunConfig({key}={name}) over {replicas} replicas is not supported by tpushim's "
            "estimator API on TensorFlow >= 2.16"
            + (_CENTRAL_STORAGE if "CentralStorage" in name else "")
            + ", which runs several replicas only for a MirroredStrategy or a one-worker "
            "MultiWorkerMirroredStrategy (their devices on this machine). Use "
            "tf.distribute.MirroredStrategy over the same devices, give the strategy one "
            "device, or leave it unset (the model then trains in one graph placed by "
            "TensorFlow's default placement, on the first GPU where the machine has one); or "
            "run this script with TensorFlow <= 2.15 (Python <= 3.11)."
        )


_MIRRORED_V1 = tf.compat.v1.distribute.MirroredStrategy
#: Why a CentralStorageStrategy of several replicas has no stock numbers to reproduce.
_CENTRAL_STORAGE = (
    " (stock 2.15's estimator fails on it at its first checkpoint for an optimizer with slot "
    "variables -- its Saver finds every replica's slot under one name, 'At least two variables "
    "have the same name: training/SGD/<layer>/bias/momentum' -- and trains a slot-free one with "
    "numbers unlike a MirroredStrategy's, which tpushim does not reproduce)"
)


def _one_worker_collective(strategy):
    """Whether ``strategy`` is a ``MultiWorkerMirroredStrategy`` (either API's) of one worker: no
    cluster, its replicas this machine's devices (several GPUs). Stock 2.15 trains it as a
    ``MirroredStrategy`` of those devices: each replica its own batch, the same numbers."""
    kinds = (
        tf.distribute.MultiWorkerMirroredStrategy,
        tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy,
    )
    return isinstance(strategy, kinds) and getattr(strategy.extended, "_num_workers", 2) == 1


# RunConfig's values for one local process (a TF_CONFIG without a cluster, or none).
_LOCAL_TASK = {
    "master": "",
    "evaluation_master": "",
    "is_chief": True,
    "num_ps_replicas": 0,
    "num_worker_replicas": 1,
    "task_type": "worker",
    "task_id": 0,
    "global_id_in_cluster": 0,
    "cluster_spec": tf.train.ClusterSpec({}),
}


def _task_from_tf_config():
    """This process's task, from TF_CONFIG as tf.estimator.RunConfig reads it (stock's errors,
    verbatim). A cluster of one node, a chief (what a job launcher sets for one process), runs
    here as stock runs it: locally, as the chief. A larger cluster is refused by name: tpushim's
    Estimator trains in one process."""
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster = tf_config.get("cluster") or {}
    task = tf_config.get("task") or {}
    if not cluster:
        if task.get("type", "worker") != "worker":
            raise ValueError('If "cluster" is not set in TF_CONFIG, task type must be WORKER.')
        if int(task.get("index", 0)) != 0:
            raise ValueError('If "cluster" is not set in TF_CONFIG, task index must be 0.')
        return dict(
            _LOCAL_TASK,
            master=tf_config.get("session_master", ""),
            evaluation_master=tf_config.get("eval_session_master", ""),
        )
    spec = tf.train.ClusterSpec(cluster)
    if "master" not in spec.jobs:  # stock's checks of a cluster with a chief
        if "chief" not in spec.jobs:
            raise ValueError('If "cluster" is set in TF_CONFIG, it must have one "chief" node.')
        if len(spec.job_tasks("chief")) > 1:
            raise ValueError('The "cluster" in TF_CONFIG must have only one "chief" node.')
    nodes = {job: len(spec.job_tasks(job)) for job in spec.jobs}
    if nodes == {"chief": 1} and task.get("type") == "chief" and int(task.get("index", -1)) == 0:
        return dict(_LOCAL_TASK, task_type="chief", cluster_spec=spec)
    shown = ", ".join(f"{count} {job}" for job, count in sorted(nodes.items()))
    raise NotImplementedError(
        f"TF_CONFIG names a cluster of tf.estimator tasks ({shown}; this process: "
        f"{task.get('type')} {task.get('index')}), which tpushim's estimator API on "
        "TensorFlow >= 2.16 cannot run: it trains in one process. To train here, unset "
        'TF_CONFIG or leave this process alone in it as the "chief"; to run the cluster, use '
        "TensorFlow <= 2.15 (Python <= 3.11)."
    )


def overwrite_model_dir_and_session_config(config, model_dir):
    """The config an estimator runs with: a session config, and one model_dir (stock's rules)."""
    import tempfile

    if config is None:
        config = RunConfig()
    if not isinstance(config, RunConfig):
        raise ValueError(f"config must be an instance of `RunConfig`, but provided {config}.")
    if config.session_config is None:
        config = config.replace(session_config=default_session_config())
    model_dir = os.fspath(model_dir) if model_dir is not None else None
    if model_dir is not None and config.model_dir is not None and config.model_dir != model_dir:
        raise ValueError(
            "`model_dir` are set both in constructor and `RunConfig`, but with different values. "
            f"In constructor: '{model_dir}', in `RunConfig`: '{config.model_dir}' "
        )
    if model_dir:
        config = config.replace(model_dir=model_dir)
    elif config.model_dir is None:
        model_dir = tempfile.mkdtemp()
        tf.compat.v1.logging.warning("Using temporary folder as model directory: %s", model_dir)
        config = config.replace(model_dir=model_dir)
    return config


_SPEC_FIELDS = (
    "mode",
    "predictions",
    "loss",
    "train_op",
    "eval_metric_ops",
    "export_outputs",
    "training_chief_hooks",
    "training_hooks",
    "scaffold",
    "evaluation_hooks",
    "prediction_hooks",
)


class EstimatorSpec(collections.namedtuple("EstimatorSpec", _SPEC_FIELDS)):
    """tf.estimator.EstimatorSpec: what a model_fn returns (Keras metrics become (value, update))."""

    def __new__(
        cls,
        mode,
        predictions=None,
        loss=None,
        train_op=None,
        eval_metric_ops=None,
        export_outputs=None,
        training_chief_hooks=None,
        training_hooks=None,
        scaffold=None,
        evaluation_hooks=None,
        prediction_hooks=None,
    ):
        if mode == ModeKeys.TRAIN and (loss is None or train_op is None):
            raise ValueError("Missing loss or train_op in TRAIN mode.")
        if mode == ModeKeys.EVAL and loss is None:
            raise ValueError("Missing loss in EVAL mode.")
        if mode == ModeKeys.PREDICT and predictions is None:
            raise ValueError("Missing predictions in PREDICT mode.")
        metrics = {}
        added = []
        for key, value in (eval_metric_ops or {}).items():
            if isinstance(value, tf.keras.metrics.Metric):
                if not value.updates:
                    raise ValueError(f'Please call update_state(...) on the "{key}" metric')
                added.extend(value.variables)
                value = (value.result(), value.updates[0])
            metrics[key] = value
        for collection in (
            tf.compat.v1.GraphKeys.LOCAL_VARIABLES,
            tf.compat.v1.GraphKeys.METRIC_VARIABLES,
        ):
            present = tf.compat.v1.get_collection(collection)
            for variable in added:
                if variable not in present:
                    tf.compat.v1.add_to_collection(collection, variable)
        if predictions is not None and mode == ModeKeys.PREDICT and export_outputs is None:
            outputs = predictions if isinstance(predictions, dict) else {"output": predictions}
            export_outputs = {"serving_default": _predict_output(outputs)}
        return super().__new__(
            cls,
            mode=mode,
            predictions=predictions,
            loss=loss,
            train_op=train_op,
            eval_metric_ops=metrics,
            export_outputs=export_outputs,
            training_chief_hooks=tuple(training_chief_hooks or ()),
            training_hooks=tuple(training_hooks or ()),
            scaffold=scaffold or tf.compat.v1.train.Scaffold(),
            evaluation_hooks=tuple(evaluation_hooks or ()),
            prediction_hooks=tuple(prediction_hooks or ()),
        )

    def _replace(self, **kwargs):
        """A new spec with these fields replaced, checked and converted as a new one is."""
        return EstimatorSpec(**dict(self._asdict(), **kwargs))


def _predict_output(outputs):
    from tpushim._estimator_api import _tfprivate  # (what _export.PredictOutput is)

    return _tfprivate.export_output.PredictOutput(outputs)
