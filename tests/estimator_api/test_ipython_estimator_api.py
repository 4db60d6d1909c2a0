"""``%load_ext tpushim`` on TensorFlow >= 2.16, where tf_keras's own ``model_to_estimator`` raises
NotImplementedError: a name a notebook bound to it before loading tpushim (the migrate_legacy_cnn
notebook imports it by name at the top) is rebound to tpushim's wrapper, and converts."""

import procs
import pytest

from tpushim import _versions

pytestmark = pytest.mark.skipif(
    not _versions.uses_own_estimator(), reason="tpushim's estimator API: TensorFlow >= 2.16"
)

SESSION = """\
import os
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf
from tensorflow.keras.estimator import model_to_estimator
m2e = tf.keras.estimator.model_to_estimator
%load_ext tpushim
model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
model.compile(optimizer="sgd", loss="mse")
estimator = model_to_estimator(keras_model=model, model_dir="model")
def input_fn():
    x = np.ones((4, 2), "float32")
    return tf.data.Dataset.from_tensor_slices(({model.input_names[0]: x}, x[:, :1])).batch(2)
estimator.train(input_fn, steps=1)
print("TRAINED", type(estimator).__module__, estimator.latest_checkpoint())
"""


@pytest.mark.slow  # a TensorFlow subprocess that trains
def test_a_name_bound_before_load_ext_is_rebound_and_converts(tmp_path):
    script = tmp_path / "session.ipy"
    script.write_text(SESSION)
    proc = procs.python(
        ["-m", "IPython", "--quick", "--no-banner", "--colors=NoColor", script],
        env={"IPYTHONDIR": str(tmp_path / "ipython")},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("model_to_estimator", "m2e"):
        assert (
            f"`{name}` was bound to tf_keras.src.estimator.model_to_estimator_v2 before "
            "%load_ext tpushim; tpushim rebound it to its wrapper"
        ) in proc.stdout, proc.stdout
    assert "TRAINED tpushim._estimator_api" in proc.stdout and proc.stdout.rstrip().endswith(
        "model.ckpt-1"
    )
