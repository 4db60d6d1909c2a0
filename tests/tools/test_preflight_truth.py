"""``python -m tpushim check`` touches nothing of the user's and says what tpushim refused.

Legacy scripts written under ``tmp_path``, run as their owners run them (``python script.py``)
and then checked (``python -m tpushim check script.py``): every file of the model_dir (and of an
export folder) keeps its name, size and hash through the check -- with ``keep_checkpoint_max``
rotation, v1 and v2 estimators, ``train_and_evaluate`` with an exporter -- and a model_dir that
does not exist is not created; a conversion tpushim refuses is one finding, the one
``tpushim.check`` gives, with exit status 1 and no traceback.
"""

import hashlib
import json
import os
import textwrap

import procs
import pytest
import tensorflow as tf

import tpushim

# The preflight runs the TPU path (cpu mode's TPUEstimator); `tpushim check` refuses on 2.16+.
pytestmark = [pytest.mark.slow, pytest.mark.tpuestimator]  # runs scripts

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # this checkout's tpushim


def _run(*args, tmp):
    """``python ARGS`` with this checkout's tpushim and ``tmp`` as the temporary directory."""
    return procs.python(args, env={"PYTHONPATH": ROOT, "TMPDIR": str(tmp)}, timeout=900)


def _files(root):
    """{relative path: (size, sha256)} of every file under ``root``."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            found[os.path.relpath(path, root)] = (os.path.getsize(path), digest)
    return found


TRAIN_AND_EXPORT = """
import os
import sys

import numpy as np
import tensorflow as tf

model_dir, fresh_dir, exports, spelling, max_steps = sys.argv[1:]
rng = np.random.RandomState(0)
x, y = rng.rand(64, 4).astype("float32"), rng.randint(0, 3, 64)


def build():
    model = tf.keras.Sequential(
        [tf.keras.layers.Dense(3, activation="softmax", input_shape=(4,), name="dense")]
    )
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def input_fn():
    return tf.data.Dataset.from_tensor_slices(({"dense_input": x}, y)).repeat().batch(8)


def serving():
    features = {"dense_input": tf.compat.v1.placeholder(tf.float32, [None, 4])}
    return tf.estimator.export.ServingInputReceiver(features, features)


to_estimator = {
    "v1": tf.compat.v1.keras.estimator.model_to_estimator,
    "v2": tf.keras.estimator.model_to_estimator,
}[spelling]
config = tf.estimator.RunConfig(
    model_dir=model_dir, keep_checkpoint_max=2, save_checkpoints_steps=4, tf_random_seed=1
)
est = to_estimator(keras_model=build(), config=config)
tf.estimator.train_and_evaluate(
    est,
    tf.estimator.TrainSpec(input_fn, max_steps=int(max_steps)),
    tf.estimator.EvalSpec(
        input_fn,
        steps=2,
        exporters=[tf.estimator.LatestExporter("latest", serving, exports_to_keep=2)],
        throttle_secs=0,
    ),
)
est.export_saved_model(exports, serving)
print("latest", tf.train.latest_checkpoint(est.model_dir).rsplit("/", 1)[1])
# A model_dir that does not exist yet, and none at all (stock makes a temporary one).
to_estimator(keras_model=build(), model_dir=fresh_dir).train(input_fn, steps=2)
to_estimator(keras_model=build()).train(input_fn, steps=2)
print("fresh", sorted(os.listdir(fresh_dir))[-1])  # what the run wrote (not there under check)
"""


@pytest.mark.parametrize("spelling", ["v1", "v2"])
def test_check_leaves_every_file_the_script_names_as_it_was(tmp_path, spelling):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_AND_EXPORT)
    model_dir, exports, tmp = tmp_path / "model", tmp_path / "exports", tmp_path / "tmp"
    tmp.mkdir()
    trained = _run(script, model_dir, tmp_path / "stock_fresh", exports, spelling, 12, tmp=tmp)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "latest model.ckpt-12" in trained.stdout
    # Rotation kept two checkpoints; the next save would delete model.ckpt-8 (which the
    # checkpoint file lists) if a checked run saved here.
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("model.ckpt-12")
    assert {"model.ckpt-8.index", "eval", "export", "keras"} <= set(os.listdir(model_dir))
    before = _files(model_dir), _files(exports), sorted(os.listdir(tmp))

    proc = _run("-m", "tpushim", "check", script, model_dir, tmp_path / "fresh", exports,
                spelling, 12, tmp=tmp)  # fmt: skip

    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]  # warnings only
    assert (_files(model_dir), _files(exports), sorted(os.listdir(tmp))) == before
    assert not (tmp_path / "fresh").exists()
    # The checked steps ran from the user's latest checkpoint, on a copy.
    assert "latest model.ckpt-15" in proc.stdout
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note: ")]
    assert notes == [
        f"note: model_dir {model_dir} is left as it is: the checked run writes to a scratch "
        "folder, starting from a copy of its latest checkpoint model.ckpt-12",
        f"note: export to {exports}: written to a scratch folder instead (nothing is written "
        "there)",
        f"note: model_dir {tmp_path / 'fresh'} is left as it is: the checked run writes to a "
        "scratch folder, empty (it does not exist, and is not created)",
        "note: no model_dir given: the checked run writes to a scratch folder (stock would make "
        "a temporary one)",
    ]
    for note in notes:  # each said as it happened, too
        assert f"tpushim check: {note[len('note: ') :]}" in proc.stderr
    # The script's last line reads the folder the check did not create: said, not a traceback.
    assert "Traceback" not in proc.stderr and "script-raised" not in proc.stdout
    assert (
        f"  [WARNING] model-dir-read at {script}:{len(TRAIN_AND_EXPORT.splitlines())} in "
        f"<module>: the script then raised FileNotFoundError: [Errno 2] No such file or "
        f"directory: '{tmp_path / 'fresh'}': it reads {tmp_path / 'fresh'}, which the check "
        "leaves as it is"
    ) in proc.stdout


# Models tpushim refuses to convert, one per kind (the same source builds them in this process
# for tpushim.check and in the script).
REFUSED_MODELS = """
import tensorflow as tf


def dense(name="dense"):
    return tf.keras.Sequential(
        [tf.keras.layers.Dense(1, input_shape=(4,), name=name)], name=f"{name}_model"
    )


def standardized_error(y_true, y_pred):  # a batch statistic: TPU cores cannot split it
    standardized = (y_pred - tf.reduce_mean(y_pred, 0)) / (tf.math.reduce_std(y_pred, 0) + 1e-3)
    return tf.reduce_mean(tf.square(standardized - y_true))


class Above(tf.keras.metrics.Metric):  # no get_config for its argument: cannot be copied
    def __init__(self, threshold):
        super().__init__(name="above")
        self.threshold = threshold
        self.count = self.add_weight("count", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.count.assign_add(tf.reduce_sum(tf.cast(y_pred > self.threshold, tf.float32)))

    def result(self):
        return self.count


class HandRolledSGD(tf.keras.optimizers.Optimizer):  # no legacy twin: estimators need one
    def build(self, var_list):
        super().build(var_list)

    def update_step(self, gradient, variable):
        variable.assign_sub(0.1 * gradient)


def with_loss():
    model = dense()
    model.compile("sgd", standardized_error)
    return model


def with_metric():
    model = dense()
    model.compile("sgd", "mse", metrics=[Above(0.5)])
    return model


def with_optimizer():
    model = dense()
    model.compile(HandRolledSGD(name="hand_rolled"), "mse")
    return model
"""

REFUSED_SCRIPT = """
import sys

import numpy as np
import tensorflow as tf

from models import dense, with_loss, with_metric, with_optimizer

model_dir = sys.argv[1]
x, y = np.ones((16, 4), "float32"), np.ones((16, 1), "float32")
to_estimator = tf.compat.v1.keras.estimator.model_to_estimator
for build in (with_loss, with_optimizer, with_metric):
    try:
        to_estimator(keras_model=build())
    except ValueError as e:
        print("refused:", type(e).__name__)
# A model_dir holding another model's checkpoint.
other = dense(name="other")
other.compile("sgd", "mse")
to_estimator(keras_model=other, model_dir=model_dir).train(
    lambda: tf.data.Dataset.from_tensor_slices(({"other_input": x}, y)).batch(8), steps=1
)
model = dense()
model.compile("sgd", "mse")
try:
    to_estimator(keras_model=model, model_dir=model_dir)
except ValueError as e:
    print("refused:", type(e).__name__)
# Uncaught, the script ends here; it fails as stock fails (the file is not there).
to_estimator(keras_model_path=model_dir + "/no_such_model.h5")
print("not reached")
"""

UNCHECKED = (
    " Not checked, as tpushim refused this model_to_estimator call: the script's input pipeline, "
    "the XLA compile of its training step and its TPU graphs."
)


def and_unchecked(message):
    return message.rstrip(".") + "." + UNCHECKED


def test_refused_conversions_are_findings_as_tpushim_check_gives_them(tmp_path):
    (tmp_path / "models.py").write_text(REFUSED_MODELS)
    script = tmp_path / "refused.py"
    script.write_text(REFUSED_SCRIPT)

    proc = _run("-m", "tpushim", "check", "--json", script, tmp_path / "model", tmp=tmp_path)

    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr  # the findings say all; no trace through tpushim
    assert "not reached" not in proc.stderr  # (the script's prints go to stderr with --json)
    report = json.loads(proc.stdout)
    found = {f["code"]: f for f in report["findings"]}
    # (the model that trained, "other", has its batch of 8 and no prefetch reported too)
    assert set(found) - {"batch-small", "no-prefetch"} == {
        "unconvertible-loss",
        "unconvertible-optimizer",
        "unconvertible-metric",
        "conversion-refused",
        "conversion-failed",
    }
    assert report["exit_code"] == 1 and not report["ok"]
    assert not (tmp_path / "model").exists()  # the script's own training ran on a scratch copy

    # Each model's finding is tpushim.check's, with what went unchecked said after it, uncut.
    models = {}
    exec(REFUSED_MODELS, models)
    for code, build in (
        ("unconvertible-loss", "with_loss"),
        ("unconvertible-optimizer", "with_optimizer"),
        ("unconvertible-metric", "with_metric"),
    ):
        (expected,) = [
            f for f in tpushim.check(models[build]()).findings if f.code.startswith("unconvert")
        ]
        assert (found[code]["where"], found[code]["fix"]) == (expected.where, expected.fix)
        assert found[code]["message"] == and_unchecked(expected.message)
        assert "TPU too" not in found[code]["message"]
    # Refused elsewhere in the conversion: the error itself, where the script called.
    refused = found["conversion-refused"]
    line = REFUSED_SCRIPT.splitlines().index(
        "    to_estimator(keras_model=model, model_dir=model_dir)"
    )
    assert refused["where"] == f"model_to_estimator call at {script}:{line + 1} in <module>"
    assert refused["message"].startswith(
        f"tpushim refused the conversion: ConversionError: model_dir {tmp_path / 'model'} "
        "already holds a checkpoint of different variables"
    )
    assert refused["message"].endswith(UNCHECKED)
    assert "tpushim-check-" not in refused["message"]  # the user's path, not the scratch copy's
    failed = found["conversion-failed"]
    assert failed["message"].startswith(
        f"model_to_estimator raised OSError: No file or directory found at {tmp_path / 'model'}"
    )
    assert "script-raised" not in found  # the failure is the conversion's: said once
    assert "while tpushim converted the model" in failed["message"]


def test_refused_conversion_in_text_names_no_missing_conversion(tmp_path):
    """The text report of a script stopped by a refusal: one finding, no false 'no-conversion'
    or 'script-raised', no traceback."""
    (tmp_path / "models.py").write_text(REFUSED_MODELS)
    script = tmp_path / "loss.py"
    script.write_text(
        textwrap.dedent("""
        import tensorflow as tf
        from models import with_loss

        tf.keras.estimator.model_to_estimator(keras_model=with_loss())
        """)
    )
    proc = _run("-m", "tpushim", "check", script, tmp=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "tpushim check: FAIL - would not run on a TPU (1 error, 0 warnings)"
    assert lines[1] == "checked: conversion"
    errors = [line for line in lines if line.startswith("  [")]
    assert len(errors) == 1 and errors[0].startswith(
        "  [ERROR] unconvertible-loss at loss of output 'dense' (standardized_error): "
    )
    assert errors[0].endswith(UNCHECKED)
    assert "Traceback" not in proc.stderr and "no-conversion" not in proc.stdout


REBUILT = """
import sys

import numpy as np
import tensorflow as tf

model_dir, steps = sys.argv[1], int(sys.argv[2])
rng = np.random.RandomState(0)
x, y = rng.rand(64, 4).astype("float32"), rng.randint(0, 3, 64)
model = tf.keras.Sequential(
    [tf.keras.layers.Dense(3, activation="softmax", input_shape=(4,), name="dense")]
)
model.compile("adam", "sparse_categorical_crossentropy")
converted = tf.keras.estimator.model_to_estimator(keras_model=model)
# A trainer that adds its own metrics by rebuilding the estimator around the model_fn.
config = tf.estimator.RunConfig(model_dir=model_dir, keep_checkpoint_max=1, tf_random_seed=1)
est = tf.estimator.Estimator(model_fn=converted.model_fn, config=config)
est.train(lambda: tf.data.Dataset.from_tensor_slices(({"dense_input": x}, y)).repeat().batch(8),
          steps=steps)
print("latest", tf.train.latest_checkpoint(est.model_dir).rsplit("/", 1)[1])
"""


def test_check_leaves_a_rebuilt_estimators_model_dir_as_it_was(tmp_path):
    # An Estimator built around a converted one's model_fn is tpushim's too (#34): the model_dir
    # its own call names moves to a scratch copy under check like a conversion's.
    script = tmp_path / "rebuilt.py"
    script.write_text(REBUILT)
    model_dir, tmp = tmp_path / "model", tmp_path / "tmp"
    tmp.mkdir()
    trained = _run(script, model_dir, 6, tmp=tmp)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "latest model.ckpt-6" in trained.stdout
    before = _files(model_dir)

    proc = _run("-m", "tpushim", "check", script, model_dir, 6, tmp=tmp)

    assert proc.returncode in (0, 1), proc.stdout + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert _files(model_dir) == before
    assert "latest model.ckpt-" in proc.stdout and "latest model.ckpt-6" not in proc.stdout
    assert (
        f"note: model_dir {model_dir} is left as it is: the checked run writes to a scratch "
        "folder, starting from a copy of its latest checkpoint model.ckpt-6"
    ) in proc.stdout
