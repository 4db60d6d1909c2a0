"""The JAX engine: the Keras model's training step converted to JAX and run on every local
device (:mod:`tpushim._jax`), the input_fn and the checkpoints in TensorFlow on the host: for
TPUs JAX runs on and TensorFlow does not (Colab's v5e-1, Kaggle's v5e-8, TensorFlow >= 2.21 with
no ``tensorflow-tpu``), or where ``engine='jax'`` asks for it. This module adapts it to the
engine protocol; TensorFlow- and JAX-free at import.

``engine=auto`` chooses it where JAX sees a TPU and TensorFlow cannot use it, told from files
and package metadata alone (nothing imported, no device opened, no network: it cannot hang):
a TPU device file with libtpu installed (:func:`tpushim._detect.tpu_vm_device`), jax and
tf2jax installed, and no ``tensorflow-tpu`` of TensorFlow's own minor version.
"""

import importlib.metadata
import importlib.util
import sys

from tpushim import _versions
from tpushim._engines import base

INSTALL = 'pip install "tpushim[jax]"'


def _missing():
    """The names of the packages the engine needs that are not installed."""
    return [m for m in ("jax", "tf2jax") if importlib.util.find_spec(m) is None]


def tensorflow_tpu_version():
    """The installed ``tensorflow-tpu``'s version, or None."""
    try:
        return importlib.metadata.version("tensorflow-tpu")
    except importlib.metadata.PackageNotFoundError:
        return None


class JaxEngine(base.Engine):
    """The JAX engine (see the module)."""

    name = base.JAX
    chosen_why = (
        "JAX sees this machine's TPU (a TPU device file and libtpu) and TensorFlow cannot use "
        "it (no tensorflow-tpu of its version) (engine auto)"
    )
    said_when_passed = False  # where it cannot run, the other engines' reasons are the ones
    tpu_through_tensorflow = False  # JAX finds its devices (TensorFlow may see no TPU)

    def unavailable(self, tf_version, environ):
        from tpushim import _detect

        missing = _missing()
        if missing:
            return f"{' and '.join(missing)} not installed (the JAX engine: {INSTALL})"
        if _detect.tpu_vm_device(environ) is None:
            return "no TPU device JAX could use here (the JAX engine)"
        tpu_tf = tensorflow_tpu_version()
        if tpu_tf is not None and base._major_minor(tpu_tf) == base._major_minor(tf_version):
            return f"TensorFlow {tf_version} runs the TPU (tensorflow-tpu {tpu_tf})"
        return None

    def why_chosen(self, refused):
        return "; ".join([*refused, self.chosen_why])

    def refuse_here(self, settings):
        from tpushim._errors import ConversionError

        missing = _missing()
        if missing:
            raise ConversionError(
                f"engine={self.name} (from {settings.sources.get('engine')}): "
                f"{' and '.join(missing)} not installed. Install them with {INSTALL} "
                "(on a TPU VM, Colab or Kaggle: also jax[tpu]), or use engine='strategy'."
            )
        if not _versions.uses_own_estimator():
            raise ConversionError(
                f"engine={self.name} (from {settings.sources.get('engine')}): the JAX engine "
                "runs on TensorFlow >= 2.16 with tf-keras (where jax and tf2jax install, Python "
                ">= 3.12); on this TensorFlow use engine='tpuestimator' or 'strategy'."
            )

    def plan(self, keras_model, optimizer, custom_objects, settings, tpu, cluster):
        del cluster
        target = getattr(tpu, "target", None)
        if isinstance(target, str) and target.startswith("grpc://"):
            from tpushim._errors import ConversionError

            raise ConversionError(
                f"tpushim's JAX engine runs on this machine's own devices; the TPU {target} "
                f"(from {tpu.source}) is a TPU node TensorFlow reaches over gRPC, which JAX "
                "cannot use. Use engine='strategy' or 'tpuestimator', or run on a TPU VM."
            )
        from tpushim._jax import _build

        _build.refusals(keras_model, optimizer, custom_objects, settings)
        return None

    def build(self, prepared, arguments, settings, decision):
        from tpushim._jax import _build

        return _build.made(prepared, arguments, settings, decision)

    def owns(self, estimator):
        module = sys.modules.get("tpushim._jax._estimator")  # none made before it is imported
        return module is not None and isinstance(estimator, module.JaxEstimator)
