"""What one lane serves: a full lane or a callout replica, as two specs (issue 16).

``LaneSpec = FullLane | ReplicaLane``. Both name their space, its folder in the root and the
:class:`LaneCommon` settings a process gives each of its lanes; only a :class:`FullLane` has an
exchange face, a plane claim, service-endpoint admission and connect limits of its own, so a
replica cannot be given any of them (spec "Callout replicas": no HTTP face, no
``auth-service.json``, the spec's default connect limits). :func:`~cotal_trio.lane.run.run_lane`
matches on the spec's type where the two kinds differ.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from nacl.signing import VerifyKey

from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.ledger import ReadRows
from cotal_trio.core.limits import DEFAULT_LIMITS, ConnectLimits
from cotal_trio.core.manifest import SpaceEntry
from cotal_trio.core.plane import Lease
from cotal_trio.state import SpacePaths
from cotal_trio.lane.events import EventBus
from cotal_trio.lane.health import PROBE_EVERY_S
from cotal_trio.lane.plane import DEFAULT_LEASE
from cotal_trio.lane.service_users import ISSUER_LIFETIME_S, STORE_LIFETIME_S

__all__ = ["FullLane", "IdpKeys", "LaneCommon", "LaneSpec", "PublicFace", "ReplicaLane"]

IdpKeys = Callable[[], Mapping[str, VerifyKey]]


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneCommon:
    """What a full lane and a replica both take; a host gives all its lanes the same one.

    Attributes:
        server_url: the broker's seed URLs, comma-separated (``nats://127.0.0.1:<port>`` for one
            node): every connection the lane opens (callout, issuer and store sessions, the
            plane keeper) is given the whole list (issue 17 item 3).
        limits: callout limits (spec "Callout deadlines").
        reconnect: ride out a broker restart (a lane of a host); False ends the lane when its
            connection drops, so a single-space process exits non-zero and its unit restarts
            it (spec "Callout replicas").
        clock: wall time, unix seconds.
        events: the host process's event bus (issue 7 item 1): the lane publishes each callout
            answer and each exchange answer on it, and a full lane's loopback face streams it on
            ``/events``; None: no events, no ``/events``.
        issuer_lifetime_s: the lane's issuer session's credential lifetime (seconds, at least 3;
            :data:`~cotal_trio.lane.service_users.ISSUER_LIFETIME_S`, five minutes); it is
            replaced before it expires. Tests shorten it.
        store_lifetime_s: the lane's store user's credential lifetime (seconds, at least 3;
            :data:`~cotal_trio.lane.service_users.STORE_LIFETIME_S`, a day); it is replaced
            before it expires. Tests shorten it.
        wrap_ledger: wraps the lane's blocking ledger read (``ReadRows -> ReadRows``), the one
            its callout runs in worker threads: a fault to inject (a stalled or failing disk, in
            tests); None: the read as it is.
        probe_every_s: seconds between the lane's self-probes while it is healthy
            (:data:`~cotal_trio.lane.health.PROBE_EVERY_S`, 5 s; tests shorten it).
        callout_url: the seed URLs of the server whose connects the lane answers, when that is
            not ``server_url``: a leaf node's (issue 17 item 5, docs/deploy.md "Leaf nodes").
            Only the callout connection opens there; the store, issuer and plane sessions stay
            on ``server_url``, since JetStream's API does not cross a leaf-node link. None:
            ``server_url``.
    """

    server_url: str
    limits: CalloutLimits = field(default_factory=CalloutLimits)
    reconnect: bool = True
    clock: Callable[[], float] = time.time
    events: EventBus | None = None
    issuer_lifetime_s: int = ISSUER_LIFETIME_S
    store_lifetime_s: int = STORE_LIFETIME_S
    wrap_ledger: Callable[[ReadRows], ReadRows] | None = None
    probe_every_s: float = PROBE_EVERY_S
    callout_url: str | None = None


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
class _Lane:
    """The fields both specs have: the space, its folder in the root, the process's settings.

    Attributes:
        space: the space name.
        paths: the space's folder in the root (material, ledger, ``auth-service.json``).
        common: the :class:`LaneCommon` settings.
    """

    space: str
    paths: SpacePaths
    common: LaneCommon


@dataclass(frozen=True, slots=True, kw_only=True)
class FullLane(_Lane):
    """The full auth service of one space: its callout, its exchange faces and its plane claim.

    Attributes (beside ``space``, ``paths`` and ``common``):
        idp_keys: the pinned IdP's current key set (sync; a cache the host refreshes).
        refetch_idp_keys: re-reads that key set for an unknown ``kid`` (an oidc pin's
            :meth:`~cotal_trio.service.idp_keys.IdpKeyCache.refetch`), or None (fixed keys).
        connect_limits: ``connectLimits`` (spec "Connect limits"): one limiter per lane start,
            shared by its callout and its exchange faces, on trio time.
        http_port: loopback exchange port; 0 picks a free one.
        lease: the plane claim's lease and fencing margin (tests shorten it).
        service_endpoints: open the space's service-endpoint admission (nothing closes it).
        public: the public exchange face the space's manifest entry names, or None for the
            loopback face alone.
        dev_idp_url: where the development IdP is served (``cotal up``), which a public face's
            bootstrap document names for a space pinned to it; None elsewhere.
        holder: the plane claim holder id. A host passes the same id to every start of one
            space's lane, so a restart takes back the claim its stopped earlier start could not
            release (broker gone); None: a fresh id per start.
        tool_result_consent: serve the opt-in host-only door ``POST /tool-result-consent/issue``
            (the manifest entry's ``toolResultConsent``).
        replicas: the copies JetStream keeps of each of the space's stores (the entry's
            ``replicas``, 1..5): the lane creates them so and scales existing ones up at start
            (issue 17 item 1; :mod:`cotal_trio.stores.replicas`). A replica lane creates none.
    """

    idp_keys: IdpKeys
    refetch_idp_keys: Callable[[str], Awaitable[None]] | None = None
    connect_limits: ConnectLimits = DEFAULT_LIMITS
    http_port: int = 0
    lease: Lease = DEFAULT_LEASE
    service_endpoints: bool = False
    public: PublicFace | None = None
    dev_idp_url: str | None = None
    holder: str | None = None
    tool_result_consent: bool = False
    replicas: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaLane(_Lane):
    """A callout replica of one space (spec "Callout replicas"): the callout alone, no HTTP
    face, no ``auth-service.json``, never the plane claim; it refuses a space whose
    service-endpoint admission is open."""

    @property
    def connect_limits(self) -> ConnectLimits:
        """A replica keeps the spec's default connect limits (no setting can change them)."""
        return DEFAULT_LIMITS


LaneSpec = FullLane | ReplicaLane
