"""Source recovery: a legacy input_fn's tensors traced back to data a ``tf.data.Dataset`` can feed.

A TPU reads its input from a Dataset. Legacy input_fns return the tensors of an iterator's
``get_next()`` (``make_one_shot_iterator(ds).get_next()``) or of the queues ``numpy_input_fn`` /
``pandas_input_fn`` fill. :func:`call_and_recover` calls the input_fn while :class:`_SourceRecorder`
notes where such tensors come from, and returns the Dataset that feeds the same rows.
"""

import collections
import collections.abc
import contextlib
import logging
import threading

import tensorflow as tf

from tpushim import _arrays, _observe, _shuffle_queue, _tfprivate

logger = logging.getLogger("tpushim")


def call_user_input_fn(input_fn, mode, params, config, input_context=None):
    """Calls a user's input_fn with the arguments it accepts, as Estimator does."""
    args = _tfprivate.estimator.fn_args(input_fn)
    kwargs = {}
    if "params" in args:
        kwargs["params"] = params
    if "mode" in args:
        kwargs["mode"] = mode
    if "config" in args:
        kwargs["config"] = config
    if "input_context" in args:
        kwargs["input_context"] = input_context
    return input_fn(**kwargs)


class _SourceRecorder:
    """While the user's input_fn runs, notes where its tensors can come from, so that tensors it
    returns can be traced back to data a ``tf.data.Dataset`` can feed:

    * every one-shot / initializable iterator it makes over a Dataset, and what each ``get_next()``
      returns (``make_one_shot_iterator(ds).get_next()``);
    * every queue ``numpy_input_fn`` / ``pandas_input_fn`` fill from arrays or a DataFrame
      (``feeding_functions._enqueue_data``), with how they fill it.

    Entering installs :class:`_Interception` (once, however many threads are in an input_fn) and
    makes this recorder the one the calls of this thread go to.
    """

    def __init__(self):
        self.made = []  # (dataset, [flat get_next outputs, per call])
        self.queues = []  # _QueueSource
        # The op-seed counter of the graph the input_fn starts in: stock's starts it at 0 (a
        # fresh graph, its global step), so a queue's op seed is counted from here.
        self.counter = None

    def __enter__(self):
        self.counter = _tfprivate.graph.graph_seeds(tf.compat.v1.get_default_graph())[1]
        _INTERCEPTION.enter()
        self._outer = getattr(_active, "recorder", None)
        _active.recorder = self
        return self

    def __exit__(self, *exc):
        _active.recorder = self._outer
        _INTERCEPTION.exit()

    def iterator_made(self, dataset, iterator):
        calls = []
        self.made.append((dataset, calls))
        get_next = iterator.get_next

        def recorded_get_next(*a, **k):
            out = get_next(*a, **k)
            calls.append(tf.nest.flatten(out))
            return out

        iterator.get_next = recorded_get_next

    def queue_made(self, queue, arguments, side_effects, seeds):
        self.queues.append(_QueueSource(queue, arguments, side_effects, seeds, len(self.queues)))

    def dataset_for(self, result, queues_only=False):
        """The recorded source mapped to ``result``'s structure, if every tensor in it came from
        one get_next() of one iterator or (alone with ``queues_only``) one dequeue of one
        recorded queue; else None."""
        flat = tf.nest.flatten(result)
        if not flat:
            return None
        for dataset, calls in [] if queues_only else self.made:
            for outputs in calls:
                ids = [next((i for i, t in enumerate(outputs) if t is x), None) for x in flat]
                if None not in ids:
                    _observe.note("iterator", "iterator tensors fed as the Dataset they came from")
                    # Dataset.map (v2), not the v1 method: v1's map forgets the cardinality, and
                    # evaluate() on a TPU must know whether the input ends.
                    return tf.data.Dataset.map(dataset, _rearrange(result, ids))
        for source in self.queues:
            dataset = source.dataset_for(result, flat)
            if dataset is not None:
                return dataset
        return None


_active = threading.local()  # .recorder: the _SourceRecorder of this thread's input_fn call
_shared = threading.local()  # .starts: the start rows the copies of one input share (a pod's)


@contextlib.contextmanager
def same_start_rows(starts):
    """While a copy of one call's input is made (each host's, on a pod): the feeding threads of
    its numpy_input_fn / pandas_input_fn queues start where the first copy's did (``starts``, a
    list the first copy fills), as stock's one reader does, not at rows each call draws anew."""
    outer = getattr(_shared, "starts", None)
    _shared.starts = starts
    try:
        yield
    finally:
        _shared.starts = outer


class _Interception:
    """The iterator constructors and ``feeding_functions._enqueue_data``, replaced process-wide
    while at least one thread is in an input_fn (reference-counted under a lock), each call routed
    to the calling thread's recorder, or straight through where its thread has none."""

    _ITERATORS = ("make_one_shot_iterator", "make_initializable_iterator")

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._saved = []  # (owner, name, original, ours)
        self._restore_enqueue = None

    def enter(self):
        with self._lock:
            if self._users == 0:
                self._install()
            self._users += 1

    def exit(self):
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._uninstall()

    def _install(self):
        for name in self._ITERATORS:
            for owner, original in (
                (tf.compat.v1.data, getattr(tf.compat.v1.data, name)),
                (tf.compat.v1.data.Dataset, tf.compat.v1.data.Dataset.__dict__[name]),  # methods
            ):
                ours = _routed_iterator(original)
                self._saved.append((owner, name, original, ours))
                setattr(owner, name, ours)
        self._restore_enqueue = _tfprivate.estimator.replace_enqueue_data(_routed_enqueue)

    def _uninstall(self):
        self._restore_enqueue()
        for owner, name, original, ours in reversed(self._saved):
            if getattr(owner, name, None) is ours:  # only ours: someone may have replaced it
                setattr(owner, name, original)
        self._saved = []


_INTERCEPTION = _Interception()


def _routed_iterator(original):
    def make_iterator(dataset, *args, **kwargs):
        iterator = original(dataset, *args, **kwargs)
        recorder = getattr(_active, "recorder", None)
        if recorder is not None:
            recorder.iterator_made(dataset, iterator)
        return iterator

    return make_iterator


def _routed_enqueue(original):
    import inspect

    signature = inspect.signature(original)

    def enqueue_data(*args, **kwargs):
        recorder = getattr(_active, "recorder", None)
        if recorder is None:
            return original(*args, **kwargs)
        graph = tf.compat.v1.get_default_graph()
        before = {key: list(graph.get_collection(key)) for key in _QUEUE_SIDE_EFFECTS}
        # The seeds stock's queue gets: the graph seed, and for op seed the random ops the
        # input_fn made before it (stock's graph counts them from 0).
        seed, counter = _tfprivate.graph.graph_seeds(graph)
        start = recorder.counter
        seeds = _shuffle_queue.stock_seeds(
            seed, None if counter is None or start is None else counter - start
        )
        queue = original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        added = {
            key: [x for x in graph.get_collection(key) if not any(x is y for y in before[key])]
            for key in _QUEUE_SIDE_EFFECTS
        }
        recorder.queue_made(queue, dict(bound.arguments), added, seeds)
        return queue

    return enqueue_data


# What feeding_functions._enqueue_data adds to the graph besides the queue: a queue runner (threads
# filling it) and a summary of how full it is. Dropped when the queue is replaced by a Dataset.
_QUEUE_SIDE_EFFECTS = (tf.compat.v1.GraphKeys.QUEUE_RUNNERS, tf.compat.v1.GraphKeys.SUMMARIES)

_DEQUEUE_OPS = {"QueueDequeueManyV2": True, "QueueDequeueUpToV2": False}  # -> full batches only


def _rearrange(result, ids):
    structure = tuples(result)

    def rearrange(*element):
        element = tf.nest.flatten(element)
        return tf.nest.pack_sequence_as(structure, [element[i] for i in ids])

    return rearrange


def _has_list(structure):
    if isinstance(structure, list):
        return True
    if isinstance(structure, tuple):
        return any(_has_list(x) for x in structure)
    if isinstance(structure, collections.abc.Mapping):
        return any(_has_list(x) for x in structure.values())
    return False


def tuples(structure):
    """``structure`` (features and labels as the user's input_fn gave them) with every list a
    tuple: tf.data reads a list as ONE tensor to stack (``([a, b, text], [y1, y2])`` fails, or
    features of one shape silently become one tensor), a tuple as its components. keras_lib
    reads a tuple of features or labels as the list it would read (``_convert_estimator_io_to_keras``
    takes both as the model's inputs or outputs in order), so the model gets what stock gives it."""
    if not _has_list(structure):
        return structure
    if isinstance(structure, list) or type(structure) is tuple:
        return tuple(tuples(x) for x in structure)
    if isinstance(structure, tuple):  # a namedtuple
        return type(structure)(*(tuples(x) for x in structure))
    items = [(key, tuples(value)) for key, value in structure.items()]
    return type(structure)(items) if isinstance(structure, collections.OrderedDict) else dict(items)


class _QueueSource:
    """A queue numpy_input_fn / pandas_input_fn fill, and the Dataset that feeds the same rows.

    The queue holds, per row, its number (or the DataFrame's index) and then one column per array.
    ``shuffle=False`` with one thread: the same rows in the same order and batches as stock
    (``repeat(num_epochs).batch(B)``, batches running on across epochs as the queue's do; a last
    short batch only when ``num_epochs`` is set). ``shuffle=True`` with one thread: stock's order
    (:mod:`tpushim._shuffle_queue`: its queue's seeds and its reader's start row, as stock's queue
    gives them while its reader keeps it full). Several threads (whose order in stock is their
    race's): a shuffle with a buffer of the queue's capacity, reshuffled every epoch, every row
    once per epoch, seeded by the graph's seed.
    """

    def __init__(self, queue, arguments, side_effects, seeds, index):
        self.queue, self.arguments, self.side_effects = queue, arguments, side_effects
        self.seeds = seeds  # stock's queue's (seed, seed2); None: the kernel draws its own
        self.index = index  # of the queues the input_fn made

    def columns(self):
        import numpy as np

        data = self.arguments["data"]
        # A numpy array's row numbers are the row indices themselves: a range, never materialised.
        if isinstance(data, np.ndarray):
            return [range(len(data)), data]
        if isinstance(data, collections.OrderedDict):
            values = list(data.values())
            return [range(len(values[0]))] + values
        if type(data).__name__ == "DataFrame" and hasattr(data, "columns"):
            return [data.index.values] + [data[c].values for c in data.columns]
        return None  # a generator: no fixed rows to slice

    def dataset_for(self, result, flat):
        ops = {x.op for x in flat}
        if len(ops) != 1:
            return None
        op = ops.pop()
        if op.type not in _DEQUEUE_OPS or op.inputs[0] is not self.queue.queue_ref:
            return None
        columns, batch_size = self.columns(), tf.get_static_value(op.inputs[1])
        if columns is None or batch_size is None or self.arguments.get("pad_value") is not None:
            return None
        args = self.arguments
        # Row numbers, whose rows are read from the arrays fed by placeholder (see _arrays): the
        # graph never holds the arrays.
        used = sorted({x.value_index for x in flat})
        rows = _arrays.Rows([columns[i] for i in used], [op.outputs[i].dtype for i in used])
        order = self._stock_order(len(columns[0]), int(batch_size), not _DEQUEUE_OPS[op.type])
        if order is not None:
            dataset = order.with_options(_arrays.no_rewrites())
        else:
            dataset = tf.data.Dataset.range(len(columns[0])).with_options(_arrays.no_rewrites())
            if args["shuffle"]:
                dataset = dataset.shuffle(
                    min(int(args["capacity"]), len(columns[0])),
                    seed=args.get("seed"),  # tpushim/_estimator_api/_inputs.py's has none
                    reshuffle_each_iteration=True,
                )
            epochs = args["num_epochs"]
            # Each of num_threads feeding threads counts its own epochs (stock warns about it).
            dataset = dataset.repeat(None if epochs is None else epochs * args["num_threads"])
            dataset = dataset.batch(int(batch_size), drop_remainder=_DEQUEUE_OPS[op.type])
        rearrange = _rearrange(result, [used.index(x.value_index) for x in flat])
        dataset = dataset.map(
            # Plain ops, no Python control flow: autograph would only take a second to convert it.
            tf.autograph.experimental.do_not_convert(
                lambda indices: rearrange(*rows.gather(indices))
            ),
            num_parallel_calls=tf.data.AUTOTUNE,  # a TPU host gathers batches for many cores
            deterministic=True,
        )
        self._undo_side_effects()
        _observe.note(
            "queue",
            "numpy/pandas queue input (%d rows, batch %d%s) fed as a tf.data.Dataset, its arrays "
            "fed when the iterator starts (not embedded in the graph)",
            len(columns[0]),
            batch_size,
            ", shuffled" if args["shuffle"] else "",
        )
        return dataset

    def _stock_order(self, rows, batch_size, up_to):
        """Batches of row numbers in the order stock's shuffling queue gives them (one feeding
        thread); None where the Dataset shuffles by itself (unshuffled, several threads)."""
        args = self.arguments
        if not args["shuffle"] or args["num_threads"] != 1:
            return None
        runners = self.side_effects.get(tf.compat.v1.GraphKeys.QUEUE_RUNNERS, [])
        starts = [
            row for runner in runners for row in _tfprivate.estimator.feeding_start_rows(runner)
        ]
        if len(starts) != 1 or starts[0] is None:
            return None
        start = starts[0]
        shared = getattr(_shared, "starts", None)
        if shared is not None:  # a pod host's copy: the first copy's start row
            if len(shared) <= self.index:
                shared.append(start)
            start = shared[self.index]
        capacity = int(args["capacity"])
        keep = args["min_after_dequeue"]
        keep = int(capacity / 4 if keep is None else keep)
        seeds = self.seeds
        if args.get("seed") is not None:  # the op's own seed (feeding_functions' argument)
            op = self.queue.queue_ref.op
            seeds = (op.get_attr("seed"), op.get_attr("seed2"))
        seeds = seeds if seeds is not None else _shuffle_queue.drawn_seeds()
        enqueue_size = args["enqueue_size"] if "enqueue_size" in args else args["batch_size"]
        return _shuffle_queue.row_batches(
            rows,
            start,
            batch_size,
            args["num_epochs"],
            capacity,
            keep,
            seeds,
            up_to,
            enqueue_size=int(enqueue_size),
        )

    def _undo_side_effects(self):
        # The queue is never read now: its runner must not start threads filling it (on a TPU host
        # they would copy the arrays for nothing), nor its summary report it empty.
        graph = self.queue.queue_ref.graph
        for key, added in self.side_effects.items():
            collection = graph.get_collection_ref(key)
            collection[:] = [x for x in collection if not any(x is a for a in added)]


def call_and_recover(input_fn, mode, params, config, input_context=None, queues_only=False):
    """Calls the input_fn; iterator or queue tensors traced to their source become a Dataset
    (with ``queues_only``, numpy_input_fn / pandas_input_fn queues' alone: an engine that reads
    an iterator's tensors as they are, but must not read a queue whose order is its feeding
    thread's race)."""
    with _SourceRecorder() as recorder:
        result = call_user_input_fn(input_fn, mode, params, config, input_context)
    if isinstance(result, (list, tuple)) and len(result) != 2:
        # Estimator's own check and text (estimator/util.py parse_iterator_result).
        raise ValueError("input_fn should return (features, labels) as a len 2 tuple.")
    if result is not None and not isinstance(result, tf.data.Dataset):
        flat = tf.nest.flatten(result)
        if flat and all(tf.is_tensor(x) for x in flat):
            dataset = recorder.dataset_for(result, queues_only)
            if dataset is not None:
                return dataset
    return result
