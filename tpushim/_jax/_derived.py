"""Estimators a script makes from the JAX engine's: one built around its ``model_fn``
(``tf.estimator.Estimator(model_fn=<converted>.model_fn, model_dir=..., config=...,
warm_start_from=...)``, the way trainers give a converted model their own model_dir, RunConfig or
warm start).

Stock runs the converted Keras model_fn in a plain Estimator with that call's model_dir, config,
params and warm start; on a TPU only JAX can use, nothing would run there. Here the engine's
estimator is made again around the same conversion with the call's model_dir, config and
``warm_start_from``: it trains, evaluates, predicts and exports as the engine's, starting where
stock's would (:mod:`tpushim._jax._warm_start`: the warm start given, a path or a
``WarmStartSettings``, else every weight from its initializer, as stock draws them all fresh).
A subclass of Estimator, or a ``functools.partial`` that binds the model_fn's arguments, is not
rebuilt: the engine's estimator then refuses it (``_tpushim_built_around``), in words.
"""

import functools
import inspect
import logging

logger = logging.getLogger("tpushim")


def refuse_config(config):
    """What a RunConfig asks for that the engine does not do yet, at conversion and where an
    estimator is built around its model_fn. (model_to_estimator's ``export_outputs`` go to
    stock's model_fn, which ``export_saved_model`` runs: taken.)"""
    from tpushim._errors import ConversionError

    if getattr(config, "train_distribute", None) or getattr(config, "eval_distribute", None):
        raise ConversionError(
            "tpushim's JAX engine does not run RunConfig's train_distribute / eval_distribute "
            "(it runs data parallel itself) yet. Use engine='strategy' "
            "(TPUSHIM_ENGINE=strategy), which does."
        )


def rebuilt(estimator, cls, args, kwargs):
    """The JAX engine's estimator ``cls(*args, **kwargs)`` makes around ``estimator``'s
    ``model_fn`` (see the module), or None."""
    from tpushim import _observe
    from tpushim._estimator_api import _config
    from tpushim._estimator_api._estimator import Estimator

    if cls is not Estimator:
        return None
    try:
        arguments = inspect.signature(Estimator.__init__).bind(None, *args, **kwargs).arguments
    except TypeError:
        return None  # stock's constructor says what is wrong
    model_fn = arguments["model_fn"]
    if isinstance(model_fn, functools.partial) and (model_fn.args or model_fn.keywords):
        return None
    called = f"tf.estimator.Estimator(model_fn=<{estimator._tpushim_label}>.model_fn)"
    # Observers may move the call's model_dir, as for a conversion (the preflight's scratch copy).
    dirs = {"model_dir": arguments.get("model_dir"), "config": arguments.get("config")}
    with _observe.converting(dirs) as dirs:
        config = _config.overwrite_model_dir_and_session_config(
            dirs.get("config"), dirs.get("model_dir")
        )
        refuse_config(config)
        made = type(estimator)(
            estimator._model_fn,
            config,
            arguments.get("warm_start_from"),
            estimator._tpushim_jax,
            params=arguments.get("params"),
        )
        made._tpushim_metric_fns = estimator._tpushim_metric_fns  # (its model_fn adds them)
    _observe.derived(made, estimator, made.model_fn)
    logger.info(
        "%s -> the JAX engine's estimator with this call's model_dir %s, config and warm start "
        "(%s)",
        called,
        made.model_dir,
        "from " + str(made._warm_start_settings[0])
        if made._warm_start_settings is not None
        else "none: every weight from its initializer, as stock's",
    )
    return made


def add_metrics(estimator, metric_fn, model_fn):
    """The JAX engine's estimator ``tf.estimator.add_metrics(estimator, metric_fn)`` returns:
    ``estimator`` (its conversion, config, model_dir, warm start) whose evaluation also computes
    ``metric_fn``'s metrics as stock's does (:class:`Added`).

    Args:
      estimator: a JAX engine's estimator (one add_metrics made, too: the metrics add up).
      metric_fn: the user's, its arguments checked by ``add_metrics`` (stock's check).
      model_fn: the model_fn stock's ``add_metrics`` made (the estimator's, with the metrics in
        EVAL mode): the new estimator's, so that what a script builds or exports from it is
        stock's.
    """
    from tpushim import _added_metrics

    made = type(estimator)(
        model_fn, estimator.config, estimator._warm_start_settings, estimator._tpushim_jax
    )
    return _added_metrics.derived(made, estimator, model_fn, metric_fn, "the JAX engine")


class _Sparse:
    """A ``SparseTensorValue`` of a batch, one leaf of ``tf.nest`` (which would take the
    namedtuple's parts for three arrays): the metrics read it as a ``SparseTensor``, as stock's."""

    def __init__(self, value):
        self.value = value


def _unwrapped(leaf):
    return leaf.value if isinstance(leaf, _Sparse) else leaf


def _parts(batch):
    """``{"features", "labels"}`` of an input_fn's batch, as stock's model_fn gets them (a
    sparse feature as one :class:`_Sparse` leaf)."""
    import jax
    import tensorflow as tf

    def is_sparse(value):
        return isinstance(value, tf.compat.v1.SparseTensorValue)

    batch = jax.tree_util.tree_map(
        lambda v: _Sparse(v) if is_sparse(v) else v, batch, is_leaf=is_sparse
    )
    if isinstance(batch, tuple) and len(batch) == 2:
        return {"features": batch[0], "labels": batch[1]}
    return {"features": batch, "labels": None}


class Added:
    """The added metrics of one evaluation (:mod:`tpushim._added_metrics`: stock's metric code
    in a graph of its own on the host), fed each batch's rows as the input_fn gave them and the
    model's outputs by name. The host's batch holds only real rows: padding is added after it,
    for the devices, and the outputs come back cut to the real rows."""

    def __init__(self, estimator, first_batch):
        import numpy as np
        import tensorflow as tf

        from tpushim import _added_metrics

        def spec(value):
            if isinstance(value, _Sparse):  # (its width may differ from batch to batch)
                rank = len(value.value.dense_shape)
                return tf.SparseTensorSpec([None] * rank, tf.as_dtype(value.value.values.dtype))
            value = np.asarray(value)
            return tf.TensorSpec([None, *value.shape[1:]], tf.as_dtype(value.dtype))

        model = estimator._tpushim_jax.keras_model
        self._names = list(model.output_names)
        given = {k: tf.nest.map_structure(spec, v) for k, v in _parts(first_batch).items()}
        self._added = _added_metrics.added(
            estimator._tpushim_metric_fns,
            estimator.config,
            {n: tf.TensorSpec(o.shape, o.dtype) for n, o in zip(self._names, model.outputs)},
            given,
        )

    def update(self, batch, outputs):
        """One batch's update: ``batch`` the input_fn's (real rows), ``outputs`` the model's
        outputs of its rows, in output order."""
        import tensorflow as tf

        parts = _parts(batch)
        parts["predictions"] = dict(zip(self._names, outputs))
        self._added.update(
            {
                part: [_unwrapped(tf.nest.flatten(parts[part])[i]) for i in used]
                for part, used in self._added.used.items()
            }
        )

    def results(self):
        """{name: value} of every added metric."""
        return self._added.results()
