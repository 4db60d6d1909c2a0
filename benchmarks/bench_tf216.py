"""TensorFlow 2.16+: tpushim's estimator API on TF 2.21 against stock TF 2.15, same machine.

One run needs two interpreters: stock TensorFlow <= 2.15 with tensorflow_estimator (default: the
one running the benchmark) and TensorFlow >= 2.16 with tf-keras and this tree's tpushim
(``--tf216-python`` or ``TPUSHIM_BENCH_TF216_PYTHON``; the section is skipped, saying so, when
neither names one). Each run is a fresh subprocess of one of them (this file, run as a driver):
the demo or a tests/scripts script, unchanged, its every ``train()`` timed from inside by
wrapping the estimator class's ``train`` with a step-counting hook. Contenders per round, the
order rotating: stock 2.15, stock 2.15 again (the stock-against-stock row: the noise), tpushim on
2.21 (``tpushim.patch()`` before TensorFlow, as README's one line).

Measured: steps/s of ``train()`` (all steps over all train() calls' wall time: graph building,
session creation and checkpoints included, as a user waits for them), and the steady rate
(steps after the first session run over the time they took: per-step cost alone), and where
the rest goes: setup (train() called to its first step done: graph, session, restore) and end
(its last step to its return: the final checkpoint), summed over train() calls; the set-up's CPU
time on the calling thread (graph building is Python there: steadier than wall time on shared
cores), and the time CPython's full (generation 2) garbage collections took inside train() with
how many rounds had one (a full collection walks every object the process holds, ~0.15-0.3 s
after TensorFlow's import; where the count of allocations makes one fall, inside train() or
before it, differs between TensorFlow releases and scripts). Goal: tpushim on 2.21 >= 0.95x stock
2.15's train() steps/s, per case.
"""

import json
import os
import subprocess
import sys
import tempfile

import benchlib

VAR = "TPUSHIM_BENCH_TF216_PYTHON"
GOAL = 0.95
#: (case, what the driver runs): the demo and two tests/scripts scripts (TF1 style with numpy
#: input; add_metrics around a converted estimator).
CASES = (
    ("demo (legacy_mlp)", "demo"),
    ("census_numpy_tf1.py", "tests/scripts/census_numpy_tf1.py"),
    ("iris_add_metrics.py", "tests/scripts/iris_add_metrics.py"),
)


def _probe(python):
    """``(TensorFlow version, has tensorflow_estimator)`` of ``python``, or None."""
    code = (
        "import importlib.metadata as m, importlib.util as u, json\n"
        "v = None\n"
        "for d in ('tensorflow', 'tensorflow-cpu'):\n"
        "    try:\n        v = m.version(d); break\n"
        "    except m.PackageNotFoundError:\n        pass\n"
        "print(json.dumps([v, u.find_spec('tensorflow_estimator') is not None]))"
    )
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        return tuple(json.loads(out.strip().splitlines()[-1]))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _major_minor(version):
    return tuple(int(p) for p in str(version).split(".")[:2])


def _run(python, target, patch):
    """One driver run: ``(train steps/s, steady steps/s, steps)``."""
    with tempfile.TemporaryDirectory(prefix="bench_tf216_") as workdir:
        env = benchlib.clean_env({"PYTHONPATH": benchlib.REPO, "TF_USE_LEGACY_KERAS": ""})
        proc = subprocess.run(
            [python, os.path.abspath(__file__), target, workdir] + (["--patch"] if patch else []),
            check=False,
            capture_output=True,
            text=True,
            env=env,
            cwd=workdir,
            timeout=1200,
        )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("BENCH ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{python} {target} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("BENCH ") :])
    return (
        result["steps"] / result["seconds"],
        result["steady"],
        result["steps"],
        result["setup_seconds"],
        result["end_seconds"],
        result["setup_cpu_seconds"],
        result["full_gc_seconds"],
    )


def run(table, opts, report):
    other = getattr(opts, "tf216_python", None) or os.environ.get(VAR)
    if not other:
        table.notes.append(
            f"tf216: skipped: name a Python with TensorFlow >= 2.16 and tf-keras (--tf216-python "
            f"PATH or {VAR}=PATH) to compare tpushim there with stock 2.15 here"
        )
        return
    stock = getattr(opts, "tf215_python", None) or sys.executable
    probes = {"stock": _probe(stock), "tpushim": _probe(other)}
    problem = None
    if (
        probes["stock"] is None
        or not probes["stock"][1]
        or _major_minor(probes["stock"][0])
        > (
            2,
            15,
        )
    ):
        problem = f"{stock} has no TensorFlow <= 2.15 with tensorflow_estimator ({probes['stock']})"
    elif probes["tpushim"] is None or _major_minor(probes["tpushim"][0]) < (2, 16):
        problem = f"{other} has no TensorFlow >= 2.16 ({probes['tpushim']})"
    if problem:
        table.notes.append(f"tf216: skipped: {problem}")
        return
    reps = benchlib.rounds(opts, full=5, quick=1)
    tf_new = probes["tpushim"][0]
    contenders = [
        ("stock 2.15", (stock, False)),
        ("stock 2.15 again", (stock, False)),
        (f"tpushim on {tf_new}", (other, True)),
    ]
    report["tf216"] = {}
    for case, target in CASES:
        if opts.quick and target != "demo":
            continue
        runs = benchlib.interleaved(
            contenders, reps, lambda arg, target=target: _run(arg[0], target, arg[1])
        )
        rates = {name: [r[0] for r in values] for name, values in runs.items()}
        steady = {name: [r[1] for r in values] for name, values in runs.items()}
        setup = {name: [r[3] for r in values] for name, values in runs.items()}
        end = {name: [r[4] for r in values] for name, values in runs.items()}
        setup_cpu = {name: [r[5] for r in values] for name, values in runs.items()}
        full_gc = {name: [r[6] for r in values] for name, values in runs.items()}
        report["tf216"][case] = runs
        paired = benchlib.Paired(rates, "stock 2.15")
        paired_steady = benchlib.Paired(steady, "stock 2.15")
        paired_setup = benchlib.Paired(setup, "stock 2.15")
        paired_end = benchlib.Paired(end, "stock 2.15")
        paired_setup_cpu = benchlib.Paired(setup_cpu, "stock 2.15")
        noise = paired.ratios("stock 2.15 again")
        noise = (min(noise), max(noise)) if noise else None
        for name, _ in contenders:
            ratio = paired.ratio(name)
            steps = runs[name][0][2]
            table.add(
                "tf216",
                f"{case}: train() steps/s ({steps} steps)",
                name,
                f"{benchlib.median(rates[name]):.1f}",
                f"{ratio:.3f}x" if name != "stock 2.15" else "",
                goal=f">= {GOAL}x" if name.startswith("tpushim") else "",
                ok=(ratio >= GOAL) if name.startswith("tpushim") else None,
                spread=paired.spread(name),
                noise=noise,
            )
            table.add(
                "tf216",
                f"{case}: steady steps/s",
                name,
                f"{benchlib.median(steady[name]):.1f}",
                f"{paired_steady.ratio(name):.3f}x" if name != "stock 2.15" else "",
                spread=paired_steady.spread(name),
            )
            for what, values, paired_what in (
                ("setup s (to the first step)", setup, paired_setup),
                ("end s (after the last step)", end, paired_end),
            ):
                table.add(
                    "tf216",
                    f"{case}: {what}",
                    name,
                    f"{benchlib.median(values[name]):.2f}",
                    f"{paired_what.ratio(name):.3f}x" if name != "stock 2.15" else "",
                    spread=paired_what.spread(name),
                )
            table.add(
                "tf216",
                f"{case}: setup CPU s (main thread)",
                name,
                f"{benchlib.median(setup_cpu[name]):.2f}",
                f"{paired_setup_cpu.ratio(name):.3f}x" if name != "stock 2.15" else "",
                spread=paired_setup_cpu.spread(name),
            )
            table.add(
                "tf216",
                f"{case}: full GC s in train()",
                name,
                f"{benchlib.median(full_gc[name]):.2f}",
                spread=f"in {sum(1 for v in full_gc[name] if v > 0)}/{len(full_gc[name])} rounds",
            )
    table.notes.append(
        f"tf216: {reps} round(s) per case, each contender a fresh process per round, order "
        f"rotating; medians of the per-round ratios. stock: {stock} (TensorFlow "
        f"{probes['stock'][0]}); tpushim: {other} (TensorFlow {tf_new})."
    )


# -- the driver: one run of one target, in its own process ---------------------------------------


def _drive(target, workdir, patch):
    import gc
    import time

    if patch:
        import tpushim

        tpushim.patch()  # before TensorFlow, as README's one line
    tf = benchlib.tf()
    if patch:
        from tpushim._estimator_api import _estimator as estimator_module
    else:
        from tensorflow_estimator.python.estimator import estimator as estimator_module
    cls = estimator_module.Estimator
    original = cls.train
    record = {
        "seconds": 0.0,
        "steps": 0,
        "steady_steps": 0,
        "steady_seconds": 0.0,
        "setup_seconds": 0.0,  # train() called -> first step done (graph, session, restore)
        "end_seconds": 0.0,  # last step done -> train() returned (final checkpoint)
        # The set-up's CPU time on the calling thread (graph building is Python there): steadier
        # than wall time on shared cores, where other processes take the CPU.
        "setup_cpu_seconds": 0.0,
        "full_gc_seconds": 0.0,  # CPython's full (generation 2) collections inside train()
    }
    in_train, gc_started = [False], [None]

    def full_gc(phase, info):
        if info["generation"] == 2 and in_train[0]:
            if phase == "start":
                gc_started[0] = time.perf_counter()
            elif gc_started[0] is not None:
                record["full_gc_seconds"] += time.perf_counter() - gc_started[0]

    gc.callbacks.append(full_gc)

    class Clock(tf.compat.v1.train.SessionRunHook):
        def __init__(self):
            self.steps, self.first_done, self.last = 0, None, None

        def after_run(self, run_context, run_values):
            self.steps += 1
            self.last = time.perf_counter()
            if self.first_done is None:
                self.first_done, self.first_cpu = self.last, time.thread_time()

    def train(self, input_fn, hooks=None, *args, **kwargs):
        clock, start, start_cpu = Clock(), time.perf_counter(), time.thread_time()
        in_train[0] = True
        try:
            result = original(self, input_fn, [*(hooks or ()), clock], *args, **kwargs)
        finally:
            in_train[0] = False
        end = time.perf_counter()
        record["seconds"] += end - start
        if clock.steps:
            record["setup_seconds"] += clock.first_done - start
            record["setup_cpu_seconds"] += clock.first_cpu - start_cpu
            record["end_seconds"] += end - clock.last
        record["steps"] += clock.steps
        if clock.steps > 1:
            record["steady_steps"] += clock.steps - 1
            record["steady_seconds"] += clock.last - clock.first_done
        return result

    cls.train = train
    if target == "demo":
        from tpushim.demo import legacy_mlp

        legacy_mlp.train_and_evaluate(os.path.join(workdir, "model"))
    else:
        import runpy

        script = os.path.join(benchlib.REPO, target)
        sys.argv = [script, workdir]
        sys.path.insert(0, os.path.dirname(script))
        runpy.run_path(script, run_name="__main__")
    steady = record["steady_steps"] / record["steady_seconds"] if record["steady_seconds"] else 0.0
    print("BENCH " + json.dumps(dict(record, steady=steady)), flush=True)


if __name__ == "__main__":
    _drive(sys.argv[1], sys.argv[2], "--patch" in sys.argv[3:])
