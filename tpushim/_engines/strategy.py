"""The strategy engine: the Keras model trained, evaluated and predicted under a
``tf.distribute`` strategy in TF2 (:mod:`tpushim._strategy`), where TPUEstimator cannot run (PJRT
TPU runtimes, TensorFlow >= 2.16) or where ``engine='strategy'`` asks for it. This module adapts
it to the engine protocol; TensorFlow-free at import."""

from tpushim import _engines


class StrategyEngine(_engines.Engine):
    """The ``tf.distribute`` strategy engine: runs wherever TensorFlow 2 does."""

    name = _engines.STRATEGY
    chosen_why = "the strategy engine runs here (engine auto)"

    def plan(self, keras_model, optimizer, custom_objects, settings, tpu, cluster):
        from tpushim import _strategy

        return _strategy.make_plan(
            keras_model,
            optimizer,
            custom_objects,
            settings,
            lambda: (
                _strategy.tpu_strategy(cluster()) if tpu is not None else _strategy.cpu_strategy()
            ),
        )

    def build(self, prepared, arguments, settings, decision):
        from tpushim import _strategy

        return _strategy.made(prepared, arguments, settings, decision)

    def owns(self, estimator):
        from tpushim import _strategy  # only where a converted estimator is involved

        return isinstance(estimator, _strategy.StrategyEstimator)

    def add_metrics(self, estimator, metric_fn, model_fn):
        from tpushim import _strategy

        return _strategy.add_metrics(estimator, metric_fn, model_fn)

    def rewrap(self, cls, args, kwargs, found):
        from tpushim import _strategy, _tfprivate

        _strategy.said_stock_around(
            found[0],
            f"{_tfprivate.estimator_classes().get(cls, cls.__name__)}"
            "(model_fn=<the strategy engine's estimator>.model_fn)",
        )
        return None

    compiles_own_step = True

    def refusals(self, keras_model, custom_objects, settings):
        import tensorflow as tf

        from tpushim import _strategy

        optimizer = getattr(keras_model, "optimizer", None)
        if not isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer) and isinstance(
            optimizer, tf.keras.optimizers.Optimizer
        ):  # as the conversion does (stock's too): a new-style optimizer trains as its legacy twin
            optimizer = tf.keras.__internal__.optimizers.convert_to_legacy_optimizer(optimizer)
        return _strategy.make_plan(
            keras_model, optimizer, custom_objects, settings, _strategy.cpu_strategy
        )
