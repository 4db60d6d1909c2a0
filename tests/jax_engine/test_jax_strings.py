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


def test_string_ops_inside_a_layer_the_devices_run_are_refused_at_conversion_and_by_the_preflight(
    tmp_path,
):
    """A debugging ``Lambda`` formatting the devices' numbers as text (legacy_text_classifier's):
    refused when ``model_to_estimator`` converts it, in the engine's words naming the layer, the
    ops and what to do, before anything is written; the preflight's JAX check says the same."""
    import numpy as np
    import tensorflow as tf

    import tpushim
    from tpushim._preflight import jax_checks
    from tpushim._preflight.report import Report

    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(4, input_shape=(3,), name="dense"),
            tf.keras.layers.Lambda(
                lambda x: x + 0.0 * tf.strings.to_number(tf.strings.as_string(x)),
                name="debug_strings",
            ),
            tf.keras.layers.Dense(1, name="score"),
        ]
    )
    model.compile(tf.keras.optimizers.legacy.Adam(1e-3), "mse")
    model_dir = tmp_path / "model"
    with (
        pytest.raises(tpushim.ConversionError) as refused,
        tpushim.patched(quiet=True, mode="cpu", engine="jax"),
    ):
        tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=str(model_dir))
    said = str(refused.value)
    assert said.startswith("tpushim's JAX engine cannot run layer 'debug_strings' (Lambda)"), said
    assert "'AsString', 'StringToNumber'" in said and "the output of layer 'dense'" in said
    assert "Move that work out of the model" in said and "Nothing was written" in said
    assert not model_dir.exists() or not any(model_dir.iterdir())

    report = Report()
    jax_checks.check_jax_step(
        report, model, {}, None, np.zeros([8, 3], np.float32), np.zeros([8, 1]), 8
    )
    (finding,) = report.findings
    assert finding.code == "jax-engine-refuses" and said in finding.message
    assert finding.where == "model 'sequential', layer 'debug_strings'"
    assert finding.fix == "see the message"
