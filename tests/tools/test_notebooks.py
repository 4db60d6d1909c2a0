"""The notebooks run top to bottom on CPU (as CI runs them), and are committed without outputs."""

import pathlib
import re

import docquotes
import nbformat
import pytest
import tfcases
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # trains estimators or runs scripts: outside the fast tier

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "notebooks"


def execute(name, tmp_path, monkeypatch, env=None):
    for var in ("TPUSHIM_MODE", "TPUSHIM_TPU", "TPUSHIM_BATCH_SIZE", "TPUSHIM_AUTOPATCH"):
        monkeypatch.delenv(var, raising=False)
    for var, value in (env or {}).items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # model dirs and exports land in tmp_path
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(
        notebook,
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    streams = {"stdout": "", "stderr": ""}
    images = 0
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error", f"{output.ename}: {output.evalue}"
            if output.output_type == "stream":
                streams[output.name] += output.text
            images += "image/png" in output.get("data", {})
    return streams["stdout"], streams["stderr"], images


def check_page_quotes(name, out, err):
    """notebooks.md's quote of this notebook's run on this Python and TensorFlow (it quotes
    Python 3.11 with TensorFlow 2.15.1, and 3.12 with 2.21.0) is what the run printed, line for
    line. Returns whether the page quotes this release."""
    ready = re.search(r"^ready: (Python \S+ TensorFlow \S+)", out, re.M).group(1)
    page = docquotes.page("docs", "how-to", "notebooks.md")
    quotes = [
        block
        for block in docquotes.blocks(page, f"`{name}`")
        if block.startswith(f"ready: {ready} ")
    ]
    if ready.endswith(("2.15.1,", "2.21.0,")):
        assert len(quotes) == 1, (ready, name)
    for quote in quotes:
        assert docquotes.unmatched(quote, out + "\n" + err) == [], out + err
    return bool(quotes)


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, path.name


@pytest.mark.parametrize("tpu", [None, "local"], ids=["no-tpu", "tpu-vm-without-tpu-support"])
@pytest.mark.tpuestimator
def test_colab_quickstart_on_cpu(tmp_path, monkeypatch, tpu):
    # With TPUSHIM_TPU=local: a TPU VM runtime as a TensorFlow without TPU support sees it (a TPU
    # configured, no TPU device), as on a Colab TPU runtime after pip installed TensorFlow 2.15.
    out, err, _ = execute(
        "colab_quickstart.ipynb", tmp_path, monkeypatch, env={"TPUSHIM_TPU": tpu} if tpu else None
    )
    assert re.search(r"^ready: Python 3\.\d+, TensorFlow 2\.1[2-5]\.\d+, tpushim ", out, re.M)
    assert "skipped:" not in out  # every cell ran
    if tpu:
        assert "TPU: local (from TPUSHIM_TPU)" in out
        assert re.search(
            r"Can TensorFlow \S+ use a TPU here\? NO: this TensorFlow build has no TPU "
            r"support for this runtime .*continuing in cpu mode",
            out,
        )
    else:
        assert "TPU: none found" in out and "tpushim mode: cpu" in out
        assert re.search(r"Can TensorFlow \S+ use a TPU here\? no TPU on this runtime", out)
    assert "model_to_estimator -> TPUEstimator(use_tpu=False" in err
    assert "estimator: TPUShimEstimator" in out
    accuracy = float(re.search(r"'accuracy': ([0-9.]+)", out).group(1))
    assert accuracy > 0.9
    assert f"exported to {tmp_path}" in out and "served predictions:" in out
    if not tpu:
        check_page_quotes("colab_quickstart.ipynb", out, err)


@pytest.mark.tpuestimator
def test_migrate_legacy_cnn_on_cpu(tmp_path, monkeypatch):
    out, err, images = execute("migrate_legacy_cnn.ipynb", tmp_path, monkeypatch)
    keras_package = (
        "keras.src" if tfcases.KERAS_VERSION >= (2, 13) else "keras"
    )  # 2.12: no keras.src
    assert (
        f"`model_to_estimator` was bound to {keras_package}.estimator.model_to_estimator_v2" in out
    )
    assert "it will still convert" in out
    assert "tpushim run will use mode: cpu" in out
    assert "preflight ok: True" in out
    assert "model_to_estimator -> stock EstimatorV2 (tpushim mode off" in err
    assert "model_to_estimator -> TPUEstimator(use_tpu=False" in err
    assert re.search(r"stock: +EstimatorV2", out) and re.search(r"tpushim: +TPUShimEstimator", out)
    difference = float(re.search(r"training-loss difference along the curve: (\S+)", out).group(1))
    assert difference <= 1e-4  # cpu mode trains as stock does
    assert images == 1  # the loss-curve plot
    assert "patched:     yes" in out  # the closing %tpushim
    check_page_quotes("migrate_legacy_cnn.ipynb", out, err)
