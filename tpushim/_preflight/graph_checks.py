"""Rung 2 as a check: TPUEstimator's whole TPU graph for a script's calls, built for a faked TPU
system (:mod:`tpushim._preflight.faketpu`) without running anything. What TPUEstimator raises
while building is what a TPU run would raise before its first step."""

import os
import shutil
import tempfile

import tensorflow as tf

from tpushim import _estimator
from tpushim._errors import TPUShimError
from tpushim._preflight import faketpu, progress

CORES_PER_HOST = 8  # a Cloud TPU v2/v3 host: 4 chips x 2 cores
EVENTS = ("train", "evaluate", "predict")

#: Fixes for what TPUEstimator raises while building, by a fragment of its message.
_GRAPH_FIXES = (
    (
        "TPUEstimator.predict is only supported",
        "predict on one TPU host (up to 8 cores, e.g. a v3-8), or run predict() without the TPU "
        "(TPUSHIM_MODE=cpu for that run)",
    ),
    (
        "num_shards",
        "remove num_shards from your TPUConfig (TPUEstimator reads the TPU's core count) or set it "
        "to the TPU's cores",
    ),
)


def faked_system_shape(num_cores):
    """(hosts, cores per host) of a TPU with ``num_cores`` cores: 8 per host beyond one host."""
    if num_cores > CORES_PER_HOST and num_cores % CORES_PER_HOST == 0:
        return num_cores // CORES_PER_HOST, CORES_PER_HOST
    return 1, num_cores


def check_tpu_graphs(report, estimator, calls, num_cores, name):
    """Builds the TPU graph of each call for a faked TPU system of ``num_cores`` cores.

    Args:
      report: the :class:`~tpushim._preflight.report.Report` to add findings to.
      estimator: the estimator tpushim converted (in cpu mode); its TPU twin is built.
      calls: ``{event: (input_fn, steps)}``, the script's first call of each of :data:`EVENTS`.
      num_cores: the TPU's cores.
      name: the model's name, for the findings.

    Builds in a scratch model_dir made here and removed afterwards; the user's is not touched.
    """
    hosts, per_host = faked_system_shape(num_cores)
    report.note_checked(f"TPU graphs for {num_cores} cores ({hosts} host{'s' * (hosts != 1)})")
    parent = tempfile.mkdtemp(prefix="tpushim-check-")
    # A folder of our own inside it: a mocked mkdtemp may return a folder we did not create.
    scratch = os.path.join(parent, "tpushim_check_tpu_graphs")
    os.mkdir(scratch)
    try:
        with faketpu.faked_tpu_system(hosts=hosts, cores_per_host=per_host) as tpu:
            cluster = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu.master)
            for event in (e for e in EVENTS if e in calls):
                with progress.phase(f"TPU {event} graph for {num_cores} cores", report):
                    twin = _estimator.tpu_twin(estimator, cluster, os.path.join(scratch, event))
                    _build_one(report, tpu, twin, event, *calls[event], num_cores, name)
    finally:
        tf.compat.v1.summary.FileWriterCache.clear()  # its event files are in the scratch folder
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            os.rmdir(parent)  # only if empty: never anything the check did not write
        except OSError:
            pass


def _build_one(report, tpu, twin, event, input_fn, steps, num_cores, name):
    run = {
        "train": lambda: twin.train(input_fn, steps=1),
        "evaluate": lambda: twin.evaluate(input_fn, steps=steps),
        "predict": lambda: twin.predict(input_fn),
    }[event]
    where = f"{event}() of model {name!r}"
    try:
        tpu.build(run)
    except TPUShimError as e:
        if "batch-indivisible" not in report.codes():  # else already reported
            report.add("tpu-graph", "error", where, str(e), "see the message")
    except Exception as e:
        if (
            "must be divisible by number of replicas" in str(e)
            and "batch-indivisible" in report.codes()
        ):
            return  # already reported, with the sizes that would work
        # TPUEstimator names its master: here the faked one, meaningless to the user.
        first = str(e).strip().splitlines()[0].replace(tpu.master, "the TPU")
        fix = next(
            (f for fragment, f in _GRAPH_FIXES if fragment in str(e)),
            "change the model or input so that TPUEstimator can build it; the message is "
            "TPUEstimator's own",
        )
        report.add(
            "tpu-graph",
            "error",
            where,
            f"TPUEstimator cannot build the TPU {event} graph for {num_cores} cores: "
            f"{type(e).__name__}: {first[:600]}",
            fix,
        )
