"""Every CLI command and every HTTP route is documented (issue 7 item 5, "Docs").

The CLI reference ``docs/cli.md`` is generated from the cyclopts app and must equal what the app
renders now; every command reached by walking the app has its heading there. Every route of both
faces (the loopback face with every host-only door, and the public face) has a heading
``### `METHOD /path``` in ``docs/http-api.md``.
"""

from __future__ import annotations

import re
from pathlib import Path

from cotal_trio.cli import app as cli_app
from cotal_trio.cli.reference import REGENERATE, render
from cotal_trio.http.errors import ROUTES_CONFIG
from cotal_trio.http.ops import build_ops_app
from cotal_trio.http.lifecycle_doors import routes as lifecycle_routes
from cotal_trio.http.loopback import build_loopback_app
from cotal_trio.http.manager_doors import routes as manager_routes
from cotal_trio.lane.events import EventBus
from tests.support.loopback import _context
from tests.support.manager_doors import _doors
from tests.support.public_face import _app as public_app
from tests.support.cli_commands import _commands

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_cli_reference_is_what_the_app_renders():
    assert (DOCS / "cli.md").read_text() == render(), f"docs/cli.md is stale - run `{REGENERATE}`"


def test_every_cli_command_has_its_heading():
    text = (DOCS / "cli.md").read_text()
    headings = set(re.findall(r"^#+ (cotal(?: [\w-]+)*)$", text, re.M))
    commands = {" ".join(path) for path in _commands(cli_app)}
    assert {"cotal auth mint", "cotal doctor auth", "cotal up"} <= commands  # the walk reaches the leaves
    assert commands - headings == set()


async def _noop_guard() -> object:
    return {}


def _served_routes() -> set[tuple[str, str]]:
    """(METHOD, path) of every route the faces serve (loopback, public, operator), the doors included."""
    doors = [
        lambda guard, admit: lifecycle_routes(None, guard=guard, admit_refusal=admit),  # type: ignore[arg-type]
        lambda guard, admit: manager_routes(_doors(consent=True), guard=guard),
    ]
    loopback = build_loopback_app(_context(), metrics=lambda: (b"", "text/plain"), doors=doors, events=EventBus())
    ops = build_ops_app(capability="c" * 64, clock=lambda: 0.0, metrics=lambda: (b"", "text/plain"), events=EventBus(),
                        lanes=dict)  # the process's operator face (issue 18 item 8)
    apps = [loopback, public_app(), ops]
    served = set()
    for app in apps:
        served |= {(method, path) for path, methods in app.config[ROUTES_CONFIG].items() for method in methods}
        served |= {("GET", rule.rule) for rule in app.url_map.iter_rules() if rule.websocket}
    return served


def test_every_route_of_both_faces_is_documented():
    text = (DOCS / "http-api.md").read_text()
    documented = set(re.findall(r"^### `([A-Z]+) (/[^`\s]*)`", text, re.M))
    served = _served_routes()
    assert {("POST", "/exchange"), ("POST", "/interactive-lifecycle/retire"), ("POST", "/tool-result-consent/issue"),
            ("GET", "/.well-known/cotal-mesh"), ("GET", "/metrics"), ("GET", "/events"), ("GET", "/")} <= served  # fmt: skip
    missing = sorted(f"{m} {p}" for m, p in served - documented)
    assert missing == [], f"routes served but not documented in docs/http-api.md: {missing}"
