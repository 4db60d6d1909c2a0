"""Shared fixtures. After every test: tpushim's state (``_patch.reset()``), the environment and Keras
are restored."""

import logging
import os

import pytest

from tpushim import _detect, _engines, _patch, _platforms, _settings, _versions

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if (
    _versions.uses_own_estimator()
    and os.environ.get(_versions.LEGACY_KERAS) not in _versions.LEGACY_KERAS_ON
):
    # TensorFlow >= 2.16: the suite's models are Keras 2 (tf_keras), as tpushim.patch() makes a
    # script's tf.keras; TensorFlow reads this once, when tf.keras is first touched (tfcases does at
    # import). Subprocess tests that check tpushim setting it pass TF_USE_LEGACY_KERAS="" themselves.
    os.environ[_versions.LEGACY_KERAS] = "1"

#: Why a ``@pytest.mark.tpuestimator`` test is skipped on TensorFlow >= 2.16 (registered in pytest.ini).
TPUESTIMATOR_REASON = (
    "the TPUEstimator path exists on TensorFlow <= 2.15; on 2.16+ the TPU path is the strategy "
    "engine, #33"
)


#: The strategy engine's proofs against stock (subprocesses on 8 logical devices, the scripts on
#: the engine): marked ``strategy_proof``. Issue 33 asks them of TensorFlow 2.15 and the newest;
#: CI runs them there, and leaves them out on the oldest release, whose whole suite it also runs.
STRATEGY_PROOFS = {
    "test_strategy_batchnorm.py",
    "test_strategy_checkpoints.py",
    "test_strategy_events.py",
    "test_strategy_hooks.py",
    "test_strategy_input_reads.py",
    "test_strategy_inputs.py",
    "test_strategy_metrics.py",
    "test_strategy_optimizers.py",
    "test_strategy_pods.py",
    "test_strategy_replicas.py",
    "test_strategy_row_labels.py",
    "test_strategy_step.py",
    "test_strategy_subclassed.py",
}
STRATEGY_SCRIPT_TESTS = {"test_script_unchanged_on_the_strategy_engine_equals_stock"}

#: Of those, the proofs of the engine's step arithmetic (replicas, optimizers, BatchNormalization,
#: subclassed models, the compiled step), its input styles, pods (each host's pipeline from
#: tf.distribute's InputContext and tpushim's own split) and events (log lines, TensorBoard events,
#: the NaN check, the checkpoints kept: the engine's _stock_hooks) and the scripts on the engine
#: run on TensorFlow >= 2.16, where the engine is the only TPU path, against stock 2.15's recorded
#: numbers (each proof recorded them live on 2.15). The engine's code for them is the same on
#: every TensorFlow (on <= 2.15 the TPUEstimator path's own input and event tests run stock's
#: numpy_input_fn / pandas_input_fn, queues and hooks); on <= 2.15 the proofs of what stock's own
#: estimator does with the engine run (the user's hooks, checkpoints, metrics, row labels).
#: CI's budget (docs/contributing/ci.md); ``TPUSHIM_TEST_EVERY_PROOF=1`` runs them on <= 2.15 too.
NEWEST_ONLY_PROOFS = {
    "test_strategy_batchnorm.py",
    "test_strategy_events.py",
    "test_strategy_inputs.py",
    "test_strategy_optimizers.py",
    "test_strategy_pods.py",
    "test_strategy_replicas.py",
    "test_strategy_step.py",
    "test_strategy_subclassed.py",
}
#: Single tests of the same kind, by name: the engine's arithmetic against stock 2.15's
#: recording (an input loss beside BatchNormalization; the layers' training mode), and the
#: strategy benchmark's driver around the engine's loop (the same loop on every TensorFlow).
NEWEST_ONLY_TESTS = {
    "test_input_loss_beside_batchnormalization_trains_stocks_numbers",
    "test_layers_read_the_training_mode_as_stock_2_15",
    "test_strategy_section_driver_measures_fit_and_the_engine_in_one_process",
    "test_sparse_inputs_train_evaluate_predict_as_stock_on_the_strategy_engine",
}
NEWEST_ONLY_REASON = (
    "this proof of the strategy engine runs on TensorFlow >= 2.16, against stock 2.15's recorded "
    "numbers (TPUSHIM_TEST_EVERY_PROOF=1 runs it here)"
)


#: Modules whose tests share a module- or session-scoped fixture (a proof's subprocess, an
#: emulated TPU system's run): pytest-xdist's default scheduling hands a module's tests out in
#: chunks, and a module split between two workers runs its fixture in each (a proof twice).
#: Each of these goes to one worker whole (tests/tools/test_suite_scheduling.py keeps the list complete).
#: Legacy scripts against stock in cpu mode on the TPUEstimator path: marker ``legacy_scripts``
#: (those of OLDEST_LEGACY_SCRIPTS), which CI's oldest TensorFlow runs beside its fast tier (every
#: script, its preflight and the strategy engine's runs of them run on 2.15 and the newest).
LEGACY_SCRIPTS_TEST = "test_script_unchanged_under_cpu_mode_equals_stock"
#: The scripts the oldest TensorFlow runs so: one for each part of the conversion whose Keras
#: internals differ by version (tf.compat.v1 behaviour and numpy input, train_and_evaluate with
#: an exporter, DenseFeatures in the model, BatchNormalization after the columns with Ftrl and
#: Adam, add_metrics, a keyed second output, string features and lookups, an Estimator rebuilt
#: around the converted model_fn). The other scripts differ in their input pipelines, which
#: tpushim feeds with the same code on every TensorFlow; 2.15 and the newest run them all.
OLDEST_LEGACY_SCRIPTS = {
    "census_numpy_tf1.py",
    "taxi_csv_train_and_evaluate.py",
    "boston_feature_columns_in_model.py",
    "boston_feature_columns_batchnorm.py",
    "iris_add_metrics.py",
    "keyed_outputs_constant_loss.py",
    "multi_input_lists_strings.py",
    "text_rebuilt_estimator.py",
}

SHARED_FIXTURE_MODULES = {
    "test_arrays.py",
    "test_jax_draws.py",
    "test_jax_export.py",
    "test_jax_hooks.py",
    "test_jax_pods.py",
    "test_jax_proof.py",
    "test_jax_subclassed.py",
    "test_pods.py",
    "test_rewrap.py",
    "test_strategy_batchnorm.py",
    "test_strategy_events.py",
    "test_strategy_hooks.py",
    "test_strategy_inputs.py",
    "test_strategy_metrics.py",
    "test_strategy_optimizers.py",
    "test_strategy_pods.py",
    "test_strategy_replicas.py",
    "test_strategy_step.py",
    "test_strategy_subclassed.py",
    "test_strategy_tf216.py",
    "test_tpu_emulation.py",
    "test_tpu_losses.py",
}


def pytest_xdist_make_scheduler(config, log):
    """``-n``'s default ("load") scheduling, but a module of :data:`SHARED_FIXTURE_MODULES` one
    unit of work (xdist's scope scheduling, every other test a scope of its own)."""
    if config.getoption("dist") != "load":
        return None  # a --dist the caller chose
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split("::", 1)[0]
            return path if os.path.basename(path) in SHARED_FIXTURE_MODULES else nodeid

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in STRATEGY_PROOFS or item.originalname in STRATEGY_SCRIPT_TESTS:
            item.add_marker(pytest.mark.strategy_proof)
        if (
            item.originalname == LEGACY_SCRIPTS_TEST
            and item.callspec.params["script"] in OLDEST_LEGACY_SCRIPTS
        ):
            item.add_marker(pytest.mark.legacy_scripts)
    if not _versions.uses_own_estimator():
        if os.environ.get("TPUSHIM_TEST_EVERY_PROOF") != "1":
            newest_only = pytest.mark.skip(reason=NEWEST_ONLY_REASON)
            for item in items:
                if (
                    item.path.name in NEWEST_ONLY_PROOFS
                    or item.originalname in STRATEGY_SCRIPT_TESTS
                    or item.originalname in NEWEST_ONLY_TESTS
                ):
                    item.add_marker(newest_only)
        return
    skip = pytest.mark.skip(reason=TPUESTIMATOR_REASON)
    for item in items:
        if item.get_closest_marker("tpuestimator") is not None:
            item.add_marker(skip)


#: every variable that configures tpushim or a TPU: unset in each test (tests/helpers import this)
TPUSHIM_VARS = tuple(
    dict.fromkeys(
        (
            *_settings.ENV_VARS.values(),
            _settings.LOG_LEVEL_VAR,
            _settings.SUMMARY_VAR,
            "TPUSHIM_AUTOPATCH",
            *_detect.TPU_ENV_VARS,
            *_engines.PJRT_VARS,
            *_platforms.PLATFORM_ENV_VARS,  # a test on Colab or Kaggle runs as on a laptop
        )
    )
)


@pytest.fixture(autouse=True)
def restore_state(monkeypatch):
    for var in TPUSHIM_VARS:  # tests start from a machine with no TPU configured
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("tpushim._detect.DEVICE_GLOBS", ())
    environ = dict(os.environ)
    yield
    try:
        # Unpatched, no pending hooks, the guard forgotten; raises (failing the test) if a scope is open.
        _patch.reset()
    finally:
        os.environ.clear()
        os.environ.update(environ)
    import sys

    if "tensorflow" in sys.modules:
        import tensorflow as tf

        tf.keras.backend.clear_session()


@pytest.fixture
def tpushim_log(caplog):
    caplog.set_level(logging.INFO, logger="tpushim")
    return caplog


@pytest.fixture
def ipython_shell(tmp_path, monkeypatch):
    """An in-process IPython shell; what it takes over (sys.modules['__main__'], hooks) comes back."""
    import sys

    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    monkeypatch.setattr(sys, "displayhook", sys.displayhook)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    config = Config()
    config.HistoryManager.enabled = False
    yield InteractiveShell.instance(config=config)
    InteractiveShell.clear_instance()


class TPUEstimatorOnly:
    """Stands, on TensorFlow >= 2.16, for a name only the TPUEstimator path has (tensorflow_estimator,
    tpushim's TPUEstimator modules), so that a test module imports there and its
    ``@pytest.mark.tpuestimator`` tests are skipped. Any use of it outside such a test raises."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return TPUEstimatorOnly(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):  # a table built at import (parametrize): a stand-in too
        return TPUEstimatorOnly(f"{self._name}(...)")

    def __bool__(self):
        raise RuntimeError(f"{self._name} exists on TensorFlow <= 2.15 only: {TPUESTIMATOR_REASON}")

    __iter__ = __index__ = __int__ = __bool__


def tpuestimator_import(module, *names):
    """``module`` (or its ``names``), imported where TensorFlow <= 2.15 has the TPUEstimator path;
    :class:`TPUEstimatorOnly` stand-ins on TensorFlow >= 2.16."""
    import importlib

    if _versions.uses_own_estimator():
        found = [TPUEstimatorOnly(f"{module}.{n}") for n in names] or [TPUEstimatorOnly(module)]
    else:
        imported = importlib.import_module(module)
        found = [
            getattr(imported, n)
            if hasattr(imported, n)
            else importlib.import_module(f"{module}.{n}")
            for n in names
        ] or [imported]
    return found[0] if len(found) == 1 else found
