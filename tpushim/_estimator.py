"""The one internal entry point: the arguments of a ``model_to_estimator`` call -> a TPUEstimator.

Validates everything first (nothing is written to ``model_dir`` before the last check passes),
then carries the user's RunConfig into a ``tpu_config.RunConfig``, builds the model_fn, writes the
warm-start checkpoint of the Keras weights exactly as stock does, and returns a
:class:`TPUShimEstimator`.
"""

import contextlib
import logging
import os
import weakref

import tensorflow as tf

from tpushim import _input_fn, _model_fn, _settings, _tfprivate
from tpushim._errors import ConversionError

logger = logging.getLogger("tpushim")

ModeKeys = tf.estimator.ModeKeys
tpu_config = _tfprivate.tpu_config

#: The one recorder, or None (always, except while the preflight runs a script): see
#: :func:`recording_to`. A plain slot, not a ContextVar: a script may train from a thread it starts.
_recorder = None


@contextlib.contextmanager
def recording_to(recorder):
    """While active, ``recorder`` is told about what tpushim's estimators do, and may cap it.

    ``recorder.converted(estimator, keras_model, custom_objects, settings)`` after each conversion;
    ``recorder.calling(event, estimator, input_fn, steps, max_steps)`` at the start of each
    ``train``/``evaluate``/``predict`` (``event``), returning the ``(steps, max_steps)`` to run.
    With none active, nothing is called. A nested recorder replaces the outer one until it exits.
    """
    global _recorder  # pylint: disable=global-statement
    outer, _recorder = _recorder, recorder
    try:
        yield recorder
    finally:
        _recorder = outer


DEFAULT_ITERATIONS_PER_LOOP = _settings.DEFAULT_ITERATIONS_PER_LOOP

# RunConfig settings carried one-to-one into tpu_config.RunConfig.
_CARRIED = ("model_dir", "tf_random_seed", "save_summary_steps", "save_checkpoints_steps",
            "save_checkpoints_secs", "session_config", "keep_checkpoint_max",
            "keep_checkpoint_every_n_hours", "log_step_count_steps", "device_fn", "protocol",
            "experimental_max_worker_delay_secs", "session_creation_timeout_secs",
            "checkpoint_save_graph_def")
# Settings that mean nothing under TPUEstimator: carried where RunConfig allows, with a warning.
_IGNORED_ON_TPU = ("train_distribute", "eval_distribute", "experimental_distribute")


def _validate_model(keras_model, custom_objects):
    """Structure checks that need no writing; raise before anything touches model_dir.

    Exactly stock's: a subclassed model must rebuild from ``get_config``/``from_config`` (Keras
    2.13+ derives a config from basic ``__init__`` arguments), as the model_fn clones it so.
    """
    if keras_model is None:
        return
    _tfprivate.assert_valid_model(keras_model, custom_objects)


def _check_compiled(keras_model, custom_objects=None):
    del custom_objects
    if not getattr(keras_model, "optimizer", None):
        raise ValueError("The given keras model has not been compiled yet. Please compile the model "
                         "with `model.compile()` before calling `model_to_estimator()`.")


def _one_legacy_optimizer(optimizer):
    if isinstance(optimizer, tf.keras.optimizers.experimental.Optimizer):
        try:
            legacy = tf.keras.__internal__.optimizers.convert_to_legacy_optimizer(optimizer)
        except Exception as e:  # pylint: disable=broad-except
            legacy, why = None, f"{type(e).__name__}: {e}"
        else:
            why = f"conversion gave {legacy!r}"
        if not isinstance(legacy, tf.keras.optimizers.legacy.Optimizer):
            raise ConversionError(
                f"optimizer {type(optimizer).__name__} has no tf.keras.optimizers.legacy equivalent "
                f"({why}); estimators, and so TPUEstimator, need one to average gradients across "
                f"TPU shards. Compile with a built-in Keras optimizer (e.g. "
                f"tf.keras.optimizers.legacy.Adam) or a tf.compat.v1.train optimizer.")
        optimizer = legacy
    _model_fn.optimizer_kind(optimizer)
    return optimizer


def _legacy_optimizer(keras_model, custom_objects=None):
    """The optimizer the model_fn will clone; validated, but not yet set on the user's model.

    As stock: a new-style Keras optimizer is converted to its legacy twin (estimators need one).
    A list (WideDeepModel: one optimizer per sub-model) is checked and converted item by item.
    """
    del custom_objects
    optimizer = keras_model.optimizer
    if isinstance(optimizer, (list, tuple)):
        converted = [_one_legacy_optimizer(o) for o in optimizer]
        if all(c is o for c, o in zip(converted, optimizer)):
            return optimizer
        return type(optimizer)(converted)
    return _one_legacy_optimizer(optimizer)


def _check_metrics(keras_model, custom_objects):
    """Every compiled metric must rebuild from its config: metric_fn recreates it on the host."""
    metrics = [m for m in tf.nest.flatten(_tfprivate.compiled_user_metrics(keras_model))
               if isinstance(m, tf.keras.metrics.Metric)]
    for metric in metrics:
        try:
            with tf.keras.utils.custom_object_scope(custom_objects or {}):
                metric.__class__.from_config(metric.get_config())
        except Exception as e:  # pylint: disable=broad-except
            raise ConversionError(
                f"tpushim cannot rebuild metric {metric.name!r} ({type(metric).__name__}) from its "
                f"config ({type(e).__name__}: {e}); a TPU computes metrics in a metric_fn that "
                f"recreates each metric. Implement get_config() on it, pass its class in "
                f"custom_objects, or compile the model without it.") from e


#: What the conversion checks before anything is written, in order: (kind, check(model, custom_objects)).
#: ``build`` runs them; the preflight reports the first that fails as ``unconvertible-<kind>``.
VALIDATION_STEPS = (("model", _validate_model), ("model", _check_compiled),
                    ("optimizer", _legacy_optimizer), ("metric", _check_metrics))


def validate(keras_model, custom_objects):
    """Runs :data:`VALIDATION_STEPS`; returns the optimizer the model_fn will clone."""
    results = {kind: check(keras_model, custom_objects) for kind, check in VALIDATION_STEPS}
    return results["optimizer"]


def _tf_config_cluster():
    import json  # pylint: disable=import-outside-toplevel
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
    _tfprivate.set_cluster_spec(config, tf.train.ClusterSpec({}))
    return config


def to_tpu_run_config(config, settings, cluster):
    """The user's RunConfig as a tpu_config.RunConfig; nothing they set is dropped silently."""
    return _tpu_as_remote_master(_to_tpu_run_config(config, settings, cluster))


def _to_tpu_run_config(config, settings, cluster):
    if isinstance(config, tpu_config.RunConfig):
        if cluster is not None and config.cluster is None:
            # RunConfig.replace() cannot set a cluster: rebuild with every carried setting.
            config = tpu_config.RunConfig(tpu_config=config.tpu_config, cluster=cluster,
                                          **{k: getattr(config, k) for k in _CARRIED})
        if settings.iterations_per_loop:
            config = config.replace(tpu_config=config.tpu_config._replace(
                iterations_per_loop=settings.iterations_per_loop))
        return config
    kwargs = {k: getattr(config, k) for k in _CARRIED}
    for key in _IGNORED_ON_TPU:
        if getattr(config, key, None) is not None:
            logger.warning("RunConfig.%s is ignored by TPUEstimator (a TPU replicates the "
                           "model itself); remove it or run with TPUSHIM_MODE=off.", key)
    iterations = settings.iterations_per_loop or DEFAULT_ITERATIONS_PER_LOOP
    if not settings.iterations_per_loop and config.save_checkpoints_steps:
        iterations = min(iterations, config.save_checkpoints_steps)
    tpu = tpu_config.TPUConfig(
        iterations_per_loop=iterations,
        per_host_input_for_training=tpu_config.InputPipelineConfig.PER_HOST_V2)
    return tpu_config.RunConfig(tpu_config=tpu, cluster=cluster, **kwargs)


def _expected_variables(keras_model):
    """The model's own weights as {checkpoint key: shape}, both ways a checkpoint may name them:
    (name-based keys, object-based keys). Computed in memory: nothing is written."""
    by_name = {w.name.split(":")[0]: w.shape.as_list() for w in keras_model.weights}
    return by_name, _tfprivate.object_checkpoint_keys(keras_model)


def check_model_dir(keras_model, model_dir, save_object_ckpt):
    """A model_dir already holding a checkpoint of different variables is an error, not an overwrite.

    Read-only. Accepts any checkpoint stock would warm-start from or continue: name-based or
    object-based keys, in model_dir or model_dir/keras. Refuses only when a matching key has a
    different shape, or when none of this model's variables is in it under either naming.
    """
    del save_object_ckpt  # either format may be there, whichever this call will save
    if _tfprivate.is_subclassed(keras_model):
        # Its variables are named when the model_fn builds it (an unbuilt model has none yet) and
        # stock writes no Keras checkpoint for it: nothing to compare before training.
        return
    expected_formats = None
    for folder in (model_dir, os.path.join(model_dir, "keras")):
        latest = tf.train.latest_checkpoint(folder)
        if not latest:
            continue
        found = dict(tf.train.list_variables(latest))
        if expected_formats is None:
            expected_formats = _expected_variables(keras_model)
        details, matched = [], False
        for expected in expected_formats:
            present = [k for k in expected if k in found]
            matched = matched or bool(present)
            details += [f"'{k}' has shape {list(found[k])} there but {expected[k]} in this model"
                        for k in present if list(found[k]) != list(expected[k])]
        if not matched:
            first = next(iter(expected_formats[0]), None)
            details.append(f"none of this model's variables are in it (e.g. '{first}')")
        if details:
            raise ConversionError(
                f"model_dir {model_dir} already holds a checkpoint of different variables ({latest}): "
                f"{'; '.join(details[:3])}. tpushim wrote nothing. Use a new model_dir for this model, "
                f"or delete that one to start over.")


class TPUShimEstimator(_tfprivate.tpu_estimator.TPUEstimator):
    """A TPUEstimator that accepts legacy input_fns and infers the batch size from them.

    Behaves as ``tf.compat.v1.estimator.tpu.TPUEstimator``; in addition ``input_fn`` may take no
    ``params``, batches need not be static (they are re-batched), ``evaluate()`` and ``predict()``
    see every example exactly once (padding is weighted out and dropped), and the global batch size
    is taken from the input when tpushim was not given one.
    """

    def __init__(self, *args, tpushim_batch_size=None, tpushim_tpu_source=None, **kwargs):
        self._tpushim_batch = {}
        self._tpushim_inspected = weakref.WeakKeyDictionary()  # input_fn -> {(mode, count): facts}
        self._tpushim_fixed_batch = tpushim_batch_size
        size = tpushim_batch_size or 1  # placeholder until the input says
        super().__init__(*args, train_batch_size=size, eval_batch_size=size,
                         predict_batch_size=size, **kwargs)
        self._tpushim_use_tpu = kwargs.get("use_tpu", True)
        if not self._tpushim_use_tpu:
            _tfprivate.log_every_step_count_steps_on_cpu(self, kwargs.get("config"))
        self._tpushim_tpu_source = tpushim_tpu_source
        self._tpushim_model_fn = kwargs.get("model_fn")  # tpushim's own, before TPUEstimator wraps it

    def _assert_members_are_not_overridden(self):
        # Estimator forbids subclasses to override train/evaluate/predict and exempts TPUEstimator
        # by class name. tpushim extends exactly those entry points (input adaptation, batch
        # inference, padding removal) and calls TPUEstimator's own for the work.
        pass

    # -- batch size ---------------------------------------------------------------------------
    def _tpushim_set_batch(self, input_fn, mode, count=False, count_unknown=True):
        """Fixes this mode's global batch size (given, or read from the input) before TPUEstimator
        builds anything; returns the input's :class:`_input_fn.InputFacts` when it was inspected
        (with ``count``: counted, see :func:`_input_fn.inspect_input`), else None."""
        if self._tpushim_use_tpu:
            from tpushim import _detect  # pylint: disable=import-outside-toplevel
            _detect.check_reachable(self._config.master, self._tpushim_tpu_source)
        size, facts = self._tpushim_fixed_batch, None
        if size is None or mode == ModeKeys.TRAIN or count:
            facts = self._tpushim_inspect(input_fn, mode, count, count_unknown)
            if size is None:
                size = facts.batch_size
                logger.info("global %s batch size %d, taken from the input_fn", mode, size)
            if mode == ModeKeys.TRAIN and facts.finite and facts.declared != size:
                logger.info("the training input is finite and batched by %s, not %d; a TPU "
                            "needs full batches, so a last batch of fewer than %d rows is dropped. "
                            "Repeat the dataset (dataset.repeat()) to train on every example.",
                            facts.declared or "a size its graph does not declare", size, size)
        self._tpushim_batch[mode] = size
        self._ctx = _tfprivate.get_tpu_context(
            self._config, self._tpushim_batch.get(ModeKeys.TRAIN, size),
            self._tpushim_batch.get(ModeKeys.EVAL, size), self._tpushim_batch.get(ModeKeys.PREDICT, size),
            self._tpushim_use_tpu, self._ctx._eval_on_tpu)  # pylint: disable=protected-access
        shards = self._config.tpu_config.num_shards
        if self._tpushim_use_tpu and shards and size % shards:
            raise ConversionError(_indivisible(size, shards))
        return facts

    def _tpushim_inspect(self, input_fn, mode, count, count_unknown=True):
        """The input's facts, read once per (input_fn, mode) for this estimator."""
        key = (mode, count, count_unknown)
        try:
            cached = self._tpushim_inspected.setdefault(input_fn, {})
        except TypeError:  # not weak-referenceable (e.g. a bound method of a __slots__ class)
            cached = {}
        if key not in cached:
            cached[key] = _input_fn.inspect_input(input_fn, mode, self.config, count, count_unknown)
        return cached[key]

    def _call_input_fn(self, input_fn, mode, input_context=None):
        adapted = _input_fn.adapt(input_fn, global_batch=self._tpushim_batch.get(mode))
        return super()._call_input_fn(adapted, mode, input_context)

    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        if _recorder is not None:
            steps, max_steps = _recorder.calling("train", self, input_fn, steps, max_steps)
        self._tpushim_set_batch(input_fn, ModeKeys.TRAIN)
        return super().train(input_fn, hooks=hooks, steps=steps, max_steps=max_steps,
                             saving_listeners=saving_listeners)

    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
        if _recorder is not None:
            steps, _ = _recorder.calling("evaluate", self, input_fn, steps, None)
        # A TPU runs exactly `steps` evaluation steps and cannot stop at the end of the input:
        # for a finite input, as many padded batches as it holds (stock stops there too, or at
        # `steps` if fewer; EvalSpec's default is 100), else steps past the end would be padding
        # only and count in the mean eval loss.
        # With `steps` given, an input of unknown cardinality is not counted: it may never end.
        facts = self._tpushim_set_batch(input_fn, ModeKeys.EVAL, count=self._tpushim_use_tpu,
                                        count_unknown=steps is None)
        if self._tpushim_use_tpu:
            if facts.examples is None and steps is None:
                raise ConversionError("evaluate() on a TPU needs `steps` when the input repeats "
                                      "forever; pass steps=..., or give evaluate() a finite dataset.")
            if facts.examples is not None:
                size = self._tpushim_batch[ModeKeys.EVAL]
                # Batched by the eval batch size, each of the input's batches is one step (a
                # short one padded); re-batched, the examples fill ceil(examples / size) steps.
                held = max(1, facts.batches if facts.declared == size else -(-facts.examples // size))
                if steps is not None and steps > held:
                    logger.info("evaluate(steps=%d): the input holds %d batches; a TPU cannot stop "
                                "at its end, so %d steps are run, as many as stock runs", steps, held, held)
                steps = held if steps is None else min(steps, held)
                logger.info("evaluating %d batches%s", steps,
                            ": every example once" if steps == held else "")
        return super().evaluate(input_fn, steps=steps, hooks=hooks,
                                checkpoint_path=checkpoint_path, name=name)

    def predict(self, input_fn, predict_keys=None, hooks=None, checkpoint_path=None,
                yield_single_examples=True):
        if _recorder is not None:
            _recorder.calling("predict", self, input_fn, None, None)
        self._tpushim_set_batch(input_fn, ModeKeys.PREDICT)
        if predict_keys is not None:
            predict_keys = list(predict_keys) + [_input_fn.PADDING_KEY]
        for out in super().predict(input_fn, predict_keys=predict_keys, hooks=hooks,
                                   checkpoint_path=checkpoint_path,
                                   yield_single_examples=yield_single_examples):
            weight = out.pop(_input_fn.PADDING_KEY, None)
            if weight is None:
                yield out
            elif yield_single_examples:
                if weight > 0:
                    yield out
            else:
                keep = weight > 0
                yield {k: v[keep] for k, v in out.items()}


def tpu_twin(estimator, cluster, model_dir):
    """The TPU estimator a conversion would have returned with ``cluster`` configured, for an
    estimator tpushim built (in either mode): same model_fn, settings and batch size, ``model_dir``
    instead of the user's. The preflight builds its TPU graphs with it."""
    config = estimator.config
    carried = {k: getattr(config, k) for k in _CARRIED if k != "model_dir"}
    run_config = _tpu_as_remote_master(tpu_config.RunConfig(
        tpu_config=config.tpu_config, cluster=cluster, model_dir=model_dir, **carried))
    return TPUShimEstimator(
        model_fn=estimator._tpushim_model_fn, config=run_config, use_tpu=True,  # pylint: disable=protected-access
        export_to_tpu=False, eval_on_tpu=True, params={},
        tpushim_batch_size=estimator._tpushim_fixed_batch,  # pylint: disable=protected-access
        tpushim_tpu_source="the preflight's faked TPU")


def batch_choices(size, shards):
    """The multiples of ``shards`` nearest to ``size``, e.g. '96 or 104'."""
    lower = (size // shards) * shards
    return " or ".join(str(c) for c in (lower, lower + shards) if c > 0)


def _indivisible(size, shards):
    return (f"global batch size {size} does not divide among {shards} TPU shards; use a multiple "
            f"of {shards} ({batch_choices(size, shards)}) via tpushim.patch(batch_size=...) or "
            f"TPUSHIM_BATCH_SIZE, or batch the input by such a size.")


def build(call, settings, spec):
    """Builds the TPUShimEstimator for one ``model_to_estimator`` call.

    Args:
      call: the call's arguments by name (``keras_lib.model_to_estimator``'s signature).
      settings: the resolved :class:`tpushim._settings.Settings`.
      spec: the :class:`tpushim._detect.TPUSpec` to run on, or None for ``use_tpu=False``.
    """
    from tpushim import _detect  # pylint: disable=import-outside-toplevel
    keras_model, keras_model_path = call["keras_model"], call["keras_model_path"]
    custom_objects = call["custom_objects"]
    if not (keras_model or keras_model_path):
        raise ValueError("Either `keras_model` or `keras_model_path` needs to be provided.")
    if keras_model and keras_model_path:
        raise ValueError("Please specity either `keras_model` or `keras_model_path`, but not both.")
    _validate_model(keras_model, custom_objects)
    cluster = _detect.cluster_resolver(spec) if spec is not None else None
    if keras_model is None:
        if keras_model_path.startswith("gs://") or "storage.googleapis.com" in keras_model_path:
            raise ConversionError("tpushim loads keras_model_path from local or mounted paths; copy "
                                  f"{keras_model_path} locally first (gsutil cp) and pass that path.")
        logger.info("loading model from %s", keras_model_path)
        keras_model = tf.keras.models.load_model(keras_model_path, custom_objects=custom_objects)
    checkpoint_format = call["checkpoint_format"]
    if checkpoint_format in (None, "checkpoint"):
        if _tfprivate.is_subclassed(keras_model):
            raise ValueError("Object-based checkpoints are currently not supported with "
                             "subclassed models."  # stock's text, then how to get past it
                             " Pass checkpoint_format='saver' to model_to_estimator.")
        save_object_ckpt = True
    elif checkpoint_format == "saver":
        save_object_ckpt = False
    else:
        raise ValueError('Checkpoint format must be one of "checkpoint" or "saver". Got {}'.format(
            checkpoint_format))
    optimizer = validate(keras_model, custom_objects)
    config = _tfprivate.maybe_overwrite_model_dir_and_session_config(call["config"], call["model_dir"])
    check_model_dir(keras_model, config.model_dir, save_object_ckpt)
    tpu_run_config = to_tpu_run_config(config, settings, cluster)
    num_shards = tpu_run_config.tpu_config.num_shards
    if spec is not None and settings.batch_size and num_shards and settings.batch_size % num_shards:
        raise ConversionError(_indivisible(settings.batch_size, num_shards))
    if optimizer is not keras_model.optimizer:
        logger.warning("converting optimizer %s to tf.keras.optimizers.legacy, as the stock "
                       "model_to_estimator does.", type(keras_model.optimizer).__name__)
        keras_model.optimizer = optimizer

    model_fn = _model_fn.make_model_fn(keras_model, custom_objects, save_object_ckpt,
                                       call["metric_names_map"], call["export_outputs"])
    if not _tfprivate.any_weight_initialized(keras_model):
        tf.compat.v1.keras.backend.set_session(tf.compat.v1.Session(config=config.session_config))
    warm_start_path = None
    if keras_model._is_graph_network and config.is_chief:  # pylint: disable=protected-access
        warm_start_path = _tfprivate.save_first_checkpoint(keras_model, custom_objects, config,
                                                           save_object_ckpt)
    elif keras_model.built:
        # As stock: a subclassed (or unbuilt Sequential) model's clone starts freshly initialised.
        logger.warning("%s is a subclassed Keras model that already has weights; as the stock "
                       "model_to_estimator, the estimator starts from a freshly initialised copy "
                       "(its weights are not carried over). The model you passed is unchanged.",
                       type(keras_model).__name__)
    use_tpu = spec is not None
    describe = (f"TPUEstimator(use_tpu={use_tpu}"
                + (f", tpu={spec.describe()}" if use_tpu else "")
                + f", global batch {settings.batch_size or 'from input'}"
                + f", iterations_per_loop {tpu_run_config.tpu_config.iterations_per_loop})"
                + (f" [TPU from {spec.source}]" if use_tpu else
                   f" [mode cpu from {settings.sources.get('mode')}: the TPU code path on CPU]"))
    estimator = TPUShimEstimator(
        model_fn=model_fn, config=tpu_run_config, use_tpu=use_tpu, warm_start_from=warm_start_path,
        export_to_tpu=False, tpushim_batch_size=settings.batch_size,
        # Quiet cpu mode: without these TPUEstimator logs 'eval_on_tpu ignored because use_tpu
        # is False.' and Estimator 'params are not passed' about tpushim's own construction.
        eval_on_tpu=use_tpu, params={},
        tpushim_tpu_source=spec.source if use_tpu else None)
    logger.info("model_to_estimator -> %s", describe)
    if _recorder is not None:
        _recorder.converted(estimator, keras_model, custom_objects, settings)
    return estimator
