"""The notebooks' first cell (notebooks/first_cell.py) on every kind of runtime, versions faked.

Colab today brings Python 3.12 and TensorFlow 2.19 (its TPU runtimes: no TensorFlow at all), for
which no TensorFlow with estimators exists: there the cell adds the tf-keras of TensorFlow's minor
(or installs TensorFlow 2.21 and tf-keras), and tpushim brings the estimator API. The cell's code runs here as it is, with what it reads
of the runtime faked -- the Python version, the installed distributions, whether TensorFlow was
imported, the files in the working folder -- and pip replaced by a recorder that "installs" into
those fakes. Nothing is installed.
"""

import importlib.metadata
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import nbformat
import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
SOURCE = (NOTEBOOKS / "first_cell.py").read_text(encoding="utf-8")


class Runtime:
    """What the cell can see of a runtime: Python, installed distributions, and pip."""

    def __init__(self, monkeypatch, python, installed, pip_works=True, imported_tf=False):
        self.installed = dict(installed)
        self.pip_calls = []
        self.pip_works = pip_works
        monkeypatch.setattr(sys, "version_info", (*python, 0, "final", 0))
        monkeypatch.setattr(importlib.metadata, "version", self.version)
        real_find_spec = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a: (
                (real_find_spec("json") if "tpushim" in self.installed else None)
                if name == "tpushim"
                else real_find_spec(name, *a)
            ),
        )
        monkeypatch.setattr(subprocess, "run", self.pip)
        # The cell sets it on Python 3.12+: restored after the test (monkeypatch keeps the value).
        monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
        if imported_tf:
            monkeypatch.setitem(sys.modules, "tensorflow", object())
        else:
            monkeypatch.delitem(sys.modules, "tensorflow", raising=False)

    def version(self, dist):
        if dist not in self.installed:
            raise importlib.metadata.PackageNotFoundError(dist)
        return self.installed[dist]

    def pip(self, command, **kwargs):
        assert command[1:4] == ["-m", "pip", "install"], command
        requirements = command[5:]
        self.pip_calls.append(requirements)
        if self.pip_works:
            for requirement in requirements:
                if requirement.startswith(("tensorflow==", "tensorflow-tpu==")):  # one release
                    name, version = requirement.split("==")
                    self.installed[name] = version.replace("*", "0")
                elif requirement.startswith("tensorflow>=2.16"):
                    self.installed.pop("tensorflow-tpu", None)
                    self.installed["tensorflow"] = "2.21.0"
                elif requirement.startswith("tensorflow"):
                    self.installed.pop("tensorflow-tpu", None)
                    self.installed["tensorflow"] = "2.15.1"
                elif requirement.startswith("tf-keras"):  # the one of TensorFlow's minor
                    tf_version = (
                        self.installed.get("tensorflow") or self.installed["tensorflow-cpu"]
                    )
                    minor = ".".join(tf_version.split(".")[:2])
                    self.installed["tf-keras"] = minor + ".0"
                elif "tpushim" in requirement:
                    self.installed["tpushim"] = "0.1.0"
        return subprocess.CompletedProcess(command, 0 if self.pip_works else 1)


def run_cell(capsys):
    namespace = {"__name__": "__main__"}
    exec(compile(SOURCE, "first_cell.py", "exec"), namespace)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1  # one line: what this runtime can do, or what to do
    return namespace["READY"], out[0]


TF_INSTALL = ["tensorflow>=2.12,<2.16", "numpy<2"]


ESTIMATOR_API_INSTALL = ["tensorflow>=2.16,<2.22", "tf-keras>=2.16,<2.22"]
#: What the cell says of TensorFlow >= 2.16 (Python 3.12/3.13): what runs, what does not yet.
ON_ESTIMATOR_API = (
    ". On TensorFlow >= 2.16 tpushim brings the estimator API itself and runs the legacy script "
    "on CPU/GPU with stock 2.15's numbers; its TPU path there is the strategy engine "
    "(TPUStrategy), proven on emulated replicas and not yet run on a real TPU. TPUEstimator's "
    "path (a TPU v2, v3 or v4): On Google Cloud: a TPU VM created from a TensorFlow 2.15 image "
    "(gcloud compute tpus tpu-vm create ... --version tpu-vm-tf-2.15.1-se; TPU v2, v3 or v4)."
)


@pytest.mark.parametrize("python", [(3, 12), (3, 13)])
def test_colab_cpu_or_gpu_python_3_12_keeps_its_tensorflow_and_adds_its_tf_keras(
    monkeypatch, capsys, python
):
    runtime = Runtime(monkeypatch, python, {"tensorflow": "2.19.0", "tpushim": "0.1.0"})
    ready, line = run_cell(capsys)
    assert ready and runtime.pip_calls == [["tf-keras~=2.19.0"]]
    assert line == (
        f"ready: Python {python[0]}.{python[1]}, TensorFlow 2.19.0, tf-keras 2.19.0, tpushim "
        f"0.1.0: this runtime runs the notebook (installed tf-keras 2.19.0)" + ON_ESTIMATOR_API
    )


def test_colab_tpu_runtime_python_3_12_without_tensorflow_gets_2_21_and_tf_keras(
    monkeypatch, capsys, tmp_path
):
    monkeypatch.chdir(tmp_path)
    runtime = Runtime(monkeypatch, (3, 12), {})
    ready, line = run_cell(capsys)
    assert ready and runtime.pip_calls == [ESTIMATOR_API_INSTALL, [REPOSITORY]]
    assert line.startswith("ready: Python 3.12, TensorFlow 2.21.0, tf-keras 2.21.0, tpushim 0.1.0")
    assert "(installed TensorFlow 2.21.0 and tf-keras 2.21.0 in place of none; installed " in line
    assert line.endswith(ON_ESTIMATOR_API)


def test_python_3_12_with_tensorflow_2_15_too_old_there_is_replaced(monkeypatch, capsys):
    runtime = Runtime(monkeypatch, (3, 12), {"tensorflow": "2.14.0", "tpushim": "0.1.0"})
    ready, line = run_cell(capsys)
    assert ready and runtime.pip_calls == [ESTIMATOR_API_INSTALL]
    assert "(installed TensorFlow 2.21.0 and tf-keras 2.21.0 in place of TensorFlow 2.14.0)" in line


def test_python_3_12_ready_installs_nothing(monkeypatch, capsys):
    installed = {"tensorflow": "2.21.0", "tf-keras": "2.21.0", "tpushim": "0.1.0"}
    runtime = Runtime(monkeypatch, (3, 12), installed)
    ready, line = run_cell(capsys)
    assert ready and runtime.pip_calls == []
    # tf.keras is Keras 2 in the whole session, also in a cell that uses it before tpushim.
    assert os.environ["TF_USE_LEGACY_KERAS"] == "1"
    assert line == (
        "ready: Python 3.12, TensorFlow 2.21.0, tf-keras 2.21.0, tpushim 0.1.0: this runtime runs "
        "the notebook" + ON_ESTIMATOR_API
    )


def test_python_3_14_names_the_runtime_to_choose(monkeypatch, capsys):
    runtime = Runtime(monkeypatch, (3, 14), {"tensorflow": "2.21.0"})
    ready, line = run_cell(capsys)
    assert not ready and runtime.pip_calls == []  # no pip run that cannot succeed
    assert line.startswith("cannot run here: Python 3.14 here: TensorFlow has no wheel tpushim")
    # Colab's menu and Google Cloud's steps, each in a sentence of its own.
    colab, cloud = line.split(" On Colab: ")[1].split(" On Google Cloud: ")
    assert colab == "Runtime > Change runtime type > Runtime version: one with Python 3.11."
    assert cloud.startswith("a TPU VM created from a TensorFlow 2.15 image (gcloud compute tpus")
    assert "--version tpu-vm-tf-2.15.1-se; TPU v2, v3 or v4" in cloud
    assert "Runtime" not in cloud and "gcloud" not in colab


def test_python_3_12_tensorflow_2_15_already_imported_asks_for_a_restart(monkeypatch, capsys):
    with monkeypatch.context() as patch:  # undone before conftest's teardown reads tensorflow
        runtime = Runtime(patch, (3, 12), {"tensorflow": "2.15.0"}, imported_tf=True)
        ready, line = run_cell(capsys)
    assert not ready and runtime.pip_calls == []
    assert "TensorFlow 2.15.0 (tpushim supports 2.16-2.21 on this Python) is already imported" in (
        line
    )


def test_tensorflow_2_19_on_python_3_11_is_replaced_by_2_15(monkeypatch, capsys):
    runtime = Runtime(monkeypatch, (3, 11), {"tensorflow": "2.19.0", "tpushim": "0.1.0"})
    ready, line = run_cell(capsys)
    assert ready and runtime.pip_calls == [TF_INSTALL]
    assert line.startswith("ready: Python 3.11, TensorFlow 2.15.1, tpushim 0.1.0: this runtime")
    assert "(installed TensorFlow 2.15.1 in place of 2.19.0)" in line


def test_tensorflow_2_19_already_imported_asks_for_a_restart(monkeypatch, capsys):
    with monkeypatch.context() as patch:  # undone before conftest's teardown reads tensorflow
        runtime = Runtime(patch, (3, 11), {"tensorflow": "2.19.0"}, imported_tf=True)
        ready, line = run_cell(capsys)
    assert not ready and runtime.pip_calls == []
    assert (
        "already imported in this session: on Colab: Runtime > Restart session, then Run all"
        in (line)
    )


def test_pip_failing_says_so(monkeypatch, capsys):
    runtime = Runtime(monkeypatch, (3, 10), {"tensorflow": "2.19.0"}, pip_works=False)
    ready, line = run_cell(capsys)
    assert not ready and runtime.pip_calls == [TF_INSTALL]
    assert line.startswith("cannot run here: pip could not install tensorflow>=2.12,<2.16 numpy<2")


REPOSITORY = "tpushim @ git+https://github.com/tpushim/tpushim"


def test_no_tpushim_is_installed_from_the_repository(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    runtime = Runtime(monkeypatch, (3, 11), {"tensorflow": "2.15.1"})
    ready, line = run_cell(capsys)
    assert ready and runtime.pip_calls == [[REPOSITORY]]  # no extra: TensorFlow stays as it is
    assert f"(installed tpushim from {REPOSITORY})" in line


def test_no_tpushim_and_pip_failing_says_what_to_upload(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    runtime = Runtime(monkeypatch, (3, 11), {"tensorflow": "2.15.1"}, pip_works=False)
    ready, line = run_cell(capsys)
    assert not ready and runtime.pip_calls == [[REPOSITORY]]
    assert line.startswith(f"cannot run here: pip could not install {REPOSITORY} (tpushim is not")
    assert "`python -m build --wheel` in a tpushim checkout makes dist/tpushim-*.whl" in line


@pytest.mark.parametrize("upload", ["tpushim-0.1.0-py3-none-any.whl", "tpushim/pyproject.toml"])
def test_an_uploaded_wheel_or_checkout_is_installed(monkeypatch, capsys, tmp_path, upload):
    monkeypatch.chdir(tmp_path)
    (tmp_path / upload).parent.mkdir(exist_ok=True)
    (tmp_path / upload).write_text("")
    runtime = Runtime(monkeypatch, (3, 11), {"tensorflow-cpu": "2.13.1"})
    ready, line = run_cell(capsys)
    expected = upload if upload.endswith(".whl") else "./tpushim"
    assert ready and runtime.pip_calls == [[expected]]
    assert line.startswith("ready: Python 3.11, TensorFlow 2.13.1, tpushim 0.1.0")
    assert f"(installed tpushim from {expected})" in line


def test_a_ready_runtime_installs_nothing(monkeypatch, capsys):
    runtime = Runtime(monkeypatch, (3, 11), {"tensorflow": "2.15.1", "tpushim": "0.1.0"})
    ready, line = run_cell(capsys)
    assert ready and runtime.pip_calls == []
    assert "TF_USE_LEGACY_KERAS" not in os.environ
    assert line == (
        "ready: Python 3.11, TensorFlow 2.15.1, tpushim 0.1.0: this runtime runs the notebook. "
        "The cells below say whether TensorFlow reaches a TPU here; without one they run "
        "tpushim's cpu mode, the TPU code path on the CPU."
    )


def test_in_a_notebook_the_cells_below_are_skipped_until_the_runtime_can(
    ipython_shell, monkeypatch, capsys
):
    shell = ipython_shell
    runtime = Runtime(monkeypatch, (3, 14), {"tensorflow": "2.19.0"})
    shell.run_cell(SOURCE)
    assert capsys.readouterr().out.startswith("cannot run here: Python 3.14")
    result = shell.run_cell("import tensorflow_that_is_not_here\nprint('ran')")
    assert result.success  # Run all goes on, top to bottom
    assert capsys.readouterr().out == (
        "skipped: this runtime cannot run the notebook (see the first cell)\n"
    )
    monkeypatch.setattr(sys, "version_info", (3, 11, 0, "final", 0))  # another runtime chosen
    runtime.installed = {"tensorflow": "2.15.1", "tpushim": "0.1.0"}
    shell.run_cell(SOURCE)  # the first cell itself always runs
    assert capsys.readouterr().out.startswith("ready: Python 3.11")
    shell.run_cell("print('ran')")
    assert capsys.readouterr().out == "ran\n"


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_every_notebook_opens_with_this_cell(path):
    notebook = nbformat.read(path, as_version=4)
    first = next(cell for cell in notebook.cells if cell.cell_type == "code")
    assert first.source == SOURCE.rstrip("\n"), f"run: python notebooks/sync.py ({path.name})"


def test_colab_tpu_runtime_gets_the_tpu_build_platforms_md_names(monkeypatch, capsys, tmp_path):
    """Colab's TPU runtime (COLAB_RELEASE_TAG, a TPU): the TPU build of 2.20 with its libtpu and
    tf-keras, the line platforms.md gives, not pip's TensorFlow 2.21 (no TPU support)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-tpu")
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    runtime = Runtime(monkeypatch, (3, 12), {})
    ready, line = run_cell(capsys)
    namespace = {}
    exec(compile(SOURCE.split("\nREADY, ANSWER")[0], "first_cell.py", "exec"), namespace)
    assert ready and runtime.pip_calls == [namespace["COLAB_TPU_INSTALL"], [REPOSITORY]]
    assert runtime.installed["tensorflow-tpu"] == "2.20.0"
    assert line.startswith("ready: Python 3.12, TensorFlow 2.20.0, tf-keras 2.20.0, tpushim 0.1.0")
    assert "installed TensorFlow 2.20.0, its TPU build and tf-keras 2.20.0 in place of none" in line
    assert "Python 3.11" not in line and "strategy engine (TPUStrategy)" in line


def test_kaggle_installs_tf_keras_without_its_dependencies(monkeypatch, capsys):
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    runtime = Runtime(monkeypatch, (3, 12), {"tensorflow-cpu": "2.20.0", "tpushim": "0.1.0"})
    ready, _ = run_cell(capsys)
    assert ready and runtime.pip_calls == [["--no-deps", "tf-keras~=2.20.0"]]


def test_kaggle_tpu_installs_the_jax_engines_converter_without_dependencies(monkeypatch, capsys):
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    monkeypatch.setenv("ISTPUVM", "1")
    runtime = Runtime(monkeypatch, (3, 12), {"tensorflow-cpu": "2.20.0", "tpushim": "0.1.0"})
    ready, _ = run_cell(capsys)
    assert ready and runtime.pip_calls == [["--no-deps", "tf-keras~=2.20.0", "tf2jax", "dm-tree"]]


def test_the_cells_installs_are_the_platforms_table():
    from tpushim import _platforms

    namespace = {}
    exec(compile(SOURCE.split("\nREADY, ANSWER")[0], "first_cell.py", "exec"), namespace)
    colab_tpu = _platforms.BY_KEY["colab-tpu"].install
    requirements = re.findall(r'"([^"]+)"', colab_tpu)
    assert namespace["COLAB_TPU_INSTALL"] == [*requirements, "-f", _platforms.LIBTPU_INDEX]
    assert f"-f {_platforms.LIBTPU_INDEX}`" in colab_tpu
    assert "--no-deps" in _platforms.BY_KEY["kaggle"].install
    kaggle_tpu = _platforms.BY_KEY["kaggle-tpu"].install
    assert (
        f'--no-deps "tf-keras~=2.20.0" {" ".join(namespace["KAGGLE_TPU_INSTALL"])}`' in kaggle_tpu
    )


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"COLAB_RELEASE_TAG": "release-colab"},
        {"COLAB_RELEASE_TAG": "release-colab", "TPU_ACCELERATOR_TYPE": "v5litepod-1"},
        {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"},
        {"KAGGLE_URL_BASE": "https://www.kaggle.com/"},
        {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "ISTPUVM": "1"},
        {"KAGGLE_KERNEL_RUN_TYPE": "Batch", "TPU_ACCELERATOR_TYPE": "v5litepod-8"},
        {"ISTPUVM": "1"},
    ],
)
def test_the_cell_tells_colab_and_kaggle_as_tpushim_does(monkeypatch, environ):
    """The cell cannot import tpushim before installing it, so it tells the platform itself: as
    tpushim's platforms table does (device files left out on both sides)."""
    import glob

    from tpushim import _platforms

    for var in _platforms.PLATFORM_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in environ.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    namespace = {}
    exec(compile(SOURCE.split("\nREADY, ANSWER")[0], "first_cell.py", "exec"), namespace)
    key = _platforms.detect(environ, device_globs=()).key
    assert namespace["_platform"]() == (key if key.startswith(("colab", "kaggle")) else None)
