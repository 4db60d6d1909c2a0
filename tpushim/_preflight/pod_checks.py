"""How a pod's hosts would read each recorded input (``--cores 16`` and above: several hosts):
the path :mod:`tpushim._pods` takes for it, and why, as the estimator decides it on a pod."""

import tensorflow as tf

from tpushim import _pods
from tpushim._preflight import graph_checks

_FIXES = {
    "files": "nothing to do; pod_input=exact (TPUSHIM_POD_INPUT) feeds stock's batches exactly "
    "instead, every host reading the whole input",
    "exact": "nothing to do",
    "fallback": "to have each host read only its own files, read shuffled, repeated training "
    "input from at least as many files as hosts (e.g. TFRecordDataset or Dataset.list_files), "
    "with deterministic=True in dataset functions; or set pod_input=exact to say the exact path "
    "is meant",
}


def analyse(input_call, pod_input):
    """The recorded input as :func:`tpushim._pods.analyse` reads it, or None for tensors."""
    if not isinstance(input_call.result, tf.data.Dataset):
        return None
    return _pods.analyse(input_call.result, _pods.needs_files(input_call.mode, pod_input))


def _invocations(conversion, event, hosts):
    """The input_fn invocations TPUEstimator makes for ``event`` on ``hosts`` hosts: one per
    host, but one in all for predict (tpushim has host 0 feed every core) and for evaluate under
    the user's ``SLICED`` TPUConfig."""
    if event == "predict":
        return 1
    tpu_config = getattr(conversion.estimator.config, "tpu_config", None)
    sliced = getattr(tpu_config, "eval_training_input_configuration", None)
    if event == "evaluate" and sliced is _pods.SLICED:
        return 1
    return hosts


def check_pod_inputs(report, recorded, num_cores):
    """A ``pod-input`` finding per recorded input on a TPU of several hosts: ``info`` for the
    path taken, ``warning`` where the files path was asked for or would have saved the hosts
    work but something stands in the way (the message says what)."""
    hosts, _ = graph_checks.faked_system_shape(num_cores)
    if hosts < 2:
        return
    settings = recorded.conversion.settings
    for i, (call, input_call) in enumerate(recorded.calls):
        graph = recorded.pod_inputs.get(i)
        if graph is None:
            continue
        count = _invocations(recorded.conversion, call.event, hosts)
        path = _pods.decide(graph, input_call.mode, settings.pod_input, count)
        name = getattr(call.input_fn, "__name__", "input_fn")
        report.add(
            "pod-input",
            "warning" if path.fallback else "info",
            f"{call.event}() input_fn {name!r}",
            f"on {hosts} TPU hosts: {path.name} path: {path.why}",
            _FIXES["fallback" if path.fallback else path.name],
        )
