"""The plane claim keeper of a full auth-service lane (DESIGN.md sections 5 and 8).

:func:`hold_plane` runs in the lane's nursery (``await nursery.start(hold_plane, ...)``). It takes
the claim or refuses (:class:`ClaimRefused`), reports the generation it holds, renews the row by
compare-and-set every ``lease_s / 3``, and raises :class:`Fenced` when it has not renewed for
``lease_s - margin_s`` or finds the row taken: the error cancels the lane's nursery, so the lane
stops serving before a contender may reclaim (contenders wait a full lease). Cancelled (a clean
stop), it writes ``released`` by compare-and-set in a shielded, bounded ``finally``; if that
fails the row stays ``held`` and the next holder reclaims it after a full lease.

Schedules use trio time (``trio.sleep_until``); the row's ``renewedAt`` comes from the injected
wall ``clock``. Replicas never call this.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable

import trio

from cotal_trio.core import wire
from cotal_trio.core.errors import CodecError, ConfigError, Unavailable
from cotal_trio.core.plane import (
    PLANE_KEY,
    Acquire,
    Lease,
    PlaneRow,
    PlaneState,
    Refuse,
    decide_acquire,
    decide_renew,
    must_fence,
    parse_row,
    plane_bucket,
    release,
    render_row,
)
from cotal_trio.natsio import (
    Connection,
    KeyExists,
    WrongRevision,
    ensure_bucket,
    kv_create,
    kv_get,
    kv_update,
)

__all__ = ["DEFAULT_LEASE", "RELEASE_S", "ClaimRefused", "Fenced", "hold_plane", "holder_id"]

log = logging.getLogger("cotal.plane")

DEFAULT_LEASE = Lease()
# The shielded release on a clean stop gets this long.
RELEASE_S = 2.0
# Acquire: the first attempt plus one re-read after a compare-and-set conflict.
ACQUIRE_ATTEMPTS = 2
# After a failed renewal, try again this fraction of the lease later (until the fence point).
RETRY_FRACTION = 1 / 15


class ClaimRefused(ConfigError):
    """Another full auth service holds the space (or its row is unreadable).

    Attributes:
        space: the space.
        reason: the core's sentence (names the holder and when it may be reclaimed).
    """

    def __init__(self, space: str, reason: str) -> None:
        super().__init__(f"space {space}: {reason}")
        self.space = space
        self.reason = reason


class Fenced(Unavailable):
    """The holder lost the claim or could not renew it in time; its lane must stop serving.

    Attributes:
        space: the space.
        generation: the generation that was held.
    """

    def __init__(self, space: str, generation: int, why: str) -> None:
        super().__init__(f"space {space}: plane claim generation {generation} fenced: {why}")
        self.space = space
        self.generation = generation


def holder_id() -> str:
    """A holder id for this process: ``<host name>:<pid>:<8 random hex>``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


async def _acquire(
    conn: Connection, space: str, bucket: str, *, holder: str, lease: Lease, clock: Callable[[], float]
) -> tuple[PlaneRow, int, float]:
    """Take the claim; returns (row written, its revision, trio time the row's clock was read)."""
    for attempt in range(ACQUIRE_ATTEMPTS):
        entry = await kv_get(conn, bucket, PLANE_KEY)
        current = None if entry is None else (entry.value, entry.revision)
        now_t, now_w = trio.current_time(), clock()
        decision = decide_acquire(current, holder=holder, now=now_w, lease=lease)
        if isinstance(decision, Refuse):
            raise ClaimRefused(space, decision.reason)
        assert isinstance(decision, Acquire)
        payload = render_row(decision.row)
        try:
            if decision.kind == "create":
                revision = await kv_create(conn, bucket, PLANE_KEY, payload)
            else:
                assert decision.revision is not None
                revision = await kv_update(
                    conn, bucket, PLANE_KEY, payload, last_revision=decision.revision
                )
        except (KeyExists, WrongRevision):
            if attempt + 1 < ACQUIRE_ATTEMPTS:
                continue  # another contender wrote first: read again and decide again
            raise ClaimRefused(
                space,
                "the plane claim kept changing while this service tried to take it - another auth"
                " service is starting for this space; stop it, or start this one again",
            ) from None
        return decision.row, revision, now_t
    raise AssertionError("unreachable")


async def hold_plane(
    conn: Connection,
    space: str,
    *,
    holder: str,
    lease: Lease = DEFAULT_LEASE,
    clock: Callable[[], float],
    replicas: int = 1,
    copies: dict[str, int] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio: hold ``space``'s plane claim until cancelled; ``started(generation)``.

    Args:
        conn: a connection of the space's data account (JetStream on).
        holder: this service's holder id (:func:`holder_id`).
        lease: lease and fencing margin.
        clock: wall time, unix seconds (the row's ``renewedAt``).
        replicas: the auth bucket's copies, created or scaled up to (issue 17 item 1).
        copies: if given, the bucket's stream and its copies after the ensure are added to it
            before ``started`` (the lane's one "more copies" warning; no second STREAM.INFO).

    Raises:
        ClaimRefused: before ``started``: another service holds the space, or the row is
            unreadable (the sentence names the holder and when it may be reclaimed).
        Fenced: after ``started``: a renewal did not succeed within ``lease_s - margin_s`` of the
            last one, or the row was taken by someone else.
        Unavailable: before ``started``: the bucket or broker did not answer.
        ConfigError: the bucket exists with another shape.
    """
    bucket = plane_bucket(space)
    count = await ensure_bucket(conn, bucket, history=1, allow_msg_ttl=True, replicas=replicas)
    if copies is not None:
        copies[wire.kv_stream(bucket)] = count
    mine, revision, last_t = await _acquire(
        conn, space, bucket, holder=holder, lease=lease, clock=clock
    )
    log.info("space %s: plane claim generation %d held by %s", space, mine.generation, holder)
    fenced = False
    try:
        task_status.started(mine.generation)
        next_t = last_t + lease.renew_every_s
        while True:
            fence_t = last_t + lease.fence_after_s
            await trio.sleep_until(min(next_t, fence_t))
            now_t = trio.current_time()
            if must_fence(last_t, now=now_t, lease=lease):
                fenced = True
                raise Fenced(space, mine.generation, f"no renewal for {lease.fence_after_s:g} s")
            wanted = decide_renew(mine, now=clock(), lease=lease)
            try:
                with trio.move_on_at(fence_t):  # a renewal never outlasts the fence point
                    revision = await _renew(conn, bucket, wanted, revision)
                    mine, last_t = wanted, now_t
                    next_t = now_t + lease.renew_every_s
                    continue
            except _Lost as exc:
                fenced = True
                raise Fenced(space, mine.generation, str(exc)) from None
            except Unavailable as exc:
                log.warning("space %s: plane claim renewal failed: %s", space, exc)
            next_t = min(trio.current_time() + lease.lease_s * RETRY_FRACTION, fence_t)
    finally:
        if not fenced:
            with trio.move_on_after(RELEASE_S, shield=True):
                await _release(conn, space, bucket, mine, revision)


class _Lost(Exception):
    """The stored row is no longer ours."""


async def _renew(conn: Connection, bucket: str, wanted: PlaneRow, revision: int) -> int:
    """One CAS renewal; returns the new revision. Raises _Lost, or Unavailable to retry."""
    try:
        return await kv_update(conn, bucket, PLANE_KEY, render_row(wanted), last_revision=revision)
    except WrongRevision:
        pass
    # Our previous renewal may have landed with its acknowledgement lost: then the stored row
    # is still ours (same holder and generation, held) and we renew on top of it. Anything else
    # means someone else wrote the row.
    entry = await kv_get(conn, bucket, PLANE_KEY)
    if entry is None:
        raise _Lost("the plane claim row was deleted")
    try:
        stored = parse_row(entry.value)
    except CodecError:
        raise _Lost("the plane claim row was overwritten with an unreadable value") from None
    if (stored.holder, stored.generation, stored.state) != (
        wanted.holder, wanted.generation, PlaneState.HELD
    ):
        raise _Lost(
            f"the plane claim row is now {stored.state.value} by {stored.holder}"
            f" (generation {stored.generation})"
        )
    try:
        return await kv_update(
            conn, bucket, PLANE_KEY, render_row(wanted), last_revision=entry.revision
        )
    except WrongRevision:
        raise _Lost("the plane claim row keeps changing under this holder") from None


async def _release(
    conn: Connection, space: str, bucket: str, mine: PlaneRow, revision: int
) -> None:
    """Write ``released`` by CAS; a failure leaves ``held`` (reclaimed after a full lease)."""
    try:
        await kv_update(conn, bucket, PLANE_KEY, render_row(release(mine)), last_revision=revision)
    except (WrongRevision, Unavailable) as exc:
        log.warning(
            "space %s: plane claim generation %d not released (%s); the next holder reclaims it"
            " after a full lease", space, mine.generation, exc,
        )
    else:
        log.info("space %s: plane claim generation %d released", space, mine.generation)
