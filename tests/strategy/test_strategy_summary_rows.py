"""How the strategy engine reaches stock's value of a model's summary (its ``summary_walk``):
walked back, side by side with stock's graph, to tensors of one row per example whose every row
is that example's own (gathered from the replicas, in replica order), weights and constants; a
tensor whose rows an op mixed (a column mean taken from them, a cumulative sum, a reversal) is
walked past to the rows before it, so that the host's copy of stock's graph computes it over
the global batch. What the host cannot draw again as stock's graph drew it is refused, with the
reason the engine's warning names. The values these feeds give, against stock's:
tests/proofs/test_strategy_events.py (8 replicas) and test_strategy_graph_files.py (one)."""

import pytest
import tensorflow as tf

from tpushim._padding import PADDING_KEY
from tpushim._strategy.summary_walk import ROWS, summary_feeds

W = [[1.0, -2.0], [0.5, 0.25], [3.0, 1.0]]


def _walk(summarized):
    """(feeds, stock's input, stock's summarized tensor): a replica's step of 2 rows against
    stock's graph of an unknown batch."""
    replica = tf.Graph()
    with replica.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        pad = tf.compat.v1.placeholder(tf.float32, [2], name="pad")
        mine = summarized(x)
    stock = tf.Graph()
    with stock.as_default():
        given = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        theirs = summarized(given)
    with replica.as_default():
        feeds = summary_feeds(mine, {"x": x, PADDING_KEY: pad}, theirs)
    return feeds, given, theirs


def _rows_fed(feeds):
    assert not isinstance(feeds, str), feeds
    return [theirs.name for theirs, how, _ in feeds if how == ROWS]


@pytest.mark.parametrize(
    "summarized",
    [
        lambda x: tf.tanh(tf.matmul(x, W) + 1.0),  # a layer's output: each row its own
        lambda x: tf.reshape(x[:, 1:] * 2.0, [-1, 2, 1]),
        # a draw not of the batch's values (dropout's mask): gathered as drawn
        lambda x: x * tf.cast(tf.random.uniform(tf.shape(x)) > 0.5, tf.float32),
    ],
    ids=["dense", "slice-reshape", "dropped"],
)
def test_a_tensor_whose_rows_are_each_examples_own_is_gathered(summarized):
    feeds, _, theirs = _walk(summarized)
    assert _rows_fed(feeds) == [theirs.name]


@pytest.mark.parametrize(
    "summarized, fed",
    [
        (lambda x: x - tf.reduce_mean(x, 0), ["x:0"]),
        (lambda x: x / tf.reduce_max(tf.abs(x)), ["Abs:0", "x:0"]),
        (lambda x: tf.cumsum(x, 0), ["x:0"]),
        (lambda x: tf.reverse(x * 2.0, [0]), ["mul:0"]),
        (lambda x: tf.reshape(tf.transpose(x * 2.0), [-1, 3]), ["mul:0"]),  # rows not its own
        (lambda x: tf.nn.softmax(tf.reduce_sum(x, 1)), ["Sum:0"]),  # over the rows
    ],
    ids=["centred", "scaled", "cumsum", "reverse", "transposed", "softmax-rows"],
)
def test_rows_mixed_are_computed_on_the_host_from_the_rows_before(summarized, fed):
    """The old walk stopped at the summarized tensor itself (each replica's rows as it mixed
    them): these fail there."""
    feeds, _, theirs = _walk(summarized)
    assert _rows_fed(feeds) == fed != [theirs.name]


def test_a_draw_the_host_cannot_repeat_is_refused_naming_it():
    feeds, _, _ = _walk(lambda x: tf.cumsum(x, 0) + tf.random.uniform([3]))
    assert isinstance(feeds, str) and "RandomUniform" in feeds, feeds
    feeds, _, _ = _walk(lambda x: x - tf.reduce_mean(tf.random.shuffle(x), 0))
    assert isinstance(feeds, str) and "RandomShuffle" in feeds, feeds
