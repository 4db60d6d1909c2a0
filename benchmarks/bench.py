"""tpushim benchmarks: every ratio measured side by side in one run, interleaved, median reported.

    python benchmarks/bench.py                  # full run, every section
    python benchmarks/bench.py --quick          # smoke run: few rounds, short runs
    python benchmarks/bench.py --only train,graph --rounds 3 --json /tmp/bench.json

Sections (``--only`` takes their names; each is a module here, its docstring says what it
measures and its goals): ``startup`` (bench_startup), ``wrapper`` (bench_wrapper), ``train``
(bench_training), ``input`` (bench_input, legacy input), ``graph`` (bench_graph, built with the
tests' replica harness ``tests/replicas.py``), ``pods`` (bench_pods: each host's input on faked
TPU systems of 1, 2 and 4 hosts), ``scale`` (bench_scale, in-memory arrays at real size, one
process per run), ``padding`` (bench_padding: a TPU host's pipeline with padded batches), ``bn`` (bench_bn:
BatchNormalization-heavy Keras applications on a finite input, cpu mode against stock, the TPU
step against a hand-written one, the preflight against the script; its parts ``bn-step`` and
``bn-check`` run alone), ``tf216`` (bench_tf216: tpushim's estimator API on TensorFlow >= 2.16
against stock 2.15, two interpreters: ``--tf216-python``), ``strategy`` (bench_strategy: the
strategy engine's ``train()`` against a hand-written Keras ``fit`` under the same
MirroredStrategy on 8 logical CPU devices; ``strategy-activity``: a model with activity regularizers, the
engine against itself before they were read from its forward pass), ``strategy-pods`` (bench_strategy_pods: one
emulated host's input on the strategy engine, tpushim's ``HostInput`` against a hand-written
``distribute_datasets_from_function``), ``strategy-images`` (bench_strategy_images: MobileNetV2
and ResNet50 converted and trained for 2 steps on the strategy engine against the stock
estimator, and against the engine before it read stock's checkpoint names from the
conversion's graph), ``first-checkpoint`` (bench_first_checkpoint: seconds from ``train()``
called to ``model.ckpt-0`` on every engine against stock, an MLP and MobileNetV2, one process a
run). All of them write one table (benchlib.Table).

Each timed comparison has a stock-against-stock row (the baseline run again, interleaved like the
rest) and a ``spread`` column, the range of the per-round ratios (or differences): a goal is judged
against that noise. A missed goal whose median lies inside the stock-against-stock spread of the
same case is marked so, and still counts as missed. The exit status is 1 when any goal is missed,
0 otherwise (2: bad arguments).

The tpushim benchmarked is the one in this tree (its folder goes first on ``sys.path``, and
start-up subprocesses get it on ``PYTHONPATH``). Every contender gets the same model, data, seed and
batch size; TensorFlow's logger is set to ERROR so log formatting is not timed; every variable
that configures tpushim or names a TPU is removed first, so "no TPU configured" is true.
"""

import argparse
import contextlib
import json
import os
import platform
import sys
import time

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # this tree's tpushim

import bench_bn
import bench_first_checkpoint
import bench_graph
import bench_input
import bench_padding
import bench_pods
import bench_scale
import bench_startup
import bench_strategy
import bench_strategy_images
import bench_strategy_pods
import bench_tf216
import bench_training
import bench_wrapper
import benchlib

#: name -> run(table, opts, report); start-up first: it must not compete with TensorFlow.
SECTIONS = {
    "startup": bench_startup.run,
    "wrapper": bench_wrapper.run,
    "train": bench_training.run,
    "input": bench_input.run,
    "graph": bench_graph.run,
    "pods": bench_pods.run,
    "scale": bench_scale.run,
    "padding": bench_padding.run,
    "bn": bench_bn.run,
    "tf216": bench_tf216.run,
    "strategy": bench_strategy.run,
    "strategy-activity": bench_strategy.run_activity,
    "strategy-pods": bench_strategy_pods.run,
    "strategy-images": bench_strategy_images.run,
    "first-checkpoint": bench_first_checkpoint.run,
}
#: parts of a section ``--only`` also takes (never run by default: their section runs them)
PARTS = {"bn-step": bench_bn.run_step, "bn-check": bench_bn.run_check}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: few rounds and short training runs"
    )
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections: {', '.join(SECTIONS)} (or parts: {', '.join(PARTS)})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="interleaved rounds per comparison (default: per section)",
    )
    parser.add_argument("--json", help="also write raw measurements to this file")
    parser.add_argument(
        "--compare-tree",
        metavar="DIR",
        help="start-up: also time a prototype tpushim package in DIR (interleaved)",
    )
    parser.add_argument(
        "--tf216-python",
        metavar="PYTHON",
        help=f"tf216: a Python with TensorFlow >= 2.16 and tf-keras (default "
        f"${bench_tf216.VAR}; the section is skipped without one)",
    )
    parser.add_argument(
        "--tf215-python",
        metavar="PYTHON",
        help="tf216: the stock side's Python, TensorFlow <= 2.15 with tensorflow_estimator "
        "(default: this one)",
    )
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.sections) - set(SECTIONS) - set(PARTS)
    if unknown or not args.sections:
        parser.error(
            f"unknown sections {sorted(unknown)}; choose from {', '.join([*SECTIONS, *PARTS])}"
        )
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    dropped = sorted(k for k in os.environ if k in benchlib.tpu_env_vars())
    for key in dropped:  # "no TPU configured" must be true for the auto-mode rows
        del os.environ[key]
    table, report = benchlib.Table(), {}
    start = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    runs = {**SECTIONS, **PARTS}
    for name in sorted(args.sections, key=list(runs).index):
        runs[name](table, args, report)
    elapsed = time.perf_counter() - start
    tf_version = (
        sys.modules["tensorflow"].__version__ if "tensorflow" in sys.modules else "not imported"
    )
    print(
        f"tpushim benchmarks ({'quick' if args.quick else 'full'}): python {platform.python_version()}, "
        f"tensorflow {tf_version}, {os.cpu_count()} CPUs, load average {load:.2f} at start, "
        f"{elapsed:.0f} s" + (f"; removed from env: {', '.join(dropped)}" if dropped else "")
    )
    print()
    print(table.render())
    missed = table.missed()
    print()
    print(
        f"goals missed: {len(missed)}"
        + "".join(f"\n  {r[0]} | {r[1]} | {r[2]}: {r[4]}, goal {r[6]}" for r in missed)
    )
    for note in table.notes:
        print()
        print(note)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, default=str)
    return 1 if missed else 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
