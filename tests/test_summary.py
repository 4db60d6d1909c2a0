"""The run summary ``python -m tpushim script.py`` prints at the end (issue 25, item 7)."""

import types

import pytest

from tpushim import _cli, _console, _observe, _summary

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
    evaluate = _observe.Call("evaluate", estimator, None)
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
    assert "no model_to_estimator call was converted" in _summary.Summary().format()


@pytest.mark.slow  # trains an estimator
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
