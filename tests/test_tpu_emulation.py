"""Rung 2b: the TPU model_fn run as 8 shards on CPU, with different data and a real cross-replica sum.

All 8 replicas are built in ONE graph (each call of the model_fn clones the Keras model, so each has
its own variables, set to the same initial values). ``cross_replica_sum`` is replaced, for the build
only, by an AddN whose inputs are rewired, once every replica exists, to the 8 replicas' tensors of
the same call: a true sum across shards. ``tpu_shard_context(8)`` gives ``number_of_shards`` = 8.
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_function
from tensorflow.python.tpu.ops import tpu_ops

import tfcases
from tpushim import _model_fn

ModeKeys = tf.estimator.ModeKeys
REPLICAS = 8
PER = 4
TOL = 1e-5


class _Rendezvous:
    """cross_replica_sum across replicas built one after another in one graph."""

    def __init__(self):
        self.calls = []  # per replica: [AddN op of each cross_replica_sum call, in order]

    def cross_replica_sum(self, x, group_assignment=None, name=None):
        del group_assignment, name
        x = tf.convert_to_tensor(x)
        total = tf.math.add_n([x] * REPLICAS)
        self.calls[-1].append((total.op, x))
        return total

    def wire(self):
        counts = {len(c) for c in self.calls}
        assert len(counts) == 1 and counts.pop() > 0, "replicas made different cross_replica_sum calls"
        for i in range(len(self.calls[0])):
            ops = [calls[i][0] for calls in self.calls]
            xs = [calls[i][1] for calls in self.calls]
            for op in ops:
                for k, x in enumerate(xs):
                    op._update_input(k, x)  # pylint: disable=protected-access


def _new_vars(graph, before):
    return [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
            if v.ref() not in before]


def _replicas(model, mode, shard_inputs, monkeypatch):
    """(graph, per-replica specs, per-replica variables): the TPU model_fn built once per replica in
    one graph, its cross_replica_sums wired into true sums across the replicas."""
    graph, rv = tf.Graph(), _Rendezvous()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        model_fn = _model_fn.make_model_fn(model)
        monkeypatch.setattr(tf.compat.v1.tpu, "cross_replica_sum", rv.cross_replica_sum)
        monkeypatch.setattr(tpu_ops, "cross_replica_sum", rv.cross_replica_sum)
        specs, replica_vars = [], []
        for r in range(REPLICAS):
            before = {v.ref() for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
            rv.calls.append([])
            features, labels = shard_inputs(r)
            with tpu_function.tpu_shard_context(REPLICAS):
                specs.append(model_fn(features, labels, mode, params={"use_tpu": True, "batch_size": PER}))
            replica_vars.append(_new_vars(graph, before))
        monkeypatch.undo()
        rv.wire()
    return graph, specs, replica_vars


def _init_as_replica_0(sess, replica_vars):
    """Initialises every replica with replica 0's initial values; returns those values."""
    sess.run(tf.compat.v1.global_variables_initializer())
    init = sess.run(replica_vars[0])
    for vs in replica_vars[1:]:
        for v, val in zip(vs, init):
            v.load(val, sess)
    return init


def _shard(r):
    return slice(r * PER, (r + 1) * PER)


def _emulated_train(build_model, x, y, monkeypatch, steps=1):
    """Per replica: the final values of its variables after ``steps`` TPU-shard train steps."""
    graph, specs, replica_vars = _replicas(
        build_model(), ModeKeys.TRAIN,
        lambda r: (tf.constant(x[_shard(r)]), tf.constant(y[_shard(r)])), monkeypatch)
    with tf.compat.v1.Session(graph=graph) as sess:
        init = _init_as_replica_0(sess, replica_vars)
        for _ in range(steps):
            sess.run([spec.train_op for spec in specs])
        return init, [sess.run(vs) for vs in replica_vars], [v.name for v in replica_vars[0]]


def _reference_train(build_model, x, y, init, steps=1):
    """The same model_fn, no TPU, one step on the whole global batch, from the same initial values."""
    model = build_model()
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        before = {v.ref() for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
        spec = _model_fn.make_model_fn(model)(tf.constant(x), tf.constant(y), ModeKeys.TRAIN,
                                              params={"use_tpu": False, "batch_size": len(x)})
        vs = _new_vars(graph, before)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert [v.shape.as_list() for v in vs] == [list(i.shape) for i in init]
            for v, val in zip(vs, init):
                v.load(val, sess)
            for _ in range(steps):
                sess.run(spec.train_op)
            return sess.run(vs)


def _max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64))))
               for p, q in zip(a, b))


OPTS = {
    "keras-sgd-momentum": lambda: tf.keras.optimizers.legacy.SGD(0.5, momentum=0.9),
    "keras-adam": lambda: tf.keras.optimizers.legacy.Adam(0.05),
    "tf1-momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.5, 0.9),
}


# Adam over one step only: Keras legacy Adam's bias correction reads the optimizer's `iterations`,
# which keras_lib binds to the global step; in this one-graph emulation all 8 replicas share it and
# each train op advances it (8 per emulated step), so a
# second step is not what a TPU (one iterations counter per replica) computes.
@pytest.mark.parametrize("opt,steps", [("keras-sgd-momentum", 2), ("tf1-momentum", 2), ("keras-adam", 1)])
def test_eight_shards_equal_one_global_batch(opt, steps, monkeypatch):
    x, y = tfcases.data(n=REPLICAS * PER)
    build = lambda: tfcases.sequential(OPTS[opt]())
    init, replicas, names = _emulated_train(build, x, y, monkeypatch, steps=steps)
    ref = _reference_train(build, x, y, init, steps=steps)
    assert _max_diff(init, ref) > 1e-3  # training moved the weights
    for values in replicas:
        assert _max_diff(values, ref) < TOL, names


def test_negative_control_summed_gradients_fail(monkeypatch):
    """Gradients summed over shards instead of averaged must be caught by the comparison."""
    x, y = tfcases.data(n=REPLICAS * PER)
    build = lambda: tfcases.sequential(OPTS["keras-sgd-momentum"]())
    monkeypatch.setattr(_model_fn._tfprivate, "num_shards_in_replica_context", lambda: 1)
    init, replicas, _ = _emulated_train(build, x, y, monkeypatch)
    ref = _reference_train(build, x, y, init)
    assert _max_diff(replicas[0], ref) > 100 * TOL


def test_eight_shards_eval_loss_is_the_global_batchs_with_padding_shards(monkeypatch):
    """22 real rows padded to a global batch of 32: shard 5 is half padding, shards 6 and 7 only
    padding; every shard's eval loss must be that of the 22 real rows (TPUEstimator reports shard 0's)."""
    from tpushim import _input_fn  # pylint: disable=import-outside-toplevel
    real = 22
    x, y = tfcases.data(n=REPLICAS * PER)
    x[real:], y[real:] = 0, 0
    pad = np.array([1.0] * real + [0.0] * (REPLICAS * PER - real), np.float32)
    model = tfcases.sequential(OPTS["keras-sgd-momentum"]())
    graph, specs, replica_vars = _replicas(
        model, ModeKeys.EVAL,
        lambda r: ({_input_fn.FEATURES_KEY: tf.constant(x[_shard(r)]),
                    _input_fn.PADDING_KEY: tf.constant(pad[_shard(r)])}, tf.constant(y[_shard(r)])),
        monkeypatch)
    with tf.compat.v1.Session(graph=graph) as sess:
        init = _init_as_replica_0(sess, replica_vars)
        shard_losses = sess.run([spec.loss for spec in specs])
    ref_graph = tf.Graph()
    with ref_graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        before = {v.ref() for v in ref_graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
        spec = _model_fn.make_model_fn(model)(tf.constant(x[:real]), tf.constant(y[:real]),
                                              ModeKeys.EVAL, params={"use_tpu": False, "batch_size": real})
        vs = _new_vars(ref_graph, before)
        with tf.compat.v1.Session(graph=ref_graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for v, val in zip(vs, init):
                v.load(val, sess)
            ref_loss = sess.run(spec.loss)
    assert all(abs(s - ref_loss) < TOL for s in shard_losses), (shard_losses, ref_loss)
    assert abs(shard_losses[0] - ref_loss) < TOL and shard_losses[0] > 0
