"""One lane start's material and sessions: what it reads from the root before it connects, and
its three connections to the broker (DESIGN.md 5; spec "Callout replicas", "Profiles").

:meth:`LaneStart.load` reads the space's material and issuer keys (a missing or corrupt file is
refused before any connect) and makes the start's own counters. :func:`open_sessions` opens, in
this order, the callout connection (its refusal named with the remedy), the store session and
the issuer session, the last two renewed before they expire, and yields them as
:class:`Sessions`. Must be entered inside the lane's ``open_loop()``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from cotal_trio.core.errors import Unavailable
from cotal_trio.core.limits import ConnectLimiter
from cotal_trio.natsio import CalloutConnection, Connection, open_connection, open_native_connection, speaks_native
from cotal_trio.state import IssuerKeys, LedgerReader, SpaceMaterial, load_issuer_keys, load_space
from cotal_trio.stores.issuance import RowExpiries
from cotal_trio.stores.issued import IssuedStores
from cotal_trio.stores.records import RecordsStore
from cotal_trio.lane.metrics import LaneMetrics
from cotal_trio.lane.refusals import name_callout_refusal
from cotal_trio.lane.service_users import (
    IssuerSession,
    RenewedUser,
    open_service_user,
    replica_store_permissions,
    store_permissions,
)
from cotal_trio.lane.spec import FullLane, LaneSpec, ReplicaLane

__all__ = ["LaneStart", "Sessions", "open_sessions"]

log = logging.getLogger("cotal.lane")


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneStart:
    """One start of a lane: what it read from the root, and the counters it starts from zero.

    Attributes:
        material: the space's callout material (keys, accounts, credentials).
        issuer: the space's bearer issuer keys.
        metrics: the start's :class:`~cotal_trio.lane.metrics.LaneMetrics` (a restarted lane
            counts from zero).
        limiter: the start's connect limiter (``spec.connect_limits``), shared by its callout and
            its exchange faces.
        ledger: the space's ledger reader.
        row_expiries: the issuance rows' noted expiries, from the callout to the prune sweep.
    """

    material: SpaceMaterial
    issuer: IssuerKeys
    metrics: LaneMetrics
    limiter: ConnectLimiter
    ledger: LedgerReader
    row_expiries: RowExpiries

    @classmethod
    def load(cls, spec: LaneSpec) -> LaneStart:
        """Read ``spec``'s space from the root (sync, files only).

        Raises:
            ConfigError: the space's material or issuer keys are missing or corrupt.
        """
        return cls(
            material=load_space(spec.paths.callout_json, spec.space),
            issuer=load_issuer_keys(spec.paths.issuer_json, spec.space),
            metrics=LaneMetrics(spec.space), limiter=ConnectLimiter(spec.connect_limits),
            ledger=LedgerReader(spec.paths), row_expiries=RowExpiries(),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Sessions:
    """A lane's connections (each allow-list is what the lane does with it).

    Attributes:
        callout: the callout user's connection (the subscription, the replies): trio-native on
            ``nats://`` seeds, without the asyncio bridge (issue 14), nats-py's on ``tls://``.
        store: the data-account store session, renewed; what it is repoints itself to each
            renewal.
        issued: the issued stores over the lane's issuer session, renewed likewise.
        records: the records and sessions stores over ``store``.
    """

    callout: CalloutConnection
    store: Connection
    issued: IssuedStores
    records: RecordsStore


@contextlib.asynccontextmanager
async def open_sessions(spec: LaneSpec, material: SpaceMaterial) -> AsyncIterator[Sessions]:
    """Trio: the lane's :class:`Sessions`, open for the block (closed, shielded, on exit).

    Raises:
        ConfigError: the broker's auth account does not list the space's callout user.
        Unavailable: the broker refused or dropped a connection, or refused the first store
            user or issuer session, or one expired with no renewal let in.
    """
    name = f"cotal:auth-service:{spec.space}"
    async with (
        _open_callout(spec, material, material.callout_creds, name) as conn,
        _open_store(spec, material) as store_conn,
        _open_issuer(spec, material) as issued,
    ):
        yield Sessions(callout=conn, store=store_conn, issued=issued, records=RecordsStore(store_conn, spec.space))


@contextlib.asynccontextmanager
async def _open_callout(spec: LaneSpec, material: SpaceMaterial, creds: str, name: str) -> AsyncIterator[CalloutConnection]:
    """The lane's callout connection: :func:`~cotal_trio.natsio.open_native_connection` when
    every seed is ``nats://`` (the callout's hot path on trio sockets, issue 14), else
    :func:`~cotal_trio.natsio.open_connection`; both reconnect alike. A refused connect is named where it is refused (issue 15
    item 10: :func:`~cotal_trio.lane.refusals.name_callout_refusal`), so every host shows the
    missing ``auth_users`` entry and its remedy, not the bare ``Authorization Violation``.

    Raises:
        ConfigError: the broker's auth account does not list the space's callout user.
        Unavailable: any other refusal or failure of the connect (as ``open_connection``).
    """
    connected = False
    url = spec.common.callout_url or spec.common.server_url  # a leaf node's replica answers there
    try:
        opener = open_native_connection if speaks_native(url) else open_connection
        async with opener(url, creds=creds, name=name, reconnect=spec.common.reconnect) as conn:
            connected = True
            yield conn
    except Unavailable as refused:
        if connected:  # the lane's own failure later on, not the connect's
            raise
        named = await name_callout_refusal(refused, space_paths=spec.paths, material=material, server_url=url)
        if named is refused:  # not named: keep its cause (a refused socket), which the CLI names
            raise
        raise named from None


@contextlib.asynccontextmanager
async def _open_store(spec: LaneSpec, material: SpaceMaterial) -> AsyncIterator[Connection]:
    """The lane's data-account store connection, as a service user minted in memory for
    ``spec.common.store_lifetime_s`` (a day) and renewed before it expires by a
    :class:`~cotal_trio.lane.service_users.RenewedUser` in a nursery of its own; what it yields
    repoints itself to each renewed session, so its holders (the claim keeper, the stores) never
    see a gap. Raises ``Unavailable`` when the first session is refused, or when one expires with
    no renewal let in (which ends the lane).

    Over trio sockets (:func:`~cotal_trio.natsio.open_native_connection`) on ``nats://`` seeds:
    every call the lane makes on it is a JetStream request, and the issuance row at connect
    rides it (issue 14). Its allow-list is exactly what the lane does with it (issue 15 item 4; docs/wire-layout.md
    "The service's own users"): :func:`~cotal_trio.lane.service_users.store_permissions` for a
    full lane, :func:`~cotal_trio.lane.service_users.replica_store_permissions` for a replica
    (it creates no store). Must be entered inside the lane's ``open_loop()``.
    """
    space = spec.space
    match spec:
        case FullLane():
            permissions = store_permissions
        case ReplicaLane():
            permissions = replica_store_permissions
    user = RenewedUser(
        material, spec.common.server_url, what="store session", name=f"cotal:auth-store:{space}",
        permissions=functools.partial(permissions, space), lifetime_s=spec.common.store_lifetime_s, clock=spec.common.clock,
        reconnect=spec.common.reconnect, watched=True,  # `_until_lost` names a dropped store connection
        # the issuance row at connect (and the lane's other store calls) on trio sockets (issue 14)
        open_user=functools.partial(open_service_user, native=speaks_native(spec.common.server_url)),
    )  # fmt: skip
    async with _session_task(user.run) as conn:
        yield typing.cast(Connection, conn)


@contextlib.asynccontextmanager
async def _session_task(run: Callable[..., Awaitable[None]]) -> AsyncIterator[Any]:
    """Trio: ``run`` (a renewed session's startable) in a task of its own; yields what it started.

    Once started, the task is shielded from the lane's cancellation and cancelled only when the
    block exits: the block's own shielded clean-ups (the plane claim's release by CAS, the
    callout's last answers) still find the session open. Before that, while it connects, a
    cancel reaches it as usual, so a stop during start-up never waits on a hung broker. A
    failure of the task (no renewal let in) ends the block, except once the lane is stopping:
    then the broker going away meanwhile is part of the stop, not a fault to report.
    """
    stop = trio.CancelScope()
    stopping = False

    async def shielded(task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        class Started:
            def started(self, value: Any = None) -> None:
                stop.shield = True  # from here on, the lane's cancel waits for the block's exit
                task_status.started(value)

        with stop:
            try:
                await run(task_status=Started())
            except Exception:
                if not stopping:
                    raise
                log.debug("a session ended while its lane stopped", exc_info=True)

    async def watch_for_the_stop() -> None:
        nonlocal stopping
        try:
            await trio.sleep_forever()
        finally:
            stopping = True  # the lane's cancel (or the block's exit) reached this nursery

    async with trio.open_nursery() as nursery:
        try:
            value = await nursery.start(shielded)
            nursery.start_soon(watch_for_the_stop)
            yield value
        finally:
            stop.cancel()
            nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def _open_issuer(spec: LaneSpec, material: SpaceMaterial) -> AsyncIterator[IssuedStores]:
    """The lane's own issuer session (spec "Profiles", issuer row; "Callout replicas": "it holds
    its own issuer session"), renewed in a nursery of its own for as long as the lane runs; yields
    the issued stores over its renewed connection, which each renewal repoints. Must be entered inside ``open_loop()``.

    Raises:
        Unavailable: the first session was refused, or one expired with no renewal let in, or
            the broker closed it (which ends the lane).
    """
    session = IssuerSession(
        material, spec.common.server_url, lifetime_s=spec.common.issuer_lifetime_s, clock=spec.common.clock,
        reconnect=spec.common.reconnect,
    )
    async with _session_task(session.run) as stores:
        yield stores
