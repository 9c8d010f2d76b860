"""The systemd notify protocol of a real ``cotal auth-service`` process (issue 7 item 4 tests).

The test plays systemd's part: it binds a unix datagram socket in ``tmp_path``, starts ``python
-m cotal_trio auth-service`` with ``NOTIFY_SOCKET`` naming it (and ``WATCHDOG_USEC=400000``)
against a real operator-mode nats-server whose spaces ``a``, ``b`` and ``c`` are pushed
(``test_auth_service_live.start_mesh``), reads the datagrams, and stops the process it started
with SIGTERM, by its pid. Every wait is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
import trio

from cotal_trio.state import RootPaths, atomic_write
from tests.support.service import SPACES, start_mesh, write_manifest
from tests.support.notify import Systemd, WATCHDOG_USEC, start_service, stop

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

CEILING_S = 60


def readiness_files(paths: RootPaths) -> dict[str, bool]:
    return {space: paths.space(space).auth_service_json.exists() for space in SPACES}


async def test_ready_once_every_lane_has_its_outcome_then_watchdog_and_stopping(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str, systemd: tuple[str, Systemd]
):
    """Issue 7 item 4: READY=1 once every lane of the applied manifest has its outcome: the
    serving ones flushed, every space's ``auth-service.json`` written at that moment, and a lane
    that cannot start (space ``d`` has no material) retrying with its reason in the same STATUS
    (it must not hold the unit's start, which would stop the lanes that serve); WATCHDOG=1 every
    WATCHDOG_USEC/2; STOPPING=1 on SIGTERM, and the process exits 0."""
    address, inbox = systemd
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    manifest = tmp_path / "host" / "spaces.json"
    manifest.parent.mkdir()
    write_manifest(manifest, *SPACES, "d")
    proc = await start_service(nursery, mesh, tmp_path, address, "--spaces", str(manifest))
    with trio.fail_after(CEILING_S):
        ready = await inbox.until("READY=1")
        assert readiness_files(mesh.paths) == dict.fromkeys(SPACES, True)
        write_manifest(manifest, *SPACES)  # drop d: the host's file watch applies it
        while "3/3 lanes serving" not in inbox.statuses():
            await inbox.receive()
    assert ready[0] == "READY=1" and ready[1].startswith("STATUS=3/4 lanes serving; retrying: d ("), ready
    assert "manifest refused" not in " ".join(inbox.statuses())
    shape = re.compile(r"[0-3]/4 lanes serving(; retrying: d \(.+\))?|3/3 lanes serving")
    assert all(shape.fullmatch(status) for status in inbox.statuses()), inbox.statuses()

    with trio.fail_after(10):
        start = trio.current_time()
        pings = 0
        while pings < 5:
            pings += (await inbox.receive()).count("WATCHDOG=1")
        elapsed = trio.current_time() - start
    assert 0.4 <= elapsed < 3, f"5 pings at {WATCHDOG_USEC / 2e6} s apart took {elapsed:.2f} s"

    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(20):
        await inbox.until("STOPPING=1")
        code = await proc.wait()
    assert code == 0, (tmp_path / "service.log").read_text()
    assert sum("READY=1" in seen for seen in inbox.seen) == 1
    assert readiness_files(mesh.paths) == dict.fromkeys(SPACES, False)


async def test_a_single_space_replica_is_ready_after_its_flush(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str, systemd: tuple[str, Systemd]
):
    """A callout-only ``--space`` replica (no ``auth-service.json``) sends READY=1 with
    ``1/1 lanes serving`` once its lane started (its subscription flushed), STOPPING=1 on SIGTERM."""
    address, inbox = systemd
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    proc = await start_service(nursery, mesh, tmp_path, address, "--space", "a", "--callout-only")
    with trio.fail_after(CEILING_S):
        ready = await inbox.until("READY=1")
    assert ready == ["READY=1", "STATUS=1/1 lanes serving"]
    assert not mesh.paths.space("a").auth_service_json.exists()  # a replica writes none
    assert await stop(proc) == 0, (tmp_path / "service.log").read_text()
    with trio.fail_after(5):  # sent when the shutdown began; still queued on our socket
        await inbox.until("STOPPING=1")


async def test_a_refused_manifest_never_becomes_ready(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str, systemd: tuple[str, Systemd]
):
    """A manifest refused at start is not applied: STATUS names the refusal, READY never comes
    (systemd's TimeoutStartSec then fails the start)."""
    address, inbox = systemd
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    manifest = tmp_path / "spaces.json"
    atomic_write(manifest, b'{"version": 2, "spaces": [{"space": "a", "nope": 1}]}')
    proc = await start_service(nursery, mesh, tmp_path, address, "--spaces", str(manifest))
    with trio.fail_after(CEILING_S):
        while not any("manifest refused" in status for status in inbox.statuses()):
            await inbox.receive()
    assert inbox.statuses()[-1].startswith("0/0 lanes serving; manifest refused: ")
    with trio.move_on_after(1):  # a few watchdog pings, and no READY among them
        while True:
            assert "READY=1" not in await inbox.receive()
    assert await stop(proc) == 0, (tmp_path / "service.log").read_text()
