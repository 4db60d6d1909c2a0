"""numpy_input_fn and pandas_input_fn (tf.estimator.inputs on TensorFlow >= 2.16), on TF's queues.

Why queues, not tf.data: stock fed these through TensorFlow's queues -- a ``FIFOQueue``, or with
``shuffle=True`` a ``RandomShuffleQueue`` whose op seed comes from the graph seed -- filled by a
queue-runner thread that starts each epoch at a random row (``random.randrange`` after
``random.seed(None)``). TensorFlow 2.21 still ships the queues and queue runners, so this module
builds the same ops in the same order (same op seeds, the same ``queue/...fraction_..._full``
summary) and a script gets stock's example order: identical where stock's own order is
reproducible (one pass over at most ``queue_capacity / 4`` rows, with the same start row), and the
same kind of randomness where stock's depends on its reading thread's timing.
"""

import collections
import random

import numpy as np
import tensorflow as tf

_TARGET = "__target_key__"


def _check_args(batch_size, shuffle, num_epochs):
    if not isinstance(shuffle, bool):
        raise ValueError(
            "shuffle must be provided and explicitly set as boolean (it is recommended to set it "
            f"as True for training); got {shuffle}"
        )
    if not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if num_epochs is not None and num_epochs <= 0:
        raise ValueError(f"num_epochs must be None or positive, got {num_epochs!r}.")


class _Feeder:
    """The feed of one enqueue: the next ``batch_size`` rows (wrapping around, ending after
    ``num_epochs`` passes), and their row numbers (a DataFrame's index)."""

    def __init__(self, placeholders, data, batch_size, random_start, num_epochs):
        self._index, self._columns = placeholders[0], placeholders[1:]
        self._data, self._batch_size, self._num_epochs = data, batch_size, num_epochs
        self._frame = not isinstance(data, dict)
        self._length = len(data) if self._frame else len(next(iter(data.values())))
        random.seed(None)  # as stock: OS entropy, every time (a script's global random too)
        self._next = random.randrange(self._length) if random_start else 0
        self.start = self._next  # where the feed starts (tpushim._source reads it)
        self._epoch_end = (self._next - 1) % self._length
        self._epoch = 0

    def __call__(self):
        if self._num_epochs is not None and self._epoch >= self._num_epochs:
            raise tf.errors.OutOfRangeError(None, None, f"Already emitted {self._epoch} epochs.")
        rows = [i % self._length for i in range(self._next, self._next + self._batch_size)]
        ends = [n for n, row in enumerate(rows) if row == self._epoch_end]
        self._epoch += len(ends)
        if self._num_epochs is not None and self._epoch >= self._num_epochs:
            # Stop after the last epoch's last row: a short final batch.
            rows = rows[: ends[-(self._epoch - self._num_epochs + 1)] + 1]
            self._epoch = self._num_epochs
        self._next = (rows[-1] + 1) % self._length
        if self._frame:
            chosen = self._data.iloc[rows]
            feed = {self._index: chosen.index.values}
            feed.update(zip(self._columns, (chosen[c].values for c in chosen.columns)))
        else:
            feed = {self._index: rows}
            feed.update(zip(self._columns, (column[rows] for column in self._data.values())))
        return feed


class _FeedingSession:
    """The session a queue runner's threads see: running one of ``feed_fns``' enqueue ops (by
    ``run`` or by the callable ``make_callable`` makes, which QueueRunner uses) feeds it from its
    feed function; anything else is the session's. Equal to (and hashed as) the session, so
    QueueRunner's per-session bookkeeping is the session's."""

    def __init__(self, session, feed_fns):
        self._session, self._feed_fns = session, feed_fns

    def run(self, fetches, feed_dict=None, **kwargs):
        enqueue = isinstance(fetches, tf.Operation) and feed_dict is None
        feed_fn = self._feed_fns.get(fetches) if enqueue else None
        return self._session.run(fetches, feed_dict=feed_fn() if feed_fn else feed_dict, **kwargs)

    def make_callable(self, fetches, *args, **kwargs):
        if isinstance(fetches, tf.Operation) and fetches in self._feed_fns:
            return lambda: self.run(fetches)
        return self._session.make_callable(fetches, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._session, name)

    def __eq__(self, other):
        return self._session == getattr(other, "_session", other)

    def __hash__(self):
        return hash(self._session)


class _FeedingQueueRunner(tf.compat.v1.train.queue_runner.QueueRunner):
    """A QueueRunner whose threads run each enqueue with a feed from a Python function (a feed
    function running out raises OutOfRangeError: that thread ends, the last one closes the
    queue, as QueueRunner does when its queue is closed)."""

    def __init__(self, queue, enqueue_ops, feed_fns):
        super().__init__(
            queue,
            enqueue_ops,
            queue_closed_exception_types=(tf.errors.OutOfRangeError, tf.errors.CancelledError),
        )
        self._feeds = dict(zip(enqueue_ops, feed_fns))

    def create_threads(self, sess, coord=None, daemon=False, start=False):
        return super().create_threads(_FeedingSession(sess, self._feeds), coord, daemon, start)

    def to_proto(self, export_scope=None):
        raise NotImplementedError("A feeding queue runner cannot be serialized.")


def _enqueue(data, capacity, shuffle, min_after_dequeue, num_threads, batch_size, num_epochs):
    """A queue of ``data``'s rows, its first component the row number (a DataFrame's index),
    filled by a queue runner in the graph's QUEUE_RUNNERS: stock's ops, in stock's order."""
    with tf.name_scope("enqueue_input"):
        if isinstance(data, dict):
            types = [tf.int64] + [tf.as_dtype(column.dtype) for column in data.values()]
            shapes = [()] + [column.shape[1:] for column in data.values()]
        else:
            types = [tf.as_dtype(d) for d in [data.index.dtype] + list(data.dtypes)]
            shapes = [() for _ in types]
        if num_threads > 1 and num_epochs is not None:
            tf.compat.v1.logging.warn(
                "enqueue_data was called with num_epochs and num_threads > 1. num_epochs is "
                "applied per thread, so this will produce more epochs than you probably intend. "
                "If you want to limit epochs, use one thread."
            )
        if not shuffle and num_threads > 1:
            tf.compat.v1.logging.warn(
                "enqueue_data was called with shuffle=False and num_threads > 1. This will "
                "create multiple threads, all reading the array/dataframe in order. If you want "
                "examples read in order, use one thread; if you want multiple threads, enable "
                "shuffling."
            )
        if shuffle:
            min_after_dequeue = int(
                capacity / 4 if min_after_dequeue is None else min_after_dequeue
            )
            queue = tf.queue.RandomShuffleQueue(
                capacity, min_after_dequeue, dtypes=types, shapes=shapes
            )
        else:
            min_after_dequeue = 0
            queue = tf.queue.FIFOQueue(capacity, dtypes=types, shapes=shapes)
        enqueue_ops, feed_fns = [], []
        for _ in range(num_threads):
            placeholders = [tf.compat.v1.placeholder(t) for t in types]
            enqueue_ops.append(queue.enqueue_many(placeholders))
            feed_fns.append(_Feeder(placeholders, data, batch_size, shuffle, num_epochs))
        tf.compat.v1.train.queue_runner.add_queue_runner(
            _FeedingQueueRunner(queue, enqueue_ops, feed_fns)
        )
        full = tf.cast(tf.math.maximum(0, queue.size() - min_after_dequeue), tf.float32) * (
            1.0 / (capacity - min_after_dequeue)
        )
        # queue.name ends with "/": stock's summary name, as TensorBoard showed it.
        tf.compat.v1.summary.scalar(
            "queue/%sfraction_over_%d_of_%d_full"
            % (queue.name, min_after_dequeue, capacity - min_after_dequeue),
            full,
        )
    return queue


def _dequeue(queue, batch_size, num_epochs):
    """Full batches while the input repeats forever; a short last batch when it ends."""
    if num_epochs is None:
        return queue.dequeue_many(batch_size)
    return queue.dequeue_up_to(batch_size)


def numpy_input_fn(
    x,
    y=None,
    batch_size=128,
    num_epochs=1,
    shuffle=None,
    queue_capacity=1000,
    num_threads=1,
):
    """tf.estimator.inputs.numpy_input_fn: an input_fn over numpy arrays (or dicts of them)."""
    _check_args(batch_size, shuffle, num_epochs)

    def input_fn():
        if isinstance(x, dict):
            if not x:
                raise ValueError("x cannot be an empty dict")
            data = collections.OrderedDict(sorted(x.items()))
        elif isinstance(x, np.ndarray):
            if x.size == 0:
                raise ValueError("x cannot be an empty array")
            data = collections.OrderedDict({"__direct_np_input__": x})
        else:
            raise TypeError(f"x must be a dict or array; got {type(x).__name__}")
        feature_keys = list(data)
        if y is None:
            target_keys = None
        elif isinstance(y, dict):
            if not y:
                raise ValueError("y cannot be empty dict, use None instead.")
            targets = collections.OrderedDict(sorted(y.items()))
            target_keys = list(targets)
            duplicate = set(feature_keys) & set(target_keys)
            if duplicate:
                raise ValueError(
                    f"{len(duplicate)} duplicate keys are found in both x and y: {duplicate}"
                )
            data.update(targets)
        else:
            target_keys = _TARGET
            while target_keys in data:
                target_keys += "_n"
            data[target_keys] = y
        if len({len(v) for v in data.values()}) != 1:
            raise ValueError(
                "Length of tensors in x and y is mismatched. All elements in x and y must have "
                f"the same length.\nShapes in x: { {k: data[k].shape for k in feature_keys} }\n"
            )
        queue = _enqueue(data, queue_capacity, shuffle, None, num_threads, batch_size, num_epochs)
        batch = _dequeue(queue, batch_size, num_epochs)[1:]  # without the row numbers
        if isinstance(x, np.ndarray):
            features = batch[0]
        else:
            features = dict(zip(feature_keys, batch[: len(feature_keys)]))
        if target_keys is None:
            return features
        if isinstance(target_keys, str):
            return features, batch[-1]
        return features, dict(zip(target_keys, batch[-len(target_keys) :]))

    return input_fn


def _unique_column(frame, name):
    import uuid

    return name + "_" + str(uuid.uuid4()) if name in frame else name


def pandas_input_fn(
    x,
    y=None,
    batch_size=128,
    num_epochs=1,
    shuffle=None,
    queue_capacity=1000,
    num_threads=1,
    target_column="target",
):
    """tf.estimator.inputs.pandas_input_fn: an input_fn over a DataFrame (and a Series or
    DataFrame of targets)."""
    import pandas as pd

    _check_args(batch_size, shuffle, num_epochs)
    if not isinstance(target_column, str):
        raise TypeError("target_column must be a string type")
    x = x.copy()
    if y is not None:
        if target_column in x:
            raise ValueError(
                f"Cannot use name {target_column} for target column: DataFrame already has a "
                f"column with that name: {x.columns}"
            )
        if not np.array_equal(x.index, y.index):
            raise ValueError(
                f"Index for x and y are mismatched.\nIndex for x: {x.index}\n"
                f"Index for y: {y.index}\n"
            )
        if isinstance(y, pd.DataFrame):
            y_columns = [(column, _unique_column(x, column)) for column in list(y)]
            target_column = [new for _, new in y_columns]
            x[target_column] = y
        else:
            x[target_column] = y
    if queue_capacity is None:
        queue_capacity = 4 * len(x) if shuffle else len(x)
    min_after_dequeue = max(queue_capacity / 4, 1)

    def input_fn():
        queue = _enqueue(
            x, queue_capacity, shuffle, min_after_dequeue, num_threads, batch_size, num_epochs
        )
        features = dict(zip(list(x.columns), _dequeue(queue, batch_size, num_epochs)[1:]))
        if y is None:
            return features
        if isinstance(target_column, list):
            keys = [key for key, _ in y_columns]
            return features, dict(zip(keys, (features.pop(c) for c in target_column)))
        return features, features.pop(target_column)

    return input_fn
