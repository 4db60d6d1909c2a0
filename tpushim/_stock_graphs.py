"""What stock's estimator does around a model that every engine repeats, in one place: the graph
it builds an input_fn in (seeded as stock's, so a shuffle gives stock's order), the session it
reads tensors there with, and how a checkpoint's format is told (object-based or name-based).
Engines import it; it imports none."""

import contextlib

import tensorflow as tf

from tpushim import _arrays, _input_fn, _source, _tfprivate

ModeKeys = _tfprivate.estimator.ModeKeys

#: The key that marks an object-based checkpoint (TensorFlow's ``OBJECT_GRAPH_PROTO_KEY``).
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def is_object_based(path):
    """Whether the checkpoint at ``path`` (a prefix) is object-based."""
    return tf.train.load_checkpoint(path).has_tensor(OBJECT_GRAPH_KEY)


@contextlib.contextmanager
def input_graph(mode, seed):
    """A graph of its own, as stock's estimator builds its input in: graph seed, global step and
    (training) its read made first -- stock's op seeds -- and the input_fn's ops on the CPU."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.random.set_random_seed(seed)
        tf.compat.v1.train.create_global_step(graph)
        if mode == ModeKeys.TRAIN:
            _tfprivate.estimator.global_step_read()
        # The program's own TensorShape for its input_fn (a program that disabled v2 behaviour).
        with tf.compat.v1.device("/cpu:0"), _tfprivate.graph.programs_shapes():
            yield graph


def read_batches(session, result):
    """Each batch of ``result`` that ``session`` (:func:`input_session`'s) reads, a numpy
    structure, until the input ends; the session closed at the end."""
    try:
        while not session.should_stop():
            try:
                yield session.run(result)
            except tf.errors.OutOfRangeError:
                return
    finally:
        session.close()


def input_session(input_fn, mode, config, queues_as_datasets=False):
    """The input_fn called as stock calls it, in a graph of its own (:func:`input_graph`), and
    a ``MonitoredSession`` over that graph (queue runners, tables, initializers as stock's):
    ``(graph, tensors, session)``, the tensors a Dataset's next element where it returns one.
    Each ``session.run(tensors)`` is one batch, as stock reads it, until the input runs out.

    With ``queues_as_datasets``, a ``numpy_input_fn`` / ``pandas_input_fn`` queue's tensors are
    read from the Dataset that feeds its rows (:func:`tpushim._source.call_and_recover`; shuffled:
    stock's queue's order kept full, :mod:`tpushim._shuffle_queue`), its arrays fed when the
    session starts, its queue and threads never started: a reader faster than stock's training
    would otherwise take another order from the queue than stock's does."""
    with input_graph(mode, config.tf_random_seed) as graph:
        if queues_as_datasets:
            called = _source.call_and_recover(input_fn, mode, {}, config, queues_only=True)
        else:
            called = _source.call_user_input_fn(input_fn, mode, {}, config)
        result = _input_fn.check_result(input_fn, called)
    hooks = []
    with graph.as_default():
        if isinstance(result, tf.data.Dataset):
            # Stock's initializable iterator takes no op seed; a one-shot iterator takes one:
            # the graph's seeds left as stock's (the model's unseeded random ops seed from them).
            seeds = _tfprivate.graph.graph_seeds(graph)
            feeds = {}
            if _arrays.fed_arrays(graph):  # (a recovered queue's arrays)
                feeds = _arrays.feeds_for(tf.data.experimental.to_variant(result), graph)
            if feeds:  # (a one-shot iterator cannot capture the arrays' placeholders)
                iterator = tf.compat.v1.data.make_initializable_iterator(result)
                hooks.append(FedInitializer(iterator.initializer, feeds))
            else:
                try:
                    iterator = tf.compat.v1.data.make_one_shot_iterator(result)
                except ValueError:  # it captures a stateful op (a table's lookup outside it)
                    iterator = tf.compat.v1.data.make_initializable_iterator(result)
                    hooks.append(FedInitializer(iterator.initializer, {}))  # as stock's
            result = iterator.get_next()
            _tfprivate.graph.set_graph_seeds(graph, seeds)
        if isinstance(result, list):
            result = tuple(result)
        session = tf.compat.v1.train.MonitoredSession(
            session_creator=tf.compat.v1.train.ChiefSessionCreator(config=config.session_config),
            hooks=hooks,
        )
    return graph, result, session


class FedInitializer(tf.compat.v1.train.SessionRunHook):
    """Runs an iterator's initializer with the arrays it reads (:mod:`tpushim._arrays`) fed,
    when the session starts."""

    def __init__(self, initializer, feeds):
        self._initializer, self._feeds = initializer, feeds

    def after_create_session(self, session, coord):
        del coord
        session.run(self._initializer, feed_dict=self._feeds)
