"""TensorFlow's TPU names and TPUEstimator's TPU context (None-safe on TensorFlow >= 2.16)."""

import tensorflow as tf
from tensorflow.python.tpu import tpu_function  # number of shards inside a replicated computation

from tpushim._tfprivate import modules


def tpu_context_like(ctx, train_batch_size, eval_batch_size, predict_batch_size, config=None):
    """A TPU context (TPUEstimator's ``_ctx``) as ``ctx`` but for these global batch sizes (and
    ``config``, a ``tpu_config.RunConfig``, when given), sharing ``ctx``'s answer from the TPU
    system (asked once per master, then cached)."""
    new = modules.tpu_context._get_tpu_context(
        ctx._config if config is None else config,
        train_batch_size,
        eval_batch_size,
        predict_batch_size,
        ctx._use_tpu,
        ctx._eval_on_tpu,
        None,
    )
    new._lazy_tpu_system_metadata_dict = ctx._lazy_tpu_system_metadata_dict
    return new


def skip_batch_validation(ctx):
    """Marks a TPU context as validated, for every mode: its batch sizes are placeholders that no
    graph is built with (each call builds with a context made by :func:`tpu_context_like`, which
    TPUEstimator validates as usual)."""

    modes = tf.estimator.ModeKeys
    ctx._lazy_validation_dict.update({modes.TRAIN: True, modes.EVAL: True, modes.PREDICT: True})


def tpu_context_config(ctx):
    """The ``tpu_config.RunConfig`` a TPU context builds with."""
    return ctx._config


def tpu_input_context(ctx, device):
    """The ``params['context']`` TPUEstimator gives the first input_fn invocation (host 0's)."""
    return modules.tpu_context.TPUContext(
        internal_ctx=ctx, input_device=device, invocation_index=0, host_id=0
    )


def tpu_eval_steps_hooks(steps):
    """The session hooks with which TPUEstimator runs ``steps`` evaluation steps on a TPU (what
    its ``_convert_eval_steps_to_hooks`` returns)."""
    from tensorflow.python.training import evaluation

    return [
        evaluation._StopAfterNEvalsHook(num_evals=steps),
        modules.tpu_estimator._SetEvalIterationsHook(steps),
    ]


def num_shards_in_replica_context():
    """The number of shards of the TPU computation being built (None outside one)."""
    return tpu_function.get_tpu_context().number_of_shards


def replaced_tpu_system_query():
    """TensorFlow's TPU system query (``tpu_system_metadata._query_tpu_system_metadata``, which
    TPUEstimator's TPU context sends to its master) when someone replaced it -- the preflight's
    faked TPU system answers it for its own masters --, or None while it is TensorFlow's own."""
    from tensorflow.python.tpu import tpu_system_metadata as module

    query = module._query_tpu_system_metadata
    return None if getattr(query, "__module__", None) == module.__name__ else query
