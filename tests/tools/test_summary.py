"""The run summary ``python -m tpushim script.py`` prints at the end (issue 25, item 7)."""

import types

import pytest

from tpushim import _cli, _console, _observe, _summary
from tpushim._errors import NoTPUError

SCRIPT = """
import numpy as np
import tensorflow as tf

x = np.random.RandomState(0).rand(20, 4)  # float64, as numpy gives it
y = np.random.RandomState(1).randint(0, 3, size=(20, 1))
model = tf.keras.Sequential([tf.keras.layers.Dense(3, activation="softmax", input_shape=(4,))])
model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy")
est = tf.keras.estimator.model_to_estimator(keras_model=model, model_dir={model_dir!r})
est.train(lambda: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8), steps=5)
est.evaluate(lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
"""


def test_summary_lines_from_observed_events():
    summary = _summary.Summary()
    estimator = object()
    summary.converted(types.SimpleNamespace(estimator=estimator, description="TPUEstimator(X)"))
    call = _observe.Call("train", estimator, None, 100)
    summary.adapted(call, "float64", "float64 input cast to float32")
    summary.adapted(call, "float64", "float64 input cast to float32")  # once per text
    summary.finished(call, 2.0, 100, 0.5)
    added = object()  # tf.estimator.add_metrics' estimator: its calls are the conversion's
    summary.derived(added, estimator, None)
    evaluate = _observe.Call("evaluate", added, None)
    summary.adapted(evaluate, "float64", "float64 input cast to float32")
    summary.finished(evaluate, 0.25, None, None)
    summary.adapted(_observe.Call("train", object(), None), "x", "another estimator's")
    assert summary.format().splitlines() == [
        "tpushim run summary:",
        "  estimator 1: model_to_estimator -> TPUEstimator(X)",
        "    what tpushim changed:",
        "      - float64 input cast to float32 [train, evaluate]",
        "    train()        2.00 s  100 steps, 50.0 steps/s  (first session run 0.50 s)",
        "    evaluate()     0.25 s",
    ]
    assert _summary.Summary().format() == ""  # nothing converted: silent, as the stock path is


@pytest.mark.slow  # trains an estimator
@pytest.mark.tpuestimator
def test_runner_prints_the_summary_unless_quiet(tmp_path, capsys):
    script = tmp_path / "legacy.py"
    script.write_text(SCRIPT.format(model_dir=str(tmp_path / "model")))
    try:
        assert _cli.main(["--mode", "cpu", str(script)]) == 0
        err = capsys.readouterr().err
        assert "tpushim run summary:" in err
        assert "estimator 1: model_to_estimator -> TPUEstimator(use_tpu=False" in err
        assert "float64 input cast to float32" in err and "[train, evaluate]" in err
        assert "short batches padded to 8 rows" in err  # 20 rows: the last eval batch is short
        assert "train() " in err and "5 steps," in err and "first session run" in err
        assert _cli.main(["-q", "--mode", "cpu", str(script)]) == 0
        assert "tpushim run summary" not in capsys.readouterr().err
    finally:
        _console.hide_conversions()


def test_what_ended_a_run_and_the_per_call_table():
    summary = _summary.Summary(table=True)
    estimator = object()
    summary.converted(
        types.SimpleNamespace(estimator=estimator, description="TPUEstimator(use_tpu=False, X)")
    )
    train = _observe.Call("train", estimator, None, 4)
    summary.calling(train)
    summary.finished(train, 2.0, 4, 0.5)
    evaluate = _observe.Call("evaluate", estimator, None)
    summary.calling(evaluate)
    summary.adapted(evaluate, "padding", "short batches padded to 8 rows")
    summary.finished(evaluate, 0.5, None, None)
    predict = _observe.Call("predict", estimator, None)
    summary.calling(predict)
    summary.adapted(
        predict,
        "batch-padding",
        "global batch size 10 does not divide among 8 TPU cores: each of its batches is padded to "
        "16 rows, weighted 0 (6 of 16, 37.5% of every step's work, wasted); use a multiple of 8",
    )
    summary.finished(predict, 0.25, None, None)
    summary.calling(_observe.Call("train", estimator, None, 4))  # never returns
    summary.ended(1, NoTPUError("TPU grpc://127.0.0.1:1 is not reachable"))
    lines = summary.format().splitlines()
    assert lines[-1] == "  the run ended: the script raised NoTPUError (its traceback is above)"
    assert any(
        line.startswith("    train()     raised NoTPUError after ")
        and line.endswith(": the run ended there")
        for line in lines
    )
    assert "no train/evaluate/predict call" not in summary.format()
    table = [line.split() for line in lines if line.startswith("    ") and "  " in line.strip()]
    assert ["call", "ran", "on", "seconds", "steps", "steps/s", "first", "run", "s", "padding"] + [
        "input",
        "wait",
    ] in (table)
    # No input wait told (a TPU's infeed is not measured): "-".
    assert ["train()", "TPU", "path", "on", "CPU", "2.00", "4", "2.0", "0.50", "none", "-"] in table
    assert [
        "evaluate()",
        "TPU",
        "path",
        "on",
        "CPU",
        "0.50",
        "-",
        "-",
        "-",
        "short",
        "batches",
        "-",
    ] in (table)
    assert ["predict()", "TPU", "path", "on", "CPU", "0.25", "-", "-", "-", "uneven", "batch"] + [
        "37.5%",
        "-",
    ] in table
    exited = _summary.Summary()
    exited.converted(types.SimpleNamespace(estimator=estimator, description="TPUEstimator(X)"))
    exited.calling(_observe.Call("predict", estimator, None))
    exited.ended(3)
    assert exited.format().splitlines()[-2:] == [
        "    predict()   did not return: the script exited with status 3 after 0.00 s",
        "  the run ended: the script exited with status 3",
    ]
    assert "call  " not in exited.format()  # no table unless asked for


@pytest.mark.slow  # runs a script
@pytest.mark.tpuestimator
def test_a_train_call_that_raised_is_named_in_the_summary(tmp_path, capsys):
    # An input_fn that fails inside train(): the call that never returned is named, and what
    # ended the run. (A TPU that does not answer now fails at model_to_estimator, before any call.)
    script = tmp_path / "legacy.py"
    failing = SCRIPT.replace(
        "est.train(lambda: tf.data",
        "def input_fn():\n    raise RuntimeError('the input went away')\n\n\n"
        "est.train(input_fn, steps=5)\nest.train(lambda: tf.data",
    )
    assert failing != SCRIPT
    script.write_text(failing.format(model_dir=str(tmp_path / "model")))
    try:
        assert _cli.main(["--mode", "cpu", str(script)]) == 1
        err = capsys.readouterr().err
        assert "RuntimeError: the input went away" in err
        summary = err[err.index("tpushim run summary:") :]
        assert "no train/evaluate/predict call" not in summary
        assert "    train()     raised RuntimeError after " in summary
        assert summary.rstrip().endswith(
            "the run ended: the script raised RuntimeError (its traceback is above)"
        )
    finally:
        _console.hide_conversions()


@pytest.mark.slow  # trains an estimator
@pytest.mark.tpuestimator
def test_summary_flag_and_variable_add_the_table(tmp_path, capsys, monkeypatch):
    script = tmp_path / "legacy.py"
    script.write_text(SCRIPT.format(model_dir=str(tmp_path / "model")))
    header = (
        "call        ran on           seconds  steps  steps/s  first run s  padding        "
        "input wait"
    )
    try:
        assert _cli.main(["--mode", "cpu", "--summary", str(script)]) == 0
        err = capsys.readouterr().err
        assert header in err and "evaluate()  TPU path on CPU" in err and "short batches" in err
        monkeypatch.setenv("TPUSHIM_SUMMARY", "1")
        assert _cli.main(["--mode", "cpu", str(script)]) == 0
        assert header in capsys.readouterr().err
        monkeypatch.setenv("TPUSHIM_SUMMARY", "tabel")  # strict, as every TPUSHIM_* variable
        with pytest.raises(SystemExit):
            _cli.main(["--mode", "cpu", str(script)])
        assert "TPUSHIM_SUMMARY='tabel' is not a yes/no value" in capsys.readouterr().err
    finally:
        _console.hide_conversions()


@pytest.mark.parametrize(
    "description,ran_on",
    [
        ("TPUEstimator(use_tpu=True, tpu=grpc://127.0.0.1:1, X)", "TPU"),
        ("TPUEstimator(use_tpu=False, X)", "TPU path on CPU"),
        ("the strategy engine: tf.distribute.TPUStrategy on TPU grpc://127.0.0.1:1, X", "TPU"),
        (
            "the strategy engine: tf.distribute.MirroredStrategy over this machine's devices, X",
            "TPU path on CPU",
        ),
    ],
)
def test_the_table_says_where_each_engine_ran(description, ran_on):
    summary = _summary.Summary(table=True)
    estimator = object()
    summary.converted(types.SimpleNamespace(estimator=estimator, description=description))
    call = _observe.Call("train", estimator, None, 5)
    summary.finished(call, 1.0, 5, 0.5)
    lines = summary.format().splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["call", "ran"])
    row = lines[header + 1]  # the table's row: its second column says where the call ran
    assert row.strip().split("  ")[1] == ran_on, row
