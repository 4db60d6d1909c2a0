"""The private TensorFlow and Keras modules themselves, found per release: tensorflow_estimator's
(None on TensorFlow >= 2.16, which has none) and Keras 2's (``keras.src``, ``keras`` or ``tf_keras.src``).
"""

import tensorflow as tf

try:
    from tensorflow_estimator.python.estimator import estimator as estimator_lib
    from tensorflow_estimator.python.estimator import extenders, keras_lib
    from tensorflow_estimator.python.estimator.export import export_lib
    from tensorflow_estimator.python.estimator.tpu import (
        tpu_config,
        tpu_context,
        tpu_estimator,
    )
except ImportError:
    # TensorFlow >= 2.16: no tensorflow_estimator. Only the strategy engine's modules import this
    # file there (tpushim._estimator_api gives the estimator); their Keras names come from tf_keras.
    ON_TF_KERAS = True
    estimator_lib = extenders = keras_lib = export_lib = None
    tpu_config = tpu_context = tpu_estimator = None
else:
    ON_TF_KERAS = False


@tf.autograph.experimental.do_not_convert
def keras_module(module):
    """Keras 2's private module ``module`` (e.g. ``engine.training_utils_v1``): in ``keras.src``
    (Keras 2.13-2.15), ``keras`` (Keras 2.12), or ``tf_keras.src`` (TensorFlow >= 2.16, where
    ``keras`` is Keras 3).

    Not converted by AutoGraph: the strategy engine's step (a ``tf.function``) reaches it through
    the loss helpers, and AutoGraph would follow ``importlib.import_module`` into the frozen
    ``_gcd_import`` and warn that it cannot (once per trace) -- there is nothing to convert.
    """
    import importlib

    if ON_TF_KERAS:
        return importlib.import_module(f"tf_keras.src.{module}")
    try:
        return importlib.import_module(f"keras.src.{module}")  # Keras >= 2.13 keeps it in keras.src
    except ImportError:
        return importlib.import_module(f"keras.{module}")  # Keras 2.12
