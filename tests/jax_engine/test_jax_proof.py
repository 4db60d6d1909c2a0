"""The JAX engine's proof matrix through the estimator (tests/jax_proof.py): a legacy script's
``model_to_estimator`` under ``mode="cpu", engine="jax"`` trains, evaluates and predicts on 8 XLA
CPU devices and on 1 with stock TensorFlow 2.15's recorded numbers within 1e-5 (every
checkpoint value -- weights, moving statistics, optimizer slots --, every eval metric, every
prediction), for each loss kind, optimizer family and input style the engine trains, on a short
last batch padded to the global batch; negative controls (gradients of each device's own mean
summed over the devices; padding rows counted in the loss and BatchNormalization's statistics)
must not give stock's numbers.

Each device count is a process of its own (JAX fixes it at its first import); the 8 devices'
cases are split over two processes, and all three start at once. The step alone against tf-keras, and each optimizer's update against TensorFlow's, are
test_jax_step.py's and test_jax_optimizers.py's; this module proves the estimator around them.
"""

import json
import os
import subprocess
import sys

import numpy as np
import procs
import pytest
from jax_scripts import JAX_TESTS, ROOT, scripts_started  # noqa: F401

pytestmark = JAX_TESTS

TOL = 1e-5
HELPER = os.path.join(ROOT, "tests", "jax_proof.py")
RECORD = os.path.join(ROOT, "tests", "reference", "jax_proof_tf215.json")
with open(RECORD, encoding="utf-8") as _f:
    STOCK = json.load(_f)
CASES = sorted(k for k in STOCK if k != "tensorflow")
#: The cases also run on 1 device: one per axis of the matrix (8 devices run every case; 1
#: device is the same program without the sharding, so one line of each kind shows it).
ONE_DEVICE = ("base", "loss-binary_crossentropy", "optimizer-tf1_adam", "input-pandas_input_fn")
TIMEOUT = 600  # seconds on a quiet machine, stretched by the load (procs.scaled)
#: The step's negative controls run on the base case (each compared with stock below); the
#: step's others are test_jax_losses.py's (``mean_device_losses``: a SUM reduction's).
CONTROLS = ("sum_device_means", "count_padding")


def _processes():
    """(devices, arguments) of each helper process, started at once: the 8-device cases in two
    halves (the controls with the first), so that 2 cores share the work evenly."""
    optimizers = [c for c in CASES if c.startswith("optimizer-")]
    others = [c for c in CASES if c not in optimizers]
    controls = "--controls=" + ",".join(CONTROLS)
    return [(8, [controls, *others]), (8, optimizers), (1, list(ONE_DEVICE))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """devices -> the helpers' RESULTs merged: 8 devices (every case, the controls), 1 device
    (ONE_DEVICE)."""
    started = []
    for i, (devices, arguments) in enumerate(_processes()):
        root = tmp_path_factory.mktemp(f"devices{devices}-{i}")
        env = procs.env_without_tpu(
            PYTHONPATH=ROOT,
            XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        )
        process = subprocess.Popen(
            [sys.executable, HELPER, str(root), *arguments],
            env=env,
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append((devices, process))
    out = {}
    try:
        for devices, process in started:
            stdout, stderr = process.communicate(timeout=procs.scaled(TIMEOUT))
            lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
            assert process.returncode == 0 and lines, stderr[-4000:]
            got = json.loads(lines[-1][len("RESULT ") :])
            merged = out.setdefault(devices, {"controls": {}})
            merged["controls"].update(got.pop("controls"))
            merged.update(got)
    finally:
        for _, process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    return out


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


def differences(got, want):
    """{what: largest relative difference} of a run against stock's: every checkpoint value,
    every metric and the predictions; names missing on either side as infinities."""
    assert "error" not in got, got["error"]
    out = {}
    for kind in ("values", "metrics"):
        for name in set(got[kind]) | set(want[kind]):
            if name not in got[kind] or name not in want[kind]:
                out[f"{kind}: {name}"] = float("inf")
            else:
                out[f"{kind}: {name}"] = _rel(got[kind][name], want[kind][name])
    out["predictions"] = _rel(got["predictions"], want["predictions"])
    return out


def test_stock_is_stock_tensorflow_2_15_and_every_case_is_recorded():
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    try:
        import jax_proof  # its tables (importing TensorFlow, no JAX)
    finally:
        sys.path.pop(0)
    assert STOCK["tensorflow"].startswith("2.15.")
    assert sorted(jax_proof.CASES) == CASES  # a new line needs its recording
    axes = (
        {c.loss for c in jax_proof.CASES.values()},
        {c.optimizer for c in jax_proof.CASES.values()},
    )
    assert axes == (set(jax_proof.LOSSES), set(jax_proof.OPTIMIZERS))
    assert {c.style for c in jax_proof.CASES.values()} == set(jax_proof.STYLES)
    assert set(ONE_DEVICE) <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_eight_devices_equal_stock_2_15(runs, case):
    assert runs[8]["devices"] == 8
    got, want = runs[8][case], STOCK[case]
    worst = differences(got, want)
    assert max(worst.values()) < TOL, {k: v for k, v in worst.items() if v >= TOL}
    assert len(got["predictions"]) == len(want["predictions"]) > 0
    assert got["metrics"]["global_step"] == want["metrics"]["global_step"] > 0


@pytest.mark.parametrize("case", ONE_DEVICE)
def test_one_device_equals_eight_and_stock_2_15(runs, case):
    assert runs[1]["devices"] == 1
    worst = differences(runs[1][case], STOCK[case])
    assert max(worst.values()) < TOL, {k: v for k, v in worst.items() if v >= TOL}
    between = differences(runs[1][case], runs[8][case])
    assert max(between.values()) < TOL, {k: v for k, v in between.items() if v >= TOL}


@pytest.mark.parametrize("control", CONTROLS)
def test_negative_controls_do_not_give_stocks_numbers(runs, control):
    # The base case with the step's control in place: the same comparison must fail.
    assert sorted(runs[8]["controls"]) == sorted(CONTROLS)
    worst = differences(runs[8]["controls"][control], STOCK["base"])
    assert max(v for k, v in worst.items() if k.startswith("values")) > 1e-3, worst
    assert worst["predictions"] > 1e-3
