"""tpushim's estimator API for TensorFlow >= 2.16, where tf.estimator no longer exists.

Legacy ``model_to_estimator`` scripts call tf.estimator names; TensorFlow 2.16 removed them, and
tensorflow_estimator does not import beside it. Only while tpushim is on, :mod:`tpushim._patch`
installs :mod:`._api`'s namespace as ``tf.estimator`` / ``tf.compat.v1.estimator`` and routes
tf_keras's ``model_to_estimator`` to :mod:`._keras`.

Why tf.compat.v1 graphs and sessions (not TF2 functions with tf.distribute): it is what
stock 2.15's model_to_estimator ran on -- the same graph-mode Keras train step, the same op seeds
(graph seed, then ops created in stock's order), TensorFlow's own MonitoredTrainingSession, hooks
and Saver checkpoints -- so a script gets stock 2.15's numbers and model_dir, and TensorFlow 2.21
still ships every piece. Written from tf.estimator's documented behaviour, not copied from it.
Modules: _config (RunConfig, ModeKeys, EstimatorSpec), _estimator (Estimator), _keras
(model_to_estimator), _inputs (numpy/pandas input_fns on TF's queues), _training
(train_and_evaluate, exporters, add_metrics), _early_stopping (tf.estimator.experimental's
hooks), _export (receivers, parsing specs, SavedModel), _api (the namespaces), _tfprivate.
"""
