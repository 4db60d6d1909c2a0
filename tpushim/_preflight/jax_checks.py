"""The JAX engine's preflight (``python -m tpushim check --engine jax script.py``, or
``engine='jax'`` in force): what the engine refuses of the script's model (a loss, an optimizer,
a layer's random draws, an op tf2jax has no JAX for: op and layer named), and its training step
converted and compiled with XLA on this machine's CPU devices, split over them as the engine
splits the global batch -- nothing trained, nothing written.
"""

from tpushim._preflight import model_checks

ENGINE_NOTE = "the XLA compile of the training step is the JAX engine's"


def check_jax_step(report, keras_model, custom_objects, settings, features, labels, num_cores):
    """Adds the JAX engine's findings for ``keras_model`` on one training batch (``features``,
    ``labels``: numpy structures as the input gives them): ``jax-engine-refuses`` (error) with
    the engine's own words where it would refuse the model, else the step compiled for up to
    ``num_cores`` of JAX's devices."""
    report.note_checked("XLA compile of the training step")
    try:
        import jax

        from tpushim._jax import _estimator, _graph_program
    except ImportError as e:
        report.add(
            "jax-engine-missing",
            "error",
            "the installation",
            f"the JAX engine needs jax and tf2jax ({e})",
            'pip install "tpushim[jax]"',
        )
        return
    from tpushim._errors import ConversionError

    devices = jax.local_devices()[:num_cores]
    name = keras_model.name  # (a subclassed model's: not its stand-in's)
    try:
        if _graph_program.is_graph_program():  # its eager copy, checked on the eager runtime
            copy = _graph_program.eager_copy(keras_model, custom_objects)
            with _graph_program.runtime(keras_model):
                _check_step(report, copy, custom_objects, settings, features, labels, devices)
            return
        _estimator._eager_classes(keras_model)  # the script's conversion cloned it in a graph
        _check_step(report, keras_model, custom_objects, settings, features, labels, devices)
    except ConversionError as e:
        report.add(
            "jax-engine-refuses",
            "error",
            f"model {name!r}" + _layers_named(str(e), keras_model),
            f"the JAX engine would refuse this model: {e}",
            # (a model no TPU engine runs, the strategy engine not named)
            "see the message" + (" (engine=strategy trains it)" if "strategy" in str(e) else ""),
        )
    except Exception as e:  # XLA's compile failed: named as the model's step
        model_checks._report_xla_error(report, keras_model, e)


def _check_step(report, keras_model, custom_objects, settings, features, labels, devices):
    """The engine's refusals of ``keras_model`` (an eager one), then its step compiled."""
    from tpushim import _tfprivate
    from tpushim._jax import _build, _estimator, _host, _step

    _build.refusals(keras_model, keras_model.optimizer, custom_objects, settings)
    if _tfprivate.keras.is_subclassed(keras_model):  # built on the input, as the engine's
        from tpushim._jax import _subclassed

        spec = _subclassed.features_spec(_estimator._given_weights(features)[0])
        keras_model = _subclassed.stand_in(keras_model, custom_objects, spec)[0]
    host = _host.plan(keras_model, custom_objects)  # strings and lookups: on the host
    arrays = _estimator.Arrays(keras_model, host)
    feats, labs = arrays.split((features, labels), _estimator.ModeKeys.TRAIN)
    if labs is None:
        return
    rows = len(feats[0])
    size = -(-rows // len(devices)) * len(devices)  # as the engine splits it (padded)
    report.notes.append(
        f"{ENGINE_NOTE}: converted with tf2jax and compiled for {len(devices)} "
        f"{'/'.join(sorted({d.platform.upper() for d in devices}))} device(s) of JAX's here, "
        f"the global batch of {rows} rows split over them"
        + (f" (padded to {size})" if size != rows else "")
    )
    _step.Trainer(keras_model, size, devices, custom_objects, fed=host).compile((feats, labs, None))


def not_run_note(note):
    """The preflight's note of what it did not run, said of the JAX engine (the path checked
    here) rather than of the strategy engine; any other note as it is."""
    return note.replace(
        "tpushim's TPU path for TensorFlow >= 2.16 is the strategy engine, checked instead for "
        "its input, host-only ops and XLA",
        "the JAX engine was asked for: its input, host-only ops and its step's conversion and "
        "XLA compile checked instead",
    )


def _layers_named(message, keras_model):
    """``, layer 'x'`` for the model's layers the engine's message names (an op's scope)."""
    from tpushim import _tfprivate

    names = [
        layer.name
        for layer in _tfprivate.keras.all_layers(keras_model)[1:]
        if f" in {layer.name}" in message or f"{layer.name}/" in message
    ]
    return "".join(f", layer {n!r}" for n in names[:3])
