"""The preflight of a subclassed model fed a ``SparseTensor`` feature: every engine refuses
``train()`` on it by name, before anything is written (its call would read the sparse tensor on
the devices); ``python -m tpushim check`` reports that refusal in the engine's words, as an
error (exit status 1), and builds nothing of the step the engine never gets to."""

import importlib.util
import json
import sys

import pytest

#: tests/sparse_program.py's input, read by a subclassed model (stock 2.15 trains it)
SCRIPT = """
import sys
import tensorflow as tf
import sparse_program


class Subclassed(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.encode = tf.keras.layers.CategoryEncoding(6, "multi_hot")
        self.out = tf.keras.layers.Dense(1)

    def call(self, inputs):
        dense = tf.sparse.to_dense(inputs["x"])
        return self.out(tf.concat([self.encode(inputs["ids"]), dense], 1))


model = Subclassed()
model.compile(tf.keras.optimizers.SGD(0.1), "mse")
estimator = tf.keras.estimator.model_to_estimator(
    keras_model=model, model_dir=sys.argv[1], checkpoint_format="saver"
)
estimator.train(sparse_program.input_fn(), steps=4)
estimator.evaluate(sparse_program.input_fn())
"""

NO_JAX = not all(importlib.util.find_spec(m) for m in ("jax", "tf2jax"))


@pytest.mark.parametrize(
    "engine, words",
    [
        pytest.param(
            None,
            "tpushim's TPUEstimator path does not feed the SparseTensor feature 'ids' to the TPU",
            marks=pytest.mark.tpuestimator,
        ),
        ("strategy", "the strategy engine does not feed the SparseTensor feature 'ids' to the TPU"),
        pytest.param(
            "jax",
            "tpushim's JAX engine does not run a subclassed model on a SparseTensor feature ('ids')",
            marks=[pytest.mark.jax, pytest.mark.skipif(NO_JAX, reason="jax, tf2jax not installed")],
        ),
    ],
    ids=["tpuestimator", "strategy", "jax"],
)
def test_a_subclassed_model_on_a_sparse_feature_is_the_engines_refusal(
    tmp_path, monkeypatch, capsys, engine, words
):
    from tpushim import _cli

    (tmp_path / "subclassed_sparse.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    for name in ("argv", "path"):  # the runner sets them as python would for the script
        monkeypatch.setattr(sys, name, list(getattr(sys, name)))
    flag = ["--engine", engine] if engine else []
    code = _cli.main(["check", *flag, "--json", "subclassed_sparse.py", str(tmp_path / "model")])
    report = json.loads(capsys.readouterr().out)
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert [f["code"] for f in errors] == ["sparse-feature-refused"], errors  # no crash
    assert words in errors[0]["message"] and "Nothing was written" in errors[0]["message"]
    assert "build the model functional" in errors[0]["message"]
    assert code == report["exit_code"] == 1, report
    assert not (tmp_path / "model").exists()
