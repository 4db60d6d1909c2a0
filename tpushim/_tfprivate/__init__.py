"""Every private TensorFlow / Keras name the core uses, by TensorFlow component.

These are internals of tensorflow_estimator and Keras 2 in TensorFlow 2.12-2.15 (and tf_keras on
>= 2.16; the range in tpushim/version.py), pinned by tests/unit/test_tfprivate.py on each of them:
when a release moves one, the module of its component is the one to edit. Where the releases
differ, the fallback says which has what. The few names only the tooling reaches (the faked TPU
system's) live in tpushim/_preflight/faketpu.py.

* :mod:`.modules`: the private modules themselves, found per release (``keras_module``).
* :mod:`.graph`: graph building and the runtime (AutoGraph marks, op editing, seeds, compiler IR,
  deprecation warnings of tpushim's own calls).
* :mod:`.keras`: Keras 2's models and layers (the clone, BatchNormalization, DenseFeatures,
  functional nodes, subclassed models).
* :mod:`.keras_compile`: what ``compile()`` made (losses, metrics, optimizers).
* :mod:`.data`: tf.data and tf.nest.
* :mod:`.tpu`: TensorFlow's TPU names and TPUEstimator's TPU context.
* :mod:`.estimator`: tensorflow_estimator's (or the estimator API's twins on >= 2.16).
* :mod:`.checkpoint`: the variables stock's checkpoints save, under stock's names.

Callers name the component: ``_tfprivate.keras.clone_and_build_model(...)``. Importing this
package imports TensorFlow; ``import tpushim`` never does.
"""

from tpushim._tfprivate import (  # noqa: F401 (the components, in the order they import each other)
    checkpoint,
    data,
    estimator,
    graph,
    keras,
    keras_compile,
    modules,
    tpu,
)

# Before any of tpushim's calls: importing this package is the first thing a conversion does.
graph.silence_own_deprecation_warnings()
