"""Cotal bearers: issuance and validation (upstream-notes 3.1-3.3; DESIGN 6 step 3, 7).

A bearer is a compact JWS (RFC 7515) signed with Ed25519 by the space's issuer key
(:class:`~cotal_trio.core.jose.IssuerKey`):

* header ``{"alg": "EdDSA", "kid": <RFC 7638 thumbprint>, "typ": "JWT"}``;
* claims ``{scope, ver: 1, act: {owner, actor, scope?, parent?, lifecycleUid, view?,
  managerInstanceId?, session?, transferWriter?, serviceEndpoint?, credentialId?}, sub: owner,
  iss: "urn:cotal:auth:<space>", aud: <space>, iat, nbf, exp}``.

A view's binding (``managerInstanceId``, ``session``, ``transferWriter``, ``serviceEndpoint``) is present iff the bearer
names its view (``core/views.py``), checked at issue and at validation; ``exp - iat`` is capped by
:func:`~cotal_trio.core.views.view_ttl_cap` (300 s for ``transfer-writer``, else 900 s).

Validation is split so connect limits can charge an actor whose signature verified even when
the bearer is expired: :func:`verify_bearer_signature` (the key and header rules, then the
signature) and :func:`check_bearer_claims` (issuer, audience, times and claim shapes).
:func:`validate_bearer` runs both.

The JWS itself is parsed and verified by :func:`~cotal_trio.core.jose.verify_ed25519_jws`
(``core/jose.py``), the same primitive that verifies IdP tokens (``core/idp.py``).

Pure and synchronous: time comes in as ``now`` (unix seconds).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nacl.signing import VerifyKey

from cotal_trio.core.errors import ConfigError, RefusalCode, Refused
from cotal_trio.core.identity import (
    check_actor,
    check_lifecycle_uid,
    check_owner,
    check_principal,
    check_scope_token,
    check_space,
    is_actor,
    is_lifecycle_uid,
    is_owner,
    is_principal,
    is_scope_token,
)
from cotal_trio.core.jose import (
    IssuerKey,
    JwsWording,
    refuse_jws,
    shown,
    sign_ed25519_jws,
    verify_ed25519_jws,
)
from cotal_trio.core.views import (
    MAX_TOKEN_TTL_S,
    VIEWS,
    ServiceEndpointBinding,
    SessionBinding,
    TransferTarget,
    binding_mismatch,
    is_view,
    view_ttl_cap,
)

__all__ = [
    "BEARER_VER",
    "CLOCK_SKEW_S",
    "KNOWN_VIEWS",
    "MAX_TOKEN_TTL_S",
    "BearerGrant",
    "ValidatedBearer",
    "check_bearer_claims",
    "is_credential_id",
    "issue_bearer",
    "space_issuer",
    "validate_bearer",
    "verify_bearer_signature",
    "BearerVerifier",
]

# Tolerance for clock differences between the issuing and the validating host (DESIGN 6 step 3).
CLOCK_SKEW_S = 5
# The header typ a bearer carries; a JWS of another type signed by the issuer key (a consent,
# typ cotal-consent+jwt) is never taken for a bearer (RFC 8725 section 3.11).
BEARER_TYP = frozenset({"JWT"})
# The claims version this code writes and accepts (upstream USER_TOKEN_VER).
BEARER_VER = 1
# Views a bearer may name (upstream-notes 3.4): the table of core/views.py.
KNOWN_VIEWS = frozenset(VIEWS)

_CREDENTIAL_ID = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_MAX_CREDENTIAL_ID_CHARS = 256
_ACT_KEYS = frozenset(
    {"owner", "actor", "scope", "parent", "lifecycleUid", "view", "managerInstanceId", "session", "transferWriter",
     "serviceEndpoint", "credentialId"}
)  # fmt: skip


def space_issuer(space: str) -> str:
    """The bearer ``iss`` of a space: ``urn:cotal:auth:<space>`` (upstream-notes 3.1)."""
    return f"urn:cotal:auth:{space}"


def is_credential_id(value: object) -> bool:
    """True for a credential id: at most 256 chars of dot-separated ``[A-Za-z0-9_-]+`` segments."""
    return (
        isinstance(value, str)
        and len(value) <= _MAX_CREDENTIAL_ID_CHARS
        and _CREDENTIAL_ID.fullmatch(value) is not None
    )


# --- issuance -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BearerGrant:
    """What a bearer asserts, taken from a ledger row (upstream-notes 3.2 ``act``).

    Attributes:
        owner: derived owner ``u_…``; also the bearer's ``sub``.
        actor: actor token.
        scope: scope tokens (may be empty).
        lifecycle_uid: the row's lifecycle UID; bearers are lifecycle-bound.
        parent: ``<owner>.<actor>`` of the spawner, or ``None``.
        view: one of :data:`KNOWN_VIEWS`, or ``None``.
        credential_id: the root credential id, or ``None``.
        manager_instance_id: the manager instance (lifecycle token) of a ``manager-caller``
            bearer; ``None`` for every other view.
        session: the chat session of a ``session-caller`` bearer; ``None`` otherwise.
        transfer_writer: the transcript object of a ``transfer-writer`` bearer; ``None`` otherwise.
        service_endpoint: the registered endpoint of a ``service-host`` bearer; ``None`` otherwise.

    Raises:
        Refused: BAD_REQUEST when a field breaks its grammar (see ``core/identity.py``) or a
            binding does not pair with the view (:func:`~cotal_trio.core.views.binding_mismatch`).
    """

    owner: str
    actor: str
    scope: tuple[str, ...]
    lifecycle_uid: str
    parent: str | None = None
    view: str | None = None
    credential_id: str | None = None
    manager_instance_id: str | None = None
    session: SessionBinding | None = None
    transfer_writer: TransferTarget | None = None
    service_endpoint: ServiceEndpointBinding | None = None

    def __post_init__(self) -> None:
        _check_grant_fields(self)


def _check_grant_fields(value: BearerGrant | ValidatedBearer) -> None:
    check_owner(value.owner)
    check_actor(value.actor)
    if not isinstance(value.scope, tuple):
        raise Refused(RefusalCode.BAD_REQUEST, "scope must be a tuple of scope tokens")
    for token in value.scope:
        check_scope_token(token)
    check_lifecycle_uid(value.lifecycle_uid)
    if value.parent is not None:
        check_principal(value.parent)
    if value.view is not None and not is_view(value.view):
        raise Refused(RefusalCode.BAD_REQUEST, f"view {shown(value.view)} is not a known view")
    if value.credential_id is not None and not is_credential_id(value.credential_id):
        raise Refused(RefusalCode.BAD_REQUEST, "a credential id is dot-separated [A-Za-z0-9_-] segments, at most 256 chars")
    _check_bindings(value)


def _check_bindings(value: BearerGrant | ValidatedBearer) -> None:
    if value.manager_instance_id is not None and not is_lifecycle_uid(value.manager_instance_id):
        raise Refused(RefusalCode.BAD_REQUEST, "a manager instance id is 26 to 32 characters of a-z and 0-9")
    if value.session is not None and not isinstance(value.session, SessionBinding):
        raise Refused(RefusalCode.BAD_REQUEST, "session must be a SessionBinding")
    if value.transfer_writer is not None and not isinstance(value.transfer_writer, TransferTarget):
        raise Refused(RefusalCode.BAD_REQUEST, "transfer_writer must be a TransferTarget")
    if value.service_endpoint is not None and not isinstance(value.service_endpoint, ServiceEndpointBinding):
        raise Refused(RefusalCode.BAD_REQUEST, "service_endpoint must be a ServiceEndpointBinding")
    problem = binding_mismatch(
        value.view, manager_instance_id=value.manager_instance_id, session=value.session,
        transfer_writer=value.transfer_writer, service_endpoint=value.service_endpoint,
    )  # fmt: skip
    if problem is not None:
        raise Refused(RefusalCode.BAD_REQUEST, f"a bearer's {problem}")


def _act_claim(grant: BearerGrant) -> dict[str, Any]:
    act: dict[str, Any] = {"owner": grant.owner, "actor": grant.actor}
    if grant.scope:
        act["scope"] = list(grant.scope)
    if grant.parent is not None:
        act["parent"] = grant.parent
    act["lifecycleUid"] = grant.lifecycle_uid
    if grant.view is not None:
        act["view"] = grant.view
    if grant.manager_instance_id is not None:
        act["managerInstanceId"] = grant.manager_instance_id
    if grant.session is not None:
        act["session"] = grant.session.to_claim()
    if grant.transfer_writer is not None:
        act["transferWriter"] = grant.transfer_writer.to_claim()
    if grant.service_endpoint is not None:
        act["serviceEndpoint"] = grant.service_endpoint.to_claim()
    if grant.credential_id is not None:
        act["credentialId"] = grant.credential_id
    return act


def issue_bearer(grant: BearerGrant, *, key: IssuerKey, space: str, now: int, ttl_s: int) -> tuple[str, int]:
    """Sign a bearer for ``grant`` (upstream-notes 3.2).

    Args:
        grant: the claims source (already authorized against the ledger).
        key: the space's active issuer key; its ``kid`` goes in the header.
        space: the space name (``aud``; ``iss`` is :func:`space_issuer`).
        now: unix seconds, integer; becomes ``iat`` and ``nbf``.
        ttl_s: lifetime in seconds, 1 to the view's cap (:func:`~cotal_trio.core.views.view_ttl_cap`:
            300 for ``transfer-writer``, else :data:`MAX_TOKEN_TTL_S`).

    Returns:
        ``(token, exp)`` with ``exp = now + ttl_s`` (unix seconds).

    Raises:
        ConfigError: ``ttl_s`` or ``now`` is not a positive integer, or ``ttl_s`` exceeds 900 or
            the view's cap (a caller bug: callers cap the lifetime first).
        Refused: BAD_REQUEST when ``space`` breaks the space grammar.
    """
    if type(ttl_s) is not int or not 0 < ttl_s <= MAX_TOKEN_TTL_S:
        raise ConfigError(f"a bearer lifetime must be 1 to {MAX_TOKEN_TTL_S} seconds, got {ttl_s!r}")
    cap = view_ttl_cap(grant.view)
    if ttl_s > cap:
        raise ConfigError(f"a {grant.view} bearer lifetime must be 1 to {cap} seconds, got {ttl_s!r}")
    if type(now) is not int or now <= 0:
        raise ConfigError(f"issue_bearer needs now as positive integer unix seconds, got {now!r}")
    check_space(space)
    exp = now + ttl_s
    claims = {
        "scope": list(grant.scope), "ver": BEARER_VER, "act": _act_claim(grant), "sub": grant.owner,
        "iss": space_issuer(space), "aud": space, "iat": now, "nbf": now, "exp": exp,
    }  # fmt: skip
    return sign_ed25519_jws({"alg": "EdDSA", "kid": key.kid, "typ": "JWT"}, claims, key), exp


# --- validation -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidatedBearer:
    """A bearer whose signature and claims passed :func:`validate_bearer`.

    Attributes are those of :class:`BearerGrant` plus ``iat`` and ``exp`` (unix seconds).
    ``scope`` is ``act.scope`` in token order (empty when absent).

    Raises:
        Refused: BAD_REQUEST when a field breaks its grammar or a binding does not pair.
    """

    owner: str
    actor: str
    scope: tuple[str, ...]
    lifecycle_uid: str
    parent: str | None
    view: str | None
    credential_id: str | None
    iat: int
    exp: int
    manager_instance_id: str | None = None
    session: SessionBinding | None = None
    transfer_writer: TransferTarget | None = None
    service_endpoint: ServiceEndpointBinding | None = None

    def __post_init__(self) -> None:
        _check_grant_fields(self)

    @property
    def principal(self) -> str:
        """``<owner>.<actor>``."""
        return f"{self.owner}.{self.actor}"


_BEARER_WORDING = JwsWording(
    what="bearer",
    fix="exchange a fresh bearer from this space's auth service",
    unknown_key=(
        "bearer key {kid} is not one this space's auth service signs with - "
        "exchange a fresh bearer from this space's auth service"
    ),
)


def _bad(problem: str) -> Refused:
    return refuse_jws(_BEARER_WORDING, problem)


def verify_bearer_signature(token: object, keys: Mapping[str, VerifyKey]) -> dict[str, Any]:
    """Verify a bearer's header and signature; return its claims, unchecked.

    The first half of :func:`validate_bearer` (DESIGN 6 step 3): a caller may charge the
    ``act`` of a bearer that passed this step to connect limits even if its claims then fail.

    Args:
        token: the ``auth_token`` as received.
        keys: the space's issuer keys, ``{kid: VerifyKey}`` (a :class:`~cotal_trio.core.jose.BearerKeySet`).

    Returns:
        The claims object.

    Raises:
        Refused: BAD_CREDENTIAL on any rule of :func:`~cotal_trio.core.jose.verify_ed25519_jws`.
    """
    return verify_ed25519_jws(token, keys, wording=_BEARER_WORDING, typ=BEARER_TYP)


def _int_claim(claims: Mapping[str, Any], name: str) -> int:
    value = claims.get(name)
    if type(value) is not int:
        raise _bad(f"claim {name} is missing or not an integer")
    return value


def _check_issuer_and_audience(claims: Mapping[str, Any], space: str) -> None:
    if claims.get("iss") != space_issuer(space):
        raise _bad(f"was not issued by this space's auth service (iss must be {space_issuer(space)})")
    aud = claims.get("aud")
    if aud != space and aud != [space]:
        raise _bad(f"is not for space {space} (aud must be {shown(space)})")
    ver = claims.get("ver")
    if type(ver) is not int or ver != BEARER_VER:
        raise _bad(f"version {shown(ver)} is not understood (ver 1 only)")


def _check_times(claims: Mapping[str, Any], now: float, view: str | None) -> tuple[int, int]:
    exp, iat, nbf = (_int_claim(claims, name) for name in ("exp", "iat", "nbf"))
    if now >= exp + CLOCK_SKEW_S:
        raise Refused(RefusalCode.BAD_CREDENTIAL, "bearer expired - exchange a fresh one")
    if nbf > now + CLOCK_SKEW_S or iat > now + CLOCK_SKEW_S:
        raise Refused(
            RefusalCode.BAD_CREDENTIAL,
            "bearer is not valid yet (issued in the future) - check the clocks of this host "
            "and of the auth service host, then exchange a fresh bearer",
        )
    cap = view_ttl_cap(view)
    if not 0 < exp - iat <= cap:
        raise _bad(f"lifetime exp - iat must be 1 to {cap} seconds" + (f" for view {view}" if cap < MAX_TOKEN_TTL_S else ""))
    return iat, exp


def _scope_list(value: object, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(is_scope_token(token) for token in value):
        raise _bad(f"{name} must be a list of scope tokens")
    return tuple(value)


def _claimed_view(claims: Mapping[str, Any]) -> str | None:
    """``act.view`` when it is a known view, else ``None`` (:func:`_check_act` refuses the rest)."""
    act = claims.get("act")
    view = act.get("view") if isinstance(act, dict) else None
    return view if is_view(view) else None


def _binding(act: Mapping[str, Any], name: str, parse: Callable[[object], Any]) -> Any:
    """Parse the act member ``name`` with ``parse`` when present (``null`` is malformed too)."""
    if name not in act:
        return None
    try:
        return parse(act[name])
    except Refused:
        raise _bad(f"act.{name} is malformed") from None


def _instance_id(value: object) -> str:
    if not is_lifecycle_uid(value):
        raise Refused(RefusalCode.BAD_REQUEST, "not a lifecycle token")
    return value  # type: ignore[return-value]


def _check_act_bindings(act: Mapping[str, Any], view: str | None) -> dict[str, Any]:
    bindings = {
        "manager_instance_id": _binding(act, "managerInstanceId", _instance_id),
        "session": _binding(act, "session", SessionBinding.from_claim),
        "transfer_writer": _binding(act, "transferWriter", TransferTarget.from_claim),
        "service_endpoint": _binding(act, "serviceEndpoint", ServiceEndpointBinding.from_claim),
    }
    problem = binding_mismatch(view, **bindings)
    if problem is not None:
        raise _bad(f"act.{problem}")
    return bindings


def _optional(act: Mapping[str, Any], name: str, valid: Any) -> str | None:
    value = act.get(name)
    if value is not None and not valid(value):
        raise _bad(f"act.{name} is malformed")
    return value


def _check_act(claims: Mapping[str, Any]) -> dict[str, Any]:
    act = claims.get("act")
    if not isinstance(act, dict) or not act.keys() <= _ACT_KEYS:
        raise _bad(
            "act must be an object with only owner, actor, scope, parent, lifecycleUid, view, "
            "managerInstanceId, session, transferWriter, serviceEndpoint, credentialId"
        )
    if not is_owner(claims.get("sub")) or act.get("owner") != claims["sub"]:
        raise _bad("sub must be a derived owner (u_ + 26 base32 chars) equal to act.owner")
    if not is_actor(act.get("actor")):
        raise _bad("act.actor is not an actor name")
    if not is_lifecycle_uid(act.get("lifecycleUid")):
        raise _bad("carries no valid act.lifecycleUid (bearers are lifecycle-bound)")
    scope = _scope_list(act.get("scope", []), "act.scope")
    top = _scope_list(claims.get("scope"), "scope")
    if top and set(top) != set(scope):
        raise _bad("scope and act.scope disagree")
    view = _optional(act, "view", is_view)
    return {
        "owner": act["owner"], "actor": act["actor"], "scope": scope, "lifecycle_uid": act["lifecycleUid"],
        "parent": _optional(act, "parent", is_principal), "view": view,
        "credential_id": _optional(act, "credentialId", is_credential_id), **_check_act_bindings(act, view),
    }  # fmt: skip


def check_bearer_claims(claims: Mapping[str, Any], *, space: str, now: float) -> ValidatedBearer:
    """Check the claims of a bearer whose signature verified (upstream-notes 3.3).

    Rules: ``iss == urn:cotal:auth:<space>``; ``aud == space`` or ``[space]``; ``ver == 1``;
    integer ``exp``, ``iat``, ``nbf``; with skew :data:`CLOCK_SKEW_S`, expired when
    ``now >= exp + 5`` and not yet valid when ``nbf`` or ``iat`` exceeds ``now + 5``;
    ``0 < exp - iat <= cap`` with the cap of ``act.view`` (:func:`~cotal_trio.core.views.view_ttl_cap`:
    300 for ``transfer-writer``, else 900); ``sub`` a derived owner equal to ``act.owner``;
    ``act`` an object with only known keys, an actor name, a lifecycle UID (required), optional
    ``scope`` list of scope tokens, ``parent`` ``<u_…>.<actor>``, ``view`` a known view,
    ``credentialId``; ``managerInstanceId`` (a lifecycle token), ``session``
    (``{endpoint, sessionId, epoch, exp}``), ``transferWriter`` (``{instanceId, hex}``) and
    ``serviceEndpoint`` (``{endpoint, instanceId}``) each present iff ``view`` is its view
    (``manager-caller``, ``session-caller``, ``transfer-writer``, ``service-host``);
    a top-level ``scope`` list that, when non-empty, equals ``act.scope`` as a set.

    Args:
        claims: the output of :func:`verify_bearer_signature`.
        space: this lane's space.
        now: wall time, unix seconds.

    Raises:
        Refused: BAD_CREDENTIAL, with a sentence naming the broken rule; expired and
            not-yet-valid bearers get distinct sentences.
    """
    _check_issuer_and_audience(claims, space)
    iat, exp = _check_times(claims, now, _claimed_view(claims))
    return ValidatedBearer(iat=iat, exp=exp, **_check_act(claims))


def validate_bearer(token: object, *, keys: Mapping[str, VerifyKey], space: str, now: float) -> ValidatedBearer:
    """Verify and check a bearer: :func:`verify_bearer_signature` then :func:`check_bearer_claims`.

    Raises:
        Refused: BAD_CREDENTIAL as either step.
    """
    return check_bearer_claims(verify_bearer_signature(token, keys), space=space, now=now)


class BearerVerifier:
    """A space's issuer keys plus a bounded memo of bearers whose signature verified.

    A client that reconnects presents the same bearer every time; its signature cannot have
    changed, so the result of :func:`verify_bearer_signature` is kept per exact token string
    (only successes; at most ``capacity`` tokens, least recently used first out). The claims are
    still checked on every call (expiry, issuer, audience), and the ledger is still read fresh
    by the caller, so revocation bites as before. The keys never change for one verifier.

    Args:
        keys: ``{kid: VerifyKey}`` (a :class:`~cotal_trio.core.jose.BearerKeySet`).
        capacity: tokens remembered (default 4096, about 4 MiB at most).
    """

    def __init__(self, keys: Mapping[str, VerifyKey], *, capacity: int = 4096) -> None:
        self._keys = keys
        self._capacity = capacity
        self._verified: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def verify(self, token: object) -> dict[str, Any]:
        """:func:`verify_bearer_signature`, remembered; the claims must not be mutated.

        Raises:
            Refused: BAD_CREDENTIAL as :func:`verify_bearer_signature` (never remembered).
        """
        if isinstance(token, str) and (claims := self._verified.get(token)) is not None:
            self._verified.move_to_end(token)
            return claims
        claims = verify_bearer_signature(token, self._keys)
        self._verified[token] = claims  # type: ignore[index]  # a str: it verified
        if len(self._verified) > self._capacity:
            self._verified.popitem(last=False)
        return claims

    def validate(self, token: object, *, space: str, now: float) -> ValidatedBearer:
        """:func:`validate_bearer` through the memo.

        Raises:
            Refused: BAD_CREDENTIAL as :func:`validate_bearer`.
        """
        return check_bearer_claims(self.verify(token), space=space, now=now)
