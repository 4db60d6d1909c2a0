"""The JAX engine's host input (tpushim._jax._estimator.host_batches) feeds ``numpy_input_fn`` /
``pandas_input_fn(shuffle=True)``'s rows batch by batch in stock's order: the order stock 2.15
recorded (tests/reference/tf215_api.json's ``shuffle`` scenario: its seeds, its reader's start
row), and, where the queue is refilled between reads, the order stock's queue gives while its
reader keeps it full (the queue itself read in stock's graph, a training step's pause before
each read). The queue is never started. Controls: another start row or another seed is told
apart. In-process and cheap (no model, no device)."""

import json
import os
import random
import time

import numpy as np
import pytest
from jax_scripts import eight_devices

eight_devices(tf2jax=False)

import pandas as pd
import tensorflow as tf
import tfcases

from tpushim import _stock_graphs
from tpushim._jax._estimator import host_batches

pytestmark = pytest.mark.jax

ModeKeys = tfcases.ModeKeys
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(ROOT, "tests", "reference", "tf215_api.json"), encoding="utf-8") as _f:
    RECORDED = json.load(_f)["results"]["shuffle"]  # stock 2.15's order, per kind


def _pin_entropy(monkeypatch, value=1234):
    """The environment: the operating-system entropy stock's reader draws its start row from
    (``random.seed(None)``) pinned, as the recorded run pinned it."""
    original = random.seed
    monkeypatch.setattr(random, "seed", lambda a=None, *args: original(value if a is None else a))


def _input_fn(kind, values, batch_size, epochs, **kwargs):
    inputs = tfcases.ESTIMATOR.inputs
    if kind == "numpy":
        return inputs.numpy_input_fn(
            {"x": values}, batch_size=batch_size, num_epochs=epochs, shuffle=True, **kwargs
        )
    return inputs.pandas_input_fn(
        pd.DataFrame({"x": values}), batch_size=batch_size, num_epochs=epochs, shuffle=True
    )


def _config(seed):
    return tfcases.ESTIMATOR.RunConfig(tf_random_seed=seed)


def _engine_batches(fn, mode, seed, batches=None):
    """The rows (their ``x``) of each batch the JAX engine's host input feeds."""
    out = []
    read = host_batches(fn, mode, _config(seed))
    try:
        for batch in read:
            features = batch[0] if isinstance(batch, tuple) else batch
            out.append([int(v) for v in np.asarray(features["x"]).ravel()])
            if batches is not None and len(out) == batches:
                break
    finally:
        read.close()
    return out


def _in_batches(order, size):
    return [order[i : i + size] for i in range(0, len(order), size)]


@pytest.mark.parametrize("kind", ["numpy", "pandas"])
def test_rows_fed_per_batch_are_stock_2_15s_recorded_order(monkeypatch, kind):
    # The recorded scenario's predict input: 100 rows, two epochs, batches of 8, tf_random_seed 7.
    _pin_entropy(monkeypatch)
    fn = _input_fn(kind, np.arange(100, dtype=np.float32), 8, 2)
    got = _engine_batches(fn, ModeKeys.PREDICT, 7)
    want = RECORDED[kind]["order"]
    assert sorted(want) == sorted(list(range(100)) * 2) and want != sorted(want)
    assert got == _in_batches(want, 8)


def _kept_full(fn, seed, batches, pause=0.2):
    """The rows of each batch stock's queue gives -- the input_fn called in a graph built as
    stock's training graph, its reading thread started with the session -- each read after a
    pause (a training step's time: the reader refills the queue meanwhile)."""
    with _stock_graphs.input_graph(ModeKeys.TRAIN, seed):
        features = fn()
        with tf.compat.v1.train.MonitoredSession() as session:
            out = []
            while len(out) < batches:
                time.sleep(pause)
                try:
                    out.append([int(v) for v in session.run(features["x"]).ravel()])
                except tf.errors.OutOfRangeError:
                    break
    return out


@pytest.mark.parametrize(
    "kind,rows,epochs,batches",
    [
        ("numpy", 2000, None, 10),  # more rows than the queue holds: refilled between reads
        ("pandas", 700, 1, 11),  # closes while read: a short last batch
    ],
)
def test_training_rows_are_stocks_order_of_its_queue_kept_full(
    monkeypatch, kind, rows, epochs, batches
):
    _pin_entropy(monkeypatch)
    fn = _input_fn(kind, np.arange(rows, dtype=np.float32), 64, epochs)
    stock = _kept_full(fn, 7, batches)
    assert len(stock) == batches and stock[0] != sorted(stock[0])
    if epochs:
        assert sorted(v for b in stock for v in b) == list(range(rows))  # every row once
        assert len(stock[-1]) == rows % 64
    got = _engine_batches(fn, ModeKeys.TRAIN, 7, batches)
    assert got == stock


def test_the_queue_is_never_started():
    graph, features, session = _stock_graphs.input_session(
        _input_fn("numpy", np.arange(50, dtype=np.float32), 8, 1),
        ModeKeys.TRAIN,
        _config(7),
        queues_as_datasets=True,
    )
    try:
        # No runner starts threads filling the queue; the rows come from the Dataset's iterator.
        assert graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS) == []
        assert {t.op.type for t in tf.nest.flatten(features)} == {"IteratorGetNext"}
        assert len(session.run(features)["x"]) == 8
    finally:
        session.close()


def test_negative_control_another_start_row_or_seed_is_told_apart(monkeypatch):
    # The comparison sees the order: another run's start row (other entropy, as stock's next run
    # would draw), or another tf_random_seed, gives other batches than the recorded ones (the
    # recorded setting gives them: test_rows_fed_per_batch_are_stock_2_15s_recorded_order).
    want = _in_batches(RECORDED["numpy"]["order"], 8)
    fn = lambda: _input_fn("numpy", np.arange(100, dtype=np.float32), 8, 2)
    _pin_entropy(monkeypatch, 99)
    other_start = _engine_batches(fn(), ModeKeys.PREDICT, 7)
    _pin_entropy(monkeypatch, 1234)
    other_seed = _engine_batches(fn(), ModeKeys.PREDICT, 8)
    for got in (other_start, other_seed):
        assert sorted(v for b in got for v in b) == sorted(v for b in want for v in b)
        assert got != want
