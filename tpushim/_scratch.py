"""The tooling's scratch folder (the preflight's TPU graphs, the demo's model_dir), removed after.

Only what the call created is ever deleted: a folder of its own made inside a fresh ``mkdtemp``
folder (a mocked ``mkdtemp`` may hand back a folder that already exists), then that parent only if
it is empty.
"""

import contextlib
import os
import shutil
import tempfile


@contextlib.contextmanager
def scratch_folder(prefix, name="scratch"):
    """Yields a new, empty folder ``<mkdtemp(prefix)>/<name>``; removes it afterwards.

    Raises:
      FileExistsError: ``mkdtemp`` returned a folder that already holds ``name`` (then nothing
        is removed).
    """
    parent = tempfile.mkdtemp(prefix=prefix)
    folder = os.path.join(parent, name)
    os.mkdir(folder)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(parent)  # only if empty: never anything the call did not write
