"""One space's lane: its callout and its loopback exchange face, in one nursery (DESIGN.md 5).

``run_lane`` is a startable (STYLE.md practice 7): ``await nursery.start(run_lane, spec)``
returns a :class:`LaneInfo` once the lane is ready, which is exactly when its readiness signal,
the 0600 ``auth-service.json`` ``{ver, url, pid, cap}`` (plus ``publicUrl`` with a public face),
has been written: after the callout subscription is flushed and every listener is bound (spec
"Exclusive ownership"; DESIGN.md 7).
Cancelling the lane's scope tears down exactly this space, in two steps once it serves (issue
15 item 8; :mod:`cotal_trio.lane.stopping`): first the drain, bounded by ``DRAIN_S`` - the
readiness file is removed, the listeners stop (new connects refused) while their in-flight
exchanges finish, the callout subscription is drained, and every admitted callout is answered
and flushed; then the cancel - the subscription and connection close in natsio's shielded
``finally``. A lane cancelled while it starts stops at once.

A lane that cannot answer is not serving (issue 15 item 11; :mod:`cotal_trio.lane.health`): it
probes its own ledger port and issuance store before it subscribes and while it serves, ends
with the reason when the probe keeps failing (the host then shows it ``retrying``), and its
faces' ``GET /health`` answers 503 with the reason while the last probe failed.

A :class:`~cotal_trio.lane.spec.FullLane` (not a :class:`~cotal_trio.lane.spec.ReplicaLane`) also holds its space's plane claim (DESIGN.md section 8) over
a data-account service-user connection: the keeper starts before the callout subscription, so a
second full service for the space is refused (:class:`~cotal_trio.lane.plane.ClaimRefused`)
before it serves or writes a readiness file, and a fence
(:class:`~cotal_trio.lane.plane.Fenced`) ends the lane. Replicas never touch the claim.

A full lane with ``service_endpoints`` opens its space's service-endpoint admission once it
holds the claim; a replica holds a read-only store connection of its own and, before it
subscribes, refuses a space whose admission is open (spec "Callout replicas";
:mod:`cotal_trio.lane.service_endpoints`). Either connection closing for good ends the lane.
Both kinds write each mint's issuance row over their store connection; only a full lane
prunes them (:mod:`cotal_trio.stores.issuance`). Both issue at connect over an ``issuer`` session
of their own, renewed before it expires; a replica checks the issued stores' shape over it
before it subscribes and refuses a drifted one with the remedy (issue 15 items 3 and 4;
:mod:`cotal_trio.lane.service_users`). Each connection's allow-list is what the lane uses.

Each lane start has its own :class:`~cotal_trio.lane.metrics.LaneMetrics` (its own registry):
the responder and both exchange faces feed it, and the loopback face serves it as
``GET /metrics``; while the lane serves it is also on the process's board (``LaneCommon.board``,
:mod:`cotal_trio.lane.ops`), which the operator face serves with every other lane's.

The parts, in the order ``run_lane`` tells them: the start's material and counters and the
lane's sessions (:mod:`cotal_trio.lane.sessions`), the responder
(:func:`~cotal_trio.lane.callout.build.build_responder`), the space taken (the claim, or a
replica's checks), the health probe, the subscription, the faces
(:func:`~cotal_trio.lane.faces.open_faces`, full lanes only), then the graceful stop.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass
from collections.abc import Mapping
from typing import NoReturn

import trio

from cotal_trio.core.errors import Unavailable
from cotal_trio.natsio import CalloutConnection, Connection, NativeSubscription, Subscription, open_loop
from cotal_trio.stores.issuance import RowExpiries, issuance_store
from cotal_trio.lane.sweep import run_issuance_sweep
from cotal_trio.stores.issued import IssuedStores, IssuedStoresMissing
from cotal_trio.stores.records import ensure_records_stores
from cotal_trio.stores.replicas import placing
from cotal_trio.stores.streams import ensure_space_streams
from cotal_trio.lane.callout.build import build_responder
from cotal_trio.lane.callout.responder import CALLOUT_QUEUE_GROUP, CALLOUT_SUBJECT, CalloutResponder
from cotal_trio.lane.faces import Faces, exchange_context, no_faces, open_faces, scrub_readiness
from cotal_trio.lane.plane import hold_plane, holder_id
from cotal_trio.lane.service_endpoints import open_admission, refuse_if_admitted
from cotal_trio.lane.sessions import LaneStart, Sessions, open_sessions
from cotal_trio.lane.spec import FullLane, LaneSpec, ReplicaLane
from cotal_trio.lane.stopping import graceful_stop

__all__ = ["LaneInfo", "run_lane"]

log = logging.getLogger("cotal.lane")


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneInfo:
    """A ready lane: its space and its loopback exchange URL (None for a replica)."""

    space: str
    url: str | None


async def run_lane(
    spec: LaneSpec, *, task_status: trio.TaskStatus[LaneInfo] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Serve one space until cancelled (startable; ``started`` with a :class:`LaneInfo`).

    Raises:
        ConfigError: before started: the space's material in the root is missing or corrupt; or
            this is a replica and the space admits service endpoints (spec "Callout replicas");
            or an issued store has drifted (spec "Issued authority"; the sentence names the
            remedy), for a full lane and a replica alike; or, for a full lane, the broker cannot
            place the space's ``replicas`` copies of a store (issue 17 item 1; the sentence
            names the fix: a lower count or more nodes).
        ClaimRefused: before started: another full service holds the space (a ConfigError).
        Unavailable: the broker refused or dropped the callout or store connection, or refused
            the first store user or issuer session, or one expired with no renewal let in; after
            ``started`` it means the lane lost the broker and ends (the host decides whether to
            retry). Its subclass LaneUnhealthy: the lane's probe failed, before ``started`` or
            ``PROBE_FAILURES`` times in a row after it (:mod:`cotal_trio.lane.health`).

    Cancellation after ``started`` drains first (module docstring), for at most ``DRAIN_S``.
    """
    start = LaneStart.load(spec)
    match spec:  # a full lane's exchange files are read, and refused, before any connect
        case FullLane():
            faces = functools.partial(open_faces, spec, exchange_context(spec, start))
        case ReplicaLane():
            faces = no_faces
    async with graceful_stop() as stop, open_loop(), open_sessions(spec, start.material) as sessions:
        responder, health = build_responder(spec, start, sessions)
        async with trio.open_nursery() as nursery:
            await _take_space(nursery, spec, sessions, start.row_expiries)
            await health.check()  # a lane that cannot answer does not start serving (issue 15 item 11)
            nursery.start_soon(health.run)
            await nursery.start(responder.run)
            callout = sessions.callout
            subscription = await callout.subscribe(CALLOUT_SUBJECT, queue=CALLOUT_QUEUE_GROUP, on_message=responder.on_message)
            await callout.flush()
            async with faces(nursery, start, sessions, health) as opened:
                with _on_board(spec, start, callout):
                    stop.serving()
                    task_status.started(LaneInfo(space=spec.space, url=opened.url))
                    await _until_lost(spec.space, stop.requested, callout=callout, store=sessions.store)
                    opened.unpublish()  # no client finds a stopping lane's face any more
                    await _drain(spec.space, subscription, responder, callout, opened)
                    stop.done()
    raise AssertionError("unreachable: the drain ends in the lane's cancel")  # pragma: no cover


def _on_board(spec: LaneSpec, start: LaneStart, callout: Connection) -> contextlib.AbstractContextManager[None]:
    """The lane's metrics on the process's board while it serves (issue 18 item 8), with the
    version its broker announced; nothing without a board."""
    board = spec.common.board
    if board is None:
        return contextlib.nullcontext()
    return board.serving(start.metrics, nats_server=callout.connected_server_version)


async def _take_space(nursery: trio.Nursery, spec: LaneSpec, sessions: Sessions, row_expiries: RowExpiries) -> None:
    """What a lane does before its callout subscription, by kind: a full lane holds the space
    (:func:`_hold_space`); a replica refuses a space whose service-endpoint admission is open,
    since it cannot issue such a connection (spec "Callout replicas"), and checks the issued
    stores' shape."""
    match spec:
        case FullLane():
            await _hold_space(nursery, spec, sessions.store, row_expiries)
        case ReplicaLane():
            await refuse_if_admitted(sessions.store, spec.space)
            await _check_issued(sessions.issued)


async def _drain(
    space: str, subscription: Subscription | NativeSubscription, responder: CalloutResponder, conn: CalloutConnection,
    faces: Faces,
) -> None:
    """A stopping lane: take no new request, let the in-flight ones answer (issue 15 item 8).

    The exchange listeners stop at once and their in-flight requests finish (hypercorn's
    graceful shutdown); the callout subscription is drained (requests already delivered are
    still answered, new ones go to the queue group's other members, or wait for the next
    start); then every admitted callout is answered and the answers flushed to the broker.
    The caller's :func:`~cotal_trio.lane.stopping.graceful_stop` bounds all of it to
    ``DRAIN_S``; what is still running then is cancelled.
    """
    started = trio.current_time()
    faces.stopping.set()
    try:
        await subscription.drain()
        await responder.drained()
        await conn.flush()  # the answers are on the broker before the connection closes
    except Unavailable as exc:  # the broker went while we drained: nothing more to deliver
        log.warning("space %s: stopping without draining the callout: %s", space, exc)
    for ended in faces.ended:
        await ended.wait()
    log.info("space %s: lane drained in %.3f s", space, trio.current_time() - started)


async def _check_issued(issued: IssuedStores) -> None:
    """A replica's bind of the issued stores (spec "Issued authority": a drifted store "is refused
    by every service that binds them, with the remedy"): the full lane's shape check, without
    creating a store. Missing stores are left to the connects (each is minted on the legacy rail,
    :mod:`~cotal_trio.lane.callout.authority`) until the full service creates them.

    Raises:
        ConfigError: a store has another shape; the sentence names the differences and the
            remedy. The replica then issues nothing.
        Unavailable: the broker did not answer.
    """
    try:
        await issued.check()
    except IssuedStoresMissing as exc:
        log.warning("%s; until then this replica's connects carry no issued authority", exc)


async def _hold_space(nursery: trio.Nursery, spec: FullLane, store_conn: Connection, row_expiries: RowExpiries) -> None:
    """A full lane's start, before its callout subscription: claim, sweep, admission, readiness file.

    A second full service is refused here (ClaimRefused) before it serves or writes a readiness
    file. A Fenced from the keeper, which runs in ``nursery``, ends the lane. The issuance-row
    sweep runs in ``nursery`` too, from the moment the claim (and so the bucket) is held.
    """
    holder = spec.holder or holder_id()
    copies: dict[str, int] = {}  # every stream's copies, as its ensure left it
    with placing(spec.space, spec.replicas):  # a count the broker cannot place: one sentence (issue 17 item 1)
        await nursery.start(
            functools.partial(
                hold_plane, store_conn, spec.space, holder=holder, lease=spec.lease, clock=spec.common.clock,
                replicas=spec.replicas, copies=copies,
            )
        )
    store = issuance_store(store_conn, spec.space)
    nursery.start_soon(
        functools.partial(run_issuance_sweep, store, space=spec.space, clock=spec.common.clock, expiries=row_expiries)
    )
    with placing(spec.space, spec.replicas):
        copies |= await ensure_records_stores(store_conn, spec.space, replicas=spec.replicas)
        # the wire layout's streams (docs/wire-layout.md)
        copies |= await ensure_space_streams(store_conn, spec.space, replicas=spec.replicas)
        # spec "Issued authority": both stores in their exact shape; a drifted one refuses the start
        # with the remedy (cotal up --recreate-issued-stores), never silently adopted
        copies |= await IssuedStores(store_conn, spec.space).ensure(replicas=spec.replicas)
    _warn_above(spec.space, copies, spec.replicas)
    if spec.service_endpoints:
        admission = await open_admission(store_conn, spec.space, holder=holder, now=spec.common.clock())
        log.info("space %s: service-endpoint admission open (since %s)", spec.space, admission.opened_at)
    # Only the claim's holder touches the readiness file: a refused second service (even one in
    # this process) leaves the serving lane's file alone.
    scrub_readiness(spec)


def _warn_above(space: str, copies: Mapping[str, int], replicas: int) -> None:
    """One warning naming the stores with more ``copies`` (by stream name, as the lane's ensures
    left them) than the space's ``replicas``: they are left as they are (never scaled down;
    :mod:`cotal_trio.stores.replicas`)."""
    above = sorted((stream, count) for stream, count in copies.items() if count > replicas)
    if above:
        log.warning(
            "space %s: %s keep more copies than its replicas %d and are left as they are - raise \"replicas\""
            " in its entry of spaces.json to match, or scale them down by hand (nats stream edit --replicas)",
            space, ", ".join(f"{stream} (R{count})" for stream, count in above), replicas,
        )


async def _until_lost(space: str, stopping: trio.Event, **conns: CalloutConnection) -> None:
    """Trio: wait until ``stopping`` is set (return) or one of the lane's connections closes
    for good (raise naming it).

    One error however many close at once (the broker going takes them all), so a single-space
    process reports one sentence; ``conns`` order decides which is named then.

    Raises:
        Unavailable: once a connection in ``conns`` (``name=connection``) has closed.
    """
    async with trio.open_nursery() as watchers:
        for conn in conns.values():
            watchers.start_soon(_cancel_when_closed, conn, watchers.cancel_scope)
        watchers.start_soon(_cancel_when_set, stopping, watchers.cancel_scope)
    lost = [(name, conn) for name, conn in conns.items() if conn.closed.is_set()]
    if not lost:
        return
    name, conn = lost[0]
    raise Unavailable(
        f"space {space}: the broker closed the {name} connection ({conn.last_error or 'no reason given'})"
    )


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _cancel_when_closed(conn: CalloutConnection, scope: trio.CancelScope) -> None:
    await conn.closed.wait()
    scope.cancel()
