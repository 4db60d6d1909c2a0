"""The mode decision (tpushim/_decision.py): what a model_to_estimator call returns, and why.

Pure: settings and the TPU found in, a decision out. How the wrapper acts on each decision is
tests/unit/test_modes_detect.py's (real conversions); here, the table, and that ``status()`` carries the
decision a call made at that moment would act on.
"""

import pytest

import tpushim
from tpushim import _decision, _settings, _versions
from tpushim._detect import TPUSpec

TPU = TPUSpec("grpc://127.0.0.1:1", "TPU_NAME")
#: The rows whose call takes the TPU path: TPUEstimator's on TensorFlow <= 2.15.
TPU_PATH = pytest.mark.tpuestimator


@pytest.mark.parametrize(
    "mode,tpu,action,returns",
    [
        ("off", TPU, "stock", "the stock estimator (mode off, from argument)"),
        ("off", None, "stock", "the stock estimator (mode off, from argument)"),
        pytest.param(
            *("cpu", TPU, "cpu", "TPUEstimator(use_tpu=False): the TPU code path on CPU/GPU"),
            marks=TPU_PATH,
        ),
        pytest.param(
            *("cpu", None, "cpu", "TPUEstimator(use_tpu=False): the TPU code path on CPU/GPU"),
            marks=TPU_PATH,
        ),
        pytest.param(
            *("auto", TPU, "tpu", "TPUEstimator on TPU grpc://127.0.0.1:1 (from TPU_NAME)"),
            marks=TPU_PATH,
        ),
        pytest.param(
            *("tpu", TPU, "tpu", "TPUEstimator on TPU grpc://127.0.0.1:1 (from TPU_NAME)"),
            marks=TPU_PATH,
        ),
        (
            "auto",
            None,
            "stock",
            "the stock estimator (no TPU configured; --mode cpu runs the TPU code path on CPU)",
        ),
        (
            "tpu",
            None,
            "no-tpu",
            "an error, tpushim.NoTPUError: mode tpu needs a TPU and none is configured",
        ),
    ],
)
def test_decision_table(mode, tpu, action, returns):
    decision = _decision.decide(_settings.Settings(mode=mode, sources={"mode": "argument"}), tpu)
    assert (decision.action, decision.returns) == (action, returns)
    assert decision.tpu is (tpu if action == "tpu" else None)


def test_the_why_names_where_the_mode_came_from():
    settings = _settings.resolve(environ={"TPUSHIM_MODE": "off"})
    assert _decision.decide(settings, TPU).why == "tpushim mode off, from TPUSHIM_MODE=off"
    no_tpu = _decision.decide(_settings.resolve([{"mode": "tpu"}], environ={}), None)
    assert no_tpu.why.startswith(
        "tpushim mode 'tpu' (from argument) needs a TPU, and none is configured."
    )
    assert "TPUSHIM_MODE=cpu" in no_tpu.why  # what to do instead


def test_a_decision_is_immutable():
    decision = _decision.decide(_settings.Settings(), None)
    with pytest.raises(AttributeError):
        decision.action = "tpu"


@pytest.mark.parametrize(
    "env,patch_kwargs,action",
    [
        ({}, {}, "stock"),
        pytest.param({"TPU_NAME": "grpc://127.0.0.1:1"}, {}, "tpu", marks=TPU_PATH),
        pytest.param({"TPU_NAME": "grpc://127.0.0.1:1"}, {"mode": "cpu"}, "cpu", marks=TPU_PATH),
        ({"TPU_NAME": "grpc://127.0.0.1:1", "TPUSHIM_MODE": "off"}, {"mode": "cpu"}, "stock"),
        pytest.param({}, {"mode": "tpu"}, "no-tpu", marks=TPU_PATH),
    ],
)
def test_status_carries_the_decision_a_call_would_act_on(monkeypatch, env, patch_kwargs, action):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    tpushim.patch(**patch_kwargs)
    status = tpushim.status()
    assert status["decision"]["action"] == action
    assert status["decision"]["returns"].startswith(
        {
            # TensorFlow >= 2.16 has no estimators: tpushim's own takes stock's place
            "stock": "tpushim's estimator"
            if _versions.uses_own_estimator()
            else "the stock estimator",
            "tpu": "TPUEstimator on TPU grpc://127.0.0.1:1 (from TPU_NAME)",
            "cpu": "TPUEstimator(use_tpu=False)",
            "no-tpu": "an error, tpushim.NoTPUError",
        }[action]
    )
