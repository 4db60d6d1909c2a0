"""TPU preflight: what would break or crawl on a TPU, found on CPU before TPU time is spent.

``tpushim.check(keras_model, input_fn)`` returns a :class:`Report`; ``python -m tpushim check
script.py`` runs a script in cpu mode for a few steps, records every conversion and input_fn it
makes, and reports on each. Every finding says where it came from (layer, input feature, setting)
and the fix. Severity ``error`` means it would fail on a TPU (exit code 1), ``warning`` that it would
run slowly.
"""

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
from typing import List, Optional

import tensorflow as tf

from tpushim import (_batching, _estimator, _faketpu, _input_fn, _model_fn, _settings, _source,
                     _tfprivate, _validation)
from tpushim._errors import TPUShimError

ModeKeys = tf.estimator.ModeKeys

DEFAULT_CORES = _settings.DEFAULT_CORES
MIN_PER_CORE_BATCH = 8  # below this a TPU core's matrix units mostly multiply padding
GOOD_PER_CORE_BATCH = 128  # fills a 128x128 matrix unit
MIN_ITERATIONS_PER_LOOP = 20
HOST_ONLY_OPS = {"PyFunc": "a Python function (tf.py_function / tf.numpy_function)",
                 "EagerPyFunc": "a Python function (tf.py_function / tf.numpy_function)",
                 "Print": "tf.print / tf.compat.v1.Print", "PrintV2": "tf.print",
                 "ScalarSummary": "a summary", "HistogramSummary": "a summary",
                 "ImageSummary": "a summary", "AudioSummary": "a summary",
                 "TensorSummary": "a summary", "TensorSummaryV2": "a summary",
                 "WriteSummary": "a summary", "WriteScalarSummary": "a summary",
                 "WriteHistogramSummary": "a summary", "WriteImageSummary": "a summary"}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One finding. ``severity``: ``error`` (fails on a TPU), ``warning`` (runs slowly on a TPU) or
    ``info`` (tpushim already takes care of it on the TPU path)."""

    code: str
    severity: str
    where: str
    message: str
    fix: str


@dataclasses.dataclass
class Report:
    """The result of a preflight check: findings, what was checked, and the verdict."""

    findings: List[Finding] = dataclasses.field(default_factory=list)
    checked: List[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self):
        """True when nothing would fail on a TPU (warnings allowed)."""
        return not any(f.severity == "error" for f in self.findings)

    @property
    def exit_code(self):
        return 0 if self.ok else 1

    def codes(self):
        return [f.code for f in self.findings]

    def add(self, code, severity, where, message, fix):
        finding = Finding(code, severity, where, message, fix)
        if finding not in self.findings:
            self.findings.append(finding)

    def extend(self, other):
        for finding in other.findings:
            if finding not in self.findings:
                self.findings.append(finding)
        self.checked.extend(c for c in other.checked if c not in self.checked)

    def to_dict(self):
        return {"ok": self.ok, "checked": self.checked,
                "findings": [dataclasses.asdict(f) for f in self.findings]}

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self):
        errors = sum(f.severity == "error" for f in self.findings)
        warnings = sum(f.severity == "warning" for f in self.findings)
        head = ("tpushim check: " + ("OK - nothing blocks a TPU" if self.ok else "FAIL - would not run on a TPU")
                + f" ({errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)})")
        lines = [head, "checked: " + ", ".join(self.checked)]
        order = {"error": 0, "warning": 1, "info": 2}
        for f in sorted(self.findings, key=lambda f: order[f.severity]):
            lines.append(f"  [{f.severity.upper()}] {f.code} at {f.where}: {f.message}")
            lines.append(f"      fix: {f.fix}")
        return "\n".join(lines)

    def _repr_html_(self):
        import html  # pylint: disable=import-outside-toplevel
        rows = "".join(
            f"<tr><td>{f.severity}</td><td>{html.escape(f.code)}</td><td>{html.escape(f.where)}</td>"
            f"<td>{html.escape(f.message)}</td><td>{html.escape(f.fix)}</td></tr>" for f in self.findings)
        verdict = "OK - nothing blocks a TPU" if self.ok else "FAIL - would not run on a TPU"
        return (f"<p><b>tpushim check: {verdict}</b> (checked: {html.escape(', '.join(self.checked))})</p>"
                f"<table><tr><th>severity</th><th>finding</th><th>where</th><th>what</th><th>fix</th></tr>"
                f"{rows}</table>")


# --- model ---------------------------------------------------------------------------------------

def _check_conversion(report, keras_model, custom_objects):
    """What the conversion itself would refuse: subclassed model, optimizer, metrics."""
    report.checked.append("conversion")
    for kind, check in _validation.VALIDATION_STEPS:
        try:
            check(keras_model, custom_objects)
        except (TPUShimError, ValueError) as e:
            report.add(f"unconvertible-{kind}", "error", f"model {keras_model.name!r}", str(e),
                       "see the message")
            return False
    return True


# What XLA says when a shape is computed from a tensor's value (tf.ones([n]), tf.range(n), ...).
_XLA_NOT_CONSTANT = re.compile(r"Input \d+ to node `([^`]+)` with op (\w+) must be a compile-time constant")
_XLA_UNSUPPORTED = re.compile(r"(\w+) \(No registered '\w+' OpKernel for XLA_\w+ devices compatible "
                              r"with node \{\{node ([^}]+)\}\}")


def _layer_of(node_name, keras_model):
    names = {layer.name for layer in keras_model.layers}
    parts = node_name.split("/")
    for part in parts:
        if part in names:
            return part
    return parts[1] if len(parts) > 2 else node_name


def _check_xla(report, keras_model, custom_objects, features, labels):
    """Rung 3: the training step (forward, loss, gradients) compiled with XLA on CPU.

    Runs on a clone, so the user's model (weights, BatchNormalization statistics) is untouched.
    """
    report.checked.append("XLA compile of the training step")
    if not tf.executing_eagerly():  # the script called disable_v2_behavior()
        try:
            _xla_compile_in_graph(keras_model, custom_objects, features, labels)
        except Exception as e:  # pylint: disable=broad-except
            _report_xla_error(report, keras_model, e)
        return
    with tf.keras.utils.custom_object_scope(custom_objects or {}):
        clone = tf.keras.models.clone_model(keras_model)
    try:
        clone.set_weights(keras_model.get_weights())
    except ValueError:
        pass  # an unbuilt subclassed model (e.g. a WideDeepModel) has none yet; the compile needs none
    loss_weights = _tfprivate.user_loss_weights(keras_model)
    clone.compile(loss=keras_model.loss, loss_weights=loss_weights)
    inputs, targets, _ = _tfprivate.convert_estimator_io_to_keras(clone, features, labels)
    inputs = inputs[0] if isinstance(inputs, list) and len(inputs) == 1 else inputs
    targets = targets[0] if isinstance(targets, list) and len(targets) == 1 else targets

    structure = (inputs, targets)

    @tf.function(jit_compile=True)
    def train_step(*flat):  # flat: experimental_get_compiler_ir takes no nested TensorSpecs
        x, y = tf.nest.pack_sequence_as(structure, flat)
        with tf.GradientTape() as tape:
            predictions = clone(x, training=True)
            loss = clone.compiled_loss(y, predictions, regularization_losses=clone.losses)
        return loss, tape.gradient(loss, clone.trainable_variables)

    # From shapes and dtypes only: a TPU compiles the step before any batch exists (values come by
    # infeed), whereas XLA on CPU given values folds a shape computed from them into a constant.
    specs = [tf.TensorSpec.from_tensor(tf.convert_to_tensor(a)) for a in tf.nest.flatten(structure)]
    try:
        train_step.experimental_get_compiler_ir(*specs)(stage="hlo")
    except Exception as e:  # pylint: disable=broad-except
        _report_xla_error(report, keras_model, e)


def _report_xla_error(report, keras_model, e):
    """The finding(s) for an XLA compilation error: unsupported ops and value-dependent shapes
    named by layer, anything else as xla-compile."""
    text = str(e)
    unsupported = _XLA_UNSUPPORTED.findall(text)
    not_constant = _XLA_NOT_CONSTANT.search(text)
    if not_constant:
        node, op = not_constant.groups()
        layer = _layer_of(node, keras_model)
        where = (f"layer {layer!r} (op {op})" if layer != node else  # in a subclassed call()
                 f"model {keras_model.name!r} (op {op}, node {node})")
        report.add("value-dependent-shape", "error", where,
                   f"a shape in the training step depends on a tensor's value (e.g. tf.ones([n]) or "
                   f"tf.range(n) with n computed from the batch, or a loop growing a tensor): a "
                   f"TPU compiles the step before any value exists",
                   "derive shapes from static shapes (x.shape) or constants, or compute such "
                   "values in the input pipeline and pad them to a fixed size")
    elif not unsupported:
        report.add("xla-compile", "error", f"model {keras_model.name!r}",
                   f"the training step does not compile with XLA: {summary(e)}",
                   "make the model's ops XLA-compatible (tf.function(jit_compile=True) on CPU "
                   "reproduces this)")
    for op, node in dict((op, node) for op, node in unsupported).items():
        report.add("xla-unsupported-op", "error", f"layer {_layer_of(node, keras_model)!r} (op {op})",
                   f"op {op} has no XLA kernel: the training step does not compile for a TPU",
                   f"replace {op} in that layer with XLA-supported ops, or move it into the "
                   f"input pipeline (tf.data), which runs on the host")


def _xla_compile_in_graph(keras_model, custom_objects, features, labels):
    """The training step compiled by XLA in a graph, for scripts that ``disable_v2_behavior()``
    (no eager context to ask for the compiler's IR): built in a scratch graph as a
    ``jit_compile`` function on the batch's values and run once, which compiles it."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        with tf.keras.utils.custom_object_scope(custom_objects or {}):
            clone = tf.keras.models.clone_model(keras_model)
        clone.compile(loss=keras_model.loss)  # Keras's v1 training: loss_functions, per output
        structure = _tfprivate.convert_estimator_io_to_keras(clone, features, labels)[:2]
        flat = [tf.convert_to_tensor(a) for a in tf.nest.flatten(structure)]

        @tf.function(jit_compile=True)
        def train_step(*flat):
            x, y = tf.nest.pack_sequence_as(structure, flat)
            with tf.GradientTape() as tape:
                predictions = clone(x, training=True)
                if isinstance(predictions, dict):
                    predictions = [predictions[n] for n in clone.output_names]
                pairs = zip(tf.nest.flatten(y), tf.nest.flatten(predictions), clone.loss_functions)
                loss = tf.add_n([fn(t, p) for t, p, fn in pairs] + list(clone.losses))
            return loss, tape.gradient(loss, clone.trainable_variables)

        outputs = train_step(*flat)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(outputs)


def _check_model_graph(report, keras_model, custom_objects, features, labels):
    """Host-only ops (summaries, prints, Python functions) inside the TPU train computation."""
    report.checked.append("host-only ops in the model")
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        feats = tf.nest.map_structure(tf.constant, features)
        labs = tf.nest.map_structure(tf.constant, labels) if labels is not None else None
        _model_fn.make_model_fn(keras_model, custom_objects)(
            feats, labs, ModeKeys.TRAIN, params={"use_tpu": False, "batch_size": None})
    for op in graph.get_operations():
        what = HOST_ONLY_OPS.get(op.type)
        if what:
            report.add("host-only-op", "warning" if "summary" in what else "error",
                       f"layer {_layer_of(op.name, keras_model)!r} (op {op.type})",
                       f"{what} inside the model runs on the host: on a TPU it cannot be compiled "
                       f"or forces a round trip every step",
                       "remove it from the model (log with TensorBoard hooks outside the model, "
                       "do Python work in the input pipeline)")


# --- input ---------------------------------------------------------------------------------------

def _feature_paths(structure, root):
    paths = []

    def walk(prefix, value):
        if isinstance(value, dict):
            for key in sorted(value):
                walk(f"{prefix}[{key!r}]" if prefix else repr(key), value[key])
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(f"{prefix}[{i}]", item)
        else:
            paths.append((prefix, value))

    walk("", structure)
    return paths


def _dataset_ops(dataset, session):
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(session.run(_tfprivate.serialized_dataset_graph(dataset)))
    top = {node.op for node in graph_def.node}
    inner = {node.op for function in graph_def.library.function for node in function.node_def}
    return top, inner


def _element_spec(result):
    if isinstance(result, tf.data.Dataset):
        return result.element_spec
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), result)


def _check_input(report, input_fn, batch_size, num_cores):
    """Static shapes, dtypes, pipeline speed and batch size of the user's input, as the TPU path
    adapts it (iterator and numpy_input_fn tensors traced back to their Dataset).

    An input finding never ends the check: whatever can still be read is. Returns one batch
    (numpy, as features and labels) for the model checks, or None when none could be read.
    """
    report.checked.append("input pipeline")
    name = getattr(input_fn, "__name__", "input_fn")
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        try:
            result = _input_fn.check_result(
                input_fn, _source.call_and_recover(input_fn, ModeKeys.TRAIN, {}, None))
        except TPUShimError as e:
            report.add("input-unusable", "error", f"input_fn {name!r}", str(e), "see the message")
            return None
        if not isinstance(result, tf.data.Dataset):
            report.add("input-not-dataset", "error", f"input_fn {name!r}",
                       str(_input_fn.tensors_error(input_fn, result)), "return a tf.data.Dataset")
        spec = _element_spec(result)
        features_spec, labels_spec = spec if isinstance(spec, tuple) and len(spec) == 2 else (spec, None)
        for role, structure in (("feature", features_spec), ("label", labels_spec)):
            if structure is None:
                continue
            for path, tensor_spec in _feature_paths(structure, role):
                where = f"{role} {path}" if path else f"{role}s (a single tensor)"
                shape = tensor_spec.shape
                if shape.rank is None or any(d is None for d in shape.as_list()[1:]):
                    report.add("dynamic-shape", "error", where,
                               f"shape {shape} is not static beyond the batch dimension; a TPU "
                               f"compiles for fixed shapes", "pad or crop to a fixed size in the "
                               "input pipeline (e.g. padded_batch with padded_shapes, or tf.image.resize)")
                if tensor_spec.dtype == tf.float64:
                    report.add("float64-input", "info", where, "float64 tensors cannot be fed to a "
                               "TPU; tpushim casts them to float32 on its TPU path (and in cpu "
                               "mode), which the model computes in anyway",
                               "nothing to do; to save the host the cast, produce float32 in the "
                               "input pipeline: dataset.map(lambda x, y: (tf.cast(x, tf.float32), y))")
                if tensor_spec.dtype == tf.string:
                    report.add("string-input", "error", where, "string tensors cannot be sent to a TPU",
                               "turn strings into numbers in the input pipeline (e.g. "
                               "tf.keras.layers.StringLookup or tf.strings.to_hash_bucket_fast in "
                               "dataset.map)")
        declared = None
        if isinstance(result, tf.data.Dataset):
            _check_dataset_ops(report, result, sess, name)
            declared = _batching.declared_batch_size(result)
        batch = _read_one_batch(result, sess)
    features, labels = batch if isinstance(batch, tuple) and len(batch) == 2 else (batch, None)
    size = declared or int(tf.nest.flatten(features)[0].shape[0])
    _check_batch(report, batch_size or size, num_cores,
                 "setting batch_size" if batch_size else f"input_fn {name!r} (batch of {size})")
    return features, labels


def _read_one_batch(result, sess):
    if isinstance(result, tf.data.Dataset):
        # Initializable: a one-shot iterator refuses a Dataset that captures a lookup table.
        iterator = tf.compat.v1.data.make_initializable_iterator(result.take(1))
        sess.run(tf.compat.v1.tables_initializer())
        sess.run(iterator.initializer)
        return sess.run(iterator.get_next())
    # Tensors tpushim could not trace: a MonitoredSession starts their queue runners and tables.
    with tf.compat.v1.train.MonitoredSession() as monitored:
        return monitored.run(result)


def _check_dataset_ops(report, dataset, sess, name):
    top, inner = _dataset_ops(dataset, sess)
    if "PrefetchDataset" not in top:
        report.add("no-prefetch", "info", f"input_fn {name!r}", "the input pipeline does not "
                   "prefetch, so the accelerator would wait while the host prepares each batch; "
                   "tpushim adds .prefetch(tf.data.AUTOTUNE) on its TPU path, so a TPU run is "
                   "not slowed", "end the pipeline with .prefetch(tf.data.AUTOTUNE) to get the "
                   "same on the stock path")
    if "GeneratorDataset" in inner or "GeneratorDataset" in top:
        report.add("python-generator", "warning", f"input_fn {name!r}", "Dataset.from_generator "
                   "runs Python for every element, holding the GIL: it starves a TPU",
                   "build the dataset from tensors or files (from_tensor_slices, TFRecordDataset)")
    if {"PyFunc", "EagerPyFunc"} & inner:
        report.add("per-example-python", "warning", f"input_fn {name!r}", "tf.py_function / "
                   "tf.numpy_function in the pipeline runs Python per element",
                   "express the transformation in TensorFlow ops inside dataset.map")


def _check_batch(report, global_batch, num_cores, where):
    report.checked.append(f"batch size for {num_cores} cores")
    if global_batch % num_cores:
        choices = _estimator.batch_choices(global_batch, num_cores)
        report.add("batch-indivisible", "error", where,
                   f"global batch size {global_batch} does not divide among {num_cores} TPU cores",
                   f"use a multiple of {num_cores} ({choices}): batch the input by it, or set "
                   f"tpushim.patch(batch_size=...) / TPUSHIM_BATCH_SIZE")
        return
    per_core = global_batch // num_cores
    if per_core < MIN_PER_CORE_BATCH:
        report.add("batch-small", "warning", where,
                   f"global batch {global_batch} is {per_core} per core on {num_cores} cores, too small "
                   f"to keep a TPU core's matrix units busy",
                   f"use a global batch of at least {num_cores * MIN_PER_CORE_BATCH}, ideally "
                   f"{num_cores * GOOD_PER_CORE_BATCH} ({GOOD_PER_CORE_BATCH} per core)")


def _check_loop(report, iterations_per_loop, steps):
    report.checked.append("iterations_per_loop")
    iterations = iterations_per_loop or _settings.DEFAULT_ITERATIONS_PER_LOOP
    if iterations < MIN_ITERATIONS_PER_LOOP and (steps is None or steps > iterations):
        report.add("iterations-per-loop-small", "warning", f"setting iterations_per_loop={iterations}",
                   f"the TPU returns to the host every {iterations} steps"
                   + (f" ({steps} steps in all)" if steps else "") + ", idling while it does",
                   f"raise iterations_per_loop to {min(steps or 100, 100)} or more "
                   f"(tpushim.patch(iterations_per_loop=...) or TPUSHIM_ITERATIONS_PER_LOOP)")


def check(keras_model, input_fn=None, *, batch_size=None, num_cores=DEFAULT_CORES, steps=None,
          iterations_per_loop=None, custom_objects=None) -> Report:
    """Reports, on CPU, what would break or crawl when this model and input run on a TPU.

    Args:
      keras_model: the compiled Keras model you pass to ``model_to_estimator``.
      input_fn: your training input_fn (optional: without it only the model is checked).
      batch_size: the global batch size, when you set one (else it is read from the input).
      num_cores: TPU cores to check the batch against (8 for a v2-8/v3-8/v4-8).
      steps: training steps planned, to judge ``iterations_per_loop``.
      iterations_per_loop: the value you will use (tpushim's default when None).
      custom_objects: as for ``model_to_estimator``.

    Returns:
      A :class:`Report`; ``report.ok`` is False when something would fail on a TPU.
    """
    report = Report()
    convertible = _check_conversion(report, keras_model, custom_objects)
    batch = _check_input(report, input_fn, batch_size, num_cores) if input_fn is not None else None
    if batch is None and batch_size:
        _check_batch(report, batch_size, num_cores, "setting batch_size")
    _check_loop(report, iterations_per_loop, steps)
    if convertible and batch is not None and "dynamic-shape" not in report.codes():
        features, labels = batch
        _check_model_graph(report, keras_model, custom_objects, features, labels)
        _check_xla(report, keras_model, custom_objects, features, labels)
    return report


# --- the TPU graphs, built for a faked TPU system ------------------------------------------------

CORES_PER_HOST = 8  # a Cloud TPU v2/v3 host: 4 chips x 2 cores

#: Fixes for what TPUEstimator raises while building, by a fragment of its message.
_GRAPH_FIXES = (
    ("TPUEstimator.predict is only supported",
     "predict on one TPU host (up to 8 cores, e.g. a v3-8), or run predict() without the TPU "
     "(TPUSHIM_MODE=cpu for that run)"),
    ("num_shards",
     "remove num_shards from your TPUConfig (TPUEstimator reads the TPU's core count) or set it "
     "to the TPU's cores"),
)


def faked_system_shape(num_cores):
    """(hosts, cores per host) of a TPU with ``num_cores`` cores: 8 per host beyond one host."""
    if num_cores > CORES_PER_HOST and num_cores % CORES_PER_HOST == 0:
        return num_cores // CORES_PER_HOST, CORES_PER_HOST
    return 1, num_cores


def _check_tpu_graphs(report, recorded, num_cores):
    """Rung 2: TPUEstimator's whole TPU graph for the script's first train, evaluate and predict
    call, built for a faked TPU system of ``num_cores`` cores without running anything. What
    TPUEstimator raises while building is what a TPU run would raise before its first step.

    Builds in a scratch model_dir made here and removed afterwards; the user's is not touched.
    """
    hosts, per_host = faked_system_shape(num_cores)
    checked = f"TPU graphs for {num_cores} cores ({hosts} host{'s' * (hosts != 1)})"
    if checked not in report.checked:  # once for all conversions
        report.checked.append(checked)
    calls = {}
    for event, fn, steps in recorded.inputs:
        calls.setdefault(event, (fn, steps))
    name = getattr(recorded.keras_model, "name", "model")
    parent = tempfile.mkdtemp(prefix="tpushim-check-")
    # A folder of our own inside it: a mocked mkdtemp may return a folder we did not create.
    scratch = os.path.join(parent, "tpushim_check_tpu_graphs")
    os.mkdir(scratch)
    try:
        with _faketpu.faked_tpu_system(hosts=hosts, cores_per_host=per_host) as tpu:
            cluster = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu.master)
            for event in ("train", "evaluate", "predict"):
                if event not in calls:
                    continue
                fn, steps = calls[event]
                estimator = _estimator.tpu_twin(recorded.estimator, cluster, os.path.join(scratch, event))
                run = {"train": lambda: estimator.train(fn, steps=1),
                       "evaluate": lambda: estimator.evaluate(fn, steps=steps),
                       "predict": lambda: estimator.predict(fn)}[event]
                try:
                    tpu.build(run)
                except TPUShimError as e:
                    if "batch-indivisible" not in report.codes():  # else already reported
                        report.add("tpu-graph", "error", f"{event}() of model {name!r}", str(e),
                                   "see the message")
                except Exception as e:  # pylint: disable=broad-except
                    if "must be divisible by number of replicas" in str(e) and \
                            "batch-indivisible" in report.codes():
                        continue  # already reported, with the sizes that would work
                    # TPUEstimator names its master: here the faked one, meaningless to the user.
                    first = str(e).strip().splitlines()[0].replace(tpu.master, "the TPU")
                    text = f"{type(e).__name__}: {first[:600]}"
                    fix = next((f for fragment, f in _GRAPH_FIXES if fragment in str(e)),
                               "change the model or input so that TPUEstimator can build it; "
                               "the message is TPUEstimator's own")
                    report.add("tpu-graph", "error", f"{event}() of model {name!r}",
                               f"TPUEstimator cannot build the TPU {event} graph for {num_cores} "
                               f"cores: {text}", fix)
    finally:
        tf.compat.v1.summary.FileWriterCache.clear()  # its event files are in the scratch folder
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            os.rmdir(parent)  # only if empty: never anything the check did not write
        except OSError:
            pass


# --- python -m tpushim check script.py -------------------------------------------------------------

@dataclasses.dataclass
class _Recorded:
    estimator: object
    keras_model: object
    custom_objects: Optional[dict]
    settings: object
    inputs: list = dataclasses.field(default_factory=list)  # (mode, input_fn, steps)


class Recorder:
    """Records conversions and input_fns while a script runs in cpu mode; caps its steps."""

    MAX_TRAIN_STEPS = 3
    MAX_EVAL_STEPS = 2

    def __init__(self):
        self.conversions: List[_Recorded] = []

    def __call__(self, event, **info):
        if event == "convert":
            self.conversions.append(_Recorded(info["estimator"], info["keras_model"],
                                              info["custom_objects"], info["settings"]))
            return None
        owner = next((c for c in self.conversions if c.estimator is info.get("estimator")), None)
        if owner is not None:
            owner.inputs.append((event, info["input_fn"], info.get("steps")))
            if event == "train":
                return min(info.get("steps") or self.MAX_TRAIN_STEPS, self.MAX_TRAIN_STEPS)
            if event == "evaluate":
                return min(info.get("steps") or self.MAX_EVAL_STEPS, self.MAX_EVAL_STEPS)
        return None

    def report(self, num_cores=DEFAULT_CORES, tpu_graphs=True):
        """The findings for every recorded conversion; ``tpu_graphs`` also builds TPUEstimator's
        TPU graphs for its calls on a faked system of ``num_cores`` cores."""
        report = Report()
        if not self.conversions:
            report.add("no-conversion", "error", "script", "the script made no model_to_estimator "
                       "call, so there was nothing to check", "run the script that builds the estimator")
        for recorded in self.conversions:
            trains = [(fn, steps) for event, fn, steps in recorded.inputs if event == "train"]
            train_fn, steps = trains[0] if trains else (None, None)
            with _preflight_failure(report):
                report.extend(check(recorded.keras_model, train_fn, batch_size=recorded.settings.batch_size,
                                    num_cores=num_cores, steps=steps,
                                    iterations_per_loop=recorded.settings.iterations_per_loop,
                                    custom_objects=recorded.custom_objects))
            for event, fn, _ in recorded.inputs:
                if event != "train" and fn is not train_fn:
                    with _preflight_failure(report):
                        sub = Report()
                        _check_input(sub, fn, recorded.settings.batch_size, num_cores)
                        report.extend(sub)
            if tpu_graphs and getattr(recorded.estimator, "_tpushim_model_fn", None) is not None:
                with _preflight_failure(report):
                    _check_tpu_graphs(report, recorded, num_cores)
        return report


def summary(exc):
    """One informative line of an exception's text (TensorFlow's start with 'Graph execution error:'
    and end with the op that failed; the line before that says what went wrong)."""
    noise = ("File ", "[[", "Detected at node", "Graph execution error", "defined at", "Traceback",
             "Node: ")
    lines = [l.strip() for l in str(exc).split("Original stack trace for")[0].splitlines()]
    lines = [l for l in lines if l and not l.startswith(noise)]
    return f"{type(exc).__name__}: {lines[-1][:300] if lines else ''}"


def last_frame(exc):
    """'file:line in function' of the innermost frame an exception went through."""
    import traceback  # pylint: disable=import-outside-toplevel
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown location"
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


@contextlib.contextmanager
def _preflight_failure(report):
    """A check that itself fails becomes an error finding naming where; the other checks go on."""
    try:
        yield
    except Exception as e:  # pylint: disable=broad-except
        report.add("preflight-failed", "error", last_frame(e),
                   f"the preflight could not finish a check: {summary(e)}",
                   "the findings above still hold; please report this with the script to tpushim")


@contextlib.contextmanager
def recording():
    """While active, tpushim's estimators report to (and are capped by) a :class:`Recorder`."""
    recorder = Recorder()
    _estimator.OBSERVERS.append(recorder)
    try:
        yield recorder
    finally:
        _estimator.OBSERVERS.remove(recorder)
