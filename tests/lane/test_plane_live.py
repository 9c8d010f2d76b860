"""The plane claim keeper on a real nats-server with JetStream (DESIGN.md section 8, issue 3 item 5).

Real time with a short lease (1.5 s, margin 0.3 s: renew every 0.5 s, fence after 1.2 s); every
test has a ceiling.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator

import pytest
import trio

from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.core.plane import (
    PLANE_KEY,
    Lease,
    PlaneRow,
    PlaneState,
    parse_row,
    plane_bucket,
    render_row,
)
from cotal_trio.lane.plane import ClaimRefused, Fenced, hold_plane, holder_id
from cotal_trio.natsio import (
    Connection,
    delete_bucket,
    ensure_bucket,
    kv_create,
    kv_get,
    kv_put,
    open_connection,
    open_loop,
)

CEILING_S = 20
SPACE = "alpha"
BUCKET = plane_bucket(SPACE)
LEASE = Lease(lease_s=1.5, margin_s=0.3)
# Scheduling and broker round trips on a busy CI host.
SLACK_S = 0.3


@pytest.fixture
async def conn(plain_broker: str) -> AsyncIterator[Connection]:
    async with open_loop(), open_connection(plain_broker, name="plane") as connection:
        yield connection


def holder(conn: Connection, name: str):
    return functools.partial(hold_plane, conn, SPACE, holder=name, lease=LEASE, clock=time.time)


async def stored(conn: Connection) -> tuple[PlaneRow, int]:
    entry = await kv_get(conn, BUCKET, PLANE_KEY)
    assert entry is not None
    return parse_row(entry.value), entry.revision


async def test_first_holds_second_refused_then_takes_over_after_release(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as first:
            assert await first.start(holder(conn, "first:1:aa")) == 1
            row, rev1 = await stored(conn)
            assert (row.generation, row.holder, row.state) == (1, "first:1:aa", PlaneState.HELD)
            with pytest.raises(ClaimRefused) as refused:
                await hold_plane(conn, SPACE, holder="second:2:bb", lease=LEASE, clock=time.time)
            # Renewals keep the claim past two full leases: still refused, row renewed.
            await trio.sleep(2 * LEASE.lease_s)
            renewed, rev2 = await stored(conn)
            with pytest.raises(ClaimRefused):
                await hold_plane(conn, SPACE, holder="second:2:bb", lease=LEASE, clock=time.time)
            first.cancel_scope.cancel()
        released, _ = await stored(conn)
        async with trio.open_nursery() as second:
            assert await second.start(holder(conn, "second:2:bb")) == 2
            taken, _ = await stored(conn)
            second.cancel_scope.cancel()
    assert isinstance(refused.value, ConfigError) and refused.value.space == SPACE
    assert refused.value.reason.startswith(
        "space held by first:1:aa (generation 1) - stop that auth service, or wait 1.5 s after it"
        " stops renewing"
    )
    assert str(refused.value).startswith("space alpha: space held by first:1:aa (generation 1)")
    assert rev2 > rev1 and renewed.renewed_at > row.renewed_at
    assert renewed.generation == 1 and renewed.state is PlaneState.HELD
    assert (released.generation, released.holder, released.state) == (
        1, "first:1:aa", PlaneState.RELEASED
    )
    assert (taken.generation, taken.holder, taken.state) == (2, "second:2:bb", PlaneState.HELD)


async def test_vanished_holder_is_reclaimed_only_after_a_full_lease(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, BUCKET, history=1, allow_msg_ttl=True)
        renewed_at = time.time()
        ghost = PlaneRow(generation=7, holder="ghost:9:cc", state=PlaneState.HELD,
                         renewed_at=renewed_at, lease_s=LEASE.lease_s)
        await kv_create(conn, BUCKET, PLANE_KEY, render_row(ghost))
        # Past the ghost's own fence point but short of a full lease: still refused.
        await trio.sleep(renewed_at + LEASE.lease_s - SLACK_S - time.time())
        with pytest.raises(ClaimRefused, match="space held by ghost:9:cc \\(generation 7\\)"):
            await hold_plane(conn, SPACE, holder="new:1:dd", lease=LEASE, clock=time.time)
        await trio.sleep(renewed_at + LEASE.lease_s - time.time())
        async with trio.open_nursery() as nursery:
            assert await nursery.start(holder(conn, "new:1:dd")) == 8
            taken_at = time.time()
            taken, _ = await stored(conn)
            nursery.cancel_scope.cancel()
    assert renewed_at + LEASE.lease_s <= taken.renewed_at <= taken_at
    assert (taken.generation, taken.holder) == (8, "new:1:dd")
    assert taken_at - renewed_at < 2 * LEASE.lease_s  # issue 3: takeover within two leases


async def test_holder_unrenewed_for_a_full_lease_is_reclaimed_at_once(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, BUCKET, history=1, allow_msg_ttl=True)
        ghost = PlaneRow(generation=3, holder="ghost:9:cc", state=PlaneState.HELD,
                         renewed_at=time.time() - LEASE.lease_s, lease_s=LEASE.lease_s)
        await kv_create(conn, BUCKET, PLANE_KEY, render_row(ghost))
        async with trio.open_nursery() as nursery:
            assert await nursery.start(holder(conn, "new:1:dd")) == 4
            nursery.cancel_scope.cancel()


async def test_unreadable_row_is_refused_and_kept(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, BUCKET, history=1, allow_msg_ttl=True)
        await kv_create(conn, BUCKET, PLANE_KEY, b"{garbage")
        with pytest.raises(ClaimRefused, match="plane claim row is unreadable"):
            await hold_plane(conn, SPACE, holder="new:1:dd", lease=LEASE, clock=time.time)
        entry = await kv_get(conn, BUCKET, PLANE_KEY)
    assert entry is not None and entry.value == b"{garbage"


async def run_until_fenced(conn: Connection, name: str, break_it) -> tuple[Fenced, float]:
    """Start a holder, call ``break_it()``, and return (the Fenced error, seconds it took)."""
    fenced: list[BaseException] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(holder(conn, name))
            await break_it()
            broken_at = trio.current_time()
            await trio.sleep_forever()
    except* Fenced as group:
        fenced.extend(group.exceptions)
    took = trio.current_time() - broken_at
    assert len(fenced) == 1 and isinstance(fenced[0], Fenced)
    return fenced[0], took


async def test_lost_store_fences_within_lease_minus_margin(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        error, took = await run_until_fenced(
            conn, "first:1:aa", functools.partial(delete_bucket, conn, BUCKET)
        )
    # Renewals fail from the deletion on; the last good one was at most one period before it.
    assert LEASE.fence_after_s - LEASE.renew_every_s - SLACK_S <= took
    assert took <= LEASE.fence_after_s + SLACK_S
    assert isinstance(error, Unavailable) and (error.space, error.generation) == (SPACE, 1)
    assert "no renewal for 1.2 s" in str(error)


async def test_row_taken_under_the_holder_fences_at_its_next_renewal(conn: Connection) -> None:
    intruder = PlaneRow(generation=5, holder="intruder:3:ee", state=PlaneState.HELD,
                        renewed_at=time.time(), lease_s=LEASE.lease_s)

    async def overwrite() -> None:
        await kv_put(conn, BUCKET, PLANE_KEY, render_row(intruder))

    with trio.fail_after(CEILING_S):
        error, took = await run_until_fenced(conn, "first:1:aa", overwrite)
        row, _ = await stored(conn)
    assert took <= LEASE.renew_every_s + SLACK_S
    assert "now held by intruder:3:ee (generation 5)" in str(error)
    assert row == intruder  # a fenced holder does not release (or touch) the row


def test_holder_id_shape() -> None:
    host, pid, rand = holder_id().rsplit(":", 2)
    assert host and pid.isdigit() and len(rand) == 8 and holder_id() != holder_id()
