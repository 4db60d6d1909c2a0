"""The engine protocol and registry (tpushim/_engines/): every engine found through one ordered
registry, ``engine=auto`` taking the first that can run here, and the engine decided once per
conversion (tpushim/_decision.py) and carried to the build (tpushim/_convert.py).
"""

import json
import os

import procs
import pytest

from tpushim import _decision, _engines, _settings, _versions
from tpushim._engines import jax_engine
from tpushim._engines import strategy as strategy_engine
from tpushim._engines import tpuestimator as tpuestimator_engine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def settings(**kwargs):
    return _settings.resolve((_settings.parse_arguments(**kwargs),), environ={})


def test_the_registry_holds_every_engine_in_order_of_preference():
    assert _engines.names() == ("tpuestimator", "jax", "strategy") == _settings.ENGINES[1:]
    assert all(isinstance(engine, _engines.Engine) for engine in _engines.ENGINES)
    assert isinstance(_engines.get("tpuestimator"), tpuestimator_engine.TPUEstimatorEngine)
    assert isinstance(_engines.get("jax"), jax_engine.JaxEngine)
    assert isinstance(_engines.get("strategy"), strategy_engine.StrategyEngine)
    with pytest.raises(
        KeyError, match="no tpushim engine 'pytorch'; the engines: tpuestimator, jax"
    ):
        _engines.get("pytorch")


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


# --- the JAX engine: chosen where JAX sees a TPU that TensorFlow cannot use ------------------------


@pytest.fixture
def jax_here(monkeypatch):
    """The facts the JAX engine's choice reads, faked (nothing imported, no device opened): jax
    and tf2jax installed or not, a TPU device file with libtpu or not, tensorflow-tpu's version."""
    from tpushim import _detect

    facts = {"missing": [], "device": "/dev/vfio/0", "tensorflow_tpu": None}
    monkeypatch.setattr(jax_engine, "_missing", lambda: list(facts["missing"]))
    monkeypatch.setattr(_detect, "tpu_vm_device", lambda environ=None: facts["device"])
    monkeypatch.setattr(jax_engine, "tensorflow_tpu_version", lambda: facts["tensorflow_tpu"])
    return facts


def test_auto_chooses_jax_where_jax_sees_a_tpu_tensorflow_cannot_use(jax_here):
    engine, why = _engines.choose(settings(), environ={}, tf_version="2.21.0")
    assert engine == "jax"
    assert why == "TensorFlow 2.21.0 has no TPUEstimator; " + jax_engine.JaxEngine.chosen_why


@pytest.mark.parametrize(
    "fact,value,tf_version,engine",
    [
        ("tensorflow_tpu", "2.20.0", "2.20.0", "strategy"),  # TensorFlow runs this TPU itself
        ("device", None, "2.21.0", "strategy"),  # no TPU JAX could use
        ("missing", ["tf2jax"], "2.21.0", "strategy"),  # the extra not installed
        ("tensorflow_tpu", "2.20.0", "2.15.1", "tpuestimator"),  # TPUEstimator first
    ],
)
def test_auto_leaves_jax_where_it_does_not_apply(jax_here, fact, value, tf_version, engine):
    jax_here[fact] = value
    chosen, why = _engines.choose(settings(), environ={}, tf_version=tf_version)
    assert chosen == engine and "JAX" not in why and "jax" not in why, why


def test_engine_jax_without_jax_is_refused_naming_the_install(jax_here):
    from tpushim import ConversionError

    jax_here["missing"] = ["jax", "tf2jax"]
    with pytest.raises(ConversionError, match=r"jax and tf2jax not installed.*tpushim\[jax\]"):
        _engines.get("jax").refuse_here(settings(engine="jax"))


def test_the_decision_names_the_jax_engine(jax_here):
    decision = _decision.decide(settings(mode="cpu", engine="jax"), None)
    assert (decision.engine, decision.engine_why) == ("jax", "engine jax from argument")
    assert decision.returns.startswith("the JAX engine")


def test_the_decision_carries_the_engine_and_its_why():
    decision = _decision.decide(settings(mode="cpu", engine="strategy"), None)
    assert (decision.engine, decision.engine_why) == ("strategy", "engine strategy from argument")
    stock = _decision.decide(settings(mode="off"), None)
    assert (stock.engine, stock.engine_why) == (None, None)


def test_the_jax_engine_skips_tensorflows_tpu_resolver_and_check(monkeypatch):
    # A TPU VM where JAX has the TPU and TensorFlow cannot drive it: TensorFlow's resolver and
    # TPU check (check_tpu_support would refuse: no tensorflow-tpu) are never asked.
    from tpushim import _convert, _detect

    asked = []
    monkeypatch.setattr(_detect, "cluster_resolver", lambda spec, *a: asked.append(spec) or "c")
    monkeypatch.setattr(_detect, "check_tpu_answers", lambda c, source, *a: asked.append(source))
    tpu = _detect.TPUSpec("local", "TPU VM (/dev/vfio/0)")
    cluster = _convert.tpu_resolver(jax_engine.JaxEngine(), tpu)
    _convert.check_tpu_answers(cluster, tpu)
    assert cluster is None and asked == []
    # The engines that drive the TPU through TensorFlow still resolve it and ask it to answer.
    for engine in (strategy_engine.StrategyEngine(), tpuestimator_engine.TPUEstimatorEngine()):
        asked.clear()
        cluster = _convert.tpu_resolver(engine, tpu)
        _convert.check_tpu_answers(cluster, tpu)
        assert cluster == "c" and asked == [tpu, "TPU VM (/dev/vfio/0)"]


def test_the_jax_engine_refuses_a_tpu_node_over_grpc():
    from tpushim import ConversionError, _detect

    tpu = _detect.TPUSpec("grpc://10.0.0.2:8470", "TPU_NAME")
    with pytest.raises(
        ConversionError, match=r"grpc://10.0.0.2:8470 \(from TPU_NAME\) is a TPU node"
    ):
        jax_engine.JaxEngine().plan(None, None, None, settings(engine="jax"), tpu, None)


def test_the_engines_import_no_tensorflow():
    proc = procs.python(
        code="""
            import sys
            import tpushim._engines, tpushim._convert, tpushim._decision
            from tpushim import _settings
            s = _settings.resolve((_settings.parse_arguments(),), environ={})
            tpushim._engines.select(s, environ={}, tf_version="2.21.0")  # every engine asked
            print(sorted(
                m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "jax", "tf2jax")
            ))
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
