"""Shared fixtures. After every test: the unpatched state, the environment and Keras are restored."""

import logging
import os

import pytest

import tpushim
from tpushim import _patch

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TPUSHIM_VARS = ("TPUSHIM_MODE", "TPUSHIM_TPU", "TPUSHIM_BATCH_SIZE", "TPUSHIM_ITERATIONS_PER_LOOP",
                "TPUSHIM_AUTOPATCH", "TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_CONFIG",
                "COLAB_TPU_ADDR", "TPU_LIBRARY_PATH")


@pytest.fixture(autouse=True)
def restore_state(monkeypatch):
    for var in TPUSHIM_VARS:  # tests start from a machine with no TPU configured
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("tpushim._detect.DEVICE_GLOBS", ())
    environ = dict(os.environ)
    yield
    tpushim.unpatch()
    with _patch._lock:  # pylint: disable=protected-access
        assert _patch._open_scopes == 0, "a test left a tpushim.patched() scope open"  # pylint: disable=protected-access
        _patch._unsupported = None  # pylint: disable=protected-access
        _patch._warned = False  # pylint: disable=protected-access
    os.environ.clear()
    os.environ.update(environ)
    import sys  # pylint: disable=import-outside-toplevel
    if "tensorflow" in sys.modules:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        tf.keras.backend.clear_session()


@pytest.fixture
def tpushim_log(caplog):
    caplog.set_level(logging.INFO, logger="tpushim")
    return caplog
