"""The engine protocol and registry (tpushim/_engines/): every engine found through one ordered
registry, ``engine=auto`` taking the first that can run here, and the engine decided once per
conversion (tpushim/_decision.py) and carried to the build (tpushim/_convert.py).
"""

import json
import os

import procs
import pytest

from tpushim import _decision, _engines, _settings, _versions
from tpushim._engines import strategy as strategy_engine
from tpushim._engines import tpuestimator as tpuestimator_engine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def settings(**kwargs):
    return _settings.resolve((_settings.parse_arguments(**kwargs),), environ={})


def test_the_registry_holds_every_engine_in_order_of_preference():
    assert _engines.names() == ("tpuestimator", "strategy") == _settings.ENGINES[1:]
    assert all(isinstance(engine, _engines.Engine) for engine in _engines.ENGINES)
    assert isinstance(_engines.get("tpuestimator"), tpuestimator_engine.TPUEstimatorEngine)
    assert isinstance(_engines.get("strategy"), strategy_engine.StrategyEngine)
    with pytest.raises(KeyError, match="no tpushim engine 'jax'; the engines: tpuestimator, strat"):
        _engines.get("jax")


@pytest.mark.parametrize(
    "environ,tf_version,engine,why",
    [
        ({}, "2.15.1", "tpuestimator", "TPUEstimator runs here (engine auto)"),
        ({}, "2.16.1", "strategy", "TensorFlow 2.16.1 has no TPUEstimator"),
        (
            {"PJRT_DEVICE": "TPU"},
            "2.15.1",
            "strategy",
            "a PJRT TPU runtime (PJRT_DEVICE=TPU), where TPUEstimator cannot run",
        ),
    ],
)
def test_choose_answers_the_registrys_first_engine_that_runs_here(environ, tf_version, engine, why):
    selected, reason = _engines.select(settings(), environ=environ, tf_version=tf_version)
    assert (selected.name, reason) == (engine, why)
    assert _engines.choose(settings(), environ=environ, tf_version=tf_version) == (engine, why)


def test_a_named_engine_is_taken_as_named():
    selected, why = _engines.select(
        settings(engine="tpuestimator"), environ={"PJRT_DEVICE": "TPU"}, tf_version="2.16.1"
    )
    assert (selected, why) == (_engines.get("tpuestimator"), "engine tpuestimator from argument")


class _Refusing(_engines.Engine):
    name = "refusing"

    def unavailable(self, tf_version, environ):
        return f"refusing needs TensorFlow 9 (not {tf_version})"


class _Taking(_engines.Engine):
    name = "taking"
    chosen_why = "taking runs anywhere"


def test_auto_asks_each_engine_in_turn_and_says_why_the_earlier_ones_cannot(monkeypatch):
    monkeypatch.setattr(_engines, "ENGINES", (_Refusing(), _Taking()))
    assert _engines.choose(settings(), environ={}, tf_version="2.15.1") == (
        "taking",
        "refusing needs TensorFlow 9 (not 2.15.1)",
    )
    monkeypatch.setattr(_engines, "ENGINES", (_Taking(), _Refusing()))
    assert _engines.choose(settings(), environ={}, tf_version="2.15.1") == (
        "taking",
        "taking runs anywhere",
    )


def test_the_protocols_defaults_leave_everything_to_stock():
    engine = _Taking()
    assert engine.owns(object()) is False
    assert engine.add_metrics(object(), None, None) is None
    assert engine.rewrap(object, (), {}, None) is None
    assert engine.plan(None, None, None, None, None, None) is None
    assert engine.run_config(None, None, None) is None
    assert engine.refusals(None, None, None) is None and not engine.compiles_own_step
    assert engine.refuse_here(settings()) is None
    with pytest.raises(NotImplementedError):
        engine.build(None, None, None, None)
    assert _engines.owner(object()) is None


def test_the_decision_carries_the_engine_and_its_why():
    decision = _decision.decide(settings(mode="cpu", engine="strategy"), None)
    assert (decision.engine, decision.engine_why) == ("strategy", "engine strategy from argument")
    stock = _decision.decide(settings(mode="off"), None)
    assert (stock.engine, stock.engine_why) == (None, None)


def test_the_engines_import_no_tensorflow():
    proc = procs.python(
        code="""
            import sys
            import tpushim._engines, tpushim._convert, tpushim._decision
            print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras")))
        """,
        env={"PYTHONPATH": ROOT},
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr[-2000:]


# --- decided once per conversion ------------------------------------------------------------------

COUNTED = """
import json, sys
import tpushim
from tpushim import _engines

calls = []
select = _engines.select
_engines.select = lambda *args, **kwargs: calls.append(1) or select(*args, **kwargs)
import tensorflow as tf

out = {}
for engine in sys.argv[2:]:
    m = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,), name="out")])
    m.compile(tf.keras.optimizers.legacy.SGD(0.1), "mse")
    calls.clear()
    with tpushim.patched(mode="cpu", engine=engine):
        e = tf.keras.estimator.model_to_estimator(keras_model=m, model_dir=sys.argv[1] + engine)
    out[engine] = [type(e).__name__, len(calls)]
print("RESULT " + json.dumps(out))
"""


def test_the_engine_is_chosen_once_per_conversion(tmp_path):
    engines = ["strategy"] if _versions.uses_own_estimator() else ["tpuestimator", "strategy"]
    proc = procs.python(
        [str(tmp_path) + "/", *engines],
        code=COUNTED,
        env={
            "PYTHONPATH": ROOT,
            **({"TF_USE_LEGACY_KERAS": "1"} if engines == ["strategy"] else {}),
        },
        timeout=600,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    want = {"tpuestimator": "TPUShimEstimator", "strategy": "StrategyEstimator"}
    assert out == {engine: [want[engine], 1] for engine in engines}
