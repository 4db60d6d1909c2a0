"""Is a TPU configured, and where did that come from?

Detection (:func:`find_tpu`) makes no network call: it reads only arguments, the RunConfig,
environment variables and device files. Two functions here do use the network, only for the TPU
the user configured and bounded in time: :func:`cluster_resolver` turns a *bare TPU name* into an
address through the GCE metadata server and the Cloud TPU API, and :func:`check_reachable` makes
one TCP connection to a ``grpc://`` address.
"""

import dataclasses
import glob
import importlib.util
import os
import socket
import threading
from typing import Any, Optional

from tpushim._errors import NoTPUError

# TPU VM (and today's Colab TPU runtime) device files. A module constant so tests can point it at
# a folder of fake device files.
DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*")
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
        raise NoTPUError(
            f"TPU {master} (from {source}) is not reachable: {e}. Check the address and that the TPU "
            f"is running (gcloud compute tpus list), run the TPU code path on CPU with "
            f"TPUSHIM_MODE=cpu, or turn tpushim off with TPUSHIM_MODE=off."
        ) from e


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
    result = {}

    def run():
        try:
            result["resolver"] = build()
        except Exception as e:
            result["error"] = e

    worker = threading.Thread(target=run, name="tpushim-resolve-tpu", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise NoTPUError(
            f"Could not resolve TPU {spec.describe()!r} (from {spec.source}) within {timeout_s:.0f} s: "
            f"a TPU name is looked up through the GCE metadata server and the Cloud TPU API, which "
            f"did not answer. Give its address instead (tpu='grpc://IP:8470' or TPUSHIM_TPU), use "
            f"tpu='local' on a TPU VM, or TPUSHIM_MODE=off to run without a TPU."
        )
    if "error" in result:
        e = result["error"]
        raise NoTPUError(
            f"Could not resolve TPU {spec.describe()!r} (from {spec.source}): {type(e).__name__}: {e}. "
            f"Check the name, zone and project, give its address (grpc://IP:8470), or set "
            f"TPUSHIM_MODE=off to run without a TPU."
        ) from e
    return result["resolver"]
