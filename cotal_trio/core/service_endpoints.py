"""Service endpoints: the registration row, the two doors' bodies and every decision (spec
"Listener policy", "Callout replicas"; docs/http-api.md "Service endpoints").

A **service endpoint** is a named service of a space, ``<endpoint>`` (``[A-Za-z0-9_-]{1,64}``,
never ``v1``: that name is the issued rail), that callers reach on the endpoint rails
``cotal.<space>.ep.<endpoint>.<verb>.<owner>.<actor>`` and
``cotal.<space>.ep.v1.<generation>.<owner>.<actor>.<endpoint>.<verb>`` (docs/wire-layout.md). Only
a space whose full auth service runs with ``--service-endpoints`` (or whose manifest entry sets
``serviceEndpoints``) hosts them. Its host is one principal ``<owner>.<actor>`` whose ledger row
carries scope :data:`SERVICE_ENDPOINT_SCOPE`:

1. a person registers the endpoint for one of their actors (interactive, or a managed agent of
   theirs) with ``POST /service-endpoint-authority`` (``register``), which binds the name to that
   principal and answers a fresh ``instanceId``;
2. the host (that person, or the actor's managed agent) takes a ``service-host`` bearer for the
   registration from ``POST /service-endpoint-host``;
3. the host connects with it; the callout admits the connection only while the lane serves
   service endpoints and the registration still names that principal and instance
   (:func:`decide_service_connect`), with :func:`~cotal_trio.core.profiles.view_permissions`'
   ``service-host`` profile: receive the endpoint's calls on both rails, answer each once.

The row lives in the records store ``cotal_records_<space>`` under ``svcep.<endpoint>``, one per
name: a name is registered to one principal at a time (create-only), the same principal's
``register`` again replaces it with a new instance and the next ``serveEpoch`` (a restarted host
takes the name back; the old instance's connects are refused from then on), and ``retire``
deletes it. Row (version 1, closed)::

    {"ver": 1, "endpoint": "search", "instanceId": "<[a-z0-9]{26,32}>", "owner": "u_…",
     "actor": "<host actor>", "serveEpoch": 1, "registeredAt": 1767225600, "label": "…" | null}

Pure and synchronous: ``stores/records.py`` does the I/O, ``http/service_endpoint_routes.py`` the
HTTP, ``lane/callout/views.py`` the callout's read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import CodecError, RefusalCode, Refused
from .registration import MAX_LABEL_CHARS, AuthorityDoor, RegistrationRequest, check_registration
from .rowcodec import decode_row, encode_row
from .sessions import is_endpoint
from .views import ServiceEndpointBinding

__all__ = [
    "AUTHORITY_BODY",
    "AUTHORITY_REQUEST",
    "MAX_LABEL_CHARS",
    "NOT_SERVING",
    "RECORD_KEY_PREFIX",
    "ROW_VERSION",
    "SERVICE_ENDPOINT_SCOPE",
    "AuthorityRequest",
    "ServiceEndpointRecord",
    "check_endpoint_name",
    "decide_registration",
    "decide_retirement",
    "decide_service_connect",
    "decide_service_host",
    "parse_authority_body",
    "parse_service_row",
    "record_key",
    "render_service_row",
]

ROW_VERSION = 1
RECORD_KEY_PREFIX = "svcep."
SERVICE_ENDPOINT_SCOPE = "service-endpoint"
"""The ledger scope a service endpoint's host principal needs (the ``service-host`` view's)."""
_KEYS = ("ver", "endpoint", "instanceId", "owner", "actor", "serveEpoch", "registeredAt", "label")

AUTHORITY_BODY = "service-endpoint authority needs { idpToken, request } and nothing else"
AUTHORITY_REQUEST = (
    'request must be {"kind": "register", "actor": "<host actor>", "endpoint": "<name>", "label"?: "<text>"} '
    'or {"kind": "retire", "actor": "<host actor>", "endpoint": "<name>", "instanceId": "<id>"}'
)
ENDPOINT_RULE = "endpoint must be 1 to 64 characters of A-Z a-z 0-9 _ - and not v1 (the issued rail's name)"
NOT_SERVING = (
    "this space's auth service does not host service endpoints now - run it with --service-endpoints "
    '(or "serviceEndpoints": true in its manifest entry)'
)


def check_endpoint_name(value: object) -> str:
    """Return ``value`` if it may name a service endpoint.

    Raises:
        Refused: BAD_REQUEST :data:`ENDPOINT_RULE`.
    """
    if not is_endpoint(value) or value == "v1":
        raise Refused(RefusalCode.BAD_REQUEST, ENDPOINT_RULE)
    return value  # type: ignore[return-value]


def record_key(endpoint: str) -> str:
    """``svcep.<endpoint>``: the registration's key in ``cotal_records_<space>``.

    Raises:
        Refused: BAD_REQUEST for a name :func:`check_endpoint_name` refuses.
    """
    return f"{RECORD_KEY_PREFIX}{check_endpoint_name(endpoint)}"


def _require(ok: bool, problem: str) -> None:
    if not ok:
        raise CodecError(f"service endpoint row: {problem}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceEndpointRecord:
    """One registered service endpoint (module docstring).

    Attributes:
        endpoint: its name (``[A-Za-z0-9_-]{1,64}``, not ``v1``).
        instance_id: this registration's id, a lifecycle token ``[a-z0-9]{26,32}``.
        owner: the host principal's owner ``u_…``.
        actor: the host principal's actor (its ledger row carries :data:`SERVICE_ENDPOINT_SCOPE`).
        serve_epoch: how many times the principal has registered the name in a row, >= 1.
        registered_at: unix seconds.
        label: printable text of at most :data:`MAX_LABEL_CHARS` characters, or None.

    Raises:
        CodecError: a field breaks its grammar; the message names it.
    """

    endpoint: str
    instance_id: str
    owner: str
    actor: str
    serve_epoch: int
    registered_at: int
    label: str | None = None

    def __post_init__(self) -> None:
        _require(is_endpoint(self.endpoint) and self.endpoint != "v1", ENDPOINT_RULE)
        check_registration(self, what="service endpoint row")

    @property
    def key(self) -> str:
        """``svcep.<endpoint>``."""
        return record_key(self.endpoint)

    def answer(self) -> dict[str, Any]:
        """The doors' JSON of the registration: ``{endpoint, instanceId, owner, actor, serveEpoch,
        registeredAt, label}``."""
        return {
            "endpoint": self.endpoint, "instanceId": self.instance_id, "owner": self.owner, "actor": self.actor,
            "serveEpoch": self.serve_epoch, "registeredAt": self.registered_at, "label": self.label,
        }  # fmt: skip


def render_service_row(record: ServiceEndpointRecord) -> bytes:
    """The row's stored bytes: compact JSON, keys in the documented order
    (``parse_service_row(render_service_row(r)) == r``)."""
    return encode_row({"ver": ROW_VERSION, **record.answer()})


def parse_service_row(data: bytes) -> ServiceEndpointRecord:
    """The registration a stored row holds.

    Raises:
        CodecError: not a version-1 row of exactly the documented keys, or a field breaks its grammar.
    """
    obj = decode_row(data, what="service endpoint row", keys=_KEYS, version=ROW_VERSION)
    return ServiceEndpointRecord(
        endpoint=obj["endpoint"], instance_id=obj["instanceId"], owner=obj["owner"], actor=obj["actor"],
        serve_epoch=obj["serveEpoch"], registered_at=obj["registeredAt"], label=obj["label"],
    )  # fmt: skip


# --- POST /service-endpoint-authority ----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthorityRequest(RegistrationRequest):
    """One parsed ``POST /service-endpoint-authority`` body: a
    :class:`~cotal_trio.core.registration.RegistrationRequest` (``actor`` is the host actor, one
    of the person's: its interactive or managed row is read) and the name it binds.

    Attributes:
        endpoint: the endpoint's name.
    """

    endpoint: str


_DOOR = AuthorityDoor(
    body_rule=AUTHORITY_BODY, request_rule=AUTHORITY_REQUEST, build=AuthorityRequest,
    kinds={"register": (frozenset(), frozenset({"label"})), "retire": (frozenset({"instanceId"}), frozenset())},
    own={"endpoint": check_endpoint_name},
)  # fmt: skip


def parse_authority_body(body: object) -> AuthorityRequest:
    """Parse ``{idpToken, request}`` (closed; docs/http-api.md "Service endpoints"): a ``retire``
    without ``instanceId`` breaks the request's shape, and the endpoint is checked before the
    ``instanceId`` (:class:`~cotal_trio.core.registration.AuthorityDoor`).

    Raises:
        Refused: BAD_REQUEST :data:`AUTHORITY_BODY` for another outer shape, :data:`AUTHORITY_REQUEST`
            for an unknown kind or member, or the rule a field breaks (endpoint, instanceId, label).
    """
    return _DOOR.parse(body)


def _forbidden_without_scope(owner: str, actor: str, row_scope: tuple[str, ...]) -> None:
    if SERVICE_ENDPOINT_SCOPE not in row_scope:
        raise Refused(
            RefusalCode.FORBIDDEN,
            f"actor {actor} may not host service endpoints: its ledger row lacks scope {SERVICE_ENDPOINT_SCOPE} - "
            f"the operator grants it with `cotal actor grant {actor} --owner {owner} --scope {SERVICE_ENDPOINT_SCOPE}`"
            " (listing the actor's other scope tokens too)",
        )


def decide_registration(
    owner: str, actor: str, row_scope: tuple[str, ...], request: AuthorityRequest, existing: ServiceEndpointRecord | None,
    *, instance_id: str, now: int,
) -> ServiceEndpointRecord:
    """The registration a ``register`` request writes, or its refusal.

    Args:
        owner, actor: the host principal (the IdP token's owner, the body's actor).
        row_scope: that principal's fresh ledger row's scope (interactive or managed).
        request: the parsed body (``kind == "register"``).
        existing: the name's live registration, or None.
        instance_id: a fresh lifecycle token for the new registration.
        now: unix seconds (``registeredAt``).

    Returns:
        A record with ``serveEpoch`` 1 for a free name, or the existing one's + 1 when the name is
        already the same principal's (the old instance's connects are refused from then on).

    Raises:
        Refused: FORBIDDEN without :data:`SERVICE_ENDPOINT_SCOPE` on the row; CONFLICT when the
            name is registered to another principal.
    """
    _forbidden_without_scope(owner, actor, row_scope)
    epoch = 1
    if existing is not None:
        if (existing.owner, existing.actor) != (owner, actor):
            raise Refused(
                RefusalCode.CONFLICT,
                f"service endpoint {request.endpoint} is registered to another principal - choose another name, or"
                " ask its host to retire it",
            )
        epoch = existing.serve_epoch + 1
    return ServiceEndpointRecord(
        endpoint=request.endpoint, instance_id=instance_id, owner=owner, actor=actor, serve_epoch=epoch,
        registered_at=now, label=request.label,
    )  # fmt: skip


def _not_yours(endpoint: str, instance_id: str, owner: str, actor: str) -> Refused:
    return Refused(
        RefusalCode.NOT_FOUND,
        f"service endpoint {endpoint} instance {instance_id} is not registered to {actor} of owner {owner} -"
        " register it again with POST /service-endpoint-authority",
    )


def decide_retirement(
    owner: str, actor: str, row_scope: tuple[str, ...], request: AuthorityRequest, existing: ServiceEndpointRecord | None,
) -> ServiceEndpointRecord:
    """The registration a ``retire`` request deletes (``existing`` itself), or its refusal.

    Raises:
        Refused: FORBIDDEN without :data:`SERVICE_ENDPOINT_SCOPE`; NOT_FOUND when the name is not
            registered to this principal under ``request.instance_id``.
    """
    _forbidden_without_scope(owner, actor, row_scope)
    assert request.instance_id is not None  # parse_authority_body checked it for retire
    if existing is None or (existing.owner, existing.actor, existing.instance_id) != (owner, actor, request.instance_id):
        raise _not_yours(request.endpoint, request.instance_id, owner, actor)
    return existing


# --- POST /service-endpoint-host and the callout -----------------------------------------------


def decide_service_host(
    owner: str, actor: str, row_scope: tuple[str, ...], binding: ServiceEndpointBinding,
    record: ServiceEndpointRecord | None,
) -> ServiceEndpointRecord:
    """May principal ``owner.actor`` host ``binding``'s registration now? Its record, else Refused.

    The door asks before minting a ``service-host`` bearer (whose minting checks the view's scope
    again, :func:`~cotal_trio.core.views.check_view_scope`).

    Args:
        row_scope: the principal's fresh ledger row's scope (interactive for a person, managed
            for an agent).

    Raises:
        Refused: FORBIDDEN without :data:`SERVICE_ENDPOINT_SCOPE`; NOT_FOUND when ``record`` is
            gone or names another principal or instance.
    """
    _forbidden_without_scope(owner, actor, row_scope)
    if record is None or (record.owner, record.actor, record.instance_id, record.endpoint) != (
        owner, actor, binding.instance_id, binding.endpoint,
    ):  # fmt: skip
        raise _not_yours(binding.endpoint, binding.instance_id, owner, actor)
    return record


def decide_service_connect(
    owner: str, actor: str, binding: ServiceEndpointBinding | None, record: ServiceEndpointRecord | None, *,
    serving: bool,
) -> None:
    """The callout's check of a ``service-host`` connect, after its issuance row (spec "Listener
    policy": a lane hosts service endpoints only when its entry sets ``serviceEndpoints``).

    Args:
        owner, actor: the bearer's principal.
        binding: the bearer's ``act.serviceEndpoint``.
        record: the registration ``svcep.<endpoint>`` read just now, or None.
        serving: the lane runs with service endpoints (``--service-endpoints``/``serviceEndpoints``).

    Raises:
        Refused: NOT_GRANTED: :data:`NOT_SERVING`; a bearer without its binding; the registration
            retired, or re-registered since (another instance) or by another principal.
    """
    if not serving:
        raise Refused(RefusalCode.NOT_GRANTED, NOT_SERVING)
    if binding is None:
        raise Refused(RefusalCode.NOT_GRANTED, "a service-host bearer without its binding - take a fresh one")
    if record is None or (record.owner, record.actor, record.instance_id) != (owner, actor, binding.instance_id):
        raise Refused(
            RefusalCode.NOT_GRANTED,
            f"service endpoint {binding.endpoint} instance {binding.instance_id} is no longer registered to this"
            " principal - register it again with POST /service-endpoint-authority, then take a fresh bearer from"
            " POST /service-endpoint-host",
        )
