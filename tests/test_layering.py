"""DESIGN.md section 3: ``core/`` imports no I/O package; only ``natsio/`` touches asyncio/nats.

The check walks every module's import statements (``import x``, ``from x import y``, including
imports nested in functions), so a lazy import cannot slip past it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "cotal_trio"
CORE_FORBIDDEN = {
    "trio", "trio_asyncio", "asyncio", "nats", "quart", "quart_trio", "hypercorn", "socket",
    "time", "os", "pathlib", "subprocess", "urllib", "http", "logging",
}
ASYNCIO_FAMILY = {"asyncio", "nats", "trio_asyncio"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level > 0 and node.module:
            names.add("." * node.level + node.module)
    return names


def _modules(sub: str = "") -> list[Path]:
    return sorted((PACKAGE / sub).rglob("*.py"))


@pytest.mark.parametrize("path", _modules("core"), ids=lambda p: p.name)
def test_core_is_pure(path):
    imported = _imports(path)
    assert not imported & CORE_FORBIDDEN, f"{path.name} imports {imported & CORE_FORBIDDEN}"
    relative_io = {name for name in imported if name.startswith("..")}
    assert not relative_io, f"{path.name} reaches outside core: {relative_io}"


@pytest.mark.parametrize("path", [p for p in _modules() if "natsio" not in p.parts], ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_natsio_touches_asyncio(path):
    assert not _imports(path) & ASYNCIO_FAMILY


# Clock reads and file access, by call shape; ``xkey.open(...)`` (a box) is not the builtin.
CLOCK_OR_FILE = re.compile(r"datetime\.now|\.utcnow\(|date\.today|time\.time\(|monotonic\(|(?<![.\w])(?<!def )open\(|read_text\(|read_bytes\(")


@pytest.mark.parametrize("path", _modules("core"), ids=lambda p: p.name)
def test_core_reads_no_clock_and_no_file(path):
    assert CLOCK_OR_FILE.findall(path.read_text()) == []


def test_the_walk_sees_imports():
    # A guard against a test that cannot fail: the walker finds what is there.
    assert "trio_asyncio" in _imports(PACKAGE / "natsio" / "_loop.py")
    assert "nacl" in _imports(PACKAGE / "core" / "nkeys.py")
    assert CLOCK_OR_FILE.findall("x = open(p); t = time.time(); k.open(b)") == ["open(", "time.time("]
