"""``check(keras_model, input_fn)``: the model and input checks run together, in the order in which
each needs the last (the model checks run on a batch the input gave)."""

from __future__ import annotations

from typing import Callable

from tpushim import _settings, _shapes, _versions
from tpushim._preflight import input_checks, model_checks, progress, strategy_checks
from tpushim._preflight.report import Report


def check(
    keras_model: object,
    input_fn: Callable[..., object] | None = None,
    *,
    batch_size: int | None = None,
    num_cores: int = _settings.DEFAULT_CORES,
    steps: int | None = None,
    iterations_per_loop: int | None = None,
    custom_objects: dict[str, object] | None = None,
) -> Report:
    """Reports, on CPU, what would break or crawl when this model and input run on a TPU.

    Args:
      keras_model: the compiled Keras model you pass to ``model_to_estimator``.
      input_fn: your training input_fn (optional: without it only the model is checked).
      batch_size: the global batch size, when you set one (else it is read from the input).
      num_cores: TPU cores to check the batch against (8 for a v2-8, v3-8,
        v5litepod-8 or v6e-8; 4 for a v4-8 or v5p-8).
      steps: training steps planned, to judge ``iterations_per_loop``.
      iterations_per_loop: the value you will use (tpushim's default when None).
      custom_objects: as for ``model_to_estimator``.

    Returns:
      A :class:`Report`; ``report.ok`` is False when something would fail on a TPU.
    """
    if (
        _versions.uses_own_estimator()
    ):  # TensorFlow >= 2.16: no TPUEstimator, tpushim's estimator API
        from tpushim._preflight import strategy_checks

        return strategy_checks.check(keras_model, input_fn, batch_size, num_cores, custom_objects)
    report = Report()
    batch = None
    if input_fn is not None:
        with progress.phase(f"input pipeline of {_name(input_fn)}", report):
            batch = input_checks.check_input(
                report, input_fn, batch_size, num_cores, _shapes.ModelInputs.of(keras_model)
            )
    check_model(
        report,
        keras_model,
        batch,
        batch_size,
        num_cores,
        steps,
        iterations_per_loop,
        custom_objects,
    )
    return report


def check_model(
    report,
    keras_model,
    batch,
    batch_size,
    num_cores,
    steps,
    iterations_per_loop,
    custom_objects,
    host_only_later=None,
    settings=None,
):
    """The checks of the model (conversion, host-only ops, XLA) on ``batch`` (features, labels:
    numpy, shaped as the input's; None when no input was checked) and of the settings.

    ``host_only_later``: a list, or None. Where given, the host-only-ops check is not run here
    but appended to it, as a function of the model_fn's training ops (None: build them) that
    puts its findings where they would have been: a script's check runs it once the TPU train
    graph has built those ops (:func:`tpushim._preflight.graph_checks.model_fn_ops`).

    ``settings``: those that choose the engine whose step is compiled (a script's conversion's;
    None: the settings in force).
    """
    name = getattr(keras_model, "name", "model")
    with progress.phase(f"conversion of model {name!r}", report):
        convertible = model_checks.check_conversion(report, keras_model, custom_objects)
    if batch is None and batch_size:
        input_checks.check_batch(report, batch_size, num_cores, "setting batch_size")
    input_checks.check_loop(report, iterations_per_loop, steps)
    if convertible:
        model_checks.check_feature_columns(report, keras_model)
    if (
        convertible
        and batch is not None
        and not {"dynamic-shape", "sparse-feature-refused"} & set(report.codes())
    ):
        features, labels = batch
        host_only = _host_only_check(report, keras_model, custom_objects, features, labels)
        if host_only_later is None:
            host_only(None)
        else:
            host_only_later.append(host_only)
        with progress.phase("XLA compile of the training step", report):
            plan = _strategy_plan(report, keras_model, custom_objects, settings)
            if plan is None:
                model_checks.check_xla(report, keras_model, custom_objects, features, labels)
            else:
                strategy_checks.check_strategy_step(report, plan, features, labels, num_cores)


def _strategy_plan(report, keras_model, custom_objects, settings=None):
    """The strategy engine's plan where the settings in force choose that engine on this
    TensorFlow (``engine='strategy'``, a PJRT runtime: :func:`tpushim._engines.choose`), else
    None; None with a finding where that engine would refuse the model."""
    from tpushim import _engines, _patch

    settings = settings or _patch.current_settings() or _settings.resolve()
    if not _engines.select(settings)[0].compiles_own_step:
        return None
    return strategy_checks.strategy_plan(report, keras_model, custom_objects, settings)


def _host_only_check(report, keras_model, custom_objects, features, labels):
    """The host-only-ops check as a function of the model_fn's training ops (None: built), which
    inserts its findings here, at the report's end as it is now, whenever it runs."""
    report.note_checked("host-only ops in the model")  # in the order the checks are listed
    position = len(report.findings)

    def run(ops):
        found = Report()
        with progress.phase("host-only ops in the model", found):
            model_checks.check_host_only_ops(
                found, keras_model, custom_objects, features, labels, ops
            )
        new = [f for f in found.findings if f not in report.findings]
        report.findings[position:position] = new

    return run


def _name(input_fn):
    return f"input_fn {getattr(input_fn, '__name__', type(input_fn).__name__)!r}"
