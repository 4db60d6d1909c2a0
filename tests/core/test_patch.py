"""Patching core: every spelling converts; lazy, idempotent, thread-safe and reversible."""

import functools
import inspect
import json
import logging
import sys
import threading
import types

import procs
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

extenders, keras_lib = tpuestimator_import(
    "tensorflow_estimator.python.estimator", "extenders", "keras_lib"
)

import tpushim
from tpushim import _patch, _versions

TPUShimEstimator = tpuestimator_import("tpushim._estimator", "TPUShimEstimator")

ESTIMATOR_API = _versions.uses_own_estimator()  # TensorFlow >= 2.16: tpushim's estimator API
#: What patch() wraps, each with its original captured before any test patched anything: on
#: TensorFlow <= 2.15 keras_lib's model_to_estimator and the module add_metrics builds its result
#: from; on 2.16+ tf_keras's model_to_estimator functions (tpushim's tf.estimator names are
#: attributes added while patched, checked in _one_layer).
if ESTIMATOR_API:
    import tf_keras.api._v1.keras.estimator as _v1_api
    import tf_keras.src.estimator as _tf_keras_estimator

    WRAPPED = [
        (_tf_keras_estimator, "model_to_estimator_v2"),
        (_tf_keras_estimator, "model_to_estimator"),
        (_v1_api, "model_to_estimator"),
    ]
else:
    WRAPPED = [(keras_lib, "model_to_estimator"), (extenders, "estimator_lib")]
ORIGINALS = [getattr(module, name) for module, name in WRAPPED]
EstimatorV1 = tfcases.ESTIMATOR.Estimator
EstimatorV2 = tfcases.ESTIMATOR.Estimator if ESTIMATOR_API else tf.estimator.Estimator


def _spellings():
    import keras
    from tensorflow.compat.v1.keras.estimator import model_to_estimator as v1_imported
    from tensorflow.keras.estimator import model_to_estimator as v2_imported

    if ESTIMATOR_API:  # bare keras is Keras 3 on TensorFlow >= 2.16: it has no estimator
        keras = types.SimpleNamespace(estimator=tf.keras.estimator)
    return {
        "tf.keras.estimator": (tf.keras.estimator.model_to_estimator, "v2"),
        "tf.compat.v1.keras.estimator": (tf.compat.v1.keras.estimator.model_to_estimator, "v1"),
        "tf.compat.v2.keras.estimator": (tf.compat.v2.keras.estimator.model_to_estimator, "v2"),
        # Bare keras.estimator is the v1 function up to Keras 2.12 (stock differs by version).
        "keras.estimator": (
            keras.estimator.model_to_estimator,
            "v2" if tfcases.KERAS_VERSION >= (2, 13) else "v1",
        ),
        "from tensorflow.keras.estimator import": (v2_imported, "v2"),
        "from tensorflow.compat.v1.keras.estimator import": (v1_imported, "v1"),
    }


BOUND_BEFORE_PATCH = _spellings()  # names bound before patch() ever ran


def _one_layer():
    """Whether every target is wrapped (asserting they agree), each by one layer at most."""
    wrapped = []
    for (module, name), original in zip(WRAPPED, ORIGINALS):
        current = getattr(module, name)
        if _patch.is_ours(current):
            assert current.__wrapped__ is original  # one layer: a second would wrap the first
            wrapped.append(True)
        else:
            assert current is original
            wrapped.append(False)
    if ESTIMATOR_API:  # tpushim's tf.estimator names are there exactly while patched
        wrapped.append(hasattr(tf, "estimator"))
    assert len(set(wrapped)) == 1, wrapped
    return wrapped[0]


@pytest.mark.tpuestimator
@pytest.mark.parametrize("name", sorted(BOUND_BEFORE_PATCH))
def test_every_spelling_converts_then_reverts(name, tmp_path):
    for fn, version in (BOUND_BEFORE_PATCH[name], _spellings()[name]):
        tpushim.patch(mode="cpu")
        converted = fn(keras_model=tfcases.sequential(), model_dir=str(tmp_path / "a"))
        assert isinstance(converted, TPUShimEstimator)
        tpushim.unpatch()
        stock = fn(keras_model=tfcases.sequential(), model_dir=str(tmp_path / "b"))
        assert type(stock) is (EstimatorV2 if version == "v2" else EstimatorV1)


@pytest.mark.tpuestimator
def test_positional_arguments_and_v1_v2_checkpoint_formats(tmp_path):
    tpushim.patch(mode="cpu")
    x, y = tfcases.data()
    fn = tfcases.dataset_input_fn(x, y)
    v2 = tf.keras.estimator.model_to_estimator(
        tfcases.sequential(), None, None, str(tmp_path / "v2")
    )
    v1 = tf.compat.v1.keras.estimator.model_to_estimator(
        tfcases.sequential(), None, None, str(tmp_path / "v1")
    )
    for est in (v1, v2):
        assert isinstance(est, TPUShimEstimator)
        est.train(fn, steps=1)
    v1_names = {n for n, _ in tf.train.list_variables(v1.model_dir)}
    v2_names = {n for n, _ in tf.train.list_variables(v2.model_dir)}
    assert "hidden/kernel" in v1_names and "_CHECKPOINTABLE_OBJECT_GRAPH" not in v1_names  # Saver
    assert "_CHECKPOINTABLE_OBJECT_GRAPH" in v2_names  # object-based
    assert any(n.endswith("kernel/.ATTRIBUTES/VARIABLE_VALUE") for n in v2_names)


@pytest.mark.tpuestimator  # on 2.16+: tests/estimator_api/test_estimator_api_scripts.py (tf.keras made tf_keras first)
@pytest.mark.slow  # a TensorFlow subprocess that trains
def test_patch_before_tensorflow_is_lazy_then_applies():
    proc = procs.python(
        code="""
        import sys, tpushim
        tpushim.patch(mode="cpu")
        print("tf imported after patch:", "tensorflow" in sys.modules)
        print("wrapt imported after patch:", "wrapt" in sys.modules)
        print("status applied:", tpushim.status()["applied"])
        import tensorflow as tf
        from tensorflow_estimator.python.estimator import extenders, keras_lib
        assert tpushim.is_patched()
        m = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
        m.compile("sgd", "mse")
        est = tf.keras.estimator.model_to_estimator(keras_model=m)
        print("converted:", type(est).__name__)
        # patch -> import -> unpatch -> patch: one layer each time, the original restored exactly
        original = keras_lib.model_to_estimator.__wrapped__
        tpushim.unpatch()
        assert keras_lib.model_to_estimator is original
        tpushim.patch(); tpushim.patch(mode="cpu")
        assert keras_lib.model_to_estimator.__wrapped__ is original
        print("ok")
    """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "tf imported after patch: False" in out
    assert "wrapt imported after patch: False" in out  # nothing slow at start-up
    assert "pending import" in out
    assert "converted: TPUShimEstimator" in out
    assert out.rstrip().endswith("ok")


def test_unpatch_before_tensorflow_leaves_the_import_system_as_it_was():
    """patch() before TensorFlow waits for its import on sys.meta_path; unpatch() takes that
    finder off again (nothing else waits), and once everything awaited is imported it leaves too."""
    proc = procs.python(
        code="""
        import sys
        before = list(sys.meta_path)
        import tpushim
        tpushim.patch(mode="cpu")
        print("waiting:", len(sys.meta_path) - len(before))
        tpushim.unpatch()
        print("after unpatch:", sys.meta_path == before)
        tpushim.patch(); tpushim.unpatch(); tpushim.unpatch()
        print("again:", sys.meta_path == before)
        tpushim.patch(mode="cpu")
        import tensorflow as tf
        import importlib
        from tpushim import _patch
        # What patch() waits for (on TensorFlow >= 2.16 tf_keras's modules load when a script
        # first touches them): each is wrapped as it is imported.
        for module, _, _ in _patch.targets():
            importlib.import_module(module)
        module, name = _patch.targets()[0][:2]
        assert _patch.is_ours(getattr(sys.modules[module], name))
        # TensorFlow's imports add finders of their own: look for tpushim's.
        print("after every import:", not any("tpushim" in type(f).__module__ for f in sys.meta_path))
    """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "waiting: 1" in proc.stdout
    assert "after unpatch: True" in proc.stdout and "again: True" in proc.stdout
    assert "after every import: True" in proc.stdout


@pytest.mark.parametrize(
    "sequence",
    [
        "patch unpatch patch",
        "patch patch unpatch",
        "unpatch unpatch patch",
        "unpatch patch patch patch unpatch unpatch",
        "patch unpatch unpatch patch patch",
    ],
)
def test_lifecycle_never_wraps_twice(sequence):
    for step in sequence.split():
        getattr(tpushim, step)()
        assert _one_layer() == (step == "patch")
        assert tpushim.is_patched() == (step == "patch")


def test_unpatch_before_patch_is_harmless():
    tpushim.unpatch()
    assert [getattr(module, name) for module, name in WRAPPED] == ORIGINALS
    assert not _one_layer()


def test_unpatch_leaves_someone_elses_wrapper_alone():
    tpushim.patch()
    theirs = []
    for module, name in WRAPPED:
        ours = getattr(module, name)
        # another library's wrapper on top of ours (a function, or its own view of a module)
        if name == "estimator_lib":
            their = types.ModuleType("their_view_of_estimator_lib")
        else:
            their = functools.partial(ours)
        setattr(module, name, their)
        theirs.append(their)
    try:
        tpushim.unpatch()
        assert [getattr(module, name) for module, name in WRAPPED] == theirs
    finally:
        for (module, name), original in zip(WRAPPED, ORIGINALS):
            setattr(module, name, original)


def test_sixteen_threads_patch_at_once():
    barrier = threading.Barrier(16)
    errors = []

    def worker(i):
        try:
            barrier.wait()
            tpushim.patch(mode=("cpu", "auto")[i % 2])
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert _one_layer()


def test_second_patch_updates_settings_and_logs(tpushim_log):
    tpushim.patch(mode="cpu")
    tpushim.patch(mode="auto", batch_size=16)
    assert tpushim.status()["mode"] == "auto"
    assert tpushim.status()["batch_size"] == 16
    assert "settings updated from mode='cpu' to mode='auto', batch_size=16" in tpushim_log.text


def test_status_reports_versions_and_tpu(monkeypatch):
    monkeypatch.setenv("TPU_NAME", "grpc://127.0.0.1:1")
    tpushim.patch(mode="cpu")
    status = tpushim.status()
    assert status["patched"] is True
    assert (status["mode"], status["mode_source"]) == ("cpu", "argument")
    assert (status["tpu"], status["tpu_source"]) == ("grpc://127.0.0.1:1", "TPU_NAME")
    assert status["versions"]["tensorflow"] == tf.__version__
    # The Keras tf.keras is: Keras 2 (tf-keras on TensorFlow >= 2.16), not Keras 3 installed beside it.
    keras_of_tf_keras = sys.modules[tf.keras.Model.__module__.split(".")[0]]  # keras or tf_keras
    assert status["versions"]["keras"] == keras_of_tf_keras.__version__
    assert status["versions"]["keras"].startswith("2.")
    if (
        ESTIMATOR_API
    ):  # tf.keras is tf_keras there; tpushim's estimator API, the strategy engine its TPU path
        assert status["versions"]["tensorflow_estimator"] is None
        assert set(status["applied"]) == {f"{m}.{a}" for m, a, _ in _patch.targets()}
        assert status["applied"]["tensorflow.estimator"] is True
        assert set(status["applied"].values()) <= {True, "pending import"}, status["applied"]
        assert status["decision"]["action"] == "cpu"
        assert status["decision"]["returns"] == (
            "the strategy engine (tf.distribute.MirroredStrategy over this machine's devices): "
            f"the TPU code path on CPU/GPU (TensorFlow {tf.__version__} has no TPUEstimator)"
        )
        return
    assert status["versions"]["tensorflow_estimator"]
    assert status["applied"] == {
        "tensorflow_estimator.python.estimator.keras_lib.model_to_estimator": True,
        "tensorflow_estimator.python.estimator.extenders.estimator_lib": True,
        "tensorflow_estimator.python.estimator.estimator.Estimator.__new__": "pending conversion",
    }
    assert status["decision"]["action"] == "cpu"  # mode cpu wins over the TPU found
    assert (
        status["decision"]["returns"] == "TPUEstimator(use_tpu=False): the TPU code path on CPU/GPU"
    )


def test_public_api_names_and_check_signature():
    import inspect

    from tpushim import _preflight

    assert {"TPUShimError", "ConfigurationError", "ConversionError", "NoTPUError"} <= set(
        tpushim.__all__
    )
    assert all(hasattr(tpushim, name) for name in tpushim.__all__)
    # tpushim.check shows the preflight's own keywords and defaults, so they cannot drift apart.
    assert list(inspect.signature(tpushim.check).parameters.values()) == list(
        inspect.signature(_preflight.check).parameters.values()
    )


def test_status_is_typed_by_the_status_typeddict_and_typing_stays_unimported():
    proc = procs.python(
        code="""
        import json, sys, tpushim
        tpushim.patch()
        typing_at_start = "typing" in sys.modules
        keys = sorted(tpushim.status())
        print(json.dumps({"typing": typing_at_start, "keys": keys}))
        import typing
        hints = typing.get_type_hints(tpushim.Status)
        print(json.dumps({"keys": sorted(hints), "decision": sorted(typing.get_type_hints(hints["decision"]))}))
        """
    )
    assert proc.returncode == 0, proc.stderr
    before, after = (json.loads(line) for line in proc.stdout.splitlines())
    assert before["typing"] is False  # the annotations cost start-up nothing
    assert after["keys"] == before["keys"]  # every key status() returns, and only those
    assert after["decision"] == ["action", "returns", "why"]


def test_a_name_bound_before_patch_converts_in_the_default_mode(tmp_path):
    from tensorflow.keras.estimator import model_to_estimator  # bound before patch()

    tpushim.patch()
    est = model_to_estimator(keras_model=tfcases.sequential(), model_dir=str(tmp_path))
    assert type(est) is EstimatorV2


def _stock_refusal():
    """What stock's function does with no model: NotImplementedError on TensorFlow >= 2.16 (no
    estimator there), ValueError (no keras_model) before."""
    return pytest.raises(NotImplementedError if ESTIMATOR_API else ValueError)


@pytest.mark.parametrize("name", sorted(BOUND_BEFORE_PATCH))
def test_a_name_bound_before_patch_converts_wherever_it_is_held_then_reverts(name, tmp_path):
    """Every spelling, bound before patch() and held in a closure (no module namespace): on
    TensorFlow >= 2.16 tf_keras's own function, which delegates to tpushim while patched only."""
    fn, version = BOUND_BEFORE_PATCH[name]

    def held_in_a_closure(f):
        def call(**kwargs):
            return f(**kwargs)  # f: a closure cell, in no module's namespace

        return call

    call = held_in_a_closure(fn)
    code, signature = getattr(fn, "__code__", None), inspect.signature(fn)
    for _ in range(2):  # patched twice: the same again
        tpushim.patch()
        est = call(keras_model=tfcases.sequential(), model_dir=str(tmp_path / "a"))
        assert type(est) is (EstimatorV2 if version == "v2" else EstimatorV1)
        assert inspect.signature(fn) == signature  # the parameters stay visible while it delegates
        tpushim.unpatch()
        assert getattr(fn, "__code__", None) is code  # the very code object again
        assert "__signature__" not in vars(fn)
        with _stock_refusal():
            call(keras_model=None)


def test_a_name_bound_before_a_scope_converts_inside_it_in_its_thread_only(tmp_path, caplog):
    """``patched()``: the function bound before converts inside the scope; another thread's call
    meanwhile is stock's (no recursion through tpushim's wrapper), and so is any call after it."""
    fn, _ = BOUND_BEFORE_PATCH["from tensorflow.keras.estimator import"]
    logging.getLogger("tpushim").setLevel(logging.INFO)
    caplog.set_level(logging.INFO, logger="tpushim")
    other = {}

    def other_thread():
        try:
            fn(keras_model=None)
        except Exception as e:  # the type is what is checked
            other["raised"] = type(e)

    with tpushim.patched():
        est = fn(keras_model=tfcases.sequential(), model_dir=str(tmp_path))
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert type(est) is EstimatorV2
    assert other["raised"] is (NotImplementedError if ESTIMATOR_API else ValueError)
    with _stock_refusal():
        fn(keras_model=None)
    said = [
        r.getMessage() for r in caplog.records if "bound to it before the patch" in r.getMessage()
    ]
    if ESTIMATOR_API:  # one line names the function that delegated
        assert said == [
            "tpushim: tf_keras.src.estimator.model_to_estimator_v2 was called through a name "
            "bound to it before the patch; tpushim makes that function itself call its wrapper "
            "while patched, so it converts (unpatch restores it)"
        ]
    else:  # every spelling calls keras_lib's function at call time: nothing delegates
        assert said == []
