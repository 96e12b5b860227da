"""The layers of docs/architecture.md, checked over the import graph of the code as it is.

Every ``import`` counts, those inside functions too (a lazy import that dodges a circle is still
a circle). A module may import its own layer and the layers below it; modules never import each
other in a circle; ``tasks/`` and ``cd4ml_runtime/`` import no Airflow; nothing loads project
code by name (``importlib.import_module`` of a project module).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Bottom to top; the one rule: a module imports only its own layer and the layers listed before it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("runtime", ("cd4ml_runtime",)),
    ("foundation", ("tasks", "tasks.errors", "tasks.settings", "tasks.settings_reference", "tasks.files",
                    "tasks.worker_pool")),
    ("data", ("tasks.data",)),
    ("alerting", ("tasks.alerting",)),
    ("curation", ("tasks.curation",)),
    ("models", ("tasks.models", "tasks.model")),
    ("training", ("tasks.training",)),
    ("release", ("tasks.release",)),
    ("serving", ("tasks.serving",)),
    ("monitoring", ("tasks.monitoring",)),
    ("ops", ("tasks.ops",)),
    ("cli", ("tasks.cli",)),
    ("airflow plugins", ("cd4ml_airflow",)),
    ("dags", ("dags",)),
)
SOURCES = {"cd4ml_runtime": REPO / "cd4ml_runtime", "tasks": REPO / "tasks",
           "cd4ml_airflow": REPO / "plugins" / "cd4ml_airflow", "dags": REPO / "dags"}
AIRFLOW_FREE = ("cd4ml_runtime", "tasks")


def _module_name(root: str, path: Path) -> str:
    parts = [root, *path.relative_to(SOURCES[root]).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {_module_name(root, path): path for root, folder in SOURCES.items() for path in sorted(folder.rglob("*.py"))}


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: resolve against this module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


@cache
def imports() -> dict[str, set[str]]:
    """Module -> every name it imports (top-level or inside functions), as dotted paths."""
    found: dict[str, set[str]] = defaultdict(set)
    for module, path in modules().items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            found[module].update(_imported(node, module, path.name == "__init__.py"))
    return found


def _own(name: str) -> str | None:
    """The project module a dotted import name refers to (longest match), or None for a library."""
    known = modules()
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def project_edges() -> set[tuple[str, str]]:
    return {(src, dst) for src, names in imports().items() for name in names
            if (dst := _own(name)) is not None and dst != src}


def layer_of(module: str) -> int:
    best = (-1, -1)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), index))
    assert best[1] >= 0, f"{module} belongs to no layer of docs/architecture.md: add it to LAYERS and the doc"
    return best[1]


def test_every_module_has_a_layer():
    for module in modules():
        layer_of(module)


def test_no_import_against_the_layer_order():
    wrong = sorted(f"{src} ({LAYERS[layer_of(src)][0]}) imports {dst} ({LAYERS[layer_of(dst)][0]})"
                   for src, dst in project_edges() if layer_of(dst) > layer_of(src))
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def _cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    graph: dict[str, list[str]] = defaultdict(list)
    for src, dst in edges:
        graph[src].append(dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _package(module: str) -> str:
    return module if module in ("tasks", "dags") else ".".join(module.split(".")[:2])


def test_no_circle_between_modules():
    # a package imports its own submodules in __init__ at most; the circles that matter are between files
    edges = {(s, d) for s, d in project_edges() if not modules()[s].name == "__init__.py"}
    assert not _cycles(edges), f"modules that import each other in a circle: {_cycles(edges)}"


def test_no_circle_between_stages():
    edges = {(_package(s), _package(d)) for s, d in project_edges() if _package(s) != _package(d)}
    assert not _cycles(edges), f"stages that import each other in a circle: {_cycles(edges)}"


@pytest.mark.parametrize("root", AIRFLOW_FREE)
def test_no_airflow_below_the_plugins(root):
    offending = sorted(f"{module} imports {name}" for module, names in imports().items()
                       if module.split(".")[0] == root
                       for name in names if name.split(".")[0] in ("airflow", "cd4ml_airflow", "dags"))
    assert not offending, "\n".join(offending)


def test_no_project_code_loaded_by_name():
    """``import_module("cd4ml_airflow...")`` and the like hide an arrow from every reader and from this test."""
    offending = []
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
                    and node.args and isinstance(node.args[0], ast.Constant | ast.JoinedStr)):
                text = ast.unparse(node.args[0])
                if any(root in text for root in ("tasks.", "cd4ml_airflow", "dags.")):
                    offending.append(f"{module}: import_module({text})")
    assert not offending, "\n".join(offending)


def test_the_check_sees_a_circle_and_a_wrong_way_import():
    """The checks above can fail: a planted circle and a planted upward import are found."""
    assert _cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]
    assert layer_of("tasks.data.lake") < layer_of("tasks.models.registry") < layer_of("cd4ml_airflow.release")
    assert ("tasks.monitoring.drift", "tasks.models.loading") in project_edges()  # lazy imports are seen
