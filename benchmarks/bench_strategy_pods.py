"""Pods on the strategy engine (``--only strategy-pods``, issue 33): one host's input pipeline
as TPUStrategy runs it, tpushim's against a hand-written ``distribute_datasets_from_function``.

On a pod TPUStrategy calls the dataset function of ``distribute_datasets_from_function`` once per
host with a ``tf.distribute.InputContext``; the host iterates the Dataset it returns, one
per-replica batch per replica it feeds per step. Here the hosts are emulated as the CPU proof
emulates them (tests/strategy_pod_proof.py): each contender's function is called with a real
``tf.distribute.InputContext(H, h, 8)`` and the Dataset it returns is iterated in this process,
one host at a time (the host measured rotates with the rounds). Contenders, on the same TFRecord
files, the same parse function (JPEG decode + crop + resize, bench_pods's) and the same global
batch:

* **hand-written**: what a TF user writes for ``distribute_datasets_from_function``:
  ``Dataset.list_files(pattern, shuffle=False).shard(ctx.num_input_pipelines,
  ctx.input_pipeline_id)``, interleave ``TFRecordDataset``, parse, shuffle, repeat,
  ``batch(ctx.get_per_replica_batch_size(global_batch))``, prefetch; and the same again (the
  noise: hand-written against itself);
* **tpushim, files path**: ``tpushim._strategy.input.HostInput`` -- the dataset function the
  strategy engine hands TPUStrategy -- on the legacy input_fn a model_to_estimator script passes
  (the same pipeline over every file, no context, ``batch(global_batch)``): each host reads only
  its own files and cuts its rows into per-replica batches. Goal: >= 0.95x the hand-written
  examples/s;
* **tpushim, exact path** (``pod_input=exact``): every host runs the user's whole pipeline and
  keeps its replicas' pieces, so it parses every record to feed 1/H of them: about 1/H of the
  hand-written rate by design (the price of each global batch being one board's). Reported for
  scale, without a goal.

Measured: examples (rows of per-replica batches) per second a host's Dataset delivers after a
warm-up, and per CPU-second of this process (the pipeline's threads included: less of the
machine's other load in it).
"""

import os
import time

import bench_pods
import benchlib
from benchlib import median

SECTION = "strategy pods"
HAND, HAND_AGAIN = "hand-written distribute_datasets_from_function", "hand-written again"
FILES, EXACT = "tpushim HostInput, files path", "tpushim HostInput, exact path"
REPLICAS, GLOBAL, SHUFFLE, SIDE = 8, 256, 256, 64
GOAL = 0.95


def hand_written(pattern, parse, global_batch=GLOBAL):
    """A TF user's dataset function for ``distribute_datasets_from_function``: this host's
    files (the file list unshuffled, so every host cuts the same list), per-replica batches."""
    tf = benchlib.tf()

    def dataset_fn(ctx):
        files = tf.data.Dataset.list_files(pattern, shuffle=False)
        files = files.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        records = files.interleave(
            tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE
        )
        records = records.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        batches = records.shuffle(SHUFFLE).repeat()
        per_replica = ctx.get_per_replica_batch_size(global_batch)
        return batches.batch(per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return dataset_fn


def legacy_input_fn(pattern, parse, global_batch=GLOBAL):
    """The same pipeline as a legacy model_to_estimator script's input_fn: every file, no
    context, the global batch."""
    tf = benchlib.tf()

    def input_fn():
        files = tf.data.Dataset.list_files(pattern, shuffle=False)
        records = files.interleave(
            tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE
        )
        records = records.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        batches = records.shuffle(SHUFFLE).repeat()
        return batches.batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return input_fn


class _Config:
    """The two RunConfig fields HostInput reads."""

    tf_random_seed = benchlib.SEED
    session_config = None


def host_input(input_fn, hosts, pod_input, global_batch=GLOBAL):
    """tpushim's dataset function for ``hosts`` hosts of ``REPLICAS / hosts`` replicas each."""
    from tpushim._strategy import input as _strategy_input

    feeds = _strategy_input._blocks(REPLICAS, hosts)
    return _strategy_input.HostInput(input_fn, "train", _Config(), global_batch, feeds, pod_input)


def _rate(dataset, per_replica, examples):
    """(examples/s, examples per CPU-second) of ``dataset`` after a warm-up of two global
    batches' worth (tpushim's elements carry the padding weight beside the features: the engine
    needs it; counted are rows of per-replica batches)."""
    tf = benchlib.tf()
    iterator = iter(dataset)
    for _ in range(2 * GLOBAL // per_replica):  # warm-up: buffers filled, threads started
        next(iterator)
    start, start_cpu = time.perf_counter(), time.process_time()
    rows = sum(
        int(tf.nest.flatten(next(iterator))[0].shape[0]) for _ in range(examples // per_replica)
    )
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    return rows / seconds, rows / cpu_seconds


def _throughput(table, report, scratch, opts, hosts):
    tf = benchlib.tf()
    directory = scratch.new()
    bench_pods._write_records(directory, 16, 40 if opts.quick else 120, image=2 * SIDE)
    pattern = os.path.join(directory, "*.tfrecord")
    parse = bench_pods._decode(SIDE)
    functions = {
        HAND: hand_written(pattern, parse),
        HAND_AGAIN: hand_written(pattern, parse),
        FILES: host_input(legacy_input_fn(pattern, parse), hosts, "auto"),
        EXACT: host_input(legacy_input_fn(pattern, parse), hosts, "exact"),
    }
    paths = {FILES: functions[FILES].path.name, EXACT: functions[EXACT].path.name}
    if paths != {FILES: "files", EXACT: "exact"}:  # the rows would not measure what they say
        raise RuntimeError(f"tpushim's HostInput took the paths {paths} on {hosts} hosts")
    reps = benchlib.rounds(opts, full=7, quick=1)
    examples = 512 if opts.quick else 4096
    per_replica = GLOBAL // REPLICAS
    turn = iter(range(10**6))
    cpu = {name: [] for name in functions}

    def measure(name):
        host = next(turn) // len(functions) % hosts
        context = tf.distribute.InputContext(hosts, host, REPLICAS)
        rate, per_cpu = _rate(functions[name](context), per_replica, examples)
        cpu[name].append(per_cpu)
        return rate

    values = benchlib.interleaved([(n, n) for n in functions], reps, measure)
    where = (
        f"JPEG decode + crop + resize {SIDE}px, host of {hosts}, {REPLICAS // hosts} replicas "
        f"x {per_replica}, x{reps}"
    )
    for label, measured, unit in (
        ("examples/s per host", values, "ex/s"),
        ("examples per host CPU-second", cpu, "ex/cpu-s"),
    ):
        paired = benchlib.Paired(measured, HAND)
        noise = paired.ratios(HAND_AGAIN)
        for name in functions:
            goal = name == FILES and unit == "ex/s"  # the goal: throughput
            ratio = paired.ratio(name)
            table.add(
                SECTION,
                f"{label}, {where}",
                name,
                f"{median(measured[name]):.0f} {unit}",
                f"{ratio:.3f}x" if name != HAND else "",
                f">= {GOAL}x" if goal else "",
                ratio >= GOAL if goal else None,
                spread=paired.spread(name) if name != HAND else "",
                noise=(min(noise), max(noise)),
            )
    report["strategy-pods"][f"examples/s, {hosts} hosts"] = values
    report["strategy-pods"][f"examples per CPU-second, {hosts} hosts"] = cpu


def run(table, opts, report):
    """The ``strategy-pods`` section."""
    benchlib.tf()
    report["strategy-pods"] = {}
    with benchlib.ScratchDir("tpushim-bench-strategy-pods-") as scratch:
        for hosts in (2, 4):
            _throughput(table, report, scratch, opts, hosts)
    table.notes.append(
        "strategy pods: the exact path reads every record on every host (each global batch one "
        "board's) and feeds 1/H of them: about 1/H of the hand-written rate by design, no goal."
    )
