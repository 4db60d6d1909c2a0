"""Start-up: ``import tpushim; tpushim.patch()`` before TensorFlow against a bare interpreter
(``python -c pass``), in fresh subprocesses, interleaved: the median of the paired wall-clock
differences, and the code's own time measured inside the interpreter (far less noisy). Rows: with
bytecode cached (as after ``pip install``; the cache lives in a temporary PYTHONPYCACHEPREFIX,
never in the tree), under ``python -S`` (no ``.pth`` file preloads stdlib modules: a lean
interpreter's cost), and, when PYTHONDONTWRITEBYTECODE is set, with no bytecode at all. Then
whether TensorFlow (and wrapt, inspect, logging, dataclasses) got imported, and a
``python -X importtime`` breakdown. Goal: <= 5 ms added, no TensorFlow.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import benchlib

SHIM_CODE = "import tpushim; tpushim.patch()"
IMPORT_CODE = "import tpushim"
CHECK_CODE = (
    "import json, sys, tpushim; tpushim.patch(); "
    "print(json.dumps(sorted(m for m in ('tensorflow', 'tensorflow_estimator', 'keras', "
    "'numpy', 'wrapt', 'inspect', 'logging', 'dataclasses') if m in sys.modules)))"
)


def _self_timed(code):
    """``code`` that also prints how long it took inside the interpreter (perf_counter seconds)."""
    return f"import time as _t; _s = _t.perf_counter(); {code}; print(_t.perf_counter() - _s)"


def _repo_of_tpushim():
    return os.path.dirname(os.path.dirname(importlib.util.find_spec("tpushim").origin))


def _cached_env(pycache, pythonpath=None, no_site=False):
    """An environment whose imports read bytecode from ``pycache`` (written there by warm-up runs,
    never into the source tree), as after ``pip install`` -- whatever PYTHONDONTWRITEBYTECODE says
    here. ``pythonpath``: a tree to import tpushim from first. ``no_site``: PYTHONPATH for
    ``python -S`` (the tree holding tpushim, and wrapt's site-packages)."""
    env = benchlib.clean_env({"PYTHONPYCACHEPREFIX": pycache})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    paths = [pythonpath] if pythonpath else []
    if no_site:
        paths.append(pythonpath or _repo_of_tpushim())
        paths.append(os.path.dirname(os.path.dirname(importlib.util.find_spec("wrapt").origin)))
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _run(argv, env):
    # cwd: a neutral folder, as ``-c`` puts the working directory first on sys.path (run from the
    # repository root, it would shadow the tree under test).
    start = time.perf_counter()
    out = subprocess.run(
        argv, env=env, check=True, capture_output=True, text=True, cwd=tempfile.gettempdir()
    ).stdout
    return time.perf_counter() - start, out


class StartupVariant:
    """One way to start an interpreter: ``flags`` + ``-c code`` under ``env``."""

    def __init__(self, label, code, env, flags=()):
        self.label, self.code, self.env, self.flags = label, code, env, list(flags)

    def wall(self):
        return _run([sys.executable, *self.flags, "-c", self.code], self.env)[0]

    def in_process(self):
        out = _run([sys.executable, *self.flags, "-c", _self_timed(self.code)], self.env)[1]
        return float(out.split()[-1])


def _startup_rows(table, case, variants, reps, goals):
    """Runs ``variants`` (the first is the baseline) interleaved, ``reps`` times each, both plain
    (wall clock, measured from here) and self-timed (the code's own time inside the interpreter).
    Adds one row per variant; ``goals``: labels held to the <= 5 ms goal."""
    for v in variants:  # warm-up: writes the bytecode cache, fills the OS file cache
        v.wall(), v.in_process()
    wall = {v.label: [] for v in variants}
    inner = {v.label: [] for v in variants}
    for i in range(reps):
        shift = i % len(variants)
        for v in variants[shift:] + variants[:shift]:
            wall[v.label].append(v.wall())
            inner[v.label].append(v.in_process())
    paired = benchlib.Paired(wall, variants[0].label)
    added_ms = lambda a, b: (a - b) * 1e3  # paired per round
    again = [paired.ratios(v.label, added_ms) for v in variants if v.label.endswith("(again)")]
    noise = (min(again[0]), max(again[0])) if again else None
    for v in variants:
        ms, own = benchlib.median(wall[v.label]) * 1e3, benchlib.median(inner[v.label]) * 1e3
        if v is variants[0]:
            table.add("start-up", case, v.label, f"{ms:.1f} ms wall")
            continue
        added = paired.ratio(v.label, added_ms)
        goal = v.label in goals
        table.add(
            "start-up",
            case,
            v.label,
            f"{ms:.1f} ms wall; in-process {own:.2f} ms",
            f"{added:+.1f} ms",
            "<= +5 ms" if goal else "",
            (added <= 5.0 and own <= 5.0) if goal else None,
            spread=(paired.spread(v.label, added_ms, "{:+.1f}") + " ms").strip(),
            noise=noise,
        )
    return {"wall_s": wall, "in_process_s": inner}


def parse_importtime(stderr):
    """[(name, depth, self_us, cumulative_us)] for the imports after ``site`` (the -c code's)."""
    rows = []
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)", line)
        if m:
            rows.append((m.group(4), len(m.group(3)) // 2, int(m.group(1)), int(m.group(2))))
    site = max((i for i, r in enumerate(rows) if r[0] == "site" and r[1] == 0), default=-1)
    return rows[site + 1 :]


def importtime_breakdown(runs, env):
    """Median self/cumulative microseconds per module over ``runs`` runs of -X importtime."""
    per_module, order = {}, None
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", SHIM_CODE],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd=tempfile.gettempdir(),
        )
        rows = parse_importtime(proc.stderr)
        order = order or rows
        for name, _, self_us, cum_us in rows:
            per_module.setdefault(name, []).append((self_us, cum_us))
    return [
        (
            name,
            depth,
            benchlib.median([s for s, _ in per_module[name]]),
            benchlib.median([c for _, c in per_module[name]]),
        )
        for name, depth, _, _ in order
    ]


def run(table, opts, report):
    """The ``startup`` section."""
    reps = benchlib.rounds(opts, full=50, quick=15)
    compare_tree = opts.compare_tree
    pycache = tempfile.mkdtemp(prefix="tpushim-bench-pycache-")
    report["startup"] = {"reps": reps}
    try:
        env = _cached_env(pycache, _repo_of_tpushim())
        modules = json.loads(_run([sys.executable, "-c", CHECK_CODE], env)[1].splitlines()[-1])
        tf_imported = "tensorflow" in modules
        variants = [
            StartupVariant("python -c pass", "pass", env),
            # The baseline against itself: the noise the other rows' differences sit in.
            StartupVariant("python -c pass (again)", "pass", env),
            StartupVariant(IMPORT_CODE, IMPORT_CODE, env),
            StartupVariant(SHIM_CODE, SHIM_CODE, env),
        ]
        goals = {SHIM_CODE}
        if compare_tree:  # a prototype tree, interleaved with the rest
            label = f"{SHIM_CODE}  [PYTHONPATH={compare_tree}]"
            variants.append(StartupVariant(label, SHIM_CODE, _cached_env(pycache, compare_tree)))
            goals.add(label)
        report["startup"]["cached"] = _startup_rows(
            table, f"bytecode cached, {reps} runs", variants, reps, goals
        )
        table.add(
            "start-up",
            "modules after patch()",
            SHIM_CODE,
            ", ".join(modules) or "none of those checked",
            "",
            "no tensorflow",
            not tf_imported,
        )
        report["startup"]["modules"] = modules
        # Under -S no .pth file preloads stdlib modules (this machine's site imports certifi and
        # with it pathlib, typing, re, ...): the cost on a lean interpreter.
        ns_env = _cached_env(pycache, _repo_of_tpushim(), no_site=True)
        variants = [
            StartupVariant("python -S -c pass", "pass", ns_env, ["-S"]),
            StartupVariant(f"python -S: {SHIM_CODE}", SHIM_CODE, ns_env, ["-S"]),
        ]
        if compare_tree:
            variants.append(
                StartupVariant(
                    f"python -S: {SHIM_CODE}  [PYTHONPATH={compare_tree}]",
                    SHIM_CODE,
                    _cached_env(pycache, compare_tree, no_site=True),
                    ["-S"],
                )
            )
        report["startup"]["no_site"] = _startup_rows(
            table,
            f"python -S (no site), {reps} runs",
            variants,
            reps,
            {v.label for v in variants[1:]},
        )
        # As this checkout starts when PYTHONDONTWRITEBYTECODE is set (this machine): an editable
        # install without bytecode compiles tpushim's sources at every start.
        raw_env = benchlib.clean_env({"PYTHONPATH": _repo_of_tpushim()})
        if raw_env.get("PYTHONDONTWRITEBYTECODE"):
            variants = [
                StartupVariant("python -c pass", "pass", raw_env),
                StartupVariant(SHIM_CODE, SHIM_CODE, raw_env),
            ]
            report["startup"]["no_bytecode"] = _startup_rows(
                table,
                f"PYTHONDONTWRITEBYTECODE=1, no bytecode, {reps // 2} runs",
                variants,
                reps // 2,
                set(),
            )
        breakdown = importtime_breakdown(3 if opts.quick else 7, env)
    finally:
        shutil.rmtree(pycache, ignore_errors=True)
    report["startup_importtime"] = breakdown
    lines = [
        'python -X importtime -c "import tpushim; tpushim.patch()" (bytecode cached; median '
        "of runs; microseconds; only the imports after site; depth <= 2 or self >= 300 us):",
        f"  {'self':>7} {'cumul':>7}  module",
    ]
    for name, depth, self_us, cum_us in breakdown:
        if depth <= 2 or self_us >= 300:
            lines.append(f"  {self_us:7.0f} {cum_us:7.0f}  {'  ' * depth}{name}")
    top = sorted(breakdown, key=lambda r: -r[2])[:8]
    lines.append("  largest self times: " + ", ".join(f"{n} {s:.0f}" for n, _, s, _ in top))
    table.notes.append("\n".join(lines))
