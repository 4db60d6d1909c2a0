"""The strategy engine's input: the user's input_fn as the strategy's replicas read it, each
global batch (a short last batch too) padded to a multiple of the replicas and split in order,
from one input pipeline or, on a TPU of several hosts, from each host's own.

On a pod, TPUStrategy calls the dataset function of ``distribute_datasets_from_function`` once
per host, with a ``tf.distribute.InputContext`` naming it; each host's pipeline feeds the
replicas whose TPU cores are on that host. The two paths of the TPUEstimator path's pods
(:mod:`tpushim._pods`, whose analysis, decision and file shares this module takes as they are)
hold here too:

* **exact**: every host runs the user's whole pipeline and keeps the pieces of each global batch
  its replicas train on, so each step's global batch is one board's (stock's, seeded);
* **files**: shuffled, endless training input read from files: each host reads only its own files
  (cut before the reader, parse and map), and feeds its replicas from them.

Each host's copy is built as stock builds its input -- the input_fn called in a graph of its own,
seeded as stock's (the user's ``tf_random_seed``, else a seed drawn once per call, so that every
host's copy shuffles alike) -- made to follow the path there (:func:`tpushim._pods.prepare`),
and brought to the eager runtime by its GraphDef (``DatasetFromGraph``, as tf.data moves a
pipeline to another host).
"""

import collections
import contextlib
import logging
import math
import random

import tensorflow as tf

from tpushim import (
    _arrays,
    _batching,
    _host_part,
    _input_fn,
    _observe,
    _padding,
    _plan,
    _pods,
    _shapes,
    _source,
    _sparse_inputs,
    _stock_graphs,
    _tfprivate,
)
from tpushim._errors import ConversionError
from tpushim._stock_graphs import input_graph as _stock_graph

logger = logging.getLogger("tpushim")

ModeKeys = _tfprivate.estimator.ModeKeys
ENGINE = "the strategy engine"
_EVENTS = {ModeKeys.TRAIN: "train", ModeKeys.EVAL: "evaluate", ModeKeys.PREDICT: "predict"}


class _Emulation:
    """Hosts emulated on a strategy of one input pipeline (see :func:`emulated_hosts`)."""

    def __init__(self):
        self.hosts = None

    def reset(self):
        self.hosts = None


EMULATION = _Emulation()


class Made(collections.namedtuple("Made", ["dataset", "spec", "steps"])):
    """The input as the replicas read it (:func:`distributed_input`): the distributed dataset,
    a replica's element spec, and the global batches it holds where TensorFlow knows it
    (``Dataset.cardinality``; ``math.inf`` for a repeated input), else None. Where known, the
    training loop reads each batch with ``next`` and stops itself at the end, instead of asking
    every step whether a batch is left (``get_next_as_optional``: 0.8 ms a step of 8 replicas on
    2 CPU cores, where Keras's ``fit`` steps take 5 ms)."""

    __slots__ = ()


def _steps(dataset):
    """The elements of ``dataset`` (one a global batch), ``math.inf`` or None (unknown)."""
    count = int(dataset.cardinality())
    if count == tf.data.INFINITE_CARDINALITY:
        return math.inf
    return None if count < 0 else count


@contextlib.contextmanager
def emulated_hosts(hosts):
    """Within it, a strategy of one input pipeline (a MirroredStrategy on CPU) is fed as
    TPUStrategy feeds a pod of ``hosts`` hosts: every host's pipeline is built by the function
    TPUStrategy would call, with a real ``tf.distribute.InputContext(hosts, h, replicas)``, host
    ``h`` feeding replicas ``[h*R/hosts, (h+1)*R/hosts)``, and the hosts' pieces are pooled in
    replica order. The seam the CPU proof of pods uses (no TPU system answers here); nothing in
    tpushim sets it."""
    before = EMULATION.hosts
    EMULATION.hosts = hosts
    try:
        yield
    finally:
        EMULATION.hosts = before


def _blocks(replicas, hosts):
    if replicas % hosts:
        raise ConversionError(f"{replicas} replicas cannot be split evenly over {hosts} hosts.")
    each = replicas // hosts
    return tuple(tuple(range(h * each, (h + 1) * each)) for h in range(hosts))


def input_feeds(strategy, options):
    """Per input pipeline (a host), the replicas it feeds, in the order it feeds them."""
    replicas = strategy.num_replicas_in_sync
    if isinstance(strategy, tf.distribute.TPUStrategy):
        feeds = _tfprivate.data.input_replicas(strategy, options)
        return feeds or _blocks(replicas, strategy.extended.num_hosts)
    if EMULATION.hosts:
        return _blocks(replicas, EMULATION.hosts)
    return (tuple(range(replicas)),)


@_tfprivate.graph.not_converted
def _pieces(x, replicas, piece):
    """The shape ``[replicas, piece, ...]`` of ``x`` split: a dimension the input leaves unknown
    (one the model does not declare) read per batch, the known ones static."""
    dims = x.shape.as_list()[1:]
    if None not in dims:
        return [replicas, piece] + dims
    return [replicas, piece] + [tf.shape(x)[i + 1] if d is None else d for i, d in enumerate(dims)]


def _split(replicas, piece=-1):
    """A Dataset map: each padded global batch as ``replicas`` consecutive slices of ``piece``
    rows (unbatched after, replica r reads slice r: a pipeline hands its elements to the
    replicas it feeds in order)."""

    @_tfprivate.graph.not_converted
    def split(*element):
        element = element[0] if len(element) == 1 else element
        return tf.nest.map_structure(lambda x: tf.reshape(x, _pieces(x, replicas, piece)), element)

    return split


def _keep(indices):
    """A Dataset map: of each split global batch, the slices ``indices`` (a host's replicas)."""
    indices = list(indices)

    @_tfprivate.graph.not_converted
    def keep(*element):
        element = element[0] if len(element) == 1 else element
        return tf.nest.map_structure(lambda x: tf.gather(x, indices), element)

    return keep


def _declared(dataset):
    """The batch size a Dataset's elements declare, else the one its graph's batch op declares
    (a copy built in a graph, :func:`_seeded`), or None."""
    first = tf.nest.flatten(dataset.element_spec)[0]
    if first.shape.rank and first.shape[0] is not None:
        return int(first.shape[0])
    return getattr(dataset, "_tpushim_declared", None)


def _graph_declared(dataset):
    """The batch size the last batch op of an eager Dataset's pipeline declares, read from its
    GraphDef (imported into a graph of its own) as the TPUEstimator path reads it; None where
    the graph does not say."""
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(_tfprivate.data.serialized_dataset(dataset).numpy())
    (retval,) = [node for node in graph_def.node if node.op == "_Retval"]
    graph_def.node.remove(retval)
    output = retval.input[0] if ":" in retval.input[0] else f"{retval.input[0]}:0"
    with tf.Graph().as_default():
        (variant,) = tf.graph_util.import_graph_def(graph_def, return_elements=[output], name="")
        return _batching.declared_batch_size(
            tf.data.experimental.from_variant(variant, dataset.element_spec)
        )


def batch_size_of(dataset):
    """The batch size a Dataset's elements or its pipeline's batch op declare, else that of its
    first element (read: a one-shot input, a generator over a Python iterator, loses that
    batch)."""
    if _declared(dataset) is not None:
        return _declared(dataset)
    try:
        size = _graph_declared(dataset)
    except Exception as e:  # a pipeline that does not serialize: its first batch is read
        logger.debug("the input's batch op not read from its graph (%s)", e)
        size = None
    if size:
        return size
    for element in dataset.take(1):
        return int(tf.shape(tf.nest.flatten(element)[0])[0])
    raise ConversionError("the input_fn's dataset is empty: there is no batch to read.")


def _what_failed(error):
    """An OpError's own words: its last line but the node it names (TF's graph execution
    errors begin with where the op was defined)."""
    lines = [line.strip() for line in error.message.splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith("[[")]
    return (said[-1] if said else error.message)[:300]


def _initialise_tables(graph, session):
    """Runs the graph's ``TABLE_INITIALIZERS`` in ``session``, as stock's Scaffold runs them
    before its dataset initializer: a lookup table the input_fn made (tf.lookup, a vocabulary
    feature column; in a ``Dataset.map`` or outside it) then holds its keys when the pipeline is
    serialized, and travels in the definition with them (on a pod, to every host's copy).

    Raises:
      ConversionError: an initializer that does not run in a session of the engine's own (one
        that reads a variable or a placeholder of the program's): stock's session could run it,
        the engine's copy would look up in an empty table.
    """
    initializers = graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)
    if not initializers:
        return
    try:
        for op in initializers:  # in the order the input_fn made them: a table before the
            # iterator over the Dataset that looks up in it (which scripts register there too)
            session.run(op, feed_dict=_arrays.feeds_for(op, graph))
    except tf.errors.OpError as e:
        raise ConversionError(
            "the strategy engine cannot initialise the lookup tables the input_fn makes "
            f"({', '.join(op.name for op in initializers[:4])}: tf.lookup tables, a vocabulary "
            "feature column) in a session of its own, where it reads the input pipeline with "
            "them (it initialises the input_fn's tables, not its variables or placeholders): "
            f"{_what_failed(e)}. Initialise a table from values the input_fn "
            "holds (a vocabulary file or list, constants), or use engine='tpuestimator' "
            "(TPUSHIM_ENGINE=tpuestimator) where TPUEstimator runs. Nothing was written."
        ) from None


def _graph_input(input_fn, mode, config):
    """An input_fn that returns tensors (a queue's, ``numpy_input_fn``'s unseeded, constants,
    random ops, anything that needs a graph), run as stock runs it: called in a graph
    of its own seeded as stock's (:func:`_stock_graph`), each batch one ``session.run`` of its
    tensors in a ``MonitoredSession`` (queue runners, tables, initializers as stock's), until the
    input runs out. Returns (Dataset, first batch's size).

    The Dataset reads that one session: it is iterated once (one train/evaluate/predict call).
    """
    graph, result, session = _stock_graphs.input_session(input_fn, mode, config)
    spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), result)

    def run():
        with graph.as_default():
            try:
                return None if session.should_stop() else session.run(result)
            except tf.errors.OutOfRangeError:
                return None

    first = run()
    if first is None:
        session.close()
        raise ConversionError("the input_fn's tensors gave no batch: the input is empty.")

    def batches():
        batch = first
        try:
            while batch is not None:
                yield batch
                batch = run()
        finally:  # also when a call stops early (its steps done): the queue runners stop
            session.close()

    dataset = tf.data.Dataset.from_generator(batches, output_signature=spec)
    dataset._tpushim_graph = graph  # where the input_fn's ops are (the preflight reads them)
    return dataset, int(tf.nest.flatten(first)[0].shape[0])


def _eager(graph, dataset):
    """A Dataset built in ``graph``, made on the eager runtime from its GraphDef."""
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        _initialise_tables(graph, session)
        serialized = _tfprivate.data.serialized_dataset(dataset)
        # numpy_input_fn / pandas_input_fn rows (tpushim._arrays): their arrays are fed here and
        # travel in the definition, as they would to another host.
        definition = session.run(serialized, feed_dict=_arrays.feeds_for(serialized, graph))
    variant = tf.raw_ops.DatasetFromGraph(graph_def=definition)
    return tf.data.experimental.from_variant(variant, dataset.element_spec)


TENSORS = "tensors"  # _seeded's answer for an input_fn that returns tensors, not a Dataset


def _seeded(input_fn, mode, config):
    """The input_fn's Dataset built as stock builds it -- in a graph of its own seeded with the
    user's ``tf_random_seed`` (stock's op seeds, :func:`_stock_graph`) -- on the eager runtime: a
    shuffle then gives stock's order, as it does not when built eagerly. None where the pipeline
    cannot move so (a resource made outside the input_fn): the eager Dataset is read then;
    :data:`TENSORS` where the input_fn returns tensors (run by :func:`_graph_input`)."""
    try:
        with _stock_graph(mode, config.tf_random_seed) as graph:
            dataset = _input_fn.call(input_fn, mode, {}, config)
        if not isinstance(dataset, tf.data.Dataset):
            return TENSORS
        copy = _eager(graph, dataset)
    except ConversionError:
        raise
    except Exception as e:  # any failure: the eager Dataset, as before
        logger.info(
            "the strategy engine reads input_fn %r as built eagerly, not seeded as stock's "
            "(its pipeline does not move from a graph of its own: %s): a shuffle's order is not "
            "stock's",
            getattr(input_fn, "__name__", input_fn),
            e,
        )
        return None
    copy._tpushim_graph = graph  # a py_function in the pipeline lives as long as its graph
    # Its batch op's size, read from the graph as the TPUEstimator path reads it: no batch read
    # (a generator over a one-shot iterator would lose it).
    copy._tpushim_declared = _batching.declared_batch_size(dataset)
    return copy


def _pod_tensors_error(input_fn, graph):
    """The refusal of tensors on a pod, naming the input style and the Dataset to return."""
    name = getattr(input_fn, "__name__", input_fn)
    if graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
        style = (
            "queue-based input (tf.compat.v1.train.string_input_producer, "
            "slice_input_producer, batch, shuffle_batch: queues filled by threads)"
        )
        fix = (
            "tf.data.TextLineDataset(files).map(parse).batch(B) for files read by a "
            "TextLineReader (TFRecordDataset for a TFRecordReader), "
            "tf.data.Dataset.from_tensor_slices(arrays).batch(B) for slice_input_producer, "
            "dataset.shuffle(buffer, seed) for shuffle_batch"
        )
    else:
        style = "(features, labels) tensors computed in the input_fn (constants, random ops)"
        fix = "tf.data.Dataset.from_tensor_slices((features, labels)).batch(B)"
    return ConversionError(
        f"input_fn {name!r} returns {style}, and on a TPU of several hosts the strategy engine "
        "cannot feed them: each host runs its own input pipeline on its own CPU, while tensors "
        "are run by a session in this Python process, which the other hosts cannot reach. "
        f"Return a tf.data.Dataset instead ({fix}); an iterator's get_next() over a Dataset "
        "and numpy_input_fn / pandas_input_fn are taken as they are. Nothing was written."
    )


class HostInput:
    """One call's input on a pod: :meth:`__call__` is the dataset function TPUStrategy calls
    once per host (``distribute_datasets_from_function``), returning that host's share.

    Attributes:
      feeds: per host, the replicas it feeds (:func:`input_feeds`).
      path: the :class:`tpushim._pods.Path` the call's input takes.
      padded: the global batch padded to a multiple of the replicas.
      seed: the graph seed every host's copy is built with.
      model_inputs: the model's :class:`tpushim._shapes.ModelInputs` (the shapes it declares
        complete the features'), or None.
    """

    def __init__(
        self, input_fn, mode, config, batch_size, feeds, pod_input, model_inputs=None, host=None
    ):
        self.input_fn, self.mode, self.config, self.feeds = input_fn, mode, config, feeds
        self.model_inputs, self.host = model_inputs, host
        self.replicas = sum(len(f) for f in feeds)
        seed = config.tf_random_seed
        # Unseeded, each call still differs from the last, as stock's do; its copies agree.
        self.seed = random.SystemRandom().randrange(1, 2**31 - 1) if seed is None else seed
        self._starts = []  # numpy_input_fn's reader's start rows: the first copy's, for all
        self._graphs = {}  # host -> its copy's graph (a py_function in the pipeline lives there)
        graph, dataset = self._first = self._build()
        with graph.as_default():  # it reads the file list and cardinality in a session of it
            found = _pods.analyse(dataset, _pods.needs_files(mode, pod_input))
        # The call's numbers as TPUEstimator's context answers them (tpushim._plan.RunContext).
        self.context = _plan.RunContext(mode, self.replicas, len(feeds), batch_size=batch_size)
        self.size = self.context.global_batch(
            _batching.declared_batch_size(dataset) or batch_size_of(_eager(graph, dataset))
            if batch_size is None
            else None
        )
        self.padded = self.context.padded_batch(self.size)
        self.path = _pods.decide(found, mode, pod_input, len(feeds))
        if self.path.name == "files" and 0 in self._host_rows():
            self.path = _pods.Path(
                "exact",
                f"{self.path.why}; but with a global batch of {self.size} on "
                f"{self.replicas} replicas a host would feed padding only: the exact path instead",
                fallback=True,
            )
        _observe.note(
            "pod",
            "%s() on %d TPU hosts: %s path: %s",
            _EVENTS[mode],
            len(feeds),
            self.path.name,
            self.path.why,
        )
        if "WARNING" in self.path.why:
            logger.warning("%s() on %d TPU hosts: %s", _EVENTS[mode], len(feeds), self.path.why)

    def _host_rows(self):
        """Per host, the real rows of one board's padded global batch its replicas hold."""
        piece = self.context.per_replica_batch(self.size)
        return [sum(min(max(self.size - r * piece, 0), piece) for r in feed) for feed in self.feeds]

    def _build(self):
        """A copy of the user's pipeline, in a graph of its own seeded as stock's."""
        with _stock_graph(self.mode, self.seed) as graph, _source.same_start_rows(self._starts):
            dataset = _input_fn.call(self.input_fn, self.mode, {}, self.config)
        if not isinstance(dataset, tf.data.Dataset):
            raise _pod_tensors_error(self.input_fn, graph)
        return graph, dataset

    def _copy(self, host):
        """Host ``host``'s copy, made to follow the path, as an eager Dataset."""
        if host not in self._graphs:
            graph, dataset = self._first if self._first is not None else self._build()
            self._first = None
            with graph.as_default():
                _pods.prepare(dataset, self.path, host)
            self._graphs[host] = (graph, dataset)
        return _eager(*self._graphs[host])

    def __call__(self, context):
        """Host ``context.input_pipeline_id``'s pieces, one per replica it feeds per step."""
        if context.num_input_pipelines != len(self.feeds):
            raise ConversionError(
                f"the strategy asks for {context.num_input_pipelines} input pipelines; tpushim "
                f"expected one per host ({len(self.feeds)})."
            )
        host = context.input_pipeline_id
        piece = context.get_per_replica_batch_size(self.padded)
        dataset = _batching.without_float64(self._copy(host))
        dataset = _shapes.with_declared_shapes(dataset, self.model_inputs)
        if self.host is not None:  # strings and lookups, by this host's own copy of them
            dataset = dataset.map(_host_part.element_function(self.host, self.mode))
        _sparse_inputs.refuse_fed(dataset, ENGINE)
        if self.path.name == "exact":  # the whole input: this host keeps its replicas' pieces
            dataset = dataset.map(_padding.pad_batch(self.padded, counted=True))
            dataset = dataset.map(_split(self.replicas, piece)).map(_keep(self.feeds[host]))
            return dataset.unbatch()
        # Its own files: this host's rows of each global batch, laid out as one board's (the
        # padding rows of an indivisible batch at the replicas that hold them there).
        mine = len(self.feeds[host])
        dataset = dataset.unbatch().batch(self._host_rows()[host], drop_remainder=True)
        # Each global batch holds self.size real rows (every host's batch is whole).
        dataset = dataset.map(
            _padding.pad_batch(mine * piece, counted=True, global_count=self.size)
        )
        dataset = dataset.map(_split(mine, piece))
        return dataset.unbatch()

    def pooled(self):
        """Every host's pieces in replica order, as one pipeline (:func:`emulated_hosts`)."""
        hosts = [
            self(tf.distribute.InputContext(len(self.feeds), h, self.replicas)).batch(
                len(feed), drop_remainder=True
            )
            for h, feed in enumerate(self.feeds)
        ]
        return (
            tf.data.Dataset.zip(tuple(hosts))
            .map(lambda *parts: tf.nest.map_structure(lambda *x: tf.concat(x, 0), *parts))
            .unbatch()
        )


def distributed_input(
    strategy, input_fn, mode, config, batch_size, pod_input="auto", model_inputs=None, host=None
):
    """The user's input as the strategy's replicas read it: every global batch (short ones
    too) padded to a multiple of the replicas, split in order. Returns a :class:`Made`.

    A feature whose shape the model (``model_inputs``, a :class:`tpushim._shapes.ModelInputs`)
    declares more fully than the input -- ``decode_jpeg`` without a channel count for an
    ``Input((224, 224, 3))`` -- is given the declared shape, as on the TPUEstimator path.

    On one input pipeline, a Dataset (or an iterator's tensors traced back to theirs, and with
    ``tf_random_seed`` set ``numpy_input_fn`` / ``pandas_input_fn`` rows, :mod:`tpushim._source`)
    is read eagerly. Any other input_fn -- (features, labels) tensors, queues, an unseeded
    ``numpy_input_fn`` / ``pandas_input_fn`` -- is called again in
    a graph of its own and run there as stock runs it (:func:`_graph_input`): tensors met eagerly
    say nothing of what stock's next ``session.run`` would give (a queue's next batch, a random
    op's next draw). On several hosts each reads its share (:class:`HostInput`).

    ``host``: the model's :class:`tpushim._host_part.HostPart`, computed in each pipeline;
    where it makes outputs, ``predict`` gets a :class:`WithHostOutputs` instead.
    """
    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    feeds = input_feeds(strategy, options)
    outputs = host is not None and host.outputs and mode == ModeKeys.PREDICT
    if len(feeds) > 1:
        pod = HostInput(input_fn, mode, config, batch_size, feeds, pod_input, model_inputs, host)
        if outputs:  # fed from this process (see WithHostOutputs)
            made = WithHostOutputs(strategy, pod.pooled().batch(pod.replicas, drop_remainder=True))
            return Made(made, made.element_spec, None)
        # Each host's end is its own (its files): every step asks whether a batch is left.
        if isinstance(strategy, tf.distribute.TPUStrategy):
            spec = pod(tf.distribute.InputContext(len(feeds), 0, pod.replicas)).element_spec
            return Made(strategy.distribute_datasets_from_function(pod, options), spec, None)
        dataset = pod.pooled()
        return Made(
            strategy.distribute_datasets_from_function(lambda ctx: dataset, options),
            dataset.element_spec,
            None,
        )
    size = batch_size
    # The Dataset is built as stock builds it, in a graph seeded with ``tf_random_seed`` or none
    # (a shuffle with an op seed then takes stock's order: TensorFlow's default graph seed, never
    # the program's eager global seed); one call of the input_fn, two where it returns tensors.
    result = _seeded(input_fn, mode, config)
    if result is None:
        try:
            with _tfprivate.graph.programs_shapes():
                result = _input_fn.call(input_fn, mode, {}, config)
        except Exception as e:  # a graph-only input (queues, placeholders): run in a graph below
            logger.debug("input_fn failed eagerly (%s); calling it in a graph", e)
            result = None
    if isinstance(result, tf.data.Dataset):
        size = size or batch_size_of(result)
    else:
        logger.info(
            "the strategy engine runs input_fn %r in a graph of its own, as stock does: it "
            "returns tensors, not a tf.data.Dataset",
            getattr(input_fn, "__name__", input_fn),
        )
        result, first = _graph_input(input_fn, mode, config)
        size = size or first
    if _observe.has_observers():  # the preflight checks what the input_fn built
        _observe.input_called(
            _observe.InputCall(
                _observe.current_call(),
                mode,
                result,
                _input_fn.InputFacts(size, _declared(result)),
                size,
            )
        )
    replicas = strategy.num_replicas_in_sync
    padded = _plan.RunContext(mode, replicas, batch_size=size).padded_batch()
    # As the TPUEstimator path: no TPU infeed takes float64 (said in the run summary).
    result = _shapes.with_declared_shapes(_batching.without_float64(result), model_inputs)
    if host is not None:  # strings and lookups, on the host
        result = result.map(_host_part.element_function(host, mode))
    _sparse_inputs.refuse_fed(result, ENGINE)
    dataset = result.map(_padding.pad_batch(padded, counted=True)).map(_split(replicas))
    if outputs:
        made = WithHostOutputs(strategy, dataset)
        return Made(made, made.element_spec, None)
    steps = _steps(dataset)
    dataset = dataset.unbatch()
    distributed = strategy.distribute_datasets_from_function(lambda ctx: dataset, options)
    return Made(distributed, dataset.element_spec, steps)


class WithHostOutputs:
    """``predict()``'s input where the host makes outputs (a key passed through): each split
    global batch read here, its host outputs kept here and the rest handed to the replicas
    (``experimental_distribute_values_from_function``), so strings never reach them. Yields
    (per-replica element, {output name: rows in replica order}). On a pod, this process reads
    every host's pipeline (as TPUEstimator's predict feeds every core from one host)."""

    def __init__(self, strategy, dataset):
        self.strategy, self.dataset = strategy, dataset
        self.element_spec = dataset.element_spec

    def __iter__(self):
        for element in self.dataset:
            features, outs = _host_part.carried(element[_padding.FEATURES_KEY])
            element = dict(element, **{_padding.FEATURES_KEY: features})
            per_replica = self.strategy.experimental_distribute_values_from_function(
                lambda ctx, element=element: tf.nest.map_structure(
                    lambda x: x[ctx.replica_id_in_sync_group], element
                )
            )
            yield per_replica, _host_part.padded_outputs(outs)
