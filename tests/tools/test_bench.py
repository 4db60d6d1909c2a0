"""The benchmark runner (benchmarks/bench.py): its table, and its exit status (a missed goal -> 1).

The graph section is the one run for real: its counts are exact (no timing noise) and it builds
with the tests' replica harness, so a smoke run of it checks the runner end to end in seconds.
"""

import json
import os
import re
import sys

import procs
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmarks", "bench.py")
HEAD = ("benchmark", "case", "contender", "median", "ratio", "spread", "goal", "ok")


def _table(stdout):
    """(column names, [row as {column: cell}]) parsed from the aligned text table bench prints."""
    lines = stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("benchmark "))
    head, rule = lines[i], lines[i + 1]
    spans = [m.span() for m in re.finditer(r"-+", rule)]
    names = tuple(head[a:b].strip() for a, b in spans)
    for a, _ in spans[1:]:
        assert head[a - 2 : a] == "  ", "columns are separated by two spaces"
    rows = []
    for line in lines[i + 2 :]:
        if line.startswith("goals missed"):  # printed right after the table
            break
        if line.strip():  # a blank line separates sections
            cells = [
                line[a : b if k < len(spans) - 1 else None].strip()
                for k, (a, b) in enumerate(spans)
            ]
            rows.append(dict(zip(names, cells)))
    return names, rows


def _bench(*args, timeout=600):
    return procs.python([BENCH, *args], cwd=REPO, timeout=timeout)


@pytest.mark.slow  # a TensorFlow subprocess that trains
@pytest.mark.tpuestimator
def test_quick_graph_section_prints_the_table_and_exits_1_exactly_when_a_goal_is_missed():
    proc = _bench("--quick", "--only", "graph")
    names, rows = _table(proc.stdout)
    assert names == HEAD
    assert proc.stdout.startswith("tpushim benchmarks (quick): ")
    assert {r["benchmark"] for r in rows} == {"TPU train-step ops"}
    assert len(rows) == 4  # quick: one model, four contenders (two of them tpushim's, with a goal)
    verdicts = [r["ok"] for r in rows if r["goal"]]
    assert len(verdicts) == 2 and all(v in ("yes", "NO") for v in verdicts), rows
    for row in rows:
        assert re.fullmatch(r"\d+ graph / \d+ cluster / \d+ live", row["median"]), row
    missed = sum(v == "NO" for v in verdicts)
    assert f"goals missed: {missed}" in proc.stdout
    assert proc.returncode == (1 if missed else 0), proc.stdout + proc.stderr


def test_unknown_section_is_a_usage_error():
    proc = _bench("--only", "nonsense", timeout=300)
    assert proc.returncode == 2 and "unknown sections ['nonsense']" in proc.stderr


def test_tf216_section_without_a_second_python_is_skipped_saying_how_to_run_it():
    proc = procs.python(
        [BENCH, "--only", "tf216"], cwd=REPO, timeout=300, env={"TPUSHIM_BENCH_TF216_PYTHON": ""}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "goals missed: 0" in proc.stdout
    assert (
        "tf216: skipped: name a Python with TensorFlow >= 2.16 and tf-keras (--tf216-python PATH "
        "or TPUSHIM_BENCH_TF216_PYTHON=PATH)"
    ) in proc.stdout


@pytest.fixture
def bench(monkeypatch):
    """benchmarks/bench.py imported here, sys.path restored afterwards."""
    monkeypatch.setattr(sys, "path", [os.path.join(REPO, "benchmarks"), *sys.path])
    import bench as module

    return module


def _section(values, bound):
    """A section judging contender 'shim' against 'stock', with 'stock again' as the noise."""

    def run(table, opts, report):
        del opts, report
        import benchlib

        paired = benchlib.Paired(values, "stock")
        noise = paired.ratios("stock again")
        for name in values:
            ratio = paired.ratio(name)
            is_goal = name == "shim"
            table.add(
                "toy",
                "case",
                name,
                f"{ratio:.3f}",
                f"{ratio:.3f}x",
                ">= goal" if is_goal else "",
                ratio >= bound if is_goal else None,
                spread=paired.spread(name),
                noise=(min(noise), max(noise)),
            )

    return run


@pytest.mark.parametrize(
    "shim,bound,status,verdict",
    [
        ([0.95, 0.94, 0.96], 0.90, 0, "yes"),
        # Missed, by a median that stock against itself also reaches (0.9..1.1): still missed.
        ([0.95, 0.94, 0.96], 0.99, 1, "NO (within stock-vs-stock spread)"),
        ([0.85, 0.84, 0.86], 0.90, 1, "NO"),
    ],
)
def test_exit_status_is_1_when_a_goal_is_missed_noise_or_not(
    bench, monkeypatch, capsys, shim, bound, status, verdict
):
    values = {"stock": [1.0, 1.0, 1.0], "stock again": [0.9, 1.0, 1.1], "shim": shim}
    monkeypatch.setitem(bench.SECTIONS, "toy", _section(values, bound))
    assert bench.main(["--only", "toy"]) == status
    out = capsys.readouterr().out
    _, rows = _table(out)
    row = next(r for r in rows if r["contender"] == "shim")
    assert row["ratio"] == f"{sorted(shim)[1]:.3f}x"  # the median of the per-round ratios
    assert row["spread"] == f"{min(shim):.3f}..{max(shim):.3f}" and row["ok"] == verdict
    assert next(r for r in rows if r["contender"] == "stock again")["spread"] == "0.900..1.100"
    assert f"goals missed: {status}" in out


def test_strategy_pods_section_compares_the_same_per_replica_batches_on_each_path(bench, tmp_path):
    import bench_pods
    import bench_strategy_pods as section
    import benchlib

    tf = benchlib.tf()
    assert bench.SECTIONS["strategy-pods"] is section.run
    bench_pods._write_records(str(tmp_path), 8, 6, image=16)
    pattern, parse, batch, hosts = str(tmp_path / "*.tfrecord"), bench_pods._decode(8), 16, 2
    functions = {
        "hand": section.hand_written(pattern, parse, batch),
        "files": section.host_input(
            section.legacy_input_fn(pattern, parse, batch), hosts, "auto", batch
        ),
        "exact": section.host_input(
            section.legacy_input_fn(pattern, parse, batch), hosts, "exact", batch
        ),
    }
    # The rows measure what they are named for: tpushim's files path and exact path.
    assert functions["files"].path.name == "files" and functions["exact"].path.name == "exact"
    for name, function in functions.items():
        for host in range(hosts):
            dataset = function(tf.distribute.InputContext(hosts, host, section.REPLICAS))
            for element in dataset.take(3):  # per-replica batches of the same images
                images = tf.nest.flatten(element)[0]
                assert images.shape == (batch // section.REPLICAS, 8, 8, 3), (name, host)


@pytest.mark.slow  # a TensorFlow subprocess on 8 logical devices
def test_strategy_section_driver_measures_fit_and_the_engine_in_one_process(tmp_path):
    # The driver wraps the engine's training loop to time it: a change to what the loop returns
    # must not break the benchmark unseen (it did once: (steps, losses) became three values).
    script = os.path.join(REPO, "benchmarks", "bench_strategy.py")
    proc = procs.python([script, str(tmp_path), "paired", "40", "1"], cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("BENCH ")][-1]
    [(before, engine, after)] = json.loads(line[len("BENCH ") :])
    assert before > 0 and engine > 0 and after > 0
