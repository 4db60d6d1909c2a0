"""The strategy engine: the converted estimator trains, evaluates and predicts the Keras model
under a ``tf.distribute`` strategy in TF2 (``tf.function`` on the eager runtime), where
TPUEstimator (TF1 sessions) cannot run: PJRT TPU runtimes and TensorFlow >= 2.16.

One module per concern, each importing only those below it; callers import the module they need
(nothing is re-exported here):

- ``build``: the conversion on this engine: ``build_on_engine`` (TensorFlow >= 2.16) and ``made``
  (either TensorFlow: the plan completed, the estimator, its line, the observers told).
- ``estimator``: ``StrategyEstimator`` (``train``, ``evaluate``, ``predict`` replaced), the
  estimator ``tf.estimator.add_metrics`` makes of it, stock's built around it said.
- ``xla_check``: one replica's training step compiled with XLA where no TPU compiles it.
- ``step``: one call's clone, optimizer and global step, and its compiled train, evaluate and
  predict functions.
- ``compiled_metrics``: the model's compiled metrics, updated on the host with each evaluation
  batch's real rows.
- ``loss``: one replica's share of stock's loss on the global batch.
- ``plan``: ``Plan``, what the engine takes from a conversion, and ``make_plan``.
- ``refusals``: what the engine refuses before anything is written, with its texts.
- ``clone``: the engine's copy of the user's model.
- ``element``: a replica's padded element and a model call's structures, as the engine reads them.
- ``input``: the input split over the replicas; on a pod each host's own pipeline.
- ``events``: the steps as stock's hooks see them (log lines, events, checkpoints kept, the user's
  SessionRunHooks).
- ``metrics``: ``tf.estimator.add_metrics``' metric_fns, on the host.
- ``checkpoint``: checkpoints in stock's formats and names.
- ``runtime``: the ``tf.distribute`` strategies and the eager runtime the engine runs on.

Outside this package a module is imported as ``_strategy_<module>`` (``from tpushim._strategy
import step as _strategy_step``): its short name would shadow a local (``plan``, ``step``). The
three that were top-level modules keep their old names as aliases (``_strategy_input``,
``_strategy_checkpoint``, ``_step_events``). The model's host part (strings, lookups, run in
each input pipeline) is the core's :mod:`tpushim._host_part`, which the JAX engine shares.
"""
