"""The conversion plan: what one ``model_to_estimator`` call fixed, as one frozen value that both
engines take (:mod:`tpushim._estimator`'s TPUEstimator, :mod:`tpushim._strategy`'s strategy).

An estimator made from a converted one (``tf.estimator.add_metrics``, an Estimator rebuilt around
its model_fn: :mod:`tpushim._extenders`) takes the plan whole, so it cannot drop one of its facts
(as add_metrics once dropped ``pod_input``, when each was an attribute of its own). What the
estimator learns per call (the batch a call's input gives, an evaluation's steps) is not in it.

TensorFlow-free: what it holds was computed by the modules that import TensorFlow.
"""

import dataclasses
from typing import Any

from tpushim import _settings


@dataclasses.dataclass(frozen=True)
class ConversionPlan:
    """What one conversion fixed (immutable; ``dataclasses.replace`` makes a changed copy).

    Attributes:
      settings: the conversion's :class:`tpushim._settings.Settings`; None for an estimator that
        ``model_to_estimator`` did not make (a TPUShimEstimator constructed directly).
      tpu: the :class:`tpushim._detect.TPUSpec` it runs on, or None (on this machine's CPU).
      model_inputs: the Keras model's :class:`tpushim._shapes.ModelInputs` (whose static shapes
        the TPUEstimator path gives the input's features), or None.
      warm_start: the warm-start checkpoint the conversion wrote from the Keras weights (stock's
        ``model_dir/keras``), or None.
      loss_plan: the model's :class:`tpushim._loss_kinds.LossPlan` at conversion, or None. The
        strategy engine trains with it; TPUEstimator's model_fn plans at its first call (where
        a subclassed model's losses are known), from the same cache.
    """

    settings: Any = None
    tpu: Any = None
    model_inputs: Any = None
    warm_start: Any = None
    loss_plan: Any = None

    @property
    def batch_size(self):
        """The global batch size tpushim was given, or None: each call's input gives its own."""
        return self.settings.batch_size if self.settings is not None else None

    @property
    def pod_input(self):
        """How a pod's hosts read the input (``auto``, ``exact``, ``files``)."""
        return self.settings.pod_input if self.settings is not None else "auto"

    @property
    def iterations_per_loop(self):
        """Training steps per TPU loop (TPUEstimator) or per ``tf.function`` call (strategy)."""
        given = self.settings.iterations_per_loop if self.settings is not None else None
        return given or _settings.DEFAULT_ITERATIONS_PER_LOOP

    @property
    def tpu_source(self):
        """Where the TPU came from (e.g. ``TPU_NAME``), or None on CPU."""
        return self.tpu.source if self.tpu is not None else None
