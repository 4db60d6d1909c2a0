"""The suite's own scheduling (tests/conftest.py): every module whose tests share a module- or
session-scoped fixture runs whole on one pytest-xdist worker, so the fixture (a strategy proof's
subprocess, minutes of CPU) runs once per suite, not once per worker its tests landed on."""

import os
import re

import conftest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_module_with_a_shared_fixture_is_kept_whole():
    shared = set()
    for folder, _, names in os.walk(HERE):
        for name in names:
            if name.startswith("test_") and name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    if re.search(r"""scope=["'](module|session)["']""", f.read()):
                        shared.add(name)
    assert shared == conftest.SHARED_FIXTURE_MODULES


def test_a_shared_fixture_modules_tests_are_one_unit_of_work():
    from xdist.scheduler import LoadScopeScheduling

    class Config:
        def getoption(self, name):
            return {"dist": "load"}[name]

        def getvalue(self, name):
            return {"tx": ["2*popen"]}[name]

    scheduler = conftest.pytest_xdist_make_scheduler(Config(), log=None)
    assert isinstance(scheduler, LoadScopeScheduling)
    split = scheduler._split_scope
    assert (
        split("tests/proofs/test_strategy_replicas.py::test_a[8]")
        == "tests/proofs/test_strategy_replicas.py"
    )
    assert (
        split("tests/proofs/test_strategy_replicas.py::test_b")
        == "tests/proofs/test_strategy_replicas.py"
    )
    assert split("tests/core/test_patch.py::test_a") == "tests/core/test_patch.py::test_a"
    assert conftest.pytest_xdist_make_scheduler(_Chosen(), log=None) is None


class _Chosen:  # a caller's own --dist
    def getoption(self, name):
        return "loadfile"


def test_subprocess_guards_stretch_with_the_load(monkeypatch):
    """A proof's timeout is a guard against a hung process, in seconds on a quiet machine: it
    stretches with the load per core (at least 1x, at most procs.MAX_SCALE), or by
    TPUSHIM_TEST_TIMEOUT_SCALE; a fixed 1,500 s killed the proofs on busy cores."""
    import procs

    cores = os.cpu_count() or 1
    monkeypatch.delenv("TPUSHIM_TEST_TIMEOUT_SCALE", raising=False)
    for load, factor in ((0.0, 1.0), (cores, 1.5), (cores * 2, 3.0), (cores * 10, procs.MAX_SCALE)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert procs.scaled(100) == 100 * factor
    monkeypatch.setenv("TPUSHIM_TEST_TIMEOUT_SCALE", "6")
    assert procs.scaled(100) == 600


def test_the_proofs_left_to_the_newest_tensorflow_run_there():
    """The strategy proofs skipped on TensorFlow <= 2.15 (CI's budget) are strategy proofs whose
    every test runs on the newest: none is a TPUEstimator-path test, which runs only on <= 2.15."""
    assert conftest.NEWEST_ONLY_PROOFS <= conftest.STRATEGY_PROOFS
    for name in conftest.NEWEST_ONLY_PROOFS:
        with open(os.path.join(HERE, "proofs", name), encoding="utf-8") as f:
            text = f.read()
        assert "mark.tpuestimator" not in text and "tpuestimator_import" not in text, name
        assert not re.search(r"TF_VERSION\s*>=\s*\(2,\s*16\)", text), name  # none skipped there
