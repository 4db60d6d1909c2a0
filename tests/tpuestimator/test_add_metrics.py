"""``tf.estimator.add_metrics`` on a converted estimator (issue 24, item 3): every spelling returns
tpushim's estimator (same config, settings and batch handling), whose added metrics equal stock's
add_metrics estimator's, are built on a TPU's host, and whose calls the preflight hears. The
8-shard emulation of the added metrics is in tests/proofs/test_tpu_emulation.py."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import

bound_before_patch = tpuestimator_import("tensorflow.estimator", "add_metrics")

estimator_lib = tpuestimator_import("tensorflow_estimator.python.estimator", "estimator")
extenders = tpuestimator_import("tensorflow_estimator.python.estimator", "extenders")

import tpushim
from tpushim import _settings

TPUShimEstimator = tpuestimator_import("tpushim._estimator", "TPUShimEstimator")
faketpu = tpuestimator_import("tpushim._preflight.faketpu")
recording = tpuestimator_import("tpushim._preflight", "recording")

pytestmark = pytest.mark.slow  # trains estimators or runs scripts: outside the fast tier

SPELLINGS = {
    "tf.estimator": lambda: tf.estimator.add_metrics,
    "tf.compat.v1.estimator": lambda: tf.compat.v1.estimator.add_metrics,
    "tf.compat.v2.estimator": lambda: tf.compat.v2.estimator.add_metrics,
    "extenders": lambda: extenders.add_metrics,
    "bound before patch()": lambda: bound_before_patch,
}


def added_metrics(labels, predictions, features, config):
    """Every argument add_metrics offers; a (value, update_op) pair, a Keras metric object, and a
    name the model already reports ('accuracy': the added one wins, as in stock)."""
    assert config.model_dir
    auc = tf.keras.metrics.AUC(name="auc")
    auc.update_state(tf.one_hot(tf.reshape(labels, [-1]), 3), predictions["probs"])
    return {
        "auc": auc,
        "mean_feature": tf.compat.v1.metrics.mean(features[:, 0], name="mean_feature"),
        "accuracy": tf.compat.v1.metrics.mean(predictions["probs"][:, 1], name="mean_probs"),
    }


@pytest.mark.tpuestimator
@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_every_spelling_keeps_the_converted_estimator(spelling, tmp_path, tpushim_log):
    tpushim.patch(mode="cpu", batch_size=16, iterations_per_loop=7)
    converted = tf.keras.estimator.model_to_estimator(
        keras_model=tfcases.sequential(), model_dir=str(tmp_path)
    )
    added = SPELLINGS[spelling]()(converted, added_metrics)
    assert isinstance(added, TPUShimEstimator), type(added)
    assert added.model_dir == converted.model_dir
    assert added.config.tpu_config == converted.config.tpu_config  # iterations_per_loop 7, ...
    assert added._tpushim_plan.batch_size == 16 and added._tpushim_use_tpu is False
    assert "tf.estimator.add_metrics -> TPUShimEstimator(use_tpu=False)" in tpushim_log.text


#: Every tpushim setting: a value other than its default, and what of it a converted estimator
#: carries. Derived from the settings table: a new setting fails the test below until it is here.
CARRIED = {
    "mode": ("cpu", lambda est: est._tpushim_use_tpu),
    "tpu": (
        "faked",
        lambda est: (est._tpushim_use_tpu, est.config.master, est._tpushim_plan.tpu_source),
    ),
    "batch_size": (24, lambda est: est._tpushim_plan.batch_size),
    "iterations_per_loop": (7, lambda est: est.config.tpu_config.iterations_per_loop),
    "quiet": (True, None),  # the conversion's own line: nothing for the estimator to carry
    "pod_input": ("files", lambda est: est._tpushim_plan.pod_input),
    "engine": ("tpuestimator", lambda est: est._tpushim_plan.settings.engine),
}


def test_every_setting_has_a_carried_case():
    assert set(CARRIED) == set(_settings.ENV_VARS), "add the new setting to CARRIED"


@pytest.mark.tpuestimator
@pytest.mark.parametrize("name", sorted(_settings.ENV_VARS))
def test_add_metrics_keeps_every_setting(name, tmp_path):
    value, carried = CARRIED[name]
    if carried is None:
        pytest.skip(f"{name} is not carried by an estimator")
    with faketpu.faked_tpu_system() as tpu:

        def convert(settings, model_dir):
            tpushim.patch(**settings)
            return tf.keras.estimator.model_to_estimator(
                keras_model=tfcases.sequential(), model_dir=str(model_dir)
            )

        base = {"tpu": tpu.master}
        converted = convert(
            {**base, name: tpu.master if value == "faked" else value}, tmp_path / "set"
        )
        # A negative control: without the setting, what is compared differs.
        default = convert(base, tmp_path / "default") if name != "tpu" else None
        added = tf.estimator.add_metrics(converted, added_metrics)
    assert isinstance(added, TPUShimEstimator)
    assert carried(added) == carried(converted)
    if default is not None:
        assert carried(converted) != carried(default)


@pytest.mark.tpuestimator
def test_add_metrics_and_a_rebuilt_estimator_take_the_conversion_plan_whole(tmp_path):
    """Issue 33 item 6: the conversion's facts are one value (tpushim._plan.ConversionPlan) that an
    estimator made from a converted one takes as it is -- so none of them can be dropped, as
    pod_input once was when each was an attribute of its own. Every field is set here; a field
    added to the plan is covered without changing this test."""
    with faketpu.faked_tpu_system() as tpu:
        tpushim.patch(tpu=tpu.master, batch_size=24, pod_input="files", iterations_per_loop=7)
        try:
            converted = tf.keras.estimator.model_to_estimator(
                keras_model=tfcases.sequential(), model_dir=str(tmp_path / "model")
            )
            added = tf.estimator.add_metrics(converted, added_metrics)
            rebuilt = tf.estimator.Estimator(
                model_fn=converted.model_fn, model_dir=str(tmp_path / "rebuilt")
            )
        finally:
            tpushim.unpatch()
    plan = converted._tpushim_plan
    unset = [f.name for f in dataclasses.fields(plan) if getattr(plan, f.name) is None]
    assert not unset, f"the conversion left {unset} unset: this test would not see them dropped"
    assert plan.pod_input == "files" and plan.batch_size == 24 and plan.tpu.source
    assert added._tpushim_plan is plan
    # The rebuilt Estimator's call gave no warm_start_from: as stock, it warm-starts from none.
    assert rebuilt._tpushim_plan == dataclasses.replace(plan, warm_start=None)
    assert rebuilt._tpushim_plan.pod_input == "files"


@pytest.mark.tpuestimator
def test_added_metrics_equal_stocks(tmp_path):
    """Trained, then evaluated on 52 rows in batches of 8 (the last one padded): every metric,
    added or compiled, equals stock's add_metrics estimator's; training is untouched."""
    x, y = tfcases.data()
    fn = tfcases.dataset_input_fn(x, y)
    results = {}
    for mode in ("off", "cpu"):
        tpushim.patch(mode=mode)  # add_metrics keeps an estimator tpushim's while patched
        try:
            converted = tf.keras.estimator.model_to_estimator(
                keras_model=tfcases.sequential(),
                model_dir=str(tmp_path / mode),
                config=tf.estimator.RunConfig(tf_random_seed=7),
            )
            estimator = tf.compat.v1.estimator.add_metrics(converted, added_metrics)
        finally:
            tpushim.unpatch()
        estimator.train(fn, steps=6)
        results[mode] = (estimator.evaluate(fn), tfcases.checkpoint_values(estimator.model_dir))
    assert isinstance(estimator, TPUShimEstimator)
    (stock, stock_weights), (shim, shim_weights) = results["off"], results["cpu"]
    assert set(shim) == set(stock) == {"auc", "mean_feature", "accuracy", "loss", "global_step"}
    for key, value in stock.items():
        assert abs(shim[key] - value) <= tfcases.TOL, (key, shim[key], value)
    for name, value in stock_weights.items():
        np.testing.assert_allclose(shim_weights[name], value, atol=tfcases.TOL, err_msg=name)


@pytest.mark.tpuestimator
def test_other_estimators_and_bad_metric_fns_get_stocks_add_metrics(tmp_path):
    tpushim.patch(mode="cpu")
    plain = tf.estimator.Estimator(
        model_fn=lambda features, labels, mode: None, model_dir=str(tmp_path / "plain")
    )
    assert type(tf.estimator.add_metrics(plain, added_metrics)) is estimator_lib.Estimator
    converted = tf.keras.estimator.model_to_estimator(
        keras_model=tfcases.sequential(), model_dir=str(tmp_path / "converted")
    )
    with pytest.raises(ValueError, match="has following not expected args: \\['params'\\]"):
        tf.estimator.add_metrics(converted, lambda labels, params: {})  # stock's check and text


@pytest.mark.tpuestimator
def test_added_metrics_run_on_the_tpu_host(tmp_path):
    """On a faked 8-core TPU system the evaluation with added metrics builds: the model's step
    replicated, the added metrics' tensors outfed with tpushim's own, the metrics on the host."""
    x, y = tfcases.data(n=100)
    fn = tfcases.dataset_input_fn(x, y, batch=64)
    with faketpu.faked_tpu_system() as tpu:
        tpushim.patch(tpu=tpu.master)
        try:
            converted = tf.keras.estimator.model_to_estimator(
                keras_model=tfcases.sequential(), model_dir=str(tmp_path / "model")
            )
            added = tf.estimator.add_metrics(converted, added_metrics)
        finally:
            tpushim.unpatch()
        assert isinstance(added, TPUShimEstimator) and added._tpushim_use_tpu
        plain, with_added = (tpu.build(lambda e=e: e.evaluate(fn)) for e in (converted, added))
    for build in (plain, with_added):
        metadata = build.nodes("TPUReplicateMetadata")
        assert len(metadata) == 1 and metadata[0].attr["num_replicas"].i == 8

    def outfed(build):
        return sum(len(n.attr["dtypes"].list.type) for n in build.nodes("OutfeedEnqueueTuple"))

    # features, labels and predictions travel to the host too
    assert outfed(with_added) == outfed(plain) + 3
    host_metric = [n for n in with_added.graph.as_graph_def().node if "mean_feature/" in n.name]
    assert host_metric and not any("_tpu_replicate" in n.attr for n in host_metric)


@pytest.mark.tpuestimator
def test_preflight_hears_the_added_metrics_estimators_calls(tmp_path):
    """The estimator add_metrics returns is the conversion's: the preflight caps its training and
    checks its input (here a global batch of 100 on 8 cores)."""
    x, y = tfcases.data(n=200)
    with recording() as recorder:
        tpushim.patch(mode="cpu")
        try:
            converted = tf.keras.estimator.model_to_estimator(
                keras_model=tfcases.sequential(), model_dir=str(tmp_path)
            )
            added = tf.estimator.add_metrics(converted, added_metrics)
            added.train(tfcases.dataset_input_fn(x, y, batch=100, repeat=True), steps=50)
        finally:
            tpushim.unpatch()
        # Capped, as the conversion's own calls are.
        assert tf.train.latest_checkpoint(added.model_dir).endswith("model.ckpt-3")
        report = recorder.report(tpu_graphs=False)
    assert any(
        f.code == "batch-indivisible" and "(batch of 100)" in f.where for f in report.findings
    ), report
