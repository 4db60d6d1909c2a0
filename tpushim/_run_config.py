"""The user's RunConfig carried into the ``tpu_config.RunConfig`` TPUEstimator needs."""

import json
import logging
import os

import tensorflow as tf

from tpushim import _batch_math, _settings, _tfprivate

logger = logging.getLogger("tpushim")

tpu_config = _tfprivate.modules.tpu_config

# RunConfig settings carried one-to-one into tpu_config.RunConfig.
_CARRIED = (
    "model_dir",
    "tf_random_seed",
    "save_summary_steps",
    "save_checkpoints_steps",
    "save_checkpoints_secs",
    "session_config",
    "keep_checkpoint_max",
    "keep_checkpoint_every_n_hours",
    "log_step_count_steps",
    "device_fn",
    "protocol",
    "experimental_max_worker_delay_secs",
    "session_creation_timeout_secs",
    "checkpoint_save_graph_def",
)
# Settings that mean nothing under TPUEstimator: carried where RunConfig allows, with a warning.
_IGNORED_ON_TPU = ("train_distribute", "eval_distribute", "experimental_distribute")


def _tf_config_cluster():
    try:
        return json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster")
    except (ValueError, AttributeError):
        return None  # RunConfig itself reports a malformed TF_CONFIG


def _tpu_as_remote_master(config):
    """This process drives the TPU as a session client; it is not a task of the TPU's cluster.

    A tpu_config.RunConfig copies its TPU resolver's cluster into ``cluster_spec``, and
    ``tf.estimator.train_and_evaluate`` reads any ``cluster_spec`` as "this process is a task of
    a training cluster": it runs as a worker, starts a gRPC server on that address (the TPU's own)
    and never evaluates. With no cluster in TF_CONFIG, the spec is emptied on a copy, so
    train_and_evaluate trains and evaluates locally against the TPU master, as train() and
    evaluate() do; the session still finds the TPU worker through ``session_config.cluster_def``,
    which RunConfig filled from the resolver.
    """
    if config.cluster is None or not config.cluster_spec or _tf_config_cluster():
        return config
    config = config.replace()  # a deep copy: the user's RunConfig is left as it is
    _tfprivate.estimator.set_cluster_spec(config, tf.train.ClusterSpec({}))
    return config


def to_tpu_run_config(config, settings, cluster):
    """The user's RunConfig as a tpu_config.RunConfig; nothing they set is dropped silently."""
    return _tpu_as_remote_master(_to_tpu_run_config(config, settings, cluster))


def _partition_dims_for_padded_features(config):
    """The script's own ``TPUConfig(input_partition_dims=[features, labels])`` (model parallelism,
    ``num_cores_per_replica``) for the features tpushim feeds: the script's features under
    ``_padding.FEATURES_KEY`` beside the padding weight (``PADDING_KEY``, not partitioned). The
    dims as given would match no key (TPUEstimator: "input_partition_dims[0] mismatched feature
    keys")."""
    from tpushim import _padding

    dims = config.tpu_config.input_partition_dims
    if not dims or (
        isinstance(dims[0], dict) and set(dims[0]) == {_padding.FEATURES_KEY, _padding.PADDING_KEY}
    ):
        return config
    features = {_padding.FEATURES_KEY: dims[0], _padding.PADDING_KEY: None}
    # _replace: TPUConfig validated the script's dims when it was made (a namedtuple's _replace
    # does not run its checks again).
    translated = config.tpu_config._replace(input_partition_dims=[features, *dims[1:]])
    return config.replace(tpu_config=translated)


def _to_tpu_run_config(config, settings, cluster):
    if isinstance(config, tpu_config.RunConfig):
        config = _partition_dims_for_padded_features(config)
        if cluster is not None and config.cluster is None:
            # RunConfig.replace() cannot set a cluster: rebuild with every carried setting.
            config = tpu_config.RunConfig(
                tpu_config=config.tpu_config,
                cluster=cluster,
                **{k: getattr(config, k) for k in _CARRIED},
            )
        if settings.iterations_per_loop:
            config = config.replace(
                tpu_config=config.tpu_config._replace(
                    iterations_per_loop=settings.iterations_per_loop
                )
            )
        return config
    kwargs = {k: getattr(config, k) for k in _CARRIED}
    distributed = {key: (name, n) for key, name, n in _batch_math.distribute_strategies(config)}
    for key in _IGNORED_ON_TPU:
        if key in distributed:  # the batch arithmetic too: the script's batch is now global
            problem, fix = _batch_math.distributed_batch(key, *distributed[key])
            logger.warning(
                "RunConfig.%s is ignored by TPUEstimator (a TPU replicates the model itself). "
                "%s; %s.",
                key,
                problem,
                fix,
            )
        elif getattr(config, key, None) is not None:
            logger.warning(
                "RunConfig.%s is ignored by TPUEstimator (a TPU replicates the "
                "model itself); remove it or run with TPUSHIM_MODE=off.",
                key,
            )
    iterations = settings.iterations_per_loop or _settings.DEFAULT_ITERATIONS_PER_LOOP
    if not settings.iterations_per_loop and config.save_checkpoints_steps:
        iterations = min(iterations, config.save_checkpoints_steps)
    tpu = tpu_config.TPUConfig(
        iterations_per_loop=iterations,
        per_host_input_for_training=tpu_config.InputPipelineConfig.PER_HOST_V2,
    )
    return tpu_config.RunConfig(tpu_config=tpu, cluster=cluster, **kwargs)
