"""What the strategy engine writes to model_dir for a user's tools, against the estimator
model_to_estimator returns unpatched (stock's on TensorFlow 2.15, tpushim's own on >= 2.16) from
the same two train() calls: the files (``graph.pbtxt``, a ``.meta`` beside every checkpoint,
``checkpoint``, the events), the events' records by kind, step and tag (the graphs included),
and what ``tf.train.latest_checkpoint`` and ``tf.compat.v1.train.import_meta_graph`` read back.
RunConfig's ``checkpoint_save_graph_def=False`` leaves the graph files out on both.
"""

import os
import re

import numpy as np
import pytest

pytestmark = pytest.mark.slow
STOCK = {"mode": "off"}
ENGINE = {"mode": "cpu", "engine": "strategy", "quiet": True}
TOL = 1e-5


def _train(model_dir, patch, fmt, **config):
    import tensorflow as tf
    import tfcases

    x, y = tfcases.data()
    run_config = tfcases.ESTIMATOR.RunConfig(
        tf_random_seed=7, save_summary_steps=1, save_checkpoints_steps=2, **config
    )
    estimator = tfcases.convert(model_dir, patch=patch, checkpoint_format=fmt, config=run_config)
    estimator.train(tfcases.dataset_input_fn(x, y), steps=3)
    estimator.train(tfcases.dataset_input_fn(x, y), steps=1)
    tf.compat.v1.summary.FileWriterCache.clear()  # stock's writers flush every 120 s
    return estimator


def _files(model_dir):
    """model_dir's files, a checkpoint's data shards as one name (stock's Saver shards by
    device), an events file's time and host left out."""
    names = {re.sub(r"\.data-\d+-of-\d+$", ".data", name) for name in os.listdir(model_dir)}
    return sorted(re.sub(r"^(events\.out\.tfevents)\..*", r"\1", n) for n in names)


def _records(model_dir):
    """The events' records in order as (kind, step, tag): every kind, graphs included."""
    import tensorflow as tf

    out = []
    for name in sorted(n for n in os.listdir(model_dir) if n.startswith("events.out.tfevents")):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(model_dir, name)):
            what = event.WhichOneof("what")
            if what == "summary":
                out += [(what, event.step, v.tag) for v in event.summary.value]
            elif what == "session_log":
                out.append((what, event.step, int(event.session_log.status)))
            else:
                out.append((what, event.step, None))
    return out


def _imported(checkpoint):
    """{variable name: value} of ``checkpoint`` restored through its ``.meta``, as a TF1 user's
    tool reads it: ``import_meta_graph``, then the Saver it returns."""
    import tensorflow as tf

    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        saver = tf.compat.v1.train.import_meta_graph(checkpoint + ".meta")
        saver.restore(session, checkpoint)
        variables = tf.compat.v1.global_variables()
        return dict(zip([v.op.name for v in variables], session.run(variables)))


def _graph_variables(model_dir):
    import tensorflow as tf
    from google.protobuf import text_format

    graph = tf.compat.v1.GraphDef()
    with open(os.path.join(model_dir, "graph.pbtxt"), encoding="utf-8") as f:
        text_format.Parse(f.read(), graph)
    return sorted(n.name for n in graph.node if n.op in ("VarHandleOp", "VariableV2"))


@pytest.mark.parametrize("fmt", ["checkpoint", "saver"])
def test_model_dir_as_stocks(tmp_path, fmt):
    """Stock's files and event records; graph.pbtxt holds stock's variables; each checkpoint's
    ``.meta`` restores it through ``import_meta_graph`` with every variable stock's restores,
    to the values the checkpoint holds (which equal stock's)."""
    import tensorflow as tf

    for name, patch in (("stock", STOCK), ("engine", ENGINE)):
        _train(tmp_path / name, patch, fmt)
    stock, engine = str(tmp_path / "stock"), str(tmp_path / "engine")
    assert _files(engine) == _files(stock)
    assert "graph.pbtxt" in _files(engine) and "model.ckpt-4.meta" in _files(engine)
    assert _records(engine) == _records(stock)
    assert _graph_variables(engine) == _graph_variables(stock)
    latest = tf.train.latest_checkpoint(engine)
    assert latest == os.path.join(engine, "model.ckpt-4")
    got = _imported(latest)
    want = _imported(tf.train.latest_checkpoint(stock))
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, atol=TOL, err_msg=key)
    reader = tf.train.load_checkpoint(latest)
    if fmt == "saver":  # the Saver's values are the checkpoint's own
        for key, value in got.items():
            np.testing.assert_array_equal(value, reader.get_tensor(key), err_msg=key)


def test_no_graph_files_where_stock_writes_none(tmp_path):
    """``RunConfig(checkpoint_save_graph_def=False)``: no graph.pbtxt, no ``.meta``, as stock."""
    for name, patch in (("stock", STOCK), ("engine", ENGINE)):
        _train(tmp_path / name, patch, "checkpoint", checkpoint_save_graph_def=False)
    engine = _files(tmp_path / "engine")
    assert engine == _files(tmp_path / "stock")
    assert not [name for name in engine if name == "graph.pbtxt" or name.endswith(".meta")]
    assert _records(tmp_path / "engine") == _records(tmp_path / "stock")


def _probed():
    """tfcases' model with a layer making ``tf.compat.v1.summary`` ops in its call (a scalar, a
    histogram of its input and of its weight, an image of its input, a constant text, and a
    histogram of its input's column means, which the engine leaves out), then a Lambda making
    a histogram of its input, and the custom_objects."""
    import tensorflow as tf
    import tfcases

    class Probe(tf.keras.layers.Layer):
        def build(self, shape):
            self.scale = self.add_weight("scale", shape=shape[1:], initializer="ones")

        def call(self, inputs):
            tf.compat.v1.summary.scalar("mean", tf.reduce_mean(inputs))
            tf.compat.v1.summary.histogram("values", inputs)
            tf.compat.v1.summary.histogram("scale", self.scale)
            tf.compat.v1.summary.image("picture", tf.reshape(inputs, [-1, 2, 4, 1]), 2)
            tf.compat.v1.summary.text("note", tf.constant("a probe"))
            tf.compat.v1.summary.histogram("columns", tf.reshape(tf.reduce_mean(inputs, 0), [2, 4]))
            tf.compat.v1.summary.histogram("centred", inputs - tf.reduce_mean(inputs, 0))
            tf.compat.v1.summary.histogram("running", tf.cumsum(inputs, 0))
            return inputs * self.scale

    def summarised(x):  # a Lambda's histogram, as scripts write one
        return tf.identity(x) if tf.compat.v1.summary.histogram("acts", x) is not None else x

    def normed(x):  # a histogram of a training BatchNormalization's output
        return tf.identity(x) if tf.compat.v1.summary.histogram("normed", x) is not None else x

    layers = [
        Probe(name="probe"),
        tf.keras.layers.Lambda(summarised, name="probe_lambda"),
        tf.keras.layers.BatchNormalization(name="probe_norm"),
        tf.keras.layers.Lambda(normed, name="probe_normed"),
    ]
    return tfcases.sequential(extra_layers=layers), {"Probe": Probe}


def _summary_values(directory):
    """[(step, tag, its Summary.Value's payload)] of the events' model summaries: a number, a
    histogram's (min, max, num, sum, sum_squares, limits, counts), an image's (size, its PNG's
    pixels) or a tensor's bytes."""
    import tensorflow as tf

    out = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for v in event.summary.value:
                kind = v.WhichOneof("value")
                if v.tag.startswith("probe"):
                    if kind == "histo":
                        h = v.histo
                        got = (h.min, h.max, h.num, h.sum, h.sum_squares, *h.bucket_limit)
                        got = (got, tuple(h.bucket))
                    elif kind == "image":  # its pixels, decoded
                        png = tf.io.decode_png(v.image.encoded_image_string).numpy()
                        got = ((v.image.height, v.image.width), png.astype(np.int16))
                    elif kind == "tensor":
                        got = ((), v.tensor.SerializeToString())
                    else:
                        got = ((v.simple_value,), b"")
                    out.append((event.step, v.tag, got))
    return out


def test_model_summaries_as_stocks(tmp_path, caplog):
    """A model making v1 summaries in its call: stock writes them every save_summary_steps. The
    engine trains it with stock's numbers and writes every record of stock's, in stock's order,
    with stock's values: the scalar's within 1e-5, the histograms' of the global batch's rows
    (the replicas' real rows gathered to the host; a short last batch) and of a weight, the
    image's, and the constant text's; and the column means' histogram, computed on the
    host from the gathered rows in a copy of stock's graph as stock's graph computes it over the
    global batch (a short batch of 5 padded to 7: not each replica's means); and a histogram of a
    training BatchNormalization's output, which the engine computes with ops of its own over the
    real rows (gathered as computed: on one replica stock's value). Nothing is left out, so
    nothing is said.
    Evaluation writes none of them, as stock's."""
    import logging

    import tensorflow as tf
    import tfcases

    x, y = tfcases.data()
    logging.getLogger("tpushim").setLevel(logging.WARNING)
    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7, save_summary_steps=2)
    results = {}
    for name, patch in (("stock", STOCK), ("engine", ENGINE)):
        model, custom_objects = _probed()
        estimator = tfcases.convert(
            tmp_path / name, model, patch=patch, config=config, custom_objects=custom_objects
        )
        with caplog.at_level(logging.WARNING, logger="tpushim"):
            estimator.train(tfcases.dataset_input_fn(x, y), steps=3)
            # one short batch: 5 rows, padded to 7 by the engine
            estimator.train(tfcases.dataset_input_fn(x[:5], y[:5], batch=7), steps=2)
            results[name] = estimator.evaluate(tfcases.dataset_input_fn(x, y))
            list(estimator.predict(tfcases.dataset_input_fn(x)))
    said = [r.getMessage() for r in caplog.records if "summaries itself" in r.getMessage()]
    assert not said, said
    for key, value in results["stock"].items():
        np.testing.assert_allclose(results["engine"][key], value, atol=TOL, err_msg=key)
    tf.compat.v1.summary.FileWriterCache.clear()
    stock = _records(tmp_path / "stock")
    written = {"probe/mean_1", "probe/values", "probe/scale_1", "probe/note", "probe_lambda/acts"}
    written |= {"probe/columns", "probe/centred", "probe/running", "probe_normed/normed"}
    assert written <= {tag for kind, _, tag in stock if kind == "summary"}
    assert _records(tmp_path / "engine") == stock
    want = _summary_values(tmp_path / "stock")
    got = _summary_values(tmp_path / "engine")
    assert [(s, t) for s, t, _ in got] == [(s, t) for s, t, _ in want]
    assert sorted({s for s, _, _ in got}) == [1, 3, 4]
    assert {t for _, t, _ in got} >= written | {"probe/picture/image/0", "probe/picture/image/1"}
    for (step, tag, (numbers, raw)), (_, _, (stock_numbers, stock_raw)) in zip(got, want):
        # rtol: the engine's BatchNormalization (its own ops, over the real rows) rounds
        # otherwise than stock's, which the running sums' squares (some 60) carry at 1e-7
        np.testing.assert_allclose(
            numbers, stock_numbers, rtol=1e-6, atol=TOL, err_msg=f"{tag} {step}"
        )
        if isinstance(raw, np.ndarray):
            # an image's pixels: the activations scaled to 0-255 and rounded, so a value within
            # 1e-7 of stock's may round to the next level (seen once in a loaded run)
            assert raw.shape == stock_raw.shape and np.abs(raw - stock_raw).max() <= 1, (tag, step)
        else:
            assert raw == stock_raw, (tag, step)
    # The short batch's histograms count its 5 real rows (of 7 the engine trains on) alone.
    counts = {
        t: n[0][2] for s, t, n in got if s == 4 and t in ("probe/values", "probe_normed/normed")
    }
    assert counts == {"probe/values": 5 * 8, "probe_normed/normed": 5 * 8}, counts
    # Evaluation writes the metrics alone, none of the model's summaries, as stock's.
    evaluated = {}
    for name in ("stock", "engine"):
        records = _records(tmp_path / name / "eval")
        evaluated[name] = [r for r in records if r[0] == "summary"]
    assert evaluated["engine"] == evaluated["stock"]
    assert evaluated["stock"] and not [r for r in evaluated["stock"] if "probe" in r[2]]


def _event_graph_variables(directory):
    """The variables of the first graph recorded in ``directory``'s events."""
    import tensorflow as tf

    for name in sorted(n for n in os.listdir(directory) if n.startswith("events.out.tfevents")):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
            if event.WhichOneof("what") == "graph_def":
                graph = tf.compat.v1.GraphDef()
                graph.ParseFromString(event.graph_def)
                return {n.name for n in graph.node if n.op in ("VarHandleOp", "VariableV2")}
    return set()


def test_eval_events_as_stocks(tmp_path):
    """model_dir/eval after two evaluate() calls: stock's records in stock's order (the metrics
    sorted by name, then the checkpoint's path), and a graph holding the model's weights under
    stock's names and the global step, as stock's evaluation graph does (the engine's is the
    training events' graph: no metric or eval_step variables, the optimizer's instead)."""
    import tensorflow as tf
    import tfcases

    from tpushim import _versions

    x, y = tfcases.data()
    config = tfcases.ESTIMATOR.RunConfig(tf_random_seed=7)
    for name, patch in (("stock", STOCK), ("engine", ENGINE)):
        estimator = tfcases.convert(tmp_path / name, patch=patch, config=config)
        estimator.train(tfcases.dataset_input_fn(x, y), steps=2)
        for _ in range(2):
            estimator.evaluate(tfcases.dataset_input_fn(x, y))
    tf.compat.v1.summary.FileWriterCache.clear()
    stock, engine = tmp_path / "stock" / "eval", tmp_path / "engine" / "eval"
    assert _records(engine) == _records(stock)
    assert [r[2] for r in _records(stock) if r[0] == "summary"][:2] == ["accuracy", "loss"]
    weights = {"global_step", "hidden/kernel", "hidden/bias", "probs/kernel", "probs/bias"}
    if not _versions.uses_own_estimator():  # tpushim's own estimator (>= 2.16) records none
        assert weights <= _event_graph_variables(stock)
    assert weights <= _event_graph_variables(engine)
