"""Imports point down: the read side (`api/`) and the write side (`projection/`, `projector/`) share code only
through rooms below both, and the client package imports nothing of the services (docs/architecture.md, "Tree").

Read from the source with `ast`, so a module that is never imported in a test run is checked too, and an
import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services" / "graphledger_server"
LIBS = ROOT / "libs" / "graphledger"

READ_SIDE = ("graphledger_server.api",)
WRITE_SIDE = ("graphledger_server.projection", "graphledger_server.projector")
BELOW_BOTH = ("graphledger_server.opening", "graphledger_server.log", "graphledger_server.keys")


def _module(path: Path, root: Path, package: str) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join((package, *(p for p in parts if p != "__init__")))


def _imports(path: Path, module: str) -> set[str]:
    """Every module `path` imports, relative imports resolved against `module`."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def _graph(root: Path, package: str) -> dict[str, set[str]]:
    return {_module(p, root, package): _imports(p, _module(p, root, package)) for p in sorted(root.rglob("*.py"))}


def _within(name: str, rooms: tuple[str, ...]) -> bool:
    return any(name == room or name.startswith(room + ".") for room in rooms)


def _crossings(graph: dict[str, set[str]], rooms: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{module} imports {name}"
        for module, names in graph.items()
        if _within(module, rooms)
        for name in names
        if _within(name, forbidden)
    )


def test_the_read_side_imports_nothing_of_the_write_side() -> None:
    assert _crossings(_graph(SERVICES, "graphledger_server"), READ_SIDE, WRITE_SIDE) == []


def test_the_write_side_imports_nothing_of_the_read_side() -> None:
    assert _crossings(_graph(SERVICES, "graphledger_server"), WRITE_SIDE, READ_SIDE) == []


def test_the_rooms_below_both_sides_import_neither() -> None:
    assert _crossings(_graph(SERVICES, "graphledger_server"), BELOW_BOTH, READ_SIDE + WRITE_SIDE) == []


def test_the_client_package_imports_nothing_of_the_services() -> None:
    assert _crossings(_graph(LIBS, "graphledger"), ("graphledger",), ("graphledger_server",)) == []


def test_the_scan_sees_an_import_across_the_sides(tmp_path: Path) -> None:
    """The check itself: a module of the read side that imports the write side is found."""
    api = tmp_path / "api"
    api.mkdir()
    (api / "reads.py").write_text("from ..projection import batch\nimport graphledger_server.projector.worker\n")
    graph = _graph(tmp_path, "graphledger_server")
    assert _crossings(graph, READ_SIDE, WRITE_SIDE) == [
        "graphledger_server.api.reads imports graphledger_server.projection",
        "graphledger_server.api.reads imports graphledger_server.projection.batch",
        "graphledger_server.api.reads imports graphledger_server.projector.worker",
    ]
