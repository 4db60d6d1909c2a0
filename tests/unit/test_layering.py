"""The house's shape, read from the source (every import, at the top or inside a function): no
import cycle; an engine's package never imports another engine; the core imports no tooling
(docs/contributing/layout.md)."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "tpushim")

#: The tooling above the core (layout.md): the core never imports these.
TOOLING = (
    "tpushim.__main__",
    "tpushim._cli",
    "tpushim._launcher",
    "tpushim._console",
    "tpushim._summary",
    "tpushim._scratch",
    "tpushim._ipython",
    "tpushim._autopatch",
    "tpushim.demo",
    "tpushim._preflight",
)
#: Each engine's own code: the TPUEstimator engine's modules, the strategy engine's package, the
#: JAX engine's package.
ENGINES = {
    "tpuestimator": ("tpushim._estimator", "tpushim._extenders", "tpushim._model_fn"),
    "strategy": ("tpushim._strategy",),
    "jax": ("tpushim._jax",),
}


def modules():
    """``{module name: path}`` of every module of tpushim."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path[:-3], ROOT).replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


def imports(module, path, known):
    """The tpushim modules ``module`` imports, anywhere in its source."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        found.update(name for name in names if name in known and name != module)
    return found


def graph():
    known = modules()
    return {module: imports(module, path, known) for module, path in known.items()}


def within(module, prefixes):
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_no_import_cycle():
    edges = graph()
    cycles = []
    state = {}

    def visit(module, trail):
        state[module] = "open"
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                cycles.append(trail[trail.index(target) :] + [target])
            elif target not in state:
                visit(target, trail + [target])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, f"import cycles: {cycles}"


def test_an_engine_never_imports_another_engine():
    edges = graph()
    crossing = [
        (module, target)
        for engine, own in ENGINES.items()
        for module in edges
        if within(module, own)
        for target in edges[module]
        for other, theirs in ENGINES.items()
        if other != engine and within(target, theirs)
    ]
    assert not crossing, f"an engine's module imports another engine's: {crossing}"


def test_the_core_imports_no_tooling():
    edges = graph()
    crossing = [
        (module, target)
        for module in edges
        if not within(module, TOOLING) and module != "tpushim"
        for target in edges[module]
        if within(target, TOOLING)
    ]
    assert not crossing, f"the core imports tooling: {crossing}"


def test_the_checks_can_fail():
    """The graph sees imports inside functions and relative ones (the checks above can fail)."""
    edges = graph()
    assert "tpushim._engines.base" in edges["tpushim._engines.strategy"]
    assert "tpushim._strategy.build" in edges["tpushim._engines.strategy"]  # inside a method
