"""The JAX training step: ``jax.value_and_grad`` of the converted loss (:mod:`._trace`), the
optimizer's update (:mod:`._optimizers`) and the moving statistics, jitted once per batch shape,
data parallel over every local device.

Data parallel as TPUEstimator splits the global batch: ``jax.sharding`` places equal shares of
each global batch on the devices of a one-axis mesh (``data``) and the weights and optimizer
state on every device; the step is written on the global batch, so the loss's mean over the real
rows, BatchNormalization's statistics and the gradient's sum over the devices' rows are the
global batch's, and XLA inserts the all-reduces. A short last batch is padded to the global batch
with rows of zeros weighted 0 (``pad``), which the loss and the statistics leave out; a global
batch the devices do not divide is padded so to their next multiple, as TPUEstimator pads it.
A call whose batches are all full runs a second compiled step, without the padding weight's
arithmetic (:data:`FULL_STEP`): the same numbers, 4-8% more steps/s on a BatchNormalization CNN.
A weight the model only gathers rows of (an ``Embedding``'s) is updated as stock's sparse gradient updates it, where the optimizer's
sparse update differs from its dense one: the rows the batch's real rows look up alone
(:mod:`._sparse`).

``iterations_per_loop`` steps run in one call of :meth:`Trainer.train` (hooks, logging and
checkpoints fall between calls, as TPUEstimator's loop on the device), as one compiled
``jax.lax.scan`` over that many global batches stacked; but on XLA CPU devices (``--mode cpu``)
a step that convolves runs as one compiled step per batch, dispatched from Python
(:func:`loop_of`): inside a ``while`` body XLA CPU keeps a convolution's gradient in dimension
orders (``f01b_i01o->01bf``, ``b01f_01oi->b01f``) that it does not canonicalize to its library
convolution's, and the step runs 5-15x slower than outside the loop (forward convolutions are
as fast). The numbers are the same step's.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tpushim import _batch_math
from tpushim._errors import ConversionError
from tpushim._jax import _draws, _optimizers, _pod, _sparse, _trace

#: Negative controls (the proof's), never set outside it: ``"sum_device_means"`` -- each device
#: differentiates its own rows' loss (a mean over its own rows) and the gradients are summed
#: over the devices; ``"mean_device_losses"`` -- the same, the gradients averaged (right for a
#: mean of full batches, wrong for a sum); ``"count_padding"`` -- padding rows, copies of the
#: batch's first row, weigh as real rows in the loss, its sample weights and the statistics
#: (and as rows looking up a gathered weight's rows: row 0 of its table).
CONTROLS = ("sum_device_means", "mean_device_losses", "count_padding")

#: A call whose every batch has the global batch's rows (every call but an epoch's last, where
#: the devices divide the global batch) runs a second compiled variant of the step, without
#: the padding weight's arithmetic (:func:`._trace.training_function`'s ``full``): a plain mean
#: and BatchNormalization's plain batch moments, the same numbers (one compile where every
#: batch is full). A short batch compiles the padded one. A Trainer's ``full_step`` starts as this; False: every call runs the padded step
#: (the benchmark's A/B).
FULL_STEP = True

#: How a call's steps run: ``"scan"`` (one compiled ``lax.scan``), ``"per step"`` (one compiled
#: step per batch, dispatched from Python).
LOOPS = ("scan", "per step")


def loop_of(devices, pod=None, convolves=True):
    """How a call's steps run on ``devices``: ``"per step"`` on XLA CPU devices in one process
    for a step that ``convolves`` (a convolution's gradient is 5-15x slower inside a compiled
    loop there), else ``"scan"``: a step without convolutions (one dispatch a call, not one a
    step: a small MLP's steps were 2.7x slower dispatched one by one), a TPU (unmeasured), a
    pod (its batches are global arrays made per call)."""
    if pod is None and convolves and all(d.platform == "cpu" for d in devices):
        return "per step"
    return "scan"


def _convolves(traced, batch):
    """Whether the converted step (``traced``, at ``batch``'s shapes) holds a convolution."""
    args = [{k: np.asarray(traced.params[k]) for k in (*traced.trainable, *traced.state)}]
    args += list(batch[:4])
    if traced.draws:
        args.append([np.zeros(d.fed_shape, d.dtype) for d in traced.draws])
    return "conv_general_dilated" in str(jax.make_jaxpr(traced.fn)(*args))


class _PerStep:
    """A call's steps as one compiled step per batch (``step``, a jitted ``(trainable, stats,
    opt_state, batch) -> ((trainable, stats, opt_state), loss)``), called on the call's list of
    batches as they came (never copied into one stacked array: a 224x224 image batch's copy was
    a fifth of its step on CPU); returns the carry and the steps' losses (on the host)."""

    def __init__(self, step):
        self.step = step

    def __call__(self, trainable, stats, opt_state, batches):
        carry, losses = (trainable, stats, opt_state), []
        for batch in batches:  # dispatched ahead: each call waits only on its inputs
            carry, loss = self.step(*carry, batch)
            losses.append(loss)
        return carry, np.stack(jax.device_get(losses))

    def _cache_size(self):
        return self.step._cache_size()

    def lower(self, trainable, stats, opt_state, batches):
        return self.step.lower(
            trainable, stats, opt_state, jax.tree_util.tree_map(lambda a: a[0], batches)
        )


def pad_batch(batch, global_batch):
    """``(features, labels, sample_weights, pad)`` of a batch with ``rows`` <= ``global_batch``
    real rows, padded to ``global_batch`` with copies of its first row whose ``pad`` (and sample
    weight) is 0, as :func:`tpushim._padding.pad_batch` pads a short batch."""
    features, labels, weights = batch
    rows = len(np.asarray(features[0]))
    if rows > global_batch:
        raise ValueError(f"a batch of {rows} rows is larger than the global batch {global_batch}")
    if weights is None:
        weights = [None] * len(labels)
    weights = [
        np.ones([rows], np.float32) if w is None else np.asarray(w, np.float32) for w in weights
    ]

    def padded(a):
        a = np.asarray(a)
        extra = np.zeros((global_batch - rows, *a.shape[1:]), a.dtype)
        return np.concatenate([a, extra]) if global_batch > rows else a

    pad = padded(np.ones([rows], np.float32))
    return (
        [_pod.padded_rows(f, global_batch) for f in features],
        [_pod.padded_rows(y, global_batch) for y in labels],
        [padded(w) for w in weights],
        pad,
    )


class Trainer:
    """Trains a compiled Keras model in JAX from batches of numpy arrays.

    Args:
      keras_model: a compiled tf-keras graph network; its weights are the starting point (read
        once, never written).
      global_batch: stock's global batch (a short batch is padded to it); every step runs the
        next multiple of the devices (``global_batch``), the rows beyond weighted 0.
      devices: the devices to split each global batch over (default: every local device).
      custom_objects: as given to ``model_to_estimator``.
      seeds: ``(graph seed, op-seed counter)`` stock's training graph calls the model with
        (:mod:`._draws`: the RunConfig's ``tf_random_seed``, the input graph's counter); the
        random draws (Dropout, noise layers) are stock's from them, one stream per Trainer, as
        stock's per ``train()`` call.
      fed: the model's host part (:class:`tpushim._jax._host.HostFeed`): batches hold its fed
        tensors, the model runs from them.
    """

    def __init__(
        self,
        keras_model,
        global_batch,
        devices=None,
        custom_objects=None,
        control=None,
        seeds=None,
        pod=None,
        fed=None,
        compiled=None,
    ):
        if control not in (None, *CONTROLS):
            raise ValueError(f"control must be one of {CONTROLS}")
        self.pod = pod  # a _pod.Pod: the mesh spans every process's devices
        self.devices = list(pod.devices if pod is not None else devices or jax.local_devices())
        # A global batch the devices do not divide is padded to their next multiple, with rows
        # weighted 0 (as TPUEstimator pads it): every step runs ``global_batch`` rows.
        self.stock_batch = global_batch
        global_batch = _batch_math.padded_batch(global_batch, len(self.devices))
        self.model, self.global_batch, self.control = keras_model, global_batch, control
        self.optimizer = _optimizers.of(keras_model.optimizer)
        self.custom_objects, self.seeds, self.fed = custom_objects, seeds, fed
        # ``compiled``: a dict an earlier Trainer of this model, global batch, seeds, devices
        # and optimizer kept its converted and compiled steps in (a conversion's next train()
        # call's; :meth:`tpushim._jax._build.JaxConversion.trainer`), kept only while the
        # optimizer's settings are the same. Its state (weights, draws' streams) is its own.
        compiled = {} if compiled is None or control is not None else compiled
        if compiled.get("optimizer") != _optimizer_key(self.optimizer):
            compiled.clear()
            compiled["optimizer"] = _optimizer_key(self.optimizer)
        self._compiled = compiled
        # (weighted: the input gives sample weights, full: no padding rows) -> training function
        self._train_fns = compiled.setdefault("train_fns", {})
        self._train_fn(True)  # its refusals here
        self.full_step = FULL_STEP
        self._host_draws = {}  # a trace's draws -> their stream on the host
        self.mesh = Mesh(np.array(self.devices), ("data",))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.split = NamedSharding(self.mesh, PartitionSpec("data"))
        self._traced = compiled.setdefault("traced", {})  # shapes -> (Traced, compiled loop)
        self.loop = compiled.get("loop")  # one of LOOPS: chosen at the first compile (loop_of)
        self.params = self.opt_state = None
        self._restored = {}

    def restore(self, weights=None, slots=None, iterations=None):
        """Starts from these values rather than the Keras model's (a checkpoint's): ``weights``
        variable name -> value, ``slots`` slot name -> {variable name: value}, ``iterations`` the
        optimizer's step count. Before the first :meth:`train`."""
        if self.params is not None:
            raise RuntimeError("restore() comes before the first train()")
        self._restored = {"weights": dict(weights or {}), "slots": dict(slots or {})}
        if iterations is not None:
            self._restored["iterations"] = int(iterations)

    # -- the state -------------------------------------------------------------------------------
    def _start(self, traced):
        if self.params is not None:
            return
        start = {k: traced.params[k] for k in (*traced.trainable, *traced.state)}
        start.update({k: v for k, v in self._restored.get("weights", {}).items() if k in start})
        trainable = {k: jnp.asarray(start[k]) for k in traced.trainable}
        state = {k: jnp.asarray(start[k]) for k in traced.state}
        opt = self.optimizer.init(trainable)
        if "iterations" in self._restored:  # stock's optimizer counts the global step
            opt["iterations"] = jnp.asarray(self._restored["iterations"], opt["iterations"].dtype)
        for slot, values in self._restored.get("slots", {}).items():
            if slot in opt and not isinstance(opt[slot], dict):  # a scalar (momentum_cache)
                opt[slot] = jnp.asarray(values, opt[slot].dtype)
            elif slot in opt:
                opt[slot] = {k: jnp.asarray(values.get(k, opt[slot][k])) for k in opt[slot]}
        place = jax.device_put if self.pod is None else _pod.replicated
        self.params, self.stats, self.opt_state = place((trainable, state, opt), self.replicated)

    def weights(self):
        """variable name -> numpy value, for every weight the step trains or updates."""
        return {k: np.asarray(v) for k, v in {**self.params, **self.stats}.items()}

    def slots(self):
        """The optimizer's state: ``iterations`` and slot name -> {variable name: value}."""
        return jax.tree_util.tree_map(np.asarray, self.opt_state)

    # -- the step --------------------------------------------------------------------------------
    def _full(self, batches):
        """Whether a call's ``batches`` run the step without padding rows (:data:`FULL_STEP`):
        every batch the global batch's rows, on one process, outside the negative controls."""
        return (
            self.full_step
            and self.pod is None
            and self.control is None
            and all(len(np.asarray(b[0][0])) == self.global_batch for b in batches)
        )

    def _train_fn(self, weighted, full=False):
        if (weighted, full) not in self._train_fns:
            self._train_fns[weighted, full] = _trace.training_function(
                self.model,
                self.custom_objects,
                weighted=weighted,
                seeds=self.seeds,
                global_batch=self.global_batch,
                fed=self.fed,
                full=full,
            )
        return self._train_fns[weighted, full]

    def _convert(self, batch, weighted=False, full=False):
        key = (weighted, full)
        key += tuple((np.asarray(a).shape, np.asarray(a).dtype.str) for a in _flat(batch))
        if key not in self._traced:
            train_fn = self._train_fn(weighted, full)
            traced = _trace.convert(self.model, train_fn, *batch)
            per_device = None
            if traced.draws and self.control:
                raise ValueError("the negative controls take a model without random draws")
            if self.control in ("sum_device_means", "mean_device_losses"):
                shard = jax.tree_util.tree_map(lambda a: a[: len(a) // len(self.devices)], batch)
                per_device = _trace.convert(self.model, train_fn, *shard)
            looked_up = None
            if self.optimizer.sparse_differs or self.optimizer.clipping:
                looked_up = _sparse.convert(self.model, train_fn, *batch)
            if looked_up is not None and self.optimizer.clipping:
                raise ConversionError(
                    "tpushim's JAX engine does not clip the gradient of a weight the model "
                    "gathers rows of (an Embedding's) yet: stock clips that sparse gradient's "
                    "rows before it sums a row's lookups. Compile the optimizer without "
                    "clipnorm/clipvalue/global_clipnorm, or use engine='strategy' "
                    "(TPUSHIM_ENGINE=strategy)."
                )
            if not self.optimizer.sparse_differs:
                looked_up = None
            if self.loop is None:
                cpu = loop_of(self.devices, self.pod) == "per step"  # before tracing again
                self.loop = loop_of(self.devices, self.pod, cpu and _convolves(traced, batch))
                self._compiled["loop"] = self.loop
            self._traced[key] = (traced, self._compile(traced, per_device, looked_up))
        return self._traced[key]

    def _compile(self, traced, per_device, looked_up=None):
        optimizer, shards, control = self.optimizer, len(self.devices), self.control

        def loss_fn(trainable, stats, batch):
            features, labels, weights, pad = batch[:4]
            if control == "count_padding":
                real = pad > 0
                first = jax.tree_util.tree_map(lambda a: a[:1], (features, labels))
                features, labels = jax.tree_util.tree_map(
                    lambda a, f: jnp.where(real.reshape((-1,) + (1,) * (a.ndim - 1)), a, f),
                    (features, labels),
                    first,
                )
                weights = [jnp.where(real, w, 1.0) for w in weights]
                pad = jnp.ones_like(pad)
            if per_device is None:
                (loss, _), updated = traced.fn({**stats, **trainable}, *batch[:3], pad, *batch[4:])
                return loss, {k: updated[k] for k in stats}

            def one(part):  # a device's rows alone: its own mean, its own statistics
                (loss, _), updated = per_device.fn({**stats, **trainable}, *part)
                return loss, {k: updated[k] for k in stats}

            parts = jax.tree_util.tree_map(
                lambda a: a.reshape(shards, a.shape[0] // shards, *a.shape[1:]),
                (features, labels, weights, pad),
            )
            losses, updated = jax.vmap(one)(parts)
            combined = jnp.mean(losses) if control == "mean_device_losses" else jnp.sum(losses)
            return combined, jax.tree_util.tree_map(lambda u: u[0], updated)

        def step(carry, batch):
            trainable, stats, opt_state = carry
            (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                trainable, stats, batch
            )
            rows = None
            if looked_up is not None:
                features, labels, weights, pad = batch[:4]
                if control == "count_padding":
                    pad = jnp.ones_like(pad)
                rows = looked_up({**stats, **trainable}, features, labels, weights, pad)
            trainable, opt_state = _optimizers.update(optimizer, trainable, grads, opt_state, rows)
            return (trainable, stats, opt_state), loss

        def loop(trainable, stats, opt_state, batches):
            return jax.lax.scan(step, (trainable, stats, opt_state), batches)

        lead = (None,) if self.loop == "scan" else ()  # the scan's batches: stacked
        stacked = NamedSharding(self.mesh, PartitionSpec(*lead, "data"))
        if traced.draws:  # a draw per row split as the batch, any other whole on every device
            whole = NamedSharding(self.mesh, PartitionSpec())
            looped = NamedSharding(self.mesh, PartitionSpec(*lead, None, "data"))
            stacked = (
                *(stacked,) * 4,
                [(looped if d.trips else stacked) if d.batched else whole for d in traced.draws],
            )
        if self.loop == "per step":
            return _PerStep(
                jax.jit(
                    lambda trainable, stats, opt_state, batch: step(
                        (trainable, stats, opt_state), batch
                    ),
                    in_shardings=(self.replicated, self.replicated, self.replicated, stacked),
                    out_shardings=((self.replicated,) * 3, self.replicated),
                    donate_argnums=(0, 1, 2),
                )
            )
        return jax.jit(
            loop,
            in_shardings=(self.replicated, self.replicated, self.replicated, stacked),
            out_shardings=((self.replicated,) * 3, self.replicated),
            donate_argnums=(0, 1, 2),
        )

    def check(self, batch):
        """Converts and compiles the step for ``batch``'s shapes (``(features, labels,
        sample_weights or None)``) without running it: what the step refuses (random draws, an
        op tf2jax has no JAX for) is raised here, before anything is written."""
        self._convert(pad_batch(batch, self.global_batch), _weighted(batch), self._full([batch]))

    def compile(self, batch):
        """:meth:`check`, then the step's XLA compile for one batch (``(features, labels,
        sample_weights or None)``), without running it: what XLA refuses is raised here."""
        padded = pad_batch(batch, self.global_batch)
        traced, loop = self._convert(padded, _weighted(batch), self._full([batch]))
        self._start(traced)
        if traced.draws:
            padded = (*padded, [np.zeros(d.fed_shape, d.dtype) for d in traced.draws])
        one = jax.tree_util.tree_map(lambda a: np.asarray(a)[None], padded)
        loop.lower(self.params, self.stats, self.opt_state, one).compile()

    def train(self, batches):
        """Runs one step per batch in one compiled call; returns each step's loss (stock's loss
        on the batch's real rows). ``batches``: ``(features, labels, sample_weights or None)``
        tuples of numpy arrays, at most ``global_batch`` rows each; on a pod, this process's
        rows of each global batch, padded: ``(features, labels, sample_weights or None, pad)``
        (:mod:`._pod`)."""
        if self.pod is not None:
            return self._train_pod(batches)
        padded = [pad_batch(b, self.global_batch) for b in batches]
        traced, loop = self._convert(padded[0], _weighted(batches[0]), self._full(batches))
        self._start(traced)
        if traced.draws:  # stock's draws, made on the host at each batch's real rows
            # (one stream for both variants of the step: stock's ops draw on, step after step)
            stream = tuple(dataclasses.replace(d, where="") for d in traced.draws)
            host = self._host_draws.get(stream)
            if host is None:
                host = self._host_draws[stream] = _draws.HostDraws(traced.draws, self.global_batch)
            padded = [(*p, host.draw(len(np.asarray(b[0][0])))) for p, b in zip(padded, batches)]
        if self.loop != "per step":  # the scan's batches: stacked along a first axis
            padded = jax.tree_util.tree_map(lambda *a: np.stack(a), *padded)
        (self.params, self.stats, self.opt_state), losses = loop(
            self.params, self.stats, self.opt_state, padded
        )
        return np.asarray(losses)

    def _train_pod(self, batches):
        """:meth:`train` on a pod: each process's rows made one global array per input, the
        step traced for the global batch's shapes."""
        count = self.pod.count
        local, real = [], []
        for features, labels, weights, pad, *rest in batches:
            real.append(rest[0] if rest else int(np.sum(pad)) * count)
            rows = len(pad)
            if weights is None:
                weights = [None] * len(labels)
            weights = [
                np.ones([rows], np.float32) if w is None else np.asarray(w, np.float32)
                for w in weights
            ]
            local.append(
                (
                    [np.asarray(f) for f in features],
                    [np.asarray(y) for y in labels],
                    weights,
                    np.asarray(pad, np.float32),
                )
            )
        # The step's shapes are the global batch's (its values are not read to trace it).
        shaped = jax.tree_util.tree_map(lambda a: np.concatenate([a] * count), local[0])
        traced, loop = self._convert(shaped, _weighted(batches[0]))
        self._start(traced)
        stacked = jax.tree_util.tree_map(lambda *a: np.stack(a), *local)
        split = NamedSharding(self.mesh, PartitionSpec(None, "data"))
        stacked = _pod.global_arrays(stacked, split, 1, count)
        if traced.draws:  # stock's draws for the global batch, every process alike; its rows
            stacked = (*stacked, self._pod_draws(traced.draws, real, len(local[0][3]), split))
        (self.params, self.stats, self.opt_state), losses = loop(
            self.params, self.stats, self.opt_state, stacked
        )
        return np.asarray(losses)

    def _pod_draws(self, draws, real, rows, split):
        """Each step's draws on a pod, stacked: every process makes stock's draws for the
        global batch (its ``real`` rows; the same seeds, so the same numbers) and feeds its
        devices its own ``rows`` of each draw per row, every other draw whole."""
        host = self._host_draws.get(draws)
        if host is None:
            host = self._host_draws[draws] = _draws.HostDraws(draws, self.global_batch)
        made = [host.draw(n) for n in real]
        whole = NamedSharding(self.mesh, PartitionSpec())
        out = []
        for k, d in enumerate(draws):
            steps = np.stack([m[k] for m in made])
            if d.batched and d.trips:  # (steps, the loop's iterations, rows, ...)
                mine = np.stack(
                    [[_pod.own_rows(t, self.pod.index, rows) for t in s] for s in steps]
                )
                looped = NamedSharding(self.mesh, PartitionSpec(None, None, "data"))
                out.append(_pod.global_arrays(mine, looped, 2, self.pod.count))
            elif d.batched:
                mine = np.stack([_pod.own_rows(s, self.pod.index, rows) for s in steps])
                out.append(_pod.global_arrays(mine, split, 1, self.pod.count))
            else:
                out.append(_pod.replicated(steps, whole))
        return out


def _optimizer_key(optimizer):
    """What a compiled step reads of ``optimizer`` (its class and settings), comparable: a
    Trainer reuses an earlier one's steps only where it is equal (a setting whose repr differs
    from call to call, such as a function's, never reuses them)."""
    return (type(optimizer), repr(sorted(vars(optimizer).items(), key=lambda kv: kv[0])))


def _weighted(batch):
    """Whether a ``(features, labels, sample_weights or None)`` batch gives sample weights."""
    return batch[2] is not None and any(w is not None for w in batch[2])


def _flat(batch):
    return jax.tree_util.tree_leaves(batch)
