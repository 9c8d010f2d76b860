"""Issue 3, "Tests (real nats-server)": replicas carry the callout, and a holder fences itself.

Replica failover runs real processes, as an operator would: one full ``cotal auth-service
--space a`` and two ``--callout-only`` replicas of it, all in the space's callout queue group
on one operator-mode broker. Killing the full service (SIGKILL) leaves the replicas admitting
every connect; their callout log lines show that both answered.

The fence tests run a full lane inside a lane host (``run_host``) with a short plane lease
(``FullLane.lease``), and make it lose its claim for real, with no mock:

* the broker is paused (SIGSTOP), so no renewal can succeed: the holder fences itself
  ``lease - margin`` after its last renewal, before a contender may reclaim; once the broker
  resumes, the host's retry is refused while the old row is fresh and takes the claim back
  (generation + 1) only once that row has gone unrenewed for a full lease;
* another holder's row is written over the claim: the holder's next compare-and-set renewal
  fails, it fences at once; the retry is refused while the other holder holds the claim, and
  takes it (generation + 1) once that holder releases it.

Every process and broker here was started by the test and is stopped by it, by pid.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from cotal_trio.broker import provision
from cotal_trio.broker.accounts import open_system_connection
from cotal_trio.broker.provision import mint_service_user
from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.idp import parse_jwks
from cotal_trio.core.manifest import SpaceEntry
from cotal_trio.core.plane import (
    PLANE_KEY,
    Lease,
    PlaneRow,
    PlaneState,
    parse_row,
    plane_bucket,
    render_row,
)
from cotal_trio.devidp import jwks
from cotal_trio.service.host import Host, HostConfig, run_host
from cotal_trio.lane.run import run_lane
from cotal_trio.lane.spec import FullLane, LaneCommon
from cotal_trio.natsio import (
    Connection,
    KvEntry,
    kv_get,
    kv_update,
    open_connection,
    open_loop,
)
from cotal_trio.state import load_space
from tests.support.service import (
    AUTH_TIMEOUT_S,
    Mesh,
    refused,
    start_mesh,
    write_manifest,
    SPACE,
    until_state,
)

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

READY = "✓ auth-service up"
CALLOUT_NAME = f"cotal:auth-service:{SPACE}"  # the callout connection's name (lane/run.py)
MINTED = re.compile(rf"^auth callout: level=\w+ outcome=minted space={SPACE} req=U[A-Z2-7]+ ")
# A short plane lease: renewals every 4/3 s, the holder fences 2.5 s after its last renewal,
# a contender may reclaim 4 s after it.
LEASE = Lease(lease_s=4.0, margin_s=1.5)
RETRY_S = 0.5  # the host retries a failed lane this often (production: 5 s)


@dataclass(frozen=True)
class Broker:
    """test_auth_service_live's ``mesh`` (spaces a, b, c pushed) and its broker's pid."""

    mesh: Mesh
    pid: int


@pytest.fixture
async def broker(nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str) -> Broker:
    """As ``mesh``, plus the nats-server pid (the fence test pauses that process)."""
    return Broker(*await start_mesh(nursery, tmp_path, nats_server_bin))


# --- replica failover: real `cotal auth-service` processes ----------------------------------


@dataclass(eq=False)
class Service:
    """A ``cotal auth-service`` child process and the lines it has written so far."""

    proc: trio.Process
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)

    def minted(self) -> int:
        return sum(1 for line in self.err if MINTED.match(line))

    def callout_lines(self) -> list[str]:
        return [line for line in self.err if line.startswith("auth callout:")]


class Services:
    """The ``cotal auth-service`` children of one test; their output is read in ``nursery``."""

    def __init__(self, nursery: trio.Nursery, mesh: Mesh) -> None:
        self.started: list[Service] = []
        self._nursery, self._mesh = nursery, mesh
        self._changed = trio.Event()

    async def start(self, *flags: str) -> Service:
        """Start ``cotal auth-service --space a`` with ``flags``; return once its banner is out."""
        argv = [
            sys.executable, "-m", "cotal_trio", "auth-service", "--space", SPACE,
            "--server", self._mesh.server_url, "--root", str(self._mesh.paths.root),
            "--auth-timeout", str(AUTH_TIMEOUT_S), *flags,
        ]
        proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        service = Service(proc)
        self.started.append(service)
        self._nursery.start_soon(self._read, proc.stdout, service.out)
        self._nursery.start_soon(self._read, proc.stderr, service.err)
        await self.wait_until(lambda: any(line.startswith(READY) for line in service.out))
        return service

    async def wait_until(self, done: Callable[[], bool]) -> None:
        """Await new output of any child until ``done()`` holds.

        Raises:
            AssertionError: a child exited (its output is in the message).
        """
        while not done():
            for service in self.started:
                if service.proc.returncode is not None and service.proc.returncode != -signal.SIGKILL:
                    raise AssertionError(f"auth-service exited {service.proc.returncode}: {service.out} {service.err}")
            await self._changed.wait()

    async def stop_all(self) -> None:
        """SIGTERM every child this test started, SIGKILL after 5 s; reap them all."""
        with trio.CancelScope(shield=True):
            for service in self.started:
                if service.proc.returncode is None:
                    service.proc.terminate()
            for service in self.started:
                with trio.move_on_after(5):
                    await service.proc.wait()
                if service.proc.returncode is None:
                    service.proc.kill()
                    await service.proc.wait()

    async def _read(self, stream: trio.abc.ReceiveStream, lines: list[str]) -> None:
        """Collect ``stream``'s lines until EOF, then close it."""
        async with stream:
            pending = b""
            while chunk := await stream.receive_some():
                pending += chunk
                *done, pending = pending.split(b"\n")
                lines.extend(line.decode() for line in done)
                self._wake()
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


async def callout_connections(mesh: Mesh) -> int:
    """How many connections named ``cotal:auth-service:a`` the broker has (system CONNZ)."""
    material = provision.ensure_root(mesh.paths, iat=int(time.time()))
    async with open_loop(), open_system_connection(mesh.server_url, material) as system:
        reply = await system.request("$SYS.REQ.SERVER.PING.CONNZ", json.dumps({"limit": 4096}).encode())
    connections = json.loads(reply.data)["data"]["connections"]
    return sum(1 for conn in connections if conn.get("name") == CALLOUT_NAME)


async def admit_all(mesh: Mesh, bearer: str, count: int) -> None:
    for _ in range(count):
        await mesh.admitted(SPACE, bearer)


async def test_replicas_keep_admitting_when_the_full_service_is_killed(broker: Broker):
    mesh = broker.mesh
    with trio.fail_after(60):
        async with trio.open_nursery() as readers:
            services = Services(readers, mesh)
            try:
                full = await services.start()
                replicas = [await services.start("--callout-only") for _ in range(2)]
                assert await callout_connections(mesh) == 3
                mesh.grant(SPACE, "alice", "cli")
                bearer = await mesh.bearer(SPACE, "alice", "cli")  # from the full service's face

                # All three answer in the queue group: 30 connects, 30 minted lines in all.
                await admit_all(mesh, bearer, 30)
                await services.wait_until(lambda: sum(s.minted() for s in services.started) >= 30)
                assert sum(s.minted() for s in services.started) == 30
                before = [r.minted() for r in replicas]

                full.proc.kill()  # SIGKILL: no clean stop, no release, no unsubscribe
                assert await full.proc.wait() == -signal.SIGKILL
                # The broker drops the dead process's connection (and its queue subscription)
                # as soon as it reads the socket's EOF: two callout responders remain.
                while (remaining := await callout_connections(mesh)) == 3:
                    await trio.sleep(0.01)
                assert remaining == 2

                # Every connect is admitted, each answered by exactly one replica.
                await admit_all(mesh, bearer, 50)
                await services.wait_until(lambda: sum(r.minted() for r in replicas) >= sum(before) + 50)
                answered = [r.minted() - b for r, b in zip(replicas, before, strict=True)]
                assert sum(answered) == 50, answered
                assert all(n > 0 for n in answered), answered  # the queue group spreads them
                for service in services.started:
                    assert len(service.callout_lines()) == service.minted(), service.callout_lines()
                assert [r.proc.returncode for r in replicas] == [None, None]
            finally:
                await services.stop_all()
    assert [r.proc.returncode for r in replicas] == [0, 0]  # SIGTERM: a clean stop


# --- fence on lost renewal: a full lane in a host, a short lease ----------------------------


def store_creds(mesh: Mesh, *, write: bool) -> str:
    """A short-lived data-account service user that reads (and may write) space a's auth bucket."""
    material = load_space(mesh.paths.space(SPACE).callout_json, SPACE)
    publish = ["$JS.API.>", *([f"$KV.{plane_bucket(SPACE)}.>"] if write else [])]
    now = int(time.time())
    return mint_service_user(
        material, name="test-plane", permissions={"pub": {"allow": publish}, "sub": {"allow": ["_INBOX.>"]}},
        iat=now, exp=now + 120,
    )


@asynccontextmanager
async def plane_store(mesh: Mesh, *, write: bool = False) -> AsyncIterator[Connection]:
    async with open_loop(), open_connection(
        mesh.server_url, creds=store_creds(mesh, write=write), name="test-plane", reconnect=False
    ) as conn:
        yield conn


async def plane_entry(conn: Connection) -> tuple[PlaneRow, KvEntry]:
    entry = await kv_get(conn, plane_bucket(SPACE), PLANE_KEY)
    assert entry is not None
    return parse_row(entry.value), entry


async def start_full_lane_host(
    mesh: Mesh, nursery: trio.Nursery, folder: Path, *, holder: str | None = None
) -> tuple[Host, Path]:
    """A host on a manifest naming space a, whose full lane holds the claim with ``LEASE``
    (as ``holder`` on every start, as lane_factory does; None: a fresh holder per start)."""
    keys = parse_jwks(jwks(mesh.idp))

    def start_lane(entry: SpaceEntry) -> Callable[..., object]:
        return functools.partial(run_lane, FullLane(
            space=entry.space, paths=mesh.paths.space(entry.space),
            common=LaneCommon(server_url=mesh.server_url, limits=CalloutLimits(auth_timeout_s=AUTH_TIMEOUT_S)),
            idp_keys=lambda: keys, lease=LEASE, holder=holder,
        ))

    folder.mkdir()
    manifest = folder / "spaces.json"
    write_manifest(manifest, SPACE)
    host = await nursery.start(run_host, HostConfig(
        manifest=manifest, start_lane=start_lane, retry_s=RETRY_S, backstop_s=600,
    ))
    await until_state(host, manifest, "serving")
    return host, manifest


def our_holder(row: PlaneRow) -> bool:
    return row.holder.startswith(f"{socket.gethostname()}:{os.getpid()}:")


async def next_renewal(conn: Connection, after: KvEntry) -> tuple[PlaneRow, KvEntry]:
    """Poll the claim row until the holder's next renewal lands (nats KV has no watch in natsio)."""
    while True:
        row, entry = await plane_entry(conn)
        if entry.revision != after.revision:
            return row, entry
        await trio.sleep(0.02)


async def serving_with_a_client(mesh: Mesh, nursery: trio.Nursery, tmp_path: Path) -> tuple[Host, Path, str]:
    """A full lane host serving SPACE, and a bearer of alice's ``cli`` it has admitted once."""
    host, manifest = await start_full_lane_host(mesh, nursery, tmp_path / "host")
    mesh.grant(SPACE, "alice", "cli")
    bearer = await mesh.bearer(SPACE, "alice", "cli")
    await mesh.admitted(SPACE, bearer)
    return host, manifest, bearer


async def test_a_holder_that_cannot_renew_fences_before_its_lease_runs_out(broker: Broker, nursery: trio.Nursery, tmp_path: Path):
    mesh = broker.mesh
    with trio.fail_after(40):
        host, manifest, bearer = await serving_with_a_client(mesh, nursery, tmp_path)
        wall_minus_trio = time.time() - trio.current_time()
        async with plane_store(mesh) as conn:
            acquired, entry = await plane_entry(conn)
            # Pause the broker right after a renewal has landed (its acknowledgement is already
            # on its way to the holder): that renewal is the holder's last successful one.
            held, _ = await next_renewal(conn, entry)
            os.kill(broker.pid, signal.SIGSTOP)
        assert (held.holder, held.generation, held.state) == (acquired.holder, 1, PlaneState.HELD)
        assert our_holder(held)
        renewed_at = held.renewed_at - wall_minus_trio  # in trio time
        try:
            status = await until_state(host, manifest, "retrying")
            fenced_at = trio.current_time()  # `.applied` says retrying once the lane has fully stopped
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        assert status["reason"] == f"space {SPACE}: plane claim generation 1 fenced: no renewal for 2.5 s"
        # It fenced at its fence point (lease - margin after the last renewal), not before, and
        # had stopped before the lease ran out, the earliest a contender may reclaim.
        assert renewed_at + LEASE.fence_after_s - 0.05 <= fenced_at < renewed_at + LEASE.lease_s, (
            fenced_at - renewed_at, LEASE,
        )

        # The holder wrote nothing after its fence. A renewal it gave up on at the fence point may
        # still have landed once the broker resumed (its renewedAt is then later, which only
        # delays a reclaim); either way the row is generation 1 of the same holder, held.
        async with plane_store(mesh) as conn:
            last, _ = await plane_entry(conn)
        assert (last.holder, last.generation, last.state) == (held.holder, 1, PlaneState.HELD)
        assert last.renewed_at - wall_minus_trio < fenced_at

        # The host's retry takes the claim back only once the row has gone unrenewed a full lease.
        await until_state(host, manifest, "serving")
        back_at = trio.current_time()
        assert back_at >= last.renewed_at - wall_minus_trio + LEASE.lease_s, (back_at - renewed_at, LEASE)
        async with plane_store(mesh) as conn:
            mine, _ = await plane_entry(conn)
        assert (mine.generation, mine.state) == (2, PlaneState.HELD) and our_holder(mine)
        assert mine.holder != held.holder  # a new lane start is a new holder
        await mesh.admitted(SPACE, bearer)


async def test_a_holder_whose_row_is_taken_fences_at_its_next_renewal(broker: Broker, nursery: trio.Nursery, tmp_path: Path):
    mesh = broker.mesh
    with trio.fail_after(40):
        host, manifest, bearer = await serving_with_a_client(mesh, nursery, tmp_path)

        async with plane_store(mesh, write=True) as conn:
            # Another holder writes its row over the holder's latest renewal (compare-and-set on
            # that renewal's revision, so `held.renewed_at` is the holder's last renewal).
            held, entry = await plane_entry(conn)
            assert held.state is PlaneState.HELD and our_holder(held)
            wall_minus_trio = time.time() - trio.current_time()
            other = PlaneRow(
                generation=held.generation + 1, holder="test-contender:1:00000000", state=PlaneState.HELD,
                renewed_at=time.time(), lease_s=60.0,
            )
            revision = await kv_update(conn, plane_bucket(SPACE), PLANE_KEY, render_row(other), last_revision=entry.revision)

            status = await until_state(host, manifest, "retrying")
            fenced_at = trio.current_time()
            assert status["reason"] == (
                f"space {SPACE}: plane claim generation {held.generation} fenced: the plane claim row"
                f" is now held by {other.holder} (generation {other.generation})"
            )
            # Fenced at its next renewal: before its own fence point, long before its lease ran out.
            renewed_at = held.renewed_at - wall_minus_trio
            assert fenced_at < renewed_at + LEASE.fence_after_s, (fenced_at - renewed_at, LEASE)

            # The retry is refused while the other holder holds the claim; the lane does not serve.
            await until_state(host, manifest, "retrying", f"space {SPACE}: space held by {other.holder}")
            with refused():
                await mesh.admitted(SPACE, bearer)
            assert await plane_entry(conn) == (other, KvEntry(key=PLANE_KEY, value=render_row(other), revision=revision))

            # The other holder stops cleanly (releases): the next retry takes the claim at once.
            released = PlaneRow(
                generation=other.generation, holder=other.holder, state=PlaneState.RELEASED,
                renewed_at=time.time(), lease_s=other.lease_s,
            )
            await kv_update(conn, plane_bucket(SPACE), PLANE_KEY, render_row(released), last_revision=revision)
            released_at = trio.current_time()
            await until_state(host, manifest, "serving")
            assert trio.current_time() - released_at < RETRY_S + 2.0
            mine, _ = await plane_entry(conn)
        assert (mine.generation, mine.state) == (other.generation + 1, PlaneState.HELD) and our_holder(mine)
        await mesh.admitted(SPACE, bearer)
        await mesh.admitted(SPACE, await mesh.bearer(SPACE, "alice", "cli"))  # the new face exchanges


async def test_a_host_restarting_its_fenced_lane_takes_its_own_claim_back_at_once(
    broker: Broker, nursery: trio.Nursery, tmp_path: Path
):
    """With one holder id across a lane's restarts (lane_factory's), the retry after a broker
    pause does not wait out its own lease: the stopped start's row is taken back, generation 2."""
    mesh = broker.mesh
    holder = f"{socket.gethostname()}:{os.getpid()}:5ab1e000"
    with trio.fail_after(40):
        host, manifest = await start_full_lane_host(mesh, nursery, tmp_path / "host", holder=holder)
        mesh.grant(SPACE, "alice", "cli")
        bearer = await mesh.bearer(SPACE, "alice", "cli")
        async with plane_store(mesh) as conn:
            _, entry = await plane_entry(conn)
            await next_renewal(conn, entry)
            os.kill(broker.pid, signal.SIGSTOP)
        try:
            await until_state(host, manifest, "retrying", f"space {SPACE}: plane claim generation 1 fenced")
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        resumed = trio.current_time()
        await until_state(host, manifest, "serving")
        # The next retry (RETRY_S) or the one after serves; a full lease (4 s) is never waited.
        assert trio.current_time() - resumed < LEASE.lease_s - 1, trio.current_time() - resumed
        async with plane_store(mesh) as conn:
            row, _ = await plane_entry(conn)
        assert (row.holder, row.generation, row.state) == (holder, 2, PlaneState.HELD)
        await mesh.admitted(SPACE, bearer)
