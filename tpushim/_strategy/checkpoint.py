"""The strategy engine's checkpoints, in the format stock's Keras estimator writes.

``model_to_estimator(checkpoint_format=...)`` picks one of two (keras_lib):

- ``'checkpoint'`` (``tf.keras.estimator``'s default): object-based. Keys follow the Keras
  model's object graph (``layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE``, the global
  step as ``estimator_global_step``), and each records the variable's name in stock's training
  graph (``hidden/kernel``, ``training/SGD/hidden/kernel/momentum``): warm starts and name-based
  Savers find values by it. ``checkpoint`` lists absolute paths.
- ``'saver'`` (``tf.compat.v1.keras.estimator``'s default): name-based. Keys are those graph
  names; ``checkpoint`` lists paths relative to model_dir.

The engine runs eagerly and has no such graph, so the names are read from one: the graph the
conversion builds for stock's warm-start checkpoint (``model_dir/keras``), or else one built at
the first need as stock builds it, its optimizer's variables made without gradients
(:func:`tpushim._tfprivate.checkpoint.stock_training_graph`). They are matched
with the engine's variables by their object-graph path, which the two models share (they are
clones of one model with one optimizer class). The optimizer's variables are created under the
name scope stock's graph gave them, so object-based checkpoints record stock's names too.

A checkpoint is read by what it holds, whatever format the estimator writes: a run continues from
stock's model_dir, or from one the other engine or another TPU wrote, in either format.
"""

import contextlib

import tensorflow as tf

from tpushim import _tfprivate
from tpushim._errors import ConversionError
from tpushim._stock_graphs import OBJECT_GRAPH_KEY, is_object_based  # noqa: F401 (the core's)


def _stock(plan):
    """stock_training_graph(...) of the plan's model: one graph per conversion, kept in its
    :class:`tpushim._strategy.plan.Learned`."""
    learned = plan.learned
    if learned.stock_graph is None:
        # A clone stock does not make: the seeds its weights draw are put back, so the model a
        # program builds next starts from stock's initial weights.
        with _tfprivate.keras.keras_random_state_kept():
            learned.stock_graph = _tfprivate.checkpoint.stock_training_graph(
                plan.keras_model,
                plan.custom_objects,
                learned.features_spec,
                object_based=not plan.name_based_checkpoints,
            )
    return learned.stock_graph


def stock_names(plan):
    """({object path: stock's variable name}, stock's saved names with no object path) for the
    plan's model (a :class:`tpushim._strategy.plan.Plan`), built at the first need."""
    return _stock(plan)[:2]


def stock_graph(plan):
    """That graph itself (a ``tf.Graph``), for the events' writer (see :func:`stock_meta_graph`)."""
    return _stock(plan)[2]


def stock_scalar_tags(plan):
    """The tags stock gives the model's own ``tf.compat.v1.summary.scalar`` calls, in order."""
    return _stock(plan)[4]


def stock_summaries(plan):
    """Stock's ops of the model's own v1 summaries (scalar, histogram, image, audio, text,
    tensor), in the order it made them: the order of stock's merged summary."""
    return _stock(plan)[6]


_SESSIONS = {}  # id(stock's graph) -> (it, a Session on it), for the host's summary ops


def summary_values(plan, op, feeds=()):
    """The Summary values stock's ``op`` (one of :func:`stock_summaries`) makes on the host:
    ``feeds`` [(name of a tensor of stock's graph, its value)], what the engine gathered to the
    host (the global batch's real rows of a tensor of one row per example, a weight), from which
    a copy of stock's graph computes the op's tensor as stock's would (a column mean, a batch
    statistic, a string), and the v1 op itself runs, as TPUEstimator's host_call runs it."""
    graph = op.graph
    held = _SESSIONS.get(id(graph))
    if held is None or held[0] is not graph:
        # A copy of the summary ops (and what they read): stock's graph itself is never run.
        ops = [s.name for s in stock_summaries(plan)]
        copied = tf.compat.v1.graph_util.extract_sub_graph(graph.as_graph_def(), ops)
        host = tf.Graph()
        with host.as_default():
            tf.compat.v1.import_graph_def(copied, name="")
        held = _SESSIONS[id(graph)] = (graph, tf.compat.v1.Session(graph=host))
    session = held[1]
    host = session.graph
    feed = {host.get_tensor_by_name(name): value for name, value in feeds}
    summary = session.run(host.get_tensor_by_name(op.outputs[0].name), feed)
    return list(tf.compat.v1.Summary.FromString(summary).value)


def stock_metric_names(plan):
    """The names stock's model_fn gives the model's compiled metrics (keras_lib's
    ``_compile_metric_functions``: the keys ``metric_names_map`` must hold), in Keras's order."""
    return _stock(plan)[5]


def stock_graph_files(plan):
    """(the bytes of every ``model.ckpt-N.meta``, the text of ``graph.pbtxt``) of
    :func:`stock_meta_graph`, made once per conversion: each train() call writes them again."""
    learned = plan.learned
    if learned.graph_files is None:
        from google.protobuf import text_format

        meta = stock_meta_graph(plan)
        text = text_format.MessageToString(meta.graph_def)  # as tf.io.write_graph formats it
        learned.graph_files = (meta.SerializeToString(), text)
    return learned.graph_files


def stock_meta_graph(plan):
    """Stock's training graph of the plan's model as a MetaGraphDef whose Saver restores the
    checkpoints this engine writes (``import_meta_graph``): not the graph of stock's whole
    model_fn (no input pipeline, loss or train op of the Estimator's), but the model, its
    optimizer and the global step under stock's names, with the Saver stock's Keras estimator
    has. ``graph.pbtxt``, the events' graph and every ``model.ckpt-N.meta`` hold it."""
    return _stock(plan)[3]


def remember(plan, model, step, object_based):
    """Keeps what :func:`_stock` would build again from the stock training graph the conversion
    built (``model``, its clone there, and ``step``, its global step: keras_lib's first
    checkpoint's graph) for the plan's model; ``object_based``: the estimator's checkpoints are."""
    plan.learned.stock_graph = _tfprivate.checkpoint.graph_facts(model, step, object_based)


def optimizer_scope(plan):
    """The name scope to create the optimizer's variables in: the one stock's graph gives them
    (``training/SGD/``), read from its names of the optimizer's own variables (object paths
    ``optimizer/NAME``); no scope where they have no common one."""
    names, _ = stock_names(plan)
    scopes = {
        name[: -len(path.split("/", 1)[1])]
        for path, name in names.items()
        if path.startswith("optimizer/")
        and path.count("/") == 1
        and name.endswith("/" + path.split("/", 1)[1])
    }
    return tf.name_scope(scopes.pop()) if len(scopes) == 1 else contextlib.nullcontext()


class Checkpoints:
    """Reads and writes one run's model (its optimizer and global step tracked) as stock does.

    Args:
      plan: the conversion's :class:`tpushim._strategy.plan.Plan`.
      model: the run's Keras model, built under the strategy.
      name_based: write stock's ``'saver'`` format (else ``'checkpoint'``).
    """

    def __init__(self, plan, model, name_based, writes):
        self._plan, self._model, self.name_based = plan, model, name_based
        self._object = tf.train.Checkpoint(model)
        if name_based and writes:  # refused before anything is trained or written
            self._check_names()

    def _by_name(self):
        """{stock's name: the run's variable} for every variable the run has."""
        names, _ = stock_names(self._plan)
        return {
            names[path]: variable
            for path, variable in _tfprivate.checkpoint.checkpoint_variables(self._model).items()
            if path in names
        }

    def read(self, path):
        """Restores every variable of the run from ``path``, in either format."""
        if is_object_based(path):
            self._object.read(path).expect_partial()
            return
        reader = tf.train.load_checkpoint(path)
        variables = self._by_name()
        missing = sorted(name for name in variables if not reader.has_tensor(name))
        if missing:
            raise tf.errors.NotFoundError(
                None,
                None,
                f"Restoring from checkpoint {path} failed: it has no value for "
                f"{', '.join(missing)} (names in stock's training graph). Was it written for "
                "another model or optimizer? Train in a new model_dir, or restore the "
                "checkpoint this model_dir was trained with.",
            )
        for name, variable in variables.items():
            variable.assign(reader.get_tensor(name))

    def _check_names(self):
        """Raises unless stock's saved names and the run's variables match one to one."""
        names, unmatched = stock_names(self._plan)
        ours = _tfprivate.checkpoint.checkpoint_variables(self._model)
        missing = sorted(set(unmatched) | {names[p] for p in names if p not in ours})
        extra = sorted(path for path in ours if path not in names)
        problems = []
        if missing:
            problems.append(f"stock saves {', '.join(missing)}, which it has no variable for")
        if extra:
            problems.append(f"it has {', '.join(extra)}, which stock does not save")
        if problems:
            raise ConversionError(
                "the strategy engine cannot write stock's name-based checkpoint "
                f"(checkpoint_format='saver') for this model: {'; '.join(problems)}. Convert "
                "with checkpoint_format='checkpoint' (object-based), or use "
                "engine='tpuestimator' where TPUEstimator runs."
            )

    def write(self, prefix, meta=None):
        """Writes the run's variables at ``prefix``, and ``meta`` (serialized MetaGraphDef
        bytes, or None) as ``prefix.meta``, as stock's Saver does; returns the checkpoint's
        path."""
        path = self._write(prefix)
        if meta is not None:
            with tf.io.gfile.GFile(path + ".meta", "wb") as f:
                f.write(meta)
        return path

    def _write(self, prefix):
        if not self.name_based:
            return self._object.write(prefix)
        variables = self._by_name()
        ordered = sorted(variables)
        # A Saver takes no distributed variable in eager mode; SaveV2 is what a Saver runs.
        tensors = [tf.convert_to_tensor(variables[name]) for name in ordered]
        with tf.device("CPU:0"):
            tf.raw_ops.SaveV2(
                prefix=prefix,
                tensor_names=ordered,
                shape_and_slices=[""] * len(ordered),
                tensors=tensors,
            )
        return prefix
