"""The TPU generations table (tpushim/_tpus.py) is the one source of what tpushim knows about a
TPU generation: detection's device files, the default cores, the preflight's faked system and the
table of docs/reference/tpus.md read it."""

import os
import re
import subprocess
import sys

import pytest

from tpushim import _settings, _tpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def generated_block(page, name):
    """The text between a page's generated-block markers."""
    with open(os.path.join(ROOT, *page.split("/")), encoding="utf-8") as f:
        text = f.read()
    found = re.search(
        rf"<!-- generated from tpushim/{name}.*?-->\n\n(.*?)\n\n<!-- end of generated table -->",
        text,
        flags=re.S,
    )
    assert found, f"{page} has no generated table"
    return found.group(1)


def run_python(code):
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    ).stdout.strip()


def test_the_tpus_page_shows_the_generated_table():
    # After a change to the table, paste `python -m tpushim._tpus` there.
    assert generated_block("docs/reference/tpus.md", "_tpus.py") == _tpus.markdown_table()
    printed = subprocess.run(
        [sys.executable, "-m", "tpushim._tpus"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
    ).stdout
    assert printed.rstrip("\n") == _tpus.markdown_table()


def test_every_generation_in_the_table_and_its_facts():
    names = [g.name for g in _tpus.GENERATIONS]
    assert names == ["v2", "v3", "v4", "v5e", "v5p", "v6e", "TPU7x"]
    table = _tpus.markdown_table()
    for name in ("v2", "v3", "v4", "v5e", "v5p", "v6e (Trillium)", "TPU7x"):
        assert f"\n| {name} |" in table, name
    devices = {g.name: g.devices_per_host for g in _tpus.GENERATIONS if g.runtime}
    assert devices == {"v2": 8, "v3": 8, "v4": 4, "v5e": 8, "v5p": 4, "v6e": 8}
    engines = {g.name: g.engine for g in _tpus.GENERATIONS}
    assert engines == {
        "v2": "tpuestimator",
        "v3": "tpuestimator",
        "v4": "tpuestimator",
        "v5e": "strategy",
        "v5p": "strategy",
        "v6e": "strategy",
        "TPU7x": None,
    }
    assert {g.name for g in _tpus.GENERATIONS if g.pjrt_only} == {"v5e", "v5p", "v6e"}


@pytest.mark.parametrize(
    "text,name",
    [
        ("v2-8", "v2"),
        ("v3-32", "v3"),
        ("v4-16", "v4"),
        ("v5litepod-8", "v5e"),
        ("V5LITEPOD-1", "v5e"),
        ("v5p-8", "v5p"),
        ("v6e-1", "v6e"),
        ("tpu7x-8", "TPU7x"),
    ],
)
def test_an_accelerator_type_names_its_generation(text, name):
    assert _tpus.of_accelerator_type(text).name == name
    assert _tpus.by_name(name).name == name


def test_names_aliases_and_device_files():
    assert _tpus.by_name("trillium").name == "v6e"
    assert _tpus.by_name("v5litepod").name == "v5e"
    assert _tpus.by_name("v9") is None and _tpus.of_accelerator_type("gpu-8") is None
    assert [g.name for g in _tpus.of_device_file("/dev/accel0")] == ["v2", "v3", "v4"]
    assert [g.name for g in _tpus.of_device_file("/dev/vfio/3")] == ["v5e", "v5p", "v6e"]
    assert _tpus.of_device_file("/dev/vfio/vfio") == ()  # the control node is no chip


def test_the_readers_take_their_values_from_the_table():
    # The values before the table: unchanged (in a fresh process: the tests' conftest points
    # detection at no device files).
    code = "from tpushim import _detect, _tpus; print(_detect.DEVICE_GLOBS is _tpus.DEVICE_GLOBS)"
    assert run_python(code) == "True"
    assert _tpus.DEVICE_GLOBS == ("/dev/accel*", "/dev/vfio/[0-9]*")
    assert _settings.DEFAULT_CORES == _tpus.DEFAULT_CORES == 8
    assert _tpus.boards_with(8) == ("v2-8", "v3-8", "v5litepod-8", "v6e-8")
    assert _tpus.in_words(_tpus.boards_with(4)) == "v4-8 or v5p-8"


@pytest.mark.tpuestimator  # the faked system answers TPUEstimator's query (TensorFlow <= 2.15)
def test_the_faked_tpu_system_is_shaped_as_the_table_says():
    from tpushim._preflight import faketpu, graph_checks

    assert graph_checks.CORES_PER_HOST == _tpus.FAKED.devices_per_host == 8
    assert graph_checks.faked_system_shape(32) == (4, 8)
    one = faketpu.topology(1, 8)
    assert list(one.mesh_shape) == [2, 2, 1, 2]
    assert list(faketpu.topology(2, 8).mesh_shape) == [4, 2, 1, 2]
    assert list(faketpu.topology(4, 8).mesh_shape) == [4, 4, 1, 2]


@pytest.mark.parametrize(
    "environ,says",
    [
        ({}, None),
        ({"PJRT_DEVICE": "TPU"}, "PJRT_DEVICE=TPU"),
        ({"PJRT_DEVICE": "CPU"}, None),
        (
            {"TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so"},
            "TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so",
        ),
        ({"TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libcuda.so"}, None),
    ],
)
def test_a_pjrt_runtime_is_told_from_the_environment(environ, says):
    from tpushim import _engines

    assert _tpus.pjrt_runtime(environ) == says
    assert _engines.pjrt_runtime(environ) == says  # the engine choice answers the same


def test_the_table_is_cheap_to_import():
    code = (
        "import sys, tpushim._tpus; print(sorted({'tensorflow', 'dataclasses'} & set(sys.modules)))"
    )
    assert run_python(code) == "[]"
