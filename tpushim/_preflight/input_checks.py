"""Checks of the input and of the settings that size a TPU's work: static shapes, dtypes, pipeline
speed, the global batch against the TPU's cores, and ``iterations_per_loop``; a SparseTensor
feature a model without declared inputs would read on the devices (each engine's refusal). The
input is read as tpushim's TPU path adapts it (iterator and numpy_input_fn tensors traced back to
their Dataset)."""

import numpy as np
import tensorflow as tf

from tpushim import _batch_math, _pods, _settings, _shapes
from tpushim._errors import TPUShimError

# tpushim's TPU path (_input_fn, _batching, _tfprivate) imports tensorflow_estimator, which
# TensorFlow >= 2.16 lacks: imported where a check needs it, so that the element-spec, pipeline-op
# and batch checks serve the preflight on tpushim's estimator API too (strategy_checks).

MIN_PER_CORE_BATCH = 8  # below this a TPU core's matrix units mostly multiply padding
GOOD_PER_CORE_BATCH = 128  # fills a 128x128 matrix unit
MIN_ITERATIONS_PER_LOOP = 20
LARGE_INPUT_CONSTANTS = 100 * 2**20  # bytes of constants in an input graph worth a finding


def _feature_paths(structure):
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


def _element_spec(result):
    if isinstance(result, tf.data.Dataset):
        return result.element_spec
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), result)


def check_input(report, input_fn, batch_size, num_cores, model_inputs=None):
    """Static shapes, dtypes, pipeline speed and batch size of the user's input, for
    :func:`tpushim.check`: the input_fn is called once, in a scratch graph, and one batch read.
    ``model_inputs``: the model's :class:`tpushim._shapes.ModelInputs` (shapes it declares).

    An input finding never ends the check: whatever can still be read is. Returns one batch
    (numpy, as features and labels) for the model checks, or None when none could be read.
    """
    from tpushim import _input_fn

    report.note_checked("input pipeline")
    name = getattr(input_fn, "__name__", "input_fn")
    with tf.Graph().as_default(), _input_fn.graph_session() as sess:
        try:
            result = _input_fn.call(
                input_fn, tf.estimator.ModeKeys.TRAIN, _input_fn.UserParams(), None
            )
        except TPUShimError as e:
            report.add("input-unusable", "error", f"input_fn {name!r}", str(e), "see the message")
            return None
        declared = _check_result(report, input_fn, result, model_inputs)
        batch = _read_one_batch(result, sess)
    features, labels = batch if isinstance(batch, tuple) and len(batch) == 2 else (batch, None)
    size = declared or int(tf.nest.flatten(features)[0].shape[0])
    check_batch(
        report,
        batch_size or size,
        num_cores,
        "setting batch_size" if batch_size else f"input_fn {name!r} (batch of {size})",
    )
    return features, labels


def check_recorded(report, input_fn, input_call, batch_size, num_cores, model_inputs=None):
    """The same checks on what one input_fn call of the script built (an
    :class:`tpushim._observe.InputCall`): nothing is called again and nothing is read. Returns a
    batch of zeros shaped as tpushim feeds the input (the model checks need shapes and dtypes
    only)."""
    report.note_checked("input pipeline")
    name = getattr(input_fn, "__name__", "input_fn")
    result = input_call.result
    _check_result(report, input_fn, result, model_inputs)
    size = input_call.facts.batch_size
    check_batch(
        report,
        batch_size or size,
        num_cores,
        "setting batch_size" if batch_size else f"input_fn {name!r} (batch of {size})",
    )
    batch = tf.nest.map_structure(
        lambda spec: _zeros(spec, input_call.global_batch),
        _shapes.declared_spec(_element_spec(result), model_inputs),
    )
    return batch if isinstance(batch, tuple) and len(batch) == 2 else (batch, None)


def _zeros(spec, batch):
    shape = [batch] + [d if d is not None else 1 for d in spec.shape.as_list()[1:]]
    if spec.dtype == tf.string:
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=spec.dtype.as_numpy_dtype)


def _check_result(report, input_fn, result, model_inputs=None):
    """Shapes, dtypes and pipeline ops of what the input_fn returned; the batch size its graph
    declares (None when it does not)."""
    from tpushim import _batching, _input_fn

    name = getattr(input_fn, "__name__", "input_fn")
    if not isinstance(result, tf.data.Dataset):
        report.add(
            "input-not-dataset",
            "error",
            f"input_fn {name!r}",
            str(_input_fn.tensors_error(input_fn, result)),
            "return a tf.data.Dataset",
        )
    spec = _element_spec(result)
    if isinstance(result, tf.data.Dataset):
        spec = completed_spec(report, spec, model_inputs)
    _check_element_spec(report, spec, host_keys(model_inputs))
    if not isinstance(result, tf.data.Dataset):
        return None
    _check_dataset_ops(report, result, name)
    return _batching.declared_batch_size(result)


def completed_spec(report, spec, model_inputs):
    """A Dataset's element spec with the shapes tpushim completes from the model's inputs, each
    completion an info finding (tpushim checks every element has that shape)."""
    for c in _shapes.completions(spec, model_inputs):
        report.add(
            "shape-from-model",
            "info",
            c.where,
            f"shape {c.found} is completed to the shape {tuple(c.declared.as_list())} the "
            f"model's input {c.input_name!r} declares; tpushim checks that every element "
            f"has it",
            "nothing to do; to fail earlier on an element of another shape, give it that "
            "shape in the input pipeline (e.g. decode_jpeg(..., channels=3))",
        )
    return _shapes.declared_spec(spec, model_inputs)


def host_keys(model_inputs):
    """The features only feature columns read (the input pipeline turns them into numbers)."""
    split = getattr(model_inputs, "feature_split", None)
    return split.raw_keys if split is not None else ()


def _check_element_spec(report, spec, host_keys=()):
    """``host_keys``: features only feature columns read, which the input pipeline turns into
    numbers (:mod:`tpushim._feature_columns`): strings among them never reach a TPU."""
    host_paths = {repr(key) for key in host_keys}
    features_spec, labels_spec = (
        spec if isinstance(spec, tuple) and len(spec) == 2 else (spec, None)
    )
    for role, structure in (("feature", features_spec), ("label", labels_spec)):
        if structure is None:
            continue
        for path, tensor_spec in _feature_paths(structure):
            where = f"{role} {path}" if path else f"{role}s (a single tensor)"
            shape = tensor_spec.shape
            if shape.rank is None or any(d is None for d in shape.as_list()[1:]):
                report.add(
                    "dynamic-shape",
                    "error",
                    where,
                    f"shape {shape} is not static beyond the batch dimension; a TPU "
                    f"compiles for fixed shapes",
                    "pad or crop to a fixed size in the "
                    "input pipeline (e.g. padded_batch with padded_shapes, or tf.image.resize)",
                )
            if tensor_spec.dtype == tf.float64:
                report.add(
                    "float64-input",
                    "info",
                    where,
                    "float64 tensors cannot be fed to a "
                    "TPU; tpushim casts them to float32 on its TPU path (and in cpu "
                    "mode), which the model computes in anyway",
                    "nothing to do; to save the host the cast, produce float32 in the "
                    "input pipeline: dataset.map(lambda x, y: (tf.cast(x, tf.float32), y))",
                )
            if tensor_spec.dtype == tf.string and not (role == "feature" and path in host_paths):
                report.add(
                    "string-input",
                    "error",
                    where,
                    "string tensors cannot be sent to a TPU",
                    "turn strings into numbers in the input pipeline (e.g. "
                    "tf.keras.layers.StringLookup or tf.strings.to_hash_bucket_fast in "
                    "dataset.map)",
                )


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


def _dataset_ops(dataset):
    """``(ops, ops in its functions, bytes of constants)``: the op types of the graph that makes
    ``dataset``, read from the graph it lives in (the datasets' map/filter functions included),
    and how many bytes its constants hold; nothing is run."""
    from tpushim import _tfprivate

    top, inner, seen, functions, constants = set(), set(), set(), [], 0
    stack = [_tfprivate.data.dataset_variant_op(dataset)]
    graph = stack[0].graph if stack[0] is not None else None
    while stack:
        op = stack.pop()
        if op is None or op.name in seen:
            continue
        seen.add(op.name)
        top.add(op.type)
        constants += _constant_bytes(op) if op.type == "Const" else 0
        stack.extend(t.op for t in op.inputs)
        functions += _pods.function_names(op.node_def)
    done = set()
    while functions:
        name = functions.pop()
        definition = None if name in done else _tfprivate.graph.function_def(graph, name)
        done.add(name)
        if definition is None:
            continue
        for node in definition.node_def:
            inner.add(node.op)
            constants += node.attr["value"].tensor.ByteSize() if node.op == "Const" else 0
            functions += _pods.function_names(node)
    return top, inner, constants


def _constant_bytes(op):
    # From the shape, without reading the value (op.node_def would copy it out of the graph).
    output = op.outputs[0]
    if output.dtype == tf.string or not output.shape.is_fully_defined():
        return op.get_attr("value").ByteSize()
    return output.shape.num_elements() * output.dtype.size


def _check_dataset_ops(report, dataset, name):
    report_pipeline_ops(report, name, *_dataset_ops(dataset))


def report_pipeline_ops(report, name, top, inner, constants):
    """The findings for an input pipeline's op types (``top``: its graph's, ``inner``: those in
    its functions) and the bytes of constants it holds."""
    if constants > LARGE_INPUT_CONSTANTS:
        report.add(
            "large-input-constants",
            "warning",
            f"input_fn {name!r}",
            f"the input pipeline's graph holds {constants / 2**20:.0f} MB of constants (arrays "
            "given to Dataset.from_tensor_slices or returned by the input_fn): the estimator "
            "writes them into graph.pbtxt and every checkpoint's meta graph and copies them "
            "with the graph, and no graph holds more than 2 GB",
            "feed the arrays instead: tf.compat.v1.estimator.inputs.numpy_input_fn(x, y, "
            "batch_size=..., shuffle=True) (tpushim feeds its arrays when the input starts, "
            "never embedding them), or write them to TFRecord files read by "
            "tf.data.TFRecordDataset",
        )
    if "PrefetchDataset" not in top:
        report.add(
            "no-prefetch",
            "info",
            f"input_fn {name!r}",
            "the input pipeline does not "
            "prefetch, so the accelerator would wait while the host prepares each batch; "
            "tpushim adds .prefetch(tf.data.AUTOTUNE) on its TPU path, so a TPU run is "
            "not slowed",
            "end the pipeline with .prefetch(tf.data.AUTOTUNE) to get the same on the stock path",
        )
    if "GeneratorDataset" in inner or "GeneratorDataset" in top:
        report.add(
            "python-generator",
            "warning",
            f"input_fn {name!r}",
            "Dataset.from_generator "
            "runs Python for every element, holding the GIL: it starves a TPU",
            "build the dataset from tensors or files (from_tensor_slices, TFRecordDataset)",
        )
    if {"PyFunc", "EagerPyFunc"} & inner:
        report.add(
            "per-example-python",
            "warning",
            f"input_fn {name!r}",
            "tf.py_function / tf.numpy_function in the pipeline runs Python per element",
            "express the transformation in TensorFlow ops inside dataset.map",
        )


def check_batch(report, global_batch, num_cores, where):
    """The global batch against the TPU's cores: indivisible (a warning: each batch is padded to
    the next multiple of the cores, the padding's share of the work wasted) or too small."""
    report.note_checked(f"batch size for {num_cores} cores")
    if global_batch % num_cores:
        problem, fix = _batch_math.indivisible_batch(global_batch, num_cores)
        report.add("batch-indivisible", "warning", where, problem, fix)
    per_core = _batch_math.per_shard(global_batch, num_cores)
    if per_core < MIN_PER_CORE_BATCH:
        report.add(
            "batch-small",
            "warning",
            where,
            f"global batch {global_batch} is {per_core} per core on {num_cores} cores, too small "
            f"to keep a TPU core's matrix units busy",
            f"use a global batch of at least {num_cores * MIN_PER_CORE_BATCH}, ideally "
            f"{num_cores * GOOD_PER_CORE_BATCH} ({GOOD_PER_CORE_BATCH} per core)",
        )


def check_loop(report, iterations_per_loop, steps):
    """``iterations_per_loop`` small for the planned ``steps``: the TPU idles between loops."""
    report.note_checked("iterations_per_loop")
    iterations = iterations_per_loop or _settings.DEFAULT_ITERATIONS_PER_LOOP
    if iterations < MIN_ITERATIONS_PER_LOOP and (steps is None or steps > iterations):
        report.add(
            "iterations-per-loop-small",
            "warning",
            f"setting iterations_per_loop={iterations}",
            f"the TPU returns to the host every {iterations} steps"
            + (f" ({steps} steps in all)" if steps else "")
            + ", idling while it does",
            f"raise iterations_per_loop to {min(steps or 100, 100)} or more "
            f"(tpushim.patch(iterations_per_loop=...) or TPUSHIM_ITERATIONS_PER_LOOP)",
        )


#: The words each engine refuses a SparseTensor feature with, by engine name (see below).
_SPARSE_REFUSERS = {
    "tpuestimator": "tpushim's TPUEstimator path",
    "strategy": "the strategy engine",
}


def check_sparse_features(report, keras_model, spec, engine):
    """A ``SparseTensor`` feature of a model that declares no inputs (a subclassed model, whose
    call reads its features on the devices): every engine refuses it at ``train()``, before
    anything is written (no TPU is fed a SparseTensor). Adds that refusal, in ``engine``'s own
    words (``"tpuestimator"``, ``"strategy"`` or ``"jax"``), as a ``sparse-feature-refused``
    error; True where it did (the model's step cannot be built on such a feature: the checks
    of it are left out, as the engine never gets there)."""
    if getattr(keras_model, "inputs", None) or spec is None:
        return False
    from tpushim._errors import ConversionError

    features = spec[0] if isinstance(spec, tuple) and len(spec) == 2 else spec
    if isinstance(features, dict) and set(features) == {"features", "sample_weights"}:
        features = features["features"]
    if not any(isinstance(s, tf.SparseTensorSpec) for s in tf.nest.flatten(features)):
        return False
    try:
        if engine == "jax":
            from tpushim._jax import _subclassed

            empty = tf.compat.v1.SparseTensorValue(None, None, None)
            sparse = lambda s: empty if isinstance(s, tf.SparseTensorSpec) else None
            if isinstance(features, dict):
                _subclassed._refuse_sparse({k: sparse(s) for k, s in features.items()})
            elif isinstance(features, (list, tuple)):
                _subclassed._refuse_sparse([sparse(s) for s in features])
            else:
                _subclassed._refuse_sparse(sparse(features))
        else:
            from tpushim import _sparse_inputs

            _sparse_inputs.refuse_fed(_Spec(features), _SPARSE_REFUSERS[engine])
    except ConversionError as e:
        report.add(
            "sparse-feature-refused",
            "error",
            f"model {getattr(keras_model, 'name', 'model')!r}",
            f"train() would be refused: {e}",
            "see the message",
        )
        return True
    return False


class _Spec:
    """What :func:`tpushim._sparse_inputs.refuse_fed` reads of a Dataset: its element spec."""

    def __init__(self, element_spec):
        self.element_spec = element_spec
