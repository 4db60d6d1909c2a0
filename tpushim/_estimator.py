"""The TPUEstimator engine's estimator: :class:`TPUShimEstimator`, and :func:`built`, which
makes it for one ``model_to_estimator`` call.

The conversion (:mod:`tpushim._convert`) validates everything first (:mod:`tpushim._validation`;
nothing is written to ``model_dir``, and no network is asked, before those checks pass), resolves
the TPU and carries the user's RunConfig into a ``tpu_config.RunConfig``
(:mod:`tpushim._run_config`); :func:`built` then builds the model_fn, writes the warm-start
checkpoint of the Keras weights exactly as stock does, and makes the :class:`TPUShimEstimator`,
whose train/evaluate/predict take the user's input as it is.
"""

import contextlib
import dataclasses
import logging
import threading
import time

import tensorflow as tf

from tpushim import (
    _arrays,
    _batching,
    _detect,
    _input_fn,
    _input_wait,
    _model_fn,
    _observe,
    _padding,
    _plan,
    _pods,
    _run_clock,
    _shapes,
    _step_losses,
    _tfprivate,
)
from tpushim._batch_math import batch_choices, indivisible_batch  # noqa: F401  (their old home)
from tpushim._engines import base
from tpushim._errors import ConversionError

logger = logging.getLogger("tpushim")

ModeKeys = tf.estimator.ModeKeys
tpu_config = _tfprivate.modules.tpu_config
TPUEstimator = _tfprivate.modules.tpu_estimator.TPUEstimator

_EVENTS = {ModeKeys.TRAIN: "train", ModeKeys.EVAL: "evaluate", ModeKeys.PREDICT: "predict"}


class _PerThread(threading.local):
    """What one thread's train/evaluate/predict call fixes while TPUEstimator builds its graph.

    TPUEstimator keeps its global batch sizes in one TPU context (``_ctx``), made at
    construction, and changes two attributes during a call: ``_is_input_fn_invoked`` (set by its
    input_fn wrapper, cleared by its model_fn wrapper) and ``_rendezvous`` (the call's error
    collector). Shared, another thread's call would change them between this thread's steps, so
    each thread has its own.
    """

    def __init__(self):
        self.ctx = None  # this thread's TPU context, once it fixed a batch size
        self.config = None  # the tpu_config.RunConfig its context builds with, when not stock's
        self.sizes = {}  # mode -> the global batch size this thread fixed
        self.input_fn_invoked = None
        self.rendezvous = {}
        self.eval_steps = None  # the evaluate() steps asked for, then those a TPU runs


class TPUShimEstimator(TPUEstimator):
    """A TPUEstimator that takes legacy input_fns as they are.

    Behaves as ``tf.compat.v1.estimator.tpu.TPUEstimator``; in addition ``input_fn`` may take no
    ``params`` and return iterator or numpy_input_fn tensors, batches need not be static or full,
    ``evaluate()`` and ``predict()`` see every example exactly once (padding is weighted out and
    dropped), and the global batch size is read from the input when tpushim was not given one.

    The user's input_fn is called exactly as often as stock calls it: TPUEstimator asks for the
    input (:meth:`_call_input_fn`) once per call, before it builds the model; tpushim makes the
    first invocation there (on a TPU: host 0's), reads the batch size from the graph that call
    built and fixes it for the calling thread; TPUEstimator then builds with it and is handed that
    invocation's result instead of calling again.
    """

    def __init__(self, *args, tpushim_plan=None, **kwargs):
        if getattr(self, "_tpushim_made", False):
            # Built by Estimator(model_fn=<converted>.model_fn) (tpushim._engines.rewrap_call),
            # whose class this is a subclass of: Python calls __init__ again with its arguments.
            return
        self._tpushim_thread = _PerThread()
        config = kwargs.get("config", args[2] if len(args) > 2 else None)
        # TPUEstimator turns it into loops; tpushim logs the loss at stock's steps (_step_losses).
        self._tpushim_log_every = getattr(config, "log_step_count_steps", None)
        # What the conversion fixed, one value (:mod:`tpushim._plan`): an estimator made from this
        # one (add_metrics, a rebuilt Estimator: rewrapped) takes it whole.
        self._tpushim_plan = tpushim_plan or _plan.ConversionPlan()
        size = self._tpushim_plan.batch_size or 1  # a placeholder: each call fixes its own
        super().__init__(
            *args,
            train_batch_size=size,
            eval_batch_size=size,
            predict_batch_size=size,
            **kwargs,
        )
        # TPUEstimator validates its context's batch sizes before a call reaches the input; the
        # constructed one holds placeholders, and each call validates the one it fixes.
        _tfprivate.tpu.skip_batch_validation(self._tpushim_constructed_ctx)
        self._tpushim_model_fn = kwargs.get("model_fn")  # tpushim's, before TPUEstimator wraps it
        self._tpushim_use_tpu = kwargs.get("use_tpu", True)
        self._tpushim_eval_on_tpu = kwargs.get("eval_on_tpu", True)
        if not self._tpushim_use_tpu:
            _tfprivate.estimator.log_every_step_count_steps_on_cpu(self, kwargs.get("config"))
        self._tpushim_reached = False  # the TPU accepted a connection (_reach_tpu_once)
        self._tpushim_reach_lock = threading.Lock()
        self._tpushim_made = True

    def _assert_members_are_not_overridden(self):
        # Estimator forbids overriding train/evaluate/predict but exempts TPUEstimator by class
        # name; tpushim extends exactly those and calls TPUEstimator's own for the work.
        pass

    # -- TPUEstimator's per-call state, per thread ------------------------------------------------
    @property
    def _ctx(self):
        return self._tpushim_thread.ctx or self._tpushim_constructed_ctx

    @_ctx.setter
    def _ctx(self, ctx):  # TPUEstimator.__init__ sets it, once
        self._tpushim_constructed_ctx = ctx

    @property
    def _is_input_fn_invoked(self):
        return self._tpushim_thread.input_fn_invoked

    @_is_input_fn_invoked.setter
    def _is_input_fn_invoked(self, invoked):
        self._tpushim_thread.input_fn_invoked = invoked

    @property
    def _rendezvous(self):
        return self._tpushim_thread.rendezvous

    @_rendezvous.setter
    def _rendezvous(self, rendezvous):  # TPUEstimator.__init__ sets an empty dict
        self._tpushim_thread.rendezvous = rendezvous

    def _fix_call_batch_size(self, mode, size):
        """``mode``'s global batch size for this thread's calls, from now on."""
        sizes = dict(self._tpushim_thread.sizes, **{mode: size})
        self._tpushim_thread.ctx = _tfprivate.tpu.tpu_context_like(
            self._tpushim_constructed_ctx,
            sizes.get(ModeKeys.TRAIN, size),
            sizes.get(ModeKeys.EVAL, size),
            sizes.get(ModeKeys.PREDICT, size),
            self._tpushim_thread.config,
        )
        self._tpushim_thread.sizes = sizes

    def _use_call_config(self, mode):
        """Builds this thread's call of ``mode`` with the TPU config it needs: predict() on
        several hosts, which TPUEstimator refuses per host, has host 0 feed every core in order
        (``SLICED``, as TPUEstimator evaluates with it); any other call with the estimator's."""
        constructed = self._tpushim_constructed_ctx
        config = _tfprivate.tpu.tpu_context_config(constructed)
        if mode == ModeKeys.PREDICT:
            with constructed.with_mode(mode) as ctx:
                if ctx.num_hosts > 1 and not ctx.is_input_broadcast_with_iterators():
                    config = config.replace(
                        tpu_config=config.tpu_config._replace(
                            eval_training_input_configuration=tpu_config.InputPipelineConfig.SLICED
                        )
                    )
        thread = self._tpushim_thread
        if thread.ctx is None or config is not thread.config:
            thread.config = config
            self._fix_call_batch_size(
                mode, thread.sizes.get(mode, self._tpushim_plan.batch_size or 1)
            )

    # -- before TPUEstimator builds anything ---------------------------------------------------
    def _reach_tpu_once(self):
        """A configured ``grpc://`` TPU that does not accept a connection fails the first call
        clearly (see :func:`_detect.check_reachable`); once it has, it is not probed again. The
        lock makes threads that call at once probe once. The conversion asked the TPU for its
        devices (:func:`_detect.check_tpu_answers`); this cheap check catches a TPU that went
        away since, which TensorFlow would wait for for two hours."""
        if not self._tpushim_use_tpu:
            return
        with self._tpushim_reach_lock:
            if not self._tpushim_reached:
                _detect.check_reachable(self.config.master, self._tpushim_plan.tpu_source)
                self._tpushim_reached = True

    def _on_tpu(self, mode):
        return self._tpushim_use_tpu and (mode != ModeKeys.EVAL or self._tpushim_eval_on_tpu)

    def _first_invocation(self, mode):
        """``(device, TPUContext)`` of the input pipeline TPUEstimator builds first in ``mode``
        (host 0's), as TPUEstimator would make them."""
        with self._ctx.with_mode(mode) as ctx:
            device = ctx.tpu_host_placement_function(host_id=0)
            return device, _tfprivate.tpu.tpu_input_context(ctx, device)

    def _call_context(self, mode):
        """This call's :class:`tpushim._plan.RunContext`: the plan's numbers on the replicas and
        hosts TPUEstimator's context counts (on CPU: one replica, nothing padded)."""
        if not self._on_tpu(mode):
            return self._tpushim_plan.context(mode, on_tpu=False)
        with self._ctx.with_mode(mode) as ctx:
            return self._tpushim_plan.context(mode, ctx.num_replicas, ctx.num_hosts)

    def _tpu_batch(self, context, facts):
        """The global batch a call runs for stock's global batch (the plan's, else the input's):
        on a TPU the next multiple of its replicas (one per core), the rows beyond it padding
        weighted 0 (:func:`tpushim._batching.tpu_batches`), so that every step is one of
        stock's batches."""
        size, padded = (
            context.global_batch(facts.batch_size),
            context.padded_batch(facts.batch_size),
        )
        if padded != size:
            _observe.note("batch-padding", "%s; %s.", *indivisible_batch(size, context.replicas))
        return padded

    def _call_input_fn(self, input_fn, mode, input_context=None):
        """TPUEstimator's one request for the input of a call, made in the graph it builds.

        tpushim calls the user's input_fn here, once (on a TPU: the first of the invocations
        TPUEstimator makes, one per input pipeline), reads what it needs from the graph that call
        built (:func:`_input_fn.read_facts`: the batch size; on a TPU how many steps an evaluation
        runs), fixes the global batch size for this thread, and hands TPUEstimator an input_fn that
        adapts that call's result -- and makes the further invocations on a TPU.
        """
        on_tpu = self._on_tpu(mode)
        if on_tpu:
            self._use_call_config(mode)
        device, context = self._first_invocation(mode) if on_tpu else ("/device:CPU:0", None)
        graph = tf.compat.v1.get_default_graph()
        made_before = len(graph.get_operations())
        invocations = _input_fn.deployment(context)[1] if on_tpu else 1
        # A pod's hosts each build a copy of the pipeline: all of them with the same seeds.
        seeds = _pods.Seeds(graph) if invocations > 1 else None
        pinned = seeds.pinned if seeds is not None else contextlib.nullcontext
        # On a TPU, placed on host 0 once read: this process reads it with a session of its own.
        with tf.compat.v1.device(None if on_tpu else device), pinned():
            first = _input_fn.call(
                input_fn, mode, self._user_params(context), self.config, input_context
            )
        thread = self._tpushim_thread
        count = on_tpu and mode == ModeKeys.EVAL
        facts = _input_fn.read_facts(
            first, count=count, count_unknown=thread.eval_steps is None, input_fn=input_fn
        )
        context = self._call_context(mode)
        size = context.global_batch(facts.batch_size)  # stock's: the plan's, else the input's
        tpu_batch = self._tpu_batch(context, facts)
        if mode == ModeKeys.TRAIN and facts.declared != size and _finite(first):
            with _input_fn.graph_session() as session:
                rows = _batching.rows_held(first, session)
            if rows is not None and rows < size:
                raise ConversionError(_batching.too_few_rows(rows, facts.declared, size))
            _observe.note(
                "drop",
                "the training input is finite and batched by %s, not %d; a TPU needs full "
                "batches, so a last batch of fewer than %d rows is dropped. Repeat the dataset "
                "(dataset.repeat()) to train on every example.",
                facts.declared or "a size its graph does not declare",
                size,
                size,
            )
        if count:
            thread.eval_steps = tpu_eval_steps(facts, context, thread.eval_steps)
        path = self._pod_path(first, mode, invocations) if invocations > 1 else None
        if path is not None:
            _pods.prepare(first, path, 0)  # the others are prepared as they are made
        if on_tpu:
            _tfprivate.graph.place_ops(graph.get_operations()[made_before:], device)
        self._fix_call_batch_size(mode, tpu_batch)
        _observe.input_called(_observe.InputCall(_observe.current_call(), mode, first, facts, size))
        pending = [first]

        def tpushim_input_fn(params):
            # TPUEstimator's params: batch_size per core on a TPU, and its context there.
            if pending:
                result = pending.pop()
            else:
                with pinned():
                    result = _input_fn.call(
                        input_fn,
                        mode,
                        self._user_params(params.get("context")),
                        self.config,
                        input_context,
                    )
                if path is not None:
                    _pods.prepare(result, path, _input_fn.deployment(params["context"])[0])
            # On the files path each host's pipeline reads only its own files: it keeps all.
            shard = (0, 1) if path is not None and path.name == "files" else None
            return _input_fn.adapt(
                result,
                mode,
                size,
                params,
                input_fn,
                shard,
                tpu_batch=tpu_batch,
                model_inputs=self._tpushim_plan.model_inputs,
            )

        return super()._call_input_fn(tpushim_input_fn, mode, input_context)

    def _pod_path(self, first, mode, invocations):
        """How a pod's hosts read this call's input (:mod:`tpushim._pods`), said in one line; None
        for input a TPU cannot be fed from (tensors: adapt says so)."""
        if not isinstance(first, tf.data.Dataset):
            return None
        setting = self._tpushim_plan.pod_input
        graph = _pods.analyse(first, _pods.needs_files(mode, setting))
        path = _pods.decide(graph, mode, setting, invocations)
        _observe.note(
            "pod",
            "%s() on %d TPU hosts: %s path: %s",
            _EVENTS[mode],
            invocations,
            path.name,
            path.why,
        )
        if "WARNING" in path.why:
            logger.warning("%s() on %d TPU hosts: %s", _EVENTS[mode], invocations, path.why)
        return path

    # -- in-memory arrays, fed where the input's iterator is initialised (see _arrays) -----------
    # -- and, while observed, the batch reads whose wait the run summary shows (_input_wait) -----
    def _get_features_and_labels_from_input_fn(self, input_fn, mode):
        features, labels, hooks = super()._get_features_and_labels_from_input_fn(input_fn, mode)
        if _observe.has_observers():
            _input_wait.mark(features, labels)
        return features, labels, _arrays.feeding_hooks(hooks)  # on CPU

    def _get_features_from_input_fn(self, input_fn, mode):
        features, hooks = super()._get_features_from_input_fn(input_fn, mode)
        if _observe.has_observers():
            _input_wait.mark(features)
        return features, _arrays.feeding_hooks(hooks)  # predict on CPU

    def _call_model_fn(self, features, labels, mode, config):
        # On a TPU TPUEstimator initialises every host's iterator from a hook the model_fn returns.
        spec = _arrays.feeding_spec(super()._call_model_fn(features, labels, mode, config))
        if mode == ModeKeys.TRAIN and _step_losses.recorded(tf.compat.v1.get_default_graph()):
            # TPUEstimator's once-per-loop line gives way to stock's lines, and the loss of every
            # step is checked first of all hooks: before the checkpoint saver (_step_losses).
            hooks = [
                hook
                for hook in spec.training_hooks
                if type(hook) is not tf.compat.v1.train.LoggingTensorHook
            ]
            spec = spec._replace(
                training_hooks=tuple(hooks),
                training_chief_hooks=(
                    _step_losses.StepLossHook(self._tpushim_log_every),
                    *spec.training_chief_hooks,
                ),
            )
        return spec

    def _user_params(self, context):
        """The params the user's input_fn is called with (see :class:`_input_fn.UserParams`)."""
        params = _input_fn.UserParams()
        if self._tpushim_plan.batch_size is not None:
            params["batch_size"] = self._tpushim_plan.batch_size
        if context is not None:
            params["context"] = context
        return params

    def _convert_eval_steps_to_hooks(self, steps):
        # On a TPU the steps an evaluation runs are known only once the input was read (see
        # tpu_eval_steps): TPUEstimator's step hooks are made when the session starts.
        self._tpushim_thread.eval_steps = steps
        if not self._on_tpu(ModeKeys.EVAL):
            return super()._convert_eval_steps_to_hooks(steps)
        thread = self._tpushim_thread
        return [_DeferredHooks(lambda: _tfprivate.tpu.tpu_eval_steps_hooks(thread.eval_steps))]

    # -- the entry points ----------------------------------------------------------------------
    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        with _observe.calling(_observe.Call("train", self, input_fn, steps, max_steps)) as call:
            self._reach_tpu_once()
            if not _observe.has_observers():
                return super().train(
                    input_fn,
                    hooks=hooks,
                    steps=call.steps,
                    max_steps=call.max_steps,
                    saving_listeners=saving_listeners,
                )
            clock, wait, start = (
                _run_clock.RunClock(),
                _input_wait.InputWaitHook(),
                time.monotonic(),
            )
            super().train(
                input_fn,
                hooks=[*(hooks or ()), clock, wait],
                steps=call.steps,
                max_steps=call.max_steps,
                saving_listeners=saving_listeners,
            )
            _observe.input_waited(call, wait.seconds)
            _observe.finished(call, time.monotonic() - start, clock.steps, clock.first_run)
            return self

    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
        with _observe.calling(_observe.Call("evaluate", self, input_fn, steps)) as call:
            self._reach_tpu_once()
            wait, start = _waiting(), time.monotonic()
            metrics = super().evaluate(
                input_fn,
                steps=call.steps,
                hooks=_with(hooks, wait),
                checkpoint_path=checkpoint_path,
                name=name,
            )
            _observe.input_waited(call, wait and wait.seconds)
            _observe.finished(call, time.monotonic() - start)
            return metrics

    def predict(
        self,
        input_fn,
        predict_keys=None,
        hooks=None,
        checkpoint_path=None,
        yield_single_examples=True,
    ):
        with _observe.calling(_observe.Call("predict", self, input_fn)) as call:
            self._reach_tpu_once()
            wait, start = _waiting(), time.monotonic()
            outputs = super().predict(
                input_fn,
                predict_keys=_padding.predict_keys_with_padding(predict_keys),
                hooks=_with(hooks, wait),
                checkpoint_path=checkpoint_path,
                yield_single_examples=yield_single_examples,
            )
            yield from _padding.drop_padding(outputs, yield_single_examples)
            _observe.input_waited(call, wait and wait.seconds)
            _observe.finished(call, time.monotonic() - start)


def _waiting():
    """The input-wait hook of a call observers hear of (:mod:`tpushim._input_wait`), else None."""
    return _input_wait.InputWaitHook() if _observe.has_observers() else None


def _with(hooks, hook):
    """``hooks`` as given (None stays None: stock's default), with ``hook`` when there is one."""
    return hooks if hook is None else [*(hooks or ()), hook]


class _DeferredHooks(tf.compat.v1.train.SessionRunHook):
    """Session hooks made when the session starts (``begin``), from what building the graph
    fixed (a TPU evaluation's steps, known once its input was read). They are in ``hooks``."""

    def __init__(self, make):
        self._make = make
        self.hooks = []
        self._asked = []

    def begin(self):
        self.hooks = list(self._make())
        for hook in self.hooks:
            hook.begin()

    def after_create_session(self, session, coord):
        for hook in self.hooks:
            hook.after_create_session(session, coord)

    def before_run(self, run_context):
        self._asked = [hook.before_run(run_context) for hook in self.hooks]
        feeds = {}
        for args in self._asked:
            feeds.update((args and args.feed_dict) or {})
        fetches = [args.fetches if args is not None else [] for args in self._asked]
        return tf.compat.v1.train.SessionRunArgs(fetches, feed_dict=feeds or None)

    def after_run(self, run_context, run_values):
        for hook, results in zip(self.hooks, run_values.results):
            hook.after_run(
                run_context,
                tf.compat.v1.train.SessionRunValues(
                    results, run_values.options, run_values.run_metadata
                ),
            )

    def end(self, session):
        for hook in self.hooks:
            hook.end(session)


def _finite(result):
    return isinstance(result, tf.data.Dataset) and _input_fn.is_finite(result)


def tpu_eval_steps(facts, context, steps):
    """The evaluation steps a TPU runs over an input of these :class:`_input_fn.InputFacts`, in
    the call's :class:`tpushim._plan.RunContext`.

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
    held = context.eval_steps(facts.examples, facts.batches, facts.declared, facts.batch_size)
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


_SAME = object()


def rewrapped(estimator, wrap, config=_SAME, warm_start_from=_SAME, params=None):
    """A TPUShimEstimator like ``estimator`` -- config, warm start, and its whole conversion plan
    (:class:`tpushim._plan.ConversionPlan`: TPU, settings, batch size, the model's input shapes)
    -- around ``wrap(its model_fn)`` (``tf.estimator.add_metrics``, an Estimator rebuilt around
    its model_fn: :mod:`tpushim._extenders`); ``config``, ``warm_start_from`` and ``params``
    replace its own where given. Observers hear of it as made from ``estimator``
    (:func:`_observe.derived`)."""
    model_fn = wrap(estimator._tpushim_model_fn)
    plan = estimator._tpushim_plan
    if warm_start_from is not _SAME:
        plan = dataclasses.replace(plan, warm_start=warm_start_from)
    twin = TPUShimEstimator(
        model_fn=model_fn,
        config=estimator.config if config is _SAME else config,
        use_tpu=estimator._tpushim_use_tpu,
        warm_start_from=(
            _tfprivate.estimator.warm_start_settings(estimator)
            if warm_start_from is _SAME
            else warm_start_from
        ),
        export_to_tpu=False,
        eval_on_tpu=estimator._tpushim_eval_on_tpu,
        params=dict(params or {}),
        tpushim_plan=plan,
    )
    _observe.derived(twin, estimator, model_fn)
    return twin


def built(prepared, arguments, settings, decision):
    """The TPUEstimator engine's estimator for one ``model_to_estimator`` call, from its
    :class:`tpushim._engines.base.Prepared` first half (:mod:`tpushim._convert`): the model_fn, the
    warm-start checkpoint of the Keras weights exactly as stock writes it, the conversion's
    plan, and the :class:`TPUShimEstimator` on ``decision``'s TPU (or on CPU). A
    :class:`tpushim._engines.base.Built`."""
    tpu = decision.tpu
    keras_model, custom_objects = prepared.keras_model, prepared.custom_objects
    config, save_object_ckpt = prepared.config, prepared.save_object_ckpt
    model_fn = _model_fn.make_model_fn(
        keras_model,
        custom_objects,
        save_object_ckpt,
        arguments["metric_names_map"],
        arguments["export_outputs"],
    )
    if not _tfprivate.estimator.any_weight_initialized(keras_model):
        tf.compat.v1.keras.backend.set_session(tf.compat.v1.Session(config=config.session_config))
    warm_start_path = None
    if _tfprivate.keras.is_graph_network(keras_model) and config.is_chief:
        warm_start_path = prepared.keras.save_first_checkpoint(
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
    model_inputs = _shapes.ModelInputs.of(keras_model, custom_objects=custom_objects)
    plan = _plan.ConversionPlan(
        settings=settings,
        tpu=tpu,
        model_inputs=model_inputs,
        warm_start=warm_start_path,
        loss_plan=prepared.loss_plan,
    )
    tpu_run_config = prepared.run_config
    estimator = make_estimator(model_fn, tpu_run_config, plan)
    description = (
        f"TPUEstimator(use_tpu={tpu is not None}"
        + (f", tpu={tpu.describe()}" if tpu is not None else "")
        + f", global batch {settings.batch_size or 'from input'}"
        + f", iterations_per_loop {tpu_run_config.tpu_config.iterations_per_loop})"
        + (
            f" [TPU from {tpu.source}]"
            if tpu is not None
            else f" [mode cpu from {settings.sources.get('mode')}: the TPU code path on CPU]"
        )
        + (
            f"; feature columns: {model_inputs.feature_split.describe()}"
            if model_inputs is not None and model_inputs.feature_split is not None
            else ""
        )
    )
    return base.Built(estimator, keras_model, model_fn, description)


def make_estimator(model_fn, run_config, plan):
    """The :class:`TPUShimEstimator` for a model_fn tpushim made, with the conversion's ``plan``
    (a :class:`tpushim._plan.ConversionPlan`): on its TPU (whose cluster ``run_config``
    carries), or on CPU when it has none; warm-started from its checkpoint."""
    use_tpu = plan.tpu is not None
    return TPUShimEstimator(
        model_fn=model_fn,
        config=run_config,
        use_tpu=use_tpu,
        warm_start_from=plan.warm_start,
        export_to_tpu=False,
        # Quiet cpu mode: without these TPUEstimator logs 'eval_on_tpu ignored because use_tpu
        # is False.' and Estimator 'params are not passed' about tpushim's own construction.
        eval_on_tpu=use_tpu,
        params={},
        tpushim_plan=plan,
    )
