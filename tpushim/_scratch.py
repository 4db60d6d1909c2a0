"""The tooling's scratch folder (the preflight's TPU graphs, the demo's model_dir), removed after.

Only what the call created is ever deleted. The call makes its own folder with ``os.mkdir`` under
the temporary directory, at a fresh random name (``os.mkdir`` fails rather than reuse a folder that
exists); ``tempfile.mkdtemp`` is not used, as a mocked one may hand back a folder of the user's.
"""

import contextlib
import os
import shutil
import tempfile

_TRIES = 100


def _new_folder(prefix):
    """A folder this call made: ``<temporary directory>/<prefix><random>``, mode 0o700."""
    base = tempfile.gettempdir()
    for _ in range(_TRIES):
        path = os.path.join(base, prefix + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no unused folder name {prefix}... in {base} after {_TRIES} tries")


@contextlib.contextmanager
def scratch_folder(prefix, name="scratch"):
    """Yields a new, empty folder ``<temporary directory>/<prefix><random>/<name>``; removes both
    afterwards (they are this call's)."""
    parent = _new_folder(prefix)
    folder = os.path.join(parent, name)
    try:
        os.mkdir(folder)
        yield folder
    finally:
        shutil.rmtree(parent, ignore_errors=True)
