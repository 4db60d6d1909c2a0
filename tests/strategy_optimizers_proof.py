"""Rung 2b for the strategy engine's optimizers, run as its own process (the logical devices
must be made before TensorFlow initialises): ``python strategy_optimizers_proof.py DIR`` prints
one JSON object.

A model compiled with each optimizer legacy scripts use -- every ``tf.compat.v1.train``
optimizer Keras wraps in a ``TFOptimizer`` (Adam, GradientDescent, Momentum, RMSProp, Adagrad,
Ftrl), one whose rate is ``tf.compat.v1.train.exponential_decay`` of the global step (a callable,
the form stock trains), the strings ``'adam'`` and ``'sgd'``, and a Keras ``LearningRateSchedule``
-- trained 5 steps by the stock estimator and by the strategy engine on 8 logical CPU devices
and on 1 (45 examples in global batches of 10, as tests/strategy_proof.py). Reported: the
largest difference to stock of every checkpoint value (weights, slots, Adam's ``beta1_power``),
and on 8 replicas of every eval metric and prediction (on 1 replica too, and stock's estimator
reading the engine's checkpoint and the 5 steps trained in two calls, 3 and 2, for two
``tf.compat.v1.train`` optimizers: evaluation and
prediction do not depend on the optimizer, and every estimator costs time); one replica's step
with the optimizer's apply compiled with XLA. Negative controls: the decaying rates stepped per
replica (the schedule at 8 x the global step, as if each replica advanced the step), and
GradientDescent's gradients summed over the replicas.

On TensorFlow >= 2.16 (no stock estimator) stock is stock TF 2.15's numbers, recorded by
``python strategy_optimizers_proof.py --record tests/reference/strategy_optimizers_tf215.json
DIR`` in a TF 2.15 venv (which also prints the comparison).

A helper run by tests/proofs/test_strategy_optimizers.py, not a test module.
"""

import json
import os
import sys

import strategy_proof as proof  # first: it imports eight_devices (the 8 logical devices)
import tensorflow as tf

from tpushim._strategy import loss as _strategy_loss
from tpushim._strategy import step as _strategy_step

v1 = tf.compat.v1.train


def _decaying():  # stock evaluates the callable in its graph, where the global step is its own
    return v1.exponential_decay(0.1, v1.get_or_create_global_step(), 2, 0.5, staircase=True)


#: What ``model.compile(optimizer=...)`` is given (made afresh for every model).
OPTIMIZERS = {
    "tf1_adam": lambda: v1.AdamOptimizer(0.01),
    "tf1_sgd": lambda: v1.GradientDescentOptimizer(0.1),
    "tf1_momentum": lambda: v1.MomentumOptimizer(0.05, 0.9, use_nesterov=True),
    "tf1_rmsprop": lambda: v1.RMSPropOptimizer(0.01, momentum=0.5),
    "tf1_adagrad": lambda: v1.AdagradOptimizer(0.1),
    "tf1_ftrl": lambda: v1.FtrlOptimizer(0.1, l1_regularization_strength=0.01),
    "tf1_decay": lambda: v1.GradientDescentOptimizer(_decaying),
    "adam_string": lambda: "adam",
    "sgd_string": lambda: "sgd",
    "keras_schedule": lambda: tf.keras.optimizers.legacy.SGD(
        tf.keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5, staircase=True), momentum=0.9
    ),
}
SCHEDULES = ("tf1_decay", "keras_schedule")


def model(kind):
    tf.keras.utils.set_random_seed(1)
    m = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(5, input_shape=(4,), activation="tanh", name="hidden"),
            tf.keras.layers.Dense(1, name="out"),
        ]
    )
    m.compile(OPTIMIZERS[kind](), loss="mse", metrics=["mae"])
    return m


RECORD = os.path.join(proof.HERE, "reference", "strategy_optimizers_tf215.json")


def stock_run(kind, root):
    if proof.NO_STOCK:
        return proof.eight_devices.recorded(RECORD, kind)
    return proof.run(proof.stock_estimator(model(kind), os.path.join(root, kind, "stock")))


def _recorded(stock):
    metrics, predictions, values = stock
    return {
        "metrics": metrics,
        "predictions": predictions.tolist(),
        "values": {n: v.tolist() for n, v in values.items()},
    }


class _PerReplica(tf.keras.optimizers.schedules.LearningRateSchedule):
    """A schedule read at ``replicas`` x the step: the negative control's."""

    def __init__(self, schedule, replicas):
        self.schedule, self.replicas = schedule, replicas

    def __call__(self, step):
        return self.schedule(step * self.replicas)

    def get_config(self):
        return {}


def stepped_per_replica(replicas):
    """The engine with its decaying rates stepped once per replica (8 per global step)."""
    bind, make = _strategy_step.bind_global_step, _strategy_step._optimizer

    def bind_per_replica(step):
        bind(tf.convert_to_tensor(step) * replicas)

    def optimizer_per_replica(user, step, keras_model, plan):
        optimizer = make(user, step, keras_model, plan)
        rate = getattr(optimizer, "_hyper", {}).get("learning_rate")
        if isinstance(rate, tf.keras.optimizers.schedules.LearningRateSchedule):
            optimizer._set_hyper("learning_rate", _PerReplica(rate, replicas))
        return optimizer

    return {"bind_global_step": bind_per_replica, "_optimizer": optimizer_per_replica}


#: The engine's module that looks each replaceable name up.
_LOOKED_UP_IN = {
    "bind_global_step": _strategy_step,
    "_optimizer": _strategy_step,
    "replica_loss": _strategy_loss,
}


def patched_train(replacements, estimator):
    """The checkpoint values after training with the engine's ``replacements`` in place."""
    originals = {name: getattr(_LOOKED_UP_IN[name], name) for name in replacements}
    for name, value in replacements.items():
        setattr(_LOOKED_UP_IN[name], name, value)
    try:
        return trained(estimator)
    finally:
        for name, value in originals.items():
            setattr(_LOOKED_UP_IN[name], name, value)


#: (None, None, checkpoint values) after STEPS training steps: the optimizer decides these;
#: evaluation and prediction are the engine's whatever it trained with.
trained = proof.trained


def xla_apply(plan):
    """One replica's step with the optimizer's apply, compiled with XLA (not run): None, or the
    error."""
    keras_model = tf.keras.models.clone_model(plan.keras_model)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    optimizer = _strategy_step._optimizer(plan.optimizer, step, keras_model, plan)
    loss_fn = _strategy_loss._loss_objects(plan.keras_model, plan.custom_objects)[0][1]

    def one_step(x, y):
        _strategy_step.bind_global_step(step)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, keras_model(x, training=True))
        grads = tape.gradient(loss, keras_model.trainable_variables)
        optimizer.apply_gradients(zip(grads, keras_model.trainable_variables))
        return loss

    try:
        tf.function(one_step, jit_compile=True).experimental_get_compiler_ir(
            tf.zeros([2, 4]), tf.zeros([2, 1])
        )(stage="hlo")
        return None
    except Exception as e:  # reported: the test shows it
        return f"{type(e).__name__}: {e}"[:1000]


def resumed(estimator):
    """(None, None, checkpoint values) after the same 5 steps in two ``train()`` calls, 3 and 2
    (the second restores the first's weights, slots, non-slot variables and global step)."""
    for rows in (slice(0, 3 * proof.BATCH), slice(3 * proof.BATCH, None)):
        data = (proof.X[rows], proof.Y[rows])
        estimator.train(lambda d=data: tf.data.Dataset.from_tensor_slices(d).batch(proof.BATCH))
    return None, None, proof.variable_values(estimator)


#: Where stock's estimator also evaluates the engine's model_dir (a tf1 optimizer's object graph).
READ_BACK = ("tf1_adam", "tf1_decay")


def main(root, record_to=None):
    """Prints the comparison; with ``record_to``, writes stock's numbers there (TF 2.15)."""
    out = {"tensorflow": tf.__version__, "stock_from": RECORD if proof.NO_STOCK else "live"}
    recorded = {"tensorflow": tf.__version__}
    for kind in OPTIMIZERS:
        stock = stock_run(kind, root)
        recorded[kind] = _recorded(stock)
        d = os.path.join(root, kind)
        eight = proof.engine(model(kind), os.path.join(d, "eight"))
        out[kind] = {
            "replicas": eight.strategy.num_replicas_in_sync,
            "eight": proof.differences(proof.run(eight), stock),
            "one": proof.differences(
                (proof.run if kind in READ_BACK else trained)(
                    proof.engine(model(kind), os.path.join(d, "one"), 1)
                ),
                stock,
            ),
            "xla": xla_apply(eight._tpushim_plan),
        }
        if kind in READ_BACK:
            reader = proof.stock_estimator(model(kind), os.path.join(d, "eight"))
            read = {k: float(v) for k, v in reader.evaluate(proof.train_input).items()}
            out[kind]["stock_reads_engine"] = max(
                abs(read[k] - v) / max(1.0, abs(v)) for k, v in stock[0].items()
            )
            again = proof.engine(model(kind), os.path.join(d, "resumed"))
            out[kind]["resumed"] = proof.differences(resumed(again), stock)
        replicas = out[kind]["replicas"]
        if kind in SCHEDULES:
            control = proof.engine(model(kind), os.path.join(d, "per_replica"))
            out[kind]["per_replica"] = proof.differences(
                patched_train(stepped_per_replica(replicas), control), stock
            )
        if kind == "tf1_sgd":
            _, wrong = proof.broken("mean")
            control = proof.engine(model(kind), os.path.join(d, "summed"))
            out[kind]["summed"] = proof.differences(
                patched_train({"replica_loss": wrong}, control), stock
            )
    if record_to:
        with open(record_to, "w") as f:
            json.dump(recorded, f, indent=1, sort_keys=True)
            f.write("\n")
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--record":
        main(sys.argv[3], record_to=sys.argv[2])
    else:
        main(sys.argv[1])
