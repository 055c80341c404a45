"""The decision modules of the Nomad backend import no I/O library (STYLE rule 2)."""

from __future__ import annotations

import ast
from pathlib import Path

import llmgw.scheduler.nomad as pkg

PURE = ["jobspec", "render", "placement", "fleet", "reconcile", "wire", "warmth", "adapterjob"]
IO = {"nomad", "requests", "httpx", "aiohttp", "sqlite3", "psycopg", "litestar", "socket",
      "asyncio", "threading", "subprocess", "urllib.request", "time",
      "llmgw.scheduler.nomad.client", "llmgw.scheduler.nomad.backend",
      "llmgw.scheduler.nomad.discovery", "llmgw.store"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_pure_modules_import_no_io():
    """render, placement, fleet, reconcile, jobspec, wire, warmth and adapterjob stay free
    of I/O imports."""
    root = Path(pkg.__file__).parent
    for name in PURE:
        imported = _imports(root / f"{name}.py")
        bad = {i for i in imported for io in IO if i == io or i.startswith(io + ".")}
        assert not bad, f"{name}.py imports {sorted(bad)}"
