"""Scoped use: ``with tpushim.patched(...)`` and ``@tpushim.patched(...)``."""

import asyncio
import inspect
import sys
import threading

import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

keras_lib = tpuestimator_import("tensorflow_estimator.python.estimator", "keras_lib")

import tpushim
from tpushim import _patch, _versions

TPUShimEstimator = tpuestimator_import("tpushim._estimator", "TPUShimEstimator")

ENGINE = (
    _versions.uses_own_estimator()
)  # TensorFlow >= 2.16: tpushim's estimator and strategy engines
ORIGINAL = tf.keras.estimator.model_to_estimator if ENGINE else keras_lib.model_to_estimator


def untouched():
    """Nothing of tpushim's left behind: the original model_to_estimator (on 2.16+ also no
    tf.estimator, which only a patch or a scope adds there)."""
    if ENGINE:
        return tf.keras.estimator.model_to_estimator is ORIGINAL and not hasattr(tf, "estimator")
    return keras_lib.model_to_estimator is ORIGINAL


def is_shim(convert):
    """Whether ``convert()`` takes the TPU path: it returns tpushim's TPUEstimator, or on
    TensorFlow >= 2.16 the strategy engine's estimator. Else it is stock's: its estimator, or on
    2.16+ tpushim's estimator (mode off) or stock's NotImplementedError (unpatched: no
    estimators there)."""
    try:
        est = convert()
    except NotImplementedError:
        assert ENGINE
        return False
    if ENGINE:
        from tpushim._strategy.estimator import StrategyEstimator

        return isinstance(est, StrategyEstimator)
    return isinstance(est, TPUShimEstimator)


def settings_here():
    """``(mode, batch_size)`` a call made now in this thread/task would use, from ``status()``;
    ``(None, None)`` where no scope applies (every scope in these tests names a mode)."""
    status = tpushim.status()
    return (
        (status["mode"], status["batch_size"])
        if status["mode_source"] == "argument"
        else (None, None)
    )


def test_inside_vs_outside_the_block(tmp_path):
    assert not is_shim(lambda: tfcases.convert(tmp_path / "before"))
    with tpushim.patched(mode="cpu") as scope:
        assert isinstance(scope, tpushim.patched)
        assert is_shim(lambda: tfcases.convert(tmp_path / "inside"))
        assert not tpushim.is_patched()  # a scope is not the process-wide patch
    assert not is_shim(lambda: tfcases.convert(tmp_path / "after"))
    assert untouched()  # nothing left behind


def test_scope_over_process_wide_patch_restores_it(tmp_path):
    tpushim.patch(mode="off")
    with tpushim.patched(mode="cpu"):
        assert is_shim(lambda: tfcases.convert(tmp_path / "inside"))
    assert not is_shim(lambda: tfcases.convert(tmp_path / "after"))
    assert tpushim.is_patched()
    applied = tpushim.status()["applied"]
    assert set(applied) == {f"{m}.{a}" for m, a, _ in _patch.targets()}
    if ENGINE:  # the modules a script has not touched yet are wrapped when it does
        assert set(applied.values()) <= {True, "pending import"}, applied
    else:
        assert set(applied.values()) == {True}, applied


def test_nested_innermost_wins_and_outer_settings_restored_exactly(tmp_path):
    with tpushim.patched(mode="cpu", batch_size=16):
        with tpushim.patched(mode="off"):
            assert settings_here() == (
                "off",
                16,
            )  # what the inner scope does not say, the outer does
            assert not is_shim(lambda: tfcases.convert(tmp_path / "inner"))
        assert settings_here() == ("cpu", 16)
        assert is_shim(lambda: tfcases.convert(tmp_path / "outer"))
    assert settings_here() == (None, None)


def test_exception_inside_leaves_no_residue(tmp_path):
    with pytest.raises(RuntimeError), tpushim.patched(mode="cpu"):
        raise RuntimeError("boom")
    assert settings_here() == (None, None)
    assert untouched()
    assert not is_shim(lambda: tfcases.convert(tmp_path / "after"))


def test_bad_arguments_raise_at_construction():
    with pytest.raises(tpushim.ConfigurationError, match="not a valid tpushim mode"):
        tpushim.patched(mode="sometimes")
    assert untouched()


def test_environment_is_read_on_entry_not_when_decorating(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUSHIM_BATCH_SIZE", "lots")
    # A module that decorates with @tpushim.patched imports fine under a bad variable ...
    (tmp_path / "tpushim_scoped_probe.py").write_text(
        "import tpushim\n\n@tpushim.patched(mode='cpu')\ndef build():\n    return 'built'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tpushim_scoped_probe", raising=False)
    import tpushim_scoped_probe

    scope = tpushim.patched(mode="cpu")
    # ... and the variable is refused when a scope is entered, before it opens.
    with pytest.raises(tpushim.ConfigurationError, match="TPUSHIM_BATCH_SIZE='lots'"):
        tpushim_scoped_probe.build()
    with pytest.raises(tpushim.ConfigurationError, match="TPUSHIM_BATCH_SIZE='lots'"), scope:
        pass
    assert untouched()
    # The value at entry counts, not the one at decoration.
    monkeypatch.setenv("TPUSHIM_BATCH_SIZE", "32")
    assert tpushim_scoped_probe.build() == "built"
    with scope:
        assert settings_here() == ("cpu", 32)
    monkeypatch.delitem(sys.modules, "tpushim_scoped_probe")


def test_kill_switch_wins_inside_a_scope(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUSHIM_MODE", "off")
    with tpushim.patched(mode="cpu"):
        assert not is_shim(lambda: tfcases.convert(tmp_path / "k"))


@tpushim.patched(mode="cpu")
def build_estimator(model_dir):
    """Builds an estimator the legacy way."""
    return tf.keras.estimator.model_to_estimator(
        keras_model=tfcases.sequential(), model_dir=model_dir
    )


class Trainer:
    @tpushim.patched(mode="cpu")
    def build(self, model_dir, *, seed=0):
        """Method docstring."""
        del seed
        return tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(), model_dir=model_dir
        )


def test_decorator_on_function_and_method_keeps_metadata(tmp_path):
    assert is_shim(lambda: build_estimator(str(tmp_path / "f")))
    assert is_shim(lambda: Trainer().build(str(tmp_path / "m")))
    assert not is_shim(lambda: tfcases.convert(tmp_path / "outside"))
    assert build_estimator.__name__ == "build_estimator"
    assert build_estimator.__doc__ == "Builds an estimator the legacy way."
    assert str(inspect.signature(build_estimator)) == "(model_dir)"
    assert Trainer.build.__name__ == "build" and Trainer.build.__doc__ == "Method docstring."
    assert str(inspect.signature(Trainer().build)) == "(model_dir, *, seed=0)"


def test_two_threads_at_once_each_get_their_own(tmp_path):
    inside_ready, outside_done = threading.Event(), threading.Event()
    results = {}

    def inside():
        with tpushim.patched(mode="cpu"):
            inside_ready.set()
            outside_done.wait(60)  # the other thread converts while this scope is open
            results["inside"] = is_shim(lambda: tfcases.convert(tmp_path / "t_in"))

    def outside():
        inside_ready.wait(60)
        results["outside"] = is_shim(lambda: tfcases.convert(tmp_path / "t_out"))
        outside_done.set()

    threads = [threading.Thread(target=inside), threading.Thread(target=outside)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == {"inside": True, "outside": False}


def test_asyncio_tasks_are_isolated():
    async def main():
        seen = {}
        gate = asyncio.Event()

        async def scoped():
            with tpushim.patched(mode="cpu"):
                gate.set()
                await asyncio.sleep(0.05)
                seen["scoped"] = settings_here()[0]

        async def plain():
            await gate.wait()
            seen["plain"] = settings_here()[0]

        await asyncio.gather(scoped(), plain())
        return seen

    seen = asyncio.run(main())
    assert seen == {"scoped": "cpu", "plain": None}


def test_async_function_decorator_scopes_the_await():
    @tpushim.patched(mode="cpu")
    async def job():
        await asyncio.sleep(0)
        return settings_here()[0]

    assert asyncio.run(job()) == "cpu"
    assert inspect.iscoroutinefunction(job)


def test_generator_decorator_scopes_each_step_not_the_caller_between_them():
    @tpushim.patched(mode="cpu", batch_size=8)
    def steps():
        seen = [settings_here()]
        received = yield seen[-1]
        seen.append((settings_here(), received))
        try:
            yield seen[-1]
        except KeyError:  # thrown in by the caller: handled in scope
            seen.append(settings_here())
            yield "handled"
        finally:
            seen.append(("finally", settings_here()))
            yield_log.extend(seen)
        return "done"

    yield_log = []
    assert inspect.isgeneratorfunction(steps)
    gen = steps()
    assert settings_here() == (None, None)
    assert next(gen) == ("cpu", 8)
    assert settings_here() == (None, None)  # suspended: the caller is not in its scope
    assert gen.send("x") == (("cpu", 8), "x")
    assert settings_here() == (None, None)
    assert gen.throw(KeyError("k")) == "handled"
    gen.close()  # its finally runs in scope, too
    assert yield_log[-2:] == [("cpu", 8), ("finally", ("cpu", 8))]
    assert settings_here() == (None, None)
    # Run to its end: the generator's return value comes through.
    gen = steps()
    with pytest.raises(StopIteration):
        next(gen), gen.send(None), gen.send(None)


def test_generator_values_and_return_come_through():
    @tpushim.patched(mode="cpu")
    def count(n):
        for i in range(n):
            yield i, settings_here()[0]
        return "end"

    assert list(count(3)) == [(0, "cpu"), (1, "cpu"), (2, "cpu")]

    def outer():
        result = yield from count(1)
        assert result == "end"

    assert list(outer()) == [(0, "cpu")]


def test_async_generator_is_refused_clearly():
    async def agen():
        yield 1

    with pytest.raises(TypeError, match="cannot decorate the async generator function"):
        tpushim.patched(mode="cpu")(agen)


def test_reset_restores_everything_and_fails_on_a_scope_left_open(tmp_path):
    from tpushim import _patch  # the reset conftest uses

    tpushim.patched(mode="cpu").__enter__()  # never left
    with pytest.raises(RuntimeError, match=r"1 tpushim.patched\(\) scope\(s\) left open"):
        _patch.reset()
    assert untouched()
    assert settings_here() == (None, None)
    assert not is_shim(lambda: tfcases.convert(tmp_path / "after"))
