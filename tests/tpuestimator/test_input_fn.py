"""Legacy input_fns feed the TPU path unchanged: static shapes, inferred batch, every example once."""

import threading
import types

import numpy as np
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

tpu_config = tpuestimator_import("tensorflow_estimator.python.estimator.tpu", "tpu_config")

import tpushim

_input_fn = tpuestimator_import("tpushim._input_fn")
_padding = tpuestimator_import("tpushim._padding")
TPUShimEstimator = tpuestimator_import("tpushim._estimator", "TPUShimEstimator")
_faketpu = tpuestimator_import("tpushim._preflight.faketpu")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tpuestimator,
]  # trains estimators or runs scripts: outside the fast tier

ModeKeys = tfcases.ModeKeys
N, B = tfcases.N, tfcases.BATCH  # 52 examples, batches of 8: the last eval/predict batch is short


def compare_eval_predict(tmp_path, build, train_fn, eval_fn, predict_fn, steps=3, **kwargs):
    return tfcases.compare(tmp_path, build, train_fn, eval_fn, predict_fn, steps=steps, **kwargs)


def _xy():
    return tfcases.data()


# --- every input style: evaluate() and predict() equal stock over all N examples ----------------


def test_no_argument_input_fn_and_features_only_predict(tmp_path):
    x, y = _xy()
    _, shim = compare_eval_predict(
        tmp_path,
        tfcases.sequential,
        tfcases.dataset_input_fn(x, y),
        tfcases.dataset_input_fn(x, y),
        tfcases.dataset_input_fn(x),
    )
    assert len(shim[2]) == N


def test_input_fn_taking_params_mode_config(tmp_path):
    x, y = _xy()
    seen = []

    def input_fn(params, mode, config):
        seen.append((mode, isinstance(config, tf.estimator.RunConfig), isinstance(params, dict)))
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(B)

    compare_eval_predict(tmp_path, tfcases.sequential, input_fn, input_fn, None)
    assert (ModeKeys.TRAIN, True, True) in seen and (ModeKeys.EVAL, True, True) in seen


def test_drop_remainder_dataset(tmp_path):
    x, y = _xy()
    fn = tfcases.dataset_input_fn(x, y, drop_remainder=True)
    compare_eval_predict(
        tmp_path, tfcases.sequential, fn, fn, tfcases.dataset_input_fn(x, drop_remainder=True)
    )


def test_dict_features_and_tuple_features(tmp_path):
    features, labels = tfcases.two_in_two_out_data()
    fn = tfcases.dataset_input_fn(features, labels)
    compare_eval_predict(
        tmp_path / "dict",
        tfcases.two_in_two_out,
        fn,
        fn,
        tfcases.dataset_input_fn(features),
        output_names=("cls", "reg"),
    )

    def functional_list_inputs():
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        a, b = tf.keras.Input((4,), name="a"), tf.keras.Input((2,), name="b")
        out = tf.keras.layers.Dense(3, activation="softmax", name="out")(
            tf.keras.layers.Concatenate()([a, b])
        )
        model = tf.keras.Model([a, b], out)
        model.compile(
            tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy", ["accuracy"]
        )
        return model

    tuple_fn = tfcases.dataset_input_fn((features["a"], features["b"]), labels["cls"])
    # (A features-only tuple cannot be predicted from: Estimator reads any 2-tuple as (features, labels).)
    compare_eval_predict(tmp_path / "tuple", functional_list_inputs, tuple_fn, tuple_fn, None)


def test_one_shot_iterator_tensors_on_cpu(tmp_path):
    x, y = _xy()

    def tensors_fn():
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(B)
        return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()

    compare_eval_predict(tmp_path, tfcases.sequential, tensors_fn, tensors_fn, None)


def test_numpy_input_fn_on_cpu(tmp_path):
    x, y = _xy()
    train = tf.compat.v1.estimator.inputs.numpy_input_fn(
        x, y, batch_size=B, shuffle=False, num_epochs=None
    )
    evaluate = tf.compat.v1.estimator.inputs.numpy_input_fn(
        x, y, batch_size=B, shuffle=False, num_epochs=1
    )
    compare_eval_predict(tmp_path, tfcases.sequential, train, evaluate, None)


def test_tensors_for_a_tpu_is_a_clear_error_naming_the_replacement():
    x, y = _xy()
    queue_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(x, y, batch_size=B, shuffle=False)

    def fn():  # computed from numpy_input_fn's tensors: no longer the arrays' rows
        features, labels = queue_fn()
        return features * 2.0, labels

    context = types.SimpleNamespace(num_hosts=1, current_host=0)
    with tf.Graph().as_default(), pytest.raises(tpushim.ConversionError) as info:
        tfcases.adapted(fn, ModeKeys.TRAIN, {"batch_size": B, "context": context})
    assert "cannot trace back" in str(info.value) and "'fn'" in str(info.value)
    assert "tf.data.Dataset.from_tensor_slices((x, y)).batch(B)" in str(info.value)


# --- static shapes, batch size, sharding ------------------------------------------------------

SEEN = []


class Probe(tf.keras.layers.Layer):
    """Records the static batch dimension the model is built with, in every mode."""

    def call(self, inputs):
        SEEN.append(inputs.shape[0])
        return inputs


def probe_model():
    return tfcases.sequential(extra_layers=(Probe(name="probe"),))


def _run_probe(tmp_path, batch_size=None, input_batch=B):
    x, y = _xy()
    SEEN.clear()
    tpushim.patch(mode="cpu", batch_size=batch_size)
    est = tf.keras.estimator.model_to_estimator(
        keras_model=probe_model(), model_dir=str(tmp_path), custom_objects={"Probe": Probe}
    )
    tpushim.unpatch()
    SEEN.clear()  # drop the warm-start clone
    fn = tfcases.dataset_input_fn(x, y, batch=input_batch)
    est.train(fn, steps=2)
    train = list(SEEN)
    SEEN.clear()
    metrics = est.evaluate(fn)
    evaluate = list(SEEN)
    SEEN.clear()
    predictions = list(est.predict(tfcases.dataset_input_fn(x, batch=input_batch)))
    return train, evaluate, list(SEEN), metrics, predictions


def test_probe_sees_static_batches_inferred_from_input(tmp_path):
    train, evaluate, predict, _, predictions = _run_probe(tmp_path)
    assert train == evaluate == predict == [B]  # static, inferred with nothing configured
    assert len(predictions) == N


def test_explicit_batch_size_beats_inferred(tmp_path):
    train, evaluate, predict, _metrics, predictions = _run_probe(
        tmp_path, batch_size=5, input_batch=B
    )
    assert train == evaluate == predict == [5]
    assert len(predictions) == N


def test_per_host_pieces_of_each_global_batch():
    """Global batches of 8 (stock's) over 2 hosts fed 4 rows a step: host h gets rows 8k+4h..8k+4h+3,
    so each step's two pieces are one of stock's batches; repeat().batch() needs no padding."""
    x = np.arange(32, dtype="float32").reshape(32, 1)
    fn = lambda: tf.data.Dataset.from_tensor_slices(x).repeat().batch(8)
    for host in (0, 1):
        context = types.SimpleNamespace(num_hosts=2, current_host=host)
        ds = tfcases.adapted(fn, ModeKeys.TRAIN, {"batch_size": 4, "context": context}, 8)
        assert ds.element_spec.shape.as_list() == [4, 1]
        batches = [b[:, 0].tolist() for b in ds.take(4).as_numpy_iterator()]
        assert batches == [list(range(8 * k + 4 * host, 8 * k + 4 * host + 4)) for k in range(4)]


def test_rebatch_keeps_order_pads_and_weights():
    x = np.arange(10, dtype="float32").reshape(10, 1)
    ds = tfcases.adapted(
        lambda: tf.data.Dataset.from_tensor_slices(x).batch(3), ModeKeys.EVAL, {"batch_size": 4}
    )
    batches = list(ds.as_numpy_iterator())
    assert [b[_padding.FEATURES_KEY][:, 0].tolist() for b in batches] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 8, 8],  # padded with copies of a real row, weighted 0
    ]
    assert [b[_padding.PADDING_KEY].tolist() for b in batches] == [[1] * 4, [1] * 4, [1, 1, 0, 0]]
    train = tfcases.adapted(
        lambda: tf.data.Dataset.from_tensor_slices(x).batch(3), ModeKeys.TRAIN, {"batch_size": 4}
    )
    assert train.element_spec.shape.as_list() == [4, 1]
    assert [b[:, 0].tolist() for b in train.as_numpy_iterator()] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_finite_training_input_rebatched_is_logged(tmp_path, tpushim_log):
    """Re-batched (an explicit batch size other than the input's), a finite input's last rows
    cannot form a full batch: logged. Batched by the same size, its short batch is padded instead
    (tests/tpuestimator/test_legacy_input.py) and nothing is logged."""
    x, y = _xy()
    tpushim.patch(mode="cpu", batch_size=5)
    est = tf.keras.estimator.model_to_estimator(
        keras_model=tfcases.sequential(), model_dir=str(tmp_path)
    )
    est.train(tfcases.dataset_input_fn(x, y), steps=1)
    assert "the training input is finite and batched by 8, not 5" in tpushim_log.text
    tpushim_log.clear()
    est.train(tfcases.dataset_input_fn(x, y, repeat=True), steps=1)
    assert "training input is finite" not in tpushim_log.text


def test_tpu_evaluate_steps_cover_every_example_once(tmp_path):
    x, y = _xy()
    with _faketpu.faked_tpu_system() as tpu:
        tpushim.patch(tpu=tpu.master)
        est = tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(), model_dir=str(tmp_path)
        )
        # evaluate() on a TPU runs ceil(examples / global batch) = ceil(52 / 8) = 7 padded batches,
        # the global batch of 8 taken from the input: one row per core.
        build = tpu.build(lambda: est.evaluate(tfcases.dataset_input_fn(x, y)))
        assert build.eval_steps == 7
        assert build.infeed_shapes()[0][0] == [B // tpu.num_cores, 4]
        with pytest.raises(
            tpushim.ConversionError, match="needs `steps` when the input repeats forever"
        ):
            est.evaluate(tfcases.dataset_input_fn(x, y, repeat=True))
    facts = tfcases.input_facts(tfcases.dataset_input_fn(x, y, batch=5), ModeKeys.EVAL, True)
    assert facts == _input_fn.InputFacts(5, 5, 11, N)
    facts = tfcases.input_facts(tfcases.dataset_input_fn(x, y, repeat=True), ModeKeys.EVAL, True)
    assert facts == _input_fn.InputFacts(B, B, None, None)


@pytest.mark.parametrize("drop_remainder", [True, False])
def test_predict_keys_with_static_and_short_batches(tmp_path, drop_remainder):
    x, _y = _xy()
    tpushim.patch(mode="cpu")
    est = tf.keras.estimator.model_to_estimator(
        keras_model=tfcases.sequential(), model_dir=str(tmp_path)
    )
    fn = tfcases.dataset_input_fn(x, drop_remainder=drop_remainder)
    single = list(est.predict(fn, predict_keys=["probs"]))
    assert len(single) == (48 if drop_remainder else N) and set(single[0]) == {"probs"}
    batches = list(est.predict(fn, predict_keys=["probs"], yield_single_examples=False))
    assert sum(len(b["probs"]) for b in batches) == len(single)
    np.testing.assert_allclose(
        np.concatenate([b["probs"] for b in batches]),
        np.stack([p["probs"] for p in single]),
        atol=1e-6,
    )


def test_tensor_input_predict_and_evaluate_on_cpu(tmp_path):
    x, _y = _xy()

    def tensors_fn():
        return tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensor_slices(x).batch(B)
        ).get_next()

    tpushim.patch(mode="cpu")
    est = tf.keras.estimator.model_to_estimator(
        keras_model=tfcases.sequential(), model_dir=str(tmp_path)
    )
    assert len(list(est.predict(tensors_fn, predict_keys=["probs"]))) == N


# --- legacy input as scripts write it (issue 11) ----------------------------------------------


def test_numpy_arrays_returned_by_input_fn(tmp_path):
    features, labels = tfcases.two_in_two_out_data(n=B)

    def numpy_fn():
        return {"a": features["a"], "b": features["b"]}, {
            "cls": labels["cls"],
            "reg": labels["reg"],
        }

    stock = tfcases.run(
        "off", tfcases.two_in_two_out, numpy_fn, None, None, tmp_path / "stock", steps=3
    )
    shim = tfcases.run(
        "cpu", tfcases.two_in_two_out, numpy_fn, None, None, tmp_path / "shim", steps=3
    )
    tfcases.assert_same(stock, shim, output_names=("cls", "reg"))
    assert all(e.evaluate(numpy_fn, steps=2) for e in (stock[0], shim[0]))
    np.testing.assert_allclose(
        shim[0].evaluate(numpy_fn, steps=2)["loss"],
        stock[0].evaluate(numpy_fn, steps=2)["loss"],
        atol=tfcases.TOL,
    )
    with tf.Graph().as_default():
        ds = tfcases.adapted(numpy_fn, ModeKeys.TRAIN, {"batch_size": B, "context": object()})
        assert isinstance(ds, tf.data.Dataset)


def _label_model(loss, units):
    def build():
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(0)
        act = {"binary_crossentropy": "sigmoid", "sparse_categorical_crossentropy": "softmax"}.get(
            loss
        )
        model = tf.keras.Sequential(
            [tf.keras.layers.Dense(units, activation=act, input_shape=(4,))]
        )
        model.compile(
            tf.keras.optimizers.legacy.SGD(0.1), loss, metrics=["mae"] if units == 1 else []
        )
        return model

    return build


@pytest.mark.parametrize(
    "loss,units",
    [("mse", 1), ("mae", 1), ("binary_crossentropy", 1), ("sparse_categorical_crossentropy", 3)],
)
@pytest.mark.parametrize("label_shape", ["batch", "batch1"])
def test_label_shapes_stock_accepts(tmp_path, loss, units, label_shape):
    x, y = _xy()
    y = (y % 2 if units == 1 else y).astype("float32")
    if label_shape == "batch":
        y = y[:, 0]
    fn = tfcases.dataset_input_fn(x, y)
    compare_eval_predict(tmp_path, _label_model(loss, units), fn, fn, None)


def test_unknown_cardinality_is_not_called_finite(tmp_path, tpushim_log):
    x, y = _xy()
    tpushim.patch(mode="cpu")
    est = tf.keras.estimator.model_to_estimator(
        keras_model=tfcases.sequential(), model_dir=str(tmp_path)
    )
    est.train(
        lambda: (
            tf.data.Dataset.from_tensor_slices((x, y)).repeat().filter(lambda a, b: True).batch(B)
        ),
        steps=1,
    )
    assert "training input is finite" not in tpushim_log.text


def test_batch_size_from_the_declared_batch_op(tmp_path):
    rng = np.random.RandomState(1)
    x, y = rng.rand(102, 4).astype("float32"), rng.randint(0, 3, size=(102, 1)).astype("int64")
    small = lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(128).prefetch(1)
    assert tfcases.input_facts(small, ModeKeys.EVAL).batch_size == 128
    mapped = lambda: (
        tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).batch(128).map(lambda a, b: (a, b))
    )
    assert tfcases.input_facts(mapped, ModeKeys.EVAL).batch_size == 128
    unbatched = lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(128).unbatch().batch(40)
    assert tfcases.input_facts(unbatched, ModeKeys.EVAL).batch_size == 40
    compare_eval_predict(
        tmp_path / "cpu", tfcases.sequential, tfcases.dataset_input_fn(x, y, batch=16), small, None
    )
    with _faketpu.faked_tpu_system() as tpu:
        tpushim.patch(tpu=tpu.master)
        est = tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(), model_dir=str(tmp_path / "tpu")
        )
        build = tpu.build(lambda: est.evaluate(small))
    # The declared 128 (16 per core), not the 102 rows of its one (short) batch.
    assert build.infeed_shapes()[0][0] == [128 // tpu.num_cores, 4]
    assert build.eval_steps == 1


def test_iterator_tensors_recovered_as_their_dataset(tmp_path):
    x, y = _xy()

    def method_form():
        ds = tf.compat.v1.data.Dataset.from_tensor_slices((x, y)).batch(B)
        f, labels = ds.make_one_shot_iterator().get_next()
        return {"hidden_input": f}, labels

    def function_form():
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(B)
        return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()

    context = types.SimpleNamespace(num_hosts=1, current_host=0)
    with tf.Graph().as_default():
        for fn in (method_form, function_form):
            ds = tfcases.adapted(fn, ModeKeys.EVAL, {"batch_size": B, "context": context})
            assert isinstance(ds, tf.data.Dataset)
    compare_eval_predict(tmp_path / "m", tfcases.sequential, method_form, method_form, None)
    compare_eval_predict(tmp_path / "f", tfcases.sequential, function_form, function_form, None)


def test_threads_sharing_an_estimator_each_build_with_their_own_batch_size(tmp_path):
    """Thread B fixes its batch size (5), then waits inside its model_fn while thread A predicts
    with its own (8) on the same estimator; B's graph is then built with 5, A's with 8."""
    x = np.arange(12, dtype="float32").reshape(12, 1)
    model_fn_batch = {}
    b_waits, a_done = threading.Event(), threading.Event()

    def model_fn(features, labels, mode, params):
        del labels
        if threading.current_thread().name == "B":  # its batch size is fixed by now
            b_waits.set()
            assert a_done.wait(timeout=120)
        model_fn_batch[threading.current_thread().name] = params["batch_size"]
        features, weight = _padding.split_padding(features)
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
            mode, predictions=_padding.with_padding_weight({"x": features * 2.0}, weight)
        )

    def batched(size):
        return lambda: tf.data.Dataset.from_tensor_slices(x).batch(size)

    est = TPUShimEstimator(
        model_fn=model_fn,
        use_tpu=False,
        params={},
        config=tpu_config.RunConfig(model_dir=str(tmp_path)),
    )
    results = {}
    thread_b = threading.Thread(
        name="B", target=lambda: results.update(B=list(est.predict(batched(5))))
    )
    thread_b.start()
    assert b_waits.wait(timeout=120)
    try:
        results["A"] = list(est.predict(batched(8)))
    finally:
        a_done.set()
        thread_b.join(timeout=120)
    assert model_fn_batch == {"B": 5, threading.current_thread().name: 8}
    for name in ("A", "B"):
        assert [float(p["x"][0]) for p in results[name]] == [2.0 * i for i in range(12)]
