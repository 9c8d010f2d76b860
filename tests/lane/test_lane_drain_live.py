"""Issue 15 item 8, "Stopping drains", on a real nats-server (``lane/stopping.py``).

A stopping lane stops taking new requests, lets the in-flight ones answer within ``DRAIN_S``,
then cancels. The fault: a ledger that stalls. Every callout's ledger read (the lane's
``wrap_ledger`` port, the read its workers run in threads) waits on a gate the test holds shut,
so the connects stay in flight at the ledger step; the test then stops the lane (the manifest
drops it, or the process gets SIGTERM), waits until the stop is under way (the lane's
readiness file is gone, the first thing its drain does), and only then opens the gate. Every
held connect must be admitted: its mint was answered by a lane that was stopping. An exchange
in flight (its request body half sent when the stop begins) must finish with its bearer too.

Before the fix the stop cancelled the lane outright: the held connects got no answer and the
broker refused them at its auth timeout, and the half-sent exchange's connection was cut.

The broker's auth timeout is 4 s here (the callout's budget 3.75 s), so the held connects
meet their deadlines with room on a loaded machine; every wait is bounded by ``CEILING_S``.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from cotal_trio.broker import provision
from cotal_trio.cli.common import stop_on_signal
from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.ledger import LedgerRow, ReadRows
from cotal_trio.devidp import mint_dev_token
from cotal_trio.service.host import Host, HostConfig, run_host
from cotal_trio.lane.spec import LaneCommon
from cotal_trio.service.hosting import FullLanes, lane_factory
from cotal_trio.core.plane import PLANE_KEY, PlaneState, parse_row, plane_bucket
from cotal_trio.natsio import kv_get, open_connection, open_loop
from cotal_trio.state import load_space, read_json
from tests.support.service import Mesh, serving, start_mesh, until, write_manifest

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

AUTH_TIMEOUT_S = 4
CEILING_S = 60
HELD = 4  # connects held in flight at the ledger step
GATE_CAP_S = 20.0  # a held read gives up waiting for the gate after this (the test failed)


class Gate:
    """A ledger port that holds every read until it is opened (armed reads only)."""

    def __init__(self) -> None:
        self.armed = False
        self.opened = threading.Event()
        self.held = 0
        self._lock = threading.Lock()

    def wrap(self, read: ReadRows) -> ReadRows:
        def gated(owner: str, actor: str) -> tuple[LedgerRow | None, LedgerRow | None]:
            if self.armed:
                with self._lock:
                    self.held += 1
                self.opened.wait(GATE_CAP_S)
            return read(owner, actor)
        return gated


@pytest.fixture
async def mesh(nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str) -> Mesh:
    """tests/support/service.py's mesh with space a pushed, with a 4 s auth timeout."""
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin, auth_timeout_s=AUTH_TIMEOUT_S, spaces=("a",))
    return mesh


async def start_host(nursery: trio.Nursery, mesh: Mesh, manifest: Path, gate: Gate) -> Host:
    common = LaneCommon(
        server_url=mesh.server_url, limits=CalloutLimits(auth_timeout_s=AUTH_TIMEOUT_S), clock=time.time, wrap_ledger=gate.wrap,
    )
    start_lane = lane_factory(root=mesh.paths, common=common, lanes=FullLanes())
    config = HostConfig(manifest=manifest, start_lane=start_lane, backstop_s=600, settle_s=0.01)
    host: Host = await nursery.start(run_host, config)
    await until(host, manifest, serving("a"))
    return host


async def hold_connects(mesh: Mesh, bearer: str, gate: Gate, results: list[str], nursery: trio.Nursery) -> None:
    """Start ``HELD`` connects and return once each is held at the ledger step."""
    async def connect() -> None:
        try:
            await mesh.admitted("a", bearer)
        except Exception as exc:  # noqa: BLE001 - the test reports what the client saw
            results.append(f"refused: {exc!r}")
        else:
            results.append("admitted")

    gate.armed = True
    for _ in range(HELD):
        nursery.start_soon(connect)
    while gate.held < HELD:
        await trio.sleep(0.01)


async def until_gone(path: Path) -> None:
    while path.exists():
        await trio.sleep(0.01)


async def test_a_removed_lane_answers_its_in_flight_connects(mesh: Mesh, nursery: trio.Nursery, tmp_path: Path):
    manifest, gate, results = tmp_path / "spaces.json", Gate(), []
    write_manifest(manifest, "a")
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, mesh, manifest, gate)
        mesh.grant("a", "alice", "cli")
        bearer = await mesh.bearer("a", "alice", "cli")
        readiness = mesh.paths.space("a").auth_service_json
        async with trio.open_nursery() as connects:
            await hold_connects(mesh, bearer, gate, results, connects)
            write_manifest(manifest)  # the lane is removed while its connects are in flight
            await until_gone(readiness)  # the stop is under way
            gate.opened.set()
        await until(host, manifest, lambda spaces: spaces == {})
    assert results == ["admitted"] * HELD


async def test_sigterm_drains_in_flight_connects_and_an_exchange(mesh: Mesh, tmp_path: Path):
    """SIGTERM (the CLI's ``stop_on_signal``, as ``cotal auth-service`` and ``systemctl stop``
    reach it) ends the host only after its held connects and a half-sent exchange answered."""
    manifest, gate, results = tmp_path / "spaces.json", Gate(), []
    write_manifest(manifest, "a")
    exchanged: dict[str, object] = {}
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as clients:  # outside the service: SIGTERM cancels the service only
            async with trio.open_nursery() as service:
                service.start_soon(stop_on_signal, service.cancel_scope, "test")
                await start_host(service, mesh, manifest, gate)
                mesh.grant("a", "alice", "cli")
                bearer = await mesh.bearer("a", "alice", "cli")
                readiness = mesh.paths.space("a").auth_service_json
                record = read_json(readiness)
                token = mint_dev_token(mesh.idp, sub="alice", now=int(time.time()))
                body = json.dumps({"idpToken": token, "actor": "cli"}).encode()
                await hold_connects(mesh, bearer, gate, results, clients)
                rest = await start_exchange(clients, record["url"], record["cap"], body, exchanged)

                async def release() -> None:
                    await until_gone(readiness)  # the stop is under way
                    rest()  # the exchange's body, sent after the stop began
                    gate.opened.set()

                clients.start_soon(release)
                signal.raise_signal(signal.SIGTERM)
                await trio.sleep_forever()  # cancelled by the signal, once the host has drained
    assert results == ["admitted"] * HELD
    assert exchanged["status"] == 200, exchanged
    assert json.loads(exchanged["body"])["token"], exchanged


async def start_exchange(
    nursery: trio.Nursery, url: str, cap: str, body: bytes, out: dict[str, object]
) -> Callable[[], None]:
    """``POST /exchange`` with only the first half of ``body`` sent; returns the function that
    sends the rest. The answer's status and body land in ``out``."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    head = (
        f"POST /exchange HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {cap}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    half = len(body) // 2
    await stream.send_all(head + body[:half])
    rest = trio.Event()

    async def finish() -> None:
        async with stream:
            await rest.wait()
            await stream.send_all(body[half:])
            answer = b""
            while chunk := await stream.receive_some():
                answer += chunk
        status_line, _, tail = answer.partition(b"\r\n")
        out["status"] = int(status_line.split()[1]) if status_line else None
        out["body"] = tail.partition(b"\r\n\r\n")[2]

    nursery.start_soon(finish)
    await trio.sleep(0.2)  # hypercorn has read the headers by now: the request is in flight
    return rest.set


async def test_a_removed_lane_releases_its_plane_claim(mesh: Mesh, nursery: trio.Nursery, tmp_path: Path, caplog):
    """A clean stop releases the space's plane claim by CAS before its store session closes
    (found by the issue 15 fresh-user check: nearly every stop logged "plane claim generation N
    not released (... the connection closed)" because the renewed store user's task closed the
    session while the claim keeper's shielded release still needed it)."""
    manifest = tmp_path / "spaces.json"
    write_manifest(manifest, "a")
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, mesh, manifest, Gate())  # unarmed: reads pass
        write_manifest(manifest)  # the lane is removed
        await until(host, manifest, lambda spaces: spaces == {})
    assert [r.getMessage() for r in caplog.records if "not released" in r.getMessage()] == []
    material = load_space(mesh.paths.space("a").callout_json, "a")
    now = int(time.time())
    creds = provision.mint_service_user(
        material, name="test-plane-reader", permissions={"pub": {"allow": ["$JS.API.>"]}, "sub": {"allow": ["_INBOX.>"]}},
        iat=now, exp=now + 120,
    )
    async with open_loop(), open_connection(mesh.server_url, creds=creds, name="test-plane-reader", reconnect=False) as conn:
        entry = await kv_get(conn, plane_bucket("a"), PLANE_KEY)
    assert entry is not None and parse_row(entry.value).state is PlaneState.RELEASED
