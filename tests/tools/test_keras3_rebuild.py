"""The Keras 3 rebuild measurement's pure helpers (benchmarks/keras3_rebuild.py): differences of
nests, the reason named from Keras 3's error, the verdict against the tolerance and the table's
row. The measurement itself is a benchmark (minutes), not run here."""

import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import keras3_rebuild as k3


def test_max_difference_over_nests_and_nan_where_they_differ():
    a = {"x": [1.0, 2.0], "y": ([[0.5, 0.5]],)}
    b = {"x": [1.0, 2.25], "y": ([[0.5, 0.0]],)}
    assert k3.max_difference(a, b) == 0.5
    assert k3.max_difference([1.0], [1.0]) == 0.0
    assert math.isnan(k3.max_difference([1.0, 2.0], [1.0]))
    assert math.isnan(k3.max_difference([[1.0, 2.0]], [[1.0]]))
    assert math.isnan(k3.max_difference([], []))


def test_why_not_names_the_layer_and_keras_3s_words():
    error = TypeError("Could not locate class 'DenseFeatures'. Make sure custom classes ...")
    assert k3.why_not(error, "DenseFeatures") == "DenseFeatures: no Keras 3 class (DenseFeatures)"
    assert k3.why_not(ValueError("bad\n  shape"), "Lambda") == "Lambda: ValueError: bad shape"
    assert k3.why_not(RuntimeError("x" * 500)).startswith("RuntimeError: " + "x" * 100)


def test_verdict_and_row():
    row = {
        "step": "converts",
        "loss_diff": 0.0,
        "grad_diff": 6e-8,
        "k3": "runs",
        "k3_forward": 1e-7,
        "k3_loss": 0.0,
        "k3_grad": 2e-6,
        "engine_ms": 0.25,
        "k3_ms": 0.125,
    }
    assert k3.verdict(row) == "differs"
    assert k3.verdict({**row, "k3_grad": 1e-6}) == "rebuilds"
    assert k3.verdict({**row, "k3_grad": float("nan")}) == "differs"
    assert k3.verdict({"k3": "no"}) == "NO"
    text = k3.line("two_in_two_out", {**row, "k3_why": "Dropout: own draws"})
    assert text.split()[:4] == ["two_in_two_out", "converts", "0.0e+00", "6.0e-08"]
    assert "differs" in text and "2.0e-06" in text and "0.25" in text and "0.12" in text
    assert text.endswith("Dropout: own draws")
    refused = k3.line("m", {"step": "ops Foo", "k3": "no", "k3_why": "DenseFeatures: no class"})
    assert refused.split()[1:3] == ["NO", "NO"]
    assert refused.endswith("ops Foo; DenseFeatures: no class")


def test_relative_difference_divides_by_the_value_above_one():
    assert k3.max_difference([[20.0, 0.5]], [[20.0 + 2e-6, 0.5 + 1e-7]]) > 1e-6
    assert abs(k3.max_difference([[20.0 + 2e-6]], [[20.0]], relative=True) - 1e-7) < 1e-12
    assert abs(k3.max_difference([[0.5 + 1e-7]], [[0.5]], relative=True) - 1e-7) < 1e-12


def test_a_lambda_keras_3_cannot_trace_is_named_as_tensorflow_code():
    error = NotImplementedError(
        "Exception encountered when calling Lambda.call().\n\x1b[1mWe could not automatically "
        "infer the shape of the Lambda's output. Please specify `output_shape`\x1b[0m"
    )
    assert k3.why_not(error, "Lambda") == (
        "Lambda: TensorFlow ops in its function (Keras 3 on JAX cannot run them)"
    )
    wrapped = ValueError("Error when deserializing ... Exception encountered: axis [1, 2]\x1b[0m")
    assert (
        k3.why_not(wrapped, "BatchNormalization") == "BatchNormalization: ValueError: axis [1, 2]"
    )
