"""A pod's input: every example fed exactly once, and each host reading only its share where it can.

On a TPU of several hosts TPUEstimator (``PER_HOST_V2``) calls the input_fn once per host and
builds every host's copy of the pipeline in the one graph it builds. tpushim takes one of two
paths, chosen per call from the first copy's graph (:func:`analyse`, then :func:`decide`, a pure
function of that and the ``pod_input`` setting, which the preflight calls too):

* **exact**: every host runs the user's whole pipeline and keeps its pieces of each global batch
  (:func:`tpushim._batching.tpu_batches`), so each step's global batch is the one a single board
  trains on. That needs identical copies: every copy is built with the same seeds
  (:class:`Seeds`), and dataset ops that may reorder elements (``deterministic=False``,
  ``sloppy=True``, ``Options.deterministic = False``) are made deterministic (:func:`prepare`).
* **files**: shuffled, endless training input read from files. Each host reads only its own files,
  assigned by size so that the shares are even (:func:`assign`); the file list is cut before the
  user's read, parse and map, so nothing is read by two hosts. The order is not stock's (it is
  shuffled anyway) and each host's files are its own for the whole run.
"""

import concurrent.futures
import contextlib
import dataclasses
import random
import re
from typing import Optional

import tensorflow as tf

from tpushim import _input_fn, _source, _tfprivate

ModeKeys = (
    _tfprivate.estimator.ModeKeys
)  # tf.estimator's (TensorFlow >= 2.16: tpushim's own estimator API's)
#: TPUConfig's input configuration in which host 0's one pipeline feeds every core, in order
#: (None on TensorFlow >= 2.16, which has no TPUEstimator: there only the strategy engine reads it).
SLICED = (
    _tfprivate.modules.tpu_config.InputPipelineConfig.SLICED
    if _tfprivate.modules.tpu_config is not None
    else None
)

# Dataset ops that read records from the files named by their first input (tf.data's auto-shard
# knows the same ones as readers).
_READER = re.compile(r"(TFRecord|TextLine|FixedLengthRecord|RecordIO|ArrayRecord)Dataset(V\d+)?")
# Ops that call a function per element of their input: a reader in it reads one file per element.
_PER_ELEMENT = re.compile(
    r"(FlatMap|Interleave|ParallelInterleave|LegacyParallelInterleave"
    r"|ExperimentalParallelInterleave)Dataset(V\d+)?"
)
# Ops a file list may pass through on its way to the reader, whatever files it holds: each host's
# copy is cut before them (a take() or skip() of files would take other files from a host's share).
_FILE_LIST_PASS = re.compile(
    r"(Shuffle|ShuffleAndRepeat|Repeat|Prefetch|Cache|Options)Dataset(V\d+)?"
)
_SHUFFLE = re.compile(r"Shuffle(AndRepeat)?Dataset(V\d+)?")


@dataclasses.dataclass(frozen=True)
class InputGraph:
    """What the choice of a pod's input path needs to know of one copy of the pipeline.

    Attributes:
      shuffled: a shuffle op (of records or of file names) is in the pipeline.
      endless: the pipeline never ends (its cardinality is infinite).
      reads_files: a reader (TFRecordDataset & co.) is in the pipeline.
      files: the files it reads, in the order its file list names them, when it reads one list of
        files that could be read before the run; None otherwise.
      sizes: their sizes in bytes, where they could be read; None otherwise.
      not_files: why the input cannot be cut by files (None when it can).
      reordering: ops that may emit elements out of order (``deterministic=False``, ``sloppy``,
        ``Options.deterministic = False``), by type (and name); made deterministic on the exact
        path.
      reordering_inside: such ops inside the pipeline's functions, which tpushim cannot change.
    """

    shuffled: bool
    endless: bool
    reads_files: bool = False
    files: Optional[tuple] = None
    sizes: Optional[tuple] = None
    not_files: Optional[str] = None
    reordering: tuple = ()
    reordering_inside: tuple = ()


@dataclasses.dataclass(frozen=True)
class Path:
    """How a call's input is read on a pod.

    Attributes:
      name: ``"exact"`` or ``"files"``.
      why: the reason, in words (what the INFO line and the preflight say).
      shares: on the files path, the files each host reads (by invocation index).
      fallback: the exact path although the files path was asked for (``pod_input=files``) or
        would have saved the hosts reading every file, or a reordering op tpushim cannot make
        deterministic; ``why`` says what stood in the way.
    """

    name: str
    why: str
    shares: Optional[tuple] = None
    fallback: bool = False


# --- reading the graph ------------------------------------------------------------------------


@dataclasses.dataclass
class _Structure:
    """The dataset ops of one copy of a pipeline, as :func:`_walk` found them."""

    file_sources: list = dataclasses.field(default_factory=list)  # (op, input index)
    files_repeat: bool = False  # a file list repeated forever before it is read
    other_sources: list = dataclasses.field(default_factory=list)  # op types
    computed_file_lists: list = dataclasses.field(default_factory=list)  # op types
    shuffled: bool = False
    takes: bool = False  # a take() after the reading
    reordering: list = dataclasses.field(default_factory=list)  # ops
    functions: list = dataclasses.field(default_factory=list)  # function names


def function_names(node_def):
    """The names of the functions a NodeDef's attributes name (a dataset op's map function, a
    loop's body), in order."""
    names = []
    for value in node_def.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names += [f.name for f in value.list.func]
    return names


def _function_nodes(graph, names):
    """Every node of the named functions and of the functions they call."""
    done, names = set(), list(names)
    while names:
        name = names.pop()
        definition = None if name in done else _tfprivate.graph.function_def(graph, name)
        done.add(name)
        for node in definition.node_def if definition is not None else ():
            yield node
            names += function_names(node)


def _reads_files(graph, op):
    """True when ``op`` (a per-element op) calls a reader on each element: a file name."""
    return _PER_ELEMENT.fullmatch(op.type) is not None and any(
        _READER.fullmatch(node.op) for node in _function_nodes(graph, function_names(op.node_def))
    )


def _options_reorder(op):
    if op.type != "OptionsDataset":
        return False
    options = _options_of(op)
    return options.WhichOneof("optional_deterministic") is not None and not options.deterministic


def _options_of(op):
    from tensorflow.core.framework import dataset_options_pb2

    options = dataset_options_pb2.Options()
    options.ParseFromString(op.get_attr("serialized_options"))
    return options


def _reorders(op):
    attr = op.node_def.attr.get("deterministic")
    return (attr is not None and attr.s == b"false") or _options_reorder(op)


def _dataset_inputs(op):
    return [t.op for t in op.inputs if t.dtype == tf.variant]


def _walk(dataset):
    """The :class:`_Structure` of the ops that make ``dataset``; nothing is run."""
    found = _Structure()
    top = _tfprivate.data.dataset_variant_op(dataset)
    stack, seen = [top] if top is not None else [], set()
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        found.functions += function_names(op.node_def)
        found.shuffled |= _SHUFFLE.fullmatch(op.type) is not None
        found.takes |= op.type == "TakeDataset"
        if _reorders(op):
            found.reordering.append(op)
        inputs = _dataset_inputs(op)
        if _READER.fullmatch(op.type):
            found.file_sources.append((op, 0))  # its file names are a tensor
        elif _reads_files(op.graph, op):
            stack += inputs[1:]
            _walk_file_list(inputs[0], found, seen)
        elif not inputs:
            found.other_sources.append(op.type)
        else:
            stack += inputs
    return found


def _walk_file_list(op, found, seen):
    """Follows a file list from the op that reads it up to the list it is sliced from."""
    while _FILE_LIST_PASS.fullmatch(op.type) and _dataset_inputs(op):
        seen.add(op.name)
        found.shuffled |= _SHUFFLE.fullmatch(op.type) is not None
        found.files_repeat |= _repeats_forever(op)
        if _reorders(op):
            found.reordering.append(op)
        op = _dataset_inputs(op)[0]
    seen.add(op.name)
    if op.type == "TensorSliceDataset" and len(op.inputs) == 1:
        found.file_sources.append((op, 0))
    else:
        found.computed_file_lists.append(op.type)


def _repeats_forever(op):
    if op.type == "RepeatDataset" or op.type.startswith("ShuffleAndRepeatDataset"):
        count = tf.get_static_value(op.inputs[1 if op.type == "RepeatDataset" else -2])
        return count is not None and int(count) < 0
    return False


def _endless(dataset, found, session):
    """True when the pipeline never ends: its cardinality says so, or (where a reader's output
    is of unknown length) its file list repeats forever before it is read, as the TPU reference
    models' ``list_files(...).repeat().interleave(...)`` does, and nothing takes a part of it."""
    try:
        cardinality = int(session.run(dataset.cardinality()))
    except tf.errors.OpError:  # it needs a value fed to be made
        return False
    if cardinality == tf.data.UNKNOWN_CARDINALITY:
        return found.files_repeat and not found.takes
    return cardinality == tf.data.INFINITE_CARDINALITY


def _not_files(found):
    """Why a pipeline of this structure cannot be cut by files, or None."""
    if found.computed_file_lists:
        return f"its file names are made in the pipeline (by a {found.computed_file_lists[0]})"
    if not found.file_sources:
        kinds = sorted(set(found.other_sources)) or ["no files"]
        return "it reads no files (" + ", ".join(kinds) + ")"
    if found.other_sources:
        return f"it reads a {found.other_sources[0]} beside its files"
    if len(found.file_sources) > 1:
        return f"it reads {len(found.file_sources)} lists of files"
    return None


def _sizes(files):
    """The files' sizes in bytes (read in parallel: a bucket answers each one separately), or
    None when one of them cannot be read."""
    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            return tuple(pool.map(lambda name: tf.io.gfile.stat(name).length, files))
    except (tf.errors.OpError, OSError):
        return None


def analyse(dataset, read_files=True):
    """The :class:`InputGraph` of one copy of a pipeline, read from the graph being built.

    Runs what it must before the estimator's session (the pipeline's cardinality, and, with
    ``read_files``, its file list -- a glob, not the files -- and the files' sizes), in a session
    of its own; adds ops to the graph, so it is called before the graph is finalized. Without
    ``read_files`` (no files path possible: see :func:`needs_files`) ``files`` stays None.
    """
    found = _walk(dataset)
    not_files = _not_files(found)
    files = sizes = None
    with _input_fn.graph_session() as session:
        endless = _endless(dataset, found, session)
        if not_files is None and read_files:
            op, index = found.file_sources[0]
            try:
                files = tuple(name.decode() for name in session.run(op.inputs[index]).reshape([-1]))
            except tf.errors.OpError as e:
                not_files = f"its file list cannot be read before the run ({e.message[:200]})"
    if files is not None:
        sizes = _sizes(files)
    inside = tuple(
        _named(node.op, node.name)
        for node in _function_nodes(dataset._variant_tensor.graph, found.functions)
        if node.attr.get("deterministic") is not None and node.attr["deterministic"].s == b"false"
    )
    return InputGraph(
        shuffled=found.shuffled,
        endless=endless,
        reads_files=bool(found.file_sources or found.computed_file_lists),
        files=files,
        sizes=sizes,
        not_files=not_files,
        reordering=tuple(_named(op.type, op.name) for op in found.reordering),
        reordering_inside=inside,
    )


def _named(op_type, name):
    return op_type if name.rsplit("/", 1)[-1].split("_")[0] == op_type else f"{op_type} {name!r}"


def needs_files(mode, pod_input):
    """Whether :func:`decide` may take the files path, so :func:`analyse` must read the files
    (a glob and one size per file: on a bucket, one request each)."""
    return mode == ModeKeys.TRAIN and pod_input != "exact"


# --- the decision -----------------------------------------------------------------------------


def decide(graph, mode, pod_input, hosts):
    """The :class:`Path` a call's input takes on ``hosts`` input pipelines.

    Args:
      graph: the :class:`InputGraph` of the call's first copy.
      mode: the ``ModeKeys`` value.
      pod_input: the setting: ``auto``, ``exact`` or ``files``.
      hosts: the input_fn invocations TPUEstimator makes: one per host, or one feeding every
        host (``SLICED``, and predict on a pod).
    """
    asked = pod_input == "files"
    if hosts <= 1:
        return Path(
            "exact",
            "one input pipeline (host 0's) reads the whole input and feeds every core, in order",
            fallback=asked and mode == ModeKeys.TRAIN,
        )
    if pod_input == "exact":
        return _exact(graph, "pod_input=exact says")
    obstacle = _files_obstacle(graph, mode, hosts)
    if obstacle is None and (asked or graph.shuffled):
        shares = assign(graph.files, graph.sizes, hosts)
        held = [len(share) for share in shares]
        how = "by size" if graph.sizes is not None else "in turn: their sizes cannot be read"
        return Path(
            "files",
            f"{'pod_input=files' if asked else 'shuffled, endless training input'} read from "
            f"{len(graph.files)} files: each host reads only its own "
            f"{min(held)}{'' if min(held) == max(held) else f'-{max(held)}'} of them "
            f"(assigned {how}), before the input_fn's parse and map",
            shares,
        )
    if obstacle is None:
        return _exact(graph, "the training input is not shuffled: stock's batches, in order")
    # Every host reading every file is worth a warning; every host slicing arrays it holds is not.
    reading = mode == ModeKeys.TRAIN and graph.shuffled and graph.endless and graph.reads_files
    return _exact(graph, obstacle, fallback=asked or reading)


def _files_obstacle(graph, mode, hosts):
    """What keeps each host from reading only its own files, or None."""
    if mode == ModeKeys.PREDICT:  # the strategy engine's hosts each feed their cores
        return "a prediction reads every example once, in order"
    if mode != ModeKeys.TRAIN:
        return "an evaluation reads every example once, in order"
    if graph.not_files is not None:
        return f"the input cannot be cut by files: {graph.not_files}"
    if not graph.endless:
        return (
            "the training input is not known to repeat forever: hosts reading their own files "
            "would run out at different steps"
        )
    if len(graph.files) < hosts:
        return f"{len(graph.files)} file(s) for {hosts} hosts: fewer files than hosts"
    return None


def _exact(graph, why, fallback=False):
    text = f"every host reads the whole input and keeps its share, as {why}"
    if graph.reordering:
        text += "; made deterministic: " + ", ".join(graph.reordering)
    if graph.reordering_inside:
        text += (
            "; WARNING: " + ", ".join(graph.reordering_inside) + " inside a dataset function "
            "may emit elements in another order on each host, feeding some examples twice and "
            "others never: pass deterministic=True there"
        )
    return Path("exact", text, fallback=fallback or bool(graph.reordering_inside))


def assign(files, sizes, hosts):
    """The files each of ``hosts`` reads: even shares by size (largest first to the lightest
    host, then moves and swaps between the heaviest and the lightest while that evens them),
    each host's files in list order; in turn (file ``i`` to host ``i % hosts``) without sizes."""
    if sizes is None:
        return tuple(tuple(files[h::hosts]) for h in range(hosts))
    members = [[] for _ in range(hosts)]

    def load(member):
        return sum(sizes[i] for i in member)

    for i in sorted(range(len(files)), key=lambda i: (-sizes[i], i)):
        min(members, key=load).append(i)
    for _ in range(len(files) * hosts):
        heavy, light = max(members, key=load), min(members, key=load)
        gap = load(heavy) - load(light)
        # (how much moves from heavy to light, what leaves heavy, what leaves light)
        options = [(sizes[i], i, None) for i in heavy] + [
            (sizes[i] - sizes[j], i, j) for i in heavy for j in light
        ]
        options = [o for o in options if 0 < o[0] < gap]
        if not options:
            break
        _, i, j = min(options, key=lambda o: (abs(gap - 2 * o[0]), o[1:2]))
        heavy.remove(i)
        light.append(i)
        if j is not None:
            light.remove(j)
            heavy.append(j)
    return tuple(tuple(files[i] for i in sorted(m)) for m in members)


# --- each host's copy ---------------------------------------------------------------------------


def prepare(dataset, path, index):
    """Makes host ``index``'s copy of the pipeline follow ``path`` (in the graph being built):
    on the files path it reads that host's files; on the exact path its reordering ops are made
    deterministic. Returns ``dataset``, changed in place."""
    found = _walk(dataset)
    if path.name == "files":
        op, position = found.file_sources[0]
        with tf.compat.v1.device(op.device or None):
            names = tf.constant(list(path.shares[index]), tf.string, name="tpushim_host_files")
            # The list it replaces may have a static length: the graph takes one left open.
            rank = op.inputs[position].shape.rank
            names = tf.raw_ops.PlaceholderWithDefault(
                input=names, shape=tf.TensorShape(None if rank is None else [None] * rank)
            )
        _tfprivate.graph.update_input(op, position, names)
        return dataset
    for op in found.reordering:
        if op.type == "OptionsDataset":
            options = _options_of(op)
            options.deterministic = True
            _tfprivate.graph.set_string_attr(op, "serialized_options", options.SerializeToString())
        else:
            _tfprivate.graph.set_string_attr(op, "deterministic", b"true")
    return dataset


class Seeds:
    """The seeds every host's copy of the user's pipeline is built with, for one call.

    Each copy is made with the graph seed and op-seed counter the first copy was made with (the
    user's ``tf_random_seed``; without one, a seed drawn per call, so that unseeded runs differ
    from run to run as stock's do), and numpy_input_fn's reader starting where the first copy's
    does: the copies shuffle alike. After the first copy the graph goes on as stock's would (the
    counter where that copy left it; no graph seed when there was none); after every other copy,
    as it was before it.
    """

    def __init__(self, graph):
        self._graph = graph
        seed, counter = _tfprivate.graph.graph_seeds(graph)
        self.drawn = seed is None
        self._pin = (
            random.SystemRandom().randrange(1, 2**31 - 1) if seed is None else seed,
            counter,
        )
        self._made = False
        self._starts = []  # numpy_input_fn's reader's start rows, the first copy's

    @contextlib.contextmanager
    def pinned(self):
        """While a copy of the pipeline is made."""
        before = _tfprivate.graph.graph_seeds(self._graph)
        _tfprivate.graph.set_graph_seeds(self._graph, self._pin)
        try:
            with _source.same_start_rows(self._starts):
                yield
        finally:
            if self._made or self.drawn:
                _tfprivate.graph.set_graph_seeds(self._graph, before)
            self._made = True
