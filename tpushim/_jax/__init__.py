"""The JAX engine's package (``engine=jax``): a legacy script's Keras model trained, evaluated
and predicted by steps that run in JAX on every local device (the TPUs JAX runs on: Colab's
v5e-1, Kaggle's v5e-8, v6e, and those TensorFlow no longer supports), while TensorFlow keeps the
graph, the input pipeline and the checkpoints on the host. Registered in :mod:`tpushim._engines`
(:mod:`tpushim._engines.jax_engine`); proven on 8 XLA CPU devices, not run on a TPU.

* :mod:`tpushim._jax._build`: the conversion's last step: its refusals, ``JaxConversion`` (the
  model's evaluation and prediction functions in JAX, its stock checkpoints), ``made``.
* :mod:`tpushim._jax._estimator`: ``JaxEstimator`` (stock's Estimator; ``train``, ``evaluate``,
  ``predict`` in JAX), the input_fn's batches read on the host as stock reads them.
* :mod:`tpushim._jax._subclassed`: a subclassed model rebuilt as stock's clone and called on
  the first batch's shapes, the step tracing a functional stand-in of it.
* :mod:`tpushim._jax._host`: the model's host part (strings, lookups, feature columns' lookups:
  the core's :mod:`tpushim._host_part`) computed in TensorFlow on each batch read, the step
  traced from its tensors.
* :mod:`tpushim._jax._hooks`: its part in stock's hooks (:mod:`tpushim._stock_hooks`, shared
  with the strategy engine): the user's hooks (the loss under stock's name), its TensorBoard
  events and step-rate lines, what ``train_and_evaluate`` asks of it.
* :mod:`tpushim._jax._checkpoint`: stock's checkpoints (format, variable and slot names,
  ``global_step``) written by stock's Saver in stock's training graph; read in either format.
* :mod:`tpushim._jax._trace`: the Keras model's training-mode forward pass and its compiled loss
  (and the inference ones), traced in TensorFlow on the global batch (padding rows weigh 0 in
  the loss and in BatchNormalization's statistics: the core's :mod:`tpushim._losses`,
  :mod:`tpushim._batchnorm`) and converted to JAX with ``tf2jax``; :mod:`tpushim._jax._ops`:
  the TensorFlow ops Keras uses that tf2jax lacks (or gets wrong), registered with it.
* :mod:`tpushim._jax._optimizers`: the optimizer's update as tf-keras computes it (SGD with
  momentum / nesterov, Adam; legacy and v2 spellings), its slots under Keras's names.
* :mod:`tpushim._jax._step`: ``jax.value_and_grad`` of the converted loss, the update, the
  moving statistics, data parallel over every local device (``jax.sharding``: the global batch
  split in equal per-device shares, as TPUEstimator splits it), ``iterations_per_loop`` steps per
  compiled call, compiled once per shape.
* :mod:`tpushim._jax._pod`: a pod: ``jax.distributed`` joined from the environment, each
  process's share of the input (:mod:`tpushim._pods`' paths), process 0 writing.

What it does not run yet is refused in words naming the fix (``engine='strategy'``).
TensorFlow- and JAX-free at import, as every engine package is.
"""
