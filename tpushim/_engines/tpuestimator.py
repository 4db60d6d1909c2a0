"""The TPUEstimator engine: TF1 graphs and sessions under ``TPUEstimator`` on the StreamExecutor
TPU runtime, TensorFlow <= 2.15 (:mod:`tpushim._estimator`; estimators made from a converted one:
:mod:`tpushim._extenders`). This module adapts them to the engine protocol; TensorFlow-free at
import."""

from tpushim import _versions
from tpushim._engines import base


class TPUEstimatorEngine(base.Engine):
    """TPUEstimator: where it runs, the first choice (``engine=auto``)."""

    name = base.TPUESTIMATOR
    chosen_why = "TPUEstimator runs here (engine auto)"

    def unavailable(self, tf_version, environ):
        version = base._major_minor(tf_version)
        if version is not None and version >= base.NO_ESTIMATOR_FROM:
            return f"TensorFlow {tf_version} has no TPUEstimator"
        pjrt = base.pjrt_runtime(environ)
        if pjrt is not None:
            return f"a PJRT TPU runtime ({pjrt}), where TPUEstimator cannot run"
        return None

    def refuse_here(self, settings):
        if not _versions.uses_own_estimator():
            return
        import tensorflow as tf

        from tpushim._errors import ConversionError

        raise ConversionError(
            f"engine={self.name} (from {settings.sources.get('engine')}): TensorFlow "
            f"{tf.__version__} has no TPUEstimator (tf.estimator was removed in 2.16). "
            "Use engine='strategy' or 'auto' (TPUSHIM_ENGINE), which trains the Keras model "
            "under tf.distribute.TPUStrategy, or TensorFlow <= 2.15 for TPUEstimator."
        )

    def run_config(self, config, settings, cluster):
        from tpushim import _run_config

        return _run_config.to_tpu_run_config(config, settings, cluster)

    def build(self, prepared, arguments, settings, decision):
        from tpushim import _estimator

        return _estimator.built(prepared, arguments, settings, decision)

    def owns(self, estimator):
        if _versions.uses_own_estimator():  # no TPUEstimator there: none of its estimators
            return False
        from tpushim import _estimator

        return isinstance(estimator, _estimator.TPUShimEstimator)

    def add_metrics(self, estimator, metric_fn, model_fn):
        del model_fn  # TPUEstimator's own, around the estimator's model_fn
        from tpushim import _extenders

        return _extenders.add_metrics(estimator, metric_fn)

    def rewrap(self, cls, args, kwargs, found):
        from tpushim import _extenders

        return _extenders.rewrap(cls, args, kwargs, found)

    def said_around(self, cls, model_fn):
        if _versions.uses_own_estimator():  # no TPUEstimator there: none of its estimators
            return
        from tpushim import _extenders

        _extenders.said_around(cls, model_fn)
