"""Post-import hooks without importing anything at start-up.

``wrapt.register_post_import_hook`` does this job, but importing wrapt imports ``inspect`` (about
5 ms), which would be tpushim's whole start-up budget for ``import tpushim; tpushim.patch()`` before
TensorFlow. This finder costs a string comparison per import until its module appears; wrapt is
imported only when there is something to wrap, by which time TensorFlow is loading anyway.
"""

import sys
import _thread  # threading's primitives without importing threading (and functools, collections)

_lock = _thread.RLock()
_hooks = {}  # module name -> [callback(module)]
_finder = None


class _Loader:
    """Delegates to the real loader, then runs the hooks on the freshly executed module."""

    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.__loader__ = self._loader  # tracebacks and inspect see the real loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        fire(self._name, module)

    def __getattr__(self, attr):
        return getattr(self._loader, attr)


class _Finder:
    """A meta path finder that only ever answers for hooked module names."""

    def __init__(self):
        self._searching = _thread._local()  # what threading.local is

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _hooks or getattr(self._searching, fullname, False):
            return None
        setattr(self._searching, fullname, True)
        try:  # ask the finders after us, as the import system would have
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            setattr(self._searching, fullname, False)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, fullname)
        return spec


def fire(name, module):
    with _lock:
        callbacks = list(_hooks.pop(name, ()))
    for callback in callbacks:
        callback(module)


def when_imported(name, callback):
    """Calls ``callback(module)`` once ``name`` is imported: now, if it already is."""
    global _finder
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(callback)
            if _finder is None:
                _finder = _Finder()
                sys.meta_path.insert(0, _finder)
            return
    callback(module)
