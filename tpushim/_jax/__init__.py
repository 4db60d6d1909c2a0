"""The JAX engine's package: a legacy script's Keras model trained by a step that runs in JAX
(the TPUs JAX runs on: Colab's v5e-1, Kaggle's v5e-8, v6e, and those TensorFlow no longer
supports), while TensorFlow keeps the graph, the input pipeline and the checkpoints on the host.

* :mod:`tpushim._jax._trace`: the Keras model's training-mode forward pass and its compiled loss,
  traced in TensorFlow on the global batch (padding rows weigh 0 in the loss and in
  BatchNormalization's statistics: the core's :mod:`tpushim._losses`, :mod:`tpushim._batchnorm`)
  and converted to a JAX function with ``tf2jax``.
* :mod:`tpushim._jax._optimizers`: the optimizer's update as tf-keras computes it (SGD with
  momentum / nesterov, Adam; legacy and v2 spellings), its slots under Keras's names.
* :mod:`tpushim._jax._step`: ``jax.value_and_grad`` of the converted loss, the update, the
  moving statistics, data parallel over every local device (``jax.sharding``: the global batch
  split in equal per-device shares, as TPUEstimator splits it), ``iterations_per_loop`` steps per
  compiled call, compiled once per shape.

Not yet an engine (:mod:`tpushim._engines` does not register it): the estimator that trains
from an input_fn with this step, writes stock's checkpoints and evaluates and predicts is the
next step. TensorFlow- and JAX-free at import, as every engine package is.
"""
