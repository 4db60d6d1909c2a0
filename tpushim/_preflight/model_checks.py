"""Checks of the model: would the conversion refuse it, does its training step compile with XLA
(rung 3 of the proof ladder), and does its TPU computation hold host-only ops. Each adds findings
to a :class:`~tpushim._preflight.report.Report`, naming the layer where it can."""

import contextlib
import re

import tensorflow as tf

from tpushim import _shapes, _versions
from tpushim._errors import TPUShimError
from tpushim._preflight.report import summary

# tpushim's TPU path (_model_fn, _validation, _tfprivate, _feature_columns, ...) imports
# tensorflow_estimator, which TensorFlow >= 2.16 lacks: those are imported where a check needs
# them, so that the XLA check and HOST_ONLY_OPS serve the preflight on tpushim's estimator API
# too (strategy_checks).

HOST_ONLY_OPS = {
    "PyFunc": "a Python function (tf.py_function / tf.numpy_function)",
    "EagerPyFunc": "a Python function (tf.py_function / tf.numpy_function)",
    "Print": "tf.print / tf.compat.v1.Print",
    "PrintV2": "tf.print",
    "ScalarSummary": "a summary",
    "HistogramSummary": "a summary",
    "ImageSummary": "a summary",
    "AudioSummary": "a summary",
    "TensorSummary": "a summary",
    "TensorSummaryV2": "a summary",
    "WriteSummary": "a summary",
    "WriteScalarSummary": "a summary",
    "WriteHistogramSummary": "a summary",
    "WriteImageSummary": "a summary",
}

# What XLA says when a shape is computed from a tensor's value (tf.ones([n]), tf.range(n), ...).
_XLA_NOT_CONSTANT = re.compile(
    r"Input \d+ to node `([^`]+)` with op (\w+) must be a compile-time constant"
)
# The node an XLA error is about.
_XLA_NODE = re.compile(r"\{\{node ([^}]+)\}\}")
_XLA_UNSUPPORTED = re.compile(
    r"(\w+) \(No registered '\w+' OpKernel for XLA_\w+ devices compatible "
    r"with node \{\{node ([^}]+)\}\}"
)


def check_conversion(report, keras_model, custom_objects):
    """What the conversion itself would refuse (subclassed model, optimizer, metrics, a loss TPU
    cores cannot split), as the conversion checks it; returns whether it would convert."""
    from tpushim import _loss_kinds, _validation

    report.note_checked("conversion")
    for kind, check in _validation.VALIDATION_STEPS:
        try:
            check(keras_model, custom_objects)
        except _loss_kinds.LossSplitError as e:
            report.add(f"unconvertible-{kind}", "error", e.where, e.problem, e.fix)
            return False
        except (TPUShimError, ValueError) as e:
            report.add(
                f"unconvertible-{kind}",
                "error",
                f"model {keras_model.name!r}",
                str(e),
                "see the message",
            )
            return False
    return True


def check_feature_columns(report, keras_model):
    """What the conversion moves of the model's ``DenseFeatures`` layers to the input pipeline
    (:mod:`tpushim._feature_columns`), one INFO per layer: their ops with no XLA kernel never
    reach the TPU."""
    split = _plan(keras_model)
    for layer in split.layers if split is not None else ():
        report.add(
            "feature-columns-on-host",
            "info",
            f"layer {layer.name!r}",
            f"{layer.describe()}: their ops with no XLA kernel (LookupTableFindV2, SparseCross, "
            f"...) run on the TPU host, the rest of the model on the TPU; the raw features only "
            f"that layer reads (strings too) are not sent to the TPU",
            "nothing to do; an exported model still takes the raw features",
        )


def _split_for_xla(keras_model, features):
    """(features, blocks, context) for compiling the step as tpushim's model_fn gives it: the
    feature columns' weight-free part computed here (the input pipeline's on a TPU)."""
    split = _plan(keras_model)
    if split is None or not isinstance(features, dict):
        return features, {}, lambda blocks: contextlib.nullcontext()
    features, blocks = split.model_features(tf.nest.map_structure(tf.convert_to_tensor, features))
    from tpushim import _feature_columns

    return features, blocks, lambda blocks: _feature_columns.device_layers(split, blocks)


def _clone(keras_model, custom_objects):
    """A clone of the model to compile; the raw inputs only moved feature columns read take the
    float placeholder tpushim's model_fn gives them (a string input would be cast to)."""
    split = _plan(keras_model)
    input_tensors = None
    if split is not None:  # only on the TPUEstimator path (TensorFlow <= 2.15)
        from tpushim import _feature_columns, _tfprivate
    if split is not None and split.stand_ins and _tfprivate.keras.is_graph_network(keras_model):
        input_tensors = [
            tf.keras.Input((1,), name=name)
            if name in split.stand_ins
            else tf.keras.Input(tensor.shape[1:], dtype=tensor.dtype, name=name)
            for name, tensor in zip(keras_model.input_names, keras_model.inputs)
        ]
    with (
        tf.keras.utils.custom_object_scope(custom_objects or {}),
        _feature_columns.shapes_only(split) if input_tensors else contextlib.nullcontext(),
    ):
        return tf.keras.models.clone_model(keras_model, input_tensors=input_tensors)


def _layer_of(node_name, keras_model):
    names = {layer.name for layer in keras_model.layers}
    parts = node_name.split("/")
    for part in parts:
        if part in names:
            return part
    return parts[1] if len(parts) > 2 else node_name


def check_xla(report, keras_model, custom_objects, features, labels):
    """Rung 3: the training step (forward, loss, gradients) compiled with XLA on CPU.

    Runs on a clone, so the user's model (weights, BatchNormalization statistics) is untouched.
    """
    report.note_checked("XLA compile of the training step")
    if not tf.executing_eagerly():  # the script called disable_v2_behavior()
        traced = []
        try:
            _xla_compile_in_graph(keras_model, custom_objects, features, labels, traced)
        except Exception as e:
            _report_xla_error(report, keras_model, e, traced[0] if traced else None)
        return
    from tpushim import _tfprivate

    # An inspection the script does not make: the seeds a clone draws are put back, so the model
    # a program builds next (tpushim.check called mid-script) starts from the same weights.
    with _tfprivate.keras.keras_random_state_kept():
        clone, compiled_loss = _model_to_trace(keras_model, custom_objects)
    features, labels, fed = _sparse_fed(keras_model, features, labels, clone)
    features, blocks, moved = _split_for_xla(keras_model, features)
    inputs, targets, _ = _estimator_io(clone, features, labels)
    if fed:  # the sparse inputs' readers' outputs, fed as the host computes them
        inputs = {**dict(zip(clone.input_names, tf.nest.flatten(inputs))), **fed}
    inputs = inputs[0] if isinstance(inputs, list) and len(inputs) == 1 else inputs
    targets = targets[0] if isinstance(targets, list) and len(targets) == 1 else targets
    structure = (inputs, targets, blocks)

    @tf.function(jit_compile=True)
    def train_step(*flat):  # flat: experimental_get_compiler_ir takes no nested TensorSpecs
        x, y, b = tf.nest.pack_sequence_as(structure, flat)
        with tf.GradientTape() as tape, moved(b):
            predictions = clone(x, training=True)
            loss = compiled_loss(y, predictions, regularization_losses=clone.losses)
        return loss, tape.gradient(loss, clone.trainable_variables)

    # From shapes and dtypes only: a TPU compiles the step before any batch exists (values come by
    # infeed), whereas XLA on CPU given values folds a shape computed from them into a constant.
    specs = [tf.TensorSpec.from_tensor(tf.convert_to_tensor(a)) for a in tf.nest.flatten(structure)]
    try:
        with _tfprivate.keras_compile.call_losses_kept(clone):
            _tfprivate.graph.compiler_ir(train_step, *specs)  # takes no op seed of the program's
    except Exception as e:
        _report_xla_error(report, keras_model, e, _graph_def(train_step, specs))


def sparse_again(keras_model, features):
    """The recorded batch's values of the model's ``SparseTensor`` inputs (recorded dense, or
    made of zeros) as SparseTensors again, their zeros left out: the checks build from shapes.
    ``features`` itself where the model has none (or eagerly, in a v1 graph script)."""
    from tpushim import _tfprivate

    names = {
        _tfprivate.keras.input_tensor_name(t)
        for t in getattr(keras_model, "inputs", None) or ()
        if isinstance(getattr(t, "type_spec", None), tf.SparseTensorSpec)
    }
    if not names or not isinstance(features, dict):
        return features
    return {
        k: tf.sparse.from_dense(v) if k in names and not isinstance(v, tf.SparseTensor) else v
        for k, v in features.items()
    }


def _sparse_fed(keras_model, features, labels, clone=None):
    """``(features, labels, fed)`` as the TPUEstimator path's input pipeline gives them to the
    step where the model has ``SparseTensor`` inputs (:func:`tpushim._host_part.sparse_only`:
    made dense, or read, on the host), ``fed`` the tensors the host computed; ``clone`` then
    runs from them. Unchanged, ``fed`` empty, elsewhere."""
    part = _shapes._sparse_part(keras_model)
    if part is None:
        return features, labels, {}
    from tpushim import _host_part, _tfprivate

    def tensor(a):
        return tf.compat.v1.convert_to_tensor_or_sparse_tensor(a)

    features = sparse_again(keras_model, tf.nest.map_structure(tensor, features))
    element = _host_part.element_function(part, _tfprivate.estimator.ModeKeys.TRAIN)(
        features,
        tf.nest.map_structure(tensor, labels) if labels is not None else None,
    )
    features, labels = element
    fed = {k: v for k, v in features.items() if k.startswith(_host_part.HOST_PREFIX)}
    if clone is not None and fed:
        _host_part.install(part, clone)
    return {k: v for k, v in features.items() if k not in fed}, labels, fed


def _model_to_trace(keras_model, custom_objects):
    """``(model, its compiled loss)`` for :func:`check_xla`'s step. The user's model itself where
    the step traced on it is the one traced on a clone (``_strategy.xla_check.traceable_as_is``, no
    feature columns): the step is compiled, never run, so nothing is written to the model; it
    gets a loss container of its own (the model's is built on its first call, so it is left
    untouched) and its classes are made v2 again, as a clone made in eager mode would make
    them. Cloning MobileNetV2 was a third of the check. Else a clone, compiled with the model's
    loss."""
    from tpushim import _tfprivate
    from tpushim._strategy import xla_check as _strategy_xla_check

    loss_weights = _loss_weights(keras_model)
    if _plan(keras_model) is None and _strategy_xla_check.traceable_as_is(keras_model):
        _tfprivate.keras.as_v2_classes(keras_model)
        container = type(keras_model.compiled_loss)(
            keras_model.loss, loss_weights, output_names=keras_model.output_names
        )
        return keras_model, container
    clone = _clone(keras_model, custom_objects)
    try:
        clone.set_weights(keras_model.get_weights())
    except ValueError:
        pass  # an unbuilt subclassed model (e.g. a WideDeepModel) has none yet; the compile needs none
    clone.compile(loss=keras_model.loss, loss_weights=loss_weights)
    return clone, clone.compiled_loss


def _estimator_io(model, features, labels):
    """``(inputs, targets, sample weights)`` as the estimator hands features and labels to Keras."""
    if _versions.uses_own_estimator():
        from tpushim._estimator_api import _keras

        return _keras.keras_io(model, features, labels)
    from tpushim import _tfprivate

    return _tfprivate.estimator.convert_estimator_io_to_keras(model, features, labels)


def _loss_weights(keras_model):
    """The ``loss_weights`` the model was compiled with (None: none)."""
    if _versions.uses_own_estimator():
        from tpushim._estimator_api import _tfprivate as engine_private

        return engine_private.compile_args(keras_model).get("loss_weights")
    from tpushim import _tfprivate

    return _tfprivate.keras.compile_args(keras_model).get("loss_weights")


def _plan(keras_model):
    """The feature-column split of the conversion (None: none; none on TensorFlow >= 2.16, where
    _feature_columns, which needs tensorflow_estimator, does not run)."""
    if _versions.uses_own_estimator():
        return None
    from tpushim import _feature_columns

    return _feature_columns.plan(keras_model)


def _graph_def(function, args):
    """The GraphDef of ``function`` traced for ``args`` (its library included), or None."""
    try:
        return function.get_concrete_function(*args).graph.as_graph_def()
    except Exception:
        return None


def _nodes(graph_def):
    """Every node of a GraphDef, its functions' (loops, conditions, calls) included."""
    if graph_def is None:
        return
    yield from graph_def.node
    for function in graph_def.library.function:
        yield from function.node_def


def _ops_without_xla_kernel(graph_def):
    """{op type: a node of it} for the traced step's ops XLA has no kernel for, in graph order.

    What XLA names when it gets that far; it may stop earlier, e.g. on a lookup table's handle,
    which it takes for an uninitialised variable (``RET_CHECK failure ... is_initialized``). The
    kernel registry lists XLA's kernels once XLA has compiled something in the process (the
    failed compile did); without them it tells nothing, and nothing is named.
    """
    from tensorflow.python.framework import kernels

    def on_xla(op_type):
        registered = kernels.get_registered_kernels_for_op(op_type).kernel
        return any(k.device_type == "XLA_CPU_JIT" for k in registered)

    if graph_def is None or not on_xla("MatMul"):
        return {}
    found = {}
    for node in _nodes(graph_def):
        # A placeholder is the compiled function's argument: XLA takes it as one.
        if node.op not in found and node.op != "Placeholder" and not on_xla(node.op):
            found[node.op] = node.name
    return found


def _failing_node(text, graph_def):
    """(op type, node name) of the step's node XLA's error names, or None: in graph mode XLA
    names the call of the whole step (StatefulPartitionedCall), which says nothing."""
    ops = {node.name: node.op for node in _nodes(graph_def)}
    for name in _XLA_NODE.findall(text):
        if name in ops and ops[name] not in ("PartitionedCall", "StatefulPartitionedCall"):
            return ops[name], name
    return None


def _report_xla_error(report, keras_model, e, graph_def=None):
    """The finding(s) for an XLA compilation error, each naming the op and the layer it is in:
    unsupported ops and value-dependent shapes; when XLA's error names no op, the step's ops XLA
    has no kernel for; anything else as xla-compile, with the node XLA names."""
    text = str(e)
    named = _XLA_UNSUPPORTED.findall(text)
    # An _Arg XLA refuses is an input of a dtype it cannot take (strings): the input checks
    # report those (string-input), by feature; what the model does with them is still named.
    unsupported = [(op, node) for op, node in named if op != "_Arg"]
    inputs_only = bool(named) and not unsupported
    not_constant = _XLA_NOT_CONSTANT.search(text)
    failing = _failing_node(text, graph_def)
    if not unsupported and not not_constant and (inputs_only or failing is None):
        unsupported = list(_ops_without_xla_kernel(graph_def).items())
    if inputs_only and not unsupported and not not_constant:
        return
    if not_constant:
        node, op = not_constant.groups()
        layer = _layer_of(node, keras_model)
        where = (
            f"layer {layer!r} (op {op})"
            if layer != node
            # in a subclassed call()
            else f"model {keras_model.name!r} (op {op}, node {node})"
        )
        report.add(
            "value-dependent-shape",
            "error",
            where,
            "a shape in the training step depends on a tensor's value (e.g. tf.ones([n]) or "
            "tf.range(n) with n computed from the batch, or a loop growing a tensor): a "
            "TPU compiles the step before any value exists",
            "derive shapes from static shapes (x.shape) or constants, or compute such "
            "values in the input pipeline and pad them to a fixed size",
        )
    elif not unsupported:
        if failing is None:
            where = f"model {keras_model.name!r} (XLA's error names no op of the step)"
        else:
            op, node = failing
            where = f"layer {_layer_of(node, keras_model)!r} (op {op}, node {node})"
        report.add(
            "xla-compile",
            "error",
            where,
            f"the training step does not compile with XLA: {summary(e)}",
            "make the model's ops XLA-compatible (tf.function(jit_compile=True) on CPU "
            "reproduces this)",
        )
    for op, node in dict(unsupported).items():  # one finding per op
        report.add(
            "xla-unsupported-op",
            "error",
            f"layer {_layer_of(node, keras_model)!r} (op {op})",
            f"op {op} ({node}) has no XLA kernel: the training step does not compile for a TPU",
            f"replace {op} in that layer with XLA-supported ops, or move it into the "
            f"input pipeline (tf.data), which runs on the host",
        )


def _xla_compile_in_graph(keras_model, custom_objects, features, labels, traced):
    """The training step compiled by XLA in a graph, for scripts that ``disable_v2_behavior()``
    (no eager context to ask for the compiler's IR): built in a scratch graph as a
    ``jit_compile`` function on the batch's values and run once, which compiles it. The traced
    step's GraphDef is appended to ``traced``."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        clone = _clone(keras_model, custom_objects)
        clone.compile(loss=keras_model.loss)  # Keras's v1 training: loss_functions, per output
        features, blocks, moved = _split_for_xla(keras_model, features)
        if blocks:  # the feature columns' lookup tables, made in this graph
            sess.run(tf.compat.v1.tables_initializer())
            blocks = sess.run(blocks)
            features = sess.run(features)
        structure = (*_estimator_io(clone, features, labels)[:2], blocks)
        flat = [tf.convert_to_tensor(a) for a in tf.nest.flatten(structure)]

        @tf.function(jit_compile=True)
        def train_step(*flat):
            x, y, b = tf.nest.pack_sequence_as(structure, flat)
            with tf.GradientTape() as tape, moved(b):
                predictions = clone(x, training=True)
                if isinstance(predictions, dict):
                    predictions = [predictions[n] for n in clone.output_names]
                pairs = zip(tf.nest.flatten(y), tf.nest.flatten(predictions), clone.loss_functions)
                loss = tf.add_n([fn(t, p) for t, p, fn in pairs] + list(clone.losses))
            return loss, tape.gradient(loss, clone.trainable_variables)

        outputs = train_step(*flat)
        traced.append(_graph_def(train_step, flat))
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(outputs)


def check_host_only_ops(report, keras_model, custom_objects, features, labels, ops=None):
    """Host-only ops (summaries, prints, Python functions) inside the TPU train computation, as
    tpushim's model_fn builds it.

    ``ops``: the ops that model_fn made for training where a build of it is at hand already (the
    TPU train graph's, :func:`tpushim._preflight.graph_checks.model_fn_ops`); else it is built
    here, on the batch (``features``, ``labels``).
    """
    from tpushim import _model_fn, _summaries

    report.note_checked("host-only ops in the model")
    if ops is None:
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.train.get_or_create_global_step()
            feats, labs, fed = _sparse_fed(keras_model, features, labels)
            feats = {**feats, **fed} if fed else feats
            feats = tf.nest.map_structure(tf.convert_to_tensor, feats)
            labs = tf.nest.map_structure(tf.convert_to_tensor, labs) if labs is not None else None
            _model_fn.make_model_fn(keras_model, custom_objects)(
                feats,
                labs,
                tf.estimator.ModeKeys.TRAIN,
                params={"use_tpu": False, "batch_size": None},
            )
        ops = graph.get_operations()
    for op in ops:
        what = HOST_ONLY_OPS.get(op.type)
        if what and not _summaries.carried(op):  # scalar summaries reach TensorBoard by host call
            report.add(
                "host-only-op",
                "warning" if "summary" in what else "error",
                f"layer {_layer_of(op.name, keras_model)!r} (op {op.type})",
                f"{what} inside the model runs on the host: on a TPU it cannot be compiled "
                f"or forces a round trip every step",
                "remove it from the model (log with TensorBoard hooks outside the model, "
                "do Python work in the input pipeline)",
            )
