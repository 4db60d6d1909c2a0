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
import threading
import types

import tensorflow as tf

from tpushim import _arrays, _tpus

_LOOPBACK = re.compile(r"^grpc://(127\.0\.0\.1|localhost):\d+$")


class _SessionStopped(Exception):
    """Raised where the faked TPU's session would start: the graph is built, nothing more to do."""


class NotBuilt(RuntimeError):
    """The faked system could not get TPUEstimator as far as the TPU session: a limit of the
    faked system (or of what the call did), never something TPUEstimator raised."""


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
        return eval_steps_of(self.hooks)

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

    def metadata(self, query_topology=False):
        """The TPU system query's answer: its devices, and with ``query_topology`` (TPUEstimator
        asks when ``TPUConfig.num_cores_per_replica`` is set) the serialized ``TopologyProto``
        a TPU's ``initialize_system`` returns (:func:`topology`)."""
        devices = []
        for host in range(self.num_hosts):
            prefix = f"/job:worker/replica:0/task:{host}/device:"
            devices.append(device_attributes(prefix + "CPU:0", "CPU"))
            devices += [
                device_attributes(f"{prefix}TPU:{core}", "TPU")
                for core in range(self.cores_per_host)
            ]
        return tf.tpu.experimental.TPUSystemMetadata(
            num_cores=self.num_cores,
            num_hosts=self.num_hosts,
            num_of_cores_per_host=self.cores_per_host,
            topology=(
                topology(self.num_hosts, self.cores_per_host).serialized()
                if query_topology
                else None
            ),
            devices=devices,
        )

    def build(self, call):
        """Runs ``call()`` (an estimator's train/evaluate/predict; a predict generator is
        consumed) up to the TPU session and returns the :class:`Build`. What TPUEstimator raises
        while building propagates.

        Raises:
          NotBuilt: the call returned without starting a session on this TPU (e.g. training
            skipped because model_dir already holds max_steps).
        """
        try:
            result = call()
            if isinstance(result, types.GeneratorType):
                for _ in result:
                    pass
        except _SessionStopped:
            return self.builds[-1]
        raise NotBuilt(f"the call returned without starting a session on {self.master}")

    def answer(self, query_topology):
        """The TPU system query's answer for this system."""
        return self.metadata(query_topology)

    def session_starts(self, scaffold, hooks):
        """Where a session to this system would start: keeps the :class:`Build` and stops."""
        if scaffold is not None:
            scaffold.finalize()  # as the session creator would, so the graph is complete
        self.builds.append(Build(tf.compat.v1.get_default_graph(), hooks))
        raise _SessionStopped()


@contextlib.contextmanager
def faked_tpu_system(master=None, hosts=1, cores_per_host=_tpus.FAKED.devices_per_host):
    """Fakes a TPU system of ``hosts`` x ``cores_per_host`` cores at a loopback ``master``.

    Several faked systems may be active at once (in any threads), each at its own master.

    Args:
      master: ``grpc://127.0.0.1:PORT``; None opens a loopback port that accepts TCP connections
        (so tpushim's reachability probe passes) and fakes the TPU there.
      hosts: TPU hosts (workers), e.g. 2 for a v3-16 pod slice.
      cores_per_host: TPU cores per host (8 on v2/v3 hosts).

    Yields:
      A :class:`FakedTPU`; its ``builds`` collects what TPUEstimator built.

    Raises:
      ValueError: a bad shape or master, or a faked system already active at ``master``.
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
        _SYSTEMS.add(fake)
        stack.callback(_SYSTEMS.remove, fake)
        yield fake


class _Systems:
    """The faked systems active now, by master. TensorFlow's TPU system query and session start
    are replaced process-wide while there is at least one (installed once, under a lock); a query
    or session for a faked master goes to its system, every other one runs as usual."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_master = {}
        self._restore = []

    def add(self, fake):
        with self._lock:
            if fake.master in self._by_master:
                raise ValueError(f"a faked TPU system is already active at {fake.master}")
            if not self._by_master:
                self._restore = [
                    _replace_tpu_system_query(self._answer),
                    _replace_session_start(self._intercept),
                ]
            self._by_master[fake.master] = fake

    def remove(self, fake):
        with self._lock:
            del self._by_master[fake.master]
            if not self._by_master:
                for restore in reversed(self._restore):
                    restore()
                self._restore = []

    def _answer(self, master, cluster_def, query_topology):
        del cluster_def
        fake = self._by_master.get(master)
        return None if fake is None else fake.answer(query_topology)

    def _intercept(self, master, scaffold, hooks):
        fake = self._by_master.get(master)
        if fake is not None:  # else another session (e.g. a scratch one reading the input)
            fake.session_starts(scaffold, hooks)


_SYSTEMS = _Systems()


def topology(num_hosts, cores_per_host):
    """The ``tf.tpu.experimental.Topology`` of a TPU of ``num_hosts`` x ``cores_per_host`` cores,
    laid out as Cloud TPUs are: two cores per chip (one for an odd count), a v2/v3 host's 4 chips
    in a 2 x 2 block (2 chips in a column, others in a row), hosts tiling the mesh. A v2-8/v3-8 is mesh
    ``[2, 2, 1, 2]`` with TPU:0..7 at ``(0,0,0,0) (0,0,0,1) (1,0,0,0) (1,0,0,1) (0,1,0,0) ...``,
    as TPUEstimator logs it on one; 16 cores ``[4, 2, 1, 2]``, 32 ``[4, 4, 1, 2]`` (the
    computation shapes TPUEstimator asks of them for ``num_cores_per_replica``)."""
    per_chip = _tpus.FAKED.devices_per_chip  # the generations table's faked host
    per_chip = per_chip if cores_per_host % per_chip == 0 else 1
    chips = cores_per_host // per_chip
    block = _tpus.HOST_BLOCKS.get(chips, (chips, 1))
    grid = [1, 1]  # hosts along x and y, doubling the shorter side while the count allows
    while grid[0] * grid[1] < num_hosts and num_hosts % (grid[0] * grid[1] * 2) == 0:
        grid[grid[0] > grid[1]] *= 2
    grid[0] *= num_hosts // (grid[0] * grid[1])
    mesh = [block[0] * grid[0], block[1] * grid[1], 1, per_chip]
    coordinates = []
    for host in range(num_hosts):
        x0, y0 = (host % grid[0]) * block[0], (host // grid[0]) * block[1]
        coordinates.append(
            [
                [x0 + x, y0 + y, 0, core]
                for y in range(block[1])
                for x in range(block[0])
                for core in range(per_chip)
            ]
        )
    return tf.tpu.experimental.Topology(mesh_shape=mesh, device_coordinates=coordinates)


# --- the private TensorFlow names the faked system reaches (pinned by tests/proofs/test_tpu_system.py) --


def device_attributes(name, device_type):
    """A device as a TPU system lists it (``session.list_devices()`` entries)."""
    from tensorflow.python.client import session as session_lib

    return session_lib._DeviceAttributes(name, device_type, 0, 0)


def eval_steps_of(hooks):
    """The evaluate step count TPUEstimator gave its session (``_StopAfterNEvalsHook``), or None."""
    from tensorflow.python.training import evaluation

    for hook in hooks:
        if isinstance(hook, evaluation._StopAfterNEvalsHook):
            return hook._num_evals
        inner = eval_steps_of(getattr(hook, "hooks", ()))  # hooks tpushim makes at session start
        if inner is not None:
            return inner
    return None


def _replace_tpu_system_query(answer):
    """Makes ``answer(master, cluster_def, query_topology)`` the TPU system query TPUEstimator's
    context sends (``tpu_context`` calls it once per master and caches the result in
    ``_lazy_tpu_system_metadata_dict``); ``answer`` returns None to let the real query run.
    Returns a function that restores the real one (unless someone replaced ours since)."""
    from tensorflow.python.tpu import tpu_system_metadata as module

    real = module._query_tpu_system_metadata

    def query(master, cluster_def=None, query_topology=False):
        metadata = answer(master, cluster_def, query_topology)
        if metadata is None:
            return real(master, cluster_def=cluster_def, query_topology=query_topology)
        return metadata

    module._query_tpu_system_metadata = query
    return lambda: _restore(module, "_query_tpu_system_metadata", query, real)


def _replace_session_start(intercept):
    """Calls ``intercept(master, scaffold, hooks)`` where a MonitoredSession (train, evaluate and
    predict all use one) is about to create its tf.Session, after every hook's ``begin()``; it
    raises to stop the session, or returns to let it start. Returns a function that restores the
    original (unless someone replaced ours since).

    The point is ``_MonitoredSession._CoordinatedSessionCreator.create_session``: the one place all
    three modes pass with the session's master, scaffold and hooks in reach.
    """
    from tensorflow.python.training import monitored_session

    creator_class = monitored_session._MonitoredSession._CoordinatedSessionCreator
    real = creator_class.create_session

    def create_session(self):
        inner = self._session_creator
        intercept(
            getattr(inner, "_master", None), getattr(inner, "_scaffold", None), list(self._hooks)
        )
        return real(self)

    creator_class.create_session = create_session
    return lambda: _restore(creator_class, "create_session", create_session, real)


def _restore(owner, name, ours, original):
    if getattr(owner, name) is ours:
        setattr(owner, name, original)
