"""Pods (``--only pods``): a pod's input, host by host, on faked TPU systems of 1, 2 and 4 hosts x
8 cores (``tpushim/_preflight/faketpu.py``: TPUEstimator's whole TPU graph built on CPU; each
host's input pipeline imported from it and run here, one host at a time, as a TPU host runs it).

* **Records parsed per record fed**, per host (the most of any host): tpushim on a shuffled,
  endless TFRecord input (its files path: each host reads its own files) against a hand-written
  per-host input_fn for TPUEstimator that shards the file list by
  ``params['context'].current_input_fn_deployment()``, as the TPU reference models do; tpushim's
  exact path (``pod_input=exact``: every host reads everything) for scale. Counted exactly: the
  parse function counts the records it parses. Goal: tpushim <= 1.05.
* **Pipeline throughput** per host (examples/s delivered to the cores after warm-up, a JPEG
  decode + crop + resize pipeline), tpushim against the same hand-written input_fn (and that one
  again: the noise floor), on 1, 2 and 4 hosts, interleaved rounds (the host measured rotates).
  Goal: >= 0.95x: the cut of the global batches into per-core pieces must cost the host next to
  nothing. The same runs measured in examples per CPU-second of this process (the pipeline's
  threads included) show the host's cost with less of the machine's load in it.
"""

import os
import threading
import time

import benchlib
from benchlib import median

SECTION = "pods"
SHIM, HAND, EXACT = "tpushim", "hand-written per-host input_fn", "tpushim, pod_input=exact"
HAND_AGAIN = "hand-written per-host input_fn again"
GLOBAL = 256  # 32 per core on one host, 8 on four
PARSE_GOAL, SPEED_GOAL = "<= 1.05", ">= 0.95x"


# --- data --------------------------------------------------------------------------------------


def _write_records(directory, files, per_file, image=None):
    """``files`` TFRecord files of about ``per_file`` records (sizes differ by up to a third),
    each an id and, with ``image`` (side), a JPEG of that size."""
    tf = benchlib.tf()
    import numpy as np

    rng = np.random.RandomState(0)
    paths, next_id = [], 0
    for f in range(files):
        paths.append(os.path.join(directory, f"part-{f:03d}.tfrecord"))
        count = per_file + (f * per_file // 3) // files
        with tf.io.TFRecordWriter(paths[-1]) as writer:
            for _ in range(count):
                feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[next_id]))}
                if image:
                    pixels = rng.randint(0, 255, (image, image, 3), dtype=np.uint8)
                    jpeg = tf.io.encode_jpeg(pixels).numpy()
                    feature["jpeg"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg]))
                writer.write(
                    tf.train.Example(
                        features=tf.train.Features(feature=feature)
                    ).SerializeToString()
                )
                next_id += 1
    return paths


class _Counter:
    """Records parsed, counted from inside the pipeline (a numpy_function in the parse)."""

    def __init__(self):
        self.count, self._lock = 0, threading.Lock()

    def add(self, ids):
        with self._lock:
            self.count += 1
        return ids


def _counting_parse(counter):
    tf = benchlib.tf()
    spec = {"id": tf.io.FixedLenFeature([1], tf.int64)}

    def parse(record):
        ids = tf.numpy_function(
            counter.add, [tf.io.parse_single_example(record, spec)["id"]], tf.int64
        )
        ids.set_shape([1])
        return tf.concat([tf.cast(ids, tf.float32), tf.zeros([3])], 0), ids % 3

    return parse


def _decode(side):
    """Parse, decode the JPEG, crop, resize to ``side`` and normalise: a host's usual image work."""
    tf = benchlib.tf()
    spec = {
        "id": tf.io.FixedLenFeature([1], tf.int64),
        "jpeg": tf.io.FixedLenFeature([], tf.string),
    }

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        image = tf.io.decode_jpeg(example["jpeg"], channels=3)
        image = tf.image.random_crop(image, [7 * side // 4, 7 * side // 4, 3], seed=1)
        image = tf.image.resize(image, [side, side]) / 255.0
        return image, example["id"] % 10

    return parse


# --- the contenders' input_fns ------------------------------------------------------------------


def _legacy_input_fn(paths, parse, parallel):
    """What a legacy model_to_estimator script passes: no params, the global batch."""
    tf = benchlib.tf()
    calls = tf.data.AUTOTUNE if parallel else None

    def input_fn():
        records = tf.data.TFRecordDataset(paths).shuffle(256).repeat()
        return records.map(parse, num_parallel_calls=calls).batch(GLOBAL)

    return input_fn


def _per_host_input_fn(paths, parse, parallel):
    """A hand-written TPUEstimator input_fn: this host's files (by the deployment TPUEstimator
    gives each invocation), per-core batches of ``params['batch_size']``."""
    tf = benchlib.tf()
    calls = tf.data.AUTOTUNE if parallel else None

    def input_fn(params):
        _, index, count, _ = params["context"].current_input_fn_deployment()
        files = tf.data.Dataset.from_tensor_slices(paths).shard(count, index)
        records = files.flat_map(tf.data.TFRecordDataset).shuffle(256).repeat()
        batches = records.map(parse, num_parallel_calls=calls)
        return batches.batch(params["batch_size"], drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return input_fn


def _keras_model(shape, classes):
    tf = benchlib.tf()
    tf.keras.backend.clear_session()
    layers = [tf.keras.Input(shape)]
    if len(shape) > 1:
        layers.append(tf.keras.layers.GlobalAveragePooling2D())
    layers.append(tf.keras.layers.Dense(classes, activation="softmax"))
    model = tf.keras.Sequential(layers)
    model.compile(tf.keras.optimizers.legacy.SGD(0.01), "sparse_categorical_crossentropy")
    return model


def _hand_written_estimator(tpu, model_dir, classes):
    tf = benchlib.tf()
    from tensorflow_estimator.python.estimator.tpu import tpu_config, tpu_estimator

    def model_fn(features, labels, mode, params):
        del params
        logits = tf.keras.layers.Dense(classes)(tf.keras.layers.Flatten()(features))
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, True))
        optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.01)
        )
        train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
        return tpu_estimator.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

    config = tpu_config.RunConfig(
        cluster=tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu.master),
        model_dir=model_dir,
        tpu_config=tpu_config.TPUConfig(
            iterations_per_loop=4,
            per_host_input_for_training=tpu_config.InputPipelineConfig.PER_HOST_V2,
        ),
    )
    return tpu_estimator.TPUEstimator(
        model_fn=model_fn, config=config, use_tpu=True, train_batch_size=GLOBAL
    )


def _builds(tpu, scratch, contenders, shape, classes):
    """``{contender: Build}``: each contender's training graph on the faked system."""
    tf = benchlib.tf()
    import tpushim

    builds = {}
    for name, input_fn, pod_input in contenders:
        if pod_input is None:  # a hand-written TPUEstimator
            est = _hand_written_estimator(tpu, scratch.new(), classes)
        else:
            tpushim.patch(tpu=tpu.master, iterations_per_loop=4, pod_input=pod_input)
            try:
                est = tf.keras.estimator.model_to_estimator(
                    keras_model=_keras_model(shape, classes), model_dir=scratch.new()
                )
            finally:
                tpushim.unpatch()
        builds[name] = tpu.build(lambda est=est, fn=input_fn: est.train(fn, steps=4))
    return builds


class _HostPipeline:
    """One host's input pipeline, imported from a Build (as ``Build.host_input`` does) into a
    session of its own, initialised: ``next()`` is one per-core batch."""

    def __init__(self, build, host):
        tf = benchlib.tf()
        graph_def = build.graph.as_graph_def()
        task = f"/task:{host}/"
        maker = next(n for n in graph_def.node if n.op == "MakeIterator" and task in n.device)
        iterator = next(n for n in graph_def.node if n.name == maker.input[1].split(":")[0])
        graph_def = tf.compat.v1.graph_util.extract_sub_graph(
            graph_def, [maker.name, iterator.name]
        )
        for node in graph_def.node:
            node.device = ""
        self._graph = tf.Graph()
        with self._graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
            self._next = tf.raw_ops.IteratorGetNext(
                iterator=self._graph.get_tensor_by_name(iterator.name + ":0"),
                output_types=list(iterator.attr["output_types"].list.type),
                output_shapes=[
                    tf.TensorShape(s) for s in iterator.attr["output_shapes"].list.shape
                ],
            )
            self.session = tf.compat.v1.Session(graph=self._graph)
            self.session.run(self._graph.get_operation_by_name(maker.name))

    def rows(self, batches):
        """Runs ``batches`` per-core batches; the rows they held."""
        return sum(self.session.run(self._next)[0].shape[0] for _ in range(batches))

    def close(self):
        self.session.close()


# --- the two measurements --------------------------------------------------------------------------


def _parse_ratio(table, report, scratch, quick):
    counter = _Counter()
    paths = _write_records(scratch.new(), 16, 150 if quick else 400)
    parse = _counting_parse(counter)
    fed_per_host = 3000 if quick else 20000
    contenders = [
        (HAND, _per_host_input_fn(paths, parse, False), None),
        (SHIM, _legacy_input_fn(paths, parse, False), "auto"),
        (EXACT, _legacy_input_fn(paths, parse, False), "exact"),
    ]
    from tpushim._preflight import faketpu

    for hosts in (2, 4):
        with faketpu.faked_tpu_system(hosts=hosts) as tpu:
            builds = _builds(tpu, scratch, contenders, (4,), 3)
        per_core = GLOBAL // tpu.num_cores
        batches = fed_per_host // per_core
        ratios = {}
        for name, _, _ in contenders:
            worst = 0.0
            for host in range(hosts):
                pipeline = _HostPipeline(builds[name], host)
                counter.count = 0
                fed = pipeline.rows(batches)
                pipeline.close()
                worst = max(worst, counter.count / fed)
            ratios[name] = worst
            shim = name == SHIM
            table.add(
                SECTION,
                f"records parsed per record fed, most of any host, {hosts} hosts, "
                f"{fed_per_host} fed per host, {len(paths)} files",
                name,
                f"{worst:.3f}",
                "",
                PARSE_GOAL if shim else "",
                worst <= 1.05 if shim else None,
            )
        report["pods"][f"parsed per fed, {hosts} hosts"] = ratios


def _throughput(table, report, scratch, opts):
    side = 64
    paths = _write_records(scratch.new(), 16, 40 if opts.quick else 120, image=2 * side)
    parse = _decode(side)
    contenders = [
        (HAND, _per_host_input_fn(paths, parse, True), None),
        (HAND_AGAIN, _per_host_input_fn(paths, parse, True), None),
        (SHIM, _legacy_input_fn(paths, parse, True), "auto"),
    ]
    reps = benchlib.rounds(opts, full=9, quick=2)
    examples = 512 if opts.quick else 4096
    from tpushim._preflight import faketpu

    for hosts in (1, 2, 4):
        with faketpu.faked_tpu_system(hosts=hosts) as tpu:
            builds = _builds(tpu, scratch, contenders, (side, side, 3), 10)
        per_core = GLOBAL // tpu.num_cores
        rounds = iter(range(10**6))
        cpu = {name: [] for name, _, _ in contenders}

        def measure(name, builds=builds, per_core=per_core, hosts=hosts, rounds=rounds, cpu=cpu):
            pipeline = _HostPipeline(builds[name], next(rounds) // len(contenders) % hosts)
            pipeline.rows(2 * GLOBAL // per_core)  # warm-up: buffers filled, threads started
            start, start_cpu = time.perf_counter(), time.process_time()
            rows = pipeline.rows(examples // per_core)
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
            pipeline.close()
            cpu[name].append(rows / cpu_seconds)
            return rows / seconds

        values = benchlib.interleaved([(n, n) for n, _, _ in contenders], reps, measure)
        where = f"JPEG decode + crop + resize {side}px, {hosts} host{'s' * (hosts > 1)}, x{reps}"
        for label, measured, unit in (
            ("examples/s per host", values, "ex/s"),
            ("examples per host CPU-second", cpu, "ex/cpu-s"),
        ):
            paired = benchlib.Paired(measured, HAND)
            noise = paired.ratios(HAND_AGAIN)
            for name, _, _ in contenders:
                ratio = paired.ratio(name)
                shim = name == SHIM
                table.add(
                    SECTION,
                    f"{label}, {where}",
                    name,
                    f"{median(measured[name]):.0f} {unit}",
                    f"{ratio:.3f}x",
                    SPEED_GOAL if shim else "",
                    ratio >= 0.95 if shim else None,
                    spread=paired.spread(name),
                    noise=(min(noise), max(noise)),
                )
        report["pods"][f"examples/s, {hosts} hosts"] = values
        report["pods"][f"examples per CPU-second, {hosts} hosts"] = cpu


def run(table, opts, report):
    """The ``pods`` section."""
    benchlib.tf()
    report["pods"] = {}
    with benchlib.ScratchDir("tpushim-bench-pods-") as scratch:
        _parse_ratio(table, report, scratch, opts.quick)
        _throughput(table, report, scratch, opts)
