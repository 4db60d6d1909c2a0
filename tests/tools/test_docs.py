"""The README stays a page for users, its commands are what CI runs, and the docs site builds."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr  # a broken link, anchor or nav entry fails it
    assert (tmp_path / "reference" / "preflight" / "index.html").is_file()
    # The API reference is generated from the docstrings (mkdocstrings), not written by hand.
    api = (tmp_path / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("patch", "patched", "unpatch", "is_patched", "check", "status", "NoTPUError"):
        assert f"tpushim.{name}" in api, name
    assert "global batch size for train, eval and predict" in api  # patch()'s docstring
    assert (tmp_path / "walkthrough" / "index.html").is_file()


def nav_pages():
    """``{section: [page, ...]}`` of mkdocs.yml's navigation (top-level pages under ``""``)."""
    import yaml  # mkdocs brings PyYAML

    nav = yaml.safe_load(read("mkdocs.yml"))["nav"]
    pages = {}
    for entry in nav:
        ((title, value),) = entry.items()
        if isinstance(value, str):
            pages.setdefault("", []).append(value)
        else:
            pages[title] = [next(iter(item.values())) for item in value]
    return pages


def test_navigation_is_for_users_first_and_contributors_apart():
    pytest.importorskip("yaml")
    pages = nav_pages()
    assert list(pages)[-1] == "Contributors"  # last
    assert {"quickstart.md", "walkthrough.md", "faq.md"} <= set(pages[""])
    assert "reference/api.md" in pages["Reference"]
    assert "how-to/notebooks.md" in pages["How-to"]
    assert not any(
        page.startswith("contributing/") for page in pages["Reference"] + pages["How-to"]
    )
    # User pages name no test files: a wheel user does not have them.
    for section, section_pages in pages.items():
        if section == "Contributors":
            continue
        for page in section_pages:
            assert "tests/" not in read("docs", page), page


def prose_words(text):
    """Words outside fenced code blocks (listings of a script or its output are not prose)."""
    return sum(
        len(block.split())
        for i, block in enumerate(re.split(r"^```.*$", text, flags=re.M))
        if not i % 2
    )


def test_user_pages_say_what_happens_and_leave_the_proofs_to_contributors():
    pytest.importorskip("yaml")
    # A user page says what happens and what to do, in about 1,200 words of prose at most;
    # derivations, mechanics and test lists live under docs/contributing/ (issue 35, item 1).
    for section, section_pages in nav_pages().items():
        if section == "Contributors":
            continue
        for page in section_pages:
            assert prose_words(read("docs", page)) <= 1300, page


def test_notebooks_open_in_colab_from_the_project_url():
    import json

    homepage = "https://github.com/tpushim/tpushim"
    assert f'Homepage = "{homepage}"' in read("pyproject.toml")
    for name in ("colab_quickstart.ipynb", "migrate_legacy_cnn.ipynb"):
        title = "".join(json.loads(read("notebooks", name))["cells"][0]["source"])
        badge = (
            f"https://colab.research.google.com/github/tpushim/tpushim/blob/main/notebooks/{name}"
        )
        assert "[![Open In Colab]" in title and badge in title, name
        heading = next(line for line in title.splitlines() if line.startswith("# "))
        assert "Colab TPU" not in heading  # a Colab TPU cannot run TensorFlow <= 2.15 today
        assert "**Colab today** (Python 3.12" in title  # the first bullet: what it does there
