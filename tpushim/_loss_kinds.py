"""How each term of a model's training loss grows with the batch: what a TPU needs to know to
train on shards of the global batch exactly as stock trains on the whole of it.

A term's kind is a :class:`LossKind` value, one of:

* ``ROWS``: an output's loss function returns one value per example (Keras then reduces them by
  the loss's ``reduction``); each row's value depends on that row alone.
* a :class:`Degree` ``p``: the term is one number for the batch, ``T(n rows) = n**(p-1) * sum of
  per-row values``: a mean (``MEAN``, ``p = 0``; also any term that ignores the batch, e.g. a
  weight regularizer), a sum (``SUM``, ``p = 1``), a mean divided by the batch size again
  (``p = -1``, Keras's activity regularizer around a mean-valued regularizer), ...
* ``CONSTANT``: an output's loss that reads neither labels nor predictions (e.g.
  ``lambda y_true, y_pred: tf.constant(0.0)``): no gradient, the same value on every split.
* ``UNWEIGHTED``: an output whose ``loss_weights`` entry is 0: it adds nothing to the loss or
  its gradient, whatever its kind, so it is neither evaluated nor refused.

Each kind carries the arithmetic the sites that compute with it need (the TPUEstimator path's
shard and evaluation losses, the strategy engine's replica loss, a term from its rows' values),
so no site compares kinds, and a kind that lacks an operation cannot be made. The module is one
concern, a term's kind: the values and how a model's terms are told apart.

Built-in Keras losses and regularizers are known; anything else is told apart without the
user's data: evaluated on synthetic rows of the model's shapes and dtypes, once on 8 rows and
once on each of their parts of 1, 3 and 4 rows. A term whose value is neither (e.g. batch
statistics, rows compared with one another) cannot be split across TPU cores: the conversion
refuses it before anything is written (:class:`LossSplitError`) and the preflight reports it.
"""

import abc
import dataclasses
import weakref

import numpy as np
import tensorflow as tf

from tpushim import _tfprivate
from tpushim._errors import ConversionError

_PARTS = (slice(0, 1), slice(1, 4), slice(4, 8))
_ROWS = 8
_DRAWS = 3
_RTOL = 1e-4


# --- the kinds, and the arithmetic each site does with one --------------------------------------


class LossKind(abc.ABC):
    """How a term of the training loss grows with the batch, with what every site that computes
    with a term needs of its kind: the sites call these methods and never compare kinds.

    The kinds are the members below (:data:`KINDS`); every one implements every method, so a
    kind that lacks one cannot be made (its member fails at import), and an operation a site
    needs is added here, for every kind at once.
    """

    __slots__ = ()

    @abc.abstractmethod
    def term(self, per_example, one_number):
        """This kind's term of an output's loss, made by the site's own functions:
        ``per_example()`` where the loss gives one value per example, ``one_number(degree,
        per_row)`` where it is one number for the batch (``degree`` a :class:`Degree`;
        ``per_row``: on a padded batch, evaluated on each real row alone); None where the term
        adds nothing (nothing is computed).

        Sites: a TPU shard's and a strategy replica's training loss
        (:func:`tpushim._losses.shard_loss`), the TPUEstimator path's evaluation loss over a
        padded batch or over shards (:func:`tpushim._padding.eval_loss`).
        """

    @abc.abstractmethod
    def averages_over_shards(self, mean=True, masked=False, weighted=False):
        """Whether Keras's own value of this term on each of equal shards of a batch averages,
        over the shards, to the batch's own (where every term's does, a shard of a full batch
        trains on Keras's own loss: :func:`tpushim._losses.training_loss`).

        Args:
          mean: the loss's reduction is a mean (``SUM_OVER_BATCH_SIZE``), not a sum.
          masked: a Keras mask weighs its elements.
          weighted: sample weights weigh it.
        """

    @abc.abstractmethod
    def reads_rows(self):
        """Whether the term is computed from the batch's rows, so that the shape of its labels
        can change its value: [batch] labels of a [batch, 1] output, which Keras squeezes the
        output for (the strategy engine's :func:`tpushim._strategy.loss.row_label_term`)."""

    def __repr__(self):
        return type(self).__name__.lstrip("_").upper()


@dataclasses.dataclass(frozen=True, repr=False)
class _Rows(LossKind):
    """The loss function returns one value per example, each row's from that row alone; Keras
    reduces them by the loss's ``reduction``."""

    def term(self, per_example, one_number):
        return per_example()

    def averages_over_shards(self, mean=True, masked=False, weighted=False):
        return mean and not masked  # a mean over the shard's rows, weights included

    def reads_rows(self):
        return True


@dataclasses.dataclass(frozen=True, repr=False)
class Degree(LossKind):
    """One number for the batch, ``T(n rows) = n**(p - 1) * (the sum of its rows' values)``,
    each row's value that of a batch of that row alone: a mean (``p = 0``; also a term that
    ignores the batch, e.g. a weight regularizer), a sum (``p = 1``), a mean divided by the
    batch size again (``p = -1``), ... Also the kind of a loss a layer adds from its inputs.

    Attributes:
      p: the degree.
    """

    p: int

    def term(self, per_example, one_number):
        return one_number(self, True)

    def averages_over_shards(self, mean=True, masked=False, weighted=False):
        # A mean of the shard's rows, unweighted: the shards' mean is the batch's mean. Any other
        # degree's value on a shard is off by a power of the shards.
        return self.p == 0 and mean and not masked and not weighted

    def reads_rows(self):
        return True

    def shard_factor(self, shards):
        """``shards**p``: a shard's value times it, averaged over equal shards, is the batch's."""
        return float(shards) ** self.p

    def of_rows(self, total, rows):
        """The term on ``rows`` rows from ``total``, the sum of their rows' values."""
        return total if self.p == 1 else total * rows ** float(self.p - 1)

    def of_rows_inverse(self, total, inverse_rows):
        """As :meth:`of_rows`, given ``1 / rows`` (0 where there are no rows: the term is 0)."""
        return total if self.p == 1 else total * inverse_rows ** float(1 - self.p)

    def __repr__(self):
        return f"Degree({self.p})"


@dataclasses.dataclass(frozen=True, repr=False)
class _Constant(LossKind):
    """An output's loss that reads neither labels nor predictions (e.g. ``lambda y_true,
    y_pred: tf.constant(0.0)``): no gradient, the same value on every split of the batch."""

    def term(self, per_example, one_number):
        return one_number(MEAN, False)  # the same on the real rows as on the padded batch

    def averages_over_shards(self, mean=True, masked=False, weighted=False):
        return MEAN.averages_over_shards(mean, masked, weighted)

    def reads_rows(self):
        return False


@dataclasses.dataclass(frozen=True, repr=False)
class _Unweighted(LossKind):
    """An output whose ``loss_weights`` entry is 0: it adds nothing to the loss or its gradient,
    whatever its loss, so it is neither evaluated nor refused."""

    def term(self, per_example, one_number):
        return None

    def averages_over_shards(self, mean=True, masked=False, weighted=False):
        return True  # nothing, on every shard

    def reads_rows(self):
        return False

    def __repr__(self):
        return "UNWEIGHTED"


ROWS = _Rows()
CONSTANT = _Constant()
UNWEIGHTED = _Unweighted()
MEAN, SUM = Degree(0), Degree(1)
DEGREES = (MEAN, SUM, Degree(-1), Degree(2))  # mean, sum, mean / batch, sum * batch
#: Every kind of term: the test of the kinds checks each against every site's operations.
KINDS = (ROWS, *DEGREES, CONSTANT, UNWEIGHTED)


class LossSplitError(ConversionError):
    """A loss term cannot be computed per TPU core and combined into the global batch's.

    Attributes:
      where: the term (``"loss of output 'y'"``, ``"loss added by layer 'l'"``).
      problem, fix: what is wrong, and what to do.
    """

    def __init__(self, where, problem, fix):
        super().__init__(f"tpushim cannot train the {where} on a TPU: {problem}. Fix: {fix}")
        self.where, self.problem, self.fix = where, problem, fix


_SPLIT = (
    "on a TPU each core computes the loss on its slice of the global batch, and only sums and "
    "means of per-example values add up to the global batch's loss"
)
_FIX_FUNCTION = (
    "compute it from per-example values only: return one value per example, or their "
    "tf.reduce_mean / tf.reduce_sum"
)
_FIX_LABELS_ONLY = (
    "give its output loss_weights 0 or loss None (it reads the labels but not the predictions, "
    "so it changes no weight, but the loss the step reports includes its value), or "
    + _FIX_FUNCTION
)


@dataclasses.dataclass(frozen=True)
class LossPlan:
    """The kind of every term of a model's training loss.

    Attributes:
      outputs: output name -> its :class:`LossKind` (an output without a loss is absent).
      added: (layer name, index in its input losses) -> :class:`Degree`, for the losses a layer
        adds from its inputs; absent: ``MEAN``. None: not known yet (a subclassed model's
        outputs and losses exist once it is called: :func:`plan_subclassed`, in the model_fn).
      output_specs: a subclassed model's output name -> ``tf.TensorSpec`` of that output (batch
        size None), from :func:`plan_subclassed`'s call; None for a graph network (its own
        ``outputs``).
    """

    outputs: dict
    added: dict = None
    output_specs: dict = None


# --- what is known without evaluating anything ------------------------------------------------


def _is_builtin_loss(loss_fn):
    modules = _tfprivate.keras_compile.keras_loss_modules()
    if type(loss_fn).__module__ not in modules:
        return False
    if isinstance(loss_fn, _tfprivate.keras_compile.loss_function_wrapper_class()):
        return getattr(loss_fn.fn, "__module__", None) in modules
    return True


def _builtin_activity_regularizer(layer):
    regularizer = layer.activity_regularizer
    # Keras adds regularizer(output) / batch size: a mean over rows for these sums over rows.
    builtin = (tf.keras.regularizers.L1, tf.keras.regularizers.L2, tf.keras.regularizers.L1L2)
    return type(regularizer) in builtin


def _known_mean(layer):
    """A layer whose input losses are all its built-in activity regularizer's (degree 0)."""
    return (
        type(layer).__module__.startswith("keras.")
        and not isinstance(layer, (tf.keras.Model, _tfprivate.keras_compile.add_loss_layer_class()))
        and _builtin_activity_regularizer(layer)
    )


# --- evaluation on synthetic rows ---------------------------------------------------------------


def _synthetic(shape, dtype, rows, draw, rng, classes=None):
    """``rows`` rows shaped ``shape`` (batch dimension first, unknown sizes 2) for ``draw``."""
    shape = [rows] + [2 if d is None else d for d in list(shape)[1:]]
    dtype = tf.as_dtype(dtype)
    if classes is not None or dtype.is_integer:
        return rng.randint(0, classes or 2, size=shape).astype(dtype.as_numpy_dtype)
    if dtype.is_bool:
        return rng.rand(*shape) > 0.5
    if dtype == tf.string:
        return rng.choice(np.array([b"a", b"b"], dtype=object), size=shape)
    values = (rng.uniform(0.05, 0.95, shape), rng.normal(0, 1, shape), rng.uniform(-2, 2, shape))
    return values[draw % 3].astype(dtype.as_numpy_dtype)


def _close(a, b):
    scale = max(1.0, float(np.max(np.abs(a))), float(np.max(np.abs(b))))
    return np.allclose(a, b, rtol=_RTOL, atol=1e-6 * scale)


def _kind(full, parts):
    """``ROWS``, a :class:`Degree`, ``"unsplittable"`` (with why) or None (this draw cannot tell).

    Args:
      full: the term on 8 rows; parts: on each of ``_PARTS``.
    """
    values = [full, *parts]
    if not all(np.all(np.isfinite(v)) for v in values):
        return None, "non-finite values"
    sizes = [s.stop - s.start for s in _PARTS]
    if (
        full.ndim
        and full.shape[0] == _ROWS
        and all(p.ndim and p.shape[0] == n for p, n in zip(parts, sizes))
    ):
        if all(_close(full[s], p) for s, p in zip(_PARTS, parts)):
            return ROWS, None
        return "unsplittable", "the value it gives each example depends on the other examples"
    if any(p.shape != full.shape for p in parts):
        return "unsplittable", f"its shape changes with the batch ({full.shape} on 8 rows)"
    fits = [
        degree
        for degree in DEGREES
        if _close(
            full,
            float(_ROWS) ** (degree.p - 1)
            * sum(float(n) ** (1 - degree.p) * p for n, p in zip(sizes, parts)),
        )
    ]
    if len(fits) == 1:
        return fits[0], None
    if fits:
        return None, "values that fit more than one kind (e.g. all zero)"
    return "unsplittable", "its value is neither a sum nor a mean over the examples"


_TRACE_LINES = ("Graph execution error", "Detected at node", "File ", "Node:", "[[", "Original")


def _what_went_wrong(error):
    """The line of an error that says what went wrong (not TensorFlow's trace around it)."""
    lines = [line.strip() for line in str(error).splitlines()]
    said = [line for line in lines if line and not line.startswith(_TRACE_LINES)]
    return said[-1] if isinstance(error, tf.errors.OpError) and said else (said or [""])[0]


def _classify(where, evaluate, fix):
    """Runs ``evaluate(draw) -> (full, parts)`` over the draws until one tells the kind."""
    failures = []
    for draw in range(_DRAWS):
        try:
            full, parts = evaluate(draw)
        except Exception as e:  # a user's function on synthetic rows: anything may go wrong
            failures.append(f"{type(e).__name__}: {_what_went_wrong(e)}")
            continue
        kind, why = _kind(np.asarray(full), [np.asarray(p) for p in parts])
        if kind == "unsplittable":
            raise LossSplitError(where, f"{why}; {_SPLIT}", fix)
        if kind is not None:
            return kind
        failures.append(why)
    raise LossSplitError(
        where,
        f"tpushim could not tell whether it is a sum or a mean over the examples: on synthetic "
        f"rows of the model's shapes it gave {'; '.join(dict.fromkeys(failures))}",
        f"{fix}; it must accept rows of the model's shapes and dtypes (labels shaped like the "
        f"output, or integer class ids)",
    )


def _label_forms(output_shape, output_dtype):
    """Label shapes/dtypes a custom loss may expect: like the output, or integer class ids."""
    classes = output_shape[-1] if len(output_shape) > 1 and output_shape[-1] else 2
    rank_less = list(output_shape[:-1]) if len(output_shape) > 1 else list(output_shape)
    return [
        (list(output_shape), output_dtype, None),
        (rank_less + [1], tf.int64, classes),
        (rank_less, tf.int64, classes),
    ]


def _placeholders(shape, dtype, output_shape, output_dtype):
    return (
        tf.compat.v1.placeholder(tf.as_dtype(dtype), [None] + list(shape[1:])),
        tf.compat.v1.placeholder(tf.as_dtype(output_dtype), [None] + list(output_shape[1:])),
    )


def _reads(loss_fn, output_shape, output_dtype):
    """(whether the loss reads its labels, whether it reads the predictions), from its graph on
    the first form of labels it accepts; None if it accepts none (the evaluation then says why)."""
    for shape, dtype, _ in _label_forms(output_shape, output_dtype):
        try:
            with tf.Graph().as_default():
                t, p = _placeholders(shape, dtype, output_shape, output_dtype)
                values = tf.nest.flatten(loss_fn.call(t, p))
                reached = [_tfprivate.graph.reachable_from([x], values) for x in (t, p)]
                return tuple(any(v in r for v in values) for r in reached)
        except Exception:  # a user's function: try the next form of labels
            continue
    return None


def _output_evaluator(loss_fn, output_shape, output_dtype):
    def evaluate(draw):
        rng = np.random.RandomState(draw)
        y_pred = _synthetic(output_shape, output_dtype, _ROWS, draw, rng)
        errors = []
        for shape, dtype, classes in _label_forms(output_shape, output_dtype):
            y_true = _synthetic(shape, dtype, _ROWS, draw, rng, classes)
            try:
                with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
                    t, p = _placeholders(shape, dtype, output_shape, output_dtype)
                    value = loss_fn.call(t, p)
                    out = [
                        sess.run(value, {t: y_true[rows], p: y_pred[rows]})
                        for rows in (slice(0, _ROWS), *_PARTS)
                    ]
                return out[0], out[1:]
            except Exception as e:  # try the next form of labels
                errors.append(e)
        raise errors[0]

    return evaluate


_row_label_kinds = weakref.WeakKeyDictionary()  # loss function -> its kind on [batch] labels


def row_label_kind(where, loss_fn, output_shape, output_dtype):
    """The :class:`Degree` of an output's loss given [batch] labels for its [batch, 1] output, where it
    is one number for the batch: Keras squeezes the output to [batch] first, so a loss that
    reduces the last axis (``mse``, ``binary_crossentropy``) reduces the batch itself, whatever
    the loss's reduction (a SUM loss's sum of one number is that number: a mean over the rows,
    degree 0; a loss summing the last axis, ``kl_divergence``, sums the rows, degree 1).
    Evaluated eagerly on synthetic rows, once per loss function.

    Raises:
      LossSplitError: neither a sum nor a mean over the rows (e.g. ``cosine_similarity``).
    """
    if loss_fn in _row_label_kinds:
        return _row_label_kinds[loss_fn]
    output_shape = list(output_shape)

    def evaluate(draw):
        rng = np.random.RandomState(draw)
        y_pred = _synthetic(output_shape, output_dtype, _ROWS, draw, rng)
        y_true = _synthetic(output_shape[:-1], output_dtype, _ROWS, draw, rng)
        parts = [(y_true[rows], y_pred[rows]) for rows in (slice(0, _ROWS), *_PARTS)]
        with tf.init_scope():  # eager, also while a step is traced (the strategy engine)
            eager = tf.executing_eagerly()
            if eager:
                out = [np.asarray(loss_fn.call(tf.constant(t), tf.constant(p))) for t, p in parts]
        if not eager:  # in a model_fn's graph (the TPUEstimator path): a graph of its own
            with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
                t = tf.compat.v1.placeholder(y_true.dtype, [None])
                p = tf.compat.v1.placeholder(y_pred.dtype, [None, *y_pred.shape[1:]])
                value = loss_fn.call(t, p)
                out = [sess.run(value, {t: a, p: b}) for a, b in parts]
        return out[0], out[1:]

    fix = (
        "give the labels the output's shape, [batch, 1] (labels[:, None] in the input_fn), "
        "which Keras reads one loss per example, or " + _FIX_FUNCTION
    )
    kind = _classify(f"{where} on [batch] labels for its [batch, 1] output", evaluate, fix)
    _row_label_kinds[loss_fn] = kind
    return kind


def _zero_weighted(weight):
    """Whether a ``loss_weights`` entry is a plain 0 (a variable may change: it is not)."""
    return isinstance(weight, (int, float, np.number)) and float(weight) == 0.0


def output_loss_weights(loss_weights, names):
    """output name -> its ``compile(loss_weights=...)`` entry (a dict, a list or None; 1.0 where
    absent, as Keras)."""
    if isinstance(loss_weights, dict):
        return {name: loss_weights.get(name, 1.0) for name in names}
    if isinstance(loss_weights, (list, tuple)) and len(loss_weights) == len(names):
        return dict(zip(names, loss_weights))
    return {name: 1.0 for name in names}


def classify_outputs(names, loss_fns, shapes, dtypes, loss_weights=None):
    """output name -> kind for every output with a loss (None: no loss)."""
    weights = output_loss_weights(loss_weights, names)
    kinds = {}
    for name, loss_fn, shape, dtype in zip(names, loss_fns, shapes, dtypes):
        if loss_fn is None:
            continue
        if _zero_weighted(weights[name]):
            kinds[name] = UNWEIGHTED
        elif getattr(loss_fn, "reduction", None) == tf.keras.losses.Reduction.NONE:
            kinds[name] = ROWS  # refused, with stock's reason, when training is built
        elif _is_builtin_loss(loss_fn):
            kinds[name] = ROWS
        else:
            reads = _reads(loss_fn, list(shape), dtype)
            if reads == (False, False):
                kinds[name] = CONSTANT
                continue
            where = f"loss of output {name!r} ({getattr(loss_fn, 'name', type(loss_fn).__name__)})"
            fix = _FIX_LABELS_ONLY if reads == (True, False) else _FIX_FUNCTION
            kinds[name] = _classify(where, _output_evaluator(loss_fn, list(shape), dtype), fix)
    return kinds


def _layer_terms(layers):
    """[(key, layer, index)] for every loss a layer adds from its inputs."""
    return [
        ((layer.name, i), layer, i)
        for layer in layers
        for i, _ in enumerate(_tfprivate.keras_compile.layer_input_losses(layer))
    ]


def _scratch_clone(keras_model, custom_objects, features):
    """(clone, the placeholders it is fed through): on the model's own inputs, or (a subclassed
    model) on placeholders shaped like ``features`` with any batch size."""
    with tf.keras.utils.custom_object_scope(custom_objects or {}):
        if features is None:
            clone = _tfprivate.keras.clone_for_inspection(keras_model, custom_objects)
            return clone, list(clone.inputs)
        placeholders = tf.nest.map_structure(
            lambda t: tf.compat.v1.placeholder(t.dtype, [None] + t.shape.as_list()[1:]), features
        )
        inputs, _, _ = _tfprivate.estimator.convert_estimator_io_to_keras(
            keras_model, placeholders, None
        )
        clone = _tfprivate.keras.clone_for_inspection(keras_model, custom_objects, inputs)
        return clone, tf.nest.flatten(placeholders)


def classify_added(keras_model, custom_objects, features=None):
    """(layer name, index) -> :class:`Degree` of every loss a layer adds from its inputs, evaluated on a
    clone in a scratch graph (a subclassed model: on placeholders shaped like ``features``; the
    caller restores the model, which Keras resets in place to clone it)."""
    if features is None and all(
        _known_mean(layer) for _, layer, _ in _layer_terms(_tfprivate.keras.all_layers(keras_model))
    ):
        return {}
    with (
        _tfprivate.keras.keras_classes_kept(keras_model),
        tf.Graph().as_default() as graph,
        tf.compat.v1.Session(graph=graph) as sess,
    ):
        clone, inputs = _scratch_clone(keras_model, custom_objects, features)
        terms = {
            key: _tfprivate.keras_compile.layer_input_losses(layer)[i]
            for key, layer, i in _layer_terms(_tfprivate.keras.all_layers(clone))
            if not _known_mean(layer)
        }
        if not terms:
            return {}
        reachable = _tfprivate.graph.reachable_from(inputs, list(terms.values()))
        degrees = {key: MEAN for key, t in terms.items() if t not in reachable}  # batch-free
        terms = {key: t for key, t in terms.items() if key not in degrees}
        floats = [v for v in clone.weights if v.dtype.base_dtype.is_floating]
        reinit = tf.group(
            [v.assign(tf.random.normal(tf.shape(v), stddev=0.5, dtype=v.dtype)) for v in floats]
        )
        sess.run(
            [
                tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.local_variables_initializer(),
                tf.compat.v1.tables_initializer(),
            ]
        )
        values = {}  # draw -> {key: (full, parts)}, or the exception the model raised

        def evaluate_all(draw):
            if draw not in values:
                if draw == _DRAWS - 1:
                    sess.run(reinit)  # e.g. zero-initialised kernels hide what a term does
                rng = np.random.RandomState(100 + draw)
                batch = [_synthetic(i.shape, i.dtype, _ROWS, draw, rng) for i in inputs]
                try:
                    runs = [
                        sess.run(terms, {i: b[rows] for i, b in zip(inputs, batch)})
                        for rows in (slice(0, _ROWS), *_PARTS)
                    ]
                    values[draw] = {k: (runs[0][k], [r[k] for r in runs[1:]]) for k in terms}
                except Exception as e:  # the model on synthetic rows
                    values[draw] = e
            if isinstance(values[draw], Exception):
                raise values[draw]
            return values[draw]

        fix = (
            "make the added loss (model.add_loss, activity_regularizer) a mean or a sum over "
            "the examples, or drop it"
        )
        for key in terms:
            degrees[key] = _classify(
                f"loss added by layer {key[0]!r}", lambda draw, k=key: evaluate_all(draw)[k], fix
            )
        return degrees


def _output_specs(model, custom_objects, compiled=None):
    """(names, loss functions, shapes, dtypes, loss weights) of ``model``'s outputs, with the
    losses and weights ``compiled`` (default: ``model``) was compiled with."""
    names = model.output_names
    args = _tfprivate.keras.compile_args(compiled or model)
    with tf.keras.utils.custom_object_scope(custom_objects or {}):
        loss_fns = _tfprivate.keras_compile.prepare_loss_functions(args.get("loss"), names)
    return (
        names,
        loss_fns,
        [o.shape.as_list() for o in model.outputs],
        [o.dtype for o in model.outputs],
        args.get("loss_weights"),
    )


def plan_subclassed(keras_model, custom_objects, features):
    """The :class:`LossPlan` of a subclassed model, whose outputs and losses exist only once it
    is called: from a scratch clone on placeholders shaped like ``features`` (the model_fn's)."""
    with (
        _tfprivate.keras.keras_random_state_kept(),
        _tfprivate.keras.keras_classes_kept(keras_model),
        tf.Graph().as_default(),
    ):
        try:
            clone, _ = _scratch_clone(keras_model, custom_objects, features)
            names, loss_fns, shapes, dtypes, weights = _output_specs(
                clone, custom_objects, keras_model
            )
            outputs = classify_outputs(names, loss_fns, shapes, dtypes, weights)
            specs = {n: tf.TensorSpec([None, *s[1:]], d) for n, s, d in zip(names, shapes, dtypes)}
        finally:
            _tfprivate.keras.restore_subclassed_model_state(keras_model)
    with _tfprivate.keras.keras_random_state_kept():
        try:
            added = classify_added(keras_model, custom_objects, features)
        finally:
            _tfprivate.keras.restore_subclassed_model_state(keras_model)
    return LossPlan(outputs=outputs, added=added, output_specs=specs)


# --- the plan, once per compiled model ---------------------------------------------------------

_plans = weakref.WeakKeyDictionary()  # keras model -> (what it was planned from, LossPlan)


def _planned_from(keras_model):
    args = _tfprivate.keras.compile_args(keras_model)
    return (
        id(args.get("loss")),
        id(args.get("loss_weights")),
        tuple(id(layer) for layer in keras_model.layers),
    )


def plan(keras_model, custom_objects=None):
    """The :class:`LossPlan` of a compiled model, made once per compilation.

    Raises:
      LossSplitError: a term cannot be split across TPU cores, or tpushim cannot tell.
    """
    key = _planned_from(keras_model)
    cached = _plans.get(keras_model)
    if cached is not None and cached[0] == key:
        return cached[1]
    if not keras_model.outputs:  # a subclassed model: its outputs exist once it is called
        result = LossPlan(outputs={}, added=None)
    else:
        outputs = classify_outputs(*_output_specs(keras_model, custom_objects))
        with _tfprivate.keras.keras_random_state_kept():
            added = classify_added(keras_model, custom_objects)
        result = LossPlan(outputs=outputs, added=added)
    _plans[keras_model] = (key, result)
    return result


def check(keras_model, custom_objects=None):
    """The conversion's check (:data:`tpushim._validation.VALIDATION_STEPS`): plans the loss,
    raising :class:`LossSplitError` for a term a TPU cannot split."""
    return plan(keras_model, custom_objects)


def input_losses_beside_batchnorm(keras_model):
    """(layers that add a loss in their call from their inputs -- ``add_loss``, not an activity
    regularizer's --, BatchNormalization layers), by name: the JAX engine, which evaluates such a
    loss on each example alone, refuses it where BatchNormalization would normalise by that
    example (the strategy engine replays each example's row of the batch's normalisation)."""
    adding = [
        layer.name
        for layer in _tfprivate.keras.all_layers(keras_model)
        if len(_tfprivate.keras_compile.layer_input_losses(layer))
        > _tfprivate.keras_compile.activity_loss_count(layer)
    ]
    normalizing = [
        layer.name
        for layer in _tfprivate.keras.all_layers(keras_model)
        if isinstance(layer, _tfprivate.keras.batchnorm_base_class())
    ]
    return adding, normalizing
