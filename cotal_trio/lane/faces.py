"""A full lane's exchange faces: the loopback face with its host-only doors, the public face,
and the readiness file that announces them (spec "Exclusive ownership", "Listener policy";
DESIGN.md 7).

:func:`open_faces` serves them in the lane's nursery and writes ``auth-service.json`` ``{ver,
url, pid, cap}`` (plus ``publicUrl`` with a public face, ``devIdpUrl`` under ``cotal up``) once
every listener is bound; the file is removed when the lane stops. Each face answers ``GET
/health`` with 503 and the reason while the lane's last self-probe failed
(:func:`answer_health`). A replica has none of this (:func:`no_faces`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import trio
from quart import request
from quart_trio import QuartTrio

from cotal_trio.core.bearer import space_issuer
from cotal_trio.core.errors import ConfigError
from cotal_trio.core.limits import ConnectLimiter, Limited
from cotal_trio.core.servers import parse_servers
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
from cotal_trio.natsio import Connection
from cotal_trio.state import (
    SpaceMaterial,
    SpacePaths,
    load_idp_pin,
    load_owner_secret,
    read_json,
    read_principal,
    remove_quietly,
    write_json,
)
from cotal_trio.stores.issuance import issuance_store
from cotal_trio.stores.records import RecordsStore
from cotal_trio.stores.streams import Provisioner
from cotal_trio.lane.events import exchange_hook
from cotal_trio.lane.health import LaneHealth
from cotal_trio.lane.metrics import LaneMetrics
from cotal_trio.lane.sessions import LaneStart, Sessions
from cotal_trio.lane.spec import FullLane, PublicFace

__all__ = ["Faces", "answer_health", "exchange_context", "no_faces", "open_faces", "scrub_readiness"]

log = logging.getLogger("cotal.lane")


def exchange_context(spec: FullLane, start: LaneStart) -> ExchangeContext:
    """The exchange faces' context for one start (sync, files only): a fresh capability, the
    owner secret and IdP pin read from the root, the start's metrics and connect limits.

    Raises:
        ConfigError: the owner secret or the IdP pin is missing or corrupt (before any connect).
    """
    issuer, metrics, limiter = start.issuer, start.metrics, start.limiter
    return ExchangeContext(
        space=spec.space,
        capability=secrets.token_hex(32),
        issuer_key=issuer.active,
        owner_secret=load_owner_secret(spec.paths.owner_secret_json),
        idp_pin=load_idp_pin(spec.paths.idp_json).pin(),
        idp_keys=spec.idp_keys,
        refetch_idp_keys=spec.refetch_idp_keys,
        read_ledger=functools.partial(read_principal, spec.paths),
        clock=spec.common.clock,
        metrics=exchange_hook(metrics.exchange_answered, spec.common.events, space=spec.space, face="loopback"),
        peek_limits=functools.partial(_peek_limits, limiter),
    )


def _peek_limits(limiter: ConnectLimiter, owner: str, actor: str) -> Limited | None:
    """The exchange's look at the lane's connect limits: now on trio time, spending nothing."""
    return limiter.peek_principal(owner, actor, trio.current_time())


def answer_health(app: QuartTrio, health: LaneHealth, space: str) -> None:
    """Make ``GET /health`` of a face say why while the lane's last probe failed: 503
    ``{"ok": false, "issuer", "reason"}`` (issue 15 item 11); the face's own answer otherwise."""

    async def unhealthy() -> tuple[dict[str, object], int] | None:
        reason = health.reason
        if reason is None or request.method != "GET" or request.scope["path"] != "/health":
            return None
        return {"ok": False, "issuer": space_issuer(space), "reason": reason}, 503

    app.before_request(unhealthy)


class Faces:
    """A lane's exchange listeners, for its drain: one event stops them all, each reports its end.

    A replica's (:func:`no_faces`) has none, no URL and no readiness file.

    Attributes:
        url: the loopback face's URL once it serves, else None.
    """

    def __init__(self, paths: SpacePaths | None = None, capability: str | None = None) -> None:
        self.stopping = trio.Event()
        self.ended: list[trio.Event] = []
        self.url: str | None = None
        self._paths, self._capability = paths, capability

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

    def unpublish(self) -> None:
        """Remove the readiness file if it is still this lane's (its capability), so no client
        finds a stopping lane's face any more; a replica's faces have none."""
        if self._paths is None or self._capability is None:
            return
        try:
            ours = read_json(self._paths.auth_service_json).get("cap") == self._capability
        except ConfigError:
            return
        if ours:
            remove_quietly(self._paths.auth_service_json)


@contextlib.asynccontextmanager
async def open_faces(
    spec: FullLane, exchange: ExchangeContext, nursery: trio.Nursery, start: LaneStart, sessions: Sessions,
    health: LaneHealth,
) -> AsyncIterator[Faces]:
    """Trio: serve a full lane's exchange faces in ``nursery``, then write its readiness file;
    yields its :class:`Faces`, and removes the file on exit if it is still this lane's.

    Every listener is bound before the readiness file is written: it is the signal
    (upstream-notes 4.1), and names the public face when there is one. ``exchange`` is
    :func:`exchange_context`'s, made before the lane connected.

    Raises:
        ConfigError: the public face's settings are refused (:func:`_open_public_face`).
        OSError: a port is taken (the host retries the lane).
    """
    faces = Faces(spec.paths, exchange.capability)
    provision = Provisioner(sessions.store, spec.space)
    exchange = dataclasses.replace(exchange, records=sessions.records, provision=provision.principal)
    try:
        public_url = None
        if spec.public is not None:
            public = dataclasses.replace(exchange, metrics=exchange_hook(
                start.metrics.exchange_answered, spec.common.events, space=spec.space, face="public"))
            public_url = await _open_public_face(nursery, spec, spec.public, public, start.material, faces, health)
        elif spec.service_endpoints:
            log.warning(
                "space %s hosts service endpoints, but its doors are served on the public face it lacks - give it"
                " one (--exchange-public-port, or exchangePublicPort in its manifest entry)", spec.space,
            )
        doors = _door_tables(spec, exchange, start.material, sessions.records, sessions.store)
        faces.url = await _open_face(nursery, spec, exchange, start.metrics, public_url, doors, faces, health)
        yield faces
    finally:
        faces.unpublish()


@contextlib.asynccontextmanager
async def no_faces(nursery: trio.Nursery, start: LaneStart, sessions: Sessions, health: LaneHealth) -> AsyncIterator[Faces]:
    """A replica's faces: none (spec "Callout replicas": no HTTP face, no ``auth-service.json``)."""
    await trio.lowlevel.checkpoint()
    yield Faces()


Guard = Callable[[], Awaitable[object]]
Admit = Callable[[float], bool]


def _door_tables(
    spec: FullLane, ctx: ExchangeContext, material: SpaceMaterial, records: RecordsStore, store_conn: Connection
) -> tuple[DoorTable, ...]:
    """The loopback face's host-only doors (spec "Host-only routes"; docs/host-doors.md)."""
    lifecycle = LifecycleDoors(
        space=spec.space, data_account=material.data_account, read_ledger=ctx.read_ledger, paths=spec.paths,
        records=records, issuance=issuance_store(store_conn, spec.space), clock=spec.common.clock,
    )  # fmt: skip
    managers = ManagerDoors(
        space=spec.space, read_ledger=ctx.read_ledger, records=records, issuer_key=ctx.issuer_key,
        idp_pin=ctx.idp_pin, idp_keys=ctx.idp_keys, owner_secret=ctx.owner_secret, clock=spec.common.clock,
        tool_result_consent=spec.tool_result_consent,
    )  # fmt: skip

    def lifecycle_doors(guard: Guard, admit: Admit) -> Mapping[str, Mapping[str, Handler]]:
        return lifecycle_routes(lifecycle, guard=guard, admit_refusal=admit)

    def manager_doors(guard: Guard, admit: Admit) -> Mapping[str, Mapping[str, Handler]]:
        return manager_routes(dataclasses.replace(managers, admit_refusal=admit), guard=guard)

    return lifecycle_doors, manager_doors


def scrub_readiness(spec: FullLane) -> None:
    """Remove a readiness file left by a process that is gone; refuse one that is alive."""
    path = spec.paths.auth_service_json
    if not path.exists():
        return
    try:
        pid, written = int(read_json(path).get("pid", 0)), path.stat().st_mtime
    except (ConfigError, OSError, TypeError, ValueError):
        pid, written = 0, None
    # A pid reused since the file was written (after a SIGKILL and a reboot) is not its writer.
    if pid and pid != os.getpid() and pid_alive(pid, since=written):
        raise ConfigError(
            f"space {spec.space} is already served by pid {pid} ({path}) - stop that auth service first"
        )
    remove_quietly(path)


async def _open_face(
    nursery: trio.Nursery, spec: FullLane, ctx: ExchangeContext, metrics: LaneMetrics, public_url: str | None,
    doors: tuple[DoorTable, ...], faces: Faces, health: LaneHealth,
) -> str:
    """Serve the loopback face, then write the readiness file ``{ver, url, pid, cap[, publicUrl][,
    devIdpUrl]}`` (``devIdpUrl``: where ``cotal up`` serves the development IdP)."""
    app = build_loopback_app(ctx, metrics=metrics.exposition, doors=doors, events=spec.common.events)
    answer_health(app, health, spec.space)
    port = await nursery.start(functools.partial(faces.serve, app, port=spec.http_port))
    url = f"http://127.0.0.1:{port}"
    record: dict[str, object] = {"ver": 1, "url": url, "pid": os.getpid(), "cap": ctx.capability}
    if public_url is not None:
        record["publicUrl"] = public_url
    if spec.dev_idp_url is not None:  # `cotal connect-info` names its JWKS (issue 18 item 5)
        record["devIdpUrl"] = spec.dev_idp_url
    write_json(spec.paths.auth_service_json, record)
    return url


async def _open_public_face(
    nursery: trio.Nursery, spec: FullLane, face: PublicFace, ctx: ExchangeContext, material: SpaceMaterial,
    faces: Faces, health: LaneHealth,
) -> str:
    """Serve the public face on 127.0.0.1:``face.port`` in ``nursery`` (checkpoint); its URL.

    Raises:
        ConfigError: the space is pinned to the development IdP and no ``dev_idp_url`` is
            known, or the face's settings are refused by :func:`build_public_app`.
        OSError: the port is taken (the host retries the lane).
    """
    pin = load_idp_pin(spec.paths.idp_json)
    idp_url = spec.dev_idp_url if pin.kind == "dev" else pin.url
    if not idp_url:
        raise ConfigError(
            f"space {spec.space} is pinned to the development IdP, which only `cotal up` serves -"
            " pin a real IdP before giving the space a public face, or drop --exchange-public-port"
            " (exchangePublicPort in a manifest)"
        )
    public_url = face.url or f"http://127.0.0.1:{face.port}"
    app = build_public_app(
        ctx, public_url=public_url, advertised_server=face.advertised_server,
        server_url=parse_servers(spec.common.server_url)[0], idp_url=idp_url, sentinel_creds=material.sentinel_creds,
        trusted_proxy=face.trusted_proxy, service_endpoints=spec.service_endpoints,
    )
    answer_health(app, health, spec.space)
    await nursery.start(functools.partial(faces.serve, app, port=face.port))
    log.info("space %s: public exchange face on 127.0.0.1:%d (%s)", spec.space, face.port, face.url or "no public URL")
    return public_url
