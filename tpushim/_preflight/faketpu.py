"""A faked TPU system: TPUEstimator builds its whole TPU graph on CPU, and no session starts.

Two facts about the environment are faked, nothing in TensorFlow's graph building: the answer to
the TPU system query TPUEstimator sends to its master (how many hosts and cores, which devices),
and the session to that master, stopped just before it would be created (after every hook's
``begin()``, with the graph finalized). What TPUEstimator raises while building is raised to the
caller, as it would be on a TPU. Used by the tests (rung 2 of the proof ladder) and by the
preflight's graph check (:mod:`tpushim._preflight.graph_checks`, run by ``python -m tpushim check``).
"""

import contextlib
import dataclasses
import re
import socket
import types

import tensorflow as tf

from tpushim import _arrays, _tfprivate

_LOOPBACK = re.compile(r"^grpc://(127\.0\.0\.1|localhost):\d+$")


class _SessionStopped(Exception):
    """Raised where the faked TPU's session would start: the graph is built, nothing more to do."""


def _walk_nodes(graph_def):
    yield from graph_def.node
    for function in graph_def.library.function:
        yield from function.node_def


@dataclasses.dataclass
class Build:
    """What TPUEstimator built for one train/evaluate/predict call on the faked system.

    Attributes:
      graph: the finalized graph the TPU system's session would have run.
      hooks: the session hooks it would have run it with.
    """

    graph: tf.Graph
    hooks: list

    def nodes(self, op_type):
        """NodeDefs of ``op_type``, in the graph and in every function of its library (TPU loops
        and the replicated computation are functions under TF2 control flow)."""
        return [n for n in _walk_nodes(self.graph.as_graph_def()) if n.op == op_type]

    def infeed_shapes(self):
        """The shapes each infeed enqueue op sends to a TPU core, as lists of ints (None unknown)."""
        return [
            [
                [d.size if d.size >= 0 else None for d in shape.dim]
                if not shape.unknown_rank
                else None
                for shape in node.attr["shapes"].list.shape
            ]
            for node in self.nodes("InfeedEnqueueTuple")
        ]

    @property
    def eval_steps(self):
        """The number of evaluation steps the session would run (None outside evaluate)."""
        return _tfprivate.eval_steps_of(self.hooks)

    def host_input(self, host, max_batches=1000):
        """Runs host ``host``'s input pipeline from this graph on CPU (input pipelines run on the
        TPU hosts' CPUs), its lookup tables initialised first: the batches it would feed, one list
        per ``get_next`` call per core, each a flat list of numpy arrays, until it ends or ``max_batches`` batches."""
        graph_def = self.graph.as_graph_def()
        task = f"/task:{host}/"
        makers = [n for n in graph_def.node if n.op == "MakeIterator" and task in n.device]
        if len(makers) != 1:
            raise ValueError(f"expected one input iterator on host {host}, found {len(makers)}")
        iterators = {n.name: n for n in graph_def.node if n.op in ("IteratorV2", "Iterator")}
        iterator = iterators[makers[0].input[1].split(":")[0]]
        # The host's lookup tables, which the session's Scaffold initialises (local_init_op)
        # before the dataset initializer hooks run.
        tables = [
            op.name
            for op in self.graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)
            if task in op.device
        ]
        # Only the input pipeline: TPU ops in the rest of the graph have no CPU kernels.
        graph_def = tf.compat.v1.graph_util.extract_sub_graph(
            graph_def, [makers[0].name, iterator.name, *tables]
        )
        for node in graph_def.node:
            node.device = ""  # the hosts' CPUs are this machine's CPU
        # In-memory arrays are fed to the host's pipeline where it starts, as on a TPU host.
        arrays = _arrays.fed_arrays(self.graph)
        feeds = {n.name: arrays[n.name] for n in graph_def.node if n.name in arrays}
        batches = []
        with tf.Graph().as_default() as graph:
            tf.graph_util.import_graph_def(graph_def, name="")
            resource = graph.get_tensor_by_name(iterator.name + ":0")
            get_next = tf.raw_ops.IteratorGetNext(
                iterator=resource,
                output_types=list(iterator.attr["output_types"].list.type),
                output_shapes=[
                    tf.TensorShape(s) for s in iterator.attr["output_shapes"].list.shape
                ],
            )
            with tf.compat.v1.Session(graph=graph) as sess:
                sess.run([graph.get_operation_by_name(name) for name in tables])
                sess.run(
                    graph.get_operation_by_name(makers[0].name),
                    {graph.get_tensor_by_name(name + ":0"): a for name, a in feeds.items()},
                )
                while len(batches) < max_batches:
                    try:
                        batches.append(sess.run(get_next))
                    except tf.errors.OutOfRangeError:
                        break
        return batches


class FakedTPU:
    """A faked TPU system, as yielded by :func:`faked_tpu_system`.

    Attributes:
      master: its address (``grpc://127.0.0.1:PORT``).
      num_hosts, cores_per_host: its shape.
      builds: one :class:`Build` per session TPUEstimator tried to start, in order.
    """

    def __init__(self, master, num_hosts, cores_per_host):
        self.master, self.num_hosts, self.cores_per_host = master, num_hosts, cores_per_host
        self.builds: list[Build] = []

    @property
    def num_cores(self):
        return self.num_hosts * self.cores_per_host

    def metadata(self):
        devices = []
        for host in range(self.num_hosts):
            prefix = f"/job:worker/replica:0/task:{host}/device:"
            devices.append(_tfprivate.tpu_device_attributes(prefix + "CPU:0", "CPU"))
            devices += [
                _tfprivate.tpu_device_attributes(f"{prefix}TPU:{core}", "TPU")
                for core in range(self.cores_per_host)
            ]
        return tf.tpu.experimental.TPUSystemMetadata(
            num_cores=self.num_cores,
            num_hosts=self.num_hosts,
            num_of_cores_per_host=self.cores_per_host,
            topology=None,
            devices=devices,
        )

    def build(self, call):
        """Runs ``call()`` (an estimator's train/evaluate/predict; a predict generator is
        consumed) up to the TPU session and returns the :class:`Build`. What TPUEstimator raises
        while building propagates.

        Raises:
          RuntimeError: the call returned without starting a session on this TPU (e.g. training
            skipped because model_dir already holds max_steps).
        """
        try:
            result = call()
            if isinstance(result, types.GeneratorType):
                for _ in result:
                    pass
        except _SessionStopped:
            return self.builds[-1]
        raise RuntimeError(f"the call returned without starting a session on {self.master}")


@contextlib.contextmanager
def faked_tpu_system(master=None, hosts=1, cores_per_host=8):
    """Fakes a TPU system of ``hosts`` x ``cores_per_host`` cores at a loopback ``master``.

    Args:
      master: ``grpc://127.0.0.1:PORT``; None opens a loopback port that accepts TCP connections
        (so tpushim's reachability probe passes) and fakes the TPU there.
      hosts: TPU hosts (workers), e.g. 2 for a v3-16 pod slice.
      cores_per_host: TPU cores per host (8 on v2/v3 hosts).

    Yields:
      A :class:`FakedTPU`; its ``builds`` collects what TPUEstimator built.
    """
    if hosts < 1 or cores_per_host < 1:
        raise ValueError(
            f"a faked TPU needs at least one host and core, got {hosts} x {cores_per_host}"
        )
    with contextlib.ExitStack() as stack:
        if master is None:
            listener = stack.enter_context(socket.socket())
            listener.bind(("127.0.0.1", 0))
            listener.listen(16)
            master = "grpc://127.0.0.1:%d" % listener.getsockname()[1]
        elif not _LOOPBACK.match(master):
            raise ValueError(
                f"a faked TPU lives on loopback only (grpc://127.0.0.1:PORT), not {master!r}"
            )
        fake = FakedTPU(master, hosts, cores_per_host)
        metadata = fake.metadata()

        def answer(queried, cluster_def, query_topology):
            del cluster_def
            if queried != master:
                return None
            if query_topology:
                raise ValueError(
                    "the faked TPU system has no topology: model parallelism "
                    "(TPUConfig.num_cores_per_replica) cannot be built on it"
                )
            return metadata

        def intercept(session_master, scaffold, hooks):
            if session_master != master:
                return  # another session (e.g. a scratch one reading the input): let it start
            if scaffold is not None:
                scaffold.finalize()  # as the session creator would, so the graph is complete
            fake.builds.append(Build(tf.compat.v1.get_default_graph(), hooks))
            raise _SessionStopped()

        stack.callback(_tfprivate.replace_tpu_system_query(answer))
        stack.callback(_tfprivate.replace_session_start(intercept))
        yield fake
