"""The JAX engine's benchmark (benchmarks/bench_jax.py) runs: its smoke run (one tiny model, one
round) prints the table with the engine's rows judged against the hand-written step's, and its
exit status says whether a goal was missed. The numbers are not judged here (a loaded machine)."""

import importlib.util
import os
import re

import procs
import pytest
from jax_scripts import scripts_started  # noqa: F401 (the scripts' run, in the background)

pytestmark = pytest.mark.jax
if not all(importlib.util.find_spec(m) for m in ("jax", "tf2jax")):  # not imported: the
    pytest.skip("the JAX engine needs jax and tf2jax", allow_module_level=True)  # 8 devices

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_run_prints_the_engine_against_the_hand_written_step(tmp_path):
    bench = os.path.join(REPO, "benchmarks", "bench_jax.py")
    out = tmp_path / "raw.json"
    proc = procs.python(
        [bench, "--tiny", "--rounds", "1", "--json", str(out)],
        cwd=str(tmp_path),
        env={"PYTHONPATH": REPO},
        timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    rows = [line.split("  ") for line in proc.stdout.splitlines() if line.startswith("jax ")]
    text = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("jax "))
    assert len(rows) == 7, proc.stdout
    for what in ("steady steps/s", "first compile s"):
        for contender in ("hand-written jax.jit", "hand-written again", "tpushim JAX engine"):
            assert re.search(rf"{re.escape(what)}\s+{contender}\s+\d+\.\d+", text), (what, text)
    goals = re.findall(
        r"tpushim JAX engine\s+[\d.]+\s+([\d.]+)x\s+(>= 0\.95x|<= 1\.2x)\s+(\S+)", text
    )
    assert len(goals) == 2, text
    for ratio, goal, verdict in goals:
        met = float(ratio) >= 0.95 if goal.startswith(">=") else float(ratio) <= 1.2
        assert verdict == ("yes" if met else "NO"), (ratio, goal, verdict)
    missed = sum(verdict != "yes" for _, _, verdict in goals)
    assert f"goals missed: {missed}" in proc.stdout
    assert proc.returncode == (1 if missed else 0)
    assert out.exists() and set(os.listdir(tmp_path)) == {"raw.json"}  # nothing else written
