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

from tpushim import _batch_math, _settings


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

    def context(self, mode, replicas=1, hosts=1, on_tpu=True):
        """The :class:`RunContext` of one ``mode`` call on ``replicas`` replicas over ``hosts``
        hosts (``on_tpu`` False: the TPU code path on this machine's CPU, one replica)."""
        return RunContext(mode, replicas, hosts, on_tpu, self.batch_size, self.iterations_per_loop)


#: ModeKeys' values (``tf.estimator.ModeKeys``), without importing TensorFlow.
TRAIN, EVAL, PREDICT = "train", "eval", "infer"


@dataclasses.dataclass(frozen=True)
class RunContext:
    """One call's numbers, derived from the :class:`ConversionPlan` and the system it runs on:
    what TPUEstimator's ``_InternalTPUContext`` answers (``tpu_context.py``: hosts, replicas,
    the global batch, each replica's and each input pipeline's, the loop's iterations), for
    either engine and the preflight. Derived, never stored: a setting read here is the plan's.

    Both engines feed each pod host's replicas from that host's own pipeline (TPUEstimator's
    ``PER_HOST_V2``; the strategy engine's ``distribute_datasets_from_function``), except that
    the TPUEstimator engine predicts on several hosts from one pipeline broadcast to every core
    (``SLICED``: TPUEstimator refuses per-host prediction there).

    Made by :meth:`ConversionPlan.context` (the strategy engine's input makes one from the
    batch size its plan gave it: :mod:`tpushim._strategy.input`).

    Attributes:
      mode: ``train``, ``eval`` or ``infer`` (``tf.estimator.ModeKeys``' values).
      replicas: the model's replicas (one per TPU core; the strategy's replicas in sync).
      hosts: the hosts (input pipelines) feeding them.
      on_tpu: False where the call runs the TPU code path on this machine's CPU (one replica,
        nothing padded), as TPUEstimator's ``is_running_on_cpu``.
      batch_size: the plan's global batch size, or None (each call's input gives its own).
      iterations_per_loop: the plan's training steps per TPU loop (``tf.function`` call).
    """

    mode: str
    replicas: int = 1
    hosts: int = 1
    on_tpu: bool = True
    batch_size: Any = None
    iterations_per_loop: int = _settings.DEFAULT_ITERATIONS_PER_LOOP

    def __post_init__(self):
        if self.on_tpu and (self.replicas < 1 or self.hosts < 1 or self.replicas % self.hosts):
            raise ValueError(f"{self.replicas} replicas cannot be split over {self.hosts} hosts")

    @property
    def replicas_per_host(self):
        """The replicas each host feeds (TPUEstimator's ``num_of_replicas_per_host``)."""
        return self.replicas // self.hosts

    @property
    def broadcast(self):
        """One pipeline feeds every replica (predict on several hosts, TPUEstimator engine's)."""
        return self.mode == PREDICT and self.hosts > 1

    def global_batch(self, input_batch=None):
        """Stock's global batch of the call: the plan's batch size, else the input's."""
        return self.batch_size if self.batch_size is not None else input_batch

    def padded_batch(self, input_batch=None):
        """The global batch the replicas run (TPUEstimator's ``global_batch_size``): stock's,
        padded to the next multiple of the replicas, the padding rows weighted 0."""
        size = self.global_batch(input_batch)
        if not self.on_tpu or size is None:
            return size
        return _batch_math.padded_batch(size, self.replicas)

    def per_replica_batch(self, input_batch=None):
        """Each replica's rows of a padded global batch (``batch_size_for_model_fn``)."""
        padded = self.padded_batch(input_batch)
        if not self.on_tpu or padded is None:
            return padded
        return padded // self.replicas

    def input_fn_batch(self, input_batch=None):
        """The batch each input pipeline makes per replica it feeds, or whole where one pipeline
        is broadcast (``batch_size_for_input_fn``)."""
        if self.broadcast:
            return self.padded_batch(input_batch)
        return self.per_replica_batch(input_batch)

    def host_batch(self, input_batch=None):
        """The padded global batch's rows each host's replicas take per step."""
        per_replica = self.per_replica_batch(input_batch)
        if not self.on_tpu or per_replica is None:
            return per_replica
        return per_replica * self.replicas_per_host

    def eval_steps(self, examples, batches, declared, input_batch=None):
        """The evaluation steps a finite input of ``examples`` rows fills with this call's
        global batch (:func:`tpushim._batch_math.eval_batches_held`)."""
        return _batch_math.eval_batches_held(
            examples, batches, declared, self.global_batch(input_batch)
        )
