"""A program that disabled TensorFlow 2 behaviour on the JAX engine (8 XLA CPU devices), against
stock TensorFlow 2.15's estimator (tests/reference/jax_v1_tf215.json, recorded by
tests/jax_engine/jax_v1.py): a functional model with a ``tf.compat.v1.train`` optimizer and a
Dataset input_fn, a Sequential one with Keras's ``adam`` and ``numpy_input_fn``; trained,
evaluated, predicted, exported with ``export_savedmodel`` and served. Every checkpointed variable
(stock's names), evaluate's metrics, each prediction and each served output within 1e-5 of
stock's; after each call the program still runs in graph mode, on its own default graph.

Cheap: jax_v1.py runs in tests/jax_engine/jax_scripts.py's process (in the background, after
the scripts of tests/scripts); this test reads its answer.
"""

import json
import math
import os

import numpy as np
from jax_scripts import (  # noqa: F401
    JAX_TESTS,
    ROOT,
    answers,
    differences,
    scripts_started,
)

pytestmark = JAX_TESTS

TOL = 1e-5
with open(os.path.join(ROOT, "tests", "reference", "jax_v1_tf215.json"), encoding="utf-8") as _f:
    STOCK = json.load(_f)["results"]


def test_a_v1_program_on_the_jax_engine_equals_stock_2_15(answers):  # noqa: F811
    answer = answers.get("jax_v1.py")
    assert answer is not None, sorted(answers)
    assert "raised" not in answer and "refused" not in answer, answer
    got = answer["result"]
    assert differences(got, STOCK, TOL) == {}
    for case in ("compat", "keras"):
        # The program's graph mode as it left it, between predictions and after every call:
        # no eager execution, its default graph, no op added but its own serving placeholder.
        assert got[f"{case}_eager"] == got[f"{case}_eager_between_predictions"] == 0.0
        assert got[f"{case}_same_graph"] == 1.0 and got[f"{case}_ops_added"] == 1.0
    # Negative control: the comparison tells the weights the program set apart from the
    # trained ones (compat_model's draw), and an untrained optimizer's slots are zeros.
    draw = np.random.RandomState(5)
    start = [draw.uniform(-0.5, 0.5, s).astype(np.float32) for s in ((3, 6), (6,), (6, 1), (1,))]
    assert not math.isclose(got["compat/h/kernel"], float(np.sum(start[0])), rel_tol=TOL)
    assert abs(got["compat/h/kernel/Momentum"]) > 1e-3
