"""BatchNormalization on the strategy engine's padded batches: the batch statistics (and the
moving mean and variance) over each replica's real rows, as stock's over its short batch."""

import pytest

ROWS, BATCH = 20, 8  # a short last batch of 4, padded on the engine


def _data(kind, seed=0):
    import numpy as np
    import tfcases

    rng = np.random.RandomState(seed)
    shape = {"conv": (4, 4, 2), "variants": tfcases.BATCHNORM_VARIANTS_SHAPE}.get(kind, (4,))
    shape = (ROWS, *shape)
    x = (rng.randn(*shape) * 2 + 1).astype("float32")
    return x, rng.randint(0, 3, size=(ROWS, 1)).astype("int64")


def _model(kind):
    """A classifier with BatchNormalization on 2-D inputs (not fused) or 4-D ones (fused), with
    momentum 0.5 so that the moving statistics move visibly; ``variants``, ``ghost``: every
    other kind of layer (tests/tfcases.py)."""
    import tensorflow as tf
    import tfcases

    if kind == "variants":
        return tfcases.batchnorm_variants()
    if kind == "ghost":
        return tfcases.ghost_batchnorm()
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    norm = tf.keras.layers.experimental.SyncBatchNormalization
    if kind != "conv":
        layers = [
            tf.keras.layers.Dense(6, input_shape=(4,), name="hidden"),
            # The class, not synchronized=True: Keras's get_config drops that (stock's clone too).
            (norm if kind == "synchronized" else tf.keras.layers.BatchNormalization)(
                momentum=0.5, name="norm"
            ),
        ]
    else:
        layers = [
            tf.keras.layers.Conv2D(3, 2, input_shape=(4, 4, 2), name="conv"),
            tf.keras.layers.BatchNormalization(momentum=0.5, name="norm"),
            tf.keras.layers.Flatten(),
        ]
    model = tf.keras.Sequential(
        [*layers, tf.keras.layers.Dense(3, activation="softmax", name="probs")]
    )
    model.compile(
        tf.keras.optimizers.legacy.SGD(0.1),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dense", "conv", "synchronized", "variants", "ghost"])
def test_a_short_batch_normalizes_over_its_real_rows_as_stock(tmp_path, kind):
    """20 examples in batches of 8, trained 6 steps (two epochs: each ends on a short batch of
    4, which the engine pads): weights (the moving mean and variance included), metrics and
    predictions equal stock's (on TensorFlow >= 2.16: tpushim's own estimator API, stock
    2.15's path). The padding rows entered the batch statistics before. ``variants``: renorm
    with clipping, other momenta and epsilons, a nested model, TimeDistributed (the engine
    failed its XLA check: the padding weight did not fit the folded rows), frozen,
    ``training=False``, fused or not, channels first; ``ghost``: ``virtual_batch_size`` in an
    unbuilt Sequential (the engine failed on an unbuilt Sequential: AttributeError)."""
    import tensorflow as tf
    import tfcases

    x, y = _data(kind)

    def train():  # the short batch ends every epoch
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()

    once = tfcases.dataset_input_fn(x, y, batch=BATCH)

    def run(patch, model_dir):
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
        estimator = tfcases.convert(model_dir, _model(kind), patch=patch, config=config)
        estimator.train(train, steps=6)
        return (
            estimator,
            estimator.evaluate(once),
            list(estimator.predict(tfcases.dataset_input_fn(x, batch=BATCH))),
            tfcases.checkpoint_values(model_dir),
        )

    stock = run({"mode": "off"}, tmp_path / "stock")
    engine = run({"mode": "cpu", "engine": "strategy", "quiet": True}, tmp_path / "engine")
    moving = [k for k in stock[3] if "moving_mean" in k]
    assert moving, sorted(stock[3])  # the moving statistics are among the weights compared
    tfcases.assert_same(stock, engine)


@pytest.fixture(scope="module")
def eight(tmp_path_factory):
    import os

    import procs

    root = tmp_path_factory.mktemp("batchnorm")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return procs.proof(os.path.join(here, "strategy_batchnorm_proof.py"), root)


@pytest.mark.slow
def test_synchronized_on_eight_replicas_as_stock(eight):
    """SyncBatchNormalization on 8 replicas (tests/strategy_batchnorm_proof.py: batches of 12
    padded to 16, a short one of 8 leaving 4 replicas padding only): its sums across the
    replicas are over the global batch's real rows, stock's statistics: weights (moving mean and
    variance included), metrics and predictions equal stock's."""
    assert eight["replicas"] == 8
    got = eight["synchronized"]
    assert got["names_equal"] and got["moving"], got
    assert got["weights"] < 1e-5, got
    assert got["metrics"] < 1e-5, got
    assert got["predictions"] < 1e-5, got


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dense", "conv"])
def test_padding_rows_change_nothing_on_eight_replicas(eight, kind):
    """Each replica normalises over its own real rows: the engine trained on padding rows of
    other values has the same weights (moving statistics included). Negative control: with
    Keras's own BatchNormalization call the padding rows move them."""
    got = eight["padding"][kind]
    assert got["engine"] < 1e-6, got
    assert got["keras"] > 1e-2, got


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["variants", "ghost"])
def test_padding_rows_change_no_variant_on_eight_replicas(eight, kind):
    """Every other kind of BatchNormalization (renorm, momenta and epsilons, nested,
    TimeDistributed, frozen, ``training=False``, fused or not, channels first; ghost batches)
    on 8 replicas: padding rows of other values leave every weight as it was."""
    assert eight["padding"][kind]["engine"] < 1e-6, eight["padding"][kind]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dense", "conv"])
def test_plain_batchnorm_on_eight_replicas_is_per_replica_as_the_tpuestimator_path(eight, kind):
    """Plain BatchNormalization on 8 replicas, 4 steps of padded batches (a short one leaving 4
    replicas padding only), against what the TPUEstimator path proves for it (rung 2b):
    replica r's moving statistics are Keras's on replica r's real rows alone, the trainable
    weights move by the replicas' steps weighted by their real rows. The checkpoint holds the
    replicas' mean of the moving statistics (TPUStrategy's on-read aggregation), and stock's
    estimator evaluates and predicts from it as the engine does. Negative control: replica
    0's statistics alone are not what was saved."""
    got = eight["per_replica"][kind]
    assert got["trainable"] < 1e-5, got
    assert got["moving"] < 1e-5, got
    assert got["metrics"] < 1e-5, got
    assert got["predictions"] < 1e-5, got
    assert got["replica_0"] > 1e-2 and got["replicas_differ"] > 1e-2, got
