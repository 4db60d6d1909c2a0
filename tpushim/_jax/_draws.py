"""Random draws in training (Dropout, SpatialDropout, GaussianNoise, GaussianDropout, a
``Lambda`` of ``tf.random``), made as stock's graph makes them: on the host, by TensorFlow's own
stateful random ops, fed to the JAX step.

Stock's training graph draws each of these with a stateful op (``RandomUniform``,
``RandomStandardNormal``, ``TruncatedNormal``, ``RandomUniformInt``) seeded ``(seed, seed2)``
from the graph seed (``RunConfig.tf_random_seed``) and the op's own seed: the layer's ``seed``,
else the graph's op-seed counter, which the input_fn's own unseeded ops advance first (stock
calls the input_fn in the same graph); each run of the op (each step) takes the next draws of its
Philox stream, which starts over with each ``train()`` call's new graph and session.

The trace (:func:`taken`) seeds the traced function's graph as stock's (graph seed, the input
graph's counter), starts each layer's legacy seed where a fresh clone starts it, and records
every such op it makes as a :class:`Draw` (its kind, static shape and stock's seeds); traced
again with the draws as arguments, the step takes them as inputs, so JAX computes what stock
computes from them (the mask's compare, the scale, the noise's mean and stddev).
:class:`HostDraws` makes the same ops with the same seeds in a graph of its own on the host and
runs them once per step, at the step's real rows (a draw whose first dimension is the global
batch is drawn for the batch's real rows, as stock draws for a short batch, and padded with
zeros): each step's draws are stock's, whatever the number of devices.

Where stock's draws are not fixed (no ``tf_random_seed`` and a layer without a seed: seeds
``(0, 0)``, TensorFlow's nondeterministic ones) neither are these.
"""

import dataclasses
import re

import numpy as np
import tensorflow as tf

from tpushim import _tfprivate
from tpushim._errors import ConversionError

#: gen_random_ops' function -> the raw op the host makes again
_RAW = {
    "random_uniform": "RandomUniform",
    "random_standard_normal": "RandomStandardNormal",
    "truncated_normal": "TruncatedNormal",
    "random_uniform_int": "RandomUniformInt",
}


@dataclasses.dataclass(frozen=True)
class Draw:
    """One stateful random op of the traced step, as stock's graph makes it.

    Attributes:
      op: the raw op (``RandomUniform``, ...).
      shape: its static shape at the traced global batch.
      dtype: its dtype's name.
      seed, seed2: its seeds, stock's.
      bounds: ``(minval, maxval)`` of a ``RandomUniformInt``, else ().
      batched: its first dimension is the global batch's (drawn per real row).
      where: the op's name in the trace (for messages).
      loop: the ``While`` body it is made in (a recurrent cell's dropout mask), else "".
      trips: that loop's number of iterations (the op draws again at each; fed as
        :attr:`fed_shape`, one draw per iteration), else 0.
    """

    op: str
    shape: tuple
    dtype: str
    seed: int
    seed2: int
    bounds: tuple
    batched: bool
    where: str
    loop: str = ""
    trips: int = 0

    @property
    def fed_shape(self):
        """The shape the step takes it at: :attr:`shape`, after the loop's ``trips`` in one."""
        return (self.trips, *self.shape) if self.trips else self.shape


def _refuse(what):
    raise ConversionError(
        f"tpushim's JAX engine does not train {what} yet. Train this model with engine=strategy."
    )


#: ``taken``'s ``feed`` for an evaluation or prediction trace: each draw made zeros, its tensor
#: recorded (a ``Lambda`` that draws whatever the mode, its draw unused there, traces with no
#: random op; one whose outputs read it is refused by the caller).
UNUSED = "unused"


def taken(keras_model, global_batch, seeds, feed, record):
    """A context for the trace's body: its graph seeded with ``seeds`` (``(graph seed, op-seed
    counter)`` as stock's graph has them when it calls the model: the RunConfig's
    ``tf_random_seed``, the input graph's counter after the input_fn; None: left as it is), each
    layer's legacy seed where a fresh clone starts it, and each stateful random op the model
    makes either recorded in ``record`` (``feed`` None: the op kept), replaced by ``feed``'s
    next tensor (the step's input), or (``feed`` :data:`UNUSED`) by zeros."""
    fed = iter(feed) if feed not in (None, UNUSED) else None

    def take(name, original, *args, **kwargs):
        names = (
            ("shape", "minval", "maxval") if name == "random_uniform_int" else ("shape", "dtype")
        )
        given = dict(zip(names, args), **kwargs)
        seed, seed2 = given.get("seed"), given.get("seed2")
        where = tf.compat.v1.get_default_graph().unique_name(name, mark_as_used=False)
        body = _loop_body(where)
        if fed is not None:  # the trace that takes them: the record's order, shapes, dtypes
            value = next(fed)
            # in a loop: the iteration's own draw (the loop counter is the body's first input)
            return tf.gather(value, body.inputs[0]) if body is not None else value
        if feed is UNUSED:  # zeros, and the tensor recorded: the caller checks no output reads it
            dtype = given["minval"].dtype if name == "random_uniform_int" else given["dtype"]
            out = tf.zeros(given["shape"], dtype)
            record.append(out)
            return out
        out = original(*args, **kwargs)
        if not out.shape.is_fully_defined():
            _refuse(f"a random draw of a shape known only when it runs ({where})")
        static = tuple(int(d) for d in out.shape)
        bounds = ()
        if name == "random_uniform_int":
            bounds = tuple(tf.get_static_value(given[k]) for k in ("minval", "maxval"))
            if any(b is None for b in bounds):
                _refuse(f"a random integer draw with bounds known only when it runs ({where})")
            bounds = tuple(int(b) for b in bounds)
        record.append(
            Draw(
                _RAW[name],
                static,
                out.dtype.name,
                int(seed or 0),
                int(seed2 or 0),
                bounds,
                bool(static) and static[0] == global_batch,
                where,
                body.name if body is not None else "",
            )
        )
        return out

    return _Taken(keras_model, seeds, take)


def _loop_body(where):
    """The ``While`` body graph (``tf.while_loop``'s, a recurrent layer's loop over its time
    steps) the op being made is in, through the conds inside it; None outside any. Stock runs
    such an op at each iteration, each drawing the next numbers of its stream."""
    graph, bodies = tf.compat.v1.get_default_graph(), []
    while isinstance(graph, tf.__internal__.FuncGraph):
        if re.search(r"while_body_\d+$", graph.name):
            bodies.append(graph)
        graph = getattr(graph, "outer_graph", None)
    if len(bodies) > 1:
        _refuse(f"a random draw in a loop inside a loop ({where})")
    return bodies[0] if bodies else None


def with_trips(draws, graph):
    """``draws`` recorded tracing ``graph`` (a function's), each made in a loop given that
    loop's number of iterations: the time steps of the sequence a recurrent layer's loop
    unstacks (its ``TensorListFromTensor`` inputs' first dimension, static). Another loop's
    draw is refused naming it."""
    loops = {}
    for op in graph.get_operations():
        body = getattr(op, "_body_graph", None)
        if op.type in ("While", "StatelessWhile") and body is not None:
            steps = {
                t.op.inputs[0].shape[0]
                for t in op.inputs
                if t.op.type == "TensorListFromTensor" and t.op.inputs[0].shape.rank
            }
            loops[body.name] = steps.pop() if len(steps) == 1 else None
    out = []
    for d in draws:
        if d.loop:
            trips = loops.get(d.loop)
            if not trips:
                _refuse(
                    f"a random draw in a loop whose number of iterations is not its sequence's "
                    f"static time steps ({d.where})"
                )
            d = dataclasses.replace(d, trips=int(trips))
        out.append(d)
    return tuple(out)


class _Taken:
    def __init__(self, keras_model, seeds, take):
        self._model, self._seeds, self._take = keras_model, seeds, take

    def __enter__(self):
        if self._seeds is not None:
            _tfprivate.graph.set_graph_seeds(tf.compat.v1.get_default_graph(), self._seeds)
        self._contexts = [
            _tfprivate.keras.legacy_seeds_as_configured(self._model),
            _tfprivate.keras.input_dropout_in_loops(self._model),
            _tfprivate.graph.random_ops_hooked(self._take),
        ]
        for c in self._contexts:
            c.__enter__()
        return self

    def __exit__(self, *exc):
        for c in reversed(self._contexts):
            c.__exit__(*exc)


class HostDraws:
    """The step's draws made on the host by stock's ops and seeds (see the module), one
    ``train()`` call's stream: :meth:`draw` gives each step's in turn."""

    def __init__(self, draws, global_batch):
        self.draws, self.global_batch = tuple(draws), global_batch
        self.graph = tf.Graph()
        with self.graph.as_default(), tf.device("/cpu:0"):
            self.rows = tf.compat.v1.placeholder(tf.int32, [], name="rows")
            self.tensors = []
            for d in self.draws:
                shape = list(d.shape)
                if d.batched:
                    shape = tf.stack([self.rows, *[tf.constant(n) for n in shape[1:]]])
                else:
                    shape = tf.constant(shape, tf.int32)
                op = getattr(tf.raw_ops, d.op)
                if d.op == "RandomUniformInt":
                    dtype = tf.as_dtype(d.dtype)
                    t = op(
                        shape=shape,
                        minval=tf.constant(d.bounds[0], dtype),
                        maxval=tf.constant(d.bounds[1], dtype),
                        seed=d.seed,
                        seed2=d.seed2,
                    )
                else:
                    t = op(shape=shape, dtype=tf.as_dtype(d.dtype), seed=d.seed, seed2=d.seed2)
                self.tensors.append(t)
        self._session = tf.compat.v1.Session(graph=self.graph)

    def draw(self, rows):
        """One step's draws for a batch of ``rows`` real rows, padded to the global batch; a
        draw in a loop drawn at each of its iterations, stacked (its op runs once per
        iteration, as stock's in the loop's body does)."""
        feed = {self.rows: rows}
        runs = [[v] for v in self._session.run(self.tensors, feed)]
        for i in range(1, max((d.trips for d in self.draws), default=0)):
            again = [k for k, d in enumerate(self.draws) if d.trips > i]
            for k, v in zip(again, self._session.run([self.tensors[k] for k in again], feed)):
                runs[k].append(v)
        out = []
        for k, d in enumerate(self.draws):
            if d.trips:
                v = np.stack(runs[k])
                if d.batched and rows < self.global_batch:
                    pad = np.zeros((d.trips, self.global_batch - rows, *v.shape[2:]), v.dtype)
                    v = np.concatenate([v, pad], axis=1)
            else:
                v = runs[k][0]
                if d.batched and rows < self.global_batch:
                    pad = np.zeros((self.global_batch - rows, *v.shape[1:]), v.dtype)
                    v = np.concatenate([v, pad])
            out.append(v)
        return out

    def close(self):
        self._session.close()


class CallDraws:
    """One ``evaluate()`` or ``predict()`` call's random draws as stock's graph of that call
    makes them (a draw its outputs read: a ``Lambda`` that draws whatever the mode): seeded from
    ``seeds`` (the call's input graph's: graph seed, op-seed counter after the input_fn), one
    stream per call, each batch drawn for the global batch's ``real`` rows (set per batch) and
    padded to its ``size``; on a pod predicting each process's own rows (``own``: this process's
    index and rows), those rows of it."""

    def __init__(self, seeds):
        self.seeds, self.real, self.size, self.own = seeds, None, None, None
        self._streams = {}

    def batch(self, real, size, own=None):
        self.real, self.size, self.own = real, size, own

    def draws(self, draws):
        from tpushim._jax import _pod

        host = self._streams.get(draws)
        if host is None:
            host = self._streams[draws] = HostDraws(draws, self.size)
        made = host.draw(self.real)
        if self.own is None:
            return made
        index, rows = self.own
        return [
            (
                np.stack([_pod.own_rows(t, index, rows) for t in m])
                if d.trips
                else _pod.own_rows(m, index, rows)
            )
            if d.batched
            else m
            for d, m in zip(draws, made)
        ]

    def close(self):
        for host in self._streams.values():
            host.close()
