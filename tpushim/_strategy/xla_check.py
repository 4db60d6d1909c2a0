"""The strategy engine's XLA check, where no TPU compiles the step: one replica's training step
(forward, loss, gradients) compiled with XLA as a TPU compiles it, never run, once per conversion
and input shape; the feature-column lookups and string inputs no TPU step computes refused, before
anything is written."""

import weakref

import tensorflow as tf

from tpushim import _padding, _tfprivate
from tpushim._errors import ConversionError
from tpushim._strategy.clone import _built_on_input, clone
from tpushim._strategy.element import _unpack, features_spec, known_rows
from tpushim._strategy.loss import _loss_objects, _loss_of, _outs
from tpushim._strategy.step import model_summaries_left_out, real_rows


def check_xla(plan, element_spec, replicas):
    """Compiles one replica's training step (forward, loss, gradients) with XLA, as a TPU would,
    without running it: an op XLA cannot compile raises here, naming it.

    Outside the strategy: XLA-compiled functions inside a MirroredStrategy's multi-device step
    hung now and then on CPU (about 1 run in 4 on 8 logical devices, TF 2.15), so the replicated
    step itself runs uncompiled off a TPU. On the user's model itself where it can be traced as
    it is (:func:`_as_is`: the step is compiled, never run, so nothing is written to it), else on
    a copy (cloning ResNet50 cost as much as lowering its step to HLO).

    An inspection stock does not make: the seeds its copy and trace draw are put back, so the
    model a program builds next starts from stock's initial weights.
    """
    with _tfprivate.keras.keras_random_state_kept():
        _check_xla(plan, element_spec, replicas)


def _check_xla(plan, element_spec, replicas):
    model = _as_is(plan) or clone(plan, features_spec(element_spec))
    terms = _loss_objects(plan.keras_model, plan.custom_objects, model.output_names, _outs(plan))
    lookups = _tfprivate.keras.feature_column_layers(model) if plan.host is None else ()
    if lookups:
        raise ConversionError(
            "the training step cannot run on a TPU: the model's feature-column layers "
            f"({', '.join(lookups)}) look up, hash or cross their features with ops no TPU "
            "step compiles, and the strategy engine does not move them to the host yet (the "
            "TPUEstimator path does). Apply the feature columns in the input_fn "
            "(tf.keras.layers.DenseFeatures in Dataset.map) and feed the model numbers, use "
            "engine='tpuestimator' where TPUEstimator runs, or train without tpushim "
            "(TPUSHIM_MODE=off)."
        )

    strings = _string_parts(element_spec)
    if strings:
        raise ConversionError(
            f"the training step cannot run on a TPU: its input carries strings ({strings}), and "
            "no TPU computes strings (XLA has no string type). Turn them into numbers in the "
            "input_fn (a lookup or tf.strings.to_number in Dataset.map), or train without "
            "tpushim (TPUSHIM_MODE=off)."
        )

    def step(element):
        features, labels, pad, weights = _unpack(element, model.output_names)
        with tf.GradientTape() as tape, real_rows(element):
            loss, _ = _loss_of(
                plan,
                terms,
                model,
                features,
                labels,
                pad,
                weights,
                True,
                replicas,
                lambda x: x,
                known_rows(element),
            )
        return loss, tape.gradient(loss, model.trainable_variables)

    sample = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), element_spec)
    try:
        with (
            _tfprivate.keras.batchnorm_call_hooked(),
            model_summaries_left_out(plan),
            _tfprivate.keras_compile.call_losses_kept(model),  # the user's model, traced as it is
        ):
            _tfprivate.graph.compiler_ir(tf.function(step, jit_compile=True), sample)
    except (ValueError, tf.errors.OpError) as e:
        raise ConversionError(
            "the training step does not compile with XLA, as a TPU compiles it (compiled here "
            f"with jit_compile=True): {str(e)[:1500]}. Replace the op it names with TensorFlow "
            "ops XLA supports, or train without tpushim (TPUSHIM_MODE=off)."
        ) from e


def _as_is(plan):
    """The user's model, where :func:`check_xla` traces the same step on it as on a clone: a
    built graph network (no subclassed or unbuilt one, which a clone builds on the input), no
    layer run on the host (a clone's, :mod:`tpushim._host_part`), its variables eager ones
    (not a graph-mode program's), no activity regularizer (the step installs a recorder in its
    place: :func:`_recorders`, on a clone only). Else None."""
    if plan.host is not None or not traceable_as_is(plan.keras_model):
        return None
    return plan.keras_model


def traceable_as_is(keras_model):
    """Whether an XLA check may trace its step on ``keras_model`` itself instead of a clone
    (:func:`_as_is`, and the TPUEstimator path's :func:`tpushim._preflight.model_checks.check_xla`):
    a built graph network with eager variables and no activity regularizer."""
    if _built_on_input(keras_model) or not tf.executing_eagerly():
        return False
    layers = _tfprivate.keras.all_layers(keras_model)
    if any(getattr(layer, "activity_regularizer", None) is not None for layer in layers):
        return False
    return not any(getattr(v, "_in_graph_mode", True) for v in keras_model.weights)


_XLA_CHECKED = weakref.WeakKeyDictionary()  # plan -> [(element spec, replicas)] that compiled


def check_xla_once(plan, element_spec, replicas):
    """:func:`check_xla`, once per conversion and input shape: a later ``train()`` call's step
    is the same computation (for MobileNetV2 the check costs about what tracing the step does)."""
    checked = _XLA_CHECKED.setdefault(plan, [])
    if (element_spec, replicas) not in checked:
        check_xla(plan, element_spec, replicas)
        checked.append((element_spec, replicas))


def _paths(value, path=""):
    """(path, leaf) of a nest of dicts, lists and tuples: "text", "a/b", "[0]"."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, f"{path}/{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _paths(item, f"{path}[{i}]")
    else:
        yield path, value


def _string_parts(element_spec):
    """Where a padded element's spec holds strings: "feature 'text', label 'key'" ("" if none)."""
    features, labels = element_spec if isinstance(element_spec, tuple) else (element_spec, None)
    found = []
    for part, value in (("feature", features[_padding.FEATURES_KEY]), ("label", labels)):
        if value is None:
            continue
        for path, spec in _paths(value):
            if spec.dtype == tf.string:
                found.append(f"{part} {path!r}" if path else part)
    return ", ".join(found)
