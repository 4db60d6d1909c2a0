"""Shared fixtures. After every test: tpushim's state (``_patch.reset()``), the environment and Keras
are restored."""

import logging
import os

import pytest

from tpushim import _detect, _engines, _patch, _settings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

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
