"""The checked script's model_dirs and exports, moved to scratch copies: the preflight writes
nothing of the user's.

``python -m tpushim check`` runs the script's own train/evaluate/predict calls (capped), and
training writes checkpoints, event files, ``eval/`` and exporters' ``export/`` into the model_dir;
checkpoint rotation (``keep_checkpoint_max``) deletes the oldest checkpoints the ``checkpoint``
file lists. So each model_dir a conversion names is replaced, before the conversion writes its
``keras/`` warm-start checkpoint, by a scratch folder holding a copy of what a run resumes from:
the latest checkpoint of the model_dir and of its ``keras/`` folder, each with a ``checkpoint``
state file that names only the copy (the user's lists the user's files, which rotation would
delete). Nothing else is copied (event files, older checkpoints, exports: a run does not read
them). A model_dir that does not exist is not created. ``export_saved_model`` and its kin write
under a scratch folder too (a serving system watching the export folder would pick up the
checked model otherwise). The folders are :mod:`tpushim._scratch`'s: removed when the check ends.
"""

import contextlib
import os

import tensorflow as tf

from tpushim import _scratch
from tpushim._preflight import progress

_PREFIX = "tpushim-check-"
#: The estimator methods that write a SavedModel under a folder the caller names.
EXPORT_METHODS = ("export_saved_model", "export_savedmodel", "experimental_export_all_saved_models")


def copy_to_resume(model_dir, folder):
    """Copies into ``folder`` what a run from ``model_dir`` resumes from; reads ``model_dir`` only.

    Returns:
      The latest checkpoint's name (``model.ckpt-20``) copied from ``model_dir`` itself, or None
      (then a run starts as from an empty model_dir, warm-started from ``keras/`` if it has one).
    """
    copied = None
    for sub in ("", "keras"):
        source, target = os.path.join(model_dir, sub), os.path.join(folder, sub)
        latest = tf.train.latest_checkpoint(source) if tf.io.gfile.isdir(source) else None
        if not latest:
            continue
        name = os.path.basename(latest)
        tf.io.gfile.makedirs(target)
        for file in tf.io.gfile.listdir(source):  # the checkpoint's .index, .data-*, .meta
            if file.startswith(name + "."):
                tf.io.gfile.copy(os.path.join(source, file), os.path.join(target, file))
        # A state file of its own: it lists the copy alone, so rotation can delete only copies.
        tf.compat.v1.train.update_checkpoint_state(target, os.path.join(target, name))
        if not sub:
            copied = name
    return copied


class ScratchDirs:
    """The scratch copies of one preflight, by the user's path; :meth:`close` removes them."""

    def __init__(self):
        self._stack = contextlib.ExitStack()
        self._copies = {}  # the user's path (normalised) -> its scratch folder
        self._scratch = []  # every scratch folder made
        self._users = {}  # scratch copy -> the user's model_dir it stands for
        self.left = []  # the user's folders the checked run did not write (as named, normalised)
        self.notes = []  # one line per model_dir: what the checked run used instead

    def _note(self, text):
        self.notes.append(text)
        progress.say(text)

    def _folder(self, name):
        folder = self._stack.enter_context(_scratch.scratch_folder(_PREFIX, name or "model_dir"))
        self._scratch.append(folder)
        return folder

    def model_dir(self, model_dir):
        """The scratch folder that stands for ``model_dir`` (None: none was given), made and
        filled on first use; every conversion naming the same model_dir shares it, as the
        script's own runs share theirs."""
        if not model_dir:  # each such conversion gets a new folder, as stock makes each a new one
            self._note(
                "no model_dir given: the checked run writes to a scratch folder (stock would "
                "make a temporary one)"
            )
            return self._folder("model_dir")
        key = _normalised(model_dir)
        if key not in self._copies:
            folder = self._folder(os.path.basename(key.rstrip("/")))
            copied = copy_to_resume(model_dir, folder)
            start = (
                f"starting from a copy of its latest checkpoint {copied}"
                if copied
                else "empty (it does not exist, and is not created)"
                if not tf.io.gfile.exists(model_dir)
                else "empty (it holds no checkpoint)"
            )
            self._note(
                f"model_dir {model_dir} is left as it is: the checked run writes to a scratch "
                f"folder, {start}"
            )
            self._copies[key] = folder
            self._users[folder] = model_dir
            self.left += [os.fspath(model_dir), key]
        return self._copies[key]

    def conversion_arguments(self, arguments, config_class):
        """A conversion's ``arguments`` with its model_dir (given, or its RunConfig's: a
        ``config_class``) replaced by the scratch copy; None where both name one and they differ
        (the conversion refuses two model_dirs before writing anything)."""
        config, given = arguments.get("config"), arguments.get("model_dir")
        in_config = config.model_dir if isinstance(config, config_class) else None
        if given is not None and in_config is not None and os.fspath(given) != in_config:
            return None
        scratch = self.model_dir(given or in_config)
        replaced = dict(arguments, model_dir=scratch)
        if in_config:
            replaced["config"] = config.replace(model_dir=scratch)
        return replaced

    def export_dir(self, export_dir_base):
        """The scratch folder an export to ``export_dir_base`` is written to instead."""
        key = ("export", _normalised(export_dir_base))
        if key not in self._copies:
            self._copies[key] = self._folder(os.path.basename(key[1].rstrip("/")) or "export")
            self.left += [os.fspath(export_dir_base), key[1]]
            self._note(
                f"export to {export_dir_base}: written to a scratch folder instead (nothing is "
                f"written there)"
            )
        return self._copies[key]

    def redirect_exports(self, estimator):
        """Makes ``estimator``'s export methods (:data:`EXPORT_METHODS`) write under scratch
        folders (on the instance: other estimators are not affected)."""
        for method in EXPORT_METHODS:
            original = getattr(estimator, method, None)
            if original is None or getattr(original, "_tpushim_check_export", False):
                continue
            estimator.__dict__[method] = self._exporting(original)

    def _exporting(self, original):
        def export(*args, **kwargs):
            if args:
                base, args = args[0], args[1:]
            else:
                base = kwargs.pop("export_dir_base")
            inside = any(
                _normalised(base).startswith(folder + os.sep) for folder in self._scratch
            )  # an exporter's export/ under a scratch model_dir
            return original(base if inside else self.export_dir(base), *args, **kwargs)

        export._tpushim_check_export = True
        return export

    def as_the_users(self, text):
        """``text`` with each scratch copy named by the user's path it stands for (also after
        :meth:`close`: the report is written then)."""
        for folder, path in self._users.items():
            text = text.replace(folder, path)
        return text

    @contextlib.contextmanager
    def graph_text_left_out(self):
        """While active, the ``graph.pbtxt`` a training run writes into one of these scratch
        model_dirs (stock's CheckpointSaverHook: the whole graph as text, about a second for an
        image model) is not written: the folder is removed when the check ends, unread. The
        events, checkpoints and their ``.meta`` graphs are written as in the script's own run;
        anything written anywhere else (the script's own ``tf.io.write_graph``) too."""
        from tensorflow.python.training import training_util

        write_graph = training_util.write_graph

        def left_out(graph_or_graph_def, logdir, name, as_text=True):
            if name == "graph.pbtxt" and _normalised(logdir) in map(_normalised, self._scratch):
                return None
            return write_graph(graph_or_graph_def, logdir, name, as_text)

        training_util.write_graph = left_out
        try:
            yield
        finally:
            training_util.write_graph = write_graph

    def close(self):
        """Removes every scratch folder (only those: :mod:`tpushim._scratch`)."""
        tf.compat.v1.summary.FileWriterCache.clear()  # event writers open in them
        self._stack.close()
        self._copies.clear()
        self._scratch.clear()


def _normalised(path):
    path = os.fspath(path)
    if isinstance(path, bytes):
        path = path.decode()
    return path if "://" in path else os.path.abspath(path)
