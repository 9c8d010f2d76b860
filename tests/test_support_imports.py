"""Issue 16: the shared test helpers live in ``tests/support/``.

No test module imports another test module or a conftest by name: a helper two modules share
moves to ``tests/support/<topic>.py`` and both import it from there. The walk reads every import
statement of every file under tests/ (``import x``, ``from x import y``, relative ones, and those
nested in functions), as tests/test_layering.py does for the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SUPPORT = "tests.support"


def _module_of(path: Path) -> str:
    """``tests/http/test_public.py`` -> ``tests.http.test_public``."""
    return ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)


def _targets(source: str, module: str) -> list[tuple[int, str]]:
    """Every ``(line, dotted name)`` ``source`` imports; for ``from m import n`` the name is ``m.n``,
    so a test module imported from its package (``from tests.http import test_public``) is named."""
    package = module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - (node.level - 1)]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return found


def _offending(source: str, module: str) -> list[str]:
    """The imports of ``source`` that reach a test module or conftest outside ``tests/support``."""
    return [
        f"line {line}: {name}" for line, name in _targets(source, module)
        if name.split(".")[0] == "tests" and not (name == SUPPORT or name.startswith(SUPPORT + "."))
    ]


def _files() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(TESTS)))
def test_shared_helpers_come_only_from_tests_support(path):
    assert _offending(path.read_text(), _module_of(path)) == []


def test_the_walk_flags_a_planted_import_of_a_test_module():
    # A guard against a test that cannot fail: each of these reaches a test module or a conftest.
    planted = (
        "from tests.http.test_loopback import x\n"
        "import tests.cli.test_client\n"
        "from tests.service import test_auth_service_live as live\n"
        "from .conftest import Root\n"
        "def f():\n    from .test_auth_mint import mint\n"
    )
    assert _offending(planted, "tests.cli.test_status") == [
        "line 1: tests.http.test_loopback.x",
        "line 2: tests.cli.test_client",
        "line 3: tests.service.test_auth_service_live",
        "line 4: tests.cli.conftest.Root",
        "line 6: tests.cli.test_auth_mint.mint",
    ]


def test_the_walk_passes_imports_from_tests_support_and_the_package():
    allowed = (
        "from tests.support.loopback import _context\n"
        "from tests.support import service as auth_live\n"
        "from cotal_trio.http import serve_app\n"
        "import trio\n"
    )
    assert _offending(allowed, "tests.lane.test_x") == []
    assert len(_targets(allowed, "tests.lane.test_x")) == 4
