"""The package's layers: imports only run down, and no two modules import each other.

A module may import from its own unit or from a unit of a lower layer; units
of one layer are peers and import nothing from each other (the JSON API and
the admin page share ``llmgw.control`` instead). Imports inside functions
count too: a lazy import that runs upwards is still an upward dependency, only
a hidden one.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import llmgw

PACKAGE = Path(llmgw.__file__).parent

# Lowest first. A unit is a package or module; the longest matching prefix wins.
LAYERS: list[set[str]] = [
    {"llmgw", "llmgw.errors", "llmgw.redact"},
    {"llmgw.nesting"},
    {"llmgw.catalog"},
    {"llmgw.config"},
    {"llmgw.store", "llmgw.weights", "llmgw.scheduler", "llmgw.scheduler.base"},
    {"llmgw.adaptersvc"},
    {"llmgw.planner", "llmgw.scheduler.local", "llmgw.scheduler.nomad", "llmgw.scheduler.relay",
     "llmgw.modelsvc", "llmgw.tenancy"},
    {"llmgw.control", "llmgw.gateway"},
    {"llmgw.api", "llmgw.admin"},
    {"llmgw.connection"},
    {"llmgw.server", "llmgw.workers"},
    {"llmgw.cli"},
    {"llmgw.__main__"},
]
# Test support for users and for this suite: it may use anything but the CLI.
TESTING = "llmgw.testing"
UNITS = sorted({u for layer in LAYERS for u in layer}, key=len, reverse=True)
LAYER_OF = {u: i for i, layer in enumerate(LAYERS) for u in layer}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit_of(module: str) -> str:
    if module.startswith(TESTING):
        return TESTING
    return next(u for u in UNITS if module == u or module.startswith(u + "."))


def imports() -> dict[str, set[str]]:
    """Every llmgw module and the llmgw modules it imports, at any depth of its code."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    found: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
                found[name] |= {t if t in modules else node.module for t in targets
                                if node.module.startswith("llmgw")}
            elif isinstance(node, ast.Import):
                found[name] |= {a.name for a in node.names if a.name.startswith("llmgw")}
    return found


def test_imports_run_down_the_layers_and_never_between_peers() -> None:
    """No module imports a unit of a higher layer, or a peer unit of its own layer."""
    wrong = []
    for module, targets in imports().items():
        here = unit_of(module)
        for target in targets:
            there = unit_of(target)
            if there == here:
                continue
            if here == TESTING:
                if there.startswith("llmgw.cli"):
                    wrong.append(f"{module} -> {target} (test support uses the CLI)")
                continue
            if there == TESTING:
                wrong.append(f"{module} -> {target} (the package depends on its test support)")
            elif LAYER_OF[there] >= LAYER_OF[here]:
                kind = "a peer" if LAYER_OF[there] == LAYER_OF[here] else "a higher layer"
                wrong.append(f"{module} -> {target} ({kind})")
    assert wrong == []


def test_no_two_modules_import_each_other_outside_the_fake_nomad() -> None:
    """The module graph has no cycle, except inside the fake Nomad's own package."""
    graph = imports()
    cycles: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    assert [c for c in cycles
            if not all(m.startswith("llmgw.testing.fake_nomad") for m in c)] == []


def test_the_layer_check_sees_a_real_import() -> None:
    """The scan is not vacuous: the gateway is found importing the catalog."""
    assert "llmgw.catalog.build" in imports()["llmgw.gateway.app"]
