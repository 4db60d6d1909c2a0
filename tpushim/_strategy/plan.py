"""The strategy engine's :class:`Plan`: what it takes from a conversion (the Keras model, its
optimizer, loss kinds, warm-start weights, the strategy), made by :func:`make_plan`, which refuses
what the engine cannot run yet before anything is written."""

import dataclasses
import logging
from typing import Any

import tensorflow as tf

from tpushim import _host_part, _loss_kinds, _plan, _sparse_inputs, _tfprivate, _validation
from tpushim._errors import ConversionError
from tpushim._strategy.refusals import check_tf1_optimizer

logger = logging.getLogger("tpushim")


class Learned:
    """What the engine learns of a conversion's model at its first calls, once (never a setting,
    nothing the user set): a subclassed model's loss plan, known once a call built its copy; a
    replica's feature specs (a subclassed model is built on them); stock's training graph (its
    checkpoint names: :mod:`tpushim._strategy.checkpoint`). Shared by every estimator made
    from the conversion (``tf.estimator.add_metrics``'s too).

    Attributes:
      loss_kinds: output name -> :class:`tpushim._loss_kinds.LossKind`
        (:func:`tpushim._loss_kinds.plan`).
      added_degrees: (layer name, index) -> :class:`tpushim._loss_kinds.Degree` of each loss a
        layer adds from its inputs (absent: ``MEAN``); None until a subclassed model's first call planned it.
      features_spec: a replica's feature specs, once a call read its input (subclassed models).
      stock_graph: what stock's training graph says of the model (checkpoint names), or None.
      graph_files: that graph's ``.meta`` bytes and ``graph.pbtxt`` text, or None.
    """

    __slots__ = ("added_degrees", "features_spec", "graph_files", "loss_kinds", "stock_graph")

    def __init__(self, loss_kinds, added_degrees):
        self.loss_kinds, self.added_degrees = loss_kinds, added_degrees
        self.features_spec = self.stock_graph = self.graph_files = None


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """What the engine takes from a conversion: one frozen value (``dataclasses.replace`` makes a
    changed copy, as :func:`tpushim._strategy.build.made` completes it). The settings' numbers
    (batch size, pod input, steps per execution) are not copied here: they are read from
    ``conversion``, the :class:`tpushim._plan.ConversionPlan` both engines take, so that they
    cannot drift from it.

    Attributes:
      keras_model: the user's compiled Keras model (a graph network).
      optimizer: its optimizer as stock trains it (Keras's legacy optimizer).
      custom_objects: as given to ``model_to_estimator``.
      conversion: the :class:`tpushim._plan.ConversionPlan` (settings, TPU, loss plan, warm
        start); its TPU and warm-start checkpoint are added once the conversion has them.
      make_strategy: a function returning the strategy (built at the first call).
      learned: the :class:`Learned` facts of its first calls (loss kinds, feature specs).
      warm_start: the trainable weights' values at conversion (stock warm-starts the trainable
        variables from the Keras weights), or None.
      jit_compile: check, where the strategy is not a TPU's, that a replica's training step
        compiles with XLA (on a TPU, TPUStrategy compiles every step with XLA itself).
      host: the :class:`tpushim._host_part.HostPart` (strings, lookups), or None.
      graph_mode: the program disabled v2 behaviour (its model was made in a graph).
      metric_names: its metrics as stock names them there (the program's v1 names), or None.
      metric_names_map: model_to_estimator's (None: stock's names).
      name_based_checkpoints: write stock's name-based checkpoints (``checkpoint_format='saver'``)
        rather than object-based ones (:mod:`tpushim._strategy.checkpoint`).
    """

    keras_model: Any
    optimizer: Any
    custom_objects: dict
    conversion: _plan.ConversionPlan
    make_strategy: Any
    learned: Learned
    warm_start: Any = None
    jit_compile: bool = True
    host: Any = None
    graph_mode: bool = False
    metric_names: Any = None
    metric_names_map: Any = None
    name_based_checkpoints: bool = False

    @property
    def batch_size(self):
        """The global batch size, or None (read from the input): the conversion plan's."""
        return self.conversion.batch_size

    @property
    def pod_input(self):
        """How a pod's hosts read the input (``auto``, ``exact``, ``files``:
        :mod:`tpushim._strategy.input`): the conversion plan's."""
        return self.conversion.pod_input

    @property
    def steps_per_execution(self):
        """Training steps per ``tf.function`` call: the conversion plan's iterations_per_loop."""
        return self.conversion.iterations_per_loop

    @property
    def loss_kinds(self):
        """Output name -> its loss kind (:attr:`Learned.loss_kinds`)."""
        return self.learned.loss_kinds

    @property
    def added_degrees(self):
        """(layer name, index) -> its :class:`tpushim._loss_kinds.Degree`
        (:attr:`Learned.added_degrees`)."""
        return self.learned.added_degrees


def make_plan(keras_model, optimizer, custom_objects, settings, make_strategy):
    """The :class:`Plan` of one conversion; refuses what the engine cannot run yet, before
    anything is written."""
    graph_mode = not tf.executing_eagerly()
    if isinstance(optimizer, _tfprivate.keras.keras_v1_tf_optimizer_class()):
        check_tf1_optimizer(optimizer.optimizer)
    elif not isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
        raise ConversionError(
            f"the strategy engine trains with Keras optimizers and tf.compat.v1.train ones; "
            f"{type(optimizer).__name__} is neither. Compile the model with a tf.keras optimizer, "
            "or use engine='tpuestimator'."
        )
    # Strings and lookups run on the host (refused here, naming the layer, where they cannot),
    # and a SparseTensor input's readers there, or the input is made dense there.
    encoders, densified = _sparse_inputs.plan(
        keras_model, "the strategy engine", _sparse_inputs.tf_dense_update_differs(optimizer)
    )
    host = _host_part.plan(keras_model, custom_objects, also=encoders, densified=densified)
    loss_plan = _loss_kinds.plan(keras_model, custom_objects)
    # The plan may clone it in a graph (a model made in one, by a program that disabled v2
    # behaviour, keeps its v1 classes).
    _tfprivate.keras.restore_v2_classes(keras_model, v1=graph_mode)
    warm = None
    if _tfprivate.keras.is_graph_network(keras_model):
        if not graph_mode:
            warm = [w.numpy() for w in keras_model.trainable_weights] if keras_model.built else None
        elif _tfprivate.estimator.any_weight_initialized(
            keras_model
        ):  # read in the program's session
            warm = tf.compat.v1.keras.backend.batch_get_value(keras_model.trainable_weights)
        # else stock starts from its first checkpoint's freshly initialised clone: read from it
        # once written (:func:`warm_from_first_checkpoint`), the program's variables untouched.
    elif _tfprivate.keras.is_subclassed(keras_model):
        _validation.said_subclassed(keras_model)
    plan = Plan(
        keras_model=keras_model,
        optimizer=optimizer,
        custom_objects=custom_objects or {},
        conversion=_plan.ConversionPlan(settings=settings, loss_plan=loss_plan),
        make_strategy=make_strategy,
        learned=Learned(
            loss_plan.outputs,
            # A subclassed model's losses are planned once it is built (:func:`clone`).
            None if _tfprivate.keras.is_subclassed(keras_model) else loss_plan.added or {},
        ),
        warm_start=warm,
        host=host,
        graph_mode=graph_mode,
        # Its metrics as stock names them (the program's v1 names), where the eager copy's differ.
        metric_names=_tfprivate.keras_compile.v1_metric_names(keras_model) if graph_mode else None,
    )
    if host is not None:
        logger.info("the strategy engine's host part: %s", host.describe())
    return plan
