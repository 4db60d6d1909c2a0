"""The TPU-replica harness shared by the tests and the benchmarks: tpushim's TPU model_fn as 8
replicas on CPU, in two ways.

* :func:`replicate` BUILDS a computation over 8 TPU replicas with ``tf.compat.v1.tpu.replicate``
  (never run: ``CrossReplicaSum`` has no CPU kernel); :func:`replicated_model_fn` does it for
  tpushim's model_fn. Rung 2 asserts on that graph; the benchmarks count its ops.
* :class:`Emulation` RUNS the model_fn as 8 replicas with numbers (rung 2b). All 8 are built in
  ONE graph (each model_fn call clones the Keras model, so each replica has its own variables).
  ``cross_replica_sum`` is replaced, for the build only, by an AddN whose inputs are rewired, once
  every replica exists, to the 8 replicas' tensors of the same call: a true sum across shards.
  ``tpu_shard_context(8)`` gives ``number_of_shards`` = 8. A gradient through an emulated sum is
  CrossReplicaSum's: itself a cross-replica sum (of the replicas' upstream gradients). Each
  replica gets its own global step (keras_lib binds the optimizer's ``iterations`` to it), as
  each TPU core advances its own copy of the replicated step once per step.

This is a helper module, not a test module, and not part of the installed package.
"""

import contextlib
import copy
from unittest import mock

import numpy as np
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import
from tensorflow.python.tpu import tpu_function
from tensorflow.python.tpu.ops import tpu_ops

_losses, _model_fn, _validation = (
    tpuestimator_import(f"tpushim.{m}") for m in ("_losses", "_model_fn", "_validation")
)

ModeKeys = tfcases.ModeKeys
REPLICAS = 8
PER = 4  # rows per replica
GLOBAL = REPLICAS * PER


# -- rung 2: replicated by TPU replication, built, never run ----------------------------------------


def replicate(computation, replicas=REPLICAS):
    """``computation()`` replicated over ``replicas`` TPU replicas in a new graph with a global step.

    Returns:
      ``(graph, outputs)``: ``outputs[r]`` is replica r's list of outputs.
    """
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        outputs = tf.compat.v1.tpu.replicate(computation, inputs=[[]] * replicas)
    return graph, outputs


def replicated_model_fn(model, mode, features_fn, labels_fn, out_fn, per=PER):
    """tpushim's TPU model_fn for ``model`` replicated by :func:`replicate`.

    Args:
      model: a compiled Keras model.
      mode: a ``ModeKeys`` value.
      features_fn, labels_fn: build one replica's features and labels (called in the computation).
      out_fn: ``spec -> outputs`` of the replicated computation (see :func:`train_step_outputs`).
      per: ``params['batch_size']``, the rows per replica.
    Returns:
      ``(graph, spec of the last replica built, outputs)``.
    """
    model_fn = _model_fn.make_model_fn(model)
    captured = {}

    def computation():
        spec = model_fn(
            features_fn(), labels_fn(), mode, params={"use_tpu": True, "batch_size": per}
        )
        captured["spec"] = spec
        return out_fn(spec)

    graph, outputs = replicate(computation)
    return graph, captured["spec"], outputs


def train_step_outputs(spec):
    """The loss, after the train op: a train step's replicated output."""
    with tf.control_dependencies([spec.train_op]):
        return tf.identity(spec.loss)


def ops_of_type(graph, op_type):
    return [op for op in graph.get_operations() if op.type == op_type]


def cross_replica_sums(names):
    """What each CrossReplicaSum of a TPU train step (given by op or node name) is for:
    ``{"gradient": one per trainable variable, "reported loss": 1, "loss totals": 0 or 1}``
    (the last where a loss term needs counts or weight sums of the global batch)."""
    purposes = {"gradient": 0, "reported loss": 0, "loss totals": 0}
    for name in names:
        if _losses.REPORTED_SUM in name:
            purposes["reported loss"] += 1
        elif _losses.TOTALS_SUM in name:
            purposes["loss totals"] += 1
        else:
            purposes["gradient"] += 1
    return purposes


def cluster_ops(graph):
    """The ops inside the replicate cluster (what XLA would compile for the TPU)."""
    return [op for op in graph.get_operations() if "_tpu_replicate" in op.node_def.attr]


def live_ops(outputs):
    """Every op the tensors ``outputs`` depend on, through data and control inputs."""
    seen, stack = set(), [t.op for t in outputs]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


# -- rung 2b: emulated with numbers -----------------------------------------------------------------


class _Rendezvous:
    """cross_replica_sum across replicas built one after another in one graph."""

    def __init__(self):
        self.calls = []  # per replica: [(AddN op, its replica's input) per cross_replica_sum call]

    def cross_replica_sum(self, x, group_assignment=None, name=None):
        del group_assignment, name

        # Differentiated (a synchronized BatchNormalization's statistics), a sum's gradient is the
        # sum of the replicas' upstream gradients, as TPU's CrossReplicaSum gradient is.
        @tf.custom_gradient
        def total_of(x):
            total = tf.math.add_n([x] * REPLICAS)
            self.calls[-1].append((total.op, x))
            return total, self.cross_replica_sum

        return total_of(tf.convert_to_tensor(x))

    def wire(self):
        counts = {len(c) for c in self.calls}
        assert len(counts) == 1, "replicas made different cross_replica_sum calls"
        for i in range(len(self.calls[0])):
            ops = [calls[i][0] for calls in self.calls]
            xs = [calls[i][1] for calls in self.calls]
            for op in ops:
                for k, x in enumerate(xs):
                    op._update_input(k, x)


def shard(r):
    """Replica r's rows of a global batch."""
    return slice(r * PER, (r + 1) * PER)


def global_vars(graph):
    return graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)


def _placeholders(template):
    """Placeholders for one shard's slice of a global batch shaped like ``template`` (numpy)."""
    return tf.nest.map_structure(
        lambda a: tf.compat.v1.placeholder(tf.as_dtype(a.dtype), [PER] + list(a.shape[1:])),
        template,
    )


class Assigner:
    """Sets many variables in one session.run (Variable.load makes an op and a run per variable)."""

    def __init__(self, graph, variables):
        with graph.as_default():
            self.values = [tf.compat.v1.placeholder(v.dtype.base_dtype, v.shape) for v in variables]
            self.op = tf.group([v.assign(p) for v, p in zip(variables, self.values)])

    def __call__(self, sess, values):
        sess.run(self.op, dict(zip(self.values, values)))


def tpu_model(build_model):
    """The model as tpushim's conversion hands it to the model_fn (new-style optimizer -> legacy)."""
    model = build_model()
    model.optimizer = _validation.validate(model, None)
    return model


def max_diff(a, b):
    """The largest absolute difference between two lists of arrays."""
    return max(
        float(np.max(np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64))))
        for p, q in zip(a, b)
    )


class Emulation:
    """tpushim's TPU model_fn as 8 replicas in one graph for ``mode``, fed per shard by ``feed``.

    ``wrap_model_fn``, if given, wraps that model_fn first; ``config``, if given, is the RunConfig
    it gets (a TPU one records each step's loss, :mod:`tpushim._step_losses`). ``template``: a global batch (numpy
    ``(features, labels)``, or features alone) giving the
    inputs' structure, dtypes and shapes. Attributes, one entry per replica: ``specs`` (the
    TPUEstimatorSpecs), ``clones`` (the Keras models the model_fn built), ``inputs``
    (placeholders), ``features`` (the tensors the model_fn got), ``vars`` (the global variables
    it created, in creation order) and ``steps`` (its global step).
    """

    def __init__(self, model, mode, template, wrap_model_fn=None, config=None):
        self.graph, rv = tf.Graph(), _Rendezvous()
        self.clones, self.specs, self.inputs, self.features, self.vars, self.steps = (
            [],
            [],
            [],
            [],
            [],
            [],
        )
        self._assign = {}
        with self.graph.as_default(), contextlib.ExitStack() as patches:
            patch = lambda target, name, value: patches.enter_context(
                mock.patch.object(target, name, value)
            )
            model_fn = _model_fn.make_model_fn(model)
            if wrap_model_fn is not None:  # e.g. tf.estimator.add_metrics' (tpushim._extenders)
                model_fn = wrap_model_fn(model_fn)
            build_clone = _model_fn._tfprivate.keras.clone_and_build_model

            def recording_clone(*args, **kwargs):
                clone = build_clone(*args, **kwargs)
                inner = getattr(clone.optimizer, "optimizer", None)
                if isinstance(inner, tf.compat.v1.train.Optimizer):
                    # Keras cloning hands every clone the model's one tf1 optimizer, whose
                    # non-slot variables (Adam's beta powers) are per graph: 8 replicas in one
                    # graph would share (and 8 times advance) them. Each TPU core has its own.
                    inner = copy.copy(inner)
                    inner._slots, inner._non_slot_dict = {}, {}
                    clone.optimizer.optimizer = inner
                self.clones.append(clone)
                return clone

            patch(_model_fn._tfprivate.keras, "clone_and_build_model", recording_clone)
            patch(tf.compat.v1.tpu, "cross_replica_sum", rv.cross_replica_sum)
            patch(tpu_ops, "cross_replica_sum", rv.cross_replica_sum)  # CrossShardOptimizer's
            for r in range(REPLICAS):
                step = tf.compat.v1.get_variable(
                    f"replica_{r}_global_step",
                    shape=[],
                    dtype=tf.int64,
                    trainable=False,
                    initializer=tf.compat.v1.zeros_initializer(),
                )
                patch(tf.compat.v1.train, "get_or_create_global_step", lambda graph=None, s=step: s)
                patch(tf.compat.v1.train, "get_global_step", lambda graph=None, s=step: s)
                before = {v.ref() for v in global_vars(self.graph)}
                rv.calls.append([])
                inputs = _placeholders(template)
                # The model_fn sees tensors, as a TPU's infeed gives it, not placeholders: Keras
                # treats placeholder labels as feedable and then weights outputs differently.
                tensors = tf.nest.map_structure(tf.identity, inputs)
                features, labels = tensors if isinstance(tensors, tuple) else (tensors, None)
                self.features.append(features)
                with tpu_function.tpu_shard_context(REPLICAS):
                    self.specs.append(
                        model_fn(
                            features,
                            labels,
                            mode,
                            params={"use_tpu": True, "batch_size": PER},
                            config=config,
                        )
                    )
                self.inputs.append(inputs)
                self.steps.append(step)
                self.vars.append([v for v in global_vars(self.graph) if v.ref() not in before])
            rv.wire()
            config = tf.compat.v1.ConfigProto()
            # Grappler's rewrites of an 8-replica graph cost more than these tiny steps save.
            config.graph_options.rewrite_options.disable_meta_optimizer = True
            self.sess = tf.compat.v1.Session(graph=self.graph, config=config)
            self.sess.run(
                [
                    tf.compat.v1.global_variables_initializer(),
                    tf.compat.v1.local_variables_initializer(),
                ]
            )

    def feed(self, batch):
        """Replica r gets rows [r*PER, (r+1)*PER) of the global ``batch``."""
        feed = {}
        for r, inputs in enumerate(self.inputs):
            for p, a in zip(tf.nest.flatten(inputs), tf.nest.flatten(batch)):
                feed[p] = a[shard(r)]
        return feed

    def train(self, batch):
        """One step of every replica, on its shard of the global ``batch``; returns the loss
        each replica reports for it (TPUEstimator reads replica 0's)."""
        _, losses = self.sess.run(
            [[spec.train_op for spec in self.specs], [spec.loss for spec in self.specs]],
            self.feed(batch),
        )
        return losses

    def _set(self, key, variables, values):
        if key not in self._assign:
            self._assign[key] = Assigner(self.graph, variables)
        self._assign[key](self.sess, values)

    def load_weights(self, values):
        """Every replica's model weights (Keras order) set to ``values``."""
        assert len({id(c) for c in self.clones}) == len(self.clones), (
            "a subclassed model is reset in place by each replica's clone: use start_as_replica_0"
        )
        for clone in self.clones:
            assert [w.shape.as_list() for w in clone.weights] == [list(np.shape(v)) for v in values]
        self._set(
            "weights",
            [w for clone in self.clones for w in clone.weights],
            list(values) * len(self.clones),
        )

    def start_as_replica_0(self):
        """Every replica's variables set to replica 0's initial values; returns those values."""
        init = self.sess.run(self.vars[0])
        self._set("vars", [v for vs in self.vars[1:] for v in vs], init * (REPLICAS - 1))
        return init

    def weight_names(self):
        """Checkpoint names of the model weights (replica 0 is built first: no uniquifying suffix)."""
        return [w.name.split(":")[0] for w in self.clones[0].weights]

    def var_names(self):
        return [v.name.split(":")[0] for v in self.vars[0]]

    def close(self):
        self.sess.close()
