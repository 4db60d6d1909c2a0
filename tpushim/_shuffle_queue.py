"""``numpy_input_fn`` / ``pandas_input_fn(shuffle=True)``'s example order, as a Dataset.

Stock fills a ``RandomShuffleQueue`` from a feeding thread: starting at a random row, it enqueues
the rows in order, ``enqueue_size`` at a time, around and around (``num_epochs`` times, or
forever), blocking while the queue is full; each ``dequeue_many`` / ``dequeue_up_to`` takes its
rows one at a time, each at ``generator() % size`` of the queue's vector (the last element moved
into its place), where ``generator`` is the kernel's Philox stream seeded with the op's two seeds;
while open, the queue keeps ``min_after_dequeue`` rows; closed (the feeder is done), it gives all.

Which rows the queue holds at a dequeue depends on whether the feeder has caught up. Whenever a
training step outlasts one enqueue (any real model), it has: the queue is full (or holds the
rest of the input) at every read, and the order is a function of the seeds, the start row and the
sizes alone. :func:`row_batches` is that order, computed by TensorFlow ops in the input pipeline
(no Python at run time: it runs on a TPU's remote host as well): every batch stock would dequeue,
as row numbers, the same on every run given the seeds and the start row. (Where the model's step
is faster than the feeder, stock's own order varies from run to run after the first batches.)
"""

import random

import tensorflow as tf

#: Stand-in for "forever" (``num_epochs=None``): more rows than any run reads.
_FOREVER = 2**62
#: The most takes computed at once (their cost grows with its square): a larger batch's in turns.
_BURST = 512


def stock_seeds(graph_seed, op_seed):
    """The ``(seed, seed2)`` stock's queue gets in a graph seeded ``graph_seed`` as the
    ``op_seed``-th random op without a seed of its own; None without a graph seed (the kernel then
    draws its own)."""
    if graph_seed is None:
        return None
    with tf.Graph().as_default():
        tf.compat.v1.random.set_random_seed(graph_seed)
        return tuple(tf.compat.v1.random.get_seed(op_seed or 0))


def drawn_seeds():
    """Seeds of the queue's own, as its kernel draws them where it has none (a script's
    ``random`` left alone)."""
    generator = random.SystemRandom()
    return generator.getrandbits(63), generator.getrandbits(63)


def row_batches(
    rows,
    start,
    batch_size,
    num_epochs,
    capacity,
    min_after_dequeue,
    seeds,
    up_to,
    enqueue_size=None,
):
    """A Dataset of int64 vectors: the row numbers (0 .. ``rows`` - 1) of each batch stock's queue
    gives (``batch_size`` each; with ``up_to``, as ``dequeue_up_to``, a short last one).

    Args:
      rows: the number of rows in the arrays.
      start: the feeder's random start row.
      batch_size: the rows each dequeue takes.
      num_epochs: passes over the rows, or None (forever).
      capacity, min_after_dequeue: the queue's.
      seeds: the queue op's ``(seed, seed2)``, both nonzero-or-not as the kernel got them (the
        caller replaces (0, 0), the kernel's "random", by seeds of its own).
      up_to: ``dequeue_up_to`` (a short last batch), else ``dequeue_many``.
      enqueue_size: the rows each enqueue puts in (``numpy_input_fn``: ``batch_size``).
    """
    total = _FOREVER if num_epochs is None else rows * int(num_epochs)
    batches = (
        tf.data.Dataset.from_tensors(0).repeat()
        if num_epochs is None
        else tf.data.Dataset.range(-(-total // batch_size) if up_to else total // batch_size)
    )
    order = _Order(
        rows,
        start,
        (batch_size, enqueue_size or batch_size),
        total,
        capacity,
        min_after_dequeue,
        seeds,
    )
    batches = batches.scan(order.initial(), tf.autograph.experimental.do_not_convert(order.step))
    # The same batches again, as the rows' Dataset batched (what tpushim reads of an input's
    # graph: its batch size, how many rows a finite one holds, a full batch's static size).
    rows_read = batches.unbatch()
    if num_epochs is not None:
        rows_read = rows_read.apply(tf.data.experimental.assert_cardinality(total))
    return rows_read.batch(batch_size, drop_remainder=not up_to)


class _Order:
    """The queue's state as scan's state: ``(queue, size, pushed, chunk_end, closed, draws)``.

    ``queue``: its vector of row numbers (``capacity`` long, ``size`` in use); ``pushed``: how many
    rows of the feeder's stream are in it so far; ``chunk_end``: where the enqueue in flight ends
    in the stream (equal to ``pushed`` when none is); ``closed``: the stream is all enqueued and
    the queue closed; ``draws``: samples taken from the Philox stream.
    """

    def __init__(self, rows, start, sizes, total, capacity, min_after_dequeue, seeds):
        self.rows, self.start = int(rows), int(start)
        self.batch, self.chunk = (int(x) for x in sizes)  # a dequeue's rows, an enqueue's
        self.total, self.capacity = int(total), int(capacity)
        self.keep = int(min_after_dequeue)
        self.key = int(seeds[0]) % 2**64
        self.seed2 = int(seeds[1]) % 2**64
        self.rounds = _BURST.bit_length()  # pointer doubling over at most _BURST takes

    def initial(self):
        """The state at the first read: the feeder has filled the queue (or enqueued all and
        closed it). Computed here, in Python: constants of the pipeline."""
        pushed, chunk_end, closed, size = 0, 0, False, 0
        while not (closed or (chunk_end > pushed and size >= self.capacity)):
            if chunk_end == pushed:  # the next enqueue, or none left: closed
                closed = pushed >= self.total
                chunk_end = min(pushed + self.chunk, self.total)
            if not closed:
                count = max(min(self.capacity - size, chunk_end - pushed), 0)
                pushed, size = pushed + count, size + count
        # A closed queue's restored rows may take it past its capacity where a batch is larger
        # (see step). Made by ops, not held as a constant: the input graph stays small.
        length = max(self.capacity, self.batch)
        queue = tf.concat(
            [
                (self.start + tf.range(size, dtype=tf.int64)) % self.rows,
                tf.fill([length - size], tf.constant(0, tf.int64)),  # (tf.zeros: a constant)
            ],
            0,
        )
        return (
            queue,
            tf.constant(size, tf.int64),
            tf.constant(pushed, tf.int64),
            tf.constant(chunk_end, tf.int64),
            tf.constant(closed),
            tf.constant(0, tf.int64),
        )

    # -- the feeder ---------------------------------------------------------------------------

    def _feed(self, state):
        """One move of the feeder: the enqueue in flight pushes what fits, or the next enqueue
        begins (``batch_size`` rows, the last one short), or, the stream done, the queue closes."""
        queue, size, pushed, chunk_end, closed, draws = state
        idle = tf.equal(chunk_end, pushed)
        done = tf.logical_and(idle, pushed >= self.total)
        chunk_end = tf.where(idle, tf.minimum(pushed + self.chunk, self.total), chunk_end)
        count = tf.where(
            done,
            tf.constant(0, tf.int64),
            tf.maximum(tf.minimum(self.capacity - size, chunk_end - pushed), 0),
        )
        stream = pushed + tf.range(count, dtype=tf.int64)
        queue = tf.tensor_scatter_nd_update(
            queue,
            tf.expand_dims(size + tf.range(count, dtype=tf.int64), 1),
            (self.start + stream) % self.rows,
        )
        return (queue, size + count, pushed + count, chunk_end, tf.logical_or(closed, done), draws)

    def _fill(self, state):
        """The feeder runs until it blocks on a full queue or closes it."""

        def blocked(queue, size, pushed, chunk_end, closed, draws):
            return tf.logical_not(
                tf.logical_or(closed, tf.logical_and(chunk_end > pushed, size >= self.capacity))
            )

        return tf.while_loop(blocked, lambda *s: self._feed(s), state)

    # -- a dequeue ----------------------------------------------------------------------------

    def _samples(self, draws, count):
        """Samples ``draws`` .. ``draws + count - 1`` of the kernel's Philox stream (4 a block)."""
        first = draws // 4
        blocks = (draws % 4 + count + 3) // 4
        values = tf.raw_ops.StatelessRandomUniformFullIntV2(
            shape=tf.reshape(blocks * 4, [1]),
            key=tf.constant([self.key], tf.uint64),
            counter=tf.stack([tf.cast(first, tf.uint64), tf.constant(self.seed2, tf.uint64)]),
            alg=1,  # Philox
            dtype=tf.uint32,
        )
        return tf.cast(values[draws % 4 : draws % 4 + count], tf.int64)

    def _take(self, queue, size, got, taken, draws, count):
        """``count`` rows taken one at a time, each at a sample modulo the queue's size, the
        queue's last row moved into its place -- computed at once, not one by one.

        The row at position ``p`` before take ``t`` is the queue's own, unless an earlier take
        wrote ``p``: then it is the row the last such take ``u`` moved there, the one at position
        ``size - u - 1`` before take ``u`` -- itself the queue's own, or moved there by an
        earlier take, and so on: a chain of earlier takes, followed by pointer doubling.
        """
        takes = tf.range(count, dtype=tf.int64)
        picked = self._samples(draws, count) % (size - takes)  # each take's position
        ends = size - takes - 1  # the position each take moves a row from

        def last_write(positions):
            """Per take ``t``: the last take before ``t`` that wrote ``positions[t]``, or -1."""
            wrote = tf.logical_and(
                tf.equal(picked[None, :], positions[:, None]), takes[None, :] < takes[:, None]
            )
            return tf.reduce_max(tf.where(wrote, takes[None, :], -1), axis=1)

        # moved(u), the row take u moves: queue[ends[u]], unless take earlier[u] wrote there.
        earlier = last_write(ends)
        root = tf.where(earlier < 0, takes, earlier)
        for _ in range(self.rounds):
            root = tf.gather(root, root)
        moved = tf.gather(queue, tf.gather(ends, root))
        prior = last_write(picked)
        rows = tf.where(prior < 0, tf.gather(queue, picked), tf.gather(moved, tf.maximum(prior, 0)))
        got = tf.tensor_scatter_nd_update(got, tf.expand_dims(taken + takes, 1), rows)
        # Each position written: the row its last write moved there (positions past the new
        # size are left as they are: unused).
        again = tf.reduce_any(
            tf.logical_and(
                tf.equal(picked[None, :], picked[:, None]), takes[None, :] > takes[:, None]
            ),
            axis=1,
        )
        final = tf.logical_not(again)
        queue = tf.tensor_scatter_nd_update(
            queue, tf.expand_dims(tf.boolean_mask(picked, final), 1), tf.boolean_mask(moved, final)
        )
        return queue, size - count, got, taken + count, draws + count

    def step(self, state, _):
        """One dequeue of ``batch_size`` rows (up to: fewer at the end): what the kernel's
        callback does each time the queue changes, the feeder moving whenever it waits."""
        got = tf.zeros([self.batch], tf.int64)
        wanted = tf.constant(self.batch, tf.int64)

        def waiting(state, got, taken, wanted):
            return taken < wanted

        def attempt(state, got, taken, wanted):
            queue, size, pushed, chunk_end, closed, draws = state
            short = tf.logical_and(closed, size < wanted - taken)
            # Closed with too few rows: the rows taken so far go back (last taken first), and
            # the dequeue takes all there is (dequeue_up_to; dequeue_many never closes here).
            back = tf.reverse(got[: tf.where(short, taken, tf.constant(0, tf.int64))], [0])
            queue = tf.tensor_scatter_nd_update(
                queue, tf.expand_dims(size + tf.range(tf.size(back, tf.int64)), 1), back
            )
            size = size + tf.size(back, tf.int64)
            wanted = tf.where(short, size, wanted)
            taken = tf.where(short, tf.constant(0, tf.int64), taken)
            free = tf.where(closed, size, size - self.keep)
            available = tf.clip_by_value(free, 0, wanted - taken)
            count = tf.minimum(available, _BURST)
            queue, size, got, taken, draws = self._take(queue, size, got, taken, draws, count)
            state = (queue, size, pushed, chunk_end, closed, draws)
            # Out of rows it may take: the dequeue waits, the feeder moves.
            waits = tf.logical_and(taken < wanted, tf.equal(count, available))
            state = tf.cond(waits, lambda: self._feed(state), lambda: state)
            return state, got, taken, wanted

        state, got, _, wanted = tf.while_loop(
            waiting, attempt, (state, got, tf.constant(0, tf.int64), wanted)
        )
        return self._fill(state), got[:wanted]
