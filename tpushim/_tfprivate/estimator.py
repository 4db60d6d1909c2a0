"""tensorflow_estimator's names (or, on TensorFlow >= 2.16, tpushim's estimator API's twins):
keras_lib's conversion helpers, the first checkpoint, RunConfig, add_metrics, hooks, the
numpy/pandas input_fn's feeding.
"""

import functools

import tensorflow as tf

from tpushim._tfprivate import modules

if modules.keras_lib is not None:
    # keras_lib helpers, reused so that tpushim clones, feeds and warm-starts exactly as stock does.
    convert_estimator_io_to_keras = modules.keras_lib._convert_estimator_io_to_keras
    # Stock's check that a subclassed model rebuilds from its config (its errors, verbatim).
    assert_valid_model = modules.keras_lib._assert_valid_model
    any_weight_initialized = modules.keras_lib._any_weight_initialized
    FormattedKeyError = modules.keras_lib.FormattedKeyError
    DEFAULT_SERVING_KEY = modules.keras_lib._DEFAULT_SERVING_KEY
    maybe_overwrite_model_dir_and_session_config = (
        modules.estimator_lib.maybe_overwrite_model_dir_and_session_config
    )
    from tensorflow_estimator.python.estimator.mode_keys import ModeKeys  # tf.estimator.ModeKeys

    EstimatorBase = modules.estimator_lib.EstimatorV2  # tf.estimator.Estimator
else:  # the estimator API's twins (tpushim/_estimator_api/_keras.py wrote them from stock's)
    from tpushim._estimator_api import _config as _api_config
    from tpushim._estimator_api import _estimator as _api_estimator
    from tpushim._estimator_api import _keras as _api_keras

    convert_estimator_io_to_keras = _api_keras.keras_io
    assert_valid_model = _api_keras._assert_valid_model
    any_weight_initialized = _api_keras._any_weight_initialized
    DEFAULT_SERVING_KEY = _api_keras._SERVING_KEY
    maybe_overwrite_model_dir_and_session_config = (
        _api_config.overwrite_model_dir_and_session_config
    )
    ModeKeys = _api_config.ModeKeys
    EstimatorBase = _api_estimator.Estimator  # tf.estimator.Estimator there, with tpushim on


def save_first_checkpoint(keras_model, custom_objects, config, save_object_ckpt, on_graph=None):
    """keras_lib's ``_save_first_checkpoint`` (the Keras weights in ``model_dir/keras``, the warm
    start), with stock's clone: :func:`tpushim._first_checkpoint.save`."""
    import tensorflow as tf

    from tpushim import _first_checkpoint

    return _first_checkpoint.save(
        keras_model,
        config,
        save_object_ckpt,
        lambda model: modules.keras_lib._clone_and_build_model(
            tf.estimator.ModeKeys.TRAIN, model, custom_objects
        ),
        keras_model.get_weights() if any_weight_initialized(keras_model) else None,
        on_graph,
    )


def log_every_step_count_steps_on_cpu(estimator, config):
    """TPUEstimator(use_tpu=False) logs examples/sec every log_step_count_steps steps, as Estimator.

    TPUEstimator divides log_step_count_steps by iterations_per_loop, as one session.run is
    iterations_per_loop steps on a TPU. On CPU one run is one step, so with iterations_per_loop
    100 its ExamplesPerSecondHook fired at every step: one more session.run (the global step) and
    two summaries written to the event file per step. This touches only that hook's period.
    """
    if config is not None and estimator._log_every_n_steps is not None:
        estimator._log_every_n_steps = config.log_step_count_steps


def set_cluster_spec(run_config, cluster_spec):
    """Sets a RunConfig's ``cluster_spec`` (read-only in its API; the constructor derives it)."""
    run_config._cluster_spec = cluster_spec


def add_metrics_parts(model_fn):
    """``(estimator, metric_fn)`` when ``model_fn`` is the one ``tf.estimator.add_metrics`` makes
    (extenders.py's ``new_model_fn``, a closure over both), else None."""
    code = getattr(model_fn, "__code__", None)
    if (
        code is None
        or code.co_name != "new_model_fn"
        or getattr(model_fn, "__module__", None) != modules.extenders.__name__
    ):
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in model_fn.__closure__ or ())))
    if "estimator" not in cells or "metric_fn" not in cells:
        return None
    return cells["estimator"], cells["metric_fn"]


def estimator_of_model_fn(model_fn):
    """``(estimator, partial's args, partial's keywords)`` when ``model_fn`` is an estimator's own:
    ``estimator.model_fn`` (estimator.py's ``public_model_fn``, a closure over it) or a
    TPUEstimator's ``estimator._model_fn`` (tpu_estimator.py's ``_model_fn``), alone or in a
    ``functools.partial``; else None."""

    args, keywords = (), {}
    if isinstance(model_fn, functools.partial):  # nested partials are flattened by partial itself
        model_fn, args, keywords = model_fn.func, model_fn.args, model_fn.keywords
    code = getattr(model_fn, "__code__", None)
    own = {
        ("public_model_fn", modules.estimator_lib.__name__),
        ("_model_fn", modules.tpu_estimator.__name__),
    }
    if code is None or (code.co_name, getattr(model_fn, "__module__", None)) not in own:
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in model_fn.__closure__ or ())))
    estimator = cells.get("self")
    return None if estimator is None else (estimator, args, keywords)


def estimator_classes():
    """{class: its public name} of the estimator classes a script constructs."""
    return {
        modules.estimator_lib.EstimatorV2: "tf.estimator.Estimator",
        modules.estimator_lib.Estimator: "tf.compat.v1.estimator.Estimator",
        modules.tpu_estimator.TPUEstimator: "tf.compat.v1.estimator.tpu.TPUEstimator",
    }


def validate_eval_metric_ops(eval_metric_ops):
    """Stock's checks of ``eval_metric_ops`` (its errors, verbatim); Keras ``Metric`` objects
    become ``(result, update_op)`` and their variables local metric variables, as
    ``EstimatorSpec`` makes them (TensorFlow >= 2.16: tpushim's own ``EstimatorSpec``'s)."""
    if modules.keras_lib is None:
        import tensorflow as tf

        spec = _api_config.EstimatorSpec(
            mode=ModeKeys.EVAL, loss=tf.constant(0.0), eval_metric_ops=eval_metric_ops
        )
        return spec.eval_metric_ops
    from tensorflow_estimator.python.estimator import model_fn as model_fn_lib

    return model_fn_lib._validate_eval_metric_ops(eval_metric_ops)


def warm_start_settings(estimator):
    """An estimator's ``WarmStartSettings`` (or None), as ``tf.estimator.add_metrics`` reads it."""
    return estimator._warm_start_settings


def fn_args(fn):
    """Argument names of a function, as Estimator reads them (functools.partial aware)."""
    from tensorflow.python.util import function_utils

    return function_utils.fn_args(fn)


def replace_enqueue_data(make_wrapper):
    """Sets ``make_wrapper(original)`` as ``feeding_functions._enqueue_data``, which fills
    numpy_input_fn's / pandas_input_fn's queues (both look it up by attribute at call time);
    returns a function that restores the original (unless someone replaced the wrapper since).
    On TensorFlow >= 2.16 the same for tpushim's own input_fns (tpushim/_estimator_api/_inputs.py):
    their ``_enqueue``, which takes the arguments of the same names (no ``seed``, ``pad_value``)."""
    if modules.ON_TF_KERAS:
        from tpushim._estimator_api import _inputs as module

        name = "_enqueue"
    else:
        from tensorflow_estimator.python.estimator.inputs.queues import feeding_functions as module

        name = "_enqueue_data"
    original = getattr(module, name)
    wrapper = make_wrapper(original)
    setattr(module, name, wrapper)

    def restore():
        if getattr(module, name) is wrapper:
            setattr(module, name, original)

    return restore


def feeding_start_rows(runner):
    """The row each feeding thread of a numpy_input_fn / pandas_input_fn queue runner starts at
    (drawn when the input_fn built it; the runner never started), or [] for another runner."""
    if modules.ON_TF_KERAS:
        from tpushim._estimator_api import _inputs

        if not isinstance(runner, _inputs._FeedingQueueRunner):
            return []
        return [feeder.start for feeder in runner._feeds.values()]
    from tensorflow_estimator.python.estimator.inputs.queues import feeding_queue_runner

    if not isinstance(runner, feeding_queue_runner._FeedingQueueRunner):
        return []
    return [getattr(feed_fn, "_trav", None) for feed_fn in runner._feed_fns]


def dataset_initializer_hook_classes():
    """The session hooks that initialise an estimator's input iterator when its session starts:
    Estimator's (``parse_input_fn_result``, on CPU) and TPUEstimator's (one for every TPU host's
    iterator, made in ``_InputPipeline``). Both run the initializer without a feed."""
    from tensorflow_estimator.python.estimator import util as estimator_util
    from tensorflow_estimator.python.estimator.tpu import util as tpu_util

    return (estimator_util._DatasetInitializerHook, tpu_util.MultiHostDatasetInitializerHook)


def global_step_read():
    """The read of the global step that Estimator's hooks fetch with each training step (created
    and cached in the graph when missing)."""
    from tensorflow.python.training import training_util

    return training_util._get_or_create_global_step_read()


# --- the strategy engine (tpushim/_strategy/) ---------------------------------------------------

# Stock's Keras model_fn: the strategy engine's estimator keeps it as its model_fn, so that what
# the base Estimator builds from it (export_saved_model, add_metrics) is stock's.
create_keras_model_fn = (
    modules.keras_lib._create_keras_model_fn
    if modules.keras_lib is not None
    else _api_keras._model_fn_for
)


def track_estimator_step(model, step):
    """Adds ``step`` to the model's object graph under the name keras_lib's checkpoints give the
    global step (an eager variable; :func:`track_global_step` takes the graph's)."""
    model._track_trackable(step, "estimator_global_step")


# --- SessionRunHooks on the strategy engine (tpushim/_stock_hooks.py foresees their stops) -------


def stop_at_step_last(hook):
    """The step a ``tf.compat.v1.train.StopAtStepHook`` stops at (known after its
    ``after_create_session``), or None for any other hook."""

    if isinstance(hook, tf.compat.v1.train.StopAtStepHook):
        return hook._last_step
    return None


def early_stopping_timer(hook):
    """The ``SecondOrStepTimer`` on which ``tf.estimator.experimental``'s early-stopping hook
    (``_StopOnPredicateHook``, stock's or tpushim's) checks its predicate, and whether it
    runs on a clock (``run_every_secs``); (None, None) for any other hook."""
    if type(hook).__name__ != "_StopOnPredicateHook":
        return None, None
    timer = hook._timer
    return timer, timer._every_secs is not None


def first_checkpoint_values(keras_model, custom_objects, path):
    """The trainable weights' values in the warm-start checkpoint at ``path`` (stock's first
    checkpoint, :func:`save_first_checkpoint`'s, either format), read into a clone built as
    stock builds it, in a graph and session of its own (the program's Keras session untouched).
    """

    clone = (
        modules.keras_lib._clone_and_build_model
        if modules.keras_lib is not None
        else _api_keras._clone
    )
    with tf.Graph().as_default():
        tf.compat.v1.train.create_global_step()
        model = clone(ModeKeys.TRAIN, keras_model, custom_objects)
        model._make_train_function()  # the optimizer's variables, as in the checkpoint
        with tf.compat.v1.Session() as session:
            # Saver reads a name-based checkpoint, and an object-based one by its object graph.
            tf.compat.v1.train.Saver().restore(session, path)
            return session.run(model.trainable_weights)
