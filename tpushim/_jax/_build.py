"""The conversion's last step on the JAX engine: :func:`refusals` (what it refuses before
anything is written) and :func:`made` (stock's warm-start checkpoint, the
:class:`JaxConversion`, the :class:`tpushim._jax._estimator.JaxEstimator` and its line);
:mod:`tpushim._convert` runs the steps before it and announces it.

Imports jax: only the engine's ``plan``/``build`` import this module, never ``import tpushim``.
"""

import math
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tpushim import _settings, _tfprivate
from tpushim._errors import ConversionError
from tpushim._jax import _checkpoint, _derived, _host, _optimizers, _pod, _step, _trace
from tpushim._jax._estimator import JaxEstimator


def _refuse(what, fix="engine='strategy' (TPUSHIM_ENGINE=strategy)"):
    raise ConversionError(f"tpushim's JAX engine does not run {what} yet. Use {fix}, which does.")


def refusals(keras_model, optimizer, custom_objects, settings):
    """Raises what the engine refuses for this model before anything is written: a program
    that disabled TensorFlow 2 behaviour, a subclassed model, a loss or optimizer the step does not compute (:mod:`._trace`, :mod:`._optimizers`)."""
    del settings
    import tensorflow as tf

    _pod.initialize()  # a pod's jax.distributed, before the engine's first JAX call

    if not tf.executing_eagerly():
        _refuse(
            "a program that disabled TensorFlow 2 behaviour (tf.compat.v1.disable_v2_behavior() "
            "or disable_eager_execution(): its Keras model is a TensorFlow 1 graph-mode model, "
            "whose layers Keras cannot call in the tf.function the engine converts to JAX, nor "
            "its weights be read eagerly; the engine does not rebuild it eagerly from its config "
            "and weights)"
        )
    if _tfprivate.keras.is_subclassed(keras_model):
        _refuse(
            "subclassed models (its step reads a graph network's outputs, masks and added "
            "losses, which a subclassed model has only once called)"
        )
    _optimizers.of(optimizer)
    _host.plan(keras_model, custom_objects)  # its host part's refusals, by layer
    _trace.training_function(keras_model, custom_objects)  # its loss terms refused by name


class JaxConversion:
    """What the engine keeps of one conversion: the model, its stock checkpoints, its settings,
    and its evaluation and prediction functions in JAX (converted once per batch shape)."""

    def __init__(self, keras_model, custom_objects, object_based, settings, metric_names_map):
        self.keras_model, self.custom_objects = keras_model, custom_objects
        self.batch_size = settings.batch_size
        self.per_call = settings.iterations_per_loop or _settings.DEFAULT_ITERATIONS_PER_LOOP
        self.metric_names_map = metric_names_map
        self.pod_input = settings.pod_input
        _pod.initialize()
        self.pod = _pod.current()  # None: one process
        self.checkpoints = _checkpoint.StockCheckpoints(keras_model, custom_objects, object_based)
        self.host = _host.plan(keras_model, custom_objects)  # strings, lookups: on the host
        self.devices = jax.local_devices()
        self._mesh = Mesh(np.array(self.devices), ("data",))
        self._replicated = NamedSharding(self._mesh, PartitionSpec())
        self._split = NamedSharding(self._mesh, PartitionSpec("data"))
        self._eval_fns, self._predict_fn = {}, None
        self._converted = {}

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
        )

    def device_rows(self, rows):
        """An evaluation's or prediction's batch padded to a multiple of the devices."""
        shards = len(self.devices)
        return int(math.ceil(rows / shards) * shards)

    def _run(self, kind, fn, values, arrays):
        key = (kind, tuple((np.shape(a), np.asarray(a).dtype.str) for a in jax.tree.leaves(arrays)))
        if key not in self._converted:
            jax_fn, names = _trace.convert_inference(self.keras_model, fn, *arrays)
            self._converted[key] = (jax.jit(lambda p, *a: jax_fn(p, *a)[0]), names)
        compiled, names = self._converted[key]
        params = jax.device_put({k: values[k] for k in names}, self._replicated)
        batch = jax.device_put(arrays, self._split)
        return compiled(params, *batch)

    def evaluate(self, values, features, labels, weights, pad, weighted=False):
        """(loss over the real rows, outputs, logits, how each is read) of one padded batch, in
        JAX: per output the logits Keras's crossentropy metrics read from it in stock's graph
        (None where it has none; see :func:`tpushim._jax._trace.training_function`).
        ``weighted``: the input gave ``weights`` (stock's ``{"features", "sample_weights"}``);
        else they are ones, unread (Keras's unweighted loss)."""
        if weighted not in self._eval_fns:
            self._eval_fns[weighted] = _trace.training_function(
                self.keras_model,
                self.custom_objects,
                training=False,
                weighted=weighted,
                fed=self.host,
                logits=True,
            )
        fn = self._eval_fns[weighted]
        loss, outputs, logits = self._run(
            ("evaluate", weighted), fn, values, (features, labels, weights, pad)
        )
        hows = list(fn.tpushim_logits_how)
        logits = [None if how is None else np.asarray(lg) for lg, how in zip(logits, hows)]
        return np.asarray(loss), [np.asarray(o) for o in outputs], logits, hows

    def predict(self, values, features):
        """The model's inference outputs of one padded batch, in JAX."""
        if self._predict_fn is None:
            self._predict_fn = _trace.predict_function(self.keras_model, fed=self.host)
        return [np.asarray(o) for o in self._run("predict", self._predict_fn, values, (features,))]

    def metrics_model(self):
        """A copy of the user's model compiled as the user compiled it: its compiled metrics
        (Keras's names and kinds) updated on the host with each batch's real rows."""
        import tensorflow as tf

        with (
            _tfprivate.keras.keras_random_state_kept(),  # a copy stock does not make
            tf.keras.utils.custom_object_scope(self.custom_objects or {}),  # e.g. regularizers
        ):
            model = tf.keras.models.clone_model(self.keras_model)
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
    model_fn = prepared.keras.model_fn(
        keras_model,
        custom_objects,
        save_object_ckpt,
        arguments["metric_names_map"],
        arguments["export_outputs"],
    )
    conversion = JaxConversion(
        keras_model, custom_objects, save_object_ckpt, settings, arguments["metric_names_map"]
    )
    warm_start_path = None
    if config.is_chief and _pod.is_chief():  # as stock: on a pod, process 0
        warm_start_path = prepared.keras.save_first_checkpoint(
            keras_model, custom_objects, config, save_object_ckpt
        )
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
