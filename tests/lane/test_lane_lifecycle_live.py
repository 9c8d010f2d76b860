"""Issue 3, "Tests (real nats-server)": a lane added and removed many times leaks nothing.

A lane host (``run_host`` on a manifest, as ``cotal auth-service --spaces`` runs it) follows
its manifest through the folder watcher only (no SIGHUP, no backstop): the test writes the
manifest with space ``a``, awaits ``.applied`` showing it ``serving``, writes it empty, awaits
``.applied`` without it (written only once the lane has fully stopped, DESIGN.md 9), and again.

Under ``error::ResourceWarning`` (pyproject's filterwarnings; every warning is also recorded
here, because a ResourceWarning raised inside ``__del__`` is only reported as "unraisable"
and would not fail the test by itself), no warning may appear and the process's open file
descriptors must return to their count before the cycles.

Why the baseline is taken after one full cycle: the first lane started in a process can create
descriptors that last for the process's life and belong to no lane (trio's wakeup socket pair
for ``to_thread``/``run_sync_soon``, the thread cache, the event loop policy's first loop,
lazily opened module files). Here the ``mesh`` fixture has already opened a loop and pushed
the accounts, and the first cycle was measured to add none, but counting from after it keeps
the question exact whatever ran before: does cycle *n* leave anything behind?

Sizes: 200 cycles of a callout-only lane (callout connection and subscription) and 20 of a full
lane (it also holds the plane claim over a store connection and binds an HTTP listener). A cycle
takes about 0.2 s either way, mostly the watcher's latency (watchfiles yields a batch after
~50 ms of quiet) plus the 10 ms settle, twice per cycle, so 200 full cycles on top of the 200
callout-only ones would take the file to ~90 s, over its ~60 s budget on 2 cores. A full lane's
removal releases its plane claim, so the re-add takes the claim at once (generation + 1 over a
``released`` row) instead of being refused for a lease.
"""

from __future__ import annotations

import gc
import os
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from cotal_trio.broker.provision import mint_service_user
from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.plane import (
    PLANE_KEY,
    PlaneRow,
    PlaneState,
    parse_row,
    plane_bucket,
)
from cotal_trio.service.host import Host, HostConfig, run_host
from cotal_trio.lane.spec import LaneCommon
from cotal_trio.service.hosting import FullLanes, ReplicaLanes, lane_factory
from cotal_trio.natsio import kv_get, open_connection, open_loop
from cotal_trio.state import load_space
from tests.support.service import AUTH_TIMEOUT_S, Mesh, applied_spaces, start_mesh, write_manifest

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

SPACE = "a"
CALLOUT_ONLY_CYCLES = 200
FULL_CYCLES = 20
# The host rereads 10 ms after the watcher's event (production: 100 ms) to keep 200 cycles short.
SETTLE_S = 0.01


@pytest.fixture
async def mesh(nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str) -> Mesh:
    """As tests/support/service.py's ``mesh`` fixture."""
    return (await start_mesh(nursery, tmp_path, nats_server_bin))[0]


def open_fds() -> dict[int, str]:
    """This process's open file descriptors and what each points at."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except FileNotFoundError:  # the listing's own descriptor, closed by now
            pass
    return fds


@contextmanager
def recorded_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """Every ResourceWarning raised in the block, including those from ``__del__`` (gc)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield caught


async def start_host(mesh: Mesh, nursery: trio.Nursery, folder: Path, *, callout_only: bool) -> tuple[Host, Path]:
    folder.mkdir()
    manifest = folder / "spaces.json"
    write_manifest(manifest)
    start_lane = lane_factory(
        root=mesh.paths, common=LaneCommon(server_url=mesh.server_url, limits=CalloutLimits(auth_timeout_s=AUTH_TIMEOUT_S), clock=time.time),
        lanes=ReplicaLanes() if callout_only else FullLanes(),
    )
    config = HostConfig(
        manifest=manifest, start_lane=start_lane, callout_only=callout_only,
        settle_s=SETTLE_S, backstop_s=600,  # only the watcher triggers rereads
    )
    return await nursery.start(run_host, config), manifest


async def add_and_serve(host: Host, manifest: Path) -> None:
    """Add the space to the manifest; await ``.applied`` past ``starting``: it must be serving."""
    write_manifest(manifest, SPACE)
    while applied_spaces(manifest).get(SPACE, {}).get("state") in (None, "starting"):
        await host.wait_written()
    assert applied_spaces(manifest)[SPACE] == {"state": "serving"}


async def cycle(host: Host, manifest: Path) -> None:
    """Add the space and await ``serving``; remove it and await its absence from ``.applied``."""
    await add_and_serve(host, manifest)
    write_manifest(manifest)
    while applied_spaces(manifest):
        await host.wait_written()


async def run_cycles(host: Host, manifest: Path, count: int) -> None:
    """One warm-up cycle, then ``count`` cycles that must leave no descriptor or warning."""
    await cycle(host, manifest)
    with recorded_warnings() as caught:
        gc.collect()
        before = open_fds()
        for _ in range(count):
            await cycle(host, manifest)
        gc.collect()  # a leaked socket or loop warns from its finalizer
        after = open_fds()
    assert [str(w.message) for w in caught] == []
    leaked = Counter(after.values()) - Counter(before.values())
    assert len(after) == len(before), (len(before), len(after), dict(leaked))


async def test_callout_only_lane_added_and_removed_200_times(mesh: Mesh, nursery: trio.Nursery, tmp_path: Path):
    with trio.fail_after(90):  # measured ~42 s on 2 cores, mostly the watcher's latency
        host, manifest = await start_host(mesh, nursery, tmp_path / "host", callout_only=True)
        await run_cycles(host, manifest, CALLOUT_ONLY_CYCLES)
        assert host.current_states() == {}


async def test_full_lane_added_and_removed_20_times(mesh: Mesh, nursery: trio.Nursery, tmp_path: Path):
    with trio.fail_after(60):
        host, manifest = await start_host(mesh, nursery, tmp_path / "host", callout_only=False)
        await run_cycles(host, manifest, FULL_CYCLES)
        assert not mesh.paths.space(SPACE).auth_service_json.exists()
        # Every removal released the claim (state released) and every add took it at once,
        # one generation more each time: the warm-up cycle created generation 1.
        row = await plane_row(mesh)
        assert (row.state, row.generation) == (PlaneState.RELEASED, 1 + FULL_CYCLES)
        # Added once more, the lane serves clients (the claim is free, the face is new).
        await add_and_serve(host, manifest)
        mesh.grant(SPACE, "alice", "cli")
        await mesh.admitted(SPACE, await mesh.bearer(SPACE, "alice", "cli"))
        row = await plane_row(mesh)
        assert (row.state, row.generation) == (PlaneState.HELD, 2 + FULL_CYCLES)


async def plane_row(mesh: Mesh) -> PlaneRow:
    """The space's plane claim row, read by a short-lived data-account service user."""
    material = load_space(mesh.paths.space(SPACE).callout_json, SPACE)
    now = int(time.time())
    creds = mint_service_user(
        material, name="test-plane-reader",
        permissions={"pub": {"allow": ["$JS.API.>"]}, "sub": {"allow": ["_INBOX.>"]}},
        iat=now, exp=now + 120,
    )
    async with open_loop(), open_connection(mesh.server_url, creds=creds, name="test-plane-reader", reconnect=False) as conn:
        entry = await kv_get(conn, plane_bucket(SPACE), PLANE_KEY)
    assert entry is not None
    return parse_row(entry.value)
