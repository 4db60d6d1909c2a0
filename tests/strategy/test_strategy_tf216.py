"""The strategy engine on TensorFlow >= 2.16 (tpushim/_strategy/ on tpushim's own Estimator,
tpushim/_estimator_api): ``mode=cpu``/``tpu`` and ``engine=strategy`` convert to it, ``engine=auto``
picks it, ``engine=tpuestimator`` stops naming why. Its numbers (8 replicas = 1 = stock 2.15)
are tests/proofs/test_strategy_replicas.py's, which runs on every TensorFlow.

Runs only where TensorFlow >= 2.16 is installed; each case is a subprocess, as
tests/estimator_api/test_estimator_api_scripts.py's (``TF_USE_LEGACY_KERAS`` is decided once per process).
"""

import json
import os

import procs
import pytest

from tpushim import _versions

pytestmark = [
    pytest.mark.skipif(
        not _versions.uses_own_estimator(),
        reason="TensorFlow < 2.16 installed: tests/strategy/test_strategy.py covers the engine there",
    ),
    pytest.mark.slow,  # a subprocess
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": "1"}

CONVERSIONS = """
import json, logging, sys
import tpushim
import tensorflow as tf
from tpushim._strategy import estimator as _strategy_estimator
from tpushim._estimator_api import _estimator

def model():
    m = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,), name="out")])
    m.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    return m

lines = []
handler = logging.Handler()
handler.emit = lambda record: lines.append(record.getMessage())
logging.getLogger("tpushim").addHandler(handler)
logging.getLogger("tpushim").setLevel(logging.INFO)
out = {}
for name, kwargs in [
    ("cpu", {"mode": "cpu"}),
    ("strategy", {"mode": "cpu", "engine": "strategy"}),
    ("auto_no_tpu", {}),
    ("tpuestimator", {"mode": "cpu", "engine": "tpuestimator"}),
    ("tpu_no_tpu", {"mode": "tpu"}),
]:
    model_dir = sys.argv[1] + "/" + name
    try:
        with tpushim.patched(**kwargs):
            e = tf.keras.estimator.model_to_estimator(keras_model=model(), model_dir=model_dir)
        out[name] = {
            "strategy": isinstance(e, _strategy_estimator.StrategyEstimator),
            "engine_estimator": isinstance(e, _estimator.Estimator),
        }
    except Exception as e:
        import os
        out[name] = {"error": f"{type(e).__name__}: {e}", "written": os.path.exists(model_dir)}
with tpushim.patched(mode="cpu"):
    out["status"] = tpushim.status()["decision"]["returns"]
with tpushim.patched(mode="cpu", engine="tpuestimator"):
    out["status_tpuestimator"] = tpushim.status()["decision"]["returns"]
out["lines"] = [line for line in lines if line.startswith("model_to_estimator ->")]
print("RESULT " + json.dumps(out))
"""


def _result(proc):
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture(scope="module")
def conversions(tmp_path_factory):
    root = tmp_path_factory.mktemp("conversions")
    proc = procs.python([root], code=CONVERSIONS, env=ENV)
    out = _result(proc)
    return out, "\n".join(out.pop("lines"))


def test_tpu_code_path_converts_to_the_strategy_engine(conversions):
    out, lines = conversions
    for name in ("cpu", "strategy"):
        assert out[name] == {"strategy": True, "engine_estimator": True}, out[name]
    # The conversion line says the engine and why (auto: TensorFlow has no TPUEstimator).
    assert (
        "model_to_estimator -> the strategy engine: tf.distribute.MirroredStrategy over "
        "this machine's devices [mode cpu from argument]"
    ) in lines
    assert "has no TPUEstimator]" in lines and "[engine: engine strategy from argument]" in lines
    assert "the strategy engine (tf.distribute.MirroredStrategy" in out["status"]


def test_no_tpu_configured_stays_on_stocks_path(conversions):
    out, _ = conversions
    assert out["auto_no_tpu"] == {"strategy": False, "engine_estimator": True}
    assert out["tpu_no_tpu"]["error"].startswith("NoTPUError: tpushim mode 'tpu'")


def test_engine_tpuestimator_stops_naming_why(conversions):
    out, _ = conversions
    got = out["tpuestimator"]
    assert got["error"].startswith("ConversionError: engine=tpuestimator (from argument)"), got
    assert "has no TPUEstimator" in got["error"] and "engine='strategy'" in got["error"]
    assert not got["written"]  # refused before model_dir was made
    assert "no TPUEstimator" in out["status_tpuestimator"]
