"""The JAX engine's host input read ahead in a thread (tpushim._jax._estimator.ReadAhead): the
batches come in order, never more are read than the limit (an input drawing from a shared random
state draws what stock draws), the input's own error reaches the reader, and ``close()`` stops
the thread and closes the input there."""

import threading

import pytest
from jax_scripts import eight_devices

eight_devices(tf2jax=False)

from tpushim._jax._estimator import ReadAhead

pytestmark = pytest.mark.jax


def _counting(n, fail_at=None):
    read, closed = [], threading.Event()

    def batches():
        try:
            for i in range(n):
                if i == fail_at:
                    raise ValueError("the input broke")
                read.append(i)
                yield i
        finally:
            closed.set()

    return batches(), read, closed


def test_reads_in_order_and_never_past_the_limit():
    batches, read, closed = _counting(100)
    ahead = ReadAhead(batches, limit=5, depth=20)
    assert list(ahead) == [0, 1, 2, 3, 4]
    ahead.close()
    assert read == [0, 1, 2, 3, 4] and closed.is_set()


def test_until_the_input_ends_without_a_limit():
    batches, _, closed = _counting(7)
    ahead = ReadAhead(batches, limit=None, depth=2)
    assert list(ahead) == list(range(7))
    ahead.close()
    assert closed.is_set()


def test_the_inputs_error_reaches_the_reader():
    batches, _, closed = _counting(10, fail_at=3)
    ahead = ReadAhead(batches)
    assert [next(ahead) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="the input broke"):
        next(ahead)
    ahead.close()
    assert closed.is_set()


def test_close_stops_a_reader_waiting_on_a_full_queue():
    batches, read, closed = _counting(1000)
    ahead = ReadAhead(batches, depth=2)
    assert next(ahead) == 0
    ahead.close()
    assert closed.is_set() and len(read) <= 4  # one taken, two queued, one waiting to go in
