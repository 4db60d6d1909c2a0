"""One table of the platforms (tpushim/_platforms.py): platforms.md's table and README's are
generated from it; the platform is told from the environment alone (variables and device files,
faked here); ``tpushim info`` names it, and the refusal of a TPU this TensorFlow cannot drive
names the install that platform needs."""

import os
import re
import subprocess
import sys

import pytest

import tpushim
from tpushim import _console, _detect, _platforms

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def generated_block(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    found = re.search(
        r"<!-- generated from tpushim/_platforms\.py.*?-->\n\n(.*?)\n\n"
        r"<!-- end of generated table -->",
        text,
        flags=re.S,
    )
    assert found, f"{path} has no generated table"
    return found.group(1)


def test_platforms_page_and_readme_show_the_generated_tables():
    # After a change to the table, paste `python -m tpushim._platforms` (`--readme`) there.
    assert generated_block("docs/how-to/platforms.md") == _platforms.markdown_table()
    assert generated_block("README.md") == _platforms.readme_table()
    # One row per platform in both, in the same order, with the same install lines.
    page_rows = _platforms.markdown_table().splitlines()[2:]
    readme_rows = _platforms.readme_table().splitlines()[2:]
    assert len(page_rows) == len(readme_rows) == len(_platforms.PLATFORMS) == 9
    for platform, page_row, readme_row in zip(_platforms.PLATFORMS, page_rows, readme_rows):
        assert f"| {platform.install} | {platform.engine} |" in page_row
        assert f"| {platform.install} | {platform.engine} |" in readme_row
    for flag, table in (("--readme", _platforms.readme_table()), ("", _platforms.markdown_table())):
        printed = subprocess.run(
            [sys.executable, "-m", "tpushim._platforms", *([flag] if flag else [])],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, PYTHONPATH=ROOT),
        ).stdout
        assert printed.rstrip("\n") == table


def test_no_other_page_restates_a_platforms_tpu_install():
    # The install lines only platforms.md (and README's table) give: the TPU build, Kaggle's, and
    # tpushim's own (other pages link to platforms.md for it).
    lines = (
        '"tensorflow-tpu==',
        '--no-deps "tf-keras~=',
        "tpushim @ git+",
        'pip install ".[tensorflow]"',
    )
    for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".md") or path.endswith(os.path.join("how-to", "platforms.md")):
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for line in lines:
                assert line not in text, (path, line)


def tpu_devices(tmp_path, *names):
    """A folder of fake TPU device files, and the globs that find them (as _tpus has them)."""
    (tmp_path / "vfio").mkdir()
    for name in names:
        (tmp_path / name).write_text("")
    return (str(tmp_path / "accel*"), str(tmp_path / "vfio" / "[0-9]*"))


@pytest.mark.parametrize(
    "environ,devices,key,generation,evidence",
    [
        ({}, (), "laptop-py312", None, []),
        (
            {"COLAB_RELEASE_TAG": "release-colab_20251201-060000_RC00"},
            (),
            "colab",
            None,
            ["COLAB_RELEASE_TAG"],
        ),
        (
            {"COLAB_RELEASE_TAG": "x"},
            ("vfio/0",),
            "colab-tpu",
            "v5e, v5p or v6e",
            ["COLAB_RELEASE_TAG", "vfio/0"],
        ),
        (
            {"COLAB_RELEASE_TAG": "x", "TPU_ACCELERATOR_TYPE": "v5litepod-1"},
            (),
            "colab-tpu",
            "v5e",
            ["COLAB_RELEASE_TAG", "TPU_ACCELERATOR_TYPE=v5litepod-1"],
        ),
        (
            {"COLAB_RELEASE_TAG": "x", "COLAB_TPU_ADDR": "10.0.0.2:8470"},
            (),
            "tpu-node",
            None,
            ["COLAB_RELEASE_TAG", "COLAB_TPU_ADDR"],
        ),
        (
            {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "KAGGLE_URL_BASE": "https://www.kaggle.com"},
            (),
            "kaggle",
            None,
            ["KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE"],
        ),
        (
            {"KAGGLE_KERNEL_RUN_TYPE": "Batch"},
            ("vfio/0", "vfio/1"),
            "kaggle-tpu",
            "v5e, v5p or v6e",
            ["KAGGLE_KERNEL_RUN_TYPE", "vfio/0"],
        ),
        (  # Kaggle's TPU image sets ISTPUVM=1; a TPU without device files seen is still told
            {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "ISTPUVM": "1"},
            (),
            "kaggle-tpu",
            None,
            ["KAGGLE_KERNEL_RUN_TYPE", "ISTPUVM"],
        ),
        ({"ISTPUVM": "1"}, (), "laptop-py312", None, []),  # Kaggle's variable, outside Kaggle
        ({}, ("accel0", "accel1"), "tpu-vm", "v2, v3 or v4", ["accel0"]),
        (
            {"TPU_ACCELERATOR_TYPE": "v4-8"},
            ("accel0",),
            "tpu-vm",
            "v4",
            ["TPU_ACCELERATOR_TYPE=v4-8"],
        ),
        ({}, ("vfio/0",), "tpu-vm-pjrt", "v5e, v5p or v6e", ["vfio/0"]),
        (
            {"TPU_ACCELERATOR_TYPE": "v6e-8"},
            (),
            "tpu-vm-pjrt",
            "v6e",
            ["TPU_ACCELERATOR_TYPE=v6e-8"],
        ),
    ],
)
def test_the_platform_is_told_from_the_environment(
    tmp_path, environ, devices, key, generation, evidence
):
    globs = tpu_devices(tmp_path, *devices)
    here = _platforms.detect(environ, globs, python=(3, 12))
    assert here.key == key
    assert here.as_dict()["tpu_generation"] == generation
    told = [e.replace(str(tmp_path) + os.sep, "") for e in here.evidence]
    assert told == evidence
    assert here.platform is _platforms.BY_KEY[key]


def test_a_laptop_is_told_by_its_python():
    assert _platforms.detect({}, (), python=(3, 11)).key == "laptop"
    assert _platforms.detect({}, (), python=(3, 13)).key == "laptop-py312"
    assert _platforms.detect({}, ()).key == (
        "laptop" if sys.version_info < (3, 12) else "laptop-py312"
    )


def test_info_names_the_platform(monkeypatch, tmp_path):
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    monkeypatch.setattr(_detect, "DEVICE_GLOBS", tpu_devices(tmp_path, "vfio/0"))
    status = tpushim.status()
    assert status["platform"]["key"] == "kaggle-tpu"
    assert status["platform"]["tpu_generation"] == "v5e, v5p or v6e"
    lines = _console.format_status(status).splitlines()
    platform_line = next(line for line in lines if line.startswith("platform:"))
    assert platform_line == (
        f"platform:    Kaggle's TPU (a v5e-8, `tensorflow-cpu` and JAX) "
        f"(from KAGGLE_KERNEL_RUN_TYPE, {tmp_path / 'vfio' / '0'})"
    )


def no_kernel(op):
    return False  # pip's tensorflow: the op defined, no kernel for it


def test_the_refusal_on_kaggles_tpu_says_no_tensorflow_trains_there(monkeypatch, tmp_path):
    monkeypatch.setattr(_detect, "DEVICE_GLOBS", tpu_devices(tmp_path, "vfio/0"))
    environ = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}
    with pytest.raises(tpushim.NoTPUError) as raised:
        _detect.check_tpu_support("TPUSHIM_TPU", environ, "2.20.0", no_kernel)
    message = str(raised.value)
    assert "On Kaggle's TPU (a v5e-8) no TensorFlow trains on the TPU" in message
    assert "tensorflow-tpu" not in message and "TPUSHIM_MODE=cpu" in message


@pytest.mark.parametrize(
    "version,install",
    [
        ("2.15.1", 'pip install "tensorflow==2.20.*" "tensorflow-tpu==2.20.*" "tf-keras~=2.20.0"'),
        ("2.19.0", 'pip install "tensorflow-tpu==2.19.*"'),  # the release's own TPU build
        ("2.21.0", "tensorflow-tpu stops at 2.20"),
    ],
)
def test_the_refusal_on_colabs_tpu_names_the_install_that_works_there(
    monkeypatch, tmp_path, version, install
):
    monkeypatch.setattr(_detect, "DEVICE_GLOBS", tpu_devices(tmp_path, "vfio/0"))
    environ = {"COLAB_RELEASE_TAG": "x"}
    with pytest.raises(tpushim.NoTPUError, match=re.escape(install)) as raised:
        _detect.check_tpu_support("TPU VM (/dev/vfio/0)", environ, version, no_kernel)
    assert "--version=tpu-vm-tf" not in str(raised.value)  # no Cloud TPU VM image on Colab
    # Not on Colab: 2.15's answer is the Cloud TPU VM image, as before.
    with pytest.raises(tpushim.NoTPUError, match=re.escape("--version=tpu-vm-tf-2.15.1-se")):
        _detect.check_tpu_support("TPUSHIM_TPU", {}, "2.15.1", no_kernel)
