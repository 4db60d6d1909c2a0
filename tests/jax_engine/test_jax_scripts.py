"""Every legacy script of tests/scripts on the JAX engine (``--mode cpu --engine jax``, 8 XLA CPU
devices): it gives stock TensorFlow 2.15's recorded numbers (tests/reference/tf215.json) within
1e-5, or the engine refuses it before it trains with the ConversionError pinned here (a change
in what the engine covers shows as a failing case: pin the new numbers' or words' case).

Cheap: one subprocess runs every script in turn (TensorFlow and JAX start once), in the
background from the session's first test of tests/jax_engine on (tests/jax_engine/jax_scripts.py).
"""

import math
import os

import pytest
from jax_scripts import (  # noqa: F401
    JAX_TESTS,
    NAMES,
    REFERENCE,
    ROOT,
    SCRIPTS,
    UNRECORDED,
    answers,
    scripts_started,
)

pytestmark = JAX_TESTS

TOL = 1e-5

_GRAPH_PROGRAM = (
    "tpushim's JAX engine does not run a program that disabled TensorFlow 2 behaviour "
    "(tf.compat.v1.disable_v2_behavior() or disable_eager_execution()"
)
_STRINGS = (
    "tpushim's JAX engine does not run string features (input {!r}): it feeds numbers to the "
    "devices"
)
#: script -> the start of the engine's refusal (or it and words it holds); every other script
#: gives stock's numbers.
REFUSED = {
    "boston_feature_columns_batchnorm.py": _STRINGS.format("CHAS"),
    "boston_feature_columns_in_model.py": _STRINGS.format("CHAS"),
    "census_numpy_tf1.py": _GRAPH_PROGRAM,
    "iris_add_metrics.py": "tpushim's JAX engine does not run tf.estimator.add_metrics yet",
    "jpeg_pairs_224.py": (
        "tpushim's JAX engine splits the global batch equally: global batch size 10 does not "
        "divide among 8 TPU cores"
    ),
    "keyed_outputs_constant_loss.py": _STRINGS.format("key"),
    "legacy_text_classifier.py": (
        "tpushim's JAX engine splits the global batch equally: global batch size 100 does not "
        "divide among 8 TPU cores"
    ),
    "multi_input_lists_strings.py": _STRINGS.format("text"),
    "review_lookups_batch_100.py": _GRAPH_PROGRAM,
    "taxi_csv_train_and_evaluate.py": (
        "tpushim's JAX engine does not run train_and_evaluate with exporters "
        "(EvalSpec(exporters=...): 'exporter') yet"
    ),
    "taxifare_euclidean_feature_columns.py": (  # (tf2jax names the ops in no fixed order)
        "tpushim cannot convert this model's training step to JAX: ValueError: Unsupported "
        "operations in graph: [",
        "'SparseCross'",
        "'Bucketize'",
    ),
    "text_rebuilt_estimator.py": (
        "tpushim's JAX engine does not run tf.estimator.Estimator(model_fn=<the JAX engine's "
        "estimator>.model_fn) (an estimator built around its model_fn) yet"
    ),
    "text_vocab_file_lookup.py": _GRAPH_PROGRAM,
}


def _differences(got, want):
    """Keys whose values differ beyond TOL (relative, or absolute near 0), or are missing."""
    out = {k: (got.get(k), want.get(k)) for k in set(got) ^ set(want)}
    for key, value in want.items():
        if key in got and not math.isclose(got[key], value, rel_tol=TOL, abs_tol=1e-6):
            out[key] = (got[key], value)
    return out


@pytest.mark.parametrize("script", [*NAMES, *UNRECORDED])
def test_script_on_the_jax_engine_equals_stock_2_15_or_is_refused_as_pinned(answers, script):  # noqa: F811
    answer = answers.get(script)
    assert answer is not None, sorted(answers)
    assert "raised" not in answer, answer["raised"]
    if script in REFUSED:
        start, *words = (REFUSED[script],) if isinstance(REFUSED[script], str) else REFUSED[script]
        assert answer.get("refused", "").startswith(start), answer
        assert all(w in answer["refused"] for w in words), answer
        assert answer["written"] == [], answer  # refused before anything was written
        return
    assert "refused" not in answer, answer["refused"]
    assert script in REFERENCE, f"{script} ran on the engine: it has no numbers to compare"
    assert _differences(answer["result"], REFERENCE[script]) == {}


def test_every_script_is_pinned_or_compared():
    # A new script in tests/scripts without recorded numbers would be left out silently.
    on_disk = {n for n in os.listdir(SCRIPTS) if n.endswith(".py")}
    assert on_disk - {"record_reference.py"} == set(NAMES) | set(UNRECORDED)
    assert set(REFUSED) <= set(NAMES) | set(UNRECORDED)
