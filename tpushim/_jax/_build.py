"""The conversion's last step on the JAX engine: :func:`refusals` (what it refuses before
anything is written) and :func:`made` (stock's warm-start checkpoint, the
:class:`JaxConversion`, the :class:`tpushim._jax._estimator.JaxEstimator` and its line);
:mod:`tpushim._convert` runs the steps before it and announces it.

Imports jax: only the engine's ``plan``/``build`` import this module, never ``import tpushim``.
"""

import contextlib
import math
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tpushim import _settings, _tfprivate
from tpushim._errors import ConversionError
from tpushim._jax import (
    _checkpoint,
    _derived,
    _graph_program,
    _host,
    _optimizers,
    _pod,
    _step,
    _subclassed,
    _trace,
)
from tpushim._jax._estimator import JaxEstimator


def _refuse(what, fix="engine='strategy' (TPUSHIM_ENGINE=strategy)"):
    raise ConversionError(f"tpushim's JAX engine does not run {what} yet. Use {fix}, which does.")


def refusals(keras_model, optimizer, custom_objects, settings):
    """Raises what the engine refuses for this model before anything is written: a loss or
    optimizer the step does not compute (:mod:`._trace`, :mod:`._optimizers`); a subclassed
    model's loss, once it is built on the input (:mod:`._subclassed`); for a program that
    disabled TensorFlow 2 behaviour, those of its eager copy (:mod:`._graph_program`)."""
    del settings

    _pod.initialize()  # a pod's jax.distributed, before the engine's first JAX call

    if _graph_program.is_graph_program():  # refused as its eager copy would be (_graph_program)
        if _tfprivate.keras.is_subclassed(keras_model):
            _refuse(
                "a subclassed model in a program that disabled TensorFlow 2 behaviour (the "
                "engine copies such a program's model eagerly from its config: a graph network's)"
            )
        if _pod.current() is not None:
            _refuse(
                "a program that disabled TensorFlow 2 behaviour on a pod of several processes "
                "(its eager copy starts from the first checkpoint process 0 writes)"
            )
        copy = _graph_program.eager_copy(keras_model, custom_objects)
        copied, own = [v.name for v in copy.weights], [v.name for v in keras_model.weights]
        if copied != own:  # stock's checkpoints' names
            _refuse(
                "this program's model, which disabled TensorFlow 2 behaviour: its eager copy's "
                f"weights are named {copied[:4]}, the program's {own[:4]}"
            )
        with _graph_program.runtime(keras_model):
            _eager_refusals(copy, copy.optimizer, custom_objects)
        return
    _eager_refusals(keras_model, optimizer, custom_objects)


def _eager_refusals(keras_model, optimizer, custom_objects):
    step_optimizer = _optimizers.of(optimizer)
    if _tfprivate.keras.is_subclassed(keras_model):
        return  # the rest once it is built on the input (:mod:`._subclassed`), as stock's clone
    # its host part's and sparse inputs' refusals, by layer
    _host.plan(keras_model, custom_objects, step_optimizer)
    _trace.training_function(keras_model, custom_objects)  # its loss terms refused by name


class JaxConversion:
    """What the engine keeps of one conversion: the model, its stock checkpoints, its settings,
    and its evaluation and prediction functions in JAX (converted once per batch shape).
    ``awaits_input``: a subclassed model's (:class:`SubclassedConversion`),
    built on the first batch read (``build_on``) before anything else."""

    awaits_input = False

    def __init__(
        self,
        keras_model,
        custom_objects,
        object_based,
        settings,
        metric_names_map,
        program_model=None,
    ):
        # A graph program's (``program_model``: its own, in graph mode): ``keras_model`` is its
        # eager copy, each call run on the eager runtime (:meth:`runtime`).
        self.program_model = program_model
        # tf2jax imported (the ops it lacks registered) here, at conversion: not in train()
        # before its first checkpoint
        from tpushim._jax import _ops  # noqa: F401

        self.keras_model, self.custom_objects = keras_model, custom_objects
        self.batch_size = settings.batch_size
        self.per_call = settings.iterations_per_loop or _settings.DEFAULT_ITERATIONS_PER_LOOP
        self.metric_names_map = metric_names_map
        self.pod_input = settings.pod_input
        _pod.initialize()
        self.pod = _pod.current()  # None: one process
        self.checkpoints = self.host = None  # a subclassed model's: once built on the input
        if not self.awaits_input:
            # stock's training graph: of the program's model, in its graph mode (stock's names)
            self.checkpoints = _checkpoint.StockCheckpoints(
                program_model or keras_model, custom_objects, object_based
            )
            with self.runtime():
                self.host = _host.plan(keras_model, custom_objects)  # strings, lookups: on the host
        self.devices = jax.local_devices()
        self._mesh = Mesh(np.array(self.devices), ("data",))
        self._replicated = NamedSharding(self._mesh, PartitionSpec())
        self._split = NamedSharding(self._mesh, PartitionSpec("data"))
        self._eval_fns = {}
        self._converted = {}
        self._steps = {}  # (global batch, seeds) -> what its Trainers compiled (each train())

    def runtime(self):
        """Where each call runs: as the program runs, or a graph program's eager runtime
        (:func:`._graph_program.runtime`)."""
        if self.program_model is None:
            return contextlib.nullcontext()
        return _graph_program.runtime(self.program_model)

    def trainer(self, global_batch, seeds=None):
        """A :class:`tpushim._jax._step.Trainer` of the model for this global batch, its random
        draws stock's from ``seeds`` (see the Trainer); on a pod, over every process's devices."""
        return _step.Trainer(
            self.keras_model,
            global_batch,
            self.devices,
            self.custom_objects,
            seeds=seeds,
            pod=self.pod,
            fed=self.host,
            # a later train() call's step: the one compiled before, where nothing it reads
            # changed (a new Trainer per call: its own state, its draws' streams started again)
            compiled=self._steps.setdefault((global_batch, seeds), {}),
        )

    def device_rows(self, rows):
        """An evaluation's or prediction's batch padded to a multiple of the devices."""
        shards = len(self.devices)
        return int(math.ceil(rows / shards) * shards)

    def _run(self, kind, fn, values, arrays, over_pod=False, call=None):
        """``fn`` (converted once per shape) of one padded batch on this process's devices; or
        (``over_pod``) ``arrays`` this process's rows of the global batch, run over every
        process's devices, its outputs whole on every process. A draw the outputs read is
        stock's, made on the host by ``call`` (:class:`._draws.CallDraws`)."""
        key = (kind, tuple((np.shape(a), np.asarray(a).dtype.str) for a in jax.tree.leaves(arrays)))
        if key not in self._converted:
            shaped = arrays
            if over_pod:  # traced at the global batch's shapes (its values are not read)
                shaped = jax.tree.map(lambda a: np.concatenate([a] * self.pod.count), arrays)
            jax_fn, names, draws = _trace.convert_inference(
                self.keras_model, fn, *shaped, with_draws=True
            )
            whole = None
            if over_pod:
                whole = NamedSharding(Mesh(np.array(self.pod.devices), ("data",)), PartitionSpec())
            self._converted[key] = (
                jax.jit(lambda p, *a: jax_fn(p, *a)[0], out_shardings=whole),
                names,
                draws,
            )
        compiled, names, draws = self._converted[key]
        made = []
        if draws:  # stock's, for the global batch's real rows (every process alike)
            made = [call.draws(draws)]
        if not over_pod:
            params = jax.device_put({k: values[k] for k in names}, self._replicated)
            made = jax.device_put(made, self._replicated)
            return compiled(params, *jax.device_put(arrays, self._split), *made)
        mesh = Mesh(np.array(self.pod.devices), ("data",))
        whole = NamedSharding(mesh, PartitionSpec())
        params = _pod.replicated({k: values[k] for k in names}, whole)
        split = NamedSharding(mesh, PartitionSpec("data"))
        batch = _pod.global_arrays(arrays, split, 0, self.pod.count)
        return compiled(params, *batch, *_pod.replicated(made, whole))

    def _inference_fn(self, kind, weighted, call, size):
        """The evaluation (``kind``) or prediction ``tf.function``, its draws seeded as stock's
        graph of this call (``call``'s seeds) at the traced batch of ``size`` rows."""
        seeds = call.seeds if call is not None else None
        key = (kind, weighted, seeds, size)
        if key not in self._eval_fns:
            if kind == "evaluate":
                self._eval_fns[key] = _trace.training_function(
                    self.keras_model,
                    self.custom_objects,
                    training=False,
                    weighted=weighted,
                    fed=self.host,
                    seeds=seeds,
                    global_batch=size,
                    logits=True,
                )
            else:
                self._eval_fns[key] = _trace.predict_function(
                    self.keras_model, fed=self.host, seeds=seeds, global_batch=size
                )
        return self._eval_fns[key]

    def evaluate(
        self, values, features, labels, weights, pad, weighted=False, over_pod=False, call=None
    ):
        """(loss over the real rows, outputs, logits, how each is read) of one padded batch, in
        JAX: per output the logits Keras's crossentropy metrics read from it in stock's graph
        (None where it has none; see :func:`tpushim._jax._trace.training_function`).
        ``weighted``: the input gave ``weights`` (stock's ``{"features", "sample_weights"}``);
        else they are ones, unread (Keras's unweighted loss). ``over_pod``: the arrays are this process's rows of
        the global batch, the step runs over every process's devices, and the outputs are the
        global batch's (every process's rows, in process order). ``call``: the call's
        :class:`._draws.CallDraws` (its batch's real rows set)."""
        size = len(pad) * (self.pod.count if over_pod else 1)
        fn = self._inference_fn("evaluate", weighted, call, size)
        loss, outputs, logits = self._run(
            ("evaluate", weighted, over_pod, call.seeds if call else None),
            fn,
            values,
            (features, labels, weights, pad),
            over_pod,
            call,
        )
        hows = list(fn.tpushim_logits_how)
        logits = [None if how is None else np.asarray(lg) for lg, how in zip(logits, hows)]
        return np.asarray(loss), [np.asarray(o) for o in outputs], logits, hows

    def predict(self, values, features, call=None):
        """The model's inference outputs of one padded batch, in JAX (``call``: as
        :meth:`evaluate`'s)."""
        size = len(np.asarray(features[0])) if features else None
        fn = self._inference_fn("predict", False, call, size)
        key = ("predict", call.seeds if call else None)
        return [np.asarray(o) for o in self._run(key, fn, values, (features,), call=call)]

    def metrics_model(self):
        """A copy of the user's model compiled as the user compiled it: its compiled metrics
        (Keras's names and kinds) updated on the host with each batch's real rows."""
        import tensorflow as tf

        with (
            _tfprivate.keras.keras_random_state_kept(),  # a copy stock does not make
            tf.keras.utils.custom_object_scope(self.custom_objects or {}),  # e.g. regularizers
        ):
            if self.program_model is None:
                model = tf.keras.models.clone_model(self.keras_model)
            else:  # (the program's: a Lambda's function as the program built it)
                model = tf.keras.models.clone_model(
                    self.program_model,
                    clone_function=_tfprivate.keras.clone_layer_in_programs_shapes,
                )
        with tf.keras.utils.custom_object_scope(self.custom_objects or {}):
            args = _tfprivate.keras.compile_args(self.keras_model)
            model.compile(
                loss=args.get("loss"),
                metrics=_tfprivate.keras_compile.clone_metrics(args.get("metrics")),
                weighted_metrics=_tfprivate.keras_compile.clone_metrics(
                    args.get("weighted_metrics")
                ),
                loss_weights=args.get("loss_weights"),
            )
        return model


class SubclassedConversion(_subclassed.BuiltOnInput, JaxConversion):
    """A subclassed model's: built on the first batch read, as stock's clone."""


def describe(conversion, settings, tpu, why):
    """The conversion line's description: where the engine runs and why."""
    kinds = sorted({d.platform.upper() for d in conversion.devices})
    where = (
        f"on TPU {tpu.describe()} [TPU from {tpu.source}]"
        if tpu is not None
        else f"[mode cpu from {settings.sources.get('mode')}]"
    )
    over = f"{len(conversion.devices)} {'/'.join(kinds)} device(s)"
    if conversion.pod is not None:
        over = f"{len(conversion.pod.devices)} {'/'.join(kinds)} device(s) of {conversion.pod.count} processes"
    return (
        f"the JAX engine: the Keras model's step in JAX over {over} {where}, global batch "
        f"{settings.batch_size or 'from input'}, iterations_per_loop {conversion.per_call} "
        f"[engine: {why}]"
    )


def made(prepared, arguments, settings, decision):
    """The JAX engine's estimator from the conversion's
    :class:`tpushim._engines.base.Prepared` first half: stock's Keras model_fn (what the base
    class exports with) and warm-start checkpoint, the :class:`JaxConversion`, the
    :class:`JaxEstimator`. A :class:`tpushim._engines.base.Built`."""
    from tpushim._engines import base

    keras_model, custom_objects = prepared.keras_model, prepared.custom_objects
    config, save_object_ckpt = prepared.config, prepared.save_object_ckpt
    _derived.refuse_config(config)
    model_fn = prepared.stock_model_fn(arguments)
    subclassed = _tfprivate.keras.is_subclassed(keras_model)
    # a subclassed model's is built on the input, as stock's clone; no warm start (as stock)
    kind = SubclassedConversion if subclassed else JaxConversion

    def conversion_of(model, program_model=None):
        return kind(
            model,
            custom_objects,
            save_object_ckpt,
            settings,
            arguments["metric_names_map"],
            program_model,
        )

    graph_program = _graph_program.is_graph_program()
    conversion = None if graph_program else conversion_of(keras_model)
    warm_start_path = None
    if config.is_chief and _pod.is_chief() and not subclassed:  # as stock: on a pod, process 0
        warm_start_path = prepared.keras.save_first_checkpoint(
            keras_model, custom_objects, config, save_object_ckpt
        )
    if graph_program:  # its eager copy, from the weights stock starts from (refusals: one pod)
        values = _graph_program.start_values(keras_model, custom_objects, warm_start_path)
        copy = _graph_program.eager_copy(keras_model, custom_objects, values)
        conversion = conversion_of(copy, keras_model)
    if conversion.pod is not None:  # the other processes warm-start from what process 0 wrote
        _pod.barrier("tpushim-warm-start-written")
        if warm_start_path is None and config.is_chief:
            import tensorflow as tf

            keras_dir = os.path.join(config.model_dir, "keras")
            warm_start_path = tf.train.latest_checkpoint(keras_dir)
    estimator = JaxEstimator(model_fn, config, warm_start_path, conversion)
    return base.Built(
        estimator,
        keras_model,
        model_fn,
        describe(conversion, settings, decision.tpu, decision.engine_why),
    )
