"""The optimizer's update in JAX, as TensorFlow computes it: the kernels tf-keras's legacy
optimizers call (``ResourceApplyKerasMomentum``, ``ResourceApplyGradientDescent``,
``ResourceApplyAdam(WithAmsgrad)``, ``ResourceApplyAdaMax``, ``ResourceApplyAdadelta``,
``ResourceApplyFtrl(V2)``, ``ResourceApplyRMSProp``, ``ResourceApplyCenteredRMSProp``,
``ResourceApplyAdagradV2``; legacy Nadam's Python arithmetic and its ``momentum_cache``), its v2
optimizers' ``update_step`` arithmetic (AdamW's weight decay first, as its base class applies
it; v2 Nadam's ``u_product``), and the ``tf.compat.v1.train`` optimizers a ``compile`` wraps in
Keras's ``TFOptimizer`` (``ApplyGradientDescent``, ``ApplyMomentum``, ``ApplyAdam``,
``ApplyRMSProp`` / ``ApplyCenteredRMSProp``, ``ApplyAdagrad``, ``ApplyFtrl(V2)``,
``ApplyProximalAdagrad``, ``ApplyProximalGradientDescent``, ``ApplyAdadelta``,
``ApplyAdagradDA``). The state is Keras's: ``iterations`` and one slot per trainable weight under
the optimizer's slot names (``momentum``; ``m``, ``v``, ``vhat``; ``m``, ``u``;
``accum_grad``, ``accum_var``; ``accumulator``, ``linear``; ``rms``, ``mg``; ...), starting
where it starts them (zeros; Adagrad's and Ftrl's accumulators at
``initial_accumulator_value``).

Either spelling (``tf.keras.optimizers.X`` and its ``legacy`` twin, or the string compile made
it from; a conversion trains with the legacy twin, as stock). A Keras ``LearningRateSchedule``
is its own ``__call__`` converted by tf2jax and evaluated in the step at the optimizer's
``iterations`` (stock's global step: a traced input, one compile), then the legacy ``decay``
(``lr / (1 + decay * iterations)``), as ``_decayed_lr``; ``clipvalue``, ``clipnorm`` and
``global_clipnorm`` clip the whole global batch's gradient (the one stock's optimizer clips,
after any cross-device sum), as ``_transform_gradients``. Every other optimizer, ``use_ema``, a v2
optimizer's ``weight_decay`` but AdamW's (a conversion's legacy twin drops both, as stock's
does) are refused by name. A scalar the optimizer keeps besides its slots (legacy Nadam's
``momentum_cache``, v2 Nadam's ``u_product``) is in the state under its name, a number.

A weight the model only gathers rows of (an ``Embedding``'s table) gets a sparse gradient in
stock's graph (``IndexedSlices``), and some optimizers' sparse kernels move only the rows a
batch looks up where their dense update, given zero rows, would move every row (a momentum's
decay, Ftrl's recomputed weight). ``sparse_differs`` says which, as TensorFlow's own kernels were
found to; :func:`update` then keeps every other row and its slots as they were.

One concern, one module (over 300 lines): every optimizer here shares the state's layout, the
hyperparameters' reading and the refusal's words, each update written out as its kernel does it.
"""

import numbers

import jax.numpy as jnp

from tpushim._errors import ConversionError

_SUPPORTED = (
    "SGD (momentum, nesterov), Adam (amsgrad), AdamW, Adamax, Adadelta, Ftrl, RMSprop, Adagrad, "
    "Nadam and tf.compat.v1.train's GradientDescent, Momentum, Adam, RMSProp, Adagrad, Ftrl, "
    "ProximalAdagrad, ProximalGradientDescent, Adadelta and AdagradDA"
)


def _refuse(what):
    raise ConversionError(
        f"tpushim's JAX engine does not compute {what} yet: it updates as Keras does for "
        f"{_SUPPORTED}. Compile the model with "
        "one of those, or train it with engine=strategy."
    )


def _number(config, key, optimizer):
    value = config.get(key)
    if isinstance(value, (dict, bool)) or not isinstance(value, numbers.Real):
        _refuse(f"{type(optimizer).__name__}'s {key} {value!r} (a schedule or a tensor)")
    return float(value)


class Optimizer:
    """One Keras optimizer's update in JAX: ``init(params)`` -> its state,
    ``update(params, grads, state)`` -> (params, state), for dicts of trainable weights."""

    slots = ()
    initial = 0.0  # the slots' starting value
    initials = {}  # a slot's own starting value, where it is not ``initial``
    takes_weight_decay = False
    decay_is_a_schedule = False  # legacy Nadam's decay: its momentum schedule, not the rate's
    #: a ``LearningRateSchedule`` as a JAX function of the step (float32), or None
    schedule_fn = None
    rate_decay = 0.0  # the legacy optimizers' ``decay``: lr / (1 + decay * iterations)
    clipping = ()  # (``clipvalue`` / ``clipnorm`` / ``global_clipnorm``, its limit), in order
    scalars = {}  # a scalar the optimizer keeps besides its slots -> its starting value
    #: whether TensorFlow's sparse update of a gathered weight leaves the rows not looked up
    #: (their weights and slots) as they were, where its dense update with zero rows moves them
    sparse_differs = False
    #: with ``sparse_differs``: whether the rows not looked up keep their slots too (False:
    #: the slots decay on every row, as legacy Nadam's sparse path decays them; the weights'
    #: other rows stay)
    sparse_keeps_slots = True

    def __init__(self, keras_optimizer):
        config = keras_optimizer.get_config()
        if (
            config.get("weight_decay") not in (None, 0, 0.0) and not self.takes_weight_decay
        ) or config.get("use_ema"):
            _refuse("a v2 optimizer's weight_decay or use_ema")
        if config.get("adaptive_epsilon"):
            _refuse("Adam's adaptive_epsilon")
        if not self.decay_is_a_schedule:
            self.rate_decay = float(config.get("decay", 0.0) or 0.0)
        self.clipping = tuple(
            (key, _number(config, key, keras_optimizer))
            for key in ("clipvalue", "clipnorm", "global_clipnorm")  # _transform_gradients' order
            if config.get(key) is not None
        )
        if isinstance(config.get("learning_rate"), dict):  # a LearningRateSchedule
            self.learning_rate, self.schedule_fn = None, _schedule(keras_optimizer)
        else:
            self.learning_rate = _number(config, "learning_rate", keras_optimizer)
        self.config = config
        self.legacy = ".legacy." in (type(keras_optimizer).__module__ or "")

    def rate(self, state):
        """This step's learning rate as the legacy optimizer's ``_decayed_lr`` computes it (the
        v2 optimizer's the same, without ``decay``): its schedule, then ``decay``, at the
        optimizer's ``iterations`` before the step, which stock's clone makes the global step."""
        if self.schedule_fn is None and not self.rate_decay:
            return jnp.float32(self.learning_rate)
        step = state["iterations"].astype(jnp.float32)
        if self.schedule_fn is None:
            lr = jnp.float32(self.learning_rate)
        else:
            lr = self.schedule_fn(step)
        if self.rate_decay:
            lr = lr / (1.0 + jnp.float32(self.rate_decay) * step)
        return lr

    def clip(self, grads):
        """The gradients as the optimizer clips them before its update (the legacy optimizer's
        ``_transform_gradients``: ``clipvalue``, then ``clipnorm`` per weight, then
        ``global_clipnorm``; a v2 optimizer takes one of them), TensorFlow's arithmetic."""
        for key, limit in self.clipping:
            c = jnp.float32(limit)
            if key == "clipvalue":  # tf.clip_by_value
                grads = {k: jnp.clip(g, -c, c) for k, g in grads.items()}
            elif key == "clipnorm":  # tf.clip_by_norm
                grads = {k: _clip_by_norm(g, c) for k, g in grads.items()}
            else:  # tf.clip_by_global_norm
                norm = jnp.sqrt(sum(jnp.sum(g * g) / 2 for g in grads.values()) * 2)
                scale = c * jnp.minimum(1.0 / norm, jnp.float32(1.0) / c) + (norm - norm)
                grads = {k: g * scale for k, g in grads.items()}
        return grads

    def init(self, params):
        state = {"iterations": jnp.zeros([], jnp.int64 if _x64() else jnp.int32)}
        for slot in self.slots:
            start = self.initials.get(slot, self.initial)
            state[slot] = {k: jnp.full_like(v, start) for k, v in params.items()}
        for name, start in self.scalars.items():
            state[name] = jnp.asarray(start, jnp.float32)
        return state


def _schedule(keras_optimizer):
    """The optimizer's ``LearningRateSchedule``, its own ``__call__`` converted to JAX by tf2jax:
    a function of the (traced) step, float32 as the optimizer casts it."""
    import numpy as np
    import tensorflow as tf
    import tf2jax

    from tpushim import _tfprivate

    schedule = _tfprivate.keras_compile.learning_rate_schedule(keras_optimizer)
    name = type(schedule).__name__
    call = tf.function(
        lambda step: tf.cast(schedule(step), tf.float32),
        input_signature=[tf.TensorSpec([], tf.float32)],
        autograph=False,
    )
    try:
        fn, params = tf2jax.convert(call, np.zeros([], np.float32))
    except Exception as e:  # an op tf2jax has no JAX for, or a schedule reading a variable
        _refuse(f"the learning-rate schedule {name} ({type(e).__name__}: {str(e)[:200]})")
    if params:
        _refuse(f"the learning-rate schedule {name}: it reads variables ({sorted(params)})")
    return lambda step: fn(params, step)[0]


def _clip_by_norm(g, c):
    l2sum = jnp.sum(g * g)
    safe = jnp.where(l2sum > 0, l2sum, jnp.ones_like(l2sum))
    norm = jnp.where(l2sum > 0, jnp.sqrt(safe), l2sum)
    return g * c / jnp.maximum(norm, c)


def _x64():
    import jax

    return bool(jax.config.jax_enable_x64)


class SGD(Optimizer):
    def __init__(self, keras_optimizer):
        super().__init__(keras_optimizer)
        self.momentum = _number(self.config, "momentum", keras_optimizer)
        self.nesterov = bool(self.config.get("nesterov", False))
        self.slots = ("momentum",) if self.momentum else ()
        # ResourceSparseApplyKerasMomentum; the v2 update_step decays every row's momentum
        self.sparse_differs = self.legacy and bool(self.momentum)

    def update(self, params, grads, state):
        lr = self.rate(state)
        if not self.momentum:  # ResourceApplyGradientDescent
            new = {k: params[k] - lr * grads[k] for k in params}
            return new, {**state, "iterations": state["iterations"] + 1}
        momentum = jnp.float32(self.momentum)
        new, accums = {}, {}
        for k in params:  # ResourceApplyKerasMomentum
            accum = state["momentum"][k] * momentum - lr * grads[k]
            if self.nesterov:
                new[k] = params[k] + (accum * momentum - lr * grads[k])
            else:
                new[k] = params[k] + accum
            accums[k] = accum
        return new, {"iterations": state["iterations"] + 1, "momentum": accums}


class Adam(Optimizer):
    def __init__(self, keras_optimizer):
        super().__init__(keras_optimizer)
        self.amsgrad = bool(self.config.get("amsgrad", False))
        self.slots = ("m", "v", "vhat") if self.amsgrad else ("m", "v")
        self.beta_1 = _number(self.config, "beta_1", keras_optimizer)
        self.beta_2 = _number(self.config, "beta_2", keras_optimizer)
        self.epsilon = float(self.config.get("epsilon", 1e-7))
        self.weight_decay = float(self.config.get("weight_decay") or 0.0)

    def update(self, params, grads, state):
        step = (state["iterations"] + 1).astype(jnp.float32)
        lr = self.rate(state)
        beta_1, beta_2 = jnp.float32(self.beta_1), jnp.float32(self.beta_2)
        beta_1_power, beta_2_power = beta_1**step, beta_2**step
        alpha = lr * jnp.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        eps = jnp.float32(self.epsilon)
        new, out = {}, {slot: {} for slot in self.slots}
        for k in params:  # ResourceApplyAdam(WithAmsgrad), and the v2 update_step's same
            g, var = grads[k], params[k]
            if self.weight_decay:  # the v2 optimizer's _apply_weight_decay, first
                var = var - var * jnp.float32(self.weight_decay) * lr
            m = state["m"][k] + (g - state["m"][k]) * (1 - beta_1)
            v = state["v"][k] + (jnp.square(g) - state["v"][k]) * (1 - beta_2)
            out["m"][k], out["v"][k] = m, v
            if self.amsgrad:
                v = out["vhat"][k] = jnp.maximum(state["vhat"][k], v)
            new[k] = var - (m * alpha) / (jnp.sqrt(v) + eps)
        return new, {"iterations": state["iterations"] + 1, **out}


class AdamW(Adam):
    takes_weight_decay = True

    def __init__(self, keras_optimizer):
        super().__init__(keras_optimizer)
        if self.config.get("exclude_from_weight_decay") or getattr(
            keras_optimizer, "_exclude_from_weight_decay", None
        ):
            _refuse("AdamW's exclude_from_weight_decay")


class Adamax(Optimizer):
    def __init__(self, keras_optimizer):
        super().__init__(keras_optimizer)
        self.slots = ("m", "v") if self.legacy else ("m", "u")
        self.sparse_differs = self.legacy  # its sparse kernel; the v2 update_step's is dense
        self.beta_1 = _number(self.config, "beta_1", keras_optimizer)
        self.beta_2 = _number(self.config, "beta_2", keras_optimizer)
        self.epsilon = float(self.config.get("epsilon", 1e-7))

    def update(self, params, grads, state):
        step = (state["iterations"] + 1).astype(jnp.float32)
        lr, eps = self.rate(state), jnp.float32(self.epsilon)
        beta_1, beta_2 = jnp.float32(self.beta_1), jnp.float32(self.beta_2)
        beta_1_power = beta_1**step
        name_m, name_u = self.slots
        new, ms, us = {}, {}, {}
        for k in params:
            g = grads[k]
            m = state[name_m][k] + (g - state[name_m][k]) * (1 - beta_1)
            u = jnp.maximum(beta_2 * state[name_u][k], jnp.abs(g))
            if self.legacy:  # ResourceApplyAdaMax
                new[k] = params[k] - lr / (1 - beta_1_power) * (m / (u + eps))
            else:  # the v2 optimizer's update_step
                new[k] = params[k] - (lr * m) / ((1 - beta_1_power) * (u + eps))
            ms[k], us[k] = m, u
        return new, {"iterations": state["iterations"] + 1, name_m: ms, name_u: us}


class Adadelta(Optimizer):
    def __init__(self, keras_optimizer):
        super().__init__(keras_optimizer)
        if self.legacy:
            self.slots = ("accum_grad", "accum_var")
        else:
            self.slots = ("accumulated_grad", "accumulated_delta_var")
        self.sparse_differs = self.legacy  # its sparse kernel; the v2 update_step's is dense
        self.rho = _number(self.config, "rho", keras_optimizer)
        self.epsilon = float(self.config.get("epsilon", 1e-7))

    def update(self, params, grads, state):
        lr, rho, eps = self.rate(state), jnp.float32(self.rho), jnp.float32(self.epsilon)
        name_g, name_d = self.slots
        new, accs, deltas = {}, {}, {}
        for k in params:
            g, acc, delta_acc = grads[k], state[name_g][k], state[name_d][k]
            if self.legacy:  # ResourceApplyAdadelta
                acc = acc * rho + jnp.square(g) * (1 - rho)
                update = jnp.sqrt(delta_acc + eps) * _rsqrt(acc + eps) * g
                new[k] = params[k] - update * lr
                delta_acc = delta_acc * rho + jnp.square(update) * (1 - rho)
            else:  # the v2 optimizer's update_step
                acc = rho * acc + (1 - rho) * g * g
                delta = -jnp.sqrt(delta_acc + eps) * g / jnp.sqrt(acc + eps)
                delta_acc = rho * delta_acc + (1 - rho) * delta * delta
                new[k] = params[k] + lr * delta
            accs[k], deltas[k] = acc, delta_acc
        return new, {"iterations": state["iterations"] + 1, name_g: accs, name_d: deltas}


class Ftrl(Optimizer):
    slots = ("accumulator", "linear")

    def __init__(self, keras_optimizer):
        super().__init__(keras_optimizer)
        c = self.config
        self.initials = {
            "accumulator": _number(c, "initial_accumulator_value", keras_optimizer),
            "linear": 0.0,
        }
        self.lr_power = _number(c, "learning_rate_power", keras_optimizer)
        self.l1 = _number(c, "l1_regularization_strength", keras_optimizer)
        self.l2 = _number(c, "l2_regularization_strength", keras_optimizer)
        self.l2_shrinkage = _number(c, "l2_shrinkage_regularization_strength", keras_optimizer)
        self.beta = _number(c, "beta", keras_optimizer)
        self.sparse_differs = self.legacy  # its sparse kernel; the v2 update_step's is dense

    def _pow(self, x):
        if self.legacy and self.lr_power == -0.5:  # the kernel's own special case
            return jnp.sqrt(x)
        return jnp.power(x, jnp.float32(-self.lr_power))

    def update(self, params, grads, state):
        lr = self.rate(state)
        l1 = jnp.float32(self.l1)
        l2 = jnp.float32(self.l2) + jnp.float32(self.beta) / (2.0 * lr)
        shrinkage = jnp.float32(self.l2_shrinkage)
        new, accs, linears = {}, {}, {}
        for k in params:  # ResourceApplyFtrl(V2), and the v2 update_step's same arithmetic
            g, var, acc = grads[k], params[k], state["accumulator"][k]
            shrunk = g + 2 * shrinkage * var if self.l2_shrinkage > 0 else g
            new_acc = acc + jnp.square(g)
            linear = state["linear"][k] + (
                shrunk - (self._pow(new_acc) - self._pow(acc)) / lr * var
            )
            quadratic = self._pow(new_acc) / lr + 2 * l2
            new[k] = (jnp.clip(linear, -l1, l1) - linear) / quadratic
            accs[k], linears[k] = new_acc, linear
        return new, {"iterations": state["iterations"] + 1, "accumulator": accs, "linear": linears}


class RMSprop(Optimizer):
    def __init__(self, keras_optimizer):
        super().__init__(keras_optimizer)
        self.rho = _number(self.config, "rho", keras_optimizer)
        self.momentum = _number(self.config, "momentum", keras_optimizer)
        self.epsilon = float(self.config.get("epsilon", 1e-7))
        self.centered = bool(self.config.get("centered", False))
        if self.legacy:
            names = ("rms", "momentum", "mg")
        else:
            names = ("velocity", "momentum", "average_gradient")
        self.ms, self.mom, self.mg = names
        self.slots = (self.ms,) + ((self.mom,) if self.momentum else ())
        self.slots += (self.mg,) if self.centered else ()
        # ResourceSparseApply(Centered)RMSProp; without momentum its Python arithmetic decays
        # every row's slots, as the dense update does
        self.sparse_differs = self.legacy and bool(self.momentum)

    def update(self, params, grads, state):
        lr, rho = self.rate(state), jnp.float32(self.rho)
        momentum, eps = jnp.float32(self.momentum), jnp.float32(self.epsilon)
        new = {}
        out = {slot: {} for slot in self.slots}
        for k in params:
            g, ms = grads[k], state[self.ms][k]
            mg = state[self.mg][k] if self.centered else None
            if self.legacy and self.momentum:  # ResourceApply(Centered)RMSProp
                ms = ms + (jnp.square(g) - ms) * (1 - rho)
                denom = ms
                if self.centered:
                    mg = mg + (g - mg) * (1 - rho)
                    denom = ms - jnp.square(mg)
                mom = state[self.mom][k] * momentum + _rsqrt(denom + eps) * lr * g
                new[k] = params[k] - mom
            elif self.legacy:  # its Python arithmetic without momentum
                ms = rho * ms + (1 - rho) * jnp.square(g)
                denom = ms
                if self.centered:
                    mg = rho * mg + (1 - rho) * g
                    denom = ms - jnp.square(mg)
                new[k] = params[k] - lr * g / (jnp.sqrt(denom) + eps)
                mom = None
            else:  # the v2 optimizer's update_step
                ms = rho * ms + (1 - rho) * jnp.square(g)
                denom = ms + eps
                if self.centered:
                    mg = rho * mg + (1 - rho) * g
                    denom = ms - jnp.square(mg) + eps
                increment = lr * g * _rsqrt(denom)
                mom = state[self.mom][k] * momentum + increment if self.momentum else None
                new[k] = params[k] - (mom if self.momentum else increment)
            out[self.ms][k] = ms
            if self.momentum:
                out[self.mom][k] = mom
            if self.centered:
                out[self.mg][k] = mg
        return new, {"iterations": state["iterations"] + 1, **out}


class Adagrad(Optimizer):
    slots = ("accumulator",)

    def __init__(self, keras_optimizer):
        super().__init__(keras_optimizer)
        self.initial = _number(self.config, "initial_accumulator_value", keras_optimizer)
        self.epsilon = float(self.config.get("epsilon", 1e-7))

    def update(self, params, grads, state):
        lr, eps = self.rate(state), jnp.float32(self.epsilon)
        new, accs = {}, {}
        for k in params:
            g = grads[k]
            acc = state["accumulator"][k] + jnp.square(g)
            if self.legacy:  # ResourceApplyAdagradV2
                new[k] = params[k] - lr * g / (jnp.sqrt(acc) + eps)
            else:  # the v2 optimizer's update_step
                new[k] = params[k] - lr * g / jnp.sqrt(acc + eps)
            accs[k] = acc
        return new, {"iterations": state["iterations"] + 1, "accumulator": accs}


class Nadam(Optimizer):
    """Legacy: its Python arithmetic (``_prepare_local``, ``_resource_apply_dense``), the
    momentum schedule's product kept in ``momentum_cache``, its ``decay`` (``schedule_decay``,
    0.004) the schedule's exponent; v2: its ``update_step``, the product in ``u_product``."""

    slots = ("m", "v")
    decay_is_a_schedule = True

    def __init__(self, keras_optimizer):
        self.legacy = ".legacy." in (type(keras_optimizer).__module__ or "")
        self.scalars = {"momentum_cache" if self.legacy else "u_product": 1.0}
        super().__init__(keras_optimizer)
        self.beta_1 = _number(self.config, "beta_1", keras_optimizer)
        self.beta_2 = _number(self.config, "beta_2", keras_optimizer)
        self.epsilon = float(self.config.get("epsilon", 1e-7))
        self.schedule = float(self.config.get("decay", 0.0) or 0.0) if self.legacy else 1.0
        # legacy: its sparse path decays m and v on every row, then moves the rows given only
        self.sparse_differs, self.sparse_keeps_slots = self.legacy, False

    def update(self, params, grads, state):
        f = jnp.float32
        lr, beta_1, beta_2, eps = (
            self.rate(state),  # legacy Nadam takes no schedule (its constructor says so)
            f(self.beta_1),
            f(self.beta_2),
            f(self.epsilon),
        )
        local_step = (state["iterations"] + 1).astype(f)
        next_step = (state["iterations"] + 2).astype(f)
        decay = f(0.96)
        m_t = beta_1 * (1.0 - 0.5 * jnp.power(decay, f(self.schedule) * local_step))
        m_t_1 = beta_1 * (1.0 - 0.5 * jnp.power(decay, f(self.schedule) * next_step))
        name = next(iter(self.scalars))
        product = state[name] * m_t
        product_next = product * m_t_1
        beta_2_power = jnp.power(beta_2, local_step)
        new, ms, vs = {}, {}, {}
        for k in params:
            g = grads[k]
            if self.legacy:
                g_prime = g / (1.0 - product)
                m = beta_1 * state["m"][k] + (1 - beta_1) * g
                m_prime = m / (1.0 - product_next)
                v = beta_2 * state["v"][k] + (1 - beta_2) * jnp.square(g)
                v_prime = v / (1.0 - beta_2_power)
                m_bar = (1.0 - m_t) * g_prime + m_t_1 * m_prime
                new[k] = params[k] - lr * m_bar / (jnp.sqrt(v_prime) + eps)
            else:
                m = state["m"][k] + (g - state["m"][k]) * (1 - beta_1)
                v = state["v"][k] + (jnp.square(g) - state["v"][k]) * (1 - beta_2)
                m_hat = m_t_1 * m / (1 - product_next) + (1 - m_t) * g / (1 - product)
                v_hat = v / (1 - beta_2_power)
                new[k] = params[k] - (m_hat * lr) / (jnp.sqrt(v_hat) + eps)
            ms[k], vs[k] = m, v
        return new, {"iterations": state["iterations"] + 1, "m": ms, "v": vs, name: product}


class CompatV1(Optimizer):
    """A ``tf.compat.v1.train`` optimizer, which ``compile`` wraps in Keras's ``TFOptimizer``:
    GradientDescent (``ApplyGradientDescent``), Momentum (``ApplyMomentum``: the accumulator
    sums the gradients, the learning rate applied after), Adam (``ApplyAdam``, its beta
    powers those of the step count: the global step, as stock's graph counts them), RMSProp
    (``ApplyRMSProp`` / ``ApplyCenteredRMSProp``: its ``rms`` slot starts at 1, its
    ``momentum`` slot is always there), Adagrad (``ApplyAdagrad``), Ftrl (``ApplyFtrl(V2)``, slots
    ``accum`` and ``linear``) and ProximalAdagrad (``ApplyProximalAdagrad``)."""

    def __init__(self, keras_optimizer):
        self.inner = inner = keras_optimizer.optimizer
        self.kind = type(inner).__name__
        self.learning_rate = self._value(
            "_lr" if self.kind in ("AdamOptimizer", "AdadeltaOptimizer") else "_learning_rate"
        )
        self.legacy = True
        self.initials = {}
        if self.kind == "MomentumOptimizer":
            self.momentum = self._value("_momentum")
            self.nesterov = bool(inner._use_nesterov)
            self.slots = ("momentum",)
            self.sparse_differs = True  # ResourceSparseApplyMomentum
        elif self.kind == "AdamOptimizer":
            self.beta_1, self.beta_2 = self._value("_beta1"), self._value("_beta2")
            self.epsilon = self._value("_epsilon")
            self.slots = ("m", "v")
        elif self.kind == "RMSPropOptimizer":
            self.rho, self.momentum = self._value("_decay"), self._value("_momentum")
            self.epsilon, self.centered = self._value("_epsilon"), bool(inner._centered)
            self.slots = ("rms", "momentum") + (("mg",) if self.centered else ())
            self.initials = {"rms": 1.0}
            self.sparse_differs = True  # ResourceSparseApply(Centered)RMSProp
        elif self.kind in ("AdagradOptimizer", "ProximalAdagradOptimizer"):
            self.slots = ("accumulator",)
            self.initials = {"accumulator": self._value("_initial_accumulator_value")}
            if self.kind == "ProximalAdagradOptimizer":
                self.l1 = self._value("_l1_regularization_strength")
                self.l2 = self._value("_l2_regularization_strength")
                # ResourceSparseApplyProximalAdagrad: its shrinkage on the rows given only
                self.sparse_differs = bool(self.l1 or self.l2)
        elif self.kind == "ProximalGradientDescentOptimizer":
            self.l1 = self._value("_l1_regularization_strength")
            self.l2 = self._value("_l2_regularization_strength")
            self.slots = ()
            # SparseApplyProximalGradientDescent: its shrinkage on the rows given only
            self.sparse_differs = bool(self.l1 or self.l2)
        elif self.kind == "AdadeltaOptimizer":
            self.rho, self.epsilon = self._value("_rho"), self._value("_epsilon")
            self.slots = ("accum", "accum_update")
            self.sparse_differs = True  # SparseApplyAdadelta: the rows given only
        elif self.kind == "AdagradDAOptimizer":
            self.l1 = self._value("_l1_regularization_strength")
            self.l2 = self._value("_l2_regularization_strength")
            # the kernel's global step is the one the optimizer was given, plus one (its
            # _prepare): stock's graph can read a number only (an eager variable or tensor
            # fails there: "Attempting to capture an EagerTensor")
            self.global_step = self._value("_global_step") + 1
            self.slots = ("gradient_accumulator", "gradient_squared_accumulator")
            self.initials = {
                "gradient_squared_accumulator": self._value(
                    "_initial_gradient_squared_accumulator_value"
                )
            }
            # SparseApplyAdagradDA: the dense update recomputes every row from its accumulator
            # (a row never looked up goes to 0), the sparse one the rows given only
            self.sparse_differs = True
        elif self.kind == "FtrlOptimizer":
            self.ftrl = Ftrl.__new__(Ftrl)  # the kernels' arithmetic, as Keras's legacy Ftrl
            self.ftrl.learning_rate, self.ftrl.legacy = self.learning_rate, True
            self.ftrl.lr_power = self._value("_learning_rate_power")
            self.ftrl.l1 = self._value("_l1_regularization_strength")
            self.ftrl.l2 = self._value("_l2_regularization_strength")
            self.ftrl.l2_shrinkage = self._value("_l2_shrinkage_regularization_strength")
            self.ftrl.beta = self._value("_beta")
            self.ftrl.slots = ("accumulator", "linear")
            self.slots = ("accum", "linear")
            self.initials = {"accum": self._value("_initial_accumulator_value")}
            self.sparse_differs = True  # ResourceSparseApplyFtrl(V2)
        else:
            self.slots = ()

    def _value(self, attribute):
        value = getattr(self.inner, attribute)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            _refuse(f"tf.compat.v1.train.{self.kind}'s {attribute.strip('_')} {value!r} (a tensor)")
        return float(value)

    def update(self, params, grads, state):
        lr = jnp.float32(self.learning_rate)
        step = state["iterations"] + 1
        if self.kind == "GradientDescentOptimizer":  # ApplyGradientDescent
            return {k: params[k] - lr * grads[k] for k in params}, {**state, "iterations": step}
        if self.kind == "MomentumOptimizer":  # ApplyMomentum
            momentum = jnp.float32(self.momentum)
            new, accums = {}, {}
            for k in params:
                accum = state["momentum"][k] * momentum + grads[k]
                if self.nesterov:
                    new[k] = params[k] - (grads[k] * lr + accum * momentum * lr)
                else:
                    new[k] = params[k] - accum * lr
                accums[k] = accum
            return new, {"iterations": step, "momentum": accums}
        if self.kind == "RMSPropOptimizer":
            return self._rmsprop(params, grads, state, lr, step)
        if self.kind in ("AdagradOptimizer", "ProximalAdagradOptimizer"):
            return self._adagrad(params, grads, state, lr, step)
        if self.kind == "ProximalGradientDescentOptimizer":
            return self._proximal_gd(params, grads, state, lr, step)
        if self.kind == "AdadeltaOptimizer":
            return self._adadelta(params, grads, state, lr, step)
        if self.kind == "AdagradDAOptimizer":
            return self._adagrad_da(params, grads, state, lr, step)
        if self.kind == "FtrlOptimizer":  # ApplyFtrl(V2): the slots under v1's names
            renamed = {"accumulator": state["accum"], "linear": state["linear"]}
            new, out = self.ftrl.update(params, grads, {**state, **renamed})
            return new, {"iterations": step, "accum": out["accumulator"], "linear": out["linear"]}
        t = step.astype(jnp.float32)  # ApplyAdam
        beta_1, beta_2 = jnp.float32(self.beta_1), jnp.float32(self.beta_2)
        alpha = lr * jnp.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        new, ms, vs = {}, {}, {}
        for k in params:
            g = grads[k]
            m = state["m"][k] + (g - state["m"][k]) * (1 - beta_1)
            v = state["v"][k] + (jnp.square(g) - state["v"][k]) * (1 - beta_2)
            new[k] = params[k] - (m * alpha) / (jnp.sqrt(v) + jnp.float32(self.epsilon))
            ms[k], vs[k] = m, v
        return new, {"iterations": step, "m": ms, "v": vs}

    def _rmsprop(self, params, grads, state, lr, step):  # Apply(Centered)RMSProp
        rho, momentum = jnp.float32(self.rho), jnp.float32(self.momentum)
        eps = jnp.float32(self.epsilon)
        new, out = {}, {slot: {} for slot in self.slots}
        for k in params:
            g = grads[k]
            ms = state["rms"][k] + (jnp.square(g) - state["rms"][k]) * (1 - rho)
            denom = ms + eps
            if self.centered:
                mg = state["mg"][k] + (g - state["mg"][k]) * (1 - rho)
                denom = ms - jnp.square(mg) + eps
                out["mg"][k] = mg
            mom = state["momentum"][k] * momentum + lr * g / jnp.sqrt(denom)
            new[k] = params[k] - mom
            out["rms"][k], out["momentum"][k] = ms, mom
        return new, {"iterations": step, **out}

    def _adagrad(self, params, grads, state, lr, step):  # Apply(Proximal)Adagrad
        new, accs = {}, {}
        for k in params:
            g = grads[k]
            acc = state["accumulator"][k] + jnp.square(g)
            if self.kind == "AdagradOptimizer":
                new[k] = params[k] - g * lr * _rsqrt(acc)
            else:
                rate = lr * _rsqrt(acc)
                prox = params[k] - g * rate
                l1, l2 = jnp.float32(self.l1), jnp.float32(self.l2)
                if self.l1 > 0:
                    prox = jnp.sign(prox) * jnp.maximum(jnp.abs(prox) - rate * l1, 0.0)
                new[k] = prox / (1.0 + l2 * rate)
            accs[k] = acc
        return new, {"iterations": step, "accumulator": accs}

    def _proximal_gd(self, params, grads, state, lr, step):  # ApplyProximalGradientDescent
        l1, l2 = jnp.float32(self.l1), jnp.float32(self.l2)
        new = {}
        for k in params:
            prox = params[k] - grads[k] * lr
            if self.l1 > 0:
                prox = jnp.sign(prox) * jnp.maximum(jnp.abs(prox) - lr * l1, 0.0)
            new[k] = prox / (1.0 + lr * l2)
        return new, {**state, "iterations": step}

    def _adadelta(self, params, grads, state, lr, step):  # ApplyAdadelta
        rho, eps = jnp.float32(self.rho), jnp.float32(self.epsilon)
        new, accs, updates = {}, {}, {}
        for k in params:
            g = grads[k]
            acc = state["accum"][k] * rho + jnp.square(g) * (1 - rho)
            update = jnp.sqrt(state["accum_update"][k] + eps) * _rsqrt(acc + eps) * g
            new[k] = params[k] - update * lr
            updates[k] = state["accum_update"][k] * rho + jnp.square(update) * (1 - rho)
            accs[k] = acc
        return new, {"iterations": step, "accum": accs, "accum_update": updates}

    def _adagrad_da(self, params, grads, state, lr, step):  # ApplyAdagradDA
        l1, l2 = jnp.float32(self.l1), jnp.float32(self.l2)
        global_step = jnp.float32(self.global_step)
        new, accs, squares = {}, {}, {}
        for k in params:
            acc = state["gradient_accumulator"][k] + grads[k]
            square = state["gradient_squared_accumulator"][k] + jnp.square(grads[k])
            denom = l2 * global_step * lr + jnp.sqrt(square)
            if self.l1 > 0:
                shrunk = jnp.maximum(jnp.abs(acc) - l1 * global_step, 0.0)
                new[k] = jnp.sign(acc) * -lr * shrunk / denom
            else:
                new[k] = acc * -lr / denom
            accs[k], squares[k] = acc, square
        return new, {
            "iterations": step,
            "gradient_accumulator": accs,
            "gradient_squared_accumulator": squares,
        }


_COMPAT_V1 = (
    "GradientDescentOptimizer",
    "MomentumOptimizer",
    "AdamOptimizer",
    "RMSPropOptimizer",
    "AdagradOptimizer",
    "FtrlOptimizer",
    "ProximalAdagradOptimizer",
    "ProximalGradientDescentOptimizer",
    "AdadeltaOptimizer",
    "AdagradDAOptimizer",
)


def update(optimizer, params, grads, state, looked_up=None):
    """``optimizer.update(params, grads, state)``, as TensorFlow applies a sparse gradient to
    the weights in ``looked_up`` (variable name -> [rows] bool: the rows the batch looks up,
    duplicates and all, padding rows not counted) where ``optimizer.sparse_differs``: every
    other row of such a weight, and its slots' rows, stay as they were (the looked-up rows'
    gradient is the sum of their duplicates', as TensorFlow sums them before its kernel)."""
    new, out = optimizer.update(params, optimizer.clip(grads), state)
    if not looked_up or not optimizer.sparse_differs:
        return new, out
    new, out = dict(new), {k: dict(v) if isinstance(v, dict) else v for k, v in out.items()}
    for name, rows in looked_up.items():
        keep = rows.reshape(rows.shape + (1,) * (params[name].ndim - 1))
        new[name] = jnp.where(keep, new[name], params[name])
        for slot in optimizer.slots if optimizer.sparse_keeps_slots else ():
            out[slot][name] = jnp.where(keep, out[slot][name], state[slot][name])
    return new, out


def _rsqrt(x):
    import jax

    return jax.lax.rsqrt(x)


_BY_NAME = {
    "SGD": SGD,
    "Adam": Adam,
    "AdamW": AdamW,
    "Adamax": Adamax,
    "Adadelta": Adadelta,
    "Ftrl": Ftrl,
    "RMSprop": RMSprop,
    "Adagrad": Adagrad,
    "Nadam": Nadam,
}


def of(keras_optimizer):
    """The JAX update of ``keras_optimizer`` (a tf-keras optimizer, legacy or v2)."""
    name = type(keras_optimizer).__name__
    if name == "TFOptimizer":  # compile(tf.compat.v1.train.XOptimizer(...))
        inner = type(keras_optimizer.optimizer)
        if inner.__name__ not in _COMPAT_V1 or not inner.__module__.startswith("tensorflow."):
            _refuse(f"the optimizer {inner.__module__}.{inner.__name__}")
        return CompatV1(keras_optimizer)
    cls = _BY_NAME.get(name)
    module = type(keras_optimizer).__module__ or ""
    if cls is None or "keras" not in module:
        _refuse(f"the optimizer {module}.{name}")
    return cls(keras_optimizer)
