"""Graph building and TensorFlow's runtime: AutoGraph's marks, op placement and editing, graph
seeds, compiler IR, the program's eager/graph behaviour, and TensorFlow's deprecation warnings
for tpushim's own calls.
"""

import contextlib
import functools
import os
import sys
import threading

import tensorflow as tf

from tpushim._tfprivate import modules


def not_converted(function):
    """``function`` (tpushim's own graph-building code) marked as AutoGraph's own artifact: a
    ``tf.function``, ``Dataset.map``, ``strategy.run`` or ``tf.map_fn`` that reaches it calls it
    as it is, without converting its Python, and AutoGraph's status beneath it stays what it
    was. Not ``tf.autograph.experimental.do_not_convert``: that disables the status beneath, and
    Keras converts a user's layer ``call`` and loss function by the status, so the user's
    ``if tf.reduce_sum(x) > 0:`` would fail where stock converts it.

    Converting tpushim's functions cost the strategy engine most of its time to the first
    checkpoint (95 conversions, about 2 s for an MLP on TF 2.21: ``bench_first_checkpoint``).
    A marked function has no Python control flow on tensors (nor a builtin such as ``len`` or
    ``range`` given one), and calls the user's Python only through Keras (a model, layer, loss
    or metric object's call, which converts it by the status) or :func:`user_code`; so do the
    functions it calls, which run unconverted too. Where TensorFlow lacks the marker, the
    function is returned as it is (converted, as before)."""
    try:
        from tensorflow.python.autograph.impl.api import autograph_artifact
    except ImportError:
        return function
    return autograph_artifact(function)


def user_code(function):
    """The user's ``function`` (a loss object's ``call``) as converted code calls it, for a
    :func:`not_converted` function that calls it directly: converted by AutoGraph where its
    status is enabled (inside the engine's ``tf.function``s, and in the replica functions a
    strategy runs there, which keep their status: they are not marked), Keras's own code left as
    it is; called as it is elsewhere (the TPUEstimator path's graph, where no AutoGraph runs)."""
    autograph = tf.__internal__.autograph
    ctx = autograph.control_status_ctx()
    if ctx.status.name != "ENABLED":
        return function
    return autograph.tf_convert(function, ctx)


@contextlib.contextmanager
def v1_summaries_skipped(skipped, on_scalar=None, on_other=None):
    """While active, TensorFlow's v1 summary functions (``tf.compat.v1.summary.scalar``,
    ``histogram``, ``image``, ``audio``, ``text``, ``tensor_summary``) make no op, in every
    thread (a strategy's replica threads too): their ``skip_summary`` check, the one a
    strategy's replicas after the first take, answers True. A ``scalar`` call's (name, tensor)
    goes to ``on_scalar`` where given, another's (function, name, tensor: its values; ``text``
    is its ``tensor_summary`` call) to ``on_other``; each call they do not take (return falsy
    for) adds its (function, name) to the set ``skipped``."""
    from tensorflow.python.distribute import summary_op_util

    own = summary_op_util.skip_summary

    def skip():
        caller = sys._getframe(1)
        kind, name = caller.f_code.co_name, caller.f_locals.get("name")
        tensor = caller.f_locals.get("values" if kind == "histogram" else "tensor")
        if kind == "scalar" and on_scalar is not None and on_scalar(name, tensor):
            return True
        if kind != "scalar" and on_other is not None and on_other(kind, name, tensor):
            return True
        skipped.add((kind, str(name)))
        return True

    summary_op_util.skip_summary = skip
    try:
        yield
    finally:
        if summary_op_util.skip_summary is skip:  # only ours: someone may have replaced it since
            summary_op_util.skip_summary = own


def place_ops(ops, device):
    """Places ``ops`` on ``device`` as if made in ``tf.device(device)``: what an op's own device
    says (e.g. ``/device:CPU:0``) is kept, the rest filled in from ``device``."""
    import tensorflow as tf

    outer = tf.DeviceSpec.from_string(device)
    for op in ops:
        op._set_device(outer.make_merged_spec(tf.DeviceSpec.from_string(op.device)))


def control_flow_context(graph):
    """The control-flow context ops are being built in (a loop, a cond branch, a TPU replicate
    computation): tensors made in one are usable only inside it. None at the top of a graph."""
    return graph._get_control_flow_context()


def function_def(graph, name):
    """The FunctionDef of function ``name`` in ``graph``'s library (a Dataset's map function,
    say), or None."""
    function = graph._get_function(name) if graph is not None else None
    return getattr(function, "definition", None) if function is not None else None


def reachable_from(inputs, targets):
    """The tensors and ops of ``targets`` that depend on ``inputs`` (a graph walk, as Keras's
    ``get_losses_for`` does it)."""
    keras_tf_utils = modules.keras_module("utils.tf_utils")
    return keras_tf_utils.get_reachable_from_inputs(inputs, targets)


def compiler_ir(function, *args, stage="hlo"):
    """``function``'s (a ``jit_compile`` ``tf.function``) compiler IR for ``args``, for the
    device an eager op runs on, without taking an op seed from the program's random state.

    Asked for no device, ``experimental_get_compiler_ir`` finds it by running an unseeded
    ``random_normal([])`` eagerly (``compiler_ir.maybe_get_device_name``, TF 2.15 and 2.21): in
    a program that called ``tf.random.set_seed`` that takes the eager context's next op seed
    (the one the program's next unseeded random op would get), and leaves that seed's kernel,
    its stream advanced, in the context's cache. A stateless op finds the same device and
    draws nothing. (TF >= 2.16 calls ``device_name`` deprecated, in favour of a
    ``platform_name`` that still runs the random op: its warning is left out.)
    """
    import warnings

    import tensorflow as tf

    device = tf.random.stateless_normal([], seed=[0, 0]).device
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "device_name is being deprecated", UserWarning)
        return function.experimental_get_compiler_ir(*args)(stage=stage, device_name=device)


# --- a pod's input (tpushim/_pods.py) ----------------------------------------------------------


def graph_seeds(graph):
    """``(graph seed, op-seed counter)`` of a graph: what the next random op made in it without a
    seed of its own is seeded from (``random_seed.get_seed``). The counter is None where this
    TensorFlow keeps none to read (ops then derive their seeds from graph state no one can reset).
    """
    from tensorflow.python.framework import random_seed

    counters = getattr(random_seed, "_graph_to_seed_dict", None)  # TF >= 2.5
    return graph.seed, None if counters is None else counters.get(graph, 0)


def set_graph_seeds(graph, seeds):
    """Sets what :func:`graph_seeds` reads: the random ops made next are seeded as they would
    have been when the graph was in that state."""
    from tensorflow.python.framework import random_seed

    seed, counter = seeds
    graph.seed = seed
    counters = getattr(random_seed, "_graph_to_seed_dict", None)
    if counters is not None and counter is not None:
        counters[graph] = counter


def update_input(op, index, tensor):
    """Makes ``tensor`` input ``index`` of ``op`` (a graph being built): a host's copy of a
    pipeline then reads that host's file names."""
    op._update_input(index, tensor)


def add_control_input(op, control):
    """Makes ``op`` (a graph being built) wait for ``control`` to run first: the input wait's
    timestamp before a batch read made earlier (:mod:`tpushim._input_wait`)."""
    op._add_control_input(control)


def set_string_attr(op, name, value):
    """Sets a string attribute (bytes) of an op in a graph being built (e.g. a dataset op's
    ``deterministic``)."""
    from tensorflow.core.framework import attr_value_pb2

    op._set_attr(name, attr_value_pb2.AttrValue(s=value))


# --- TensorFlow's deprecation warnings, for tpushim's own calls -----------------------------------

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # tpushim/


class _WarnOutsideTpushim:
    """What ``tensorflow.python.util.deprecation._PRINT_DEPRECATION_WARNINGS`` becomes: true (as
    TensorFlow had it) except where the deprecated name is called from tpushim's own code.

    Every deprecated TensorFlow name checks that flag, in its wrapper, before it logs its
    ``From <caller>: X is deprecated`` lines and marks X as warned (once per process): so a call
    tpushim makes (``TPUConfig``, ``TPUEstimator``, ``TPUEstimatorSpec``, ...: about 70 lines a
    run) neither prints nor uses up the warning a user's own call of X then gets, exactly as
    without tpushim. Per call site, as the wrapper's own ``_call_location`` reads it -- not
    ``deprecation.silence()``, which turns the flag off for every thread (and the user's model
    code run inside tpushim's model_fn) while it is held; ``silence()`` still works over this.
    """

    def __init__(self, value):
        self.value = value

    def __bool__(self):
        if not self.value:
            return False
        # 0: here, 1: the deprecation wrapper testing the flag, 2: the code that called X.
        try:
            caller = sys._getframe(2)
        except ValueError:  # read from the top of a stack: no caller of ours
            return True
        return not caller.f_code.co_filename.startswith(_PACKAGE)

    def __repr__(self):
        return f"{type(self).__name__}({self.value!r})"


def silence_own_deprecation_warnings():
    """Installs :class:`_WarnOutsideTpushim` (once; idempotent)."""
    from tensorflow.python.util import deprecation

    current = deprecation._PRINT_DEPRECATION_WARNINGS
    if not isinstance(current, _WarnOutsideTpushim):
        deprecation._PRINT_DEPRECATION_WARNINGS = _WarnOutsideTpushim(current)


_PROGRAM_SHAPES = []  # the program's TensorShape behaviour, per eager_runtime entered


@contextlib.contextmanager
def eager_runtime():
    """A context in which TensorFlow executes eagerly although the program disabled it
    (``tf.compat.v1.disable_v2_behavior()``), with TF2's TensorShape (``shape[0]`` an int, as
    the engine reads it): ``context.eager_mode()`` and the v2 TensorShape switch, both as the
    program had them on exit. The program's other v1 behaviours stay; its own code (an
    input_fn) sees its TensorShape again within :func:`programs_shapes`."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import tensor_shape

    before = tensor_shape._TENSORSHAPE_V2_OVERRIDE
    _PROGRAM_SHAPES.append(before)
    tensor_shape._TENSORSHAPE_V2_OVERRIDE = True
    try:
        with context.eager_mode():
            yield
    finally:
        tensor_shape._TENSORSHAPE_V2_OVERRIDE = before
        _PROGRAM_SHAPES.pop()


def for_graph_program():
    """True within :func:`eager_runtime`: the engine runs for a program that disabled v2
    behaviour."""
    return bool(_PROGRAM_SHAPES)


@contextlib.contextmanager
def programs_shapes():
    """Within :func:`eager_runtime`, the program's own TensorShape behaviour (``Dimension``s
    where it disabled v2 behaviour: ``shape[1].value``), for its code; elsewhere nothing."""
    from tensorflow.python.framework import tensor_shape

    if not _PROGRAM_SHAPES:
        yield
        return
    inside = tensor_shape._TENSORSHAPE_V2_OVERRIDE
    tensor_shape._TENSORSHAPE_V2_OVERRIDE = _PROGRAM_SHAPES[-1]
    try:
        yield
    finally:
        tensor_shape._TENSORSHAPE_V2_OVERRIDE = inside


def in_programs_shapes(fn):
    """``fn`` run within :func:`programs_shapes`: the program's own code (a ``Lambda``'s
    function, a loss function) sees the TensorShape its program had (``shape[1].value``) where
    the engine's eager clone calls it; elsewhere ``fn`` as it is."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with programs_shapes():
            return fn(*args, **kwargs)

    return run


#: The stateful random ops' generated functions a trace may take draws from, by module name.
RANDOM_OP_FUNCTIONS = (
    "random_uniform",
    "random_standard_normal",
    "truncated_normal",
    "random_uniform_int",
)
_RANDOM_HOOK = threading.local()
_RANDOM_HOOK_LOCK = threading.Lock()


@contextlib.contextmanager
def random_ops_hooked(take):
    """Inside, in this thread, each stateful random op a trace makes (``gen_random_ops``'
    :data:`RANDOM_OP_FUNCTIONS`, which ``tf.random.uniform``, ``tf.nn.dropout``,
    ``tf.random.normal`` ... call) is ``take(name, original, shape, dtype, seed, seed2,
    **rest)``'s answer. Other threads keep the original: the module's functions are swapped
    while any thread is inside, and the swap passes their calls straight through."""
    from tensorflow.python.ops import gen_random_ops

    def hooked(name, original):
        @functools.wraps(original)
        def call(*args, **kwargs):
            current = getattr(_RANDOM_HOOK, "take", None)
            if current is None:
                return original(*args, **kwargs)
            return current(name, original, *args, **kwargs)

        call._tpushim_random_hook = True
        return call

    with _RANDOM_HOOK_LOCK:
        if not getattr(gen_random_ops, "_tpushim_hooked", 0):
            originals = {n: getattr(gen_random_ops, n) for n in RANDOM_OP_FUNCTIONS}
            gen_random_ops._tpushim_originals = originals
            for n, f in originals.items():
                setattr(gen_random_ops, n, hooked(n, f))
        gen_random_ops._tpushim_hooked = getattr(gen_random_ops, "_tpushim_hooked", 0) + 1
    outer = getattr(_RANDOM_HOOK, "take", None)
    _RANDOM_HOOK.take = take
    try:
        yield
    finally:
        _RANDOM_HOOK.take = outer
        with _RANDOM_HOOK_LOCK:
            gen_random_ops._tpushim_hooked -= 1
            if not gen_random_ops._tpushim_hooked:
                for n, f in gen_random_ops._tpushim_originals.items():
                    if getattr(getattr(gen_random_ops, n), "_tpushim_random_hook", False):
                        setattr(gen_random_ops, n, f)  # only while it is still ours
