"""TPU preflight: one model or input that triggers each finding, and one that does not."""

import contextlib
import os

import numpy as np
import pytest
import tensorflow as tf
import tfcases

import tpushim

# The preflight runs the TPU path (cpu mode's TPUEstimator); `tpushim check` refuses on 2.16+.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.tpuestimator,
]  # trains estimators or runs scripts: outside the fast tier

X, Y = tfcases.data(n=128)


def clean_input(batch=64, **kwargs):
    def input_fn():
        return (
            tf.data.Dataset.from_tensor_slices((X, Y))
            .repeat()
            .batch(batch)
            .prefetch(tf.data.AUTOTUNE)
        )

    return input_fn


def run(model=None, input_fn=None, **kwargs):
    return tpushim.check(
        model if model is not None else tfcases.sequential(),
        input_fn if input_fn is not None else clean_input(),
        **kwargs,
    )


def test_clean_model_and_input_report_nothing():
    report = run()
    assert report.ok and report.exit_code == 0
    assert report.findings == []
    assert "XLA compile of the training step" in report.checked
    assert "OK - nothing blocks a TPU" in str(report)
    assert report.to_dict()["ok"] is True and '"findings": []' in report.to_json()
    assert "<table>" in report._repr_html_()


def test_op_without_xla_kernel_names_the_layer():
    model = tfcases.sequential(
        extra_layers=(
            tf.keras.layers.Lambda(
                lambda x: x + 0.0 * tf.strings.to_number(tf.strings.as_string(x)), name="strs"
            ),
        )
    )
    report = run(model)
    assert not report.ok and report.exit_code == 1
    finding = next(f for f in report.findings if f.code == "xla-unsupported-op")
    assert finding.where == "layer 'strs' (op AsString)"
    assert "XLA" in finding.message and "input pipeline" in finding.fix
    assert "FAIL" in str(report) and "xla-unsupported-op at layer 'strs'" in str(report)


# Feature columns inside the model: a vocabulary lookup and a crossed column, in a DenseFeatures
# layer of a sub-model (tpushim moves only a top-level layer's lookups to the input pipeline:
# tests/tpuestimator/test_feature_columns.py). XLA stops at the lookup table's handle (it takes it for an
# uninitialised variable) before naming any op.
FEATURE_COLUMNS = """
import json
import numpy as np
import tensorflow as tf
import tpushim

fc = tf.feature_column
color = fc.categorical_column_with_vocabulary_list("color", ["red", "green", "blue"])
shape = fc.categorical_column_with_identity("shape", 4)
columns = [fc.indicator_column(color), fc.indicator_column(fc.crossed_column([color, shape], 10))]
inputs = {
    "color": tf.keras.Input((1,), name="color", dtype=tf.string),
    "shape": tf.keras.Input((1,), name="shape", dtype=tf.int64),
}
dense_features = tf.keras.layers.DenseFeatures(columns, name="dense_features")
hidden = tf.keras.Model(inputs, dense_features(inputs), name="columns")(inputs)
model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, activation="sigmoid")(hidden))
model.compile(tf.keras.optimizers.legacy.SGD(0.1), "binary_crossentropy")
features = {"color": np.array([["red"], ["blue"]] * 8), "shape": np.array([[1], [2]] * 8)}
input_fn = lambda: tf.data.Dataset.from_tensor_slices((features, np.ones((16, 1)))).batch(16)
findings = tpushim.check(model, input_fn).findings
print("FINDINGS " + json.dumps([[f.code, f.where, f.message] for f in findings]))
"""


@pytest.mark.parametrize("v1", [False, True], ids=["eager", "disable_v2_behavior"])
def test_xla_findings_name_the_op_and_the_layer_where_xla_does_not(v1):
    """Issue 24, item 9: for feature columns in the model, XLA's own error is a RET_CHECK about
    an uninitialised variable; the finding names each op it would stop at, and the layer."""
    if v1:  # graph mode: the step is compiled on the batch's values, in a scratch graph
        code = "import tensorflow as tf; tf.compat.v1.disable_v2_behavior()\n" + FEATURE_COLUMNS
        proc = procs.python(code=code)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = proc.stdout
    else:
        printed = []
        exec(FEATURE_COLUMNS, {"print": printed.append})
        out = printed[0]
    findings = json.loads(out.split("FINDINGS ", 1)[1])
    xla = {(code, where) for code, where, _ in findings if code.startswith("xla")}
    assert xla == {
        ("xla-unsupported-op", "layer 'columns' (op LookupTableFindV2)"),
        ("xla-unsupported-op", "layer 'columns' (op SparseCross)"),
    }, findings
    messages = " ".join(message for _, _, message in findings)
    # the feature column, in the node's name
    assert "columns/dense_features/color_X_shape_indicator/SparseCross)" in messages
    assert "RET_CHECK" not in messages


@pytest.mark.parametrize("v1", [False, True], ids=["eager", "disable_v2_behavior"])
def test_feature_columns_of_a_top_level_layer_are_moved_not_errors(v1):
    """Issue 34, item 6: the same layer at the model's top level: its lookups and crosses run in
    the input pipeline (one INFO finding), and the step the TPU runs compiles with XLA."""
    code = FEATURE_COLUMNS.replace(
        'hidden = tf.keras.Model(inputs, dense_features(inputs), name="columns")(inputs)',
        "hidden = dense_features(inputs)",
    )
    if v1:
        code = "import tensorflow as tf; tf.compat.v1.disable_v2_behavior()\n" + code
    proc = procs.python(code=code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    findings = json.loads(proc.stdout.split("FINDINGS ", 1)[1])
    codes = {code for code, _, _ in findings}
    assert ("feature-columns-on-host", "layer 'dense_features'") in {(c, w) for c, w, _ in findings}
    assert not codes & {"xla-unsupported-op", "xla-compile", "string-input", "preflight-failed"}, (
        findings
    )


def _sequence_model():
    tf.keras.backend.clear_session()
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Embedding(20, 4, input_shape=(None,), name="embed"),
            tf.keras.layers.GlobalAveragePooling1D(),
            tf.keras.layers.Dense(3, activation="softmax", name="probs"),
        ]
    )
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy")
    return model


def _sequences(padded_shapes):
    lengths = np.random.RandomState(0).randint(1, 10, size=64)
    rows = [np.arange(n) % 20 for n in lengths]

    def input_fn():
        ds = tf.data.Dataset.from_generator(
            lambda: iter((r, 1) for r in rows),
            output_signature=(tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64)),
        )
        return ds.padded_batch(64, padded_shapes=padded_shapes).prefetch(1)

    return input_fn


def test_dynamic_shapes_reaching_the_model():
    report = run(_sequence_model(), _sequences(([None], [])))
    finding = next(f for f in report.findings if f.code == "dynamic-shape")
    assert finding.severity == "error" and finding.where == "features (a single tensor)"
    fixed = run(_sequence_model(), _sequences(([12], [])))
    assert "dynamic-shape" not in fixed.codes()
    assert "python-generator" in fixed.codes()  # from_generator: a Python generator feeds it


def test_float64_and_string_inputs():
    def input_fn(dtype, with_text):
        def fn():
            features = {"hidden_input": X.astype(dtype)}
            if with_text:
                features["text"] = np.array(["a"] * len(X))
            return tf.data.Dataset.from_tensor_slices((features, Y)).batch(64).prefetch(1)

        return fn

    report = run(input_fn=input_fn("float64", True))
    assert ("float64-input", "info", "feature 'hidden_input'") in [
        (f.code, f.severity, f.where) for f in report.findings
    ]
    assert ("string-input", "error", "feature 'text'") in [
        (f.code, f.severity, f.where) for f in report.findings
    ]
    assert run(input_fn=input_fn("float32", False)).findings == []


@pytest.mark.parametrize(
    "batch,code,severity",
    [(100, "batch-indivisible", "warning"), (16, "batch-small", "warning"), (64, None, None)],
)
def test_batch_against_cores(batch, code, severity):
    report = run(input_fn=clean_input(batch))
    if code is None:
        assert report.findings == []
        return
    finding = next(f for f in report.findings if f.code == code)
    assert finding.severity == severity
    if code == "batch-indivisible":  # padded, never an error: the waste and the sizes without it
        assert report.ok
        assert finding.message == (
            "global batch size 100 does not divide among 8 TPU cores: each of its batches is "
            "padded to 104 rows, weighted 0 (4 of 104, 3.8% of every step's work, wasted)"
        )
        assert "use a multiple of 8 (96 or 104) to waste nothing" in finding.fix
    else:
        assert "at least 64, ideally 1024" in finding.fix


def test_explicit_batch_size_is_checked_instead_of_the_input():
    assert "batch-indivisible" in run(batch_size=100).codes()


def test_pipeline_that_starves_a_tpu():
    no_prefetch = lambda: tf.data.Dataset.from_tensor_slices((X, Y)).batch(64)
    report = run(input_fn=no_prefetch)
    assert [(f.code, f.severity) for f in report.findings] == [("no-prefetch", "info")]
    assert report.ok

    def python_per_example():
        ds = tf.data.Dataset.from_tensor_slices((X, Y)).map(
            lambda x, y: (tf.py_function(lambda v: v * 2, [x], tf.float32), y)
        )
        return ds.map(lambda x, y: (tf.ensure_shape(x, [4]), y)).batch(64).prefetch(1)

    assert "per-example-python" in run(input_fn=python_per_example).codes()


def test_host_only_ops_inside_the_model():
    summary = tf.keras.layers.Lambda(
        lambda x: tf.identity(x) if tf.compat.v1.summary.histogram("acts", x) is not None else x,
        name="summarise",
    )
    report = run(tfcases.sequential(extra_layers=(summary,)))
    finding = next(f for f in report.findings if f.code == "host-only-op")
    assert finding.where == "layer 'summarise' (op HistogramSummary)"
    assert "host-only-op" not in run().codes()
    # A scalar summary is carried to TensorBoard by the TPU step's host call (tests/tpuestimator/test_summaries.py).
    scalar = tf.keras.layers.Lambda(
        lambda x: (
            tf.identity(x) if tf.compat.v1.summary.scalar("m", tf.reduce_mean(x)) is not None else x
        ),
        name="scalar_summary",
    )
    assert "host-only-op" not in run(tfcases.sequential(extra_layers=(scalar,))).codes()


def test_unconvertible_metric_and_optimizer():
    report = run(tfcases.sequential(metrics=[tfcases.NoConfigMetric(0.5)]))
    assert "unconvertible-metric" in report.codes() and not report.ok
    report = run(tfcases.sequential(optimizer=tfcases.HandRolledSGD(name="hand")))
    assert "unconvertible-optimizer" in report.codes()


def test_iterations_per_loop_small_for_the_steps():
    report = run(iterations_per_loop=2, steps=1000)
    finding = next(f for f in report.findings if f.code == "iterations-per-loop-small")
    assert "every 2 steps (1000 steps in all)" in finding.message
    assert "iterations-per-loop-small" not in run(steps=1000).codes()


def test_input_that_is_not_a_dataset_does_not_end_the_check():
    queue_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
        X.astype("float64"), Y, batch_size=12, shuffle=False
    )

    def computed():  # tensors computed from the queue's: not traceable to a Dataset
        features, labels = queue_fn()
        return features * 2.0, labels

    report = run(input_fn=computed)
    assert "input-not-dataset" in report.codes() and not report.ok
    # The checks after it still run on what the input gives: dtype, batch, model.
    assert {"float64-input", "batch-indivisible"} <= set(report.codes()), report.codes()
    assert "XLA compile of the training step" in report.checked


def test_numpy_input_fn_is_checked_as_the_dataset_tpushim_feeds():
    fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
        X, Y, batch_size=64, shuffle=False, num_epochs=None
    )
    report = run(input_fn=fn)
    assert report.ok and "input-not-dataset" not in report.codes(), report.codes()


def test_arrays_embedded_in_the_input_graph_are_a_finding_fed_ones_not(monkeypatch):
    # Scaled down from 100 MB: 32 KB of arrays against a 16 KB bar, above the few KB of small
    # constants any pipeline holds (numpy_input_fn's shuffle order: about 2.6 KB).
    monkeypatch.setattr("tpushim._preflight.input_checks.LARGE_INPUT_CONSTANTS", 16 * 2**10)
    x, y = tfcases.data(n=1365)  # 1365 x (4 + 1) float32 values: 27 KB, and int labels

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(64, drop_remainder=True)

    found = [f for f in run(input_fn=input_fn).findings if f.code == "large-input-constants"]
    assert [(f.severity, f.where) for f in found] == [("warning", "input_fn 'input_fn'")]
    assert "MB of constants" in found[0].message and "numpy_input_fn" in found[0].fix
    fed = tf.compat.v1.estimator.inputs.numpy_input_fn(x, y, batch_size=64, shuffle=True)
    assert "large-input-constants" not in run(input_fn=fed).codes()


def test_eval_set_smaller_than_its_batch_is_judged_by_the_declared_batch():
    report = run(input_fn=lambda: tf.data.Dataset.from_tensor_slices((X[:102], Y[:102])).batch(128))
    assert "batch-indivisible" not in report.codes(), report.codes()


def test_a_failing_check_is_a_finding_naming_where():
    import types

    from tpushim import _observe, _preflight

    recorder = _preflight.Recorder()
    # Told (as an observer) of a conversion of something that is no Keras model.
    recorder.converted(
        _observe.Conversion(
            estimator=None,
            keras_model=object(),
            arguments={"custom_objects": None},
            settings=types.SimpleNamespace(batch_size=None, iterations_per_loop=None),
            model_fn=None,
            description="",
        )
    )
    report = recorder.report()
    failed = [f for f in report.findings if f.code == "preflight-failed"]
    assert failed and failed[0].severity == "error" and ".py:" in failed[0].where
    assert "AttributeError" in failed[0].message and not report.ok


def test_check_leaves_the_users_model_untouched():
    model = tfcases.sequential(extra_layers=(tf.keras.layers.BatchNormalization(name="bn"),))
    before = [w.copy() for w in model.get_weights()]
    run(model)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


# --- python -m tpushim check ------------------------------------------------------------------

import json
import re

import procs

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # this checkout's tpushim
LEGACY = os.path.join(ROOT, "tests", "scripts", "legacy_text_classifier.py")


def _check_cli(*args, **env):
    return procs.python(
        ["-m", "tpushim", "check", *args], env=dict(env, PYTHONPATH=ROOT), timeout=900
    )


def test_cli_bundled_demo_checks_clean():
    import tpushim.demo.legacy_mlp as demo

    proc = _check_cli(demo.__file__)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tpushim check: OK - nothing blocks a TPU (0 errors, 0 warnings)" in proc.stdout
    assert "TPU graphs for 8 cores (1 host)" in proc.stdout  # its TPU graphs built, no error
    # Progress on stderr, a line as each phase starts and one with its time as it ends.
    for phase in (
        r"running \S+legacy_mlp.py in cpu mode \(training capped at 3 steps\)",
        r"XLA compile of the training step",
        r"TPU train graph for 8 cores",
        r"TPU evaluate graph for 8 cores",
    ):
        assert re.search(rf"^tpushim check: {phase} \.\.\.$", proc.stderr, re.M), phase
        assert re.search(rf"^tpushim check: {phase}: [0-9.]+ s, (ok|done)$", proc.stderr, re.M), (
            phase
        )


def test_cli_script_that_raises_exits_3(tmp_path):
    script = tmp_path / "crashes.py"
    script.write_text("raise ValueError('no such column: price')\n")
    proc = _check_cli("--json", str(script))
    assert proc.returncode == 3, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["schema_version"] == 1 and report["exit_code"] == 3
    raised = [f for f in report["findings"] if f["code"] == "script-raised"]
    assert "ValueError: no such column: price" in raised[0]["message"]
    assert "ValueError: no such column: price" in proc.stderr  # the traceback, as python prints it


def test_cli_keeps_a_scripts_exit_message(tmp_path):
    script = tmp_path / "exits.py"
    script.write_text("import sys\nsys.exit('no training data in ./data')\n")
    proc = _check_cli(str(script))
    assert proc.returncode == 1, proc.stderr[-3000:]  # no conversion to check: that blocks
    assert "no training data in ./data" in proc.stderr.splitlines()  # printed as python prints it
    assert (
        "[WARNING] script-exit at script: the script exited with status 1 ('no training data in ./data')"
        in proc.stdout
    )
    assert "[ERROR] no-conversion" in proc.stdout


def test_cli_legacy_script_fails_with_json_report():
    proc = _check_cli("--json", LEGACY, "500", TPUSHIM_ITERATIONS_PER_LOOP="2")
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout)  # the script's own prints went to stderr
    assert report["ok"] is False
    found = {(f["code"], f["where"]) for f in report["findings"]}
    assert ("xla-unsupported-op", "layer 'debug_strings' (op AsString)") in found
    assert ("batch-indivisible", "input_fn 'train_input_fn' (batch of 100)") in found
    assert ("float64-input", "features (a single tensor)") in found
    assert ("iterations-per-loop-small", "setting iterations_per_loop=2") in found
    assert "'accuracy'" in proc.stderr  # the script ran (capped) and printed its evaluation


# --- TPU graphs built for a faked TPU system --------------------------------------------------


def _record_calls(model_dir, config=None):
    x, y = tfcases.data(n=64)
    fn = tfcases.dataset_input_fn(x, y, batch=32)
    tpushim.patch(mode="cpu")
    from tpushim import _preflight

    with _preflight.recording() as recorder:
        est = tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(), model_dir=str(model_dir), config=config
        )
        est.train(fn, steps=1)
        est.evaluate(fn)
        list(est.predict(tfcases.dataset_input_fn(x, batch=32)))
    return recorder


def _global_step(model_dir):  # of the latest checkpoint, as its name says (model.ckpt-STEP)
    return int(tf.train.latest_checkpoint(str(model_dir)).rsplit("-", 1)[1])


def test_recording_caps_the_scripts_runs_and_ends_with_its_context(tmp_path, monkeypatch):
    from tpushim import _preflight

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the scratch copies: under tmp_path
    x, y = tfcases.data(n=64)
    endless = tfcases.dataset_input_fn(x, y, batch=32, repeat=True)
    tpushim.patch(mode="cpu")
    stock = tf.estimator.LinearClassifier(
        [tf.feature_column.numeric_column("hidden_input", (4,))],
        n_classes=3,
        model_dir=str(tmp_path / "stock"),
    )
    stock_input = lambda: (
        tf.data.Dataset.from_tensor_slices(({"hidden_input": x}, y)).repeat().batch(32)
    )
    with _preflight.recording() as recorder:
        est = tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(), model_dir=str(tmp_path / "model")
        )
        est.train(endless, max_steps=1000)  # max_steps gives way to the cap
        assert _global_step(est.model_dir) == recorder.MAX_TRAIN_STEPS  # in a scratch copy
        est.train(endless, steps=1)  # fewer than the cap: as asked
        assert _global_step(est.model_dir) == recorder.MAX_TRAIN_STEPS + 1
        assert est.evaluate(endless)["global_step"] == recorder.MAX_TRAIN_STEPS + 1  # ends
        stock.train(stock_input, max_steps=5)  # an estimator tpushim did not convert runs as asked
        assert _global_step(tmp_path / "stock") == 5
    assert not (tmp_path / "model").exists()  # the script's model_dir: not even created
    assert not [p for p in os.listdir(tmp_path) if p.startswith("tpushim-check-")]  # removed
    after = tf.keras.estimator.model_to_estimator(
        keras_model=tfcases.sequential(), model_dir=str(tmp_path / "model")
    )
    after.train(endless, max_steps=10)  # after the context: the model_dir and max_steps as given
    assert _global_step(tmp_path / "model") == 10
    report = recorder.report(tpu_graphs=False)
    assert "input pipeline" in report.checked and "no-conversion" not in report.codes()


def test_tpu_graphs_of_the_scripts_calls(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    recorder = _record_calls(tmp_path / "model")
    one_host = recorder.report(num_cores=8)
    assert "TPU graphs for 8 cores (1 host)" in one_host.checked
    assert "tpu-graph" not in one_host.codes()
    pod = recorder.report(num_cores=16)
    assert "TPU graphs for 16 cores (2 hosts)" in pod.checked
    assert "tpu-graph" not in pod.codes()  # predict() too: host 0 feeds every core
    # Which path each input takes on the pod's hosts (tests/proofs/test_pods.py: what each one feeds).
    paths = {f.where: (f.severity, f.message) for f in pod.findings if f.code == "pod-input"}
    assert paths == {
        f"{event}() input_fn 'input_fn'": ("info", f"on 2 TPU hosts: exact path: {why}")
        for event, why in (
            (
                "train",
                "every host reads the whole input and keeps its share, as the input "
                "cannot be cut by files: it reads no files (TensorSliceDataset)",
            ),
            (
                "evaluate",
                "every host reads the whole input and keeps its share, as an "
                "evaluation reads every example once, in order",
            ),
            (
                "predict",
                "one input pipeline (host 0's) reads the whole input and feeds every "
                "core, in order",
            ),
        )
    }
    assert "pod-input" not in one_host.codes()
    assert pod.ok
    # Built in a scratch folder of its own, removed afterwards; the script's model_dir untouched.
    assert not [p for p in os.listdir(scratch) if p.startswith("tpushim-check-")]
    assert not (tmp_path / "model").exists()


class _AddsLoss(tf.keras.layers.Layer):
    """Adds a loss from what it is called on (Keras keeps it until the model's next call)."""

    def call(self, x):
        self.add_loss(tf.reduce_mean(x))
        return tf.identity(x)


def _checked_after_a_conversion(tmp_path, model, tpu_graphs=False):
    x, y = tfcases.data(n=64)
    tpushim.patch(mode="cpu")
    from tpushim import _preflight

    with _preflight.recording() as recorder:
        est = tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=str(tmp_path))
        est.train(tfcases.dataset_input_fn(x, y, batch=32), steps=1)
    return recorder.report(tpu_graphs=tpu_graphs)


def test_the_xla_check_traces_the_users_model_itself_after_a_conversion(tmp_path, monkeypatch):
    """A script's XLA check traces its step on the user's model, not a clone (a third of the
    check for MobileNetV2): after model_to_estimator (which leaves Keras's classes v1), with a
    loss container of its own. The model is left as it was: weights, its compiled loss unbuilt,
    the losses its last call added. Without the classes made v2 again the trace fails; without
    the call losses kept the model holds the trace's tensors (the controls)."""
    from tpushim import _tfprivate
    from tpushim._preflight import model_checks

    def no_clone(*args):
        raise AssertionError("cloned")

    monkeypatch.setattr(model_checks, "_clone", no_clone)
    model = tfcases.sequential(extra_layers=(_AddsLoss(name="adds_loss"),))
    x, _ = tfcases.data(n=4)
    model(x)  # an eager call: its loss is the layer's until the model's next call
    before = [w.copy() for w in model.get_weights()]
    losses = model.losses
    report = _checked_after_a_conversion(tmp_path / "kept", model)
    assert report.ok and "XLA compile of the training step" in report.checked
    assert [id(t) for t in model.losses] == [id(t) for t in losses]
    assert not model.compiled_loss._built
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)

    monkeypatch.setattr(
        _tfprivate.keras_compile, "call_losses_kept", lambda model: contextlib.nullcontext()
    )
    model = tfcases.sequential(extra_layers=(_AddsLoss(name="adds_loss"),))
    model(x)
    losses = model.losses
    report = _checked_after_a_conversion(tmp_path / "not-kept", model)
    assert report.ok, [(f.code, f.message) for f in report.findings if f.severity == "error"]
    assert [id(t) for t in model.losses] != [id(t) for t in losses]  # the trace's tensors

    monkeypatch.setattr(_tfprivate.keras, "as_v2_classes", lambda model: None)
    model = tfcases.sequential()
    finding = next(
        f
        for f in _checked_after_a_conversion(tmp_path / "v1", model).findings
        if f.code == "xla-compile"
    )
    assert "Please check the implementation of" in finding.message  # Keras: "invalid state"


def test_the_checked_run_writes_no_graph_text_into_its_scratch_model_dir(tmp_path, monkeypatch):
    """graph.pbtxt (the training graph as text, about a second for an image model) is left out
    of the scratch model_dir the check removes unread; the checkpoints, their .meta graphs and
    the events are written, and a graph.pbtxt anywhere else too."""
    from tensorflow.python.training import training_util

    from tpushim import _preflight

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    write_graph = training_util.write_graph
    x, y = tfcases.data(n=64)
    tpushim.patch(mode="cpu")
    with _preflight.recording():
        est = tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(), model_dir=str(tmp_path / "model")
        )
        est.train(tfcases.dataset_input_fn(x, y, batch=32), steps=1)
        written = set(os.listdir(est.model_dir))
        training_util.write_graph(tf.Graph(), str(tmp_path / "elsewhere"), "graph.pbtxt")
    assert "graph.pbtxt" not in written and "model.ckpt-1.meta" in written
    assert any(f.startswith("events.out.tfevents") for f in written)
    assert os.path.exists(tmp_path / "elsewhere" / "graph.pbtxt")
    assert training_util.write_graph is write_graph


def _tpu_graphs_built(tmp_path, monkeypatch):
    """(graph, scaffold) of each TPU graph the preflight builds for ``_record_calls``'s script."""
    from tpushim._preflight import faketpu

    built = []
    session_starts = faketpu.FakedTPU.session_starts

    def recording(self, scaffold, hooks):
        built.append((tf.compat.v1.get_default_graph(), scaffold))
        return session_starts(self, scaffold, hooks)

    monkeypatch.setattr(faketpu.FakedTPU, "session_starts", recording)
    report = _record_calls(tmp_path / "model").report(num_cores=8)
    assert report.ok and "tpu-graph" not in report.codes()
    return built


SAVER_OPS = {"SaveV2", "RestoreV2", "MergeV2Checkpoints"}


def test_the_tpu_graphs_leave_out_the_checkpoint_saver(tmp_path, monkeypatch):
    """Each TPU graph (train, evaluate, predict) is TPUEstimator's but for the checkpoint saver
    (a save and a restore of every variable, a second per graph for an image model): tpushim's
    scaffold_fn makes it on the host from the same variables as in the cpu-mode run, which built
    it and saved with it. The rest of the Scaffold is built; without the left-out saver the
    graphs hold the saver's ops (the control)."""
    from tpushim._preflight import graph_checks

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    built = _tpu_graphs_built(tmp_path / "left-out", monkeypatch)
    assert len(built) == 3
    for graph, scaffold in built:
        types = {op.type for op in graph.get_operations()}
        assert "TPUReplicateMetadata" in types and not types & SAVER_OPS
        assert scaffold.init_op is not None and scaffold.ready_op is not None
    monkeypatch.setattr(graph_checks, "saver_left_out", lambda model_fn: model_fn)
    control = _tpu_graphs_built(tmp_path / "control", monkeypatch)
    assert [bool({op.type for op in g.get_operations()} & SAVER_OPS) for g, _ in control] == [
        True
    ] * 3


def _host_only_layers():
    """Layers holding each kind of host-only op: a histogram summary (a warning), tf.print and
    a Python function (errors), and a scalar summary (carried by the host call: no finding)."""

    def summarised(make):
        return lambda x: tf.identity(x) if make(x) is not None else x

    return (
        tf.keras.layers.Lambda(
            summarised(lambda x: tf.compat.v1.summary.histogram("acts", x)), name="histogram"
        ),
        tf.keras.layers.Lambda(
            summarised(lambda x: tf.compat.v1.summary.scalar("m", tf.reduce_mean(x))),
            name="scalar",
        ),
        tf.keras.layers.Lambda(
            lambda x: tf.identity(x) if tf.compat.v1.Print(x, [x]) is not None else x,
            name="printed",
        ),
        tf.keras.layers.Lambda(
            lambda x: (
                x + tf.ensure_shape(tf.numpy_function(np.zeros_like, [x], tf.float32), x.shape)
            ),
            name="python",
        ),
    )


def test_a_scripts_host_only_ops_read_from_its_tpu_train_graph(tmp_path, monkeypatch):
    """The script's check reads the host-only ops from the TPU train graph's model_fn (no second
    build of the model_fn for training) and finds what building it again finds, in place."""
    from tpushim import _model_fn, _preflight

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    x, y = tfcases.data(n=64)
    tpushim.patch(mode="cpu")
    with _preflight.recording() as recorder:
        est = tf.keras.estimator.model_to_estimator(
            keras_model=tfcases.sequential(extra_layers=_host_only_layers()),
            model_dir=str(tmp_path / "model"),
        )
        est.train(tfcases.dataset_input_fn(x, y, batch=32), steps=1)
    built = []
    make_model_fn = _model_fn.make_model_fn
    monkeypatch.setattr(
        _model_fn, "make_model_fn", lambda *a, **k: built.append(1) or make_model_fn(*a, **k)
    )
    shared = recorder.report()
    assert built == [] and "TPU graphs for 8 cores (1 host)" in shared.checked
    alone = recorder.report(tpu_graphs=False)  # no TPU graph: the model_fn built for the check
    assert built == [1]
    host_only = [f for f in alone.findings if f.code == "host-only-op"]
    assert [(f.severity, f.where) for f in host_only] == [
        ("warning", "layer 'histogram' (op HistogramSummary)"),
        ("error", "layer 'printed' (op Print)"),
        ("error", "layer 'python' (op PyFunc)"),
    ]
    assert [f for f in shared.findings if f.code != "tpu-graph"] == alone.findings
    assert shared.checked[: len(alone.checked)] == alone.checked


def test_tpu_graph_error_from_the_users_tpu_config(tmp_path):
    from tensorflow_estimator.python.estimator.tpu import tpu_config

    config = tpu_config.RunConfig(tpu_config=tpu_config.TPUConfig(num_shards=8))
    report = _record_calls(tmp_path, config).report(num_cores=16)
    found = [f for f in report.findings if f.code == "tpu-graph"]
    assert [f.where for f in found] == [
        f"{event}() of model 'sequential'" for event in ("train", "evaluate", "predict")
    ]
    for finding in found:
        assert "TPUConfig.num_shards is not set correctly" in finding.message
        assert "(grpc://" not in finding.message  # the faked TPU's address is not shown
        assert "remove num_shards" in finding.fix


@pytest.mark.parametrize("cores_per_replica", [1, 2])
def test_model_parallelism_in_the_users_tpu_config_builds(tmp_path, monkeypatch, cores_per_replica):
    """A TPU-written script's ``TPUConfig(num_cores_per_replica=...)``: the faked TPU system
    answers the topology query as a TPU does, so no false tpu-graph error."""
    from tensorflow_estimator.python.estimator.tpu import tpu_config

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    config = tpu_config.RunConfig(
        tpu_config=tpu_config.TPUConfig(num_cores_per_replica=cores_per_replica)
    )
    report = _record_calls(tmp_path / "model", config).report(num_cores=8)
    assert "TPU graphs for 8 cores (1 host)" in report.checked
    assert not [f for f in report.findings if f.code.startswith("tpu-graph")], report


def test_a_call_the_faked_system_cannot_build_is_unchecked_not_tpuestimators():
    """A call that never reaches the faked TPU's session (here: one that returns at once) is a
    limit of the preflight: a warning that the graph went unchecked, never TPUEstimator's error."""
    from tpushim._preflight import Report, faketpu, graph_checks

    class ReturnsAtOnce:
        def train(self, input_fn, steps=None):
            return self

    report = Report()
    with faketpu.faked_tpu_system() as tpu:
        graph_checks._build_one(report, tpu, ReturnsAtOnce(), "train", None, None, 8, "m")
    (finding,) = report.findings
    assert (finding.code, finding.severity) == ("tpu-graph-unchecked", "warning")
    assert "not something TPUEstimator or a TPU raised" in finding.message
    assert "TPUEstimator's own" not in finding.fix and tpu.master not in finding.message
