"""The ``tpushim`` console command (``[project.scripts]``): the installed entry point runs a script
and the three commands as ``python -m tpushim`` does, and a mistyped command suggests the right one
(a file of that name is still a script)."""

import json
import os
import shutil
import subprocess
import sys

import procs
import pytest

from tpushim import _cli, _versions

ESTIMATOR_API = _versions.uses_own_estimator()  # TensorFlow >= 2.16: tpushim's estimator API
pytestmark = pytest.mark.slow  # TensorFlow subprocesses

#: The entry point pip installed beside this interpreter (``pip install -e .`` makes it).
COMMAND = shutil.which("tpushim", path=os.path.dirname(sys.executable))

SCRIPT = """\
import numpy as np
import tensorflow as tf

x = np.random.RandomState(0).rand(16, 4).astype("float32")
y = np.random.RandomState(1).randint(0, 3, size=(16, 1))
model = tf.keras.Sequential([tf.keras.layers.Dense(3, activation="softmax", input_shape=(4,))])
model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy")
est = tf.keras.estimator.model_to_estimator(keras_model=model, model_dir="model")
est.train(lambda: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8), steps=3)
print("TRAINED")
"""


def tpushim(*args, cwd):
    assert COMMAND, "the tpushim console command is not installed: pip install -e ."
    return subprocess.run(
        [COMMAND, *args],
        cwd=cwd,
        env=procs.env_without_tpu(),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_the_console_command_runs_a_script_and_its_three_commands(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    run = tpushim("--mode", "cpu", "train.py", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "TRAINED" in run.stdout
    if ESTIMATOR_API:  # the TPU path there: the strategy engine
        assert "model_to_estimator -> the strategy engine" in run.stderr
    else:
        assert "model_to_estimator -> TPUEstimator(use_tpu=False" in run.stderr
    assert "tpushim run summary:" in run.stderr

    lines = tpushim("info", cwd=tmp_path)
    assert "(tpushim SCRIPT patches the script it runs)" in lines.stdout  # as it was called
    info = tpushim("info", "--json", cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["mode"] == "auto"

    check = tpushim("check", "train.py", cwd=tmp_path)
    assert check.returncode == 0, check.stderr[-3000:]  # on 2.16+: on tpushim's estimator API
    assert "TRAINED" in check.stdout and "tpushim check: OK" in check.stdout

    demo = tpushim("demo", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "stock" in demo.stdout and "tpushim" in demo.stdout

    usage = tpushim(cwd=tmp_path)
    assert usage.returncode == 2 and "usage: tpushim " in usage.stderr  # named as it was called


def test_a_mistyped_command_suggests_the_command_unless_it_is_a_file(tmp_path):
    typo = tpushim("demoo", cwd=tmp_path)
    assert typo.returncode == 2
    assert "did you mean `tpushim demo`?" in typo.stderr and "Traceback" not in typo.stderr
    assert "did you mean `tpushim check`?" in tpushim("chek", "x.py", cwd=tmp_path).stderr
    (tmp_path / "demoo").write_text("print('A SCRIPT NAMED demoo')\n")
    script = tpushim("demoo", cwd=tmp_path)
    assert script.returncode == 0 and "A SCRIPT NAMED demoo" in script.stdout
    far = tpushim("train.py", cwd=tmp_path)  # nothing like a command: python's own message
    assert far.returncode == 2 and "can't open file 'train.py'" in far.stderr
    assert "did you mean" not in far.stderr


def test_python_dash_m_keeps_its_name(tmp_path, capsys):
    assert _cli.main(["infoo"]) == 2
    assert "did you mean `python -m tpushim info`?" in capsys.readouterr().err
