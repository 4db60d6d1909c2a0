"""The one internal entry point: the arguments of a ``model_to_estimator`` call -> a TPUEstimator.

Validates everything first (:mod:`tpushim._validation`; nothing is written to ``model_dir``, and
no network is asked, before those checks pass), resolves the TPU, carries the user's RunConfig
into a ``tpu_config.RunConfig`` (:mod:`tpushim._run_config`), builds the model_fn, writes the
warm-start checkpoint of the Keras weights exactly as stock does, and returns a
:class:`TPUShimEstimator`.

A little over ~300 lines because it is one concern: ``build`` and the estimator it returns, whose
train/evaluate/predict each fix the batch before handing over to TPUEstimator.
"""

import contextlib
import logging
import threading
import weakref

import tensorflow as tf

from tpushim import _detect, _input_fn, _model_fn, _padding, _run_config, _tfprivate, _validation
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
    ``recorder.derived(estimator, source)`` when one is made from another (:func:`rewrapped`);
    ``recorder.calling(event, estimator, input_fn, steps, max_steps)`` at the start of each
    ``train``/``evaluate``/``predict`` (``event``), returning the ``(steps, max_steps)`` to run.
    With none active, nothing is called. A nested recorder replaces the outer one until it exits.
    """
    global _recorder
    outer, _recorder = _recorder, recorder
    try:
        yield recorder
    finally:
        _recorder = outer


class TPUShimEstimator(_tfprivate.TPUEstimatorWithCallBatchSizes):
    """A TPUEstimator that accepts legacy input_fns and infers the batch size from them.

    Behaves as ``tf.compat.v1.estimator.tpu.TPUEstimator``; in addition ``input_fn`` may take no
    ``params``, batches need not be static (they are re-batched), ``evaluate()`` and ``predict()``
    see every example exactly once (padding is weighted out and dropped), and the global batch size
    is taken from the input when tpushim was not given one.

    Before TPUEstimator builds anything, each call reaches the TPU (once per estimator), reads its
    input (:meth:`_input_facts`) and fixes its mode's global batch size for the calling thread
    (:meth:`_fix_global_batch`); threads sharing an estimator each build with their own.
    """

    def __init__(self, *args, tpushim_batch_size=None, tpushim_tpu_source=None, **kwargs):
        size = tpushim_batch_size or 1  # a placeholder: each call fixes its own (_fix_global_batch)
        super().__init__(
            *args, train_batch_size=size, eval_batch_size=size, predict_batch_size=size, **kwargs
        )
        self._tpushim_fixed_batch = tpushim_batch_size
        self._tpushim_use_tpu = kwargs.get("use_tpu", True)
        if not self._tpushim_use_tpu:
            _tfprivate.log_every_step_count_steps_on_cpu(self, kwargs.get("config"))
        self._tpushim_tpu_source = tpushim_tpu_source
        self._tpushim_model_fn = kwargs.get(
            "model_fn"
        )  # tpushim's own, before TPUEstimator wraps it
        self._tpushim_reached = False  # the TPU accepted a connection (_reach_tpu_once)
        self._tpushim_reach_lock = threading.Lock()
        self._tpushim_inspected = weakref.WeakKeyDictionary()  # input_fn -> {key: InputFacts}
        self._tpushim_inspected_lock = threading.Lock()

    def _assert_members_are_not_overridden(self):
        # Estimator forbids subclasses to override train/evaluate/predict and exempts TPUEstimator
        # by class name. tpushim extends exactly those entry points (input adaptation, batch
        # inference, padding removal) and calls TPUEstimator's own for the work.
        pass

    # -- before TPUEstimator builds anything ---------------------------------------------------
    def _reach_tpu_once(self):
        """A configured ``grpc://`` TPU that does not accept a connection fails the first call
        clearly (see :func:`_detect.check_reachable`); once it has, it is not probed again. The
        lock makes threads that call at once probe once."""
        if not self._tpushim_use_tpu:
            return
        with self._tpushim_reach_lock:
            if not self._tpushim_reached:
                _detect.check_reachable(self.config.master, self._tpushim_tpu_source)
                self._tpushim_reached = True

    def _input_facts(self, input_fn, mode, count=False, count_unknown=True):
        """The input's :class:`_input_fn.InputFacts`, read once per (input_fn, mode) for this
        estimator (see :func:`_input_fn.inspect_input` for ``count``)."""
        key = (mode, count, count_unknown)
        with self._tpushim_inspected_lock:
            try:
                cached = self._tpushim_inspected.setdefault(input_fn, {})
            except TypeError:  # not weak-referenceable (e.g. a bound method of a __slots__ class)
                cached = {}
            facts = cached.get(key)
        if facts is None:  # read outside the lock: it may take a while; a race reads it twice
            facts = _input_fn.inspect_input(input_fn, mode, self.config, count, count_unknown)
            with self._tpushim_inspected_lock:
                cached[key] = facts
        return facts

    def _global_batch(self, facts, mode):
        """This mode's global batch size: tpushim's setting, else the one the input gives."""
        if self._tpushim_fixed_batch is not None:
            return self._tpushim_fixed_batch
        logger.info("global %s batch size %d, taken from the input_fn", mode, facts.batch_size)
        return facts.batch_size

    def _fix_global_batch(self, mode, size):
        """Fixes ``mode``'s global batch size for this thread's call, once it divides among the
        TPU's shards."""
        shards = self.config.tpu_config.num_shards
        if self._tpushim_use_tpu and shards and size % shards:
            raise ConversionError(indivisible_batch_message(size, shards))
        self._fix_call_batch_size(mode, size)

    def _call_input_fn(self, input_fn, mode, input_context=None):
        adapted = _input_fn.adapt(input_fn, global_batch=self._call_batch_size(mode))
        return super()._call_input_fn(adapted, mode, input_context)

    # -- the entry points ----------------------------------------------------------------------
    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        if _recorder is not None:
            steps, max_steps = _recorder.calling("train", self, input_fn, steps, max_steps)
        self._reach_tpu_once()
        facts = self._input_facts(input_fn, ModeKeys.TRAIN)
        size = self._global_batch(facts, ModeKeys.TRAIN)
        if facts.finite and facts.declared != size:
            logger.info(
                "the training input is finite and batched by %s, not %d; a TPU "
                "needs full batches, so a last batch of fewer than %d rows is dropped. "
                "Repeat the dataset (dataset.repeat()) to train on every example.",
                facts.declared or "a size its graph does not declare",
                size,
                size,
            )
        self._fix_global_batch(ModeKeys.TRAIN, size)
        return super().train(
            input_fn,
            hooks=hooks,
            steps=steps,
            max_steps=max_steps,
            saving_listeners=saving_listeners,
        )

    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
        if _recorder is not None:
            steps, _ = _recorder.calling("evaluate", self, input_fn, steps, None)
        self._reach_tpu_once()
        facts = None
        if self._tpushim_use_tpu or self._tpushim_fixed_batch is None:
            # A TPU needs the input counted (tpu_eval_steps); with `steps` given, an input of
            # unknown cardinality is not: it may never end.
            facts = self._input_facts(
                input_fn, ModeKeys.EVAL, count=self._tpushim_use_tpu, count_unknown=steps is None
            )
        size = self._global_batch(facts, ModeKeys.EVAL)
        self._fix_global_batch(ModeKeys.EVAL, size)
        if self._tpushim_use_tpu:
            steps = tpu_eval_steps(facts, size, steps)
        return super().evaluate(
            input_fn, steps=steps, hooks=hooks, checkpoint_path=checkpoint_path, name=name
        )

    def predict(
        self,
        input_fn,
        predict_keys=None,
        hooks=None,
        checkpoint_path=None,
        yield_single_examples=True,
    ):
        if _recorder is not None:
            _recorder.calling("predict", self, input_fn, None, None)
        self._reach_tpu_once()
        facts = None
        if self._tpushim_fixed_batch is None:
            facts = self._input_facts(input_fn, ModeKeys.PREDICT)
        self._fix_global_batch(ModeKeys.PREDICT, self._global_batch(facts, ModeKeys.PREDICT))
        outputs = super().predict(
            input_fn,
            predict_keys=_padding.predict_keys_with_padding(predict_keys),
            hooks=hooks,
            checkpoint_path=checkpoint_path,
            yield_single_examples=yield_single_examples,
        )
        yield from _padding.drop_padding(outputs, yield_single_examples)


def tpu_eval_steps(facts, global_batch, steps):
    """The evaluation steps a TPU runs over an input of these :class:`_input_fn.InputFacts`.

    A TPU runs exactly ``steps`` evaluation steps and cannot stop at the end of the input: for a
    finite input, as many padded batches as it holds (stock stops there too, or at ``steps`` if
    fewer; EvalSpec's default is 100), else steps past the end would be padding only and count in
    the mean eval loss.
    """
    if facts.examples is None:
        if steps is None:
            raise ConversionError(
                "evaluate() on a TPU needs `steps` when the input repeats "
                "forever; pass steps=..., or give evaluate() a finite dataset."
            )
        return steps
    # Batched by the eval batch size, each of the input's batches is one step (a short one
    # padded); re-batched, the examples fill ceil(examples / global_batch) steps.
    held = facts.batches if facts.declared == global_batch else -(-facts.examples // global_batch)
    held = max(1, held)
    if steps is not None and steps > held:
        logger.info(
            "evaluate(steps=%d): the input holds %d batches; a TPU cannot stop "
            "at its end, so %d steps are run, as many as stock runs",
            steps,
            held,
            held,
        )
    steps = held if steps is None else min(steps, held)
    logger.info("evaluating %d batches%s", steps, ": every example once" if steps == held else "")
    return steps


def tpu_twin(estimator, cluster, model_dir):
    """The TPU estimator a conversion would have returned with ``cluster`` configured, for an
    estimator tpushim built (in either mode): same model_fn, settings and batch size, ``model_dir``
    instead of the user's. The preflight builds its TPU graphs with it."""
    return TPUShimEstimator(
        model_fn=estimator._tpushim_model_fn,
        use_tpu=True,
        config=_run_config.for_cluster(estimator.config, cluster, model_dir),
        export_to_tpu=False,
        eval_on_tpu=True,
        params={},
        tpushim_batch_size=estimator._tpushim_fixed_batch,
        tpushim_tpu_source="the preflight's faked TPU",
    )


def rewrapped(estimator, wrap):
    """A TPUShimEstimator like ``estimator`` -- config, TPU, settings, batch size, warm start --
    around ``wrap(its model_fn)`` (``tf.estimator.add_metrics``: :mod:`tpushim._extenders`). The
    recorder, if any, counts its calls as ``estimator``'s conversion's."""
    twin = TPUShimEstimator(
        model_fn=wrap(estimator._tpushim_model_fn),
        config=estimator.config,
        use_tpu=estimator._tpushim_use_tpu,
        warm_start_from=_tfprivate.warm_start_settings(estimator),
        export_to_tpu=False,
        eval_on_tpu=estimator._tpushim_use_tpu,
        params={},
        tpushim_batch_size=estimator._tpushim_fixed_batch,
        tpushim_tpu_source=estimator._tpushim_tpu_source,
    )
    if _recorder is not None:
        _recorder.derived(twin, estimator)
    return twin


def batch_choices(size, shards):
    """The multiples of ``shards`` nearest to ``size``, e.g. '96 or 104'."""
    lower = (size // shards) * shards
    return " or ".join(str(c) for c in (lower, lower + shards) if c > 0)


def indivisible_batch(size, shards):
    """The one text for a global batch size that does not divide among a TPU's shards (one per
    core): the conversion raises it, the preflight reports it.

    Args:
      size: the global batch size.
      shards: the TPU's shards (cores).
    Returns:
      ``(problem, fix)``: what is wrong; the nearest sizes that divide and where to set one.
    """
    return (
        f"global batch size {size} does not divide among {shards} TPU cores",
        f"use a multiple of {shards} ({batch_choices(size, shards)}): set "
        f"tpushim.patch(batch_size=...) or TPUSHIM_BATCH_SIZE, or batch the input by it",
    )


def indivisible_batch_message(size, shards):
    """:func:`indivisible_batch` as one sentence, for an exception."""
    return "{}; {}.".format(*indivisible_batch(size, shards))


def _load_model(arguments):
    """The Keras model the call names: given, or loaded from a local path."""
    keras_model, keras_model_path = arguments["keras_model"], arguments["keras_model_path"]
    if not (keras_model or keras_model_path):
        raise ValueError("Either `keras_model` or `keras_model_path` needs to be provided.")
    if keras_model and keras_model_path:
        raise ValueError("Please specity either `keras_model` or `keras_model_path`, but not both.")
    if keras_model is not None:
        return keras_model
    if keras_model_path.startswith("gs://") or "storage.googleapis.com" in keras_model_path:
        raise ConversionError(
            "tpushim loads keras_model_path from local or mounted paths; copy "
            f"{keras_model_path} locally first (gsutil cp) and pass that path."
        )
    logger.info("loading model from %s", keras_model_path)
    return tf.keras.models.load_model(keras_model_path, custom_objects=arguments["custom_objects"])


def _check_batch_divides(settings, config, tpu):
    """A configured global batch size must divide among shards the user's TPUConfig names."""
    if tpu is None or not settings.batch_size or not isinstance(config, tpu_config.RunConfig):
        return
    shards = config.tpu_config.num_shards
    if shards and settings.batch_size % shards:
        raise ConversionError(indivisible_batch_message(settings.batch_size, shards))


def build(arguments, settings, tpu):
    """Builds the TPUShimEstimator for one ``model_to_estimator`` call.

    Every check that needs no network runs first; then the TPU is resolved (a bare TPU name is
    looked up through the metadata server); nothing is written before all of them pass.

    Args:
      arguments: the call's arguments by name (``keras_lib.model_to_estimator``'s signature).
      settings: the resolved :class:`tpushim._settings.Settings`.
      tpu: the :class:`tpushim._detect.TPUSpec` to run on, or None for ``use_tpu=False``.
    """
    keras_model = _load_model(arguments)
    custom_objects = arguments["custom_objects"]
    save_object_ckpt = _validation.saves_object_checkpoints(
        keras_model, arguments["checkpoint_format"]
    )
    optimizer = _validation.validate(keras_model, custom_objects)
    config, model_dir_checked = arguments["config"], False
    if arguments["model_dir"] or getattr(config, "model_dir", None):
        config = _tfprivate.maybe_overwrite_model_dir_and_session_config(
            config, arguments["model_dir"]
        )
        _validation.check_model_dir(keras_model, config.model_dir)
        model_dir_checked = True
    _check_batch_divides(settings, config, tpu)
    cluster = _detect.cluster_resolver(tpu) if tpu is not None else None
    # With no model_dir given, stock makes a temporary one: only now, once nothing can fail first.
    config = _tfprivate.maybe_overwrite_model_dir_and_session_config(config, None)
    if not model_dir_checked:  # a mocked tempfile may hand out a folder that holds a checkpoint
        _validation.check_model_dir(keras_model, config.model_dir)
    tpu_run_config = _run_config.to_tpu_run_config(config, settings, cluster)
    if optimizer is not keras_model.optimizer:
        logger.warning(
            "converting optimizer %s to tf.keras.optimizers.legacy, as the stock "
            "model_to_estimator does.",
            type(keras_model.optimizer).__name__,
        )
        keras_model.optimizer = optimizer

    model_fn = _model_fn.make_model_fn(
        keras_model,
        custom_objects,
        save_object_ckpt,
        arguments["metric_names_map"],
        arguments["export_outputs"],
    )
    if not _tfprivate.any_weight_initialized(keras_model):
        tf.compat.v1.keras.backend.set_session(tf.compat.v1.Session(config=config.session_config))
    warm_start_path = None
    if _tfprivate.is_graph_network(keras_model) and config.is_chief:
        warm_start_path = _tfprivate.save_first_checkpoint(
            keras_model, custom_objects, config, save_object_ckpt
        )
    elif keras_model.built:
        # As stock: a subclassed (or unbuilt Sequential) model's clone starts freshly initialised.
        logger.warning(
            "%s is a subclassed Keras model that already has weights; as the stock "
            "model_to_estimator, the estimator starts from a freshly initialised copy "
            "(its weights are not carried over). The model you passed is unchanged.",
            type(keras_model).__name__,
        )
    use_tpu = tpu is not None
    describe = (
        f"TPUEstimator(use_tpu={use_tpu}"
        + (f", tpu={tpu.describe()}" if use_tpu else "")
        + f", global batch {settings.batch_size or 'from input'}"
        + f", iterations_per_loop {tpu_run_config.tpu_config.iterations_per_loop})"
        + (
            f" [TPU from {tpu.source}]"
            if use_tpu
            else f" [mode cpu from {settings.sources.get('mode')}: the TPU code path on CPU]"
        )
    )
    estimator = TPUShimEstimator(
        model_fn=model_fn,
        config=tpu_run_config,
        use_tpu=use_tpu,
        warm_start_from=warm_start_path,
        export_to_tpu=False,
        tpushim_batch_size=settings.batch_size,
        # Quiet cpu mode: without these TPUEstimator logs 'eval_on_tpu ignored because use_tpu
        # is False.' and Estimator 'params are not passed' about tpushim's own construction.
        eval_on_tpu=use_tpu,
        params={},
        tpushim_tpu_source=tpu.source if use_tpu else None,
    )
    logger.info("model_to_estimator -> %s", describe)
    if _recorder is not None:
        _recorder.converted(estimator, keras_model, custom_objects, settings)
    return estimator
