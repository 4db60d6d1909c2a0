"""What the docs and metadata say matches the code: status() keys, the preflight's finding codes,
the typed ``mode`` choices, the wheel's project URLs (issue 35, item 5)."""

import ast
import glob
import json
import os
import re
import typing
from importlib import metadata

import tpushim
from tpushim import _settings, _types, _versions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read(*path):
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return f.read()


def test_status_page_shows_every_key_status_has():
    page = read("docs", "reference", "status.md")
    example = json.loads(page.split("```json")[1].split("```")[0])
    with tpushim.patched(mode="cpu"):
        status = tpushim.status()
    assert sorted(example) == sorted(status)
    if _versions.uses_own_estimator():  # the example is 2.15's; the table names 2.16's keys too
        assert all(f"`{key}`" in page for key in status["applied"]), status["applied"]
        assert len(status["applied"]) == 10
    else:
        assert sorted(example["applied"]) == sorted(status["applied"])  # every wrapped function
        assert len(status["applied"]) == 3
    table_keys = re.findall(r"^\| `(\w+)` \|", page, flags=re.M)
    assert sorted(table_keys) == sorted(status)


def finding_codes():
    """Every code the preflight can report: the first argument of each ``report.add(...)`` in
    the preflight and the command line, ``unconvertible-{kind}`` for each validation step."""
    sources = glob.glob(os.path.join(ROOT, "tpushim", "_preflight", "*.py"))
    sources.append(os.path.join(ROOT, "tpushim", "_cli.py"))
    codes = set()
    for path in sources:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add"
                and len(node.args) >= 4
            ):
                first = node.args[0]
                if isinstance(first, ast.Constant):
                    codes.add(first.value)
                else:
                    assert ast.unparse(first) == "f'unconvertible-{kind}'", ast.unparse(first)
    # The kinds of _validation.VALIDATION_STEPS, read without importing TensorFlow.
    tree = ast.parse(read("tpushim", "_validation.py"))
    steps = next(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "VALIDATION_STEPS"
    )
    codes |= {f"unconvertible-{step.elts[0].value}" for step in steps.elts}
    return codes


def test_preflight_page_lists_every_finding_code():
    codes = finding_codes()
    assert {"unconvertible-loss", "no-conversion", "script-raised", "tpu-graph"} <= codes
    table = [line for line in read("docs", "reference", "preflight.md").splitlines()]
    listed = set()
    for line in table:
        if line.startswith("| `"):
            listed |= set(re.findall(r"`([a-z0-9]+(?:-[a-z0-9]+)+)`", line.split(" | ")[0]))
    assert codes - listed == set()


def test_mode_and_pod_input_are_typed_with_their_choices():
    assert typing.get_args(_types.Mode) == _settings.MODES
    assert typing.get_args(_types.PodInput) == _settings.POD_INPUTS
    assert typing.get_type_hints(_types.Status)["mode"] is _types.Mode
    names = vars(_types)  # annotations are strings: typing is not imported at start-up
    for function in (tpushim.patch, tpushim.patched.__init__):
        hints = typing.get_type_hints(function, localns=names)
        assert hints["mode"] == typing.Optional[_types.Mode], function
        assert hints["pod_input"] == typing.Optional[_types.PodInput], function


def test_the_wheel_names_the_project_urls():
    urls = dict(
        line.split(", ", 1) for line in metadata.metadata("tpushim").get_all("Project-URL") or ()
    )
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)
    assert all(url.startswith("https://github.com/tpushim/tpushim") for url in urls.values())


def test_the_typed_choices_are_public_without_importing_typing_at_start_up():
    assert tpushim.Mode is _types.Mode and tpushim.PodInput is _types.PodInput
    assert {"Mode", "PodInput", "Status"} <= set(tpushim.__all__)


def test_what_users_read_cites_no_issue_numbers():
    """An issue number (#33) means nothing outside this repository: no string in the package
    that a user may read (a message, a note, a line) cites one; docstrings and comments may, and
    ``owner/repo#N`` names a public issue anyone can open."""
    cites = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tpushim", "**", "*.py"), recursive=True)):
        tree = ast.parse(read(path))
        docstrings = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        }
        cites += [
            f"{os.path.relpath(path, ROOT)}:{node.lineno}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and re.search(r"(^|[^&\w/])#\d{2,}\b|\bissue \d+", node.value)
        ]
    assert cites == []


def _module_map():
    """layout.md's module map (its first code block) and the names its rows start with."""
    block = read("docs", "contributing", "layout.md").split("```")[1]
    heads = re.findall(r"^(?:core {3}|tooling | {7})(_\w+/?|__main__)\s", block, flags=re.M)
    return block, heads


def test_layout_names_every_module_and_only_modules_that_exist():
    """Every module and package of tpushim, and every module of its packages, is named in
    layout.md's module map; every row of the map names a module or package that exists."""
    block, heads = _module_map()
    package = os.path.join(ROOT, "tpushim")
    missing = []
    for entry in sorted(os.listdir(package)):
        path = os.path.join(package, entry)
        if entry.endswith(".py") and entry not in ("__init__.py", "version.py", "py.typed"):
            name = entry[:-3]
        elif os.path.isfile(os.path.join(path, "__init__.py")):
            name = entry
            for inner in sorted(os.listdir(path)):
                named = re.search(rf"(?<![\w.]){re.escape(inner[:-3])}\b", block)
                if inner.endswith(".py") and inner != "__init__.py" and not named:
                    missing.append(f"{entry}/{inner}")
        else:
            continue
        if not re.search(rf"(?<![\w/]){re.escape(name)}\b", block):
            missing.append(entry)
    assert not missing, f"layout.md's module map does not name: {missing}"
    stale = [
        head
        for head in heads
        if not os.path.exists(
            os.path.join(package, head.rstrip("/") + ("" if head.endswith("/") else ".py"))
        )
    ]
    assert not stale, f"layout.md's module map names modules that do not exist: {stale}"


def test_layout_engine_table_is_the_registry():
    """The engines table's 'Engine' row names each registered engine's module and class, in the
    registry's order."""
    from tpushim import _engines

    page = read("docs", "contributing", "layout.md")
    row = next(line for line in page.splitlines() if line.startswith("| Engine (`_engines/`)"))
    cells = [cell.strip() for cell in row.strip("|").split("|")][1:]
    expected = [
        f"`{type(engine).__module__.rsplit('.', 1)[1]}.{type(engine).__name__}`"
        for engine in _engines.ENGINES
    ]
    assert cells == expected, (cells, expected)
