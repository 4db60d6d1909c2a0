"""ddtrace's ordering matrix: import, patch and unpatch (and a scope) in every order, each in a fresh
interpreter that imports TensorFlow once.

After every step the child probes every public spelling of ``model_to_estimator`` -- attribute
paths looked up now and names bound when TensorFlow was imported (before ``patch()`` in the orders
that import first) -- by calling it with ``keras_model=None`` under ``mode="tpu"`` and no TPU: a
call that goes through tpushim raises ``NoTPUError`` at once, one that does not gets stock's
``ValueError``. Cheap (no graph is built), and it is the real call path. It also reports whether
``keras_lib.model_to_estimator`` is the very function keras_lib defined (or one wrapper around it)
and whether any public name was replaced; likewise for ``tf.estimator.add_metrics``' module (the second
target). Real conversions per spelling are tests/core/test_patch.py's and tests/tpuestimator/test_add_metrics.py's.

On TensorFlow >= 2.16 (tpushim's estimator API) the same matrix runs on what is wrapped there:
tf_keras's ``model_to_estimator`` functions, which stock raises NotImplementedError from (bare
``keras`` is Keras 3 there, and has no estimator; ``tf.estimator`` exists only while tpushim is on,
so no name of it can be bound before). The public attributes are tpushim's wrappers exactly while
patched, and the functions themselves delegate to tpushim exactly then (names bound before convert).
"""

import json

import procs
import pytest

from tpushim import _versions

pytestmark = pytest.mark.slow  # runs TensorFlow subprocesses: outside the fast tier

ESTIMATOR_API = _versions.uses_own_estimator()

CHILD = r"""
import json, sys, types
import tpushim
from tpushim import _detect, _patch, _versions
_detect.DEVICE_GLOBS = ()  # no TPU VM device files on any machine this runs on: mode tpu has no TPU
ESTIMATOR_API = _versions.uses_own_estimator()
# What tpushim wraps: keras_lib's function (<= 2.15), tf_keras's v2 function (>= 2.16).
KERAS_LIB, TARGET = ("tf_keras.src.estimator", "model_to_estimator_v2") if ESTIMATOR_API else (_patch.KERAS_LIB, _patch.TARGET)
state = {"names": None, "original": None, "own code": None, "scope": None}


def do_import():
    import tensorflow as tf
    from tensorflow.keras.estimator import model_to_estimator as bound_v2
    from tensorflow.compat.v1.keras.estimator import model_to_estimator as bound_v1
    state["spellings"] = {
        "tf.keras.estimator": lambda: tf.keras.estimator.model_to_estimator,
        "tf.compat.v1.keras.estimator": lambda: tf.compat.v1.keras.estimator.model_to_estimator,
        "tf.compat.v2.keras.estimator": lambda: tf.compat.v2.keras.estimator.model_to_estimator,
        "bound: from tensorflow.keras.estimator import": lambda: bound_v2,
        "bound: from tensorflow.compat.v1.keras.estimator import": lambda: bound_v1,
    }
    if not ESTIMATOR_API:  # bare keras is Keras 3 on >= 2.16 (no estimator); tf.estimator is tpushim's
        import keras
        from tensorflow.estimator import add_metrics  # imports extenders, add_metrics' module
        state["add_metrics"] = add_metrics
        state["spellings"]["keras.estimator"] = lambda: keras.estimator.model_to_estimator
    state["names"] = {k: get() for k, get in state["spellings"].items()}


def probe():
    if state["names"] is None:
        return {"tensorflow imported": "tensorflow" in sys.modules}
    through = {}
    for name, get in state["spellings"].items():
        try:
            get()(keras_model=None)
            through[name] = "returned"
        except tpushim.NoTPUError:
            through[name] = "tpushim"
        except ValueError as e:
            through[name] = "stock" if "Either `keras_model`" in str(e) else repr(e)
        except NotImplementedError as e:  # tf_keras's own function on >= 2.16
            through[name] = "stock" if ESTIMATOR_API and "not available in your installation" in str(e) else repr(e)
    current = getattr(sys.modules[KERAS_LIB], TARGET)  # imported by the first call above
    wrapped = _patch.is_ours(current)
    inner = current.__wrapped__ if wrapped else current
    if state["original"] is None:  # the function itself, the first time we see it
        assert type(inner) is types.FunctionType and inner.__module__ == KERAS_LIB, inner
        state["original"] = inner
    # Its own code (not tpushim's trampoline), the very code object each time.
    own = inner.__code__.co_filename == sys.modules[KERAS_LIB].__file__
    if own and state["own code"] is None:
        state["own code"] = inner.__code__
    import tensorflow as tf
    record = {"through": through, "keras_lib": "wrapper" if wrapped else "original",
              "one layer around the very original": inner is state["original"],
              "own code": own and inner.__code__ is state["own code"]}
    if ESTIMATOR_API:  # the public attributes are tpushim's wrappers while patched (the names bound before: never)
        def kind(value):
            if _patch.is_ours(value):
                return "wrapper" if type(value.__wrapped__) is types.FunctionType else "other"
            return "function" if type(value) is types.FunctionType and value.__module__ == KERAS_LIB else "other"
        public = {kind(get()) for k, get in state["spellings"].items() if not k.startswith("bound")}
        record["public names"] = "replaced" if public == {"wrapper"} else "unchanged" if public == {"function"} else repr(public)
        record["bound names unchanged"] = all(get() is state["names"][k] for k, get in state["spellings"].items() if k.startswith("bound"))
        record["tf.estimator"] = "tpushim's" if _patch.is_ours(getattr(tf, "estimator", None)) else (
            "absent" if not hasattr(tf, "estimator") else "other")
        return record
    estimator_lib = sys.modules[_patch.EXTENDERS].estimator_lib  # add_metrics' view of it
    record.update({"extenders": "wrapper" if _patch.is_ours(estimator_lib) else "original",
                   "add_metrics name unchanged": tf.estimator.add_metrics is state["add_metrics"],
                   "public names unchanged": all(get() is state["names"][k] for k, get in state["spellings"].items())})
    return record


def enter():
    state["scope"] = tpushim.patched(mode="tpu")
    state["scope"].__enter__()


STEPS = {"import": do_import, "patch": lambda: tpushim.patch(mode="tpu"), "unpatch": tpushim.unpatch,
         "enter": enter, "exit": lambda: state["scope"].__exit__(None, None, None),
         "reset": lambda: (_patch.reset(), state.update(original=None, **{"own code": None}))}
for step in sys.argv[1:]:
    STEPS[step]()
    print(json.dumps({"step": step, **probe()}))
"""

#: Orders with the import in the middle or at the end: one interpreter each.
ORDERS = [
    "patch patch import patch unpatch unpatch import",
    "patch unpatch import",
    "unpatch import patch unpatch",
    "unpatch patch import unpatch patch",
    "enter import exit patch enter exit unpatch",
]

#: Orders after the import: independent sequences in one interpreter, each ended by a reset that
#: restores the original (asserted) and forgets everything.
AFTER_IMPORT = [
    "patch unpatch",
    "unpatch patch unpatch",
    "patch patch unpatch unpatch",
    "unpatch unpatch",
    "patch unpatch patch unpatch",
    "enter patch exit unpatch",
    "patch enter unpatch exit",
]


def run(steps):
    proc = procs.python(steps, code=CHILD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def check(records):
    """Every record against what its step sequence wants: through tpushim exactly while patched or
    in a scope; the original restored exactly otherwise; public names never replaced."""
    patched = scoped = imported = False
    for record in records:
        step = record["step"]
        patched = {"patch": True, "unpatch": False, "reset": False}.get(step, patched)
        scoped = {"enter": True, "exit": False, "reset": False}.get(step, scoped)
        imported = imported or step == "import"
        wanted = patched or scoped
        where = f"after {step} (patched={patched}, scope={scoped})"
        if not imported:
            assert record == {"step": step, "tensorflow imported": False}, where
            continue
        expected = "tpushim" if wanted else "stock"
        assert set(record["through"].values()) == {expected}, (where, record["through"])
        assert len(record["through"]) == (5 if ESTIMATOR_API else 6), record
        assert record["keras_lib"] == ("wrapper" if wanted else "original"), where
        assert record["one layer around the very original"], where
        if (
            ESTIMATOR_API
        ):  # the function's own code exactly while unpatched (it delegates while patched)
            assert record["own code"] is not wanted, where
            assert record["public names"] == ("replaced" if wanted else "unchanged"), where
            assert record["bound names unchanged"], where
            assert record["tf.estimator"] == ("tpushim's" if wanted else "absent"), where
            continue
        assert record["own code"], where
        assert record["extenders"] == ("wrapper" if wanted else "original"), where
        assert record["add_metrics name unchanged"], where
        assert record["public names unchanged"], where


@pytest.mark.parametrize("order", ORDERS)
def test_order(order):
    records = run(order.split())
    assert [r["step"] for r in records] == order.split()
    check(records)


def test_orders_after_the_import_in_one_interpreter():
    steps = ["import"]
    for order in AFTER_IMPORT:
        steps += order.split() + ["reset"]
    records = run(steps)
    assert len(records) == len(steps)
    check(records)
