"""A model's crossentropies read its outputs' logits on the JAX engine as in stock's graph
(tests/reference/jax_logits_tf215.json, recorded by tests/jax_engine/jax_logits.py): a softmax
output's binary crossentropy (metric and loss), a sigmoid output's categorical one, a Lambda's
``tf.nn.softmax`` and a sparse one with saturated probabilities, within 1e-5 of stock 2.15's
evaluate. Before the engine handed the host's metrics the logits, the loss was stock's and four
metrics were not (the Lambda's 5.83 where stock gives 13.81)."""

import json

import pytest
from jax_scripts import (  # noqa: F401 (scripts_started: the scripts' run, in the background)
    differences,
    eight_devices,
    scripts_started,
)

pytestmark = pytest.mark.jax

jax = eight_devices()

import jax_logits

with open(jax_logits.RECORD, encoding="utf-8") as _f:
    STOCK = json.load(_f)["results"]


def test_crossentropies_read_the_outputs_logits_as_stock_2_15(tmp_path):
    import tpushim

    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    with tpushim.patched(mode="cpu", engine="jax", quiet=True):
        got = jax_logits.run(str(tmp_path))
    assert differences(got, STOCK) == {}
