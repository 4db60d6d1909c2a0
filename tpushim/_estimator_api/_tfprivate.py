"""Every private TensorFlow / tf_keras name tpushim's estimator API uses (TensorFlow >= 2.16).

tpushim/_tfprivate/ holds those of TensorFlow 2.12-2.15 and imports tensorflow_estimator at its
top, which does not import on 2.16 and later: these live here instead, pinned by
tests/estimator_api/test_estimator_api_scripts.py on the newest release tpushim/version.py names.
"""

from tensorflow.python.checkpoint import checkpoint as _checkpoint
from tensorflow.python.checkpoint import graph_view as _graph_view
from tensorflow.python.training import evaluation as _evaluation
from tensorflow.python.training import training_util as _training_util

# TensorFlow's own evaluation loop and its step-count hook, as tf.estimator used them.
evaluate_once = _evaluation._evaluate_once
get_or_create_eval_step = _evaluation._get_or_create_eval_step
StopAfterNEvalsHook = _evaluation._StopAfterNEvalsHook
# The read of the global step stock's train() makes before calling input_fn (an op: it moves the
# op-seed counter that unseeded random ops draw from, so it is made as stock makes it).
get_or_create_global_step_read = _training_util._get_or_create_global_step_read
# The collection that read lives in (stock adds the strategy's read of it there itself).
GLOBAL_STEP_READ_KEY = _training_util.GLOBAL_STEP_READ_KEY
# The object-based checkpoint of a converted Keras model (stock's model_to_estimator default).
ObjectGraphView = _graph_view.ObjectGraphView
frozen_saver = _checkpoint.frozen_saver


def keras_loaders_resolved_to_keras3(tf_module):
    """Names of TensorFlow's ``keras`` attributes already resolved to Keras 3 (too late for
    ``TF_USE_LEGACY_KERAS``). TensorFlow's lazy loader decides at its first attribute access and
    then puts the module it loaded in its place."""
    found = []
    for name, module in (
        ("tf.keras", tf_module),
        ("tf.compat.v1.keras", getattr(getattr(tf_module, "compat", None), "v1", None)),
        ("tf.compat.v2.keras", getattr(getattr(tf_module, "compat", None), "v2", None)),
    ):
        keras = vars(module).get("keras") if module is not None else None
        if keras is None:
            continue
        state = vars(keras)
        if "_tfll_initialized" in state:  # still the lazy loader
            if state["_tfll_initialized"] and state.get("_tfll_keras_version") != "tf_keras":
                found.append(name)
        elif not getattr(keras, "__name__", "").startswith("tf_keras"):
            found.append(name)  # the loader replaced itself with the Keras 3 module
    return found


def _export_modules():
    from tensorflow.python.saved_model.model_utils import export_output, export_utils

    return export_output, export_utils


# tf.estimator's export outputs and signature building live on in TensorFlow's saved_model code.
export_output, export_utils = _export_modules()


def compile_args(keras_model):
    """The arguments ``compile()`` was given (``loss``, ``loss_weights``, ...): the preflight's
    XLA check compiles its clone with them."""
    return keras_model._get_compile_args()


# A tf.distribute strategy in RunConfig (train_distribute / eval_distribute), run as stock 2.15's
# Estimator ran it: the flag that makes a v1 optimizer scale the loss by the replicas (the
# strategy's own context manager), and the graph's mark that it did, which decides how the
# reported loss is reduced over the replicas.
def scale_loss_for_estimator(strategy):
    """The strategy's context in which a v1 optimizer divides the loss by the replicas (stock's
    ``_scale_loss_for_estimator_enabled``), or a context that does nothing."""
    import contextlib

    enabled = getattr(strategy, "_scale_loss_for_estimator_enabled", None)
    return enabled() if enabled is not None else contextlib.nullcontext()


def loss_scaled_by_optimizer(graph):
    """Whether a v1 optimizer divided the loss by the replicas in ``graph``."""
    return getattr(graph, "_is_loss_scaled_by_optimizer", False)


def scaffold_init_fn(scaffold):
    """The ``init_fn`` a Scaffold was given (None if none): stock's combined scaffold of every
    replica's keeps the first."""
    return scaffold._user_init_fn
