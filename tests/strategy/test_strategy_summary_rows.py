"""How the strategy engine reaches stock's value of a model's summary (its ``summary_walk``):
walked back, side by side with stock's graph, to tensors of one row per example whose every row
is that example's own (gathered from the replicas, in replica order), weights and constants; a
tensor whose rows an op mixed (a column mean taken from them, a cumulative sum, a reversal) is
walked past to the rows before it, so that the host's copy of stock's graph computes it over
the global batch. What the host cannot draw again as stock's graph drew it is refused, with the
reason the engine's warning names. The values these feeds give, against stock's:
tests/proofs/test_strategy_events.py (8 replicas) and test_strategy_graph_files.py (one)."""

import numpy as np
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


def _normed(layer_input, bn_name="norm"):
    """The ReLU of a training BatchNormalization's output, a Keras layer named ``bn_name``."""
    normed = tf.keras.layers.BatchNormalization(name=bn_name)(layer_input, training=True)
    return normed, tf.nn.relu(normed)


def test_a_training_batchnorms_output_is_gathered_as_the_engine_computed_it():
    """A replica's step of 5 rows (3 real, 2 of padding) normalises them with the engine's own
    ops over its real rows (``real_rows``), where stock's graph has Keras's: the walk feeds the
    layer's output in stock's graph with the replica's real rows, as the replica computed them,
    and stock's graph computes the rest (its ReLU). On one replica that is stock's value on its
    short batch. The old walk went on into the engine's ops and left the summary out. Controls:
    the padding rows gathered too, or normalised too (Keras's own call on all 5 rows), are not
    stock's."""
    from tpushim._strategy.step import real_rows, summary_rows
    from tpushim._tfprivate import keras as keras_private

    data = np.array(
        [[1.0, 2.0, -1.0], [0.5, -3.0, 2.0], [4.0, 1.0, 0.0], [9.0, 9.0, 9.0], [-7.0, 5, 3]],
        np.float32,
    )
    padding = np.array([1.0, 1.0, 1.0, 0.0, 0.0], np.float32)
    replica = tf.Graph()
    with replica.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [5, 3], name="x")
        pad = tf.compat.v1.placeholder(tf.float32, [5], name="pad")
        element = {"x": x, PADDING_KEY: pad}
        normalized = {}
        with keras_private.batchnorm_call_hooked(), real_rows(element, normalized):
            mine_normed, mine = _normed(x)
        assert normalized == {mine_normed.ref(): "norm"}
    stock = tf.Graph()
    with stock.as_default():
        given = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        theirs_normed, theirs = _normed(given)
    with replica.as_default():
        feeds = summary_feeds(mine, element, theirs, normalized)
        old = summary_feeds(mine, element, theirs)  # the walk before: into the engine's ops
        assert isinstance(old, str) and "computes otherwise" in old, old
        assert _rows_fed(feeds) == [theirs_normed.name]
        (fed_to, _, fed) = feeds[0]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            values = {x: data, pad: padding}
            real, every = session.run([summary_rows(fed, pad), fed], values)
    with stock.as_default(), tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        want = session.run(theirs, {given: data[:3]})  # stock's short batch
        got = session.run(theirs, {fed_to: real})
        gathered = session.run(theirs, {fed_to: every})  # the padding rows gathered too
        control = session.run(theirs, {given: data})  # the padding rows normalised too
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert every.shape[0] == 5 and got.shape[0] == 3
    assert abs(gathered.mean() - want.mean()) > 1e-3
    assert np.abs(control[:3] - want).max() > 1e-3
