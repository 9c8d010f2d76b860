"""DESIGN.md section 3 and issue 16: folders import only downward, nothing imports in a circle.

Three kinds of check, all by walking every module's import statements with :mod:`ast` (``import
x``, ``from x import y``, relative imports of any level, and imports nested in functions or under
``if TYPE_CHECKING:``), so neither a lazy import nor an annotation-only one slips past:

* purity: ``core/`` imports no I/O package and reads no clock or file; only ``natsio/`` touches
  asyncio/nats;
* the order: a folder imports only folders of a lower rank in :data:`RANKS`, plus itself;
* circles: no module reaches itself through imports (one file importing another that imports the
  first, or longer).

The checker works on a model (a mapping of ``<folder>/<file>.py`` to its source), so the tests
below also feed it planted sources and assert the exact violation it reports.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cotal_trio"
TOP = "cotal_trio"
CORE_FORBIDDEN = {
    "trio", "trio_asyncio", "asyncio", "nats", "quart", "quart_trio", "hypercorn", "socket",
    "time", "os", "pathlib", "subprocess", "urllib", "http", "logging",
}
ASYNCIO_FAMILY = {"asyncio", "nats", "trio_asyncio"}

# The allowed direction (BRIEF, issue 16): a folder imports only folders of a LOWER rank, plus
# itself. Folders of the same rank are peers and import neither way: natsio and state are two
# independent bottoms over core (the loop vs the disk); devidp and lane both sit on http, and a
# dev IdP has no business with a running space (nor a space with the dev IdP).
#   core < natsio, state < broker < stores < http < devidp, lane < service < ops < cli
RANKS: dict[str, int] = {
    "core": 0,
    "natsio": 1,
    "state": 1,
    "broker": 2,
    "stores": 3,
    "http": 4,
    "devidp": 5,
    "lane": 5,
    "service": 6,
    "ops": 7,
    "cli": 8,
}
# The package's face: exempt as importers (``__init__``'s lazy PEP 562 exports reach into lane/).
FACE = {"__init__.py", "__main__.py"}


# --- the model -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Edge:
    """One import of a cotal_trio module by another: ``importer`` (a ``folder/file.py`` path)
    names ``target`` (a dotted module, or ``cotal_trio`` for the face) on ``line``."""

    importer: str
    target: str
    line: int


def _dotted(rel: str) -> str:
    """``lane/callout/run.py`` -> ``cotal_trio.lane.callout.run`` (``__init__.py`` is its package)."""
    parts = [TOP, *rel.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(rel: str) -> list[str]:
    """The package a relative import in ``rel`` is relative to, as dotted parts."""
    dotted = _dotted(rel).split(".")
    return dotted if rel.endswith("__init__.py") else dotted[:-1]


def _targets(rel: str, node: ast.Import | ast.ImportFrom, modules: set[str]) -> Iterator[str]:
    """The cotal_trio modules one import statement names (others are not this check's business).

    ``from P import name`` names the module ``P.name`` when that is a module (a subpackage named
    as an imported name counts as importing it), else ``P`` itself; from the face it names
    ``cotal_trio.<name>`` (so ``cotal_trio.__version__`` can be told from the lazy exports).
    """
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == TOP or alias.name.startswith(TOP + "."):
                yield alias.name
        return
    if node.level:
        base = _package_of(rel)[: len(_package_of(rel)) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    if source != TOP and not source.startswith(TOP + "."):
        return
    for alias in node.names:
        named = f"{source}.{alias.name}"
        yield named if named in modules or source == TOP else source


def edges(sources: Mapping[str, str]) -> list[Edge]:
    """Every import between cotal_trio modules in the model, nested ones included."""
    modules = {_dotted(rel) for rel in sources}
    found = []
    for rel, text in sorted(sources.items()):
        for node in ast.walk(ast.parse(text, filename=rel)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [Edge(rel, target, node.lineno) for target in _targets(rel, node, modules)]
    return found


def _folder_of(target: str) -> str | None:
    """``cotal_trio.lane.run`` -> ``lane``; the face (``cotal_trio``, its ``__version__``) -> None.

    Any other name of the face (its lazy exports, which reach into lane/) is no folder of RANKS,
    so importing it is reported.
    """
    parts = target.split(".")
    return parts[1] if len(parts) > 1 and target != f"{TOP}.__version__" else None


def _may_import(folder: str) -> list[str]:
    return [f for f, rank in RANKS.items() if rank < RANKS[folder]] + [folder]


def order_violations(sources: Mapping[str, str]) -> list[str]:
    """Each import that goes up or sideways in :data:`RANKS`, as a sentence naming the fix."""
    problems = []
    for edge in edges(sources):
        folder = edge.importer.split("/")[0]
        if edge.importer in FACE:
            continue
        if folder not in RANKS:
            problems.append(f"{edge.importer} is in no folder of RANKS: put it in one, or give its folder a rank")
            continue
        target_folder = _folder_of(edge.target)
        if target_folder is None or target_folder == folder:
            continue  # the face (``cotal_trio.__version__``), or within the folder
        if target_folder not in RANKS or RANKS[target_folder] >= RANKS[folder]:
            allowed = ", ".join(_may_import(folder))
            problems.append(
                f"{edge.importer} imports {edge.target} (line {edge.line}): {folder} may import only "
                f"{allowed}; move the shared part down"
            )
    return problems


def _strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (iterative, so depth is no limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def _one_circle(graph: Mapping[str, set[str]], component: list[str]) -> list[str]:
    """A shortest circle from the component's first member back to it (breadth-first)."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle in component {component}")  # Tarjan gave a non-component


def circles(sources: Mapping[str, str]) -> list[str]:
    """Each set of modules that import one another in a circle, as a sentence naming one circle.

    Every import counts, lazy and ``TYPE_CHECKING`` ones too: a circle dodged by a late import is
    still two files that each need the other (the fix is the same: move the shared part down).
    The face is left out (its lazy exports are how it stays light).
    """
    by_module = {_dotted(rel): rel for rel in sources}
    graph: dict[str, set[str]] = {rel: set() for rel in sources if rel not in FACE}
    for edge in edges(sources):
        target = by_module.get(edge.target)
        if edge.importer in graph and target in graph and target != edge.importer:
            graph[edge.importer].add(target)
    found = []
    for component in _strongly_connected(graph):
        if len(component) > 1:
            route = " -> ".join(_one_circle(graph, component))
            found.append(f"circle: {route}; move what they share into a module both can import one way")
    return found


def package_sources() -> dict[str, str]:
    """The model of today's tree: every module of cotal_trio/ by its path under cotal_trio/."""
    return {path.relative_to(PACKAGE).as_posix(): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


# --- the tree as it is -----------------------------------------------------------------------


def test_every_folder_has_a_rank():
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    assert folders == set(RANKS), f"give each folder a rank in RANKS (and drop gone ones): {folders ^ set(RANKS)}"
    loose = {p.name for p in PACKAGE.glob("*.py")} - FACE
    assert not loose, f"{sorted(loose)}: modules outside every folder; move each into the folder of its job"


def test_folders_import_only_downward():
    assert order_violations(package_sources()) == []


def test_nothing_imports_in_a_circle():
    assert circles(package_sources()) == []


def test_no_test_imports_the_gone_lanes_folder():
    # tests/ mirror the package; the old catch-all ``lanes/`` was split (issue 16).
    gone = f"{TOP}.lanes"
    stale = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            named = []
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                named = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and path.name != Path(__file__).name:
                named = [node.value.split(":")[0]]  # monkeypatch targets, "module:attr" strings
            stale += [
                f"{path.relative_to(ROOT)}:{node.lineno} {name}"
                for name in named
                if name == gone or name.startswith(gone + ".")
            ]
    assert stale == [], "tests still name cotal_trio.lanes; import from its new folder"


# --- the checker fails on planted sources ----------------------------------------------------

STUBS = {
    "core/__init__.py": "",
    "core/errors.py": "",
    "lane/__init__.py": "",
    "lane/run.py": "",
    "service/__init__.py": "",
    "service/host.py": "",
    "stores/__init__.py": "",
    "http/__init__.py": "",
    "natsio/__init__.py": "",
}


def test_the_checker_reports_an_absolute_upward_import():
    planted = {**STUBS, "core/x.py": "from cotal_trio.lane import run\n"}
    assert order_violations(planted) == [
        "core/x.py imports cotal_trio.lane.run (line 1): core may import only core; move the shared part down"
    ]


def test_the_checker_reports_a_lazy_import_of_a_peer_layer():
    planted = {**STUBS, "http/faces.py": "def f():\n    import cotal_trio.service.host\n"}
    assert order_violations(planted) == [
        "http/faces.py imports cotal_trio.service.host (line 2): http may import only core, natsio, state, "
        "broker, stores, http; move the shared part down"
    ]


def test_the_checker_reports_a_relative_upward_import():
    planted = {**STUBS, "stores/issued.py": "from ..lane import run\nfrom ..core import errors\n"}
    assert order_violations(planted) == [
        "stores/issued.py imports cotal_trio.lane.run (line 1): stores may import only core, natsio, state, "
        "broker, stores; move the shared part down"
    ]


def test_the_checker_reports_a_subpackage_named_as_an_import_and_spares_only_the_version():
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cotal_trio import natsio\n"
    planted = {
        **STUBS,
        "core/y.py": source,
        "core/z.py": "import cotal_trio\nfrom cotal_trio import __version__\n",
        "stores/w.py": "from .. import admits_service_endpoints\n",
    }
    assert order_violations(planted) == [
        "core/y.py imports cotal_trio.natsio (line 3): core may import only core; move the shared part down",
        "stores/w.py imports cotal_trio.admits_service_endpoints (line 1): stores may import only core, natsio, "
        "state, broker, stores; move the shared part down",
    ]


def test_the_checker_reports_peers_and_spares_the_face():
    planted = {
        **STUBS,
        "devidp/__init__.py": "",
        "devidp/app.py": "from cotal_trio.lane.run import x\n",
        "__init__.py": "def __getattr__(name):\n    from cotal_trio.lane import run\n",
        "lane/events.py": "from cotal_trio import __version__\nfrom .. import core\n",
    }
    assert order_violations(planted) == [
        "devidp/app.py imports cotal_trio.lane.run (line 1): devidp may import only core, natsio, state, "
        "broker, stores, http, devidp; move the shared part down"
    ]


def test_the_checker_reports_a_planted_circle():
    planted = {
        **STUBS,
        "core/a.py": "from cotal_trio.core.b import B\n",
        "core/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n",
        "core/c.py": "from . import a\n",  # imports into the circle, not part of it
    }
    assert circles(planted) == [
        "circle: core/a.py -> core/b.py -> core/a.py; move what they share into a module both can import one way"
    ]


def test_the_checker_reports_a_longer_circle_once():
    planted = {
        **STUBS,
        "lane/a.py": "def f():\n    from .b import x\n",
        "lane/b.py": "from cotal_trio.lane.c import y\n",
        "lane/c.py": "import cotal_trio.lane.a\n",
    }
    assert circles(planted) == [
        "circle: lane/a.py -> lane/b.py -> lane/c.py -> lane/a.py; "
        "move what they share into a module both can import one way"
    ]


# --- purity (DESIGN.md section 3) ------------------------------------------------------------


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
    # ... and the order's walk sees today's tree (an empty model would pass every check).
    model = edges(package_sources())
    assert any(e.importer == "core/ledger.py" and e.target == "cotal_trio.core.errors" for e in model)
    assert any(e.importer == "ops/caller_mint.py" and e.target == "cotal_trio.natsio" for e in model)
