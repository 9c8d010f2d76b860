"""The auth callout decision: pure steps between the lane's I/O (DESIGN.md section 6).

The lane calls these in order, doing its I/O (the ledger read, later the issuance row) between
them, with the wall time read once per request and passed in:

1. :func:`open_request` - provenance. A failure raises :class:`Dropped`: the request gets no
   reply at all, only a log line (spec "Callout deadlines", last sentence).
2. :func:`check_bearer` - the bearer in ``connect_opts.auth_token``.
3. :func:`check_connect` - step 2 with the connect limits (the buckets are
   :mod:`cotal_trio.core.limits`); then (lane) a fresh ledger read of the principal's rows.
4. :func:`decide_connect` - ledger match, the view's scope (when the bearer names a view) and the
   profile's permissions (the view's, else the agent's).
5. :func:`mint_user_jwt` and :func:`encode_response` - the user JWT and the sealed response.

Steps 2 to 4 raise :class:`~cotal_trio.core.errors.Refused` (step 3 its RateLimited too); the lane answers those with
:func:`encode_response` carrying ``error=refused.reason()``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import natsjwt
from .admission import broker_gave_up
from .bearer import BearerVerifier, ValidatedBearer, check_bearer_claims
from .errors import AuthServiceError, CodecError, RefusalCode, Refused
from .identity import check_inbox_nonce, is_actor, is_owner, principal
from .ledger import LedgerRow, authorize_connect
from .limits import ConnectLimiter
from .nkeys import KeyPair
from .profiles import CAPABILITIES, Permissions, agent_permissions, view_permissions
from .views import check_view_scope
from .xkeys import XKeyPair

__all__ = [
    "CalloutKeys",
    "ConnectGrant",
    "Dropped",
    "MAX_REQUEST_BYTES",
    "NO_TOKEN_REASON",
    "SERVER_XKEY_HEADER",
    "TIMEOUT_REASON",
    "check_bearer",
    "check_connect",
    "decide_connect",
    "encode_response",
    "mint_user_jwt",
    "open_request",
]

SERVER_XKEY_HEADER = "Nats-Server-Xkey"
NO_TOKEN_REASON = "no user token presented (auth_token empty) - connect with a bearer from the exchange"
TIMEOUT_REASON = "timeout: the auth callout could not answer inside the broker's authorization timeout"
# A request's sealed size bound, checked before it is unsealed (issue 15 item 2): the broker's
# request holds the connect options (a sentinel JWT, a bearer, perhaps a client certificate
# chain), a few KiB; 256 KiB leaves room for a long chain and still bounds the work.
MAX_REQUEST_BYTES = 256 * 1024


class Dropped(AuthServiceError):
    """The request failed provenance: answer nothing, log the reason (DESIGN.md 6, step 1)."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class CalloutKeys:
    """What one lane's callout holds for one space (DESIGN.md section 4, last paragraph).

    Attributes:
        space: the space name.
        auth_account: the auth account's public key (``AUTH_<space>``); requests must name it.
        data_account: the data account's public key; minted users land there.
        xkey: the space xkey; requests are sealed to it.
        auth_signer: the auth account's signing key; signs responses.
        data_signer: the data account's callout signing key; signs minted user JWTs.
        server_ids: when set, only requests from these broker ``N...`` keys are answered.
    """

    space: str
    auth_account: str
    data_account: str
    xkey: XKeyPair
    auth_signer: KeyPair
    data_signer: KeyPair
    server_ids: frozenset[str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectGrant:
    """An allowed connect: who it is and what the minted user may do."""

    owner: str
    actor: str
    permissions: Permissions
    exp: int


def open_request(
    payload: bytes, headers: Mapping[str, str] | None, *, keys: CalloutKeys, now: float, skew_s: float = 0.0
) -> natsjwt.AuthorizationRequest:
    """Unseal and verify a ``$SYS.REQ.USER.AUTH`` request (provenance, DESIGN.md 6 step 1).

    Args:
        payload: the message body as received (``xkv1`` sealed).
        headers: the message headers; ``Nats-Server-Xkey`` must name the broker's xkey.
        now: wall time, unix seconds.
        skew_s: how far our wall clock runs ahead of the broker's
            (:class:`~cotal_trio.core.admission.ClockSkew`); a request is expired exactly when
            :func:`~cotal_trio.core.admission.broker_gave_up` says the broker surely gave up.

    Every way the bytes can be wrong is a :class:`Dropped` (issue 15 item 2): the payload is
    bounded (``MAX_REQUEST_BYTES``) before it is unsealed, and the JWT's size, JSON depth and
    integer lengths before it is parsed (:func:`~cotal_trio.core.natsjwt.decode`). The claims
    are parsed before the signature is checked because the key that signed them is their own
    ``iss``: a forger signs with a server key of its own and the signature verifies, so checking
    it first would keep no forged request from the parser. What keeps the parser safe is the
    bounds, and after it the provenance checks below (and ``server_ids``) refuse the forger.

    Raises:
        Dropped: too large, unsealed, does not open, not a NATS JWT signed by its ``iss``
            (or not JSON within the bounds), ``iss`` not a server key equal to
            ``server_id.id``, wrong audience, another account, expired, a header key that
            differs from the signed ``server_id.xkey``, or a server outside the allow-list.
    """
    header_xkey = (headers or {}).get(SERVER_XKEY_HEADER)
    if not header_xkey:
        raise Dropped("unsealed request (no Nats-Server-Xkey header)")
    if len(payload) > MAX_REQUEST_BYTES:
        raise Dropped(f"request is larger than {MAX_REQUEST_BYTES} bytes")
    try:
        claims = natsjwt.verify(keys.xkey.open(payload, header_xkey))
        request = natsjwt.decode_authorization_request(claims)
    except CodecError as exc:
        raise Dropped(f"request is not a valid sealed authorization request: {exc}") from None
    _check_claims(claims, request, header_xkey, keys=keys, now=now, skew_s=skew_s)
    return request


def _check_claims(
    claims: Mapping[str, object],
    request: natsjwt.AuthorizationRequest,
    header_xkey: str,
    *,
    keys: CalloutKeys,
    now: float,
    skew_s: float,
) -> None:
    if claims["iss"] != request.server_id:
        raise Dropped("request issuer is not the server it names")
    if claims.get("aud") != natsjwt.AUTH_REQUEST_AUDIENCE:
        raise Dropped("request audience is not nats-authorization-request")
    if request.account != keys.auth_account:
        raise Dropped(f"request is for account {_shown(request.account)}, not this space's auth account")
    # The broker writes exp in whole seconds, truncated: its real deadline lies in [exp, exp+1)
    # on its clock, so by exp + 1 + skew on ours it has surely given up.
    if broker_gave_up(now=now, exp=request.exp, skew_s=skew_s):
        raise Dropped("request expired before it was read")
    if request.server_xkey != header_xkey:
        raise Dropped("header xkey differs from the signed server xkey")
    if keys.server_ids is not None and request.server_id not in keys.server_ids:
        raise Dropped(f"server {request.server_id} is not in the allow-list")


def _shown(value: str) -> str:
    """A request's string for a log line: JSON-quoted (no lone surrogate, no line break), at most
    64 characters of it (the request is not trusted to be short or printable)."""
    return json.dumps(value[:64])


def check_bearer(
    request: natsjwt.AuthorizationRequest, *, space: str, verifier: BearerVerifier, now: float
) -> ValidatedBearer:
    """Validate the bearer from ``connect_opts.auth_token`` (DESIGN.md 6 step 3).

    Raises:
        Refused: no token, or the token fails validation (signature, claims, expiry).
    """
    if request.auth_token is None:
        raise Refused(RefusalCode.BAD_CREDENTIAL, NO_TOKEN_REASON)
    return verifier.validate(request.auth_token, space=space, now=now)


def _principal_of(claims: Mapping[str, Any], *, space: str, now: float) -> tuple[str, str]:
    """``(act.owner, act.actor)`` of claims whose signature verified.

    Raises:
        Refused: BAD_CREDENTIAL when they name no valid owner and actor (the claims check
            names the broken rule).
    """
    act = claims.get("act")
    owner, actor = (act.get("owner"), act.get("actor")) if isinstance(act, dict) else (None, None)
    if is_owner(owner) and is_actor(actor):
        return owner, actor
    check_bearer_claims(claims, space=space, now=now)  # raises, naming the rule
    raise Refused(RefusalCode.BAD_CREDENTIAL, "bearer names no owner and actor - exchange a fresh bearer")


def check_connect(
    request: natsjwt.AuthorizationRequest,
    *,
    space: str,
    verifier: BearerVerifier,
    limiter: ConnectLimiter,
    now: float,
    at: float,
) -> ValidatedBearer:
    """The bearer and the connect limits of one connect (DESIGN.md 6 steps 3-4; step 3 above).

    Runs before any ledger read or store write (spec "Connect limits"). A bearer whose
    signature verifies is charged to its actor and owner, then its claims are checked (so an
    expired one is still charged); anything else is charged to ``request.client_host`` and
    refused with its own reason unless that host is limited.

    Args:
        request: the opened authorization request.
        space: this lane's space.
        verifier: the space's bearer verifier.
        limiter: the lane's connect limits (mutated: one connect charged, or none).
        now: wall time, unix seconds (bearer times).
        at: seconds on the limiter's monotonic clock.

    Returns:
        The validated bearer.

    Raises:
        RateLimited: a bucket the connect draws on is empty; ``reason()`` starts
            ``RATE_LIMITED retry-after <n>s``.
        Refused: BAD_CREDENTIAL: no bearer, or one that fails validation.
    """
    try:
        if request.auth_token is None:
            raise Refused(RefusalCode.BAD_CREDENTIAL, NO_TOKEN_REASON)
        claims = verifier.verify(request.auth_token)
        owner, actor = _principal_of(claims, space=space, now=now)
    except Refused:
        if (limited := limiter.charge_host(request.client_host, at)) is not None:
            raise limited.error() from None
        raise
    if (limited := limiter.charge_principal(owner, actor, at)) is not None:
        raise limited.error()
    return check_bearer_claims(claims, space=space, now=now)


def decide_connect(
    request: natsjwt.AuthorizationRequest,
    bearer: ValidatedBearer,
    rows: tuple[LedgerRow | None, LedgerRow | None],
    *,
    space: str,
    now: float,
) -> ConnectGrant:
    """Match the bearer against the fresh ledger rows and build the grant (steps 5 and 7).

    A bearer naming a view must still hold the view's required ledger scope on the fresh row
    (:func:`~cotal_trio.core.views.check_view_scope`) and is minted the view's profile
    (:func:`~cotal_trio.core.profiles.view_permissions`); a bearer without a view gets the agent
    profile from the row's channel ACLs. Whether the manager instance or chat session a view
    binds is still live is the lane's check, before this one.

    Args:
        rows: ``(interactive, managed)`` rows of the bearer's principal, read just now.
        now: wall time, unix seconds.

    Raises:
        Refused: the bearer's ``exp`` has passed (its 5 s skew still lets it verify, but the
            minted user would expire on arrival), the ledger refuses the bearer, the row or the
            bearer lacks the view's scope (NOT_GRANTED), or the connect ``name`` is not an inbox
            nonce.
    """
    if bearer.exp <= now:
        raise Refused(RefusalCode.BAD_CREDENTIAL, "bearer expired - exchange a fresh one")
    row = authorize_connect(bearer, *rows)
    if bearer.view is not None:
        check_view_scope(bearer.view, row_scope=row.scope, bearer_scope=bearer.scope, owner=bearer.owner, actor=bearer.actor)
    nonce = request.connect_name
    if nonce is None:
        raise Refused(
            RefusalCode.BAD_REQUEST,
            "the connect has no name - set the connection name to the client's inbox nonce",
        )
    permissions = _permissions(bearer, row, space=space, inbox_nonce=check_inbox_nonce(nonce))
    return ConnectGrant(owner=bearer.owner, actor=bearer.actor, permissions=permissions, exp=bearer.exp)


def _permissions(bearer: ValidatedBearer, row: LedgerRow, *, space: str, inbox_nonce: str) -> Permissions:
    """The view's profile for a view bearer, else the agent profile of the row's channel ACLs."""
    if bearer.view is None:
        # spec credential-authority "Capabilities": spawn and run are declared in the ledger scope
        # (and the bearer's, which authorize_connect keeps inside it) and minted into the cred
        capabilities = tuple(c for c in CAPABILITIES if c in row.scope and c in bearer.scope)
        return agent_permissions(
            space=space, owner=bearer.owner, actor=bearer.actor, allow_publish=row.allow_publish,
            allow_subscribe=row.allow_subscribe, inbox_nonce=inbox_nonce, role=row.role, capabilities=capabilities,
        )  # fmt: skip
    return view_permissions(
        bearer.view, space=space, owner=bearer.owner, actor=bearer.actor, scope=bearer.scope,
        inbox_nonce=inbox_nonce, manager_instance_id=bearer.manager_instance_id,
        session_id=None if bearer.session is None else bearer.session.session_id,
        transfer_writer=bearer.transfer_writer, service_endpoint=bearer.service_endpoint,
    )  # fmt: skip


def mint_user_jwt(
    request: natsjwt.AuthorizationRequest, grant: ConnectGrant, *, keys: CalloutKeys, now: int
) -> str:
    """The user JWT placing the client in the data account (DESIGN.md 6 step 8).

    ``sub`` is the broker's user nkey, ``exp`` the bearer's (the broker disconnects then),
    ``name`` ``<owner>-<actor>`` and tags ``owner:``, ``actor:``, ``principal:``.
    """
    claims = natsjwt.user_claims(
        user=request.user_nkey,
        name=f"{grant.owner}-{grant.actor}",
        issuer_account=keys.data_account,
        permissions=grant.permissions.to_nats(),
        exp=grant.exp,
        tags=(
            f"owner:{grant.owner}",
            f"actor:{grant.actor}",
            f"principal:{principal(grant.owner, grant.actor)}",
        ),
    )
    return natsjwt.encode(claims, keys.data_signer, iat=now)


def encode_response(
    request: natsjwt.AuthorizationRequest,
    *,
    keys: CalloutKeys,
    now: int,
    jwt: str | None = None,
    error: str | None = None,
) -> bytes:
    """The signed authorization response, sealed to the broker's xkey (DESIGN.md 6 step 9).

    Exactly one of ``jwt`` (allow) or ``error`` (a denial reason) is given.
    """
    claims = natsjwt.authorization_response_claims(
        user_nkey=request.user_nkey,
        server_id=request.server_id,
        issuer_account=keys.auth_account,
        jwt=jwt,
        error=error,
    )
    token = natsjwt.encode(claims, keys.auth_signer, iat=now).encode()
    if request.server_xkey is None:
        return token
    return keys.xkey.seal(token, request.server_xkey)
