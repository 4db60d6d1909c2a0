"""An Embedding's table on the JAX engine against stock TensorFlow 2.15's estimator
(tests/reference/jax_sparse_tf215.json, recorded by tests/jax_engine/jax_sparse.py): stock's
gather gives the table a sparse gradient, and the legacy optimizers' sparse kernels (SGD's and
RMSprop's momentum, Adamax, Adadelta, Ftrl, tf.compat.v1's Momentum) move only the rows a batch
looks up. Trained on 8 XLA CPU devices with a short last batch padded to the global batch: every
weight within 1e-5 of stock's; negative controls (the dense update; padding rows counted as
lookups) that must differ.
"""

import json
import os
import re

import numpy as np
import procs
import pytest
from jax_scripts import eight_devices, scripts_started  # noqa: F401 (scripts_started: the scripts' run, in the background)

pytestmark = pytest.mark.jax

jax = eight_devices()

import jax_sparse as case
import tensorflow as tf

from tpushim import ConversionError
from tpushim._jax import _step

TOL = 1e-5
with open(case.RECORD, encoding="utf-8") as _f:
    STOCK = json.load(_f)


def eight_devices():
    if jax.local_device_count() < 8:
        pytest.skip("jax was imported before this module could ask for 8 XLA CPU devices")
    return jax.local_devices()[:8]


def trained(name, control=None, dense=False):
    trainer = _step.Trainer(case.model(name), case.BATCH, devices=eight_devices(), control=control)
    if dense:  # negative control: the dense update every row
        trainer.optimizer.sparse_differs = False
    trainer.train(case.batches())  # 3 full batches and the short one, in one call
    return trainer


def from_stock(name, weights, which="final"):
    stock = {k: np.asarray(v) for k, v in STOCK[name][which].items()}
    assert set(weights) == set(stock), (sorted(weights), sorted(stock))
    return max(float(np.max(np.abs(weights[k] - v))) for k, v in stock.items())


@pytest.mark.parametrize("name", case.NAMES)
def test_embedding_on_eight_devices_equals_stock_2_15(name):
    start = {v.name.split(":")[0]: v.numpy() for v in case.model(name).weights}
    assert from_stock(name, start, "start") < 1e-7  # stock's starting point
    trainer = trained(name)
    assert trainer.slots()["iterations"] == STOCK[name]["global_step"] == 4
    assert from_stock(name, trainer.weights()) < TOL
    assert from_stock(name, start) > 1e-2  # it did train
    if name not in (
        "adam",
        "sgd_momentum_regularized",
    ):  # the dense update (what the engine did before) is not stock's
        assert from_stock(name, trained(name, dense=True).weights()) > TOL


def test_padding_rows_are_no_lookups():
    # row 0 of the table: the first batch's alone; the short batch's padding rows are ids 0
    assert from_stock("sgd_momentum", trained("sgd_momentum", "count_padding").weights()) > TOL


REGROUPED = """
import sys
import numpy as np
import tensorflow as tf

x = tf.keras.Input((3,), dtype="int64", name="x")
ids = tf.keras.layers.Lambda(lambda t: tf.reshape(t, [-1]), name="flat_ids")(x)
h = tf.keras.layers.Embedding(20, 4, name="emb")(ids)
h = tf.keras.layers.Lambda(lambda t: tf.reshape(t, [-1, 12]), name="back")(h)
m = tf.keras.Model(x, tf.keras.layers.Dense(1, name="out")(h))
m.compile(tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9), "mse")
"""
REFUSAL = (
    r"the weight 'emb/embeddings' of the layer 'emb' as stock does with "
    r"tf.keras.optimizers.legacy.SGD, .*: its gather's indices \(of shape \(\d+,\)\) are not "
    r"one row per row of the batch.* Train it with engine=strategy, or compile the model "
    r"with an optimizer whose sparse update is its dense one"
)


def test_a_gather_not_one_row_per_batch_row_is_refused_by_name():
    namespace = {}
    exec(REGROUPED, namespace)  # the ids of every row in one gather
    trainer = _step.Trainer(namespace["m"], case.BATCH, devices=eight_devices())
    with pytest.raises(ConversionError, match=REFUSAL):
        trainer.check(case.batches()[0])


def test_the_preflight_reports_the_refusal(tmp_path):
    script = tmp_path / "regrouped.py"
    script.write_text(
        REGROUPED
        + "rng = np.random.RandomState(0)\n"
        + "ids, y = rng.randint(0, 20, (64, 3)), rng.randn(64, 1).astype(np.float32)\n"
        + "est = tf.keras.estimator.model_to_estimator(m, model_dir=sys.argv[1])\n"
        + "est.train(lambda: tf.data.Dataset.from_tensor_slices((ids, y)).batch(16), steps=4)\n"
    )
    model_dir = tmp_path / "model"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = procs.python(
        ["-m", "tpushim", "check", "--engine", "jax", "--json", str(script), str(model_dir)],
        env={"PYTHONPATH": root},
        cwd=str(tmp_path),
        timeout=600,
    )
    assert not model_dir.exists(), "the check wrote the user's model_dir"
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["exit_code"] == 1, proc.stderr[-3000:]
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert [f["code"] for f in errors] == ["jax-engine-refuses"], errors
    assert errors[0]["where"].startswith("model 'model', layer 'emb'"), errors[0]["where"]
    assert re.search(REFUSAL, errors[0]["message"]), errors[0]["message"]


@pytest.mark.parametrize("name", ["sgd_momentum", "adamax"])
def test_through_model_to_estimator_equals_stock_2_15(name, tmp_path):
    # the whole path: the engine's estimator, its input adaptation and checkpoint
    import tpushim

    eight_devices()
    with tpushim.patched(mode="cpu", engine="jax", quiet=True):
        estimator = tf.keras.estimator.model_to_estimator(
            keras_model=case.model(name), model_dir=str(tmp_path), checkpoint_format="saver"
        )
    estimator.train(case.input_fn)
    final = {n: estimator.get_variable_value(n) for n in STOCK[name]["final"]}
    assert estimator.get_variable_value("global_step") == 4
    assert from_stock(name, final) < TOL


@tf.function(autograph=False)
def _lookup(table, ids):
    return tf.gather(table, ids)


class FunctionLookup(tf.keras.layers.Layer):
    """A table gathered in a function of its own (a call op in the step's graph)."""

    def build(self, input_shape):
        self.table = self.add_weight("table", (case.VOCAB, 4))

    def call(self, ids):
        return _lookup(self.table, ids)


def test_a_weight_read_in_a_function_call_is_refused_by_name():
    tf.keras.utils.set_random_seed(1)
    x = tf.keras.Input((3,), dtype="int64", name="x")
    h = tf.keras.layers.Flatten(name="flat")(FunctionLookup(name="looked")(x))
    m = tf.keras.Model(x, tf.keras.layers.Dense(1, name="out")(h))
    m.compile(tf.keras.optimizers.legacy.Adamax(0.05), "mse")
    trainer = _step.Trainer(m, case.BATCH, devices=eight_devices())
    with pytest.raises(
        ConversionError,
        match=r"the weight 'looked/table' of the layer 'looked' .*legacy.Adamax.*read inside a "
        r"StatefulPartitionedCall op .*engine=strategy",
    ):
        trainer.check(case.batches()[0])
