"""Rung 2 as a check: TPUEstimator's whole TPU graph for a script's calls, built for a faked TPU
system (:mod:`tpushim._preflight.faketpu`) without running anything. What TPUEstimator raises
while building is what a TPU run would raise before its first step."""

import os

import tensorflow as tf
import wrapt

from tpushim import _detect, _estimator, _plan, _run_config, _scratch, _shapes, _tpus
from tpushim._errors import TPUShimError
from tpushim._preflight import faketpu, progress

#: TPU cores per host of the faked system: a Cloud TPU v2/v3 host, 4 chips x 2 cores (the TPU
#: generations table, :data:`tpushim._tpus.FAKED`).
CORES_PER_HOST = _tpus.FAKED.devices_per_host
EVENTS = ("train", "evaluate", "predict")

#: Fixes for what TPUEstimator raises while building, by a fragment of its message.
_GRAPH_FIXES = (
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


def check_tpu_graphs(report, conversion, calls, num_cores, name, train_ops=None):
    """Builds the TPU graph of each call for a faked TPU system of ``num_cores`` cores.

    Args:
      report: the :class:`~tpushim._preflight.report.Report` to add findings to.
      conversion: the :class:`tpushim._observe.Conversion` (in cpu mode): the estimator it would
        have been on this TPU is built, with the same model_fn and settings.
      calls: ``{event: (Call, InputCall)}``, the script's first call of each of :data:`EVENTS`.
      num_cores: the TPU's cores.
      name: the model's name, for the findings.

      train_ops: a list, or None: where given, the ops the model_fn makes for the TPU train
        graph are appended to it (:func:`model_fn_ops`), for the host-only-ops check to read
        instead of building the model_fn again.

    The input is a replay of what each call's input_fn built (:func:`replay_input_fn`): the
    user's input_fn is not called again. Builds in a scratch model_dir made here and removed
    afterwards; the user's is not touched.
    """
    hosts, per_host = faked_system_shape(num_cores)
    report.note_checked(f"TPU graphs for {num_cores} cores ({hosts} host{'s' * (hosts != 1)})")
    with (
        _scratch.scratch_folder("tpushim-check-", "tpushim_check_tpu_graphs") as scratch,
        faketpu.faked_tpu_system(hosts=hosts, cores_per_host=per_host) as tpu,
    ):
        try:
            spec = _detect.TPUSpec(tpu.master, "the preflight's faked TPU")
            cluster = _detect.cluster_resolver(spec)
            for event in (e for e in EVENTS if e in calls):
                call, input_call = calls[event]
                with progress.phase(f"TPU {event} graph for {num_cores} cores", report):
                    config = conversion.estimator.config.replace(
                        model_dir=os.path.join(scratch, event)
                    )
                    model_fn = saver_left_out(conversion.model_fn)
                    twin = _estimator.make_estimator(
                        model_fn_ops(model_fn, train_ops)
                        if event == "train" and train_ops is not None
                        else model_fn,
                        _run_config.to_tpu_run_config(config, conversion.settings, cluster),
                        _plan.ConversionPlan(
                            settings=conversion.settings,
                            tpu=spec,
                            model_inputs=_shapes.ModelInputs.of(conversion.keras_model),
                        ),
                    )
                    replay = replay_input_fn(input_call)
                    _build_one(report, tpu, twin, event, replay, call.steps, num_cores, name)
        finally:
            tf.compat.v1.summary.FileWriterCache.clear()  # its event files are in the scratch folder


def model_fn_ops(model_fn, sink):
    """``model_fn``, which appends to ``sink`` the ops its first successful TRAIN call made (in
    the graph it was called in: inside a TPU graph, the replicated step's), as one list.

    Why: the host-only-ops check reads the ops of the model_fn's training graph; the TPU train
    graph builds that model_fn already (a Keras clone and its training function, seconds for an
    image model), so the check reads them from there instead of building them again. Its
    signature is ``model_fn``'s (wrapt): the estimator passes what it takes, by name.
    """

    @wrapt.decorator
    def recording(wrapped, instance, args, kwargs):
        del instance
        mode = kwargs.get("mode", args[2] if len(args) > 2 else None)
        graph = tf.compat.v1.get_default_graph()
        before = len(graph.get_operations())
        spec = wrapped(*args, **kwargs)
        if mode == tf.estimator.ModeKeys.TRAIN and not sink:
            sink.append(graph.get_operations()[before:])
        return spec

    return recording(model_fn)


class _SaverLeftOut:
    """The Scaffold's saver in the preflight's TPU graphs: building it is left out."""

    def build(self):
        pass


def saver_left_out(model_fn):
    """``model_fn``, whose TPUEstimatorSpec's ``scaffold_fn`` makes a Scaffold with no saver built.

    Why: the saver's ops (a save and a restore for every variable, optimizer slots included) are
    a second of graph building per TPU graph for an image model, and they check nothing the
    cpu-mode run has not: TPUEstimator calls ``scaffold_fn`` on the host, outside the TPU
    computation, and tpushim's makes the same saver from the same variables on a TPU as in cpu
    mode, where the script's own run built it (and saved with it). The rest of the Scaffold
    (its init, ready and local-init ops) is still built when the faked session starts.
    """

    @wrapt.decorator
    def leaving_out(wrapped, instance, args, kwargs):
        del instance
        spec = wrapped(*args, **kwargs)
        if getattr(spec, "scaffold_fn", None) is None:
            return spec
        return spec._replace(scaffold_fn=lambda: tf.compat.v1.train.Scaffold(saver=_SaverLeftOut()))

    return leaving_out(model_fn)


def replay_input_fn(input_call):
    """An input_fn that builds what one recorded input_fn call built, in structure, dtypes,
    shapes (unknown dimensions stay unknown), batching and length -- from zeros, not the user's
    data, and without calling the user's input_fn again."""
    result, facts = input_call.result, input_call.facts
    is_dataset = isinstance(result, tf.data.Dataset)
    spec = (
        result.element_spec
        if is_dataset
        else tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), result)
    )
    batch = facts.declared or input_call.global_batch

    def row(s):
        shape = [d if d is not None else 1 for d in s.shape.as_list()[1:]]
        value = tf.zeros(shape, s.dtype) if s.dtype != tf.string else tf.fill(shape, "")
        if isinstance(s, tf.SparseTensorSpec):  # a SparseTensor again (no value present)
            return tf.sparse.from_dense(value)
        return tf.raw_ops.PlaceholderWithDefault(input=value, shape=s.shape[1:])

    def input_fn():
        if not is_dataset:  # tensors: zeros of the same shapes, as tensors again
            return tf.nest.map_structure(
                lambda s: tf.zeros([batch] + s.shape.as_list()[1:], s.dtype), spec
            )
        rows = tf.data.Dataset.from_tensors(0).map(lambda _: tf.nest.map_structure(row, spec))
        static = all(s.shape.rank and s.shape[0] is not None for s in tf.nest.flatten(spec))
        length = facts.examples if facts.examples is not None else None
        rows = rows.repeat(length) if length is not None else rows.repeat()
        return rows.batch(batch, drop_remainder=static)

    return input_fn


def _build_one(report, tpu, twin, event, input_fn, steps, num_cores, name):
    run = {
        "train": lambda: twin.train(input_fn, steps=1),
        "evaluate": lambda: twin.evaluate(input_fn, steps=steps),
        "predict": lambda: twin.predict(input_fn),
    }[event]
    where = f"{event}() of model {name!r}"
    try:
        tpu.build(run)
    except faketpu.NotBuilt as e:
        # The faked system's limit (or the call did not build), not TPUEstimator's: unchecked.
        report.add(
            "tpu-graph-unchecked",
            "warning",
            where,
            f"the preflight could not build the TPU {event} graph on its faked TPU system, so it "
            f"was not checked ({str(e).replace(tpu.master, 'the faked TPU')}); this is a limit "
            f"of the preflight, not something TPUEstimator or a TPU raised",
            "nothing to change for the TPU; run the script on a TPU to check this call",
        )
    except TPUShimError as e:
        report.add("tpu-graph", "error", where, str(e), "see the message")
    except Exception as e:
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
