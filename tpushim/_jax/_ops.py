"""TensorFlow ops that Keras's training graphs use and ``tf2jax`` has no JAX for, registered
with ``tf2jax`` as TensorFlow's kernels compute them (their values and their gradients).

* ``SoftmaxCrossEntropyWithLogits``: Keras's ``categorical_crossentropy`` on a softmax output
  reads the softmax's logits and calls ``tf.nn.softmax_cross_entropy_with_logits``. Its kernel
  returns (loss, backprop): ``-sum(labels * log_softmax(logits))`` and ``softmax(logits) -
  labels``; TensorFlow's gradient of the loss is ``backprop`` times the upstream gradient (for
  the logits) and ``-log_softmax(logits)`` times it (for the labels), whatever the labels sum
  to: so is this one's.

* ``PlaceholderWithDefault``: ``tf.vectorized_map`` (the step's per-row losses) feeds its
  loop's index through one, fed nothing: its value is its input's.

* ``DivNoNan`` (replacing ``tf2jax``'s): its gradient does not sum over the dimensions the
  division broadcast, so JAX rejects it where the divisor broadcasts (an embedding column's
  ``mean`` combiner divides [batch, dimension] by [batch, 1]). This one is ``x / y`` with 0
  where ``y`` is 0, differentiated by JAX: ``dx = g / y`` and ``dy = -g x / y**2`` where ``y``
  is not 0 and 0 where it is, TensorFlow's gradient, summed over what broadcast.

Registered (DivNoNan replaced) once, at the first import (``tf2jax``'s op table is the process's).
"""

import jax
import jax.numpy as jnp
from tf2jax._src import ops as _tf2jax_ops  # its own registry (tf2jax.experimental's way)


@jax.custom_vjp
def softmax_cross_entropy(logits, labels):
    return -jnp.sum(labels * jax.nn.log_softmax(logits, axis=-1), axis=-1)


def _forward(logits, labels):
    log_softmax = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(labels * log_softmax, axis=-1), (log_softmax, labels)


def _backward(saved, g):
    log_softmax, labels = saved
    g = g[..., None]
    return g * (jnp.exp(log_softmax) - labels), g * -log_softmax


softmax_cross_entropy.defvjp(_forward, _backward)


def _softmax_cross_entropy_with_logits(proto):
    del proto  # attrs: T

    def kernel(features, labels):
        loss = softmax_cross_entropy(features, labels)
        return loss, jax.nn.softmax(features, axis=-1) - labels

    return kernel


if "SoftmaxCrossEntropyWithLogits" not in _tf2jax_ops._jax_ops:
    _tf2jax_ops.register_operation("SoftmaxCrossEntropyWithLogits")(
        _softmax_cross_entropy_with_logits
    )


def _placeholder_with_default(proto):
    del proto  # attrs: dtype, shape
    return lambda value: value


if "PlaceholderWithDefault" not in _tf2jax_ops._jax_ops:
    _tf2jax_ops.register_operation("PlaceholderWithDefault")(_placeholder_with_default)


def div_no_nan(x, y):
    zero = y == 0
    safe = jnp.where(zero, jnp.ones_like(y), y)
    return jnp.where(zero, jnp.zeros_like(x / safe), x / safe)


def _div_no_nan(proto):
    del proto  # attrs: T
    return div_no_nan


_tf2jax_ops._jax_ops["DivNoNan"] = _div_no_nan
