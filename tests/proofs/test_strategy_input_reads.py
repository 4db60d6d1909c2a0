"""The strategy engine reads the input as stock does: a feature whose shape the model declares
more fully than the input (``decode_png`` without a channel count) and a one-shot generator feed
(consumed by its first pass), each against stock on the same model, data and seed."""

import numpy as np
import pytest

ENGINE = {"mode": "cpu", "engine": "strategy", "quiet": True}
STOCK = {"mode": "off"}


def _image_model():
    import tensorflow as tf

    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(4)
    # A nested convolutional base, as a Keras application is: stock builds it on the model's
    # Input, so stock takes the unknown channel count (a Conv2D of the outer model would not).
    inner = tf.keras.Input((8, 8, 3))
    x = tf.keras.layers.Conv2D(2, 4, strides=4, activation="tanh")(inner)
    base = tf.keras.Model(inner, tf.keras.layers.Flatten()(x), name="base")
    image = tf.keras.Input((8, 8, 3), name="image")
    score = tf.keras.layers.Dense(1, activation="sigmoid", name="score")(base(image))
    model = tf.keras.Model(image, score)
    model.compile(tf.keras.optimizers.legacy.Adam(0.05), "binary_crossentropy", ["accuracy"])
    return model


@pytest.mark.slow
@pytest.mark.parametrize("features", ["dict", "tensor"])
def test_a_feature_the_model_declares_more_fully_as_stocks(tmp_path, features):
    """PNG images decoded without a channel count and resized to 8x8 -- a static shape of
    ``(8, 8, None)`` -- for an ``Input((8, 8, 3))``, in batches of 5 (a short last batch of 12):
    the engine's split failed on the unknown dimension ("Failed to convert elements of
    [1, -1, 8, 8, None] to Tensor"); it takes the model's shape, as the TPUEstimator path does.
    Weights, metrics and predictions equal stock's."""
    import tensorflow as tf
    import tfcases

    rng = np.random.RandomState(0)
    sizes = rng.randint(6, 14, (12, 2))
    labels = (np.arange(12) % 2).astype("float32").reshape(-1, 1)
    pngs = [
        tf.io.encode_png((rng.randint(0, 120, (*size, 3)) + 100 * label).astype("uint8")).numpy()
        for size, label in zip(sizes, labels[:, 0])
    ]

    def input_fn(with_labels=True, repeat=False):
        def make():
            def load(png, *label):
                image = tf.image.resize(tf.io.decode_png(png), [8, 8]) / 255.0
                image = {"image": image} if features == "dict" else image
                return (image, *label) if label else image

            slices = (pngs, labels) if with_labels else (pngs,)
            dataset = tf.data.Dataset.from_tensor_slices(slices).map(load)
            return (dataset.repeat() if repeat else dataset).batch(5)

        return make

    def run(patch, model_dir):
        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=5)
        estimator = tfcases.convert(model_dir, _image_model(), patch=patch, config=config)
        estimator.train(input_fn(repeat=True), steps=3)
        return (
            estimator,
            estimator.evaluate(input_fn()),
            list(estimator.predict(input_fn(with_labels=False))),
            tfcases.checkpoint_values(model_dir),
        )

    stock = run(STOCK, tmp_path / "stock")
    engine = run(ENGINE, tmp_path / "engine")
    assert len(stock[2]) == 12
    tfcases.assert_same(stock, engine)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, None])
def test_a_one_shot_generator_feed_is_predicted_whole(tmp_path, seed):
    """A prediction input over a Python iterator (a one-shot feed: a second pass finds it
    empty), batched by 8, without a static batch size: the engine read its first batch to learn
    the batch size, so predicted 16 of its 24 rows, from the 9th. It reads the size from the
    pipeline, as the TPUEstimator path does: every row, in stock's order, one input_fn call."""
    import tensorflow as tf
    import tfcases

    rows = np.random.RandomState(1).rand(24, 4).astype("float32")
    x, y = tfcases.data()

    def run(patch, model_dir):
        feed = iter(rows)
        calls = []

        def predict_input_fn():
            calls.append(1)
            return tf.data.Dataset.from_generator(
                lambda: feed, output_types=tf.float32, output_shapes=(4,)
            ).batch(8)

        config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=seed)
        estimator = tfcases.convert(model_dir, tfcases.sequential(), patch=patch, config=config)
        estimator.train(tfcases.dataset_input_fn(x, y), steps=2)
        predictions = list(estimator.predict(predict_input_fn))
        return predictions, len(calls)

    stock, stock_calls = run(STOCK, tmp_path / "stock")
    engine, engine_calls = run(ENGINE, tmp_path / "engine")
    assert (len(stock), stock_calls) == (24, 1)
    assert (len(engine), engine_calls) == (24, 1)
    for got, want in zip(engine, stock):
        np.testing.assert_allclose(got["probs"], want["probs"], atol=1e-5, rtol=0)
