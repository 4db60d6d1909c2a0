"""What tpushim wrote on TensorFlow >= 2.16 is read by stock TensorFlow 2.15 with stock's numbers.

The other direction of tests/estimator_api/test_estimator_api_scripts.py: tests/scripts/record_reference.py --engine
(run on TensorFlow 2.21 under tpushim) kept the demo's model after 100 steps
(tests/reference/tf221_demo_model) and a SavedModel exported from it (tf221_saved_model, its
predictions in tf221.json). Here, on stock TensorFlow 2.15 (no tpushim patch): the model_dir
resumes and ends where stock 2.15's own two-phase run ended (tf215.json, "demo resumed"), and the
SavedModel loads and predicts what it predicted on 2.21. Runs only on TensorFlow 2.15: the release
stock's numbers were recorded on.
"""

import json
import os
import runpy
import shutil

import numpy as np
import procs
import pytest

from tpushim import _versions

_TF = _versions.installed()["tensorflow"] or ""
pytestmark = pytest.mark.skipif(
    not _TF.startswith("2.15."),
    reason=f"stock TensorFlow 2.15 reads what tpushim wrote on 2.21 (installed: {_TF or 'none'})",
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(ROOT, "tests", "reference")


def _load(name):
    with open(os.path.join(REFERENCE, name), encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.slow
def test_a_model_dir_tpushim_wrote_on_2_21_resumes_under_stock_2_15(tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(os.path.join(REFERENCE, "tf221_demo_model"), model_dir)
    code = runpy.run_path(os.path.join(ROOT, "tests", "scripts", "record_reference.py"))["RESUME"]
    proc = procs.python(["2", model_dir], code=code, env={"PYTHONPATH": ROOT}, cwd=model_dir)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    assert "tpushim" not in proc.stderr  # stock: nothing patched
    got = json.loads(lines[-1][len("RESULT ") :])
    want = _load("tf215.json")["results"]["demo resumed"]
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_a_saved_model_tpushim_exported_on_2_21_loads_on_stock_2_15():
    import tensorflow as tf

    from tpushim.demo import legacy_mlp

    x_eval, _ = legacy_mlp.make_data(200, seed=2)
    serve = tf.saved_model.load(os.path.join(REFERENCE, "tf221_saved_model"))
    p = serve.signatures["serving_default"](x=tf.constant(x_eval))["probabilities"].numpy()
    want = _load("tf221.json")["saved_model"]
    np.testing.assert_allclose(p[0], want["first"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(p[-1], want["last"], rtol=1e-5, atol=1e-7)
    assert float(p[:, 0].sum()) == pytest.approx(want["class0"], rel=1e-5)
