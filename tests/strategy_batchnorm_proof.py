"""BatchNormalization on the strategy engine's 8 replicas, run as its own process (the logical
devices must be made before TensorFlow initialises): ``python strategy_batchnorm_proof.py DIR``
prints one JSON object.

20 examples in global batches of 12 (padded to 16: 2 rows a replica), trained 4 steps (two
epochs; each ends on a batch of 8, whose last 4 replicas hold padding only):

* ``synchronized``: a model with ``BatchNormalization(synchronized=True)`` (statistics summed
  across the replicas: the global batch's real rows, as stock's): the largest difference to stock
  of every weight (the moving statistics included), eval metric and prediction;
* ``padding``, per layer kind (2-D ``dense``, 4-D ``conv``: fused): each replica normalises over
  its own real rows, so the padding rows' values change nothing: the largest weight difference
  between the engine on the input as padded and on padding rows of other values, for the engine
  as it is and (``keras``, the negative control) for Keras's own BatchNormalization call; also
  for every variant (``variants``: renorm, momenta and epsilons, nested, TimeDistributed, frozen,
  ``training=False``, fused or not, channels first; ``ghost``: ``virtual_batch_size``);
* ``per_replica``, per layer kind: plain BatchNormalization against the TPUEstimator path's
  proven per-replica semantics (see :func:`per_replica`), and stock's evaluation and prediction
  from the weights the engine saved.

A helper run by tests/proofs/test_strategy_batchnorm.py, not a test module.
"""

import json
import os
import shutil
import sys

import eight_devices  # first: 8 logical CPU devices, before TensorFlow initialises
import numpy as np
import tensorflow as tf
import tfcases

from tpushim import _batchnorm, _padding

ROWS, BATCH, STEPS = 20, 12, 4
REPLICAS, PER = eight_devices.REPLICAS, 2  # a global batch padded to 16: 2 rows a replica
ENGINE = {"mode": "cpu", "engine": "strategy", "quiet": True}
#: the variants of BatchNormalization, one model each (tests/tfcases.py)
MODELS = {"variants": tfcases.batchnorm_variants, "ghost": tfcases.ghost_batchnorm}


def data(kind):
    rng = np.random.RandomState(0)
    shape = {"conv": (4, 4, 2), "variants": tfcases.BATCHNORM_VARIANTS_SHAPE}.get(kind, (4,))
    shape = (ROWS, *shape)
    x = (rng.randn(*shape) * 2 + 1).astype("float32")
    return x, rng.randint(0, 3, size=(ROWS, 1)).astype("int64")


def model(kind):
    if kind in MODELS:
        return MODELS[kind]()
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    norm = tf.keras.layers.experimental.SyncBatchNormalization
    if kind == "conv":
        layers = [
            tf.keras.layers.Conv2D(3, 2, input_shape=(4, 4, 2), name="conv"),
            tf.keras.layers.BatchNormalization(momentum=0.5, name="norm"),
            tf.keras.layers.Flatten(),
        ]
    else:
        layers = [
            tf.keras.layers.Dense(6, input_shape=(4,), name="hidden"),
            # The class, not synchronized=True: Keras's get_config drops that (stock's clone too).
            (norm if kind == "synchronized" else tf.keras.layers.BatchNormalization)(
                momentum=0.5, name="norm"
            ),
        ]
    m = tf.keras.Sequential([*layers, tf.keras.layers.Dense(3, activation="softmax", name="probs")])
    m.compile(
        tf.keras.optimizers.legacy.SGD(0.1),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return m


def run(kind, model_dir, patch, evaluate=False):
    x, y = data(kind)

    def train():  # each epoch ends on a short batch
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()

    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
    estimator = tfcases.convert(model_dir, model(kind), patch=patch, config=config)
    estimator.train(train, steps=STEPS)
    if not evaluate:
        return None, None, None, tfcases.checkpoint_values(model_dir)
    once = tfcases.dataset_input_fn(x, y, batch=BATCH)
    predictions = list(estimator.predict(tfcases.dataset_input_fn(x, batch=BATCH)))
    return estimator, estimator.evaluate(once), predictions, tfcases.checkpoint_values(model_dir)


def largest(a, b):
    return max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in a)


def other_padding(pad_batch):
    """pad_batch whose padding rows hold other values (100 + 7 x: finite, far from the data)."""

    def make(batch_size, **counting):
        pad = pad_batch(batch_size, **counting)

        def padded(*element):
            features, labels = pad(*element)
            x = features[_padding.FEATURES_KEY]
            real = tf.reshape(features[_padding.PADDING_KEY] > 0, [-1] + [1] * (x.shape.rank - 1))
            features = dict(features)
            features[_padding.FEATURES_KEY] = tf.where(real, x, 100.0 + 7.0 * x)
            return features, labels

        return padded

    return make


def checkpoint_keys(m):
    """{variable: its key in an object-based checkpoint} (``layer_with_weights-I/NAME``)."""
    keys = {}
    for i, layer in enumerate(layer for layer in m.layers if layer.weights):
        for w in layer.weights:
            name = w.name.split("/")[-1].split(":")[0]
            keys[w.ref()] = f"layer_with_weights-{i}/{name}/.ATTRIBUTES/VARIABLE_VALUE"
    return keys


def per_replica_dir(kind, root):
    return os.path.join(root, "per-replica", kind)


def per_replica(kind, root, made):
    """Plain BatchNormalization on 8 replicas against the TPUEstimator path's proven semantics
    (docs/contributing/proof.md, rung 2b): replica r's moving mean and variance are a single
    Keras model's stepped on replica r's real rows alone (unchanged on a replica of padding
    only), the trainable weights move by the replicas' SGD steps weighted by their real rows.
    The reference is Keras's own ``train_on_batch`` on each replica's slice; the checkpoint holds
    the mean of the replicas' moving statistics (on-read variables, TPUStrategy's aggregation).
    ``made``: the engine's ``run(kind, per_replica_dir(kind, root), ENGINE, evaluate=True)``
    (the engine as it is on the input as padded: ``padding``'s run too, made once for both)."""
    x, y = data(kind)
    model_dir = per_replica_dir(kind, root)
    _, metrics, predictions, got = made
    # Evaluation and prediction from those weights: stock's, on a copy of the model_dir.
    shutil.copytree(model_dir, model_dir + "-stock")
    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
    stock = tfcases.convert(model_dir + "-stock", model(kind), patch={"mode": "off"}, config=config)
    stock_metrics = stock.evaluate(tfcases.dataset_input_fn(x, y, batch=BATCH))
    stock_predictions = list(stock.predict(tfcases.dataset_input_fn(x, batch=BATCH)))
    ref = model(kind)
    keys = checkpoint_keys(ref)
    norm = ref.get_layer("norm")
    moving = [norm.moving_mean, norm.moving_variance]
    trainable = list(ref.trainable_weights)
    weights = [w.numpy() for w in trainable]
    replicas = [[v.numpy() for v in moving] for _ in range(REPLICAS)]
    for step in range(STEPS):
        start = (step % 2) * BATCH
        rows = min(BATCH, ROWS - start)
        step_weights = [w.copy() for w in weights]
        for r in range(REPLICAS):
            lo, hi = start + PER * r, min(start + PER * (r + 1), start + rows)
            if hi <= lo:  # padding only
                continue
            for v, value in zip(trainable + moving, weights + replicas[r]):
                v.assign(value)
            ref.train_on_batch(x[lo:hi], y[lo:hi])
            replicas[r] = [v.numpy() for v in moving]
            for i, v in enumerate(trainable):
                step_weights[i] += (hi - lo) / rows * (v.numpy() - weights[i])
        weights = step_weights
    want = {keys[v.ref()]: w for v, w in zip(trainable, weights)}
    mean = {keys[v.ref()]: np.mean([r[i] for r in replicas], 0) for i, v in enumerate(moving)}
    first = {keys[v.ref()]: replicas[0][i] for i, v in enumerate(moving)}
    return {
        "metrics": max(abs(float(stock_metrics[k]) - float(metrics[k])) for k in stock_metrics),
        "predictions": max(
            float(np.max(np.abs(a[k] - b[k])))
            for a, b in zip(stock_predictions, predictions)
            for k in a
        ),
        "trainable": largest(want, got),
        "moving": largest(mean, got),
        # Negative control: one replica's statistics (replica 0's) are not what was saved.
        "replica_0": largest(first, got),
        "replicas_differ": largest(first, {k: replicas[1][i] for i, k in enumerate(first)}),
    }


def main(root):
    out = {"replicas": len(tf.config.list_logical_devices("CPU")), "tensorflow": tf.__version__}
    stock = run("synchronized", os.path.join(root, "sync-stock"), {"mode": "off"}, True)
    engine = run("synchronized", os.path.join(root, "sync-engine"), ENGINE, True)
    weights = largest(stock[3], engine[3])
    metrics = max(abs(float(stock[1][k]) - float(engine[1][k])) for k in stock[1])
    predictions = max(
        float(np.max(np.abs(a[k] - b[k]))) for a, b in zip(stock[2], engine[2]) for k in a
    )
    out["synchronized"] = {
        "weights": weights,
        "metrics": metrics,
        "predictions": predictions,
        "names_equal": set(stock[3]) == set(engine[3]),
        "moving": sorted(k for k in stock[3] if "moving_mean" in k),
    }
    out["padding"] = {}
    pad_batch, real_rows_call = _padding.pad_batch, _batchnorm.real_rows_call
    as_is = {}  # the plain layers' engine as it is, evaluated and predicted too: per_replica's
    for kind in ("dense", "conv", *MODELS):
        got = {}
        # The negative control on the plain layers only: the variants' run is the engine's.
        for variant in ("engine", "keras") if kind not in MODELS else ("engine",):
            if variant == "keras":  # Keras's own call: the padding rows in the statistics
                _batchnorm.real_rows_call = lambda *args: None
            try:
                if variant == "engine" and kind not in MODELS:
                    as_is[kind] = run(kind, per_replica_dir(kind, root), ENGINE, evaluate=True)
                    padded = as_is[kind][3]
                else:
                    padded = run(kind, os.path.join(root, kind, variant, "a"), ENGINE)[3]
                _padding.pad_batch = other_padding(pad_batch)
                try:
                    other = run(kind, os.path.join(root, kind, variant, "b"), ENGINE)[3]
                finally:
                    _padding.pad_batch = pad_batch
            finally:
                _batchnorm.real_rows_call = real_rows_call
            got[variant] = largest(padded, other)
        out["padding"][kind] = got
    out["per_replica"] = {kind: per_replica(kind, root, as_is[kind]) for kind in ("dense", "conv")}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
