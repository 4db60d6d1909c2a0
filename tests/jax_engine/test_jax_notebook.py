"""notebooks/colab_tpu_jax.ipynb (a legacy script on Colab's TPU runtime with the JAX engine) runs
top to bottom here, where no TPU is: the JAX engine in cpu mode on 8 CPU devices, and the
script's numbers are stock TensorFlow 2.15's recorded ones within 1e-5. Its script cell is the
suite's legacy script unchanged but for the one added line."""

import math
import os
import pathlib
import re

from jax_scripts import JAX_TESTS, REFERENCE, ROOT, SCRIPTS, scripts_started  # noqa: F401

pytestmark = JAX_TESTS

NOTEBOOK = pathlib.Path(ROOT) / "notebooks" / "colab_tpu_jax.ipynb"
SCRIPT = "boston_batchnorm_short_batches.py"
ADDED = "import tpushim; tpushim.patch()  # the one added line\n"
TOL = 1e-5


def _cells():
    import nbformat

    return nbformat.read(NOTEBOOK, as_version=4)


def test_the_script_is_the_legacy_script_unchanged_but_for_one_line():
    notebook = _cells()
    with open(os.path.join(SCRIPTS, SCRIPT), encoding="utf-8") as f:
        script = f.read()
    cells = [
        c.source.rstrip("\n")
        for c in notebook.cells
        if c.source.startswith("%%writefile legacy_boston")
    ]
    assert cells == ["%%writefile legacy_boston.py\n" + ADDED + script.rstrip("\n")]
    assert "**This notebook has not run on a TPU.**" in notebook.cells[0].source


def test_runs_on_eight_cpu_devices_with_stocks_numbers(tmp_path, monkeypatch):
    from nbclient import NotebookClient

    for var in [v for v in os.environ if v.startswith("TPUSHIM_")] + ["XLA_FLAGS"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the script's work folder lands in tmp_path
    notebook = _cells()
    NotebookClient(
        notebook,
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    out = ""
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error", f"{output.ename}: {output.evalue}"
            out += output.get("text", "") if output.output_type == "stream" else ""
    assert re.search(r"^ready: Python 3\.1[23], TensorFlow 2\.\d+\.\d+, tf-keras ", out, re.M), out
    assert "engine: jax, cpu mode on 8 CPU devices (no TPU here)" in out
    assert "model_to_estimator -> the JAX engine" in out and "over 8 CPU device(s)" in out, out
    printed = dict(re.findall(r"^(\S+) +(-?[0-9.e+-]+)$", out, re.M))
    want = REFERENCE[SCRIPT]
    assert set(printed) == set(want), (sorted(printed), sorted(want))
    for name, value in want.items():
        assert math.isclose(float(printed[name]), value, rel_tol=TOL, abs_tol=1e-6), name
    assert (tmp_path / "legacy_boston.py").exists()  # written where the test put the notebook
