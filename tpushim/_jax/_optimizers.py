"""The optimizer's update in JAX, as tf-keras computes it: the kernels its legacy optimizers call
(``ResourceApplyKerasMomentum``, ``ResourceApplyGradientDescent``, ``ResourceApplyAdam``,
``ResourceApplyRMSProp``, ``ResourceApplyCenteredRMSProp``, ``ResourceApplyAdagradV2``) and its
v2 optimizers' arithmetic (the same updates for SGD and Adam; RMSprop's and Adagrad's put
epsilon elsewhere). The state is Keras's: ``iterations`` and one slot per trainable weight under
Keras's slot names (``momentum``; ``m``, ``v``; ``rms``, ``momentum``, ``mg``; ``accumulator``;
the v2 RMSprop's ``velocity``, ``momentum``, ``average_gradient``), starting where Keras starts
them (zeros; Adagrad's at ``initial_accumulator_value``).

SGD (with momentum and nesterov), Adam, RMSprop (momentum, centered) and Adagrad, in either
spelling (``tf.keras.optimizers.SGD`` etc. and their ``legacy`` twins, or the strings compile
made them from; a conversion trains with the legacy twin, as stock). Every other optimizer, a
learning-rate schedule, ``decay``, ``amsgrad`` and gradient clipping are refused by name until
the engine computes them.
"""

import numbers

import jax.numpy as jnp

from tpushim._errors import ConversionError

_SUPPORTED = "SGD (momentum, nesterov), Adam, RMSprop and Adagrad"


def _refuse(what):
    raise ConversionError(
        f"tpushim's JAX engine does not compute {what} yet: it updates as Keras does for "
        f"{_SUPPORTED}, with a constant learning rate and no clipping. Compile the model with "
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

    def __init__(self, keras_optimizer):
        config = keras_optimizer.get_config()
        for key in ("clipnorm", "clipvalue", "global_clipnorm"):
            if config.get(key) is not None:
                _refuse(f"gradient clipping ({key}={config[key]})")
        if float(config.get("decay", 0.0) or 0.0) != 0.0:
            _refuse(f"the learning rate's decay ({config['decay']})")
        if config.get("weight_decay") not in (None, 0, 0.0) or config.get("use_ema"):
            _refuse("a v2 optimizer's weight_decay or use_ema")
        self.learning_rate = _number(config, "learning_rate", keras_optimizer)
        self.config = config
        self.legacy = ".legacy." in (type(keras_optimizer).__module__ or "")

    def init(self, params):
        state = {"iterations": jnp.zeros([], jnp.int64 if _x64() else jnp.int32)}
        for slot in self.slots:
            state[slot] = {k: jnp.full_like(v, self.initial) for k, v in params.items()}
        return state


def _x64():
    import jax

    return bool(jax.config.jax_enable_x64)


class SGD(Optimizer):
    def __init__(self, keras_optimizer):
        super().__init__(keras_optimizer)
        self.momentum = _number(self.config, "momentum", keras_optimizer)
        self.nesterov = bool(self.config.get("nesterov", False))
        self.slots = ("momentum",) if self.momentum else ()

    def update(self, params, grads, state):
        lr = jnp.float32(self.learning_rate)
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
    slots = ("m", "v")

    def __init__(self, keras_optimizer):
        super().__init__(keras_optimizer)
        if self.config.get("amsgrad"):
            _refuse("Adam's amsgrad")
        self.beta_1 = _number(self.config, "beta_1", keras_optimizer)
        self.beta_2 = _number(self.config, "beta_2", keras_optimizer)
        self.epsilon = float(self.config.get("epsilon", 1e-7))

    def update(self, params, grads, state):
        step = (state["iterations"] + 1).astype(jnp.float32)
        beta_1, beta_2 = jnp.float32(self.beta_1), jnp.float32(self.beta_2)
        beta_1_power, beta_2_power = beta_1**step, beta_2**step
        alpha = jnp.float32(self.learning_rate) * jnp.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        eps = jnp.float32(self.epsilon)
        new, ms, vs = {}, {}, {}
        for k in params:  # ResourceApplyAdam
            g = grads[k]
            m = state["m"][k] + (g - state["m"][k]) * (1 - beta_1)
            v = state["v"][k] + (jnp.square(g) - state["v"][k]) * (1 - beta_2)
            new[k] = params[k] - (m * alpha) / (jnp.sqrt(v) + eps)
            ms[k], vs[k] = m, v
        return new, {"iterations": state["iterations"] + 1, "m": ms, "v": vs}


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

    def update(self, params, grads, state):
        lr, rho = jnp.float32(self.learning_rate), jnp.float32(self.rho)
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
        lr, eps = jnp.float32(self.learning_rate), jnp.float32(self.epsilon)
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


def _rsqrt(x):
    import jax

    return jax.lax.rsqrt(x)


_BY_NAME = {"SGD": SGD, "Adam": Adam, "RMSprop": RMSprop, "Adagrad": Adagrad}


def of(keras_optimizer):
    """The JAX update of ``keras_optimizer`` (a tf-keras optimizer, legacy or v2)."""
    name = type(keras_optimizer).__name__
    cls = _BY_NAME.get(name)
    module = type(keras_optimizer).__module__ or ""
    if cls is None or "keras" not in module:
        _refuse(f"the optimizer {module}.{name}")
    return cls(keras_optimizer)
