"""tpushim's estimator API against stock 2.15 in details of the conversion (in-process, cheap).

What ``model_to_estimator`` writes before training: stock 2.15's files, no more.
Stock 2.15 writes the first checkpoint (``model_dir/keras/...``) for a model with a graph
(functional, a Sequential given its input shape, one loaded from ``keras_model_path``) and
nothing at all for one without (a subclassed model, a Sequential not yet built): its Estimator
makes no folder when constructed. The listing below is stock 2.15's, recorded live; on 2.12-2.15
this test runs stock itself against it (the conversion falls back to stock with no TPU), on
2.16+ tpushim's estimator API.

A subclassed model whose call reads ``SparseTensor`` features: stock hands them to the model as
they are, and trains it (TensorFlow's raw ``Failed to convert elements of SparseTensor`` before).
"""

import os
import sys

import pytest
import tensorflow as tf

import tpushim

#: stock 2.15's files under model_dir right after the conversion (None: no folder at all)
FIRST_CHECKPOINT = [
    "keras",
    "keras/checkpoint",
    "keras/keras_model.ckpt.data-00000-of-00001",
    "keras/keras_model.ckpt.index",
    "keras/keras_model.ckpt.meta",
]
#: the v2 spelling's default (checkpoint_format="checkpoint"): an object-based one, no .meta
OBJECT_CHECKPOINT = [name for name in FIRST_CHECKPOINT if not name.endswith(".meta")]
STOCK_2_15 = {
    "functional": OBJECT_CHECKPOINT,
    "sequential_built": FIRST_CHECKPOINT,
    "keras_model_path": FIRST_CHECKPOINT,
    "sequential_unbuilt": None,
    "subclassed": None,
    "subclassed_v2_saver": None,
}


class _Subclassed(tf.keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = tf.keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls()


def _compiled(model):
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    return model


def _functional():
    inputs = tf.keras.Input((3,), name="x")
    return _compiled(tf.keras.Model(inputs, tf.keras.layers.Dense(1)(inputs)))


def _listing(folder):
    if not os.path.exists(folder):
        return None
    return sorted(
        os.path.relpath(os.path.join(parent, name), folder)
        for parent, dirs, files in os.walk(folder)
        for name in files + dirs
    )


def test_conversion_writes_what_stock_2_15_writes_for_each_model_kind(tmp_path):
    tpushim.patch()
    v1 = tf.compat.v1.keras.estimator.model_to_estimator
    v2 = tf.keras.estimator.model_to_estimator
    saved = str(tmp_path / "model.h5")
    _functional().save(saved)
    conversions = {
        "functional": lambda d: v2(keras_model=_functional(), model_dir=d),
        "sequential_built": lambda d: v1(
            keras_model=_compiled(
                tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(3,))])
            ),
            config=tf.compat.v1.estimator.RunConfig(model_dir=d),
        ),
        "keras_model_path": lambda d: v1(keras_model_path=saved, model_dir=d),
        "sequential_unbuilt": lambda d: v1(
            keras_model=_compiled(tf.keras.Sequential([tf.keras.layers.Dense(1)])), model_dir=d
        ),
        "subclassed": lambda d: v1(keras_model=_compiled(_Subclassed()), model_dir=d),
        "subclassed_v2_saver": lambda d: v2(
            keras_model=_compiled(_Subclassed()),
            config=tf.compat.v1.estimator.RunConfig(model_dir=d),
            checkpoint_format="saver",
        ),
    }
    written = {}
    for kind, convert in conversions.items():
        folder = str(tmp_path / kind)
        assert convert(folder).model_dir == folder
        written[kind] = _listing(folder)
    assert written == STOCK_2_15


@pytest.mark.parametrize("spelling", ["v1", "v2"])
def test_a_temporary_model_dir_is_made_as_stock_makes_it(spelling, monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # stock's mkdtemp lands here
    tpushim.patch()
    convert = (
        tf.compat.v1.keras.estimator.model_to_estimator
        if spelling == "v1"
        else tf.keras.estimator.model_to_estimator
    )
    kwargs = {"checkpoint_format": "saver"} if spelling == "v2" else {}
    estimator = convert(keras_model=_compiled(_Subclassed()), **kwargs)
    assert os.path.dirname(estimator.model_dir) == str(tmp_path)
    assert _listing(estimator.model_dir) == []


#: Stock 2.15's evaluation of the subclassed sparse model below after 4 steps (TensorFlow 2.15.1)
STOCK_2_15_SPARSE_LOSS = 1.1690409


def test_a_subclassed_model_reading_sparse_features_trains_as_stock_2_15(tmp_path):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import sparse_program

    tpushim.patch()
    tf.keras.utils.set_random_seed(3)
    model = sparse_program.subclassed_model()
    estimator = tf.keras.estimator.model_to_estimator(
        keras_model=model,
        config=tf.compat.v1.estimator.RunConfig(model_dir=str(tmp_path), tf_random_seed=1),
        checkpoint_format="saver",
    )
    estimator.train(sparse_program.input_fn(), steps=4)
    result = estimator.evaluate(sparse_program.input_fn())
    assert result["global_step"] == 4
    assert abs(result["loss"] - STOCK_2_15_SPARSE_LOSS) < 1e-5, result
