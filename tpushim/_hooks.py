"""Post-import hooks without importing anything at start-up.

``wrapt.register_post_import_hook`` does this job, but importing wrapt imports ``inspect`` (about
5 ms), which would be tpushim's whole start-up budget for ``import tpushim; tpushim.patch()`` before
TensorFlow. The finder below costs a dictionary lookup per import until its module appears; wrapt is
imported only when there is something to wrap, by which time TensorFlow is loading anyway.

Two rules taken from wrapt's ``importer.py`` and ddtrace's import hooks:

* the module's real loader is put back before the module executes, so code that runs during the
  import (``__loader__.get_data``, ``importlib.resources``, tracebacks) sees the real loader, not ours;
* a hook that raises is reported with a warning and the import carries on: a bug in tpushim must
  not break the user's ``import tensorflow``.
"""

import _thread  # threading's primitives without importing threading (and functools, collections)
import sys
import warnings


class _Registry:
    """The hooks waiting for their module, and the finder that watches for it (one per process)."""

    def __init__(self):
        self.lock = _thread.RLock()
        self.pending = {}  # module name -> [callback(module)], in registration order
        self.finder = None  # installed on sys.meta_path with the first pending hook

    def reset(self):
        """Forgets every pending hook and takes the finder off ``sys.meta_path`` (for tests)."""
        with self.lock:
            self.pending.clear()
            self.remove_finder()

    def remove_finder(self):
        """Takes the finder off ``sys.meta_path`` (lock held)."""
        if self.finder is not None and self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        self.finder = None


REGISTRY = _Registry()


class _Loader:
    """Delegates to the real loader, then runs the hooks on the freshly executed module."""

    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # Before executing, as wrapt does: the module's own code may read its loader.
        if getattr(module, "__loader__", None) in (None, self):
            module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        self._loader.exec_module(module)
        _fire(self._name, module)

    def __getattr__(self, attr):
        return getattr(self._loader, attr)


class _Finder:
    """A meta path finder that only ever answers for hooked module names."""

    def __init__(self):
        self._searching = _thread._local()  # what threading.local is

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in REGISTRY.pending or getattr(self._searching, fullname, False):
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


def _fire(name, module):
    """Runs, once, the hooks waiting for ``name``; a hook that raises is reported by a warning."""
    with REGISTRY.lock:
        callbacks = REGISTRY.pending.pop(name, ())
        if not REGISTRY.pending:  # nothing left to watch for: every later import as without us
            REGISTRY.remove_finder()
    # Called outside the lock, as wrapt does: a hook imports modules, and another thread that holds
    # one of their import locks may be waiting for ours (registering a hook) -- a deadlock.
    for callback in callbacks:
        try:
            callback(module)
        except Exception as e:  # the user's import must go on
            warnings.warn(
                f"tpushim: a post-import hook for {name} failed ({type(e).__name__}: {e}); "
                f"{name} was imported without tpushim's patch. Please report this.",
                RuntimeWarning,
                stacklevel=2,
            )


def when_imported(name, callback):
    """Calls ``callback(module)`` once ``name`` is imported: now, if it already is.

    Registering the same callback again for a module that is not imported yet does nothing: it
    still runs once. When the module is already imported, an exception from ``callback``
    propagates to the caller (there is no import to protect).
    """
    with REGISTRY.lock:
        module = sys.modules.get(name)
        if module is None:
            callbacks = REGISTRY.pending.setdefault(name, [])
            if callback not in callbacks:
                callbacks.append(callback)
            if REGISTRY.finder is None:
                REGISTRY.finder = _Finder()
                sys.meta_path.insert(0, REGISTRY.finder)
            return
    callback(module)


def discard(name, callback):
    """Forgets ``callback`` if it still waits for ``name``; the finder leaves ``sys.meta_path``
    when no hook waits any more (``unpatch()`` leaves the import system as it found it)."""
    with REGISTRY.lock:
        callbacks = REGISTRY.pending.get(name)
        if callbacks and callback in callbacks:
            callbacks.remove(callback)
            if not callbacks:
                del REGISTRY.pending[name]
        if not REGISTRY.pending:
            REGISTRY.remove_finder()
