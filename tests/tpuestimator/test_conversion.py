"""The TPUEstimator tpushim builds: warm start, checkpoints both ways, export, RunConfig, bad input."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

tpu_config = tpuestimator_import("tensorflow_estimator.python.estimator.tpu", "tpu_config")

import tpushim

TPUShimEstimator, indivisible_batch = tpuestimator_import(
    "tpushim._estimator", "TPUShimEstimator", "indivisible_batch"
)
faketpu = tpuestimator_import("tpushim._preflight.faketpu")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tpuestimator,
]  # trains estimators or runs scripts: outside the fast tier


def test_warm_start_from_trained_keras_model(tmp_path):
    x, y = tfcases.data()

    def fitted():  # two identical trained models: stock cannot convert one fitted model twice
        model = tfcases.sequential()
        model.fit(x, y, epochs=3, batch_size=8, verbose=0, shuffle=False)
        return model

    model = fitted()
    keras_loss, keras_acc = model.evaluate(x, y, batch_size=tfcases.N, verbose=0)
    fn = tfcases.dataset_input_fn(x, y, batch=tfcases.N)
    shim = tfcases.convert(tmp_path / "shim", model, patch={"mode": "cpu"}).evaluate(fn)
    stock = tfcases.convert(tmp_path / "stock", fitted(), patch={"mode": "off"}).evaluate(fn)
    assert shim["global_step"] == 0
    for key in ("loss", "accuracy"):
        assert shim[key] == pytest.approx(stock[key], abs=1e-6)
    assert shim["loss"] == pytest.approx(keras_loss, abs=1e-5)
    assert shim["accuracy"] == pytest.approx(keras_acc, abs=1e-6)


@pytest.mark.parametrize("spelling", ["v1", "v2"])
@pytest.mark.parametrize("first,second", [("cpu", "off"), ("off", "cpu")])
def test_checkpoints_interchange(tmp_path, spelling, first, second):
    x, y = tfcases.data()
    fn = tfcases.dataset_input_fn(x, y)
    a = tfcases.convert(tmp_path, spelling=spelling, patch={"mode": first})
    a.train(fn, steps=3)
    a_metrics = a.evaluate(fn)
    b = tfcases.convert(tmp_path, spelling=spelling, patch={"mode": second})
    assert isinstance(a, TPUShimEstimator) != isinstance(b, TPUShimEstimator)
    b_metrics = b.evaluate(fn)  # evaluates the other's checkpoint
    assert b_metrics["global_step"] == 3
    for key in ("loss", "accuracy"):
        assert b_metrics[key] == pytest.approx(a_metrics[key], abs=1e-6)
    b.train(fn, steps=2)  # and continues it
    assert b.evaluate(fn)["global_step"] == 5


def _serve(export_dir, x):
    loaded = tf.saved_model.load(export_dir)
    out = loaded.signatures["serving_default"](hidden_input=tf.constant(x))
    return {k: v.numpy() for k, v in out.items()}


def test_export_saved_model_serves_like_stock(tmp_path):
    x, y = tfcases.data()
    fn = tfcases.dataset_input_fn(x, y)

    def receiver():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="hidden_input")
        return tf.estimator.export.ServingInputReceiver({"hidden_input": x}, {"hidden_input": x})

    served = {}
    for mode in ("off", "cpu"):
        est = tfcases.convert(
            tmp_path / mode, patch={"mode": mode}, config=tf.estimator.RunConfig(tf_random_seed=1)
        )
        est.train(fn, steps=4)
        export_dir = est.export_saved_model(str(tmp_path / f"export_{mode}"), receiver)
        served[mode] = _serve(export_dir, x[:5])
    assert set(served["cpu"]) == set(served["off"]) == {"probs"}
    np.testing.assert_allclose(served["cpu"]["probs"], served["off"]["probs"], atol=1e-5)


def test_model_dir_none_is_a_temporary_directory():
    tpushim.patch(mode="cpu")
    est = tf.keras.estimator.model_to_estimator(keras_model=tfcases.sequential())
    assert isinstance(est, TPUShimEstimator) and os.path.isdir(est.model_dir)
    assert os.path.exists(os.path.join(est.model_dir, "keras"))


def test_run_config_is_carried_and_distribute_warned(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="tpushim")
    session = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
    config = tf.estimator.RunConfig(
        tf_random_seed=3,
        save_checkpoints_steps=30,
        keep_checkpoint_max=2,
        save_summary_steps=7,
        log_step_count_steps=11,
        session_config=session,
        train_distribute=tf.distribute.OneDeviceStrategy("/cpu:0"),
    )
    est = tfcases.convert(tmp_path, patch={"mode": "cpu"}, config=config)
    c = est.config
    assert isinstance(c, tpu_config.RunConfig)
    assert (
        c.model_dir,
        c.tf_random_seed,
        c.save_checkpoints_steps,
        c.keep_checkpoint_max,
        c.save_summary_steps,
    ) == (str(tmp_path), 3, 30, 2, 7)
    assert c.session_config.intra_op_parallelism_threads == 1
    assert c.tpu_config.iterations_per_loop == 30  # bounded by the checkpoint interval
    assert "RunConfig.train_distribute is ignored by TPUEstimator" in caplog.text
    # On CPU one session.run is one step: examples/sec is written every log_step_count_steps (11)
    # steps, not every step as TPUEstimator would (it divides by iterations_per_loop, 30).
    x, y = tfcases.data()
    est.train(tfcases.dataset_input_fn(x, y, repeat=True), steps=34)
    written = [
        value.tag
        for path in tf.io.gfile.glob(str(tmp_path / "events.out.tfevents.*"))
        for event in tf.compat.v1.train.summary_iterator(path)
        for value in event.summary.value
        if value.tag == "examples/sec"
    ]
    assert 1 <= len(written) <= 3


def test_user_tpu_run_config_is_respected(tmp_path):
    config = tpu_config.RunConfig(
        tpu_config=tpu_config.TPUConfig(iterations_per_loop=7), tf_random_seed=5
    )
    est = tfcases.convert(tmp_path, patch={"mode": "cpu"}, config=config)
    assert est.config.tpu_config.iterations_per_loop == 7
    assert est.config.tf_random_seed == 5


@pytest.mark.parametrize(
    "dims,features",
    [
        ([[1, 2, 1, 1], None], lambda: tf.zeros([8, 4, 4, 1])),  # one feature tensor
        ([{"image": [1, 2, 1, 1], "id": None}, None], None),  # a dict of features
    ],
    ids=["tensor", "dict"],
)
def test_a_scripts_input_partition_dims_match_tpushims_padded_features(tmp_path, dims, features):
    """``TPUConfig(num_cores_per_replica=2, input_partition_dims=...)`` (model parallelism, as a
    fine-tuning script sets it): the script's dims name its features, which tpushim feeds under
    its padding wrapper; TPUEstimator's own structure check (``InputsStructureRecorder``) refused
    them ("input_partition_dims[0] mismatched feature keys"). Carried over to that structure,
    the padding weight not partitioned: the same recorder takes them, and the script's
    RunConfig is left as it was."""
    from tensorflow_estimator.python.estimator.tpu import tpu_estimator

    from tpushim import _padding

    config = tpu_config.RunConfig(
        tpu_config=tpu_config.TPUConfig(
            num_cores_per_replica=2,
            input_partition_dims=dims,
            per_host_input_for_training=tpu_config.InputPipelineConfig.PER_HOST_V2,
        )
    )
    est = tfcases.convert(tmp_path, patch={"mode": "cpu", "quiet": True}, config=config)
    assert config.tpu_config.input_partition_dims == dims  # the script's, unchanged
    carried = est.config.tpu_config.input_partition_dims
    with tf.Graph().as_default():
        given = (
            features()
            if features
            else {"image": tf.zeros([8, 4, 4, 1]), "id": tf.zeros([8], tf.int64)}
        )
        padded = {_padding.FEATURES_KEY: given, _padding.PADDING_KEY: tf.ones([8])}
        labels = tf.zeros([8, 1])
        Recorder = tpu_estimator._InputPipeline.InputsStructureRecorder
        with pytest.raises(ValueError, match="mismatched feature keys"):
            Recorder(dims).validate_and_record_structure(padded, labels)  # as given
        recorder = Recorder(carried)
        recorder.validate_and_record_structure(padded, labels)
        flat = recorder.flattened_input_dims
    expected = [dims[0]] if features else [dims[0]["id"], dims[0]["image"]]
    assert flat == [*expected, None, None]  # the padding weight and the labels: whole


def test_indivisible_global_batch_converts_and_is_padded(tmp_path):
    """Stock trains any batch size; so does a TPU, each batch padded to the next multiple of the
    cores (tests/tpuestimator/test_input_parity.py proves the numbers): no error, and the
    one text the estimator logs and the preflight warns with names the waste and the fix."""
    config = tpu_config.RunConfig(tpu_config=tpu_config.TPUConfig(num_shards=8))
    with faketpu.faked_tpu_system() as tpu:  # the conversion asks the TPU for its devices
        tpushim.patch(tpu=tpu.master, batch_size=100)
        est = tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(), model_dir=str(tmp_path), config=config
        )
    assert isinstance(est, TPUShimEstimator)
    assert os.listdir(tmp_path) == ["keras"]  # the Keras weights' warm start, as stock writes it
    problem, fix = indivisible_batch(100, 8)
    assert "global batch size 100 does not divide among 8 TPU cores" in problem
    assert "padded to 104 rows" in problem and "4 of 104" in problem
    assert "(96 or 104)" in fix


# --- bad input: a clear error, nothing written ------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (
            lambda: {"keras_model": tfcases.uncompiled()},
            ValueError,
            "Please compile the model with `model.compile()`",
        ),
        (
            lambda: {"keras_model": tfcases.subclassed()},
            ValueError,
            "Object-based checkpoints are currently not supported with subclassed models",
        ),
        (lambda: {}, ValueError, "Either `keras_model` or `keras_model_path` needs to be provided"),
        (
            lambda: {"keras_model": tfcases.sequential(), "keras_model_path": "m.h5"},
            ValueError,
            "but not both",
        ),
        (
            lambda: {"keras_model": tfcases.with_unrebuildable_metric()},
            tpushim.ConversionError,
            "cannot rebuild metric 'above' (NoConfigMetric)",
        ),
        (
            lambda: {"keras_model": tfcases.with_legacyless_optimizer()},
            tpushim.ConversionError,
            "optimizer HandRolledSGD",
        ),
    ],
    ids=["uncompiled", "subclassed", "neither", "both", "metric", "optimizer"],
)
def test_bad_input_clear_error_nothing_written(tmp_path, kwargs, error, message):
    model_dir = tmp_path / "model_dir"
    tpushim.patch(mode="cpu")
    with pytest.raises(error) as info:
        tf.keras.estimator.model_to_estimator(model_dir=str(model_dir), **kwargs())
    assert message in str(info.value)
    assert not model_dir.exists() or not os.listdir(model_dir)


@pytest.mark.parametrize("spelling", ["v1", "v2"])
def test_model_dir_of_a_different_model_is_a_clear_error_nothing_overwritten(tmp_path, spelling):
    x, y = tfcases.data()
    first = tfcases.convert(tmp_path, spelling=spelling, patch={"mode": "cpu"})
    first.train(tfcases.dataset_input_fn(x, y), steps=2)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}

    def wider():
        tf.keras.backend.clear_session()
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Dense(16, input_shape=(4,), name="hidden"),
                tf.keras.layers.Dense(3, activation="softmax", name="probs"),
            ]
        )
        model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy")
        return model

    with pytest.raises(tpushim.ConversionError) as info:
        tfcases.convert(tmp_path, wider(), spelling, {"mode": "cpu"})
    assert "already holds a checkpoint of different variables" in str(info.value)
    assert "[4, 8] there but [4, 16] in this model" in str(info.value)
    after = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before
    # The same model continues from it.
    again = tfcases.convert(tmp_path, spelling=spelling, patch={"mode": "cpu"})
    again.train(tfcases.dataset_input_fn(x, y), steps=1)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-3")


def test_object_checkpoint_keys_equal_save_weights(tmp_path):
    from tpushim import _tfprivate

    model = tfcases.sequential()
    model.save_weights(str(tmp_path / "w"), save_format="tf")
    written = {
        k: s
        for k, s in tf.train.list_variables(str(tmp_path / "w"))
        if "/.ATTRIBUTES/" in k and k.split("/")[0] != "optimizer"
    }
    assert _tfprivate.checkpoint.object_checkpoint_keys(model) == written


def test_mocked_tempdir_and_its_contents_survive(tmp_path, monkeypatch):
    import tempfile

    user = tmp_path / "users_folder"
    user.mkdir()
    (user / "sentinel.txt").write_text("keep me")
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: str(user))
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(user))
    x, y = tfcases.data()
    fn = tfcases.dataset_input_fn(x, y)
    est = tfcases.convert(tmp_path / "md", patch={"mode": "cpu"})
    est.train(fn, steps=2)
    est.evaluate(fn)
    list(est.predict(lambda: tf.data.Dataset.from_tensor_slices(x).batch(8)))
    again = tfcases.convert(
        tmp_path / "md", patch={"mode": "cpu"}
    )  # the model_dir check runs on an existing checkpoint
    again.evaluate(fn)

    def receiver():
        p = tf.compat.v1.placeholder(tf.float32, [None, 4], name="hidden_input")
        return tf.estimator.export.ServingInputReceiver({"hidden_input": p}, {"hidden_input": p})

    est.export_saved_model(str(tmp_path / "export"), receiver)
    assert (user / "sentinel.txt").read_text() == "keep me"


@pytest.mark.parametrize("spelling,fmt", [("v1", None), ("v2", "saver"), ("v2", "checkpoint")])
def test_warm_start_from_keras_save_weights_is_accepted(tmp_path, spelling, fmt):
    x, y = tfcases.data()
    model = tfcases.sequential()
    model.fit(x, y, epochs=2, batch_size=8, verbose=0, shuffle=False)
    keras_loss = model.evaluate(x, y, batch_size=tfcases.N, verbose=0)[0]
    model.save_weights(str(tmp_path / "keras" / "warm_start.ckpt"))
    kwargs = {"checkpoint_format": fmt} if fmt else {}
    est = tfcases.convert(tmp_path, model, spelling, {"mode": "cpu"}, **kwargs)
    metrics = est.evaluate(tfcases.dataset_input_fn(x, y, batch=tfcases.N))
    assert metrics["loss"] == pytest.approx(keras_loss, abs=1e-5)


def _error_text(mode, tmp_path, call, **kwargs):
    est = tfcases.convert(tmp_path / mode, patch={"mode": mode}, **kwargs)
    with pytest.raises(Exception) as info:
        call(est)
    return type(info.value), str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"metric_names_map": {"accuracy": "acc", "nope": "x"}},  # unexpected keys
        {"metric_names_map": {"not_accuracy": "x"}},  # names missing from the map
    ],
    ids=["metric-map-extra", "metric-map-unknown"],
)
def test_metric_names_map_errors_are_stocks_text(tmp_path, kwargs):
    x, y = tfcases.data()
    fn = tfcases.dataset_input_fn(x, y)
    ours = _error_text("cpu", tmp_path, lambda e: e.evaluate(fn, steps=1), **kwargs)
    stock = _error_text("off", tmp_path, lambda e: e.evaluate(fn, steps=1), **kwargs)
    assert ours == stock


def test_export_outputs_error_is_stocks_text(tmp_path):
    x, _ = tfcases.data()
    kwargs = {"export_outputs": {"nope": tf.estimator.export.PredictOutput}}
    fn = lambda: tf.data.Dataset.from_tensor_slices(x).batch(8)
    ours = _error_text("cpu", tmp_path, lambda e: next(e.predict(fn)), **kwargs)
    stock = _error_text("off", tmp_path, lambda e: next(e.predict(fn)), **kwargs)
    assert "Missed keys" in stock[1]
    assert ours == stock


def test_cpu_mode_has_no_noise_of_tpushims_making(tmp_path):
    records = []

    class Catch(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Catch()
    tf_logger = tf.get_logger()
    level = tf_logger.level
    tf_logger.setLevel("INFO")
    tf_logger.addHandler(handler)
    try:
        x, y = tfcases.data()
        fn = tfcases.dataset_input_fn(x, y)
        est = tfcases.convert(tmp_path, patch={"mode": "cpu"})
        est.train(fn, steps=1)
        est.evaluate(fn)
    finally:
        tf_logger.removeHandler(handler)
        tf_logger.setLevel(level)
    assert records  # the capture works
    assert not [r for r in records if "eval_on_tpu ignored" in r]
    assert not [r for r in records if "params are not passed to Estimator" in r]
