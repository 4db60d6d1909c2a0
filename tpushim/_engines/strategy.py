"""The strategy engine: the Keras model trained, evaluated and predicted under a
``tf.distribute`` strategy in TF2 (:mod:`tpushim._strategy`), where TPUEstimator cannot run (PJRT
TPU runtimes, TensorFlow >= 2.16) or where ``engine='strategy'`` asks for it. This module adapts
it to the engine protocol; TensorFlow-free at import."""

from tpushim._engines import base


class StrategyEngine(base.Engine):
    """The ``tf.distribute`` strategy engine: runs wherever TensorFlow 2 does."""

    name = base.STRATEGY
    chosen_why = "the strategy engine runs here (engine auto)"

    def plan(self, keras_model, optimizer, custom_objects, settings, tpu, cluster):
        from tpushim._strategy import plan, runtime

        return plan.make_plan(
            keras_model,
            optimizer,
            custom_objects,
            settings,
            lambda: runtime.tpu_strategy(cluster()) if tpu is not None else runtime.cpu_strategy(),
        )

    def build(self, prepared, arguments, settings, decision):
        from tpushim._strategy import build

        return build.made(prepared, arguments, settings, decision)

    def owns(self, estimator):
        from tpushim._strategy import estimator as engine  # only where one is involved

        return isinstance(estimator, engine.StrategyEstimator)

    def add_metrics(self, estimator, metric_fn, model_fn):
        from tpushim._strategy import estimator as engine

        return engine.add_metrics(estimator, metric_fn, model_fn)

    def rewrap(self, cls, args, kwargs, found):
        from tpushim import _tfprivate
        from tpushim._strategy import estimator as engine

        engine.said_stock_around(
            found[0],
            f"{_tfprivate.estimator.estimator_classes().get(cls, cls.__name__)}"
            "(model_fn=<the strategy engine's estimator>.model_fn)",
        )
        return None

    compiles_own_step = True

    def refusals(self, keras_model, custom_objects, settings):
        import tensorflow as tf

        from tpushim._strategy import plan, runtime

        optimizer = getattr(keras_model, "optimizer", None)
        if not isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer) and isinstance(
            optimizer, tf.keras.optimizers.Optimizer
        ):  # as the conversion does (stock's too): a new-style optimizer trains as its legacy twin
            optimizer = tf.keras.__internal__.optimizers.convert_to_legacy_optimizer(optimizer)
        return plan.make_plan(
            keras_model, optimizer, custom_objects, settings, runtime.cpu_strategy
        )
