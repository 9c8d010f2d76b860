"""Issue 18 item 4: a typo in ``spaces.json`` never hides what serves.

A real ``cotal auth-service --spaces <root>/spaces.json`` process (a real nats-server, READY
awaited on its notify socket) hosts spaces ``a`` and ``b`` of a root that also holds ``c``. The
test then saves the manifest with a typo (a trailing comma), waits for the host's
``spaces.json.applied`` to carry the refusal, and drives the three read-only commands as an
operator would, each a child process:

* ``cotal status`` (text and ``--json``) lists ``a`` and ``b`` serving with their pid and URL,
  plus one line with the host's refusal, and exits 0;
* ``cotal space list`` (text and ``--json``) lists every space, ``a`` and ``b`` hosted as
  ``.applied`` says, plus the refusal line, and exits 0;
* ``cotal watch --json`` running when the typo is saved prints the host's ``manifest refused``
  event and says the refusal on stderr, and goes on; a ``cotal watch`` started afterwards shows
  both lanes serving under the refusal line, and ``cotal watch --json`` prints both faces'
  hellos and says the refusal on stderr.

Before the fix ``status`` and ``space list`` exited 1 with ``spaces.json is refused (...)`` and
listed nothing, and ``watch`` listed no space and said ``no space serves a face yet``.

Once the host is stopped nothing serves, and the exit codes are today's: ``status`` exits 1
(naming the refusal and that no auth service runs), ``space list`` exits 1 with the sentence
naming the broken file.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from cotal_trio.core.manifest import ManifestRefused, parse_manifest
from tests.support.notify import start_service, stop, systemd  # noqa: F401 - systemd is a fixture
from tests.support.process_lines import Lines
from tests.support.service import start_mesh, write_manifest

pytestmark = pytest.mark.broker

CEILING_S = 30
HOSTED = ("a", "b")
TYPO = b'{"version": 2, "spaces": [{"space": "a"}, {"space": "b"},]}\n'


def _refusal() -> str:
    """What the host's parser says of :data:`TYPO` (the sentence ``.applied`` records)."""
    try:
        parse_manifest(TYPO)
    except ManifestRefused as exc:
        return str(exc)
    raise AssertionError("the typo parses")


def _cotal(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cotal_trio", *argv], capture_output=True, text=True, timeout=CEILING_S)


async def _applied_refused(manifest: Path) -> dict:
    """Poll ``.applied`` (bounded) until the host records a refusal; the file then."""
    path = manifest.with_name(manifest.name + ".applied")
    with trio.fail_after(CEILING_S):
        while not (applied := json.loads(path.read_text()))["refused"]:
            await trio.sleep(0.05)
    return applied


@asynccontextmanager
async def _watching(root: Path, log: Path, *flags: str) -> AsyncIterator[Lines]:
    """``cotal watch <flags> --root <root>`` as a child (stderr to ``log``), its stdout's lines;
    SIGINT (by its pid) on the way out, and it must exit 0."""
    command = [sys.executable, "-m", "cotal_trio", "watch", *flags, "--root", str(root)]
    with log.open("wb") as err:  # the child holds its own copy
        process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE, stderr=err)
    try:
        assert process.stdout is not None
        yield Lines(process.stdout)
    finally:
        process.send_signal(signal.SIGINT)
        with trio.fail_after(CEILING_S):
            code = await process.wait()
        await process.stdout.aclose()
    assert code == 0, log.read_text()


async def _watch_view(root: Path, log: Path) -> list[str]:
    """``cotal watch`` (stdout not a terminal, so one view a second, never cleared) until a view
    shows both lanes serving: that view's lines, each view starting with the refusal line."""
    view: list[str] = []
    seen: list[str] = []  # every line, for the failure's message
    async with _watching(root, log) as lines:
        with trio.move_on_after(CEILING_S):
            while not (view and {"a  serving", "b  serving"} <= set(view)):
                line = await lines.next()
                seen.append(line)
                if line.startswith("manifest "):
                    view = []
                if view or line.startswith("manifest "):
                    view.append(line)
    assert view and {"a  serving", "b  serving"} <= set(view), seen[-12:]
    return view


async def _watch_json(root: Path, log: Path) -> tuple[dict[str, dict], str]:
    """``cotal watch --json`` until both faces' hellos arrived and stderr names the refusal:
    (the hellos by space, its stderr)."""
    hellos: dict[str, dict] = {}
    async with _watching(root, log, "--json") as lines:
        with trio.move_on_after(CEILING_S):
            while set(hellos) != set(HOSTED) or "refused" not in log.read_text():
                with trio.move_on_after(0.5):  # stderr is polled while no event comes
                    event = json.loads(await lines.next())
                    if event["type"] == "hello":
                        hellos[event["space"]] = event
    return hellos, log.read_text()


async def _watch_the_typo(root: Path, manifest: Path, log: Path) -> tuple[dict, str]:
    """``cotal watch --json`` running when the typo is saved: once both hellos came, write
    :data:`TYPO`; then read until the host's ``manifest`` event and the stderr line naming the
    refusal: (that event, its stderr)."""
    hellos: set[str] = set()
    event: dict = {}
    line = f"cotal watch: manifest {manifest} refused, the current lanes keep serving: {_refusal()}"
    async with _watching(root, log, "--json") as lines:
        with trio.move_on_after(CEILING_S):
            while hellos != set(HOSTED):
                event = json.loads(await lines.next())
                hellos |= {event["space"]} if event["type"] == "hello" else set()
            manifest.write_bytes(TYPO)  # an operator's edit in place
            while event.get("type") != "manifest":
                event = json.loads(await lines.next())
            while line not in log.read_text():
                await trio.sleep(0.05)
    return event, log.read_text()


async def test_a_refused_manifest_never_hides_what_serves(nursery, tmp_path, nats_server_bin, systemd):  # noqa: F811
    address, inbox = systemd
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    root = mesh.paths.root
    manifest = mesh.paths.spaces_manifest
    write_manifest(manifest, *HOSTED)
    service = await start_service(nursery, mesh, tmp_path, address, "--spaces", str(manifest))
    with trio.fail_after(CEILING_S):
        await inbox.until("READY=1")  # every lane serves: a's and b's auth-service.json are written
    before = _cotal("status", "--json", "--root", str(root))
    assert before.returncode == 0, before.stderr
    lanes = {s["space"]: (s["state"], s["pid"], s["url"]) for s in json.loads(before.stdout)["spaces"]}
    assert sorted(lanes) == list(HOSTED) and {state for state, _, _ in lanes.values()} == {"serving"}

    # A watcher running when the typo is saved gets the host's refusal event, and goes on.
    event, err = await _watch_the_typo(root, manifest, tmp_path / "watch-live.log")
    refusal = _refusal()
    assert {k: event.get(k) for k in ("type", "space", "outcome", "reason")} == {
        "type": "manifest", "space": None, "outcome": "refused", "reason": refusal}
    assert f"cotal watch: manifest {manifest} refused, the current lanes keep serving: {refusal}\n" in err, err
    applied = await _applied_refused(manifest)
    assert applied["refused"] == refusal
    assert applied["spaces"] == {"a": {"state": "serving"}, "b": {"state": "serving"}}
    line = f"manifest {manifest} refused, the current lanes keep serving: {refusal}"

    text = _cotal("status", "--root", str(root))
    assert (text.returncode, text.stderr) == (0, ""), text
    assert text.stdout.splitlines()[-1] == line
    shown = text.stdout.splitlines()[:-1]
    for space, (_, pid, url) in lanes.items():
        row = next(row for row in shown if row.startswith(f"{space}  "))
        assert row.startswith(f"{space}  serving  pid {pid}  {url}  "), row
    assert len([row for row in shown if not row.startswith("operator face ")]) == len(HOSTED), text.stdout
    as_json = _cotal("status", "--json", "--root", str(root))
    assert (as_json.returncode, as_json.stderr) == (0, line + "\n"), as_json
    report = json.loads(as_json.stdout)
    assert report["refused"] == refusal and report["running"] is True
    assert {s["space"]: (s["state"], s["pid"], s["url"]) for s in report["spaces"]} == lanes

    listing = _cotal("space", "list", "--root", str(root))
    assert (listing.returncode, listing.stderr) == (0, ""), listing
    assert listing.stdout.splitlines() == [
        "a\tuser-auth\thosted", "b\tuser-auth\thosted", "c\tuser-auth\tnot hosted", line,
    ]
    listing = _cotal("space", "list", "--json", "--root", str(root))
    assert (listing.returncode, listing.stderr) == (0, line + "\n"), listing
    assert json.loads(listing.stdout) == [
        {"space": "a", "mode": "user-auth", "hosted": True},
        {"space": "b", "mode": "user-auth", "hosted": True},
        {"space": "c", "mode": "user-auth", "hosted": False},
    ]

    view = await _watch_view(root, tmp_path / "watch.log")
    assert view[0] == line, view
    assert {"a  serving", "b  serving"} <= set(view), view
    hellos, err = await _watch_json(root, tmp_path / "watch-json.log")
    assert {space: hello["lanes"] for space, hello in hellos.items()} == dict.fromkeys(
        HOSTED, {"a": {"state": "serving", "reason": None}, "b": {"state": "serving", "reason": None}})
    assert f"cotal watch: {line}\n" in err, err

    # The lanes kept serving all along: a connect to b is admitted now.
    mesh.grant("b", "alice", "cli")
    with trio.fail_after(CEILING_S):
        await mesh.admitted("b", await mesh.bearer("b", "alice", "cli"))

    # Nothing serves once the host stops: today's exit codes, each naming the broken file.
    assert await stop(service) == 0, (tmp_path / "service.log").read_text()
    stopped = _cotal("status", "--root", str(root))
    assert stopped.returncode == 1, stopped
    assert "no auth service is running" in stopped.stderr
    assert str(manifest) in stopped.stdout + stopped.stderr and "fix it" in stopped.stdout + stopped.stderr
    listing = _cotal("space", "list", "--root", str(root))
    assert (listing.returncode, listing.stdout) == (1, ""), listing
    assert listing.stderr.startswith(f"cotal: {manifest} is refused (")
