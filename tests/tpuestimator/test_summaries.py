"""TensorBoard as stock writes it: cpu mode's event files against the stock estimator's (tags,
steps, values), the TPU host call's schedule and tags run on CPU, and the host call in
TPUEstimator's whole TPU graph for a faked TPU system, carrying the global batch's loss."""

import glob
import os

import pytest
import replicas
import tensorflow as tf
import tfcases
from conftest import tpuestimator_import
from tensorflow.python.ops import summary_ops_v2

import tpushim

_losses = tpuestimator_import("tpushim._losses")
_summaries = tpuestimator_import("tpushim._summaries")
faketpu = tpuestimator_import("tpushim._preflight.faketpu")

pytestmark = pytest.mark.tpuestimator  # the TPU path (cpu mode's TPUEstimator) throughout

TOL = 1e-5


def events(model_dir):
    """{tag: {step: value}} of every summary value in ``model_dir``'s event files (v1 simple
    values and v2 scalar tensors alike)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(str(model_dir), "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    number = value.simple_value
                else:
                    number = float(tf.make_ndarray(value.tensor))
                steps = out.setdefault(value.tag, {})
                assert event.step not in steps, f"{value.tag} written twice at step {event.step}"
                steps[event.step] = number
    return out


# -- cpu mode writes what stock writes ---------------------------------------------------------


@pytest.mark.slow
def test_cpu_mode_event_files_match_stocks(tmp_path):
    """Two outputs, per-output sample weights, a short batch every 6th step (45 rows in batches
    of 8, repeated: padded in cpu mode), summaries every 3 steps and step rates every 4: the same
    tags at the same steps, the losses within 1e-5. Stock tags its loss 'loss_2' here (Keras's
    loss is built twice, under 'loss' and 'loss_1'), and so does cpu mode. The one extra tag is
    TPUEstimator's examples/sec, beside global_step/sec (documented)."""
    features, labels = tfcases.two_in_two_out_data(45, sample_weights=True)
    config = tf.estimator.RunConfig(tf_random_seed=7, save_summary_steps=3, log_step_count_steps=4)
    written = {}
    # Stock's model_to_estimator leaves the global-step increment unordered against the read its
    # hooks fetch, so under load stock itself can write a step early ([1, 3, 6, 9]); cpu mode
    # orders them. Stock gets three tries at the hooks' own schedule.
    for mode, tries in (("off", 3), ("cpu", 1)):
        for attempt in range(tries):
            model_dir = tmp_path / f"{mode}{attempt}"
            estimator = tfcases.convert(
                model_dir, tfcases.two_in_two_out, patch={"mode": mode}, config=config
            )
            estimator.train(
                lambda: tf.data.Dataset.from_tensor_slices((features, labels)).batch(8).repeat(),
                steps=10,
            )
            written[mode] = events(model_dir)
            if sorted(written[mode].get("loss_2", ())) == [1, 4, 7, 10]:
                break
    stock, shim = written["off"], written["cpu"]
    assert set(stock) == {"loss_2", "global_step/sec"}
    assert set(shim) == set(stock) | {"examples/sec"}
    assert sorted(shim["examples/sec"]) == sorted(shim["global_step/sec"])
    for tag in stock:
        assert sorted(shim[tag]) == sorted(stock[tag]), tag
    assert sorted(stock["loss_2"]) == [1, 4, 7, 10] and sorted(stock["global_step/sec"]) == [5, 9]
    for step, value in stock["loss_2"].items():
        assert abs(shim["loss_2"][step] - value) < TOL, (step, shim["loss_2"][step], value)


# -- the TPU host call, run on CPU ----------------------------------------------------------------


def _host_call(model_dir, every_steps, rows=None):
    """The host call of a train step with the loss tag ``loss_1`` and one model scalar,
    ``activation_mean`` (its tensors: placeholders stand in for what the shards send)."""
    return _summaries.host_call(
        tf.constant(0, tf.int64),
        tf.constant(0.0),
        "loss_1",
        [("activation_mean", tf.constant(0.0))],
        str(model_dir),
        every_steps,
        **({} if rows is None else {"rows": rows}),
    )


def _run_host_call(model_dir, sessions, every_steps=3):
    """The host call of a train step over 2 shards, run for each session's steps (a train()
    call each): returns what it wrote."""
    with tf.Graph().as_default():
        host_fn, tensors = _host_call(model_dir, every_steps)
        assert {k: v.shape.as_list() for k, v in tensors.items()} == {
            "step": [1],
            "loss": [1],
            "carried_0": [1],
        }
        # What the host receives: each tensor of the 2 shards concatenated.
        step = tf.compat.v1.placeholder(tf.int64, [2])
        loss = tf.compat.v1.placeholder(tf.float32, [2])
        value = tf.compat.v1.placeholder(tf.float32, [2])
        op = host_fn(step=step, loss=loss, carried_0=value)
        init = summary_ops_v2.summary_writer_initializer_op()  # what TPUEstimator's hook runs
        flush = tf.compat.v2.summary.flush()
        for steps in sessions:
            with tf.compat.v1.Session() as sess:
                sess.run([init, tf.compat.v1.local_variables_initializer()])
                for s in steps:
                    sess.run(op, {step: [s, s], loss: [s / 10, s / 10], value: [s, s + 1.0]})
                sess.run(flush)
    return events(model_dir)


def test_host_call_writes_on_summary_saver_hooks_schedule(tmp_path):
    """SummarySaverHook's steps: the first step of each train() call, then every 3 after the last
    written; the loss as every shard reports it; a model's scalar averaged over the shards."""
    written = _run_host_call(tmp_path, [range(1, 11), range(11, 16)])
    assert set(written) == {"loss_1", "activation_mean"}
    assert sorted(written["loss_1"]) == [1, 4, 7, 10, 11, 14]
    for step, value in written["loss_1"].items():
        assert abs(value - step / 10) < TOL
        assert abs(written["activation_mean"][step] - (step + 0.5)) < TOL


@pytest.mark.parametrize("weighted", [True, False])
def test_host_call_weighs_each_shards_scalar_by_its_real_rows(tmp_path, weighted):
    """A short last batch on a pod leaves whole shards of padding rows: the model's scalar is
    the shards' values weighted by their real rows (3, 1 and 0 here; the padding shard's value,
    a mean over no real rows, NaN), as the strategy engine's replicas are. Negative control:
    the plain mean over the shards (``weighted`` False) is not that."""
    with tf.Graph().as_default():
        host_fn, tensors = _host_call(tmp_path, 1, rows=tf.constant(3.0) if weighted else None)
        assert ("rows" in tensors) == weighted
        shards = 3
        step = tf.compat.v1.placeholder(tf.int64, [shards])
        loss = tf.compat.v1.placeholder(tf.float32, [shards])
        value = tf.compat.v1.placeholder(tf.float32, [shards])
        rows = {"rows": tf.constant([3.0, 1.0, 0.0])} if weighted else {}
        op = host_fn(step=step, loss=loss, carried_0=value, **rows)
        with tf.compat.v1.Session() as sess:
            sess.run(
                [
                    summary_ops_v2.summary_writer_initializer_op(),
                    tf.compat.v1.local_variables_initializer(),
                ]
            )
            sess.run(
                op, {step: [1] * shards, loss: [0.5] * shards, value: [2.0, 6.0, float("nan")]}
            )
            sess.run(tf.compat.v2.summary.flush())
    written = events(tmp_path)["activation_mean"][1]
    expected = (3 * 2.0 + 1 * 6.0) / 4
    assert (abs(written - expected) < TOL) == weighted, written


def test_host_call_schedule_breaks_when_the_last_step_is_not_kept(tmp_path, monkeypatch):
    """Negative control: writing at every step is caught by the schedule's assertion above."""
    real = _summaries.host_call
    monkeypatch.setattr(
        _summaries,
        "host_call",
        lambda step, loss, tag, carried, model_dir, every: real(
            step, loss, tag, carried, model_dir, 1
        ),
    )
    written = _run_host_call(tmp_path, [range(1, 11)])
    assert sorted(written["loss_1"]) != [1, 4, 7, 10]


# -- the host call in TPUEstimator's TPU graph, on a faked TPU system ------------------------------


def _ancestors(function, node_name):
    """Names and ops of every node ``node_name`` depends on inside a function of the library."""
    nodes = {n.name: n for n in function.node_def}
    seen, stack = {}, [node_name]
    while stack:
        name = stack.pop().lstrip("^").split(":")[0]
        if name in seen or name not in nodes:
            continue
        seen[name] = nodes[name].op
        stack.extend(nodes[name].input)
    return seen


def _written_tags(graph):
    """The tags of the WriteSummary ops in the graph's functions (the host call's writes)."""
    tags = set()
    for function in graph.as_graph_def().library.function:
        nodes = {n.name: n for n in function.node_def}
        for node in function.node_def:
            if node.op == "WriteSummary":
                const = nodes[node.input[3].split(":")[0]]  # (writer, step, tensor, tag, metadata)
                tags.add(const.attr["value"].tensor.string_val[0].decode())
    return tags


class MeanActivation(tf.keras.layers.Layer):
    """A layer writing a v1 scalar summary of its inputs, as legacy models do."""

    def call(self, x):
        tf.compat.v1.summary.scalar("mean_activation", tf.reduce_mean(x))
        return tf.identity(x)


def _summarising_model():
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input((4,), name="x")
    h = MeanActivation(name="summarised")(tf.keras.layers.Dense(8, name="hidden")(x))
    model = tf.keras.Model(x, tf.keras.layers.Dense(3, activation="softmax", name="probs")(h))
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


@pytest.mark.slow
def test_tpu_train_graph_has_a_host_call_carrying_the_global_loss(tmp_path):
    x, y = tfcases.data(n=128)
    with faketpu.faked_tpu_system() as tpu:
        tpushim.patch(tpu=tpu.master, iterations_per_loop=4)
        try:
            est = tf.keras.estimator.model_to_estimator(
                keras_model=_summarising_model(),
                model_dir=str(tmp_path),
                custom_objects={"MeanActivation": MeanActivation},
            )
        finally:
            tpushim.unpatch()
        build = tpu.build(
            lambda: est.train(
                lambda: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64), steps=8
            )
        )
    graph = build.graph
    # Each step outfeeds (global step, loss, the model's scalar) from the TPU computation ...
    (enqueue,) = build.nodes("OutfeedEnqueueTuple")
    assert list(enqueue.attr["dtypes"].list.type) == [
        tf.int64.as_datatype_enum,
        tf.float32.as_datatype_enum,
        tf.float32.as_datatype_enum,
    ]
    # ... and the loss it outfeeds is the shards' losses summed over all cores.
    (function,) = [
        f
        for f in graph.as_graph_def().library.function
        if any(n.name == enqueue.name for n in f.node_def)
    ]
    loss_input = enqueue.input[1]
    sums = [
        name for name, op in _ancestors(function, loss_input).items() if op == "CrossReplicaSum"
    ]
    assert replicas.cross_replica_sums(sums) == {
        "gradient": 0,
        "reported loss": 1,
        "loss totals": 0,
    }, sums
    assert any(_losses.REPORTED_SUM in name for name in sums)
    # The host writes it under stock's tag ('loss_1', next to Keras's 'loss' scope) and the
    # model's scalar under its own, from one outfeed dequeue per core.
    assert len(build.nodes("OutfeedDequeueTuple")) == tpu.num_cores
    assert _written_tags(graph) == {"loss_1", "summarised/mean_activation"}
    # No summary is left to the SummarySaverHook: TPUEstimator's once-per-loop loss is out,
    # the model's summary moved to the host call (it cannot run inside the TPU computation).
    assert graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES) == []
    assert any(isinstance(h, _summaries.DropLoopLossSummary) for h in build.hooks)
