"""Bearer views: the table, the bindings and the checks made before a view is minted.

A view narrows (or, gated on ledger scope, elevates) what a bearer's connect may do; the callout
mints the view's permission profile (``core/profiles.py`` :func:`view_permissions`) instead of
the agent profile. The table (upstream-notes 3.4; spec "Listener policy"):

===================  =====================  ===========  =========  ====================
view                 required ledger scope  public face  agent arm  lifetime cap (s)
===================  =====================  ===========  =========  ====================
``admin``            ``admin``              no           no         900
``purger``           ``admin``              no           no         900
``channel-purger``   ``admin``              yes          no         900
``channel-writer``   ``admin``              yes          no         900
``deployer``         ``spawn``              no           no         900
``manager-service``  ``supervise``          no           no         900
``manager-caller``   (none)                 yes          yes        900
``session-caller``   (none)                 yes          no         900
``transfer-writer``  ``admin``              yes          no         300
``service-host``     ``service-endpoint``   yes          yes        900
===================  =====================  ===========  =========  ====================

``session-caller`` is minted only by ``POST /chat-session/bearer`` and ``service-host`` only by
``POST /service-endpoint-host`` (docs/http-api.md "Service endpoints"), never by ``POST /exchange``.
Four views bind the bearer to one object, carried in ``act`` (upstream-notes 3.2): ``manager-caller``
to a manager instance (``managerInstanceId``), ``session-caller`` to a chat session
(``session``, :class:`SessionBinding`), ``transfer-writer`` to one transcript object
(``transferWriter``, :class:`TransferTarget`), ``service-host`` to one registered service endpoint
(``serviceEndpoint``, :class:`ServiceEndpointBinding`); each binding is present iff its view is.

Pure and synchronous.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from cotal_trio.core.errors import ConfigError, RefusalCode, Refused
from cotal_trio.core.identity import is_lifecycle_uid
from cotal_trio.core.jose import shown
from cotal_trio.core.sessions import is_endpoint, is_session_id

__all__ = [
    "AGENT_VIEWS",
    "MAX_TOKEN_TTL_S",
    "PUBLIC_VIEWS",
    "TRANSFER_WRITER_TTL_S",
    "VIEWS",
    "VIEW_REQUIRED_SCOPE",
    "SERVICE_HOST",
    "ServiceEndpointBinding",
    "SessionBinding",
    "TransferTarget",
    "binding_mismatch",
    "check_exchange_view",
    "check_view",
    "check_view_scope",
    "is_session_id",
    "is_view",
    "view_ttl_cap",
]

# Longest bearer lifetime the issuer signs and the validator accepts (upstream MAX_TOKEN_TTL_SEC).
MAX_TOKEN_TTL_S = 900
# A transfer-writer bearer's cap: its profile default, five minutes (upstream-notes 3.2).
TRANSFER_WRITER_TTL_S = 300

# view, required ledger scope, served on the public face, offered to the agent arm, lifetime cap (s)
_TABLE: tuple[tuple[str, str | None, bool, bool, int], ...] = (
    ("admin", "admin", False, False, MAX_TOKEN_TTL_S),
    ("purger", "admin", False, False, MAX_TOKEN_TTL_S),
    ("channel-purger", "admin", True, False, MAX_TOKEN_TTL_S),
    ("channel-writer", "admin", True, False, MAX_TOKEN_TTL_S),
    ("deployer", "spawn", False, False, MAX_TOKEN_TTL_S),
    ("manager-service", "supervise", False, False, MAX_TOKEN_TTL_S),
    ("manager-caller", None, True, True, MAX_TOKEN_TTL_S),
    ("session-caller", None, True, False, MAX_TOKEN_TTL_S),
    ("transfer-writer", "admin", True, False, TRANSFER_WRITER_TTL_S),
    ("service-host", "service-endpoint", True, True, MAX_TOKEN_TTL_S),
)
SERVICE_HOST = "service-host"
"""The view of a service-endpoint connection (docs/http-api.md "Service endpoints")."""

VIEWS: tuple[str, ...] = tuple(row[0] for row in _TABLE)
"""Every view a bearer may name, in table order."""
VIEW_REQUIRED_SCOPE: Mapping[str, str | None] = MappingProxyType({row[0]: row[1] for row in _TABLE})
"""The ledger scope token each view needs (upstream ``VIEW_REQUIRED_SCOPE``); ``None``: none."""
PUBLIC_VIEWS: frozenset[str] = frozenset(row[0] for row in _TABLE if row[2])
"""Views the public face mints (upstream ``PUBLIC_EXCHANGE_VIEWS``); the rest are loopback-only."""
AGENT_VIEWS: frozenset[str] = frozenset(row[0] for row in _TABLE if row[3])
"""Views the managed-agent (actor-token) arm mints: ``manager-caller`` (and ``service-host``,
which only ``POST /service-endpoint-host`` mints)."""
_TTL_CAP_S: Mapping[str, int] = MappingProxyType({row[0]: row[4] for row in _TABLE})

FACES = ("public", "loopback")
ARMS = ("human", "agent")
# Each binding's act key and the one view it belongs to (upstream-notes 3.2 pairing rules).
_BINDINGS = (
    ("managerInstanceId", "manager-caller"), ("session", "session-caller"), ("transferWriter", "transfer-writer"),
    ("serviceEndpoint", "service-host"),
)  # fmt: skip

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# JSON numbers stay exact up to 2^53 - 1 (upstream "unsigned safe ints").
_MAX_SAFE_INT = 2**53 - 1


def is_view(value: object) -> bool:
    """True when ``value`` is one of :data:`VIEWS`."""
    return isinstance(value, str) and value in _TTL_CAP_S


def check_view(value: object) -> str:
    """Return ``value`` if it is one of :data:`VIEWS`.

    Raises:
        Refused: BAD_REQUEST naming the known views.
    """
    if not is_view(value):
        raise Refused(
            RefusalCode.BAD_REQUEST,
            f"view {shown(value)} is not a known view - name one of {', '.join(VIEWS)}, or exchange without a view",
        )
    return value  # type: ignore[return-value]


def view_ttl_cap(view: str | None) -> int:
    """The longest lifetime, in seconds, of a bearer with ``view``: 300 for ``transfer-writer``,
    900 (:data:`MAX_TOKEN_TTL_S`) for every other view and for no view.

    Raises:
        ConfigError: ``view`` is not ``None`` nor a known view (a caller bug: check it first).
    """
    if view is None:
        return MAX_TOKEN_TTL_S
    if not is_view(view):
        raise ConfigError(f"view {shown(view)} is not a known view, so it has no lifetime cap")
    return _TTL_CAP_S[view]


# --- bindings ---------------------------------------------------------------------------------


def _safe_uint(value: object) -> bool:
    return type(value) is int and 0 <= value <= _MAX_SAFE_INT


_SESSION_RULE = (
    "a chat session binding is {endpoint: 1-64 of A-Za-z0-9_-, sessionId: 22-128 of A-Za-z0-9_-, "
    "epoch and exp: whole numbers >= 0} - take it from the chat session's row"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionBinding:
    """The one chat session a ``session-caller`` bearer is bound to (``act.session``).

    Attributes:
        endpoint: the session's endpoint, ``^[A-Za-z0-9_-]{1,64}$``.
        session_id: the session id, ``^[A-Za-z0-9_-]{22,128}$``.
        epoch: the session's epoch, a whole number >= 0.
        exp: the session's expiry, unix seconds >= 0.

    Raises:
        Refused: BAD_REQUEST when a field breaks its rule (``epoch``/``exp`` also at most 2^53 - 1).
    """

    endpoint: str
    session_id: str
    epoch: int
    exp: int

    def __post_init__(self) -> None:
        ok = (
            is_endpoint(self.endpoint)
            and is_session_id(self.session_id)
            and _safe_uint(self.epoch) and _safe_uint(self.exp)
        )  # fmt: skip
        if not ok:
            raise Refused(RefusalCode.BAD_REQUEST, _SESSION_RULE)

    def to_claim(self) -> dict[str, Any]:
        """The ``act.session`` object ``{endpoint, sessionId, epoch, exp}``."""
        return {"endpoint": self.endpoint, "sessionId": self.session_id, "epoch": self.epoch, "exp": self.exp}

    @classmethod
    def from_claim(cls, obj: object) -> SessionBinding:
        """Parse an ``act.session`` object: exactly ``endpoint``, ``sessionId``, ``epoch``, ``exp``.

        Raises:
            Refused: BAD_REQUEST for another shape or a field breaking its rule.
        """
        if not isinstance(obj, dict) or set(obj) != {"endpoint", "sessionId", "epoch", "exp"}:
            raise Refused(RefusalCode.BAD_REQUEST, _SESSION_RULE)
        return cls(endpoint=obj["endpoint"], session_id=obj["sessionId"], epoch=obj["epoch"], exp=obj["exp"])


_TRANSFER_RULE = (
    'transferWriter must be exactly {"instanceId": <instance id, 26-32 of a-z0-9>, '
    '"hex": <sha256 of the transcript object, 64 lowercase hex>} - name the one object to write'
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferTarget:
    """The one transcript object a ``transfer-writer`` bearer may write (``act.transferWriter``).

    Attributes:
        instance_id: the instance the object belongs to, a lifecycle token ``[a-z0-9]{26,32}``.
        sha256_hex: the object's SHA-256, ``^[0-9a-f]{64}$``.

    Raises:
        Refused: BAD_REQUEST when a field breaks its rule.
    """

    instance_id: str
    sha256_hex: str

    def __post_init__(self) -> None:
        hex_ok = isinstance(self.sha256_hex, str) and _SHA256_HEX.fullmatch(self.sha256_hex) is not None
        if not (is_lifecycle_uid(self.instance_id) and hex_ok):
            raise Refused(RefusalCode.BAD_REQUEST, _TRANSFER_RULE)

    def to_claim(self) -> dict[str, str]:
        """The ``act.transferWriter`` object (and exchange body member) ``{instanceId, hex}``."""
        return {"instanceId": self.instance_id, "hex": self.sha256_hex}

    @classmethod
    def from_claim(cls, obj: object) -> TransferTarget:
        """Parse ``{instanceId, hex}`` (``act.transferWriter`` or the exchange's ``transferWriter``).

        Raises:
            Refused: BAD_REQUEST for another shape or a field breaking its rule.
        """
        if not isinstance(obj, dict) or set(obj) != {"instanceId", "hex"}:
            raise Refused(RefusalCode.BAD_REQUEST, _TRANSFER_RULE)
        return cls(instance_id=obj["instanceId"], sha256_hex=obj["hex"])


_SERVICE_RULE = (
    'serviceEndpoint must be exactly {"endpoint": <1-64 of A-Za-z0-9_->, "instanceId": <26-32 of a-z0-9>} '
    "- take both from the service endpoint's registration"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceEndpointBinding:
    """The one registered service endpoint a ``service-host`` bearer serves (``act.serviceEndpoint``).

    Attributes:
        endpoint: the endpoint's name, ``^[A-Za-z0-9_-]{1,64}$`` (its subjects' token).
        instance_id: the registration's instance id, a lifecycle token ``[a-z0-9]{26,32}``.

    Raises:
        Refused: BAD_REQUEST when a field breaks its rule.
    """

    endpoint: str
    instance_id: str

    def __post_init__(self) -> None:
        if not (is_endpoint(self.endpoint) and is_lifecycle_uid(self.instance_id)):
            raise Refused(RefusalCode.BAD_REQUEST, _SERVICE_RULE)

    def to_claim(self) -> dict[str, str]:
        """The ``act.serviceEndpoint`` object ``{endpoint, instanceId}``."""
        return {"endpoint": self.endpoint, "instanceId": self.instance_id}

    @classmethod
    def from_claim(cls, obj: object) -> ServiceEndpointBinding:
        """Parse ``{endpoint, instanceId}`` (``act.serviceEndpoint``).

        Raises:
            Refused: BAD_REQUEST for another shape or a field breaking its rule.
        """
        if not isinstance(obj, dict) or set(obj) != {"endpoint", "instanceId"}:
            raise Refused(RefusalCode.BAD_REQUEST, _SERVICE_RULE)
        return cls(endpoint=obj["endpoint"], instance_id=obj["instanceId"])


def binding_mismatch(
    view: str | None, *, manager_instance_id: object, session: object, transfer_writer: object,
    service_endpoint: object = None,
) -> str | None:
    """The pairing rule a bearer's bindings break, or ``None`` (upstream-notes 3.2, 3.3).

    ``managerInstanceId`` is present iff the view is ``manager-caller``, ``session`` iff
    ``session-caller``, ``transferWriter`` iff ``transfer-writer``, ``serviceEndpoint`` iff
    ``service-host`` (``None`` means absent).

    Returns:
        ``"<act key> goes with view <its view>, always and only"`` for the first binding (in that
        order) that is present without its view or absent with it; ``None`` when all pair.
    """
    present = {
        "managerInstanceId": manager_instance_id is not None,
        "session": session is not None,
        "transferWriter": transfer_writer is not None,
        "serviceEndpoint": service_endpoint is not None,
    }
    for key, its_view in _BINDINGS:
        if present[key] != (view == its_view):
            return f"{key} goes with view {its_view}, always and only"
    return None


# --- the checks -------------------------------------------------------------------------------


def check_exchange_view(view: str | None, *, face: str, arm: str) -> None:
    """Decide whether ``POST /exchange`` on ``face`` may mint ``view`` for ``arm`` (before any
    ledger read; upstream-notes 3.4, spec "Listener policy").

    In order: no view is always fine; an unknown view is refused; ``session-caller`` and
    ``service-host`` are refused on every face and arm (``POST /chat-session/bearer`` and ``POST
    /service-endpoint-host`` mint them); the agent arm is refused every
    view but ``manager-caller``; the public face is refused the loopback-only views.

    Args:
        view: the body's ``view``, or ``None``.
        face: ``"public"`` or ``"loopback"``.
        arm: ``"human"`` (IdP token) or ``"agent"`` (actor token).

    Raises:
        Refused: BAD_REQUEST with a sentence naming the fix.
        ConfigError: ``face`` or ``arm`` is not one of the values above (a caller bug).
    """
    if face not in FACES or arm not in ARMS:
        raise ConfigError(f"check_exchange_view needs face in {FACES} and arm in {ARMS}, got {face!r}, {arm!r}")
    if view is None:
        return
    check_view(view)
    if view == "session-caller":
        raise Refused(
            RefusalCode.BAD_REQUEST,
            "view session-caller is not minted by POST /exchange - open a chat session with POST "
            "/chat-session/open, then take its bearer from POST /chat-session/bearer",
        )
    if view == SERVICE_HOST:
        raise Refused(
            RefusalCode.BAD_REQUEST,
            "view service-host is not minted by POST /exchange - register the endpoint with POST "
            "/service-endpoint-authority, then take its bearer from POST /service-endpoint-host",
        )
    if arm == "agent" and view not in AGENT_VIEWS:
        raise Refused(
            RefusalCode.BAD_REQUEST,
            f"a managed agent's exchange offers only view manager-caller, not {view} - "
            "exchange with view manager-caller or without a view",
        )
    if face == "public" and view not in PUBLIC_VIEWS:
        raise Refused(
            RefusalCode.BAD_REQUEST,
            f"view {view} is served only on the loopback face - exchange it on the space's host, "
            "at the url of its auth-service.json",
        )


def check_view_scope(
    view: str, *, row_scope: Collection[str], bearer_scope: Collection[str], owner: str = "<owner>", actor: str = "<actor>"
) -> None:
    """Check that ``view``'s required ledger scope (:data:`VIEW_REQUIRED_SCOPE`) is granted.

    Used by the exchange after its ledger read (``bearer_scope`` is then the row's scope) and by
    the callout on the fresh row (spec "Listener policy": the elevated views stay gated on
    ledger scope). A view without a required scope always passes.

    Args:
        view: the view.
        row_scope: the fresh ledger row's scope tokens.
        bearer_scope: the bearer's ``act.scope``.
        owner, actor: the principal, named in the grant command of the refusal.

    Raises:
        Refused: NOT_GRANTED when the row lacks the scope (the sentence names ``cotal actor
            grant ... --scope``), or the row has it but the bearer does not (exchange a fresh
            bearer); BAD_REQUEST for an unknown view.
    """
    required = VIEW_REQUIRED_SCOPE[check_view(view)]
    if required is None:
        return
    if required not in row_scope:
        raise Refused(
            RefusalCode.NOT_GRANTED,
            f"view {view} needs ledger scope {required} - the operator grants it with `cotal actor grant "
            f"{actor} --owner {owner} --scope {required}` (listing the actor's other scope tokens too)",
        )
    if required not in bearer_scope:
        raise Refused(
            RefusalCode.NOT_GRANTED,
            f"view {view} needs scope {required} in the bearer too - it was exchanged before {required} "
            f"was granted: exchange a fresh bearer with view {view}",
        )
