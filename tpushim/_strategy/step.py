"""One call of the strategy engine (:class:`_Run`): the clone, its optimizer and global step,
built in the strategy's scope, and the ``tf.function`` s that train (up to
``steps_per_execution`` steps a call), evaluate and predict a global batch; around them the
values summed on the host, BatchNormalization over a replica's real rows, and the model's own
summaries left out of the trace."""

import contextlib
import logging
import os
import threading

import tensorflow as tf

from tpushim import _batchnorm, _input_wait, _padding, _tfprivate
from tpushim._strategy import checkpoint as _strategy_checkpoint
from tpushim._strategy.clone import clone
from tpushim._strategy.element import _labels_list, _outputs_list, _unpack, given_parts, known_rows
from tpushim._strategy.loss import _loss_objects, _loss_of, _outs, all_reduce_sum
from tpushim._strategy.summary_walk import FIXED, ROWS, summary_feeds

logger = logging.getLogger("tpushim")

ModeKeys = _tfprivate.estimator.ModeKeys
SUM = tf.distribute.ReduceOp.SUM


@_tfprivate.graph.not_converted
def bind_global_step(step):
    """Makes ``step`` what ``tf.compat.v1.train.get_global_step()`` returns in the
    ``tf.function`` being traced, as the estimator's global step is in stock's model_fn graph: a
    ``tf.compat.v1.train`` optimizer's rate computed from the global step (a callable around
    ``tf.compat.v1.train.exponential_decay``) then steps once per global step."""
    graph = tf.compat.v1.get_default_graph()
    del graph.get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_STEP)[:]
    graph.add_to_collection(tf.compat.v1.GraphKeys.GLOBAL_STEP, step)


@_tfprivate.graph.not_converted
def host_sum(strategy, per_replica):
    """A per-replica value summed on the host, outside the replicas' step: what a
    ``TPUStrategy``'s ``reduce`` does (each core's value copied to the host and added). Another
    strategy's ``reduce`` all-reduces (a MirroredStrategy's: every replica's collective, a
    rendezvous of them all, for one number it then reads on one device); here its values are
    copied and added alike."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return strategy.reduce(SUM, per_replica, axis=None)
    return tf.add_n(list(strategy.experimental_local_results(per_replica)))


@_tfprivate.graph.not_converted
def scalar_weight(element):
    """A replica's weight in the mean of a model's scalar summary: its real rows."""
    features = element[0] if isinstance(element, tuple) else element
    return tf.reduce_sum(tf.cast(features[_padding.PADDING_KEY], tf.float32))


@_tfprivate.graph.not_converted
def real_rows(element, normalized=None):
    """Inside :func:`tpushim._tfprivate.keras.batchnorm_call_hooked`, while a replica's training step
    calls the model: its BatchNormalization layers' batch statistics over the replica's real rows
    (:mod:`tpushim._batchnorm`, as a TPUEstimator shard's; a synchronized layer's summed across
    the replicas), not the padding rows. ``normalized``: a dict given each training layer's
    output (its ref -> the layer's name), which a model's summary of it is fed
    (:func:`tpushim._strategy.summary_walk.summary_feeds`): ops of the engine's own, not the
    ones stock's graph computes it with."""
    features = element[0] if isinstance(element, tuple) else element
    pad = features[_padding.PADDING_KEY]
    call = _batchnorm.real_rows_call(pad, True, all_reduce_sum)
    if normalized is not None and call is not None:  # None: Keras's own call
        own = call

        def call(layer, own_call, inputs, training, mask):
            outputs = own(layer, own_call, inputs, training, mask)
            if tf.is_tensor(outputs) and (
                _tfprivate.keras.batchnorm_training_value(layer, training) is True
            ):
                normalized[outputs.ref()] = layer.name
            return outputs

    return _tfprivate.keras.batchnorm_call_using(call)


def _mask_or_empty(output):
    """An output's Keras mask, or an empty tensor where it has none (a replica's results are
    tensors)."""
    mask = getattr(output, "_keras_mask", None)
    return tf.zeros([0], tf.bool) if mask is None else mask


_SAID_SUMMARIES = set()  # ids of the plans whose model's summaries were said left out (and why)


@contextlib.contextmanager
def model_summaries_left_out(
    plan, on_scalar=lambda name, tensor: True, on_other=lambda kind, name, tensor: True
):
    """Around a trace of the model's call: the ``tf.compat.v1.summary`` ops it makes are left out
    of the step (their string ops no TPU step compiles). A scalar's (name, tensor) goes to
    ``on_scalar``, another's (function, name, tensor) to ``on_other`` (by default taken and
    dropped: stock's evaluation and prediction write none); one they return a reason for (a
    string), which stock writes every save_summary_steps, is said once per conversion with its
    name and why."""
    skipped = set()
    reasons = {}

    def other(kind, name, tensor):
        taken = on_other(kind, name, tensor)
        if isinstance(taken, str):
            reasons[(kind, str(name))] = taken
            return False
        return taken

    with _tfprivate.graph.v1_summaries_skipped(skipped, on_scalar, other):
        yield
    if skipped and id(plan) not in _SAID_SUMMARIES:
        _SAID_SUMMARIES.add(id(plan))
        named = "; ".join(
            f"{kind} {name!r}" + (f" ({reasons[(kind, name)]})" if (kind, name) in reasons else "")
            for kind, name in sorted(skipped)
        )
        logger.warning(
            "tpushim: the model makes summaries itself (tf.compat.v1.summary: %s): the strategy "
            "engine does not write these (stock writes them every save_summary_steps). It "
            "writes a summary whose tensor stock's graph computes from tensors of one row per "
            "example (the global batch's real rows gathered to the host), the model's weights "
            "and constants, computing the rest on the host as stock's graph does. Summarize "
            "such a tensor, or use engine='tpuestimator' where TPUEstimator runs.",
            named,
        )


@_tfprivate.graph.not_converted
def summary_rows(values, pad):
    """A replica's rows of a summarized tensor of one row per example that stock's op sees:
    its real rows (``pad``: its padding weight, 0 on a padding row)."""
    return tf.boolean_mask(values, pad > 0)


def _optimizer(user, step, model, plan):
    """The clone's optimizer as keras_lib's clone makes it, with ``step`` as its iterations,
    set on ``model`` (tracked as ``optimizer``), its slots made: a Keras optimizer from its
    config; a ``tf.compat.v1.train`` one (Keras's ``TFOptimizer``) a fresh copy of the user's,
    wrapped again with ``step`` as its global step (stock reuses the user's object in each new
    graph, where its variables are new; eagerly they would be the last call's)."""
    if isinstance(user, _tfprivate.keras.keras_v1_tf_optimizer_class()):
        inner = _tfprivate.keras_compile.fresh_tf1_optimizer(user.optimizer)
        optimizer = _tfprivate.keras_compile.keras_tf_optimizer(inner, step)
        model.optimizer = optimizer
        # Slots exist before a restore: every value is restored at once.
        _tfprivate.keras_compile.create_tf1_optimizer_slots(inner, model.trainable_variables)
        return optimizer
    optimizer = type(user).from_config(user.get_config())
    optimizer.iterations = step  # as keras_lib binds it
    model.optimizer = optimizer
    # Named as stock's graph names them: checkpoints record the names.
    with _strategy_checkpoint.optimizer_scope(plan):
        _tfprivate.keras_compile.create_optimizer_slots(optimizer, model.trainable_variables)
    return optimizer


class _Run:
    """The clone, its optimizer and global step, built in the strategy's scope for one call."""

    def __init__(self, plan, strategy, mode, model_dir, checkpoint_path=None, features=None):
        self.plan, self.strategy, self.mode = plan, strategy, mode
        with strategy.scope(), tf.keras.utils.custom_object_scope(plan.custom_objects):
            self.model = clone(plan, features)  # features: a subclassed model is built on them
            self.step = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="global_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
            self.optimizer = None
            if features is not None:  # stock's graph builds a subclassed model on them too
                plan.learned.features_spec = features
            if mode == ModeKeys.TRAIN:
                self.optimizer = _optimizer(plan.optimizer, self.step, self.model, plan)
            _tfprivate.estimator.track_estimator_step(self.model, self.step)
        self.terms = _loss_objects(
            plan.keras_model, plan.custom_objects, self.model.output_names, _outs(plan)
        )
        self.checkpoints = _strategy_checkpoint.Checkpoints(
            plan, self.model, plan.name_based_checkpoints, writes=mode == ModeKeys.TRAIN
        )
        self.model_dir = model_dir
        latest = checkpoint_path or tf.train.latest_checkpoint(model_dir)
        if latest:
            # stock's Saver says so at INFO, at every call that reads a checkpoint
            tf.compat.v1.logging.info("Restoring parameters from %s", latest)
            self.checkpoints.read(latest)
        elif mode != ModeKeys.TRAIN and plan.warm_start is None:
            raise ValueError(f"Could not find trained model in model_dir: {model_dir}.")
        elif plan.warm_start is not None:  # as stock evaluates before training: warm-started
            for variable, value in zip(self.model.trainable_variables, plan.warm_start):
                variable.assign(value)
        self.restored = latest

    def save(self, kept, meta=None):
        """Writes ``model.ckpt-STEP`` as stock names it, in stock's format, and lists it in
        ``checkpoint`` as stock's Saver does (``kept``: a :class:`tpushim._stock_hooks.Kept`;
        ``meta``: the bytes of its ``.meta``, or None)."""
        step = int(self.step.numpy())
        tf.compat.v1.logging.info(
            "Saving checkpoints for %d into %s.", step, os.path.join(self.model_dir, "model.ckpt")
        )
        path = self.checkpoints.write(os.path.join(self.model_dir, f"model.ckpt-{step}"), meta)
        kept.saved(path, relative=self.checkpoints.name_based)  # stock's Saver's paths
        return path

    # -- the replica functions ----------------------------------------------------------------
    @_tfprivate.graph.not_converted
    def _loss(self, element, training):
        features, labels, pad, weights = _unpack(element, self.model.output_names)
        loss, outputs = _loss_of(
            self.plan,
            self.terms,
            self.model,
            features,
            labels,
            pad,
            weights,
            training,
            self.strategy.num_replicas_in_sync,
            all_reduce_sum,
            known_rows(element),
        )
        return loss, outputs, labels, pad, weights

    def train_function(self, checked=True):
        """A ``tf.function`` running up to ``n`` steps from ``iterator`` (``checked``: it may hold
        fewer, each step asks; else the caller knows it holds ``n``); returns (steps run,
        each step's global loss: stock's hooks see every step's, :mod:`tpushim._stock_hooks`;
        each step's values of the model's one-number ``tf.compat.v1.summary.scalar`` calls,
        averaged over the replicas weighted by their real rows, in one vector:
        ``self.scalar_count`` a step, known once traced): stock's value of a mean over the
        global batch's rows where each replica's rows are all real or all padding. Then
        ``self.summarized(iterator)``: one step that also returns what the model's v1 summaries
        (scalar, histogram, image, audio, text, tensor) are computed from, gathered to the
        host, where a copy of stock's graph computes each one's tensor over the global batch
        and stock's op summarizes it (TPUEstimator's host_call)."""
        recording = threading.local()  # a replica's scalars, in its own thread
        self.scalar_count = 0
        self.summary_hows = None  # the model's summaries: (function, feeds or why), once traced

        def frontier(kind, tensor):
            """Records the summary's feeds (:func:`summary_feeds`) on a summarized step; a
            reason it cannot be computed, or None."""
            others = getattr(recording, "others", None)
            if others is None:
                return None
            ops = _strategy_checkpoint.stock_summaries(self.plan)
            index = len(others)
            op = ops[index] if index < len(ops) else None
            if op is None or _tfprivate.checkpoint.SUMMARY_OPS[op.type] != kind:
                how = "not made in stock's graph in this order"
            else:
                how = summary_feeds(tensor, recording.element, op.inputs[1], recording.normalized)
            others.append((kind, how))
            return how if isinstance(how, str) else None

        def on_scalar(name, tensor):
            values = getattr(recording, "values", None)
            if values is None or tensor is None or tensor.shape.num_elements() != 1:
                return False
            values.append(tf.reshape(tf.cast(tensor, tf.float32), []))
            frontier("scalar", tensor)  # left out: the replicas' weighted mean is written
            return True

        def on_other(kind, name, tensor):
            if getattr(recording, "others", None) is None:  # not a summarized step: dropped
                return True
            if tensor is not None and not isinstance(tensor, tf.Tensor):
                tensor = tf.convert_to_tensor(tensor)  # a variable read here, as stock's op
            why = frontier(kind, tensor)
            return True if why is None else why  # a reason: said, left out

        def replica_step(element, summarized):
            recording.values = []
            recording.others, recording.element = ([] if summarized else None), element
            recording.normalized = {}
            try:
                with tf.GradientTape() as tape, real_rows(element, recording.normalized):
                    loss = self._loss(element, True)[0]
            finally:
                scalars, recording.values = recording.values, None
                others, recording.others, recording.element = recording.others, None, None
                recording.normalized = None
            self.scalar_count = len(scalars)  # (here: an attribute set in the loop is a tensor)
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
            rows = scalar_weight(element)
            # A replica of padding rows only weighs nothing (its value may be NaN).
            weighted = [tf.where(rows > 0, v * rows, 0.0) for v in scalars]
            if not summarized:
                return loss, weighted, rows
            self.summary_hows = others
            pad = _unpack(element, self.model.output_names)[2]
            # What the host is given: each summary's replica tensors (weights read before the
            # update above: the gradient's reads come first), as feeds in order.
            values = [
                fed[2]
                for _, how in others
                if not isinstance(how, str)
                for fed in how
                if fed[1] in (ROWS, FIXED)
            ]
            return loss, weighted, rows, values, pad

        def gathered(kind, values, pad):
            """A fed tensor on the host: stock's value over the global batch."""
            if kind == ROWS:  # the replicas' real rows, in replica order
                pads = self.strategy.experimental_local_results(pad)
                parts = self.strategy.experimental_local_results(values)
                return tf.concat([summary_rows(v, p) for v, p in zip(parts, pads)], 0)
            return self.strategy.experimental_local_results(values)[0]  # FIXED

        @_tfprivate.graph.not_converted
        def step(element, ran, losses, scalars, summarized=False):
            bind_global_step(self.step)
            hooked = _tfprivate.keras.batchnorm_call_hooked()  # at the trace
            with hooked, model_summaries_left_out(self.plan, on_scalar, on_other):
                loss, values, rows, *other = self.strategy.run(
                    replica_step, args=(element, summarized)
                )
            losses = losses.write(tf.cast(ran, tf.int32), host_sum(self.strategy, loss))
            real = host_sum(self.strategy, rows) if values else None
            for k, value in enumerate(values):
                mean = host_sum(self.strategy, value) / real
                scalars = scalars.write(tf.cast(ran, tf.int32) * len(values) + k, mean)
            if summarized:
                tensors, pad = other
                kinds = [
                    fed[1]
                    for _, how in self.summary_hows
                    if not isinstance(how, str)
                    for fed in how
                    if fed[1] in (ROWS, FIXED)
                ]
                other = [gathered(kind, t, pad) for kind, t in zip(kinds, tensors)]
                return ran + 1, losses, scalars, other
            return ran + 1, losses, scalars

        @_tfprivate.graph.not_converted
        def start():
            ran = tf.constant(0, tf.int64)
            losses, scalars = (
                tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=[])
                for _ in range(2)
            )  # their shape known: a call that finds the input exhausted stacks none
            return ran, losses, scalars

        @tf.function
        def run_checked(iterator, n):  # each step asks whether a batch is left
            ran, losses, scalars = start()
            for _ in tf.range(n):
                optional = _input_wait.next_input(iterator)  # timed (the run summary)
                if not optional.has_value():
                    break
                ran, losses, scalars = step(optional.get_value(), ran, losses, scalars)
            return ran, losses.stack(), scalars.stack()

        @tf.function
        def run(iterator, n):  # the caller knows that n batches are left
            ran, losses, scalars = start()
            for _ in tf.range(n):
                element = _input_wait.next_input(iterator, checked=False)  # timed
                ran, losses, scalars = step(element, ran, losses, scalars)
            return ran, losses.stack(), scalars.stack()

        @tf.function
        def run_summarized(element):  # one step, the model's other summaries' values out
            ran, losses, scalars = start()
            ran, losses, scalars, other = step(element, ran, losses, scalars, True)
            return ran, losses.stack(), scalars.stack(), other

        def summarized(iterator):
            """One step (none where the input ran out), as the loops' ``(ran, losses,
            scalars)``, then the values the host is given for the model's summaries (numpy), in
            the order of ``self.summary_hows`` (each summary's function and feeds, or why not)."""
            _strategy_checkpoint.stock_summaries(self.plan)  # built before the trace reads it
            if checked:
                optional = _input_wait.next_input(iterator)
                if not bool(optional.has_value()):
                    empty = tf.zeros([0])
                    return tf.constant(0, tf.int64), empty, empty, None
                element = optional.get_value()
            else:
                element = _input_wait.next_input(iterator, checked=False)
            ran, losses, scalars, other = run_summarized(element)
            return ran, losses, scalars, [v.numpy() for v in other]

        self.summarized = summarized
        return run_checked if checked else run

    def eval_function(self, parts=None):
        """A ``tf.function`` of one global batch: (global loss, per replica (outputs, labels,
        padding weight, sample weights, masks)); an output without a mask has an empty one.
        ``parts``: {``features`` or ``labels``: positions}: per replica also those of the
        tensors the input gave (``tf.nest.flatten`` order), for the metric_fns
        ``tf.estimator.add_metrics`` added (:mod:`tpushim._added_metrics`)."""

        def replica_step(element):
            loss, outputs, labels, pad, weights = self._loss(element, False)
            given = {p: tf.nest.flatten(v) for p, v in given_parts(element).items()}
            labels = _labels_list(labels, self.model.output_names)
            masks = [_mask_or_empty(o) for o in outputs]
            weights = [
                tf.ones_like(pad) if w is None else w for w in weights or [None] * len(outputs)
            ]
            # What Keras's crossentropy metrics read besides the values (known at the trace).
            read = [_tfprivate.keras_compile.output_logits(o) for o in outputs]
            self.logits_how = [how for how, _ in read]
            logits = [tf.zeros([0]) if how is None else lg for how, lg in read]
            if parts is not None:
                chosen = {p: [given[p][i] for i in positions] for p, positions in parts.items()}
                return loss, outputs, labels, pad, weights, masks, logits, chosen
            return loss, outputs, labels, pad, weights, masks, logits

        @tf.function
        def run(element):
            with model_summaries_left_out(self.plan):  # at the trace
                loss, *rest = self.strategy.run(replica_step, args=(element,))
            return (host_sum(self.strategy, loss), *rest)

        return run

    def predict_function(self):
        def replica_step(element):
            features, _, pad, _ = _unpack(element, self.model.output_names)
            outputs = _tfprivate.keras.call_as_stock(self.model, features, False)
            return _outputs_list(outputs), pad

        @tf.function
        def run(element):
            with model_summaries_left_out(self.plan):  # at the trace
                return self.strategy.run(replica_step, args=(element,))

        return run

    def gathered(self, per_replica):
        """The replicas' values, concatenated in replica order (the global batch's rows)."""
        return tf.nest.map_structure(
            lambda *parts: tf.concat(parts, 0),
            *self.strategy.experimental_local_results(per_replica),
        )
