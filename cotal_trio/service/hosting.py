"""``cotal auth-service``'s glue: one lane per space, from a root, for a host or alone.

:func:`lane_factory` is the host's ``start_lane`` (``HostConfig.start_lane``): for a manifest
entry it returns a startable that reads the space's IdP pin from the root, builds that space's
:class:`~cotal_trio.lane.spec.FullLane` or :class:`~cotal_trio.lane.spec.ReplicaLane` and runs
:func:`~cotal_trio.lane.run.run_lane`
with the same ``task_status``. :func:`run_service` is what the CLI awaits (STYLE.md practice 25):
a lane host on a manifest (``--spaces``) or one lane alone (``--space``).

The auth service starts no broker and pushes no account: the broker at ``server_url`` must
already trust each space's accounts (the operator pushes them; ``cotal up`` does for its space).

IdP keys (full lanes only; a callout-only lane never verifies an IdP token, so a replica does not
depend on the IdP being reachable): a ``dev`` pin takes its key set from ``<root>/devidp.json``;
an ``oidc`` pin's JWKS is fetched once before the lane starts and re-read every
``JWKS_REFRESH_S`` in the lane's own nursery (a failed re-read keeps the last good keys).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import NoReturn

import trio
from nacl.signing import VerifyKey

from cotal_trio.broker.spaces import hosted_entries
from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.errors import ConfigError
from cotal_trio.core.events import lane_event
from cotal_trio.core.idp import parse_jwks
from cotal_trio.core.limits import DEFAULT_LIMITS, REPLICA_LIMITS, ConnectLimits
from cotal_trio.core.manifest import SpaceEntry, public_face_problems
from cotal_trio.devidp import jwks
from cotal_trio.state import RootPaths, load_idp_pin
from cotal_trio.state.space_folders import require_space
from cotal_trio.lane.events import EventBus
from cotal_trio.lane.ops import OpsBoard
from cotal_trio.service.host import Host, HostConfig, run_host
from cotal_trio.service.idp_keys import IdpKeyCache, open_pinned_keys
from cotal_trio.service.notify import ServiceNotifier
from cotal_trio.service.ops_face import check_ops_port, run_ops_face
from cotal_trio.service.pins import load_pinned_dev_idp
from cotal_trio.lane.plane import holder_id
from cotal_trio.lane.run import LaneInfo, run_lane
from cotal_trio.lane.spec import FullLane, LaneCommon, LaneSpec, PublicFace, ReplicaLane

__all__ = [
    "PUBLIC_FLAGS", "FullLanes", "ReplicaLanes", "ServiceConfig", "ServiceInfo", "check_public_flags",
    "given_public_flags", "lane_factory", "public_fields", "run_service",
]

log = logging.getLogger("cotal.host")

Startable = Callable[..., object]

# The public-face flags of `cotal auth-service --space` and `cotal up`, by the manifest key they
# set; each is the SpaceEntry field of the same meaning (core/manifest.py).
PUBLIC_FLAGS: Mapping[str, str] = MappingProxyType({
    "exchangePublicPort": "--exchange-public-port",
    "exchangePublicUrl": "--exchange-public-url",
    "exchangeTrustedProxy": "--exchange-trusted-proxy",
    "advertisedServer": "--advertised-server",
})
_PUBLIC_FIELDS: Mapping[str, str] = MappingProxyType({
    "exchangePublicPort": "exchange_public_port",
    "exchangePublicUrl": "exchange_public_url",
    "exchangeTrustedProxy": "exchange_trusted_proxy",
    "advertisedServer": "advertised_server",
})


def public_fields(config: object) -> dict[str, object]:
    """``config``'s public-face settings as :class:`SpaceEntry` keyword arguments.

    ``config`` has the four attributes of that name (:class:`ServiceConfig`,
    :class:`~cotal_trio.service.embedded.UpConfig`, and the CLI's one declaration of the flags,
    ``cotal_trio.cli.common.PublicFaceFlags``, which the commands spread into those configs).
    """
    return {name: getattr(config, name) for name in _PUBLIC_FIELDS.values()}


def given_public_flags(fields: Mapping[str, object]) -> list[str]:
    """The public-face flags set in ``fields`` (:func:`public_fields`), in flag order."""
    return [PUBLIC_FLAGS[key] for key, name in _PUBLIC_FIELDS.items() if fields[name] is not None and fields[name] is not False]


def check_public_flags(fields: Mapping[str, object]) -> None:
    """Refuse public-face flags a manifest entry would refuse (the manifest's own rules).

    Raises:
        ConfigError: the first broken rule, one sentence naming the flag and its fix.
    """
    problems = public_face_problems(
        port=fields["exchange_public_port"], url=fields["exchange_public_url"],
        trusted_proxy=fields["exchange_trusted_proxy"], advertised_server=fields["advertised_server"],
        names=PUBLIC_FLAGS, verb="pass",
    )
    if problems:
        raise ConfigError(problems[0])


def _refuse_public_flags(config: ServiceConfig) -> None:
    """The public-face flags need ``--space`` and a full service (checked in this order)."""
    given = given_public_flags(public_fields(config))
    if not given:
        return
    flags = " and ".join(given)
    if config.callout_only:
        raise ConfigError(
            f"{flags}: a callout-only replica has no exchange, so it has no public face"
            f" - drop --callout-only or {'that flag' if len(given) == 1 else 'those flags'}"
        )
    if config.manifest is not None:
        keys = " and ".join(f'"{key}"' for key, flag in PUBLIC_FLAGS.items() if flag in given)
        raise ConfigError(
            f"{flags} appl{'ies' if len(given) == 1 else 'y'} to --space only - with --spaces,"
            f" set {keys} on the space's manifest entry instead"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class FullLanes:
    """A process's full lanes: what :func:`lane_factory` gives each beyond :class:`LaneCommon`.

    Attributes:
        http_ports: the loopback exchange port of the spaces it names (``cotal up --http-port``
            for its own space); every other full lane binds a free port and records it in its
            ``auth-service.json``.
        dev_idp_url: where the development IdP is served (``cotal up``), which a public face names.
        connect_limits: ``connectLimits`` for every lane (spec "Connect limits").
    """

    http_ports: Mapping[str, int] = field(default_factory=dict)
    dev_idp_url: str | None = None
    connect_limits: ConnectLimits = DEFAULT_LIMITS


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaLanes:
    """A process's callout replicas (``--callout-only``): :class:`LaneCommon` is all they take."""


def lane_factory(
    *, root: RootPaths, common: LaneCommon, lanes: FullLanes | ReplicaLanes
) -> Callable[[SpaceEntry], Startable]:
    """The host's ``start_lane``: ``entry -> startable`` serving ``entry.space`` from ``root``.

    Every lane gets ``common`` (the broker, the limits, the process's event bus, ...). With
    :class:`FullLanes` each is a :class:`~cotal_trio.lane.spec.FullLane`: the entry's
    ``serviceEndpoints``, ``toolResultConsent`` and public-face fields (``exchangePublicPort``
    and friends) go to it, with one plane claim holder id per space across its restarts. With
    :class:`ReplicaLanes` each is a :class:`~cotal_trio.lane.spec.ReplicaLane` (only the entry's
    ``space`` is read). A space must be pinned (``cotal up --space`` and ``cotal space add`` pin
    it); an unpinned space's lane fails and is retried.

    The startable raises (before ``started``) ``ConfigError`` for missing or corrupt material
    or pin, and ``Unavailable`` for an unreachable broker or IdP; the host then marks the lane
    ``retrying``.
    """
    holders: dict[str, str] = {}  # one plane claim holder id per space, across restarts

    def start_lane(entry: SpaceEntry) -> Startable:
        spec: LaneSpec
        paths = root.space(entry.space)
        match lanes:
            case FullLanes():
                spec = FullLane(
                    space=entry.space, paths=paths, common=common, idp_keys=_no_keys,
                    http_port=lanes.http_ports.get(entry.space, 0), service_endpoints=entry.service_endpoints,
                    public=PublicFace.of(entry), dev_idp_url=lanes.dev_idp_url, connect_limits=lanes.connect_limits,
                    holder=holders.setdefault(entry.space, holder_id()), tool_result_consent=entry.tool_result_consent,
                    replicas=entry.replicas,
                )
            case ReplicaLanes():
                _refuse_full_fields(entry)
                spec = ReplicaLane(space=entry.space, paths=paths, common=common)
        return functools.partial(_run_space, spec, root=root)
    return start_lane


def _refuse_full_fields(entry: SpaceEntry) -> None:
    """A replica's entry names nothing only a full lane has (a callout-only manifest reads only
    ``space``, so only an entry built by hand can).

    Raises:
        ConfigError: the entry names a public exchange face or service endpoints.
    """
    if entry.exchange_public_port is not None:
        raise ConfigError(
            f"space {entry.space}: a callout-only replica has no HTTP face - drop the public"
            " exchange settings from its entry, or run the full auth service for it"
        )
    if entry.service_endpoints:
        raise ConfigError(
            f"space {entry.space}: a callout-only replica cannot open service endpoints"
            " - run the full auth service with them, or leave them off the replica"
        )


async def _run_space(
    spec: LaneSpec, *, root: RootPaths,
    task_status: trio.TaskStatus[LaneInfo] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve ``spec.space`` until cancelled (startable; ``started`` with its :class:`LaneInfo`).

    A full lane's ``idp_keys`` are replaced here by the space's pinned key set (a replica never
    verifies an IdP token).

    Raises:
        ConfigError: the root does not hold the space (``space S is not in the root R - see cotal
            space list``: a manifest's typo, named before any of its files is read), or
            :func:`run_lane`'s and :func:`_idp_keys`' own refusals.
    """
    require_space(root, spec.space)  # a manifest's typo is named as every --space command names it
    async with trio.open_nursery() as nursery:
        if isinstance(spec, FullLane):
            keys = await _idp_keys(nursery, root, spec.space)
            spec = dataclasses.replace(spec, idp_keys=keys.keys, refetch_idp_keys=keys.refetch)
        await run_lane(spec, task_status=task_status)
    raise AssertionError("unreachable")  # pragma: no cover


def _no_keys() -> Mapping[str, VerifyKey]:
    return {}


async def _idp_keys(nursery: trio.Nursery, root: RootPaths, space: str) -> IdpKeyCache:
    """The key set of ``space``'s pinned IdP (an oidc pin's is refreshed in ``nursery``, and
    re-read for an unknown ``kid``; a dev pin's never changes).

    Raises:
        ConfigError: no pin, a corrupt pin or ``devidp.json``, or a dev pin naming another IdP.
        Unavailable: the oidc pin's JWKS could not be read in time.
    """
    pin = load_idp_pin(root.space(space).idp_json)
    if pin.kind == "dev":
        return IdpKeyCache(parse_jwks(jwks(load_pinned_dev_idp(root, space, pin.issuer))))
    return await open_pinned_keys(pin.jwks_uri, nursery)


# --- the service: a host on a manifest, or one lane ------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceConfig:
    """``cotal auth-service``'s flags as a value.

    Attributes:
        root: the root holding each space's material.
        server_url: the broker's seed URLs, comma-separated (``nats://n1:4222,nats://n2:4222``;
            one URL for one node), which already trusts the spaces' accounts. Every connection
            of every lane opens with the whole list and uses the first seed that answers
            (issue 17 item 3).
        space: serve this one space alone (exclusive with ``manifest``).
        manifest: serve the spaces this manifest lists, live (exclusive with ``space``).
        callout_only: replica lanes: no HTTP face, no ``auth-service.json``.
        callout_server: with ``callout_only``, the seed URLs of the server whose connects the
            replica answers (a leaf node: docs/deploy.md "Leaf nodes", issue 17 item 5); its
            store and issuer sessions stay on ``server_url``. None: ``server_url``.
        service_endpoints: with ``space``, open its service-endpoint admission (nothing closes
            it); a manifest sets ``serviceEndpoints`` per entry instead.
        exchange_public_port, exchange_public_url, exchange_trusted_proxy, advertised_server:
            with ``space``, its public face (``--exchange-public-port`` and friends). They
            become the fields of the space's :class:`SpaceEntry`, so the lane gets its face
            exactly as a manifest entry gives it one; a manifest sets them per entry instead.
        limits: callout limits (the broker's auth timeout).
        ops_port: the process's operator face on 127.0.0.1 (``--ops-port``; issue 18 item 8):
            this port, or a free one for 0 (the default); its URL and capability are in
            ``<root>/ops/<port>.json``.
        nats_server: the broker's version for ``cotal_build_info``; None: the one the first
            lane's broker announces.
        connect_limits: the hosted composition's ``connectLimits`` (spec "Connect limits"); no
            flag sets them.
        clock: wall time, unix seconds.

    Raises:
        ConfigError: neither or both of ``space`` and ``manifest``; ``callout_server`` without
            ``callout_only``; ``service_endpoints`` or a
            public-face setting with ``callout_only`` or with ``manifest``; connect limits other
            than the defaults with ``callout_only``; a public-face setting the manifest would
            refuse (:func:`check_public_flags`); an ``ops_port`` that is no port, or is
            ``exchange_public_port`` too.
    """

    root: RootPaths
    server_url: str
    space: str | None = None
    manifest: Path | None = None
    callout_only: bool = False
    callout_server: str | None = None
    service_endpoints: bool = False
    exchange_public_port: int | None = None
    exchange_public_url: str | None = None
    exchange_trusted_proxy: bool = False
    advertised_server: str | None = None
    limits: CalloutLimits = field(default_factory=CalloutLimits)
    ops_port: int = 0
    nats_server: str | None = None
    connect_limits: ConnectLimits = DEFAULT_LIMITS
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        check_ops_port(self.ops_port)
        if self.ops_port and self.ops_port == self.exchange_public_port:
            raise ConfigError(
                f"--ops-port {self.ops_port} and --exchange-public-port {self.ops_port} are the same port"
                " - give each listener its own port"
            )
        if (self.space is None) == (self.manifest is None):
            raise ConfigError("pass exactly one of --space (one space) and --spaces (a manifest of spaces)")
        if self.callout_server is not None and not self.callout_only:
            raise ConfigError(
                "--callout-server is for a callout replica on a leaf node (the full service's"
                " stores and faces stay on --server) - add --callout-only"
            )
        if self.service_endpoints and self.callout_only:
            raise ConfigError(
                "--service-endpoints needs the full auth service, and a callout-only replica cannot"
                " issue service-endpoint connections - drop --callout-only or --service-endpoints"
            )
        if self.callout_only and self.connect_limits != DEFAULT_LIMITS:
            raise ConfigError(REPLICA_LIMITS)
        if self.service_endpoints and self.manifest is not None:
            raise ConfigError(
                "--service-endpoints applies to --space only - with --spaces, set"
                ' "serviceEndpoints": true on the space\'s manifest entry instead'
            )
        _refuse_public_flags(self)
        check_public_flags(public_fields(self))


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceInfo:
    """A started service: the host's manifest and its ``.applied`` file and spaces, or one lane.

    Attributes:
        spaces: the spaces being started or served.
        ops_url: the process's operator face (``http://127.0.0.1:<port>``).
        manifest: the manifest (``None`` for one space).
        applied: ``<manifest>.applied`` (``None`` for one space).
        lane: the single lane's :class:`LaneInfo` (``None`` for a host).
        host: the running :class:`~cotal_trio.service.host.Host`, to ask which lanes serve
            (``None`` for one space).
    """

    spaces: tuple[str, ...]
    ops_url: str = ""
    manifest: Path | None = None
    applied: Path | None = None
    lane: LaneInfo | None = None
    host: Host | None = None


async def run_service(
    config: ServiceConfig, *, task_status: trio.TaskStatus[ServiceInfo] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Run the auth service until cancelled (startable; ``started`` with a :class:`ServiceInfo`).

    With a manifest, a lane failure is retried by the host and never ends this function. With
    one space, a lane failure propagates (a single-space replica exits non-zero).

    The process's operator face (:mod:`cotal_trio.service.ops_face`) listens before any lane
    starts, for the life of the process.

    Under systemd (``$NOTIFY_SOCKET``) it sends READY once every lane has its outcome (serving,
    or retrying with its reason), STATUS on lane changes, WATCHDOG pings and STOPPING when
    cancelled (:mod:`cotal_trio.service.notify`).

    Raises:
        ConfigError, Unavailable: one space's lane could not start, or ended; ConfigError: the
            operator face's port is busy (before ``started``, naming ``--ops-port``).
    """
    events = EventBus(clock=config.clock)  # one per process: the lanes' /events (issue 7 item 1)
    board = OpsBoard(events, nats_server=config.nats_server)  # one per process: the operator face (issue 18 item 8)
    common = LaneCommon(
        server_url=config.server_url, limits=config.limits, clock=config.clock, events=events, board=board,
        reconnect=config.manifest is not None,  # one space: a lost broker ends the process
        callout_url=config.callout_server,
    )
    lanes = ReplicaLanes() if config.callout_only else FullLanes(connect_limits=config.connect_limits)
    start_lane = lane_factory(root=config.root, common=common, lanes=lanes)
    notifier = ServiceNotifier.from_environ()  # systemd's Type=notify (service/notify.py; issue 7 item 4)
    async with trio.open_nursery() as nursery:
        await nursery.start(notifier.run)
        ops_url = await nursery.start(functools.partial(
            run_ops_face, root=config.root, port=config.ops_port, board=board, events=events, clock=config.clock,
        ))
        if config.manifest is None:
            assert config.space is not None  # __post_init__
            entry = SpaceEntry(
                space=config.space, service_endpoints=config.service_endpoints,
                replicas=_recorded_replicas(config.root, config.space), **public_fields(config),
            )
            events.publish(lane_event(config.space, "starting"))
            lane = await nursery.start(start_lane(entry))
            events.publish(lane_event(config.space, "serving"))
            notifier.serving(config.space)
            task_status.started(ServiceInfo(spaces=(config.space,), ops_url=ops_url, lane=lane))
        else:
            host = await nursery.start(run_host, HostConfig(
                manifest=config.manifest, start_lane=start_lane, callout_only=config.callout_only,
                clock=config.clock, events=events,
            ))
            nursery.start_soon(notifier.follow, host)
            task_status.started(ServiceInfo(
                spaces=tuple(host.current_states()), ops_url=ops_url, manifest=config.manifest,
                applied=_applied(config.manifest), host=host,
            ))
    raise AssertionError("unreachable")  # pragma: no cover


def _recorded_replicas(root: RootPaths, space: str) -> int:
    """The store replica count the root's ``spaces.json`` entry of ``space`` asks for
    (``cotal space add S --replicas N``; issue 17 item 1), else 1: ``--space`` serves a space the
    root's manifest may describe too. A manifest that does not parse is logged and read as no
    entry (a ``--space`` service does not serve that file, so its typo stops nothing here).
    """
    try:
        entries = hosted_entries(root)
    except ConfigError as exc:
        log.warning("space %s: %s; its stores keep replicas 1", space, exc)
        return 1
    return next((entry.replicas for entry in entries if entry.space == space), 1)


def _applied(manifest: Path) -> Path:
    """``<manifest>.applied``, as the host writes it (beside the manifest's own path)."""
    path = Path(os.path.abspath(manifest))
    return path.with_name(path.name + ".applied")
