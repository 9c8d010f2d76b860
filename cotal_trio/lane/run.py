"""One space's lane: its callout and its loopback exchange face, in one nursery (DESIGN.md 5).

``run_lane`` is a startable (STYLE.md practice 7): ``await nursery.start(run_lane, config)``
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

A full lane (not ``callout_only``) also holds its space's plane claim (DESIGN.md section 8) over
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
``GET /metrics``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import secrets
import time
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import trio
from nacl.signing import VerifyKey
from quart import request
from quart_trio import QuartTrio

from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.bearer import BearerVerifier, space_issuer
from cotal_trio.core.callout import CalloutKeys
from cotal_trio.core.callout_log import CalloutRecord
from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.core.jose import BearerKeySet
from cotal_trio.core.ledger import ReadRows
from cotal_trio.core.limits import DEFAULT_LIMITS, REPLICA_LIMITS, ConnectLimiter, ConnectLimits, Limited
from cotal_trio.core.manifest import SpaceEntry
from cotal_trio.core.plane import Lease
from cotal_trio.http.client import pid_alive
from cotal_trio.http.errors import Handler
from cotal_trio.http.faces import ExchangeContext
from cotal_trio.http.lifecycle_doors import LifecycleDoors
from cotal_trio.http.lifecycle_doors import routes as lifecycle_routes
from cotal_trio.http.loopback import DoorTable, build_loopback_app
from cotal_trio.http.manager_doors import ManagerDoors
from cotal_trio.http.manager_doors import routes as manager_routes
from cotal_trio.http.public import build_public_app
from cotal_trio.http.serve import serve_app
from cotal_trio.natsio import Connection, Subscription, open_connection, open_loop
from cotal_trio.state import (
    IssuerKeys,
    LedgerReader,
    SpaceMaterial,
    SpacePaths,
    load_idp_pin,
    load_issuer_keys,
    load_owner_secret,
    load_space,
    read_json,
    read_principal,
    remove_quietly,
    write_json,
)
from cotal_trio.lane.callout.responder import CALLOUT_QUEUE_GROUP, CALLOUT_SUBJECT, CalloutResponder, read_in_threads
from cotal_trio.lane.callout.authority import ConnectAuthority
from cotal_trio.lane.events import EventBus, callout_hook, exchange_hook
from cotal_trio.stores.issuance import RowExpiries, issuance_store, run_issuance_sweep
from cotal_trio.stores.issued import IssuedStores, IssuedStoresMissing
from cotal_trio.lane.metrics import LaneMetrics
from cotal_trio.lane.plane import DEFAULT_LEASE, hold_plane, holder_id
from cotal_trio.stores.records import RecordsStore, ensure_records_stores
from cotal_trio.lane.refusals import name_callout_refusal
from cotal_trio.lane.service_endpoints import open_admission, refuse_if_admitted
from cotal_trio.lane.service_users import (
    ISSUER_LIFETIME_S,
    STORE_LIFETIME_S,
    IssuerSession,
    RenewedUser,
    replica_store_permissions,
    store_permissions,
)
from cotal_trio.lane.health import PROBE_EVERY_S, LaneHealth
from cotal_trio.lane.stopping import graceful_stop
from cotal_trio.stores.streams import Provisioner, ensure_space_streams
from cotal_trio.lane.callout.views import view_confirmer

__all__ = ["LaneConfig", "LaneInfo", "PublicFace", "run_lane"]

log = logging.getLogger("cotal.lane")

IdpKeys = Callable[[], Mapping[str, VerifyKey]]


@dataclass(frozen=True, slots=True, kw_only=True)
class PublicFace:
    """A lane's public exchange listener (spec "Exclusive ownership", "Listener policy").

    Attributes:
        port: the port it binds on 127.0.0.1 (a reverse proxy terminates TLS in front of it).
        url: the ``https://`` address clients reach it by; None publishes the bound address.
        trusted_proxy: attribute peers by the last ``X-Forwarded-For`` hop.
        advertised_server: the broker address remote clients dial; None: the lane's own.
    """

    port: int
    url: str | None = None
    trusted_proxy: bool = False
    advertised_server: str | None = None

    @classmethod
    def of(cls, entry: SpaceEntry) -> PublicFace | None:
        """The face a manifest entry names (``exchangePublicPort`` and friends), or None."""
        if entry.exchange_public_port is None:
            return None
        return cls(
            port=entry.exchange_public_port, url=entry.exchange_public_url,
            trusted_proxy=entry.exchange_trusted_proxy, advertised_server=entry.advertised_server,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneConfig:
    """What one lane needs to serve one space.

    Attributes:
        space: the space name.
        paths: the space's folder in the root (material, ledger, ``auth-service.json``).
        server_url: the broker, ``nats://127.0.0.1:<port>``.
        idp_keys: the pinned IdP's current key set (sync; a cache the host refreshes).
        refetch_idp_keys: re-reads that key set for an unknown ``kid`` (an oidc pin's
            :meth:`~cotal_trio.service.idp_keys.IdpKeyCache.refetch`), or None (fixed keys).
        limits: callout limits (spec "Callout deadlines").
        connect_limits: ``connectLimits`` (spec "Connect limits"): one limiter per lane start,
            shared by its callout and its exchange faces, on trio time. A replica keeps the
            defaults.
        http_port: loopback exchange port; 0 picks a free one.
        callout_only: a replica: no HTTP face and no ``auth-service.json``.
        reconnect: ride out a broker restart (a lane of a host); False ends the lane when its
            connection drops, so a single-space process exits non-zero and its unit restarts
            it (spec "Callout replicas").
        clock: wall time, unix seconds.
        lease: the plane claim's lease and fencing margin (full lanes only; tests shorten it).
        service_endpoints: open the space's service-endpoint admission (full lanes only;
            nothing closes it).
        public: the public exchange face the space's manifest entry names (full lanes only),
            or None for the loopback face alone.
        dev_idp_url: where the development IdP is served (``cotal up``), which a public face's
            bootstrap document names for a space pinned to it; None elsewhere.
        holder: the plane claim holder id (full lanes). A host passes the same id to every
            start of one space's lane, so a restart takes back the claim its stopped earlier
            start could not release (broker gone); None: a fresh id per start.
        tool_result_consent: serve the opt-in host-only door ``POST /tool-result-consent/issue``
            (full lanes; the manifest entry's ``toolResultConsent``).
        events: the host process's event bus (issue 7 item 1): the lane publishes each callout
            answer and each exchange answer on it, and its loopback face streams it on
            ``/events``; None: no events, no ``/events``.
        store_lifetime_s: the lane's store user's credential lifetime (seconds, at least 3;
            :data:`~cotal_trio.lane.service_users.STORE_LIFETIME_S`, a day); it is replaced
            before it expires. Tests shorten it.
        issuer_lifetime_s: the lane's issuer session's credential lifetime (seconds, at least 3;
            :data:`~cotal_trio.lane.service_users.ISSUER_LIFETIME_S`, five minutes); it is
            replaced before it expires. Tests shorten it.
        wrap_ledger: wraps the lane's blocking ledger read (``ReadRows -> ReadRows``), the one
            its callout runs in worker threads: a fault to inject (a stalled or failing disk, in
            tests); None: the read as it is.
        probe_every_s: seconds between the lane's self-probes while it is healthy
            (:data:`~cotal_trio.lane.health.PROBE_EVERY_S`, 5 s; tests shorten it).

    Raises:
        ConfigError: ``service_endpoints``, a public face or connect limits other than the
            defaults on a callout-only lane.
    """

    space: str
    paths: SpacePaths
    server_url: str
    idp_keys: IdpKeys
    refetch_idp_keys: Callable[[str], Awaitable[None]] | None = None
    limits: CalloutLimits = field(default_factory=CalloutLimits)
    connect_limits: ConnectLimits = DEFAULT_LIMITS
    http_port: int = 0
    callout_only: bool = False
    reconnect: bool = True
    clock: Callable[[], float] = time.time
    lease: Lease = DEFAULT_LEASE
    service_endpoints: bool = False
    public: PublicFace | None = None
    dev_idp_url: str | None = None
    holder: str | None = None
    tool_result_consent: bool = False
    events: EventBus | None = None
    issuer_lifetime_s: int = ISSUER_LIFETIME_S
    store_lifetime_s: int = STORE_LIFETIME_S
    wrap_ledger: Callable[[ReadRows], ReadRows] | None = None
    probe_every_s: float = PROBE_EVERY_S

    def __post_init__(self) -> None:
        if self.callout_only and self.public is not None:
            raise ConfigError(
                f"space {self.space}: a callout-only replica has no HTTP face - drop the public"
                " exchange settings from its entry, or run the full auth service for it"
            )
        if self.callout_only and self.connect_limits != DEFAULT_LIMITS:
            raise ConfigError(f"space {self.space}: {REPLICA_LIMITS}")
        if self.callout_only and self.service_endpoints:
            raise ConfigError(
                f"space {self.space}: a callout-only replica cannot open service endpoints"
                " - run the full auth service with them, or leave them off the replica"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneInfo:
    """A ready lane: its space and its loopback exchange URL (None for a replica)."""

    space: str
    url: str | None


def _load_material(config: LaneConfig) -> SpaceMaterial:
    return load_space(config.paths.callout_json, config.space)


def _callout_keys(material: SpaceMaterial) -> tuple[CalloutKeys, str]:
    keys = CalloutKeys(
        space=material.space,
        auth_account=material.auth_account,
        data_account=material.data_account,
        xkey=material.xkey,
        auth_signer=material.auth_signing,
        data_signer=material.data_callout_signing,
    )
    return keys, material.callout_creds


def _exchange_context(
    config: LaneConfig, issuer: IssuerKeys, metrics: LaneMetrics, limiter: ConnectLimiter
) -> ExchangeContext:
    return ExchangeContext(
        space=config.space,
        capability=secrets.token_hex(32),
        issuer_key=issuer.active,
        owner_secret=load_owner_secret(config.paths.owner_secret_json),
        idp_pin=load_idp_pin(config.paths.idp_json).pin(),
        idp_keys=config.idp_keys,
        refetch_idp_keys=config.refetch_idp_keys,
        read_ledger=functools.partial(read_principal, config.paths),
        clock=config.clock,
        metrics=exchange_hook(metrics.exchange_answered, config.events, space=config.space, face="loopback"),
        peek_limits=functools.partial(_peek_limits, limiter),
    )


def _peek_limits(limiter: ConnectLimiter, owner: str, actor: str) -> Limited | None:
    """The exchange's look at the lane's connect limits: now on trio time, spending nothing."""
    return limiter.peek_principal(owner, actor, trio.current_time())


async def run_lane(
    config: LaneConfig, *, task_status: trio.TaskStatus[LaneInfo] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Serve one space until cancelled (startable; ``started`` with a :class:`LaneInfo`).

    Raises:
        ConfigError: before started: the space's material in the root is missing or corrupt; or
            this is a replica and the space admits service endpoints (spec "Callout replicas");
            or an issued store has drifted (spec "Issued authority"; the sentence names the
            remedy), for a full lane and a replica alike.
        ClaimRefused: before started: another full service holds the space (a ConfigError).
        Unavailable: the broker refused or dropped the callout or store connection, or refused
            the first store user or issuer session, or one expired with no renewal let in; after
            ``started`` it means the lane lost the broker and ends (the host decides whether to
            retry). Its subclass LaneUnhealthy: the lane's probe failed, before ``started`` or
            ``PROBE_FAILURES`` times in a row after it (:mod:`cotal_trio.lane.health`).

    Cancellation after ``started`` drains first (module docstring), for at most ``DRAIN_S``.
    """
    material = _load_material(config)
    keys, creds = _callout_keys(material)
    issuer = load_issuer_keys(config.paths.issuer_json, config.space)
    verifier = BearerVerifier(BearerKeySet.from_keys(issuer.keys))
    metrics = LaneMetrics(config.space)  # per lane start: a restarted lane counts from zero
    limiter = ConnectLimiter(config.connect_limits)  # per lane start, like the metrics
    exchange = None if config.callout_only else _exchange_context(config, issuer, metrics, limiter)
    name = f"cotal:auth-service:{config.space}"
    ledger, row_expiries = LedgerReader(config.paths), RowExpiries()
    async with (
        graceful_stop() as stop, open_loop(), _open_callout(config, material, creds, name) as conn,
        _open_store(config, material) as store_conn,
        _open_issuer(config, material) as issued,
    ):
        records = RecordsStore(store_conn, config.space)
        if exchange is not None:
            provision = Provisioner(store_conn, config.space)
            exchange = dataclasses.replace(exchange, records=records, provision=provision.principal)
        blocking: ReadRows = ledger if config.wrap_ledger is None else config.wrap_ledger(ledger)
        read_ledger = read_in_threads(blocking, max_threads=config.limits.max_in_flight)
        health = LaneHealth(
            config.space, read_ledger=read_ledger, store=issuance_store(store_conn, config.space),
            budget_s=config.limits.budget_s, every_s=config.probe_every_s,
        )
        answered = callout_hook(metrics.callout_answered, config.events)  # metrics, then the event (issue 7)
        responder = CalloutResponder(
            keys=keys,
            verifier=verifier,
            read_ledger=read_ledger,
            recall_ledger=ledger.recall,
            row_expiries=row_expiries,
            limits=config.limits,
            clock=config.clock,
            publish=conn.publish_nowait,
            store=issuance_store(store_conn, config.space),
            connect_limits=limiter,
            on_answer=functools.partial(_answered, answered, health),
            confirm_view=view_confirmer(records),
            # issue 6 item 6, over the lane's own issuer session (issue 15 item 4)
            issue_authority=ConnectAuthority(issued, read_ledger=read_ledger),
        )
        metrics.watch(responder.statistics, limits=limiter.statistics)
        faces = _Faces()
        async with trio.open_nursery() as nursery:
            if config.callout_only:
                # Spec "Callout replicas": a replica cannot issue a service-endpoint connection,
                # so it refuses such a space before it subscribes.
                await refuse_if_admitted(store_conn, config.space)
                await _check_issued(issued)
            else:
                await _hold_space(nursery, config, store_conn, row_expiries)
            await health.check()  # a lane that cannot answer does not start serving (issue 15 item 11)
            nursery.start_soon(health.run)
            await nursery.start(responder.run)
            subscription = await conn.subscribe(CALLOUT_SUBJECT, queue=CALLOUT_QUEUE_GROUP, on_message=responder.on_message)
            await conn.flush()
            try:
                # Every listener is bound before the readiness file is written: it is the signal
                # (upstream-notes 4.1), and names the public face when there is one.
                public_url = None
                if exchange is not None and config.public is not None:
                    public = dataclasses.replace(exchange, metrics=exchange_hook(
                        metrics.exchange_answered, config.events, space=config.space, face="public"))
                    public_url = await _open_public_face(nursery, config, config.public, public, material, faces, health)
                url = None
                if exchange is not None:
                    doors = _door_tables(config, exchange, material, records, store_conn)
                    url = await _open_face(nursery, config, exchange, metrics, public_url, doors, faces, health)
                stop.serving()
                task_status.started(LaneInfo(space=config.space, url=url))
                await _until_lost(config.space, stop.requested, callout=conn, store=store_conn)
                if exchange is not None:  # no client finds a stopping lane's face any more
                    _remove_readiness(config, exchange.capability)
                await _drain(config.space, subscription, responder, conn, faces)
                stop.done()
            finally:
                if exchange is not None:
                    _remove_readiness(config, exchange.capability)
    raise AssertionError("unreachable: the drain ends in the lane's cancel")  # pragma: no cover


def _answered(hook: Callable[[CalloutRecord], None], health: LaneHealth, record: CalloutRecord) -> None:
    """The responder's answer hook: metrics and the event, then the lane's health."""
    hook(record)
    health.answered(record)


def answer_health(app: QuartTrio, health: LaneHealth, space: str) -> None:
    """Make ``GET /health`` of a face say why while the lane's last probe failed: 503
    ``{"ok": false, "issuer", "reason"}`` (issue 15 item 11); the face's own answer otherwise."""

    async def unhealthy() -> tuple[dict[str, object], int] | None:
        reason = health.reason
        if reason is None or request.method != "GET" or request.scope["path"] != "/health":
            return None
        return {"ok": False, "issuer": space_issuer(space), "reason": reason}, 503

    app.before_request(unhealthy)


class _Faces:
    """A lane's exchange listeners, for its drain: one event stops them all, each reports its end."""

    def __init__(self) -> None:
        self.stopping = trio.Event()
        self.ended: list[trio.Event] = []

    async def serve(
        self, app: QuartTrio, *, port: int, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """:func:`serve_app` until cancelled, or until :attr:`stopping` and its requests finished."""
        ended = trio.Event()
        self.ended.append(ended)
        try:
            await serve_app(app, port=port, shutdown_trigger=self.stopping.wait, task_status=task_status)
        finally:
            ended.set()


async def _drain(
    space: str, subscription: Subscription, responder: CalloutResponder, conn: Connection, faces: _Faces
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


Guard = Callable[[], Awaitable[object]]
Admit = Callable[[float], bool]


def _door_tables(
    config: LaneConfig, ctx: ExchangeContext, material: SpaceMaterial, records: RecordsStore, store_conn: Connection
) -> tuple[DoorTable, ...]:
    """The loopback face's host-only doors (spec "Host-only routes"; docs/host-doors.md)."""
    lifecycle = LifecycleDoors(
        space=config.space, data_account=material.data_account, read_ledger=ctx.read_ledger, paths=config.paths,
        records=records, issuance=issuance_store(store_conn, config.space), clock=config.clock,
    )  # fmt: skip
    managers = ManagerDoors(
        space=config.space, read_ledger=ctx.read_ledger, records=records, issuer_key=ctx.issuer_key,
        idp_pin=ctx.idp_pin, idp_keys=ctx.idp_keys, owner_secret=ctx.owner_secret, clock=config.clock,
        tool_result_consent=config.tool_result_consent,
    )  # fmt: skip

    def lifecycle_doors(guard: Guard, admit: Admit) -> Mapping[str, Mapping[str, Handler]]:
        return lifecycle_routes(lifecycle, guard=guard, admit_refusal=admit)

    def manager_doors(guard: Guard, admit: Admit) -> Mapping[str, Mapping[str, Handler]]:
        return manager_routes(dataclasses.replace(managers, admit_refusal=admit), guard=guard)

    return lifecycle_doors, manager_doors


@contextlib.asynccontextmanager
async def _open_callout(config: LaneConfig, material: SpaceMaterial, creds: str, name: str) -> AsyncIterator[Connection]:
    """The lane's callout connection; a refused connect is named where it is refused (issue 15
    item 10: :func:`~cotal_trio.lane.refusals.name_callout_refusal`), so every host shows the
    missing ``auth_users`` entry and its remedy, not the bare ``Authorization Violation``.

    Raises:
        ConfigError: the broker's auth account does not list the space's callout user.
        Unavailable: any other refusal or failure of the connect (as ``open_connection``).
    """
    connected = False
    try:
        async with open_connection(config.server_url, creds=creds, name=name, reconnect=config.reconnect) as conn:
            connected = True
            yield conn
    except Unavailable as refused:
        if connected:  # the lane's own failure later on, not the connect's
            raise
        raise await name_callout_refusal(
            refused, space_paths=config.paths, material=material, server_url=config.server_url,
        ) from None


@contextlib.asynccontextmanager
async def _open_store(config: LaneConfig, material: SpaceMaterial) -> AsyncIterator[Connection]:
    """The lane's data-account store connection, as a service user minted in memory for
    ``config.store_lifetime_s`` (a day) and renewed before it expires by a
    :class:`~cotal_trio.lane.service_users.RenewedUser` in a nursery of its own; what it yields
    repoints itself to each renewed session, so its holders (the claim keeper, the stores) never
    see a gap. Raises ``Unavailable`` when the first session is refused, or when one expires with
    no renewal let in (which ends the lane).

    Its allow-list is exactly what the lane does with it (issue 15 item 4; docs/wire-layout.md
    "The service's own users"): :func:`~cotal_trio.lane.service_users.store_permissions` for a
    full lane, :func:`~cotal_trio.lane.service_users.replica_store_permissions` for a replica
    (it creates no store). Must be entered inside the lane's ``open_loop()``.
    """
    space = config.space
    permissions = replica_store_permissions if config.callout_only else store_permissions
    user = RenewedUser(
        material, config.server_url, what="store session", name=f"cotal:auth-store:{space}",
        permissions=functools.partial(permissions, space), lifetime_s=config.store_lifetime_s, clock=config.clock,
        reconnect=config.reconnect, watched=True,  # `_until_lost` names a dropped store connection
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
async def _open_issuer(config: LaneConfig, material: SpaceMaterial) -> AsyncIterator[IssuedStores]:
    """The lane's own issuer session (spec "Profiles", issuer row; "Callout replicas": "it holds
    its own issuer session"), renewed in a nursery of its own for as long as the lane runs; yields
    the issued stores over its renewed connection, which each renewal repoints. Must be entered inside ``open_loop()``.

    Raises:
        Unavailable: the first session was refused, or one expired with no renewal let in, or
            the broker closed it (which ends the lane).
    """
    session = IssuerSession(
        material, config.server_url, lifetime_s=config.issuer_lifetime_s, clock=config.clock,
        reconnect=config.reconnect,
    )
    async with _session_task(session.run) as stores:
        yield stores


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


async def _hold_space(
    nursery: trio.Nursery, config: LaneConfig, store_conn: Connection, row_expiries: RowExpiries
) -> None:
    """A full lane's start, before its callout subscription: claim, sweep, admission, readiness file.

    A second full service is refused here (ClaimRefused) before it serves or writes a readiness
    file. A Fenced from the keeper, which runs in ``nursery``, ends the lane. The issuance-row
    sweep runs in ``nursery`` too, from the moment the claim (and so the bucket) is held.
    """
    holder = config.holder or holder_id()
    await nursery.start(
        functools.partial(
            hold_plane, store_conn, config.space, holder=holder, lease=config.lease, clock=config.clock,
        )
    )
    store = issuance_store(store_conn, config.space)
    nursery.start_soon(
        functools.partial(run_issuance_sweep, store, space=config.space, clock=config.clock, expiries=row_expiries)
    )
    await ensure_records_stores(store_conn, config.space)
    await ensure_space_streams(store_conn, config.space)  # the wire layout's streams (docs/wire-layout.md)
    # spec "Issued authority": both stores in their exact shape; a drifted one refuses the start
    # with the remedy (cotal up --recreate-issued-stores), never silently adopted
    await IssuedStores(store_conn, config.space).ensure()
    if config.service_endpoints:
        admission = await open_admission(store_conn, config.space, holder=holder, now=config.clock())
        log.info("space %s: service-endpoint admission open (since %s)", config.space, admission.opened_at)
    # Only the claim's holder touches the readiness file: a refused second service (even one in
    # this process) leaves the serving lane's file alone.
    _scrub_readiness(config)


async def _until_lost(space: str, stopping: trio.Event, **conns: Connection) -> None:
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


async def _cancel_when_closed(conn: Connection, scope: trio.CancelScope) -> None:
    await conn.closed.wait()
    scope.cancel()


def _scrub_readiness(config: LaneConfig) -> None:
    """Remove a readiness file left by a process that is gone; refuse one that is alive."""
    path = config.paths.auth_service_json
    if not path.exists():
        return
    try:
        pid, written = int(read_json(path).get("pid", 0)), path.stat().st_mtime
    except (ConfigError, OSError, TypeError, ValueError):
        pid, written = 0, None
    # A pid reused since the file was written (after a SIGKILL and a reboot) is not its writer.
    if pid and pid != os.getpid() and pid_alive(pid, since=written):
        raise ConfigError(
            f"space {config.space} is already served by pid {pid} ({path}) - stop that auth service first"
        )
    remove_quietly(path)


def _remove_readiness(config: LaneConfig, capability: str) -> None:
    """Remove the readiness file only if it is still this lane's (its capability)."""
    try:
        ours = read_json(config.paths.auth_service_json).get("cap") == capability
    except ConfigError:
        return
    if ours:
        remove_quietly(config.paths.auth_service_json)


async def _open_face(
    nursery: trio.Nursery, config: LaneConfig, ctx: ExchangeContext, metrics: LaneMetrics, public_url: str | None,
    doors: tuple[DoorTable, ...], faces: _Faces, health: LaneHealth,
) -> str:
    """Serve the loopback face, then write the readiness file ``{ver, url, pid, cap[, publicUrl][,
    devIdpUrl]}`` (``devIdpUrl``: where ``cotal up`` serves the development IdP)."""
    app = build_loopback_app(ctx, metrics=metrics.exposition, doors=doors, events=config.events)
    answer_health(app, health, config.space)
    port = await nursery.start(functools.partial(faces.serve, app, port=config.http_port))
    url = f"http://127.0.0.1:{port}"
    record: dict[str, object] = {"ver": 1, "url": url, "pid": os.getpid(), "cap": ctx.capability}
    if public_url is not None:
        record["publicUrl"] = public_url
    if config.dev_idp_url is not None:  # `cotal connect-info` names its JWKS (issue 18 item 5)
        record["devIdpUrl"] = config.dev_idp_url
    write_json(config.paths.auth_service_json, record)
    return url


async def _open_public_face(
    nursery: trio.Nursery, config: LaneConfig, face: PublicFace, ctx: ExchangeContext, material: SpaceMaterial,
    faces: _Faces, health: LaneHealth,
) -> str:
    """Serve the public face on 127.0.0.1:``face.port`` in ``nursery`` (checkpoint); its URL.

    Raises:
        ConfigError: the space is pinned to the development IdP and no ``dev_idp_url`` is
            known, or the face's settings are refused by :func:`build_public_app`.
        OSError: the port is taken (the host retries the lane).
    """
    pin = load_idp_pin(config.paths.idp_json)
    idp_url = config.dev_idp_url if pin.kind == "dev" else pin.url
    if not idp_url:
        raise ConfigError(
            f"space {config.space} is pinned to the development IdP, which only `cotal up` serves -"
            " pin a real IdP before giving the space a public face, or drop exchangePublicPort"
        )
    public_url = face.url or f"http://127.0.0.1:{face.port}"
    app = build_public_app(
        ctx, public_url=public_url, advertised_server=face.advertised_server,
        server_url=config.server_url, idp_url=idp_url, sentinel_creds=material.sentinel_creds,
        trusted_proxy=face.trusted_proxy,
    )
    answer_health(app, health, config.space)
    await nursery.start(functools.partial(faces.serve, app, port=face.port))
    log.info("space %s: public exchange face on 127.0.0.1:%d (%s)", config.space, face.port, face.url or "no public URL")
    return public_url
