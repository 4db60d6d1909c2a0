"""``python -m tpushim check script.py`` on TensorFlow >= 2.16: the script run a few steps on
tpushim's estimator API (tpushim/_estimator_api), and every check that needs no TPUEstimator.

TensorFlow 2.16 and later have no TPUEstimator, so the TPU code path the preflight runs on 2.15
(cpu mode, :mod:`~tpushim._preflight.recorder`) does not exist there. What a TPU would refuse is
still found on CPU: the input each train/evaluate/predict call built (static shapes, strings,
Python in the pipeline, read from the graph the input_fn built, nothing read from it), the batch
against the TPU's cores, host-only ops in the model's training graph (the conversion's own
model_fn, built on a batch of zeros shaped as the input's), and the training step compiled with
XLA (``jit_compile=True`` on CPU: the check a TPU compile would fail) -- the strategy engine's
step (:mod:`tpushim._strategy`, tpushim's TPU path there: one replica's share of the padded
global batch, its share of the loss, its gradients; a note names the engine), or, where that
engine would refuse the model (an error finding says why), the model's own step. The same
strategy checks serve :func:`tpushim.check` on TensorFlow <= 2.15 where the settings choose
that engine (``engine='strategy'``, a PJRT runtime). What needs TPUEstimator --
its TPU graphs on a faked TPU system, how a pod's hosts would read the input, the conversion's
TPU model_fn -- is named in one note as not run. The script runs as on 2.15's preflight: steps
capped, model_dirs and exports moved to scratch copies (:mod:`~tpushim._preflight.model_dirs`),
nothing of the user's written. Imports no tensorflow_estimator.
"""

import contextlib
import dataclasses

import numpy as np
import tensorflow as tf

from tpushim import _settings, _shapes
from tpushim._preflight import input_checks, model_checks, progress, script_recorder
from tpushim._preflight.report import Report, failure_as_finding, script_frame, summary

#: What the preflight on TensorFlow <= 2.15 checks that needs TPUEstimator, said in one note.
NOT_RUN = (
    "not run on TensorFlow {version} (no TPUEstimator there; tpushim's TPU path for TensorFlow "
    ">= 2.16 is the strategy engine, checked instead for its input, host-only ops and XLA): "
    "TPUEstimator's TPU graphs on a faked TPU system "
    "(infeed, one CrossReplicaSum per variable, outfeed, evaluation steps), how a pod's hosts "
    "would read the input, and the conversion checks of tpushim's TPU model_fn (loss kinds a "
    "TPU's cores split, metrics as metric_fn, iterations_per_loop)"
)
#: Dataset ops that batch, and the input holding their batch size.
_BATCH_OPS = ("BatchDataset", "BatchDatasetV2", "PaddedBatchDataset", "PaddedBatchDatasetV2")


@dataclasses.dataclass
class _Input:
    """What one input_fn call built: its result (a Dataset or tensors), the op types of the graph
    it built (``top``) and of that graph's functions (``inner``), the bytes of constants, and the
    batch size its graph declares (None when unknown)."""

    result: object
    top: set
    inner: set
    constants: int
    batch_size: int = None


@dataclasses.dataclass
class _Recorded:
    conversion: object
    calls: list = dataclasses.field(default_factory=list)  # (Call, _Input or None)
    derived: list = dataclasses.field(default_factory=list)

    def first(self, event):
        return next(((c, i) for c, i in self.calls if c.event == event), None)


class StrategyRecorder(script_recorder.ScriptRecorder):
    """Records the script's conversions and input_fn calls on tpushim's estimator API and caps their
    steps (:class:`tpushim._preflight.script_recorder.ScriptRecorder`), as
    :class:`tpushim._preflight.recorder.Recorder` does on the TPU path; its :meth:`report` runs
    the checks that need no TPUEstimator."""

    def converting(self, arguments):
        """The conversion's model_dir (given, or its RunConfig's) replaced by a scratch copy."""
        from tpushim._estimator_api import _config

        return self._dirs.conversion_arguments(arguments, _config.RunConfig)

    def refused(self, arguments, error):
        self._refusals.append((arguments, error))

    def converted(self, conversion):
        self._dirs.redirect_exports(conversion.estimator)
        self._conversions.append(_Recorded(conversion))

    def derived(self, estimator, source, model_fn):
        del model_fn
        owner = self._owner(source)
        if owner is not None:
            self._dirs.redirect_exports(estimator)
            owner.derived.append(estimator)

    def input_called(self, input_call):
        """Reads, from the graph the input_fn just built (before the model is added to it), what
        it holds: nothing is run."""
        owner = self._owner(input_call.call.estimator) if input_call.call else None
        if owner is None:
            return
        for i, (call, recorded) in enumerate(owner.calls):
            # By input_fn: the call running is the capped copy calling() returned.
            if recorded is None and call.input_fn is input_call.call.input_fn:
                owner.calls[i] = (call, _read_input(input_call.result))
                return

    # -- the report ------------------------------------------------------------------------------
    def report(self, num_cores=_settings.DEFAULT_CORES):
        report = Report(notes=list(self._dirs.notes))
        report.notes.append(NOT_RUN.format(version=tf.__version__))
        for _, error in self._refusals:
            report.add(
                "conversion-failed",
                "error",
                f"model_to_estimator call at {script_frame(error)}",
                f"model_to_estimator raised {self._dirs.as_the_users(summary(error, None))}: "
                f"the script's input, host-only ops and XLA compile were not checked",
                "run the script with python -m tpushim to reproduce it, with its traceback",
            )
        self.add_no_conversion(report)
        for recorded in self._conversions:
            with failure_as_finding(report):
                _report_one(report, recorded, num_cores, recorded.conversion.settings.batch_size)
        return report


def _read_input(result, graph_def=None):
    """An :class:`_Input` from ``graph_def``, else the default graph, which the input_fn built
    ``result`` in."""
    if graph_def is None:
        graph_def = tf.compat.v1.get_default_graph().as_graph_def()
    top = {node.op for node in graph_def.node}
    inner = {node.op for f in graph_def.library.function for node in f.node_def}
    constants = sum(
        node.attr["value"].tensor.ByteSize()
        for node in [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
        if node.op == "Const"
    )
    return _Input(result, top, inner, constants, _declared_batch(graph_def))


def read_strategy_input(input_call):
    """An :class:`_Input` of what an input_fn call of the strategy engine built (an
    :class:`tpushim._observe.InputCall`: a Dataset on the eager runtime, or one of the graph the
    engine built it in, ``_tpushim_graph``): its ops read from that graph, else from the eager
    Dataset's own GraphDef (how tf.data serializes a pipeline); nothing is run."""
    from tpushim import _tfprivate

    result = input_call.result
    graph = getattr(result, "_tpushim_graph", None)
    if graph is not None:
        graph_def = graph.as_graph_def()
    else:  # an eager Dataset, read eagerly (also where the program disabled v2 behaviour)
        with _tfprivate.graph.eager_runtime():
            serialized = _tfprivate.data.serialized_dataset(result).numpy()
        graph_def = tf.compat.v1.GraphDef.FromString(serialized)
    recorded = _read_input(result, graph_def)
    recorded.batch_size = input_call.global_batch  # the engine's: declared, else its first batch's
    return recorded


def _declared_batch(graph_def):
    """The batch size of the last batching Dataset op (in the graph, then in its functions: a
    one-shot iterator's Dataset lives in one), where a constant gives it; else None."""
    size = None
    for nodes in [graph_def.node, *(f.node_def for f in graph_def.library.function)]:
        consts = {n.name: n for n in nodes if n.op == "Const"}
        for node in nodes:
            if node.op in _BATCH_OPS and len(node.input) > 1:
                const = consts.get(node.input[1].split(":")[0].lstrip("^"))
                if const is not None:
                    with contextlib.suppress(Exception):
                        size = int(tf.make_ndarray(const.attr["value"].tensor))
    return size


def _element_spec(result):
    if isinstance(result, tf.data.Dataset):
        return result.element_spec
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), result)


def _batch_size(recorded_input, spec):
    if recorded_input.batch_size:
        return recorded_input.batch_size
    for tensor_spec in tf.nest.flatten(spec):
        # A TF1 program's shapes (disable_v2_behavior) hold Dimension objects, never None.
        first = tf.compat.dimension_value(tensor_spec.shape[0]) if tensor_spec.shape.rank else None
        if first is not None:
            return int(first)
    return None


def _check_input(report, call, recorded_input, batch_size, num_cores, model_inputs):
    """The input checks on what one call's input_fn built; returns a batch of zeros shaped as
    its elements (features, labels), or None."""
    report.note_checked("input pipeline")
    name = getattr(call.input_fn, "__name__", "input_fn")
    result = recorded_input.result
    spec = _element_spec(result)
    if isinstance(result, tf.data.Dataset):
        spec = input_checks.completed_spec(report, spec, model_inputs)
    input_checks._check_element_spec(report, spec, input_checks.host_keys(model_inputs))
    input_checks.report_pipeline_ops(
        report,
        name,
        recorded_input.top,
        recorded_input.inner,
        recorded_input.constants,
    )
    size = batch_size or _batch_size(recorded_input, spec)
    if size:
        input_checks.check_batch(
            report,
            size,
            num_cores,
            "setting batch_size" if batch_size else f"input_fn {name!r} (batch of {size})",
        )
    batch = tf.nest.map_structure(lambda s: _zeros(s, size or num_cores), spec)
    return batch if isinstance(batch, tuple) and len(batch) == 2 else (batch, None)


def _zeros(spec, batch):
    shape = [batch] + [d if d is not None else 1 for d in (spec.shape.as_list() or [])[1:]]
    if spec.dtype == tf.string:
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=spec.dtype.as_numpy_dtype)


def _report_one(report, recorded, num_cores, batch_size):
    conversion = recorded.conversion
    script_recorder.add_distribute_findings(report, conversion, num_cores)
    keras_model = conversion.keras_model
    model_inputs = _shapes.ModelInputs.of(keras_model)
    train_batch = train_spec = None
    for call, recorded_input in recorded.calls:
        if recorded_input is None:
            continue
        with progress.phase(f"input pipeline of {call.event}()", report):
            batch = _check_input(report, call, recorded_input, batch_size, num_cores, model_inputs)
        if call.event == "train" and train_batch is None:
            train_batch, train_spec = batch, _element_spec(recorded_input.result)
    if train_batch is None or "dynamic-shape" in report.codes():
        return  # as on the TPU path: the model checks need a training batch of static shape
    settings = conversion.settings or _settings.resolve()
    engine = "jax" if settings.engine == "jax" else "strategy"
    if engine == "jax":  # the JAX engine's step, not the strategy engine's
        from tpushim._preflight import jax_checks

        report.notes[:] = [jax_checks.not_run_note(n) for n in report.notes]
    if input_checks.check_sparse_features(report, keras_model, train_spec, engine):
        return  # the engine refuses train() before its step is built: the finding says why
    features, labels = train_batch
    custom_objects = conversion.arguments.get("custom_objects")
    with progress.phase("host-only ops in the model", report), failure_as_finding(report):
        _check_host_only_ops(report, conversion, features, labels)
    if engine == "jax":
        with progress.phase("XLA compile of the JAX step", report), failure_as_finding(report):
            jax_checks.check_jax_step(
                report, keras_model, custom_objects, settings, features, labels, num_cores
            )
        return
    with progress.phase("XLA compile of the training step", report), failure_as_finding(report):
        plan = strategy_plan(report, keras_model, custom_objects, settings)
        if plan is None:  # the engine would refuse the model (a finding says why): the model's step
            model_checks.check_xla(report, keras_model, custom_objects, features, labels)
        else:
            check_strategy_step(report, plan, features, labels, num_cores)


def strategy_plan(report, keras_model, custom_objects, settings):
    """The strategy engine's plan of this model (:func:`tpushim._strategy.plan.make_plan`), where
    that engine is tpushim's TPU path (TensorFlow >= 2.16, a PJRT runtime, ``engine='strategy'``).
    None, with an error finding, where the engine would refuse the model (it checks that before
    anything is written, as here)."""
    from tpushim import _engines
    from tpushim._errors import ConversionError

    try:
        return _engines.get(_engines.STRATEGY).refusals(keras_model, custom_objects, settings)
    except ConversionError as e:
        report.add(
            "strategy-engine-refuses",
            "error",
            f"model {keras_model.name!r}",
            f"tpushim's TPU path here is the strategy engine (tf.distribute), which would "
            f"refuse this model: {e}",
            "see the message",
        )
        return None


def check_strategy_step(report, plan, features, labels, num_cores):
    """The strategy engine's training step (forward, the replica's share of the loss, gradients)
    for ``num_cores`` replicas compiled with XLA on CPU (:func:`tpushim._strategy.xla_check.check_xla`,
    as the engine checks it off a TPU), on one replica's share of the global batch (padded to a
    multiple of the replicas, as the engine pads it): the findings name the op and the layer as
    for the model's step, and a note says which engine they are for."""
    from tpushim import _batch_math, _padding
    from tpushim._errors import ConversionError
    from tpushim._strategy import runtime as _strategy_runtime
    from tpushim._strategy import xla_check as _strategy_xla_check

    report.note_checked("XLA compile of the training step")
    size = int(tf.nest.flatten(features)[0].shape[0])
    sparse = model_checks.sparse_again(plan.keras_model, features)
    if sparse is not features and plan.host is not None:  # as the input pipeline feeds them
        from tpushim import _host_part, _tfprivate

        train = _tfprivate.estimator.ModeKeys.TRAIN
        features = _host_part.element_function(plan.host, train)(sparse, labels)[0]
    rows = _batch_math.ceil_div(size, num_cores)  # each replica's rows of the padded batch

    def spec(array):
        tensor_spec = tf.TensorSpec.from_tensor(tf.convert_to_tensor(array))
        return tf.TensorSpec([rows, *tensor_spec.shape[1:]], tensor_spec.dtype)

    padded = {
        _padding.FEATURES_KEY: tf.nest.map_structure(spec, features),
        _padding.PADDING_KEY: tf.TensorSpec([rows], tf.float32),
    }
    element = padded if labels is None else (padded, tf.nest.map_structure(spec, labels))
    report.notes.append(
        f"the XLA compile of the training step is the strategy engine's (tpushim's TPU path "
        f"here, not TPUEstimator): one replica's step of {num_cores}, {rows} rows each "
        f"(the global batch of {size} split, padded to a multiple of {num_cores})"
    )
    try:
        # eagerly, as the engine runs (a graph-mode script too)
        with _strategy_runtime.runtime(plan):
            _strategy_xla_check.check_xla(plan, element, num_cores)
    except ConversionError as e:
        model_checks._report_xla_error(report, plan.keras_model, e.__cause__ or e)


def _check_host_only_ops(report, conversion, features, labels):
    """Host-only ops in the training graph the conversion's own model_fn builds."""
    from tpushim._estimator_api._config import ModeKeys

    report.note_checked("host-only ops in the model")
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        feats = tf.nest.map_structure(tf.constant, features)
        feats = model_checks.sparse_again(conversion.keras_model, feats)
        labs = tf.nest.map_structure(tf.constant, labels) if labels is not None else None
        conversion.model_fn(feats, labs, ModeKeys.TRAIN)
    keras_model = conversion.keras_model
    for op in graph.get_operations():
        what = model_checks.HOST_ONLY_OPS.get(op.type)
        if what:
            report.add(
                "host-only-op",
                "warning" if "summary" in what else "error",
                f"layer {model_checks._layer_of(op.name, keras_model)!r} (op {op.type})",
                f"{what} inside the model runs on the host: on a TPU it cannot be compiled "
                f"or forces a round trip every step",
                "remove it from the model (log with TensorBoard hooks outside the model, "
                "do Python work in the input pipeline)",
            )


def check(keras_model, input_fn, batch_size, num_cores, custom_objects):
    """:func:`tpushim.check` on TensorFlow >= 2.16: the input_fn called once in a scratch graph
    (nothing read from it), and the input, host-only op and XLA checks on the model's training
    step as the engine builds it; what needs TPUEstimator is named in one note."""
    from tpushim import _observe
    from tpushim._estimator_api import _estimator, _keras

    report = Report(notes=[NOT_RUN.format(version=tf.__version__)])
    model_fn = _keras._model_fn_for(keras_model, custom_objects, False, None, None)
    arguments = {"keras_model": keras_model, "custom_objects": custom_objects}
    recorded = _Recorded(
        _observe.Conversion(None, keras_model, arguments, None, model_fn, "tpushim.check")
    )
    if input_fn is not None:
        takes = _estimator._fn_args(input_fn)
        kwargs = {"mode": "train", "params": {}, "config": None}
        with tf.Graph().as_default(), failure_as_finding(report):
            with tf.compat.v1.device("/cpu:0"):
                result = input_fn(**{k: v for k, v in kwargs.items() if k in takes})
            recorded.calls.append((_observe.Call("train", None, input_fn), _read_input(result)))
    elif batch_size:
        input_checks.check_batch(report, batch_size, num_cores, "setting batch_size")
    with failure_as_finding(report):
        _report_one(report, recorded, num_cores, batch_size)
    return report


@contextlib.contextmanager
def recording():
    """While active, tpushim's own Estimators report to (and are capped by) a new
    :class:`StrategyRecorder`, which it yields."""
    from tpushim import _observe

    with _observe.observing(StrategyRecorder()) as recorder, contextlib.closing(recorder):
        yield recorder
