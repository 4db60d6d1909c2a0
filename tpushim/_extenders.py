"""Estimators a script makes from one tpushim converted: ``tf.estimator.add_metrics``, and an
Estimator (or TPUEstimator) rebuilt around the converted one's model_fn. Both stay on tpushim's TPU
path.

``tf.estimator.add_metrics``: the same TPU estimator, with the added metrics computed as a TPU can
compute them.

Stock's ``add_metrics`` wraps the estimator's model_fn in a plain ``Estimator``: tpushim's input
adaptation would never run, and on a TPU nothing would run on it. Here the TPUShimEstimator is
rebuilt around its own model_fn (same config, TPU, settings, batch handling, padding and warm
start), whose EVAL spec hands the user's ``metric_fn`` to TPUEstimator's ``eval_metrics`` next to
tpushim's own metrics. The features, labels and predictions it asks for travel to it as tensors,
so on a TPU it runs on the host over every shard's rows, padding rows dropped: it sees exactly the
rows of stock's batch. Its results are taken as stock takes them (``(value, update_op)`` pairs or
Keras ``Metric`` objects, stock's checks and errors), and override a compiled metric of the same
name, as stock's do.
"""

import inspect
import logging

import tensorflow as tf

from tpushim import _estimator, _observe, _padding, _run_config, _tfprivate
from tpushim._errors import ConversionError

logger = logging.getLogger("tpushim")

ModeKeys = tf.estimator.ModeKeys
_PREFIX = "add_metrics_"  # the keys of the tensors the added metric_fn reads


def said_around(cls, model_fn):
    """For ``cls(model_fn=...)`` whose model_fn no converted estimator owns: says so where the
    function names a TPUEstimator tpushim converted (:func:`_say_if_named`); ``cls`` a
    TPUShimEstimator says nothing (it is one)."""
    if not issubclass(cls, _estimator.TPUShimEstimator):
        _say_if_named(cls, model_fn)


def rewrap(cls, args, kwargs, found):
    """The TPUEstimator engine's answer to ``cls(*args, **kwargs)`` whose ``model_fn`` is a
    converted TPUShimEstimator's (``found``: :func:`tpushim._tfprivate.estimator.estimator_of_model_fn`'s
    answer): a TPUShimEstimator running the converted model_fn with this call's ``model_dir``,
    ``config``, ``params`` and ``warm_start_from``, on the converted one's TPU and settings
    (TPUEstimator's own ``use_tpu`` and batch sizes give way to those). Stock runs the converted
    model_fn inside a plain Estimator, where on a TPU nothing would run on it.

    None where tpushim cannot make one (a subclass of the estimator classes, a partial binding
    other arguments): then stock's estimator is built, and tpushim says so in one line and tells
    observers (:func:`tpushim._observe.bypassed`).
    """
    model_fn = kwargs.get("model_fn", args[0] if args else None)
    estimator, bound_args, bound_keywords = found
    try:
        arguments = inspect.signature(cls.__init__).bind(None, *args, **kwargs).arguments
    except TypeError:
        return None  # stock's constructor says what is wrong
    public = _tfprivate.estimator.estimator_classes()
    called = f"{public.get(cls, cls.__name__)}(model_fn=<converted estimator>.{_which(model_fn)})"
    why = None
    if cls not in public:
        why = (
            f"{cls.__name__} is a subclass of {cls.__mro__[1].__name__}, and a converted "
            "estimator cannot be one"
        )
    elif bound_args or set(bound_keywords) - {"config", "params"}:
        why = "the functools.partial around the model_fn binds its inputs"
    elif estimator._tpushim_plan.settings is None:
        why = "the converted estimator was not made by model_to_estimator"
    if why is not None:
        logger.warning(
            "%s -> stock %s, which runs the converted model_fn outside TPUEstimator (on a TPU "
            "nothing would run on it): %s. Use the converted estimator itself, or "
            "tf.estimator.add_metrics to add metrics.",
            called,
            cls.__name__,
            why,
        )
        _observe.bypassed(estimator, f"{called}: {why}")
        return None
    # Observers may move the call's model_dir, as for a conversion (the preflight's scratch copy).
    dirs = {"model_dir": arguments.get("model_dir"), "config": arguments.get("config")}
    with _observe.converting(dirs) as dirs:
        config = _tfprivate.estimator.maybe_overwrite_model_dir_and_session_config(
            dirs.get("config"), dirs.get("model_dir")
        )
        config = _run_config.to_tpu_run_config(
            config, estimator._tpushim_plan.settings, estimator.config.cluster
        )
        made = _estimator.rewrapped(
            estimator,
            lambda own: own,
            config=config,
            warm_start_from=arguments.get("warm_start_from"),
            params=arguments.get("params"),
        )
    logger.info(
        "%s -> %s(use_tpu=%s), the converted model on tpushim's path with this call's model_dir %s",
        called,
        type(made).__name__,
        made._tpushim_use_tpu,
        made.model_dir,
    )
    return made


def _say_if_named(cls, model_fn):
    """Says so in one line when a stock estimator's own model_fn names an estimator tpushim
    converted (a global or a closure variable of the function): it may call that one's model_fn,
    which then runs outside TPUEstimator. Only said: tpushim cannot tell what the function does."""
    function = getattr(model_fn, "func", model_fn)
    code = getattr(function, "__code__", None)
    if code is None:
        return
    named = [getattr(function, "__globals__", {}).get(name) for name in code.co_names]
    for cell in getattr(function, "__closure__", None) or ():
        try:
            named.append(cell.cell_contents)
        except ValueError:  # a cell not yet filled
            continue
    converted = next((v for v in named if isinstance(v, _estimator.TPUShimEstimator)), None)
    if converted is None:
        return
    public = _tfprivate.estimator.estimator_classes().get(cls, cls.__name__)
    why = (
        f"its model_fn {code.co_name!r} names an estimator tpushim converted, whose model_fn it "
        "may call outside TPUEstimator (on a TPU nothing would run on it)"
    )
    logger.warning(
        "%s(model_fn=%s) -> stock %s: %s. Use tf.estimator.add_metrics to add metrics, or the "
        "converted estimator itself.",
        public,
        code.co_name,
        cls.__name__,
        why,
    )
    _observe.bypassed(converted, f"{public}(model_fn={code.co_name}): {why}")


def _which(model_fn):
    name = getattr(getattr(model_fn, "func", model_fn), "__name__", "")
    which = "_model_fn" if name == "_model_fn" else "model_fn"
    return f"{which} in a functools.partial" if hasattr(model_fn, "func") else which


def add_metrics(estimator, metric_fn):
    """``estimator`` (a TPUShimEstimator) with ``metric_fn``'s metrics added to its evaluation,
    as stock's ``tf.estimator.add_metrics`` adds them (``metric_fn``'s arguments already checked
    by stock)."""
    config = estimator.config
    added = _estimator.rewrapped(estimator, lambda model_fn: _with(model_fn, metric_fn, config))
    logger.info(
        "tf.estimator.add_metrics -> %s(use_tpu=%s) with the metrics of %s",
        type(added).__name__,
        added._tpushim_use_tpu,
        getattr(metric_fn, "__name__", metric_fn),
    )
    return added


def _with(model_fn, metric_fn, run_config):
    """``model_fn`` whose EVAL spec also computes ``metric_fn``'s metrics (see the module);
    ``run_config`` is what ``metric_fn`` gets as ``config``, as stock gives it the estimator's."""
    wanted = set(_tfprivate.estimator.fn_args(metric_fn))
    takes_config = "config" in _tfprivate.estimator.fn_args(model_fn)

    def model_fn_with_metrics(features, labels, mode, params, config=None):
        # TPUEstimator passes its RunConfig to a model_fn that takes one (for the host_call).
        extra = {"config": config} if takes_config else {}
        spec = model_fn(features, labels, mode, params, **extra)
        if mode != ModeKeys.EVAL:
            return spec
        own_fn, own_tensors = spec.eval_metrics or (None, {})
        real_features, padding_weight = _padding.split_padding(features)
        parts = {
            "features": real_features,
            "labels": labels,
            "predictions": spec.predictions,
        }
        parts = {k: v for k, v in parts.items() if k in wanted and v is not None}
        flat = tf.nest.flatten(parts)
        for path, tensor in zip(_tfprivate.data.leaf_paths(parts), flat):
            if not isinstance(tensor, tf.Tensor) or tensor.shape.rank == 0:
                raise ConversionError(
                    f"tf.estimator.add_metrics: {path} is a {type(tensor).__name__}, not a "
                    "tensor with a batch dimension; on a TPU the metric_fn runs on the host and "
                    "gets what the model_fn gives it as such tensors. Let the metric_fn read "
                    "dense features (or predictions) instead."
                )
        tensors = dict(own_tensors)
        tensors.update({f"{_PREFIX}{i}": t for i, t in enumerate(flat)})
        if padding_weight is not None:
            tensors["padding_weight"] = padding_weight

        def metric_fn_with_added(**tensors):
            mine = {k: tensors.pop(k) for k in list(tensors) if k.startswith(_PREFIX)}
            ops = own_fn(**tensors) if own_fn is not None else {}
            mine = _padding.real_rows(mine, tensors.get("padding_weight"))
            kwargs = tf.nest.pack_sequence_as(
                parts, [mine[f"{_PREFIX}{i}"] for i in range(len(flat))]
            )
            if "config" in wanted:
                kwargs["config"] = run_config
            # Stock's checks, texts and conversion: Metric objects become (result, update_op),
            # their variables local (initialised, not restored) metric variables.
            added = _tfprivate.estimator.validate_eval_metric_ops(dict(metric_fn(**kwargs)))
            ops.update(
                {
                    name: (value, _tfprivate.keras_compile.update_op(update))
                    for name, (value, update) in added.items()
                }
            )
            return ops

        # A new spec, not spec._replace(): TPUEstimatorSpec reads its host calls in __new__.
        fields = dict(spec._asdict(), eval_metrics=(metric_fn_with_added, tensors))
        return _tfprivate.modules.tpu_estimator.TPUEstimatorSpec(**fields)

    return model_fn_with_metrics
