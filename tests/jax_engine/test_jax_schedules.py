"""A decaying learning rate and clipped gradients on the JAX engine, through
``model_to_estimator`` against stock's estimator (TensorFlow 2.21's estimator API) in the same
process: a ``LearningRateSchedule`` (its own ``__call__`` converted to JAX, evaluated at the
optimizer's ``iterations``, which stock's clone makes the global step), the legacy optimizers'
``decay`` and ``clipnorm`` / ``clipvalue`` / ``global_clipnorm``. Two ``train()`` calls, the
second resuming from the first's checkpoint: a piecewise rate whose boundary falls in the
second call shows the step counted on across the restart. The update's arithmetic, optimizer by
optimizer, is in test_jax_optimizers.py; here: the clipping of a gathered weight's gradient,
refused by name.
"""

import jax_scripts
import pytest
from jax_scripts import ROOT, eight_devices, scripts_started  # noqa: F401 (scripts_started: the scripts' run, in the background)

pytestmark = pytest.mark.jax

jax = eight_devices()

import jax_sparse
import tensorflow as tf

from tpushim import ConversionError
from tpushim._jax import _step

#: Stock's path and the engine's, one model per case, two train() calls of 3 steps each: every
#: floating value of the last checkpoint (weights, slots) by name.
DECAYED = """
import json, os, sys
import tpushim; tpushim.patch()
import numpy as np, tensorflow as tf
rng = np.random.RandomState(0)
data = (rng.randn(64, 4).astype(np.float32), rng.randn(64, 1).astype(np.float32))
k, S = tf.keras.optimizers, tf.keras.optimizers.schedules
out = {}
for run, scope in (("engine", dict(mode="cpu", engine="jax")), ("stock", {})):
    for case, optimizer in (
        ("adam-decay-clipnorm", lambda: k.legacy.Adam(0.05, decay=0.2, clipnorm=0.1)),
        ("sgd-exponential-staircase-clipvalue", lambda: k.SGD(
            S.ExponentialDecay(0.2, 2, 0.5, staircase=True), momentum=0.9, clipvalue=0.05)),
        ("rmsprop-piecewise-global-clipnorm", lambda: k.legacy.RMSprop(
            S.PiecewiseConstantDecay([4], [0.02, 0.002]), global_clipnorm=0.1)),
    ):
        tf.keras.utils.set_random_seed(1)
        x = tf.keras.Input((4,), name="x")
        h = tf.keras.layers.Dense(3, activation="tanh", name="h")(x)
        m = tf.keras.Model(x, tf.keras.layers.Dense(1, name="y")(h))
        m.compile(optimizer(), "mse")
        model_dir = os.path.join(sys.argv[1], run, case)
        config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=1)
        with tpushim.patched(**scope):
            est = tf.keras.estimator.model_to_estimator(keras_model=m, config=config)
        for _ in range(2):  # the second call resumes from the first's checkpoint
            est.train(lambda: tf.data.Dataset.from_tensor_slices(data).batch(16).repeat(), steps=3)
        reader = tf.train.load_checkpoint(model_dir)
        values = {
            name: reader.get_tensor(name).ravel().tolist()
            for name, dtype in reader.get_variable_to_dtype_map().items() if dtype.is_floating}
        out.setdefault(run, {})[case] = values
print("RESULT " + json.dumps(out))
"""


def test_schedules_decay_and_clipping_train_as_stock_across_a_resumed_run(tmp_path):
    jax_scripts.checkpoints_as_stocks(DECAYED, tmp_path, 3)


REFUSAL = "does not clip the gradient of a weight the model gathers rows of"


def test_clipping_a_gathered_weights_gradient_is_refused_by_name():
    model = jax_sparse.model("adam")  # an Embedding's table, only gathered
    model.compile(tf.keras.optimizers.legacy.Adam(0.05, clipnorm=1.0), "mse")
    trainer = _step.Trainer(model, jax_sparse.BATCH, devices=jax.local_devices()[:8])
    with pytest.raises(ConversionError, match=REFUSAL):
        trainer.check(jax_sparse.batches()[0])
