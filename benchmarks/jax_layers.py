# ruff: noqa: PLW0108 (each family a lambda: its layers made inside, after the seed)
"""Which Keras 2 layers legacy scripts use convert to the JAX engine's step: one small model per
layer family (a functional model ending in a Dense, mse), its training step traced and converted
as the engine converts it (:func:`jax_coverage.measure`: the loss and ``jax.grad`` of it against
TensorFlow's loss and ``GradientTape``'s gradients). Needs jax and tf2jax (the ``jax`` extra).
Prints one table (docs/contributing/jax-engine.md holds it):

    python benchmarks/jax_layers.py [FAMILY ...]
"""

import os
import sys

ROWS = 4


def _model(inputs, body, classes=None):
    import tensorflow as tf

    x = inputs if isinstance(inputs, list) else [inputs]
    out = body(*x)
    if len(out.shape) > 2:
        out = tf.keras.layers.Flatten()(out)
    model = tf.keras.Model(x, tf.keras.layers.Dense(1, name="out")(out))
    model.compile("sgd", "mse")
    return model


def _doubled_until_large(x):
    """A ``tf.while_loop`` whose number of iterations its values decide."""
    import tensorflow as tf

    return tf.while_loop(lambda y: tf.reduce_max(tf.abs(y)) < 10.0, lambda y: y * 2, [x])[0]


def families():
    """Family name -> a function building (model, features, labels)."""
    import numpy as np
    import tensorflow as tf

    L = tf.keras.layers
    rng = np.random.RandomState(0)

    def data(*shapes, ints=None):
        feats = [rng.uniform(-1, 1, (ROWS, *s)).astype("float32") for s in shapes]
        if ints:
            feats = [rng.randint(1, ints, (ROWS, *s)).astype("int64") for s in shapes]
        return feats, [rng.uniform(-1, 1, (ROWS, 1)).astype("float32")]

    def one(shape, body, ints=None, dtype="float32"):
        def build():
            tf.keras.utils.set_random_seed(0)
            model = _model(tf.keras.Input(shape, dtype="int64" if ints else dtype), body)
            return (model, *data(shape, ints=ints))

        return build

    seq = (6, 3)
    img = (6, 6, 2)
    vol = (4, 4, 4, 2)
    table = {
        "Conv1D": one(seq, lambda x: L.Conv1D(2, 3, padding="same", dilation_rate=2)(x)),
        "Conv2D": one(img, lambda x: L.Conv2D(2, 3, strides=2)(x)),
        "Conv3D": one(vol, lambda x: L.Conv3D(2, 3, strides=2, padding="same")(x)),
        "Conv1DTranspose": one(seq, lambda x: L.Conv1DTranspose(2, 3, strides=2)(x)),
        "Conv2DTranspose": one(img, lambda x: L.Conv2DTranspose(2, 3, strides=2)(x)),
        "Conv3DTranspose": one(vol, lambda x: L.Conv3DTranspose(2, 2, strides=2)(x)),
        "SeparableConv1D": one(seq, lambda x: L.SeparableConv1D(2, 3)(x)),
        "SeparableConv2D": one(img, lambda x: L.SeparableConv2D(2, 3)(x)),
        "DepthwiseConv1D": one(seq, lambda x: L.DepthwiseConv1D(3)(x)),
        "DepthwiseConv2D": one(img, lambda x: L.DepthwiseConv2D(3, depth_multiplier=2)(x)),
        "LSTM": one(seq, lambda x: L.LSTM(4)(x)),
        "LSTM(unroll=True)": one(seq, lambda x: L.LSTM(4, unroll=True)(x)),
        "GRU": one(seq, lambda x: L.GRU(4, return_sequences=True)(x)),
        "SimpleRNN": one(seq, lambda x: L.SimpleRNN(4)(x)),
        "Bidirectional(LSTM)": one(seq, lambda x: L.Bidirectional(L.LSTM(3))(x)),
        "Embedding(mask_zero)+LSTM": one(
            (5,), lambda x: L.LSTM(3)(L.Embedding(7, 4, mask_zero=True)(x)), ints=7
        ),
        "Masking+GRU": one(seq, lambda x: L.GRU(3)(L.Masking(0.5)(x))),
        "stacked LSTM, GRU(go_backwards)": one(
            seq, lambda x: L.GRU(3, go_backwards=True)(L.LSTM(4, return_sequences=True)(x))
        ),
        "LSTM(dropout, recurrent_dropout)": one(
            seq, lambda x: L.LSTM(4, dropout=0.2, recurrent_dropout=0.2)(x)
        ),
        "Embedding(mask_zero)+Bidirectional(LSTM, GRU(go_backwards))+SimpleRNN": one(
            (5,),
            lambda x: L.SimpleRNN(2)(
                L.Bidirectional(
                    L.LSTM(2, return_sequences=True),
                    backward_layer=L.GRU(2, return_sequences=True, go_backwards=True),
                )(L.Embedding(7, 3, mask_zero=True)(x))
            ),
            ints=7,
        ),
        "ConvLSTM2D": one((3, 4, 4, 2), lambda x: L.ConvLSTM2D(2, 3, padding="same")(x)),
        "tf.while_loop (a Lambda's)": one(seq, lambda x: L.Lambda(_doubled_until_large)(x)),
        "Attention": one(seq, lambda x: L.Attention()([x, x])),
        "MultiHeadAttention": one(seq, lambda x: L.MultiHeadAttention(2, 4)(x, x)),
        "LayerNormalization": one(seq, lambda x: L.LayerNormalization()(x)),
        "UpSampling1D": one(seq, lambda x: L.UpSampling1D(2)(x)),
        "UpSampling2D": one(img, lambda x: L.UpSampling2D(2)(x)),
        "UpSampling2D(bilinear)": one(
            img, lambda x: L.UpSampling2D(2, interpolation="bilinear")(x)
        ),
        "UpSampling3D": one(vol, lambda x: L.UpSampling3D(2)(x)),
        "Cropping1D": one(seq, lambda x: L.Cropping1D(1)(x)),
        "Cropping2D": one(img, lambda x: L.Cropping2D(1)(x)),
        "Cropping3D": one(vol, lambda x: L.Cropping3D(1)(x)),
        "ZeroPadding1D": one(seq, lambda x: L.ZeroPadding1D(1)(x)),
        "ZeroPadding2D": one(img, lambda x: L.ZeroPadding2D(1)(x)),
        "ZeroPadding3D": one(vol, lambda x: L.ZeroPadding3D(1)(x)),
        "MaxPooling1D": one(seq, lambda x: L.MaxPooling1D(2)(x)),
        "MaxPooling2D": one(img, lambda x: L.MaxPooling2D(2)(x)),
        "MaxPooling3D": one(vol, lambda x: L.MaxPooling3D(3, 2, padding="same")(x)),
        "AveragePooling1D": one(seq, lambda x: L.AveragePooling1D(2)(x)),
        "AveragePooling2D": one(img, lambda x: L.AveragePooling2D(2)(x)),
        "AveragePooling3D": one(vol, lambda x: L.AveragePooling3D(3, 2, padding="same")(x)),
        "GlobalMaxPooling1D": one(seq, lambda x: L.GlobalMaxPooling1D()(x)),
        "GlobalMaxPooling2D": one(img, lambda x: L.GlobalMaxPooling2D()(x)),
        "GlobalMaxPooling3D": one(vol, lambda x: L.GlobalMaxPooling3D()(x)),
        "GlobalAveragePooling1D": one(seq, lambda x: L.GlobalAveragePooling1D()(x)),
        "GlobalAveragePooling2D": one(img, lambda x: L.GlobalAveragePooling2D()(x)),
        "GlobalAveragePooling3D": one(vol, lambda x: L.GlobalAveragePooling3D()(x)),
        "Embedding": one((5,), lambda x: L.Embedding(7, 4)(x), ints=7),
        "TimeDistributed(Dense)": one(seq, lambda x: L.TimeDistributed(L.Dense(2))(x)),
        "Resizing": one(img, lambda x: L.Resizing(4, 4)(x)),
        "Rescaling": one(img, lambda x: L.Rescaling(1 / 255.0, offset=-0.5)(x)),
        "Normalization": one(seq, lambda x: L.Normalization(mean=0.2, variance=2.0)(x)),
        "Hashing": one((5,), lambda x: L.Embedding(8, 2)(L.Hashing(8)(x)), ints=50),
        "Discretization": one(
            (5,), lambda x: L.Embedding(4, 2)(L.Discretization([-0.5, 0.0, 0.5])(x))
        ),
        "CategoryEncoding": one((5,), lambda x: L.CategoryEncoding(7, "multi_hot")(x), ints=7),
    }
    return table


def measure(name):
    """The table's row for one family: jax_coverage.measure's."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax_coverage

    model, features, labels = families()[name]()
    return jax_coverage.measure(model, (features, labels))


def main():
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras: tf-keras, as the engine's
    names = sys.argv[1:] or list(families())
    print(f"{'layer':28} {'step':10} {'loss diff':>9} {'grad diff':>9}  why")
    for name in names:
        row = measure(name)
        ok = row.get("step") == "converts"
        print(
            f"{name:28} {'converts' if ok else 'NO':10} "
            f"{row.get('loss_diff', float('nan')):9.1e} {row.get('grad_diff', float('nan')):9.1e}"
            f"  {'' if ok else row.get('step')}",
            flush=True,
        )


if __name__ == "__main__":
    main()
