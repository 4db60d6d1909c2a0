"""A generator run step by step inside a context (a scope, a graph program's eager runtime).

A generator runs in its caller's context: a context held open across a ``yield`` would take in
the caller's own code between two items. So each step of the generator (``send``, ``throw``,
``close``) enters a fresh ``context()`` and leaves it at the next ``yield``.
"""


def each_step_in(context, generator):
    """``generator``'s items, each step of it run within ``context()`` (a context manager
    factory), the caller's code between two items outside it; what it returns, returned."""
    step, value = generator.send, None
    while True:
        try:
            with context():
                item = step(value)
        except StopIteration as stop:
            return stop.value
        try:
            value = yield item
        except GeneratorExit:
            with context():
                generator.close()
            raise
        except BaseException as e:  # thrown in by the caller: into the generator, in context
            step, value = generator.throw, e
        else:
            step = generator.send
