"""The README stays a page for users, its commands are what CI runs, and the docs site builds."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(*path):
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return f.read()


def test_readme_is_a_page_for_users():
    assert len(read("README.md").encode("utf-8")) <= 12 * 1024  # the rest lives in docs/
    readme = read("README.md")
    for section in ("## Two commands", "## Four ways in", "## Where to run", "## Troubleshooting"):
        assert section in readme, section


def test_ci_runs_the_readmes_two_commands_verbatim():
    ci = subprocess.run(
        [sys.executable, os.path.join(ROOT, ".ci", "readme_commands.py")],
        capture_output=True,
        text=True,
        check=True,
    )
    # The demo first, then the tests: on a fresh machine, in this order and each alone, the extras
    # must leave TensorFlow and numpy 1 where they are (.ci/run checks it after running them).
    assert ci.stdout.splitlines() == [
        'pip install ".[cpu]" && python -m tpushim demo',
        'pip install -e ".[cpu,test]" && python -m pytest -q -p no:cacheprovider -n auto tests',
    ]
    assert "PIP_CONSTRAINT=" not in read(".ci", "run")  # run as a user runs them


def test_every_link_in_the_readme_names_a_file_here():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", read("README.md")):
        if "://" not in target:
            assert os.path.exists(os.path.join(ROOT, target)), target


def test_the_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")  # the test extra brings it
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr  # a broken link, anchor or nav entry fails it
    assert (tmp_path / "reference" / "preflight" / "index.html").is_file()
