"""Is a TPU configured, and where did that come from?

Detection (:func:`find_tpu`) makes no network call: it reads only arguments, the RunConfig,
environment variables and device files. Two functions here do use the network, only for the TPU
the user configured and bounded in time: :func:`cluster_resolver` turns a *bare TPU name* into an
address through the GCE metadata server and the Cloud TPU API; :func:`check_tpu_answers` asks a
``grpc://`` TPU for its devices, bounded in time, before anything is written (and
:func:`check_reachable` makes one TCP connection to it).
"""

import dataclasses
import glob
import importlib.util
import os
import socket
import threading
from typing import Any, Optional

from tpushim import _tpus
from tpushim._errors import NoTPUError

# TPU VM (and today's Colab TPU runtime) device files, from the TPU generations table
# (/dev/accel* on v2 - v4, /dev/vfio/N on v5e, v5p, v6e). A module constant so tests can point it
# at a folder of fake device files.
DEVICE_GLOBS = _tpus.DEVICE_GLOBS
LIBTPU_FILES = ("/lib/libtpu.so", "/usr/lib/libtpu.so", "/usr/local/lib/libtpu.so")

#: environment variables TPUClusterResolver itself reads, in the order it reads them.
RESOLVER_ENV_VARS = ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_CONFIG")

#: every environment variable detection reads to find a TPU (tests clear these to start from a
#: machine with no TPU; the benchmark clears them so both sides run the same way).
TPU_ENV_VARS = ("TPUSHIM_TPU",) + RESOLVER_ENV_VARS + ("COLAB_TPU_ADDR", "TPU_LIBRARY_PATH")

RESOLVE_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class TPUSpec:
    """A configured TPU.

    Attributes:
      target: what TPUClusterResolver is given as ``tpu=``: a name, ``grpc://...``, ``local``,
        None (the resolver reads the variable named in ``source`` itself), or a resolver object.
      source: where it came from, e.g. ``TPU_NAME`` or ``TPU VM (/dev/accel0)``.
      config_cluster: True when the user's ``tpu_config.RunConfig`` already carries the cluster.
    """

    target: Any
    source: str
    config_cluster: bool = False

    def describe(self):
        if self.config_cluster:
            return "from config"
        if isinstance(self.target, str):
            return self.target
        if self.target is None:
            return f"${self.source}"
        return type(self.target).__name__

    @property
    def needs_lookup(self):
        """True when resolving the target asks the metadata server / Cloud TPU API."""
        bare_name = (
            isinstance(self.target, str) and self.target != "local" and "://" not in self.target
        )
        return bare_name or self.source == "TPU_CONFIG"  # TPU_CONFIG names a TPU node, too


def _libtpu_present(environ):
    path = environ.get("TPU_LIBRARY_PATH")
    if path:
        return os.path.exists(path)
    if any(os.path.exists(p) for p in LIBTPU_FILES):
        return True
    return any(importlib.util.find_spec(m) is not None for m in ("libtpu",))


def tpu_vm_device(environ=None):
    """The first TPU device file when this is a TPU VM with libtpu installed, else None."""
    environ = os.environ if environ is None else environ
    for pattern in DEVICE_GLOBS:
        found = sorted(glob.glob(pattern))
        if found and _libtpu_present(environ):
            return found[0]
    return None


def platform(environ=None):
    """This machine's platform (:func:`tpushim._platforms.detect`), from the environment and
    this module's :data:`DEVICE_GLOBS`."""
    from tpushim import _platforms  # not at start-up

    return _platforms.detect(environ, DEVICE_GLOBS)


def find_tpu(settings, config=None, environ=None) -> Optional[TPUSpec]:
    """Returns the TPU the call should use, or None. Makes no network call."""
    environ = os.environ if environ is None else environ
    if settings.tpu is not None:
        source = settings.sources.get("tpu", "argument")
        return TPUSpec(settings.tpu, "tpu= argument" if source == "argument" else source)
    # A tpu_config.RunConfig (it has .tpu_config) that already names a cluster or master.
    if config is not None and hasattr(config, "tpu_config"):
        cluster = getattr(config, "cluster", None)
        if cluster is not None:
            return TPUSpec(cluster, "config.cluster", config_cluster=True)
        master = getattr(config, "master", "") or ""
        if master:
            return TPUSpec(master, "config.master", config_cluster=True)
    for var in RESOLVER_ENV_VARS:
        value = environ.get(var, "").strip()
        if value:
            return TPUSpec(value if var == "TPU_NAME" else None, var)
    colab = environ.get("COLAB_TPU_ADDR", "").strip()
    if colab:
        # TF 2.15 no longer reads COLAB_TPU_ADDR (old Colab TPU nodes): build the address.
        return TPUSpec(
            colab if colab.startswith("grpc://") else "grpc://" + colab, "COLAB_TPU_ADDR"
        )
    device = tpu_vm_device(environ)
    if device:
        return TPUSpec("local", f"TPU VM ({device})")
    return None


REACH_TIMEOUT_S = 5.0

#: The deadline of the device query :func:`check_tpu_answers` sends a TPU (TensorFlow's own waits
#: 5 minutes, and tries 12 times). A TPU worker lists its devices within a second or two.
QUERY_TIMEOUT_S = 10.0

#: What a failed check says to do, after what failed.
_FIX = (
    "Check the address and port (a Cloud TPU node listens on 8470) and that the TPU is running "
    "(gcloud compute tpus list), run the TPU code path on CPU with TPUSHIM_MODE=cpu, or turn "
    "tpushim off with TPUSHIM_MODE=off."
)


def check_reachable(master, source):
    """A ``grpc://host:port`` TPU that does not accept a connection is a clear error, not a hang.

    TensorFlow itself would wait for the session (``session_creation_timeout_secs``, 2 hours).
    Only the address the user configured is contacted, with one TCP connect bounded by
    ``REACH_TIMEOUT_S``; an estimator probes it until it has answered once.
    """
    if not master or not master.startswith("grpc://"):
        return
    host, _, port = master[len("grpc://") :].rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except (OSError, ValueError) as e:
        raise NoTPUError(f"TPU {master} (from {source}) is not reachable: {e}. {_FIX}") from e


def _bounded(fn, timeout_s, name):
    """``fn()`` in a daemon thread: ``("value", result)``, ``("error", exception)`` or
    ``("timeout", None)`` when it has not returned after ``timeout_s``."""
    result = {}

    def run():
        try:
            result["value"] = fn()
        except Exception as e:
            result["error"] = e

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return "timeout", None
    return next(iter(result.items()))


def check_tpu_answers(cluster, source, timeout_s=None):
    """The ``grpc://`` TPU of ``cluster`` answers as a TPU worker does, or a clear
    :class:`NoTPUError` within ``REACH_TIMEOUT_S + timeout_s + 5`` seconds (20 s).

    Run before anything is written to the model_dir. Tried in turn: one TCP connection
    (:func:`check_reachable`: a refusal fails in milliseconds), then the question TPUEstimator
    itself asks first -- the devices of the TensorFlow master (``Session.list_devices()``, one
    gRPC call) -- with a deadline of ``timeout_s`` (``QUERY_TIMEOUT_S``) where TensorFlow's own
    would wait 5 minutes, 12 times over: an address that accepts connections and never answers
    (or answers, but not as a TensorFlow worker) fails here, and so does a TensorFlow server
    without TPU devices. Where TensorFlow's TPU system query was replaced (the preflight's faked
    TPU system), that query answers instead. A ``local`` TPU (a TPU VM) is not contacted.

    Args:
      cluster: the TPUClusterResolver the estimator will use (:func:`cluster_resolver`).
      source: where the TPU came from, for the message.
      timeout_s: the device query's deadline; ``QUERY_TIMEOUT_S`` when None.
    """
    master = cluster.master() if hasattr(cluster, "master") else ""
    if not master or not master.startswith("grpc://"):
        check_tpu_support(source)  # a TPU of this machine: can this TensorFlow drive one?
        return
    check_reachable(master, source)
    timeout_s = QUERY_TIMEOUT_S if timeout_s is None else timeout_s
    spec = cluster.cluster_spec()
    cluster_def = spec.as_cluster_def() if spec else None
    import tensorflow as tf

    from tpushim import _tfprivate  # imports TensorFlow: not at start-up

    replaced = _tfprivate.tpu.replaced_tpu_system_query()

    def list_devices():
        if replaced is not None:
            return replaced(master, cluster_def=cluster_def).devices
        # TensorFlow's own query, with a deadline of ours (tpu_system_metadata's: 5 minutes).
        config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=int(timeout_s * 1000))
        if cluster_def is not None:
            config.cluster_def.CopyFrom(cluster_def)
        with tf.Graph().as_default(), tf.compat.v1.Session(master, config=config) as session:
            return session.list_devices()

    tried = (
        f"tried: a TCP connection (accepted), then TensorFlow's device query (a gRPC call to "
        f"the TensorFlow worker there) with a {timeout_s:.0f} s deadline"
    )
    outcome, value = _bounded(list_devices, timeout_s + 5, "tpushim-query-tpu")
    if outcome == "timeout" or isinstance(value, tf.errors.DeadlineExceededError):
        raise NoTPUError(
            f"TPU {master} (from {source}) accepts connections but did not answer as a TPU "
            f"within {timeout_s:.0f} s ({tried}): it is not a TPU's address, or the TPU is not "
            f"ready. {_FIX}"
        )
    if outcome == "error":
        first_line = (str(value).strip().splitlines() or [""])[0]
        raise NoTPUError(
            f"TPU {master} (from {source}) did not answer as a TPU worker does ({tried}: "
            f"{type(value).__name__}: {first_line}). {_FIX}"
        ) from value
    kinds = sorted({getattr(device, "device_type", "?") for device in value})
    if "TPU" not in kinds:
        raise NoTPUError(
            f"{master} (from {source}) answered TensorFlow's device query, but has no TPU devices "
            f"(it has: {', '.join(kinds) or 'none'}): it is a TensorFlow server, not a TPU "
            f"({tried}). {_FIX}"
        )


#: The op a TPU system is started with, on StreamExecutor runtimes (TPUEstimator's and
#: TPUStrategy's ``initialize_tpu_system``): pip's ``tensorflow`` and ``tensorflow-cpu`` define it
#: but register no kernel for it, and fail there at ``train()`` with "No OpKernel was registered
#: to support Op 'ConfigureDistributedTPU'".
TPU_SYSTEM_OP = "ConfigureDistributedTPU"


def _has_kernel(op):
    from tensorflow.python.framework import kernels  # imports TensorFlow: not at start-up

    return bool(kernels.get_registered_kernels_for_op(op).kernel)


def check_tpu_support(source, environ=None, tf_version=None, has_kernel=None):
    """A TPU of this machine (``local``) that this TensorFlow cannot drive fails now, before
    anything is written, naming the install that would drive it, instead of TensorFlow's raw
    error at the first ``train()``. A PJRT runtime (:func:`tpushim._tpus.pjrt_runtime`), which
    starts its TPU otherwise, is not judged by the op.

    Args:
      source: where the TPU came from, for the message.
      environ, tf_version: the environment and TensorFlow version (this process's when None).
      has_kernel: ``op -> bool``, whether TensorFlow registered a kernel for it (asked when None).
    """
    environ = os.environ if environ is None else environ
    if _tpus.pjrt_runtime(environ):
        return
    if (has_kernel or _has_kernel)(TPU_SYSTEM_OP):
        return
    if tf_version is None:
        import tensorflow as tf

        tf_version = tf.__version__
    minor = ".".join(tf_version.split(".")[:2])
    try:
        release = tuple(int(p) for p in minor.split("."))
    except ValueError:
        release = (0, 0)
    from tpushim import _platforms

    last = _platforms.TPU_BUILD_LAST  # the last TensorFlow with a TPU build (tensorflow-tpu)
    if release < (2, 16):
        install = (
            f"TensorFlow {minor} drives a TPU only as Cloud TPU VM images built for it have it "
            f"(a TPU v2, v3 or v4 created with --version=tpu-vm-tf-{tf_version}-se or the "
            "image of your release: keep that TensorFlow, `pip install .` without the cpu "
            "extra); pip's tensorflow and tensorflow-cpu cannot"
        )
    elif release <= tuple(int(p) for p in last.split(".")):
        install = (
            f'install the TPU build of this release: pip install "tensorflow-tpu=={minor}.*" '
            "(with its libtpu, from the libtpu release index) beside "
            f'"tensorflow=={minor}.*"'
        )
    else:
        install = (
            f"no TPU build of TensorFlow {minor} exists (tensorflow-tpu stops at {last}): "
            f'pip install "tensorflow=={last}.*" "tensorflow-tpu=={last}.*" "tf-keras~={last}.0" '
            "(with libtpu, from the libtpu release index)"
        )
    # What this platform needs (Colab's, Kaggle's TPU), where it knows better than the release.
    here = platform(environ)
    sentence = _platforms.tpu_install(here, release) or f"To train on the TPU, {install}."
    raise NoTPUError(
        f"a TPU is configured ({source}), but TensorFlow {tf_version} here cannot drive it: it "
        f"has no kernel for {TPU_SYSTEM_OP}, the op a TPU system starts with (pip's tensorflow "
        f"and tensorflow-cpu are CPU/GPU builds). {sentence} To run the "
        "TPU code path on the CPU instead, set TPUSHIM_MODE=cpu; to train without tpushim, "
        "TPUSHIM_MODE=off."
    )


def cluster_resolver(spec: TPUSpec, timeout_s: Optional[float] = None):
    """Builds the TPUClusterResolver for ``spec``; a bare name's lookup is bounded in time.

    Args:
      spec: the TPU found by :func:`find_tpu`.
      timeout_s: bound on a bare name's lookup; ``RESOLVE_TIMEOUT_S`` (10 s) when None.
    """
    timeout_s = RESOLVE_TIMEOUT_S if timeout_s is None else timeout_s
    if not isinstance(spec.target, (str, type(None))):
        return spec.target  # the user's own resolver (or config.cluster)
    import tensorflow as tf

    def build():
        return tf.distribute.cluster_resolver.TPUClusterResolver(tpu=spec.target)

    if not spec.needs_lookup:
        return build()  # 'local' and grpc:// addresses make no network call
    outcome, value = _bounded(build, timeout_s, "tpushim-resolve-tpu")
    if outcome == "timeout":
        raise NoTPUError(
            f"Could not resolve TPU {spec.describe()!r} (from {spec.source}) within {timeout_s:.0f} s: "
            f"a TPU name is looked up through the GCE metadata server and the Cloud TPU API, which "
            f"did not answer. Give its address instead (tpu='grpc://IP:8470' or TPUSHIM_TPU), use "
            f"tpu='local' on a TPU VM, or TPUSHIM_MODE=off to run without a TPU."
        )
    if outcome == "error":
        raise NoTPUError(
            f"Could not resolve TPU {spec.describe()!r} (from {spec.source}): "
            f"{type(value).__name__}: {value}. Check the name, zone and project, give its address "
            f"(grpc://IP:8470), or set TPUSHIM_MODE=off to run without a TPU."
        ) from value
    return value
