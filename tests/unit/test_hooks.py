"""The post-import hooks (tpushim/_hooks.py), one behaviour per test, on real imports of probe
modules written under tmp_path."""

import importlib
import sys
import threading

import pytest

from tpushim import _hooks


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """Writes an importable module ``tpushim_probe_N`` with ``body``; returns its name. Removed after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names = []

    def write(body="VALUE = 41\n"):
        name = f"tpushim_probe_{len(names)}"
        (tmp_path / f"{name}.py").write_text(body)
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


def test_fires_when_the_module_is_imported(probe):
    name = probe()
    seen = []
    _hooks.when_imported(name, lambda m: seen.append(m.VALUE + 1))
    assert seen == []
    importlib.import_module(name)
    assert seen == [42]


def test_fires_at_once_when_already_imported(probe):
    module = importlib.import_module(probe())
    seen = []
    _hooks.when_imported(module.__name__, seen.append)
    assert seen == [module]


def test_fires_once_not_on_reload(probe):
    name = probe()
    seen = []
    _hooks.when_imported(name, seen.append)
    module = importlib.import_module(name)
    importlib.reload(module)
    assert seen == [module]


def test_same_callback_registered_twice_fires_once(probe):
    name = probe()
    seen = []
    _hooks.when_imported(name, seen.append)
    _hooks.when_imported(name, seen.append)
    importlib.import_module(name)
    assert len(seen) == 1


def test_the_module_sees_its_real_loader_while_it_executes(probe):
    name = probe(
        "LOADER = type(__loader__).__name__\nSPEC_LOADER = type(__spec__.loader).__name__\n"
    )
    _hooks.when_imported(name, lambda m: None)
    module = importlib.import_module(name)
    assert (module.LOADER, module.SPEC_LOADER) == ("SourceFileLoader", "SourceFileLoader")
    assert type(module.__loader__).__name__ == "SourceFileLoader"


def test_a_failing_hook_warns_and_the_import_goes_on(probe):
    name = probe()
    seen = []

    def broken(module):
        raise KeyError("bug")

    _hooks.when_imported(name, broken)
    _hooks.when_imported(name, seen.append)
    with pytest.warns(
        RuntimeWarning, match=rf"post-import hook for {name} failed \(KeyError: 'bug'\)"
    ):
        module = importlib.import_module(name)
    assert module.VALUE == 41 and sys.modules[name] is module
    assert seen == [module]  # the hooks after the failing one still ran


def test_a_failing_hook_on_an_imported_module_raises_to_its_caller(probe):
    module = importlib.import_module(probe())
    with pytest.raises(KeyError):
        _hooks.when_imported(module.__name__, lambda m: {}["missing"])


def test_other_imports_are_left_alone(probe):
    hooked, other = probe(), probe("VALUE = 7\n")
    seen = []
    _hooks.when_imported(hooked, seen.append)
    module = importlib.import_module(other)
    assert seen == [] and module.VALUE == 7
    assert type(module.__loader__).__name__ == "SourceFileLoader"


def test_hooks_run_outside_the_registry_lock(probe):
    # A hook that waits for another thread which registers a hook (and so takes the lock) would
    # deadlock if hooks ran with the lock held.
    name, later = probe(), probe()
    finished = []

    def hook(module):
        thread = threading.Thread(
            target=lambda: (_hooks.when_imported(later, print), finished.append(1))
        )
        thread.start()
        thread.join(10)

    _hooks.when_imported(name, hook)
    importlib.import_module(name)
    assert finished == [1]


def test_reset_forgets_pending_hooks_and_removes_the_finder(probe):
    name = probe()
    seen = []
    _hooks.when_imported(name, seen.append)
    finder = _hooks.REGISTRY.finder
    assert finder in sys.meta_path
    _hooks.REGISTRY.reset()
    assert finder not in sys.meta_path
    importlib.import_module(name)
    assert seen == []
