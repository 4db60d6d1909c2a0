"""String features and feature-column lookups on the JAX engine (8 XLA CPU devices) against
stock TensorFlow 2.15's estimator (tests/reference/jax_strings_tf215.json, recorded by
tests/jax_engine/jax_strings.py): a ``StringLookup`` beside a numeric input, and a
``DenseFeatures`` layer over a vocabulary-list indicator, an embedding column and a numeric
column, the lookups on the host and the embedding weights trained in the step; a short batch
padded. Every weight, evaluate's metrics and each prediction within 1e-5 of stock's. Needs jax
and tf2jax (the ``jax`` extra); 8 devices from ``XLA_FLAGS``, set here before jax is imported.
"""

import json
import math
import os

import pytest
from jax_scripts import differences, eight_devices, scripts_started  # noqa: F401 (scripts_started: the scripts' run, in the background)

pytestmark = pytest.mark.jax

jax = eight_devices()

import jax_strings

TOL = 1e-5
with open(
    os.path.join(os.path.dirname(jax_strings.HERE), "reference", "jax_strings_tf215.json"),
    encoding="utf-8",
) as _f:
    STOCK = json.load(_f)["results"]


def test_lookups_and_feature_columns_on_eight_devices_equal_stock_2_15(tmp_path):
    import tpushim

    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    with tpushim.patched(mode="cpu", engine="jax", quiet=True):
        got = jax_strings.run(str(tmp_path))
    assert differences(got, STOCK) == {}
    # Negative control: the comparison tells the untrained embedding apart (it trained).
    key = (
        "columns/layer_with_weights-0/shape_embedding.Sembedding_weights/.ATTRIBUTES/VARIABLE_VALUE"
    )
    start = jax_strings.initial_sum("columns", "shape_embedding/embedding_weights")
    assert not math.isclose(got[key], start, rel_tol=TOL, abs_tol=1e-6), (got[key], start)
