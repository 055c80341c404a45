"""Read-only by construction and never written by the API or gateway."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import llmgw
from llmgw.weights.mirror import server

PACKAGE = Path(llmgw.__file__).parent
WEIGHTS = PACKAGE / "weights"

# Calls that create, change or delete files, whatever object they are called on.
WRITE_CALLS = {"write_bytes", "write_text", "unlink", "remove", "removedirs", "rename",
               "renames", "rmdir", "mkdir", "makedirs", "rmtree", "truncate", "ftruncate",
               "chmod", "chown", "symlink", "link", "touch", "mkfifo", "copy", "copyfile",
               "copytree", "move", "utime", "pwrite"}
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"}


def writes_in(path: Path) -> list[str]:
    """Every call in a module's source that could write to the filesystem."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(
            func.value, ast.Name) else ""
        if name in WRITE_CALLS or (name in ("replace", "write") and owner == "os"):
            found.append(f"{path.name}:{node.lineno} {owner + '.' if owner else ''}{name}()")
        if name in ("open", "fdopen"):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and \
                        set(arg.value) & set("wax+"):
                    found.append(f"{path.name}:{node.lineno} {name}({arg.value!r})")
                flags = {n.attr for n in ast.walk(arg) if isinstance(n, ast.Attribute)}
                if flags & WRITE_FLAGS:
                    found.append(f"{path.name}:{node.lineno} {name}({sorted(flags & WRITE_FLAGS)})")
    return found


def test_the_method_table_holds_only_get_and_head() -> None:
    """The server answers exactly GET and HEAD; nothing else has a handler."""
    assert set(server.METHODS) == {"GET", "HEAD"}
    assert {"GET", "HEAD"} == set(server.SAFE_METHODS)


def test_a_write_handler_stops_the_server_from_loading() -> None:
    """Registering a handler for a write method is refused, so a later change cannot
    quietly make the mirror writable."""
    with pytest.raises(RuntimeError, match="must stay read-only"):
        server._check_read_only({**server.METHODS, "PUT": server.MirrorServer._get})


def test_the_method_table_cannot_be_changed_at_run_time() -> None:
    """The table is a read-only mapping; adding to it raises."""
    with pytest.raises(TypeError):
        server.METHODS["PUT"] = server.MirrorServer._get  # type: ignore[index]


@pytest.mark.parametrize("module", ["mirror/server.py", "mirror/answer.py", "layout.py"])
def test_the_serving_modules_contain_no_write_path(module: str) -> None:
    """No call in the modules that serve the mirror can create, change or delete a file;
    files are opened read-only."""
    assert writes_in(WEIGHTS / module) == []


def test_the_scan_finds_writes_where_there_are_some() -> None:
    """The scan is not vacuous: it flags the writes in the modules that do write."""
    found = writes_in(WEIGHTS / "mirror" / "add.py") + writes_in(WEIGHTS / "fetch.py")
    assert any("rename" in f for f in found)
    assert any("write_text" in f or "write_bytes" in f for f in found)


WRITERS = {"llmgw.weights.mirror.add", "llmgw.weights.mirror.usage", "llmgw.weights.fetch"}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_the_api_and_the_gateway_never_import_what_writes_to_the_mirror() -> None:
    """No module of the API, the gateway, the server assembly or the source check
    imports the mirror's writers (add, remove) or the node fetcher."""
    modules = [WEIGHTS / "check.py", PACKAGE / "server.py"]
    for sub in ("api", "gateway", "admin"):
        modules += sorted((PACKAGE / sub).rglob("*.py"))
    offenders = {str(m.relative_to(PACKAGE)): sorted(imported_modules(m) & WRITERS)
                 for m in modules if imported_modules(m) & WRITERS}
    assert offenders == {}
