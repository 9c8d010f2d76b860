"""The routes both faces serve from one :class:`~cotal_trio.http.faces.ExchangeContext`: ``GET
/health``, ``GET /jwks``, ``POST /exchange`` and the password-proof door (DESIGN 7; upstream-notes
3.5; spec "Proxy attribution", "Listener policy").

The loopback and the public face (``loopback.py``, ``public.py``) share these, so the two cannot
drift apart: :func:`info_routes`; :func:`answer_exchange` (parse, then each step of
:func:`~cotal_trio.core.exchange.decide_exchange` with its I/O, and a refusal counted against the
face's budget, 429 once it is full); :func:`answer_password_proof`;
:func:`refetch_for_unknown_idp_key`. Each face runs its whole ``POST /exchange`` inside
:func:`counted_exchange`, which reports every answer once to ``ExchangeContext.metrics`` by arm
and HTTP status. No CORS header is ever set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from werkzeug.exceptions import HTTPException

from cotal_trio.core.bearer import space_issuer
from cotal_trio.core.bridge import Minted
from cotal_trio.core.errors import RateLimited, RefusalCode, Refused, Unavailable
from cotal_trio.core.exchange import (
    AgentExchange,
    ExchangeFacts,
    ExchangeStep,
    HumanExchange,
    decide_exchange,
    exchange_arm,
    parse_exchange_body,
)
from cotal_trio.core.identity import derive_owner
from cotal_trio.core.idp import (
    check_password_proof,
    parse_password_proof_body,
    verify_idp_token,
)
from cotal_trio.core.jose import header_kid
from cotal_trio.core.windows import WindowLru
from cotal_trio.http.errors import LOGGER, REFUSAL_STATUS, Handler, Rejected
from cotal_trio.http.faces import (
    TOO_MANY_REFUSALS,
    Caller,
    ExchangeContext,
    Uncounted,
    ViewGrant,
    authenticate,
    mint_for,
    select_manager_for,
)

__all__ = [
    "JWKS_MAX_AGE_S",
    "NO_ARM",
    "ExchangeTally",
    "answer_exchange",
    "answer_password_proof",
    "counted_exchange",
    "info_routes",
    "refetch_for_unknown_idp_key",
]

# How long clients may cache the JWKS (upstream JWKS_MAX_AGE_SEC); a retired kid stays
# published at least this long plus the longest bearer lifetime.
JWKS_MAX_AGE_S = 300
# The arm of an exchange answered before its body named one (transport, capability, body shape).
NO_ARM = "none"


def info_routes(ctx: ExchangeContext) -> dict[str, dict[str, Handler]]:
    """The two read-only routes both faces serve, for :func:`~cotal_trio.http.errors.install_edge`.

    * ``GET /health``: ``{"ok": true, "issuer": "urn:cotal:auth:<space>"}``;
    * ``GET /jwks``: ``{"keys": [<public JWK>]}`` with ``Cache-Control: max-age=300``
      (:data:`JWKS_MAX_AGE_S`, upstream-notes 3.1).
    """

    async def health() -> dict[str, Any]:
        return {"ok": True, "issuer": space_issuer(ctx.space)}

    async def jwks() -> tuple[dict[str, Any], int, dict[str, str]]:
        return {"keys": [ctx.issuer_key.public_jwk()]}, 200, {"Cache-Control": f"max-age={JWKS_MAX_AGE_S}"}

    return {"/health": {"GET": health}, "/jwks": {"GET": jwks}}


def _throttled(ctx: ExchangeContext, refusal: Refused, *, arm: str, source: str, admitted: bool) -> Refused:
    """Log one refusal and return what to answer: itself, or 429 once the budget is full."""
    what = "an agent exchange" if arm == "agent" else "an exchange"
    LOGGER.warning("auth-service: refused %s%s: %s", what, source, refusal.detail)
    if admitted:
        return refusal
    return Refused(RefusalCode.RATE_LIMITED, TOO_MANY_REFUSALS)


def answer_password_proof(
    ctx: ExchangeContext, body: object, *, admit_refusal: Callable[[float], bool]
) -> tuple[dict[str, Any], int, dict[str, str]]:
    """Answer one ``POST /tool-result-human-proof/verify`` body (spec "Host-only routes" and
    "Password proof"): does the IdP token prove that the host's session subject signed in with a
    password in the last 300 s? It decides only: it issues no consent and no credential.

    Reads ``ctx.clock()`` once. A refusal is logged and offered to ``admit_refusal`` (the
    loopback face's shared refusal window), as an exchange refusal is.

    Returns:
        ``({"verified": true, "sub", "owner", "authTime"}, 200, {"Cache-Control": "no-store"})``:
        ``owner`` is the owner the exchange derives for that subject, ``authTime`` unix seconds.

    Raises:
        Refused: BAD_REQUEST 400 for a body that is not exactly ``{idpToken, subject}``;
            BAD_CREDENTIAL 401 for a token the pin refuses or that is no fresh password proof
            for ``subject``; RATE_LIMITED 429 :data:`TOO_MANY_REFUSALS` once the window is full.
    """
    now = ctx.clock()
    try:
        token, subject = parse_password_proof_body(body)
        identity = verify_idp_token(token, pin=ctx.idp_pin, keys=ctx.idp_keys(), now=now)
        check_password_proof(identity, subject=subject, now=now)
    except Refused as refusal:
        LOGGER.warning("auth-service: refused a password proof: %s", refusal.detail)
        if admit_refusal(now):
            raise
        raise Refused(RefusalCode.RATE_LIMITED, TOO_MANY_REFUSALS) from None
    owner = derive_owner(ctx.owner_secret, ctx.idp_pin.issuer, identity.sub)
    body_out = {"verified": True, "sub": identity.sub, "owner": owner, "authTime": identity.auth_time}
    return body_out, 200, {"Cache-Control": "no-store"}


async def refetch_for_unknown_idp_key(ctx: ExchangeContext, body: object) -> None:
    """Trio: before a human exchange is decided, re-read the IdP's JWKS if its token names a
    ``kid`` the pinned key set lacks (the IdP rotated its keys); see ``refetch_idp_keys``.

    Trusts nothing in the token: it only decides whether a re-read is worth it, and the token
    is verified afterwards against whatever keys there are. Never raises for a bad body.
    """
    if ctx.refetch_idp_keys is None or not isinstance(body, dict):
        return
    kid = header_kid(body.get("idpToken"))
    if kid is not None and kid not in ctx.idp_keys():
        await ctx.refetch_idp_keys(kid)


async def answer_exchange(
    ctx: ExchangeContext, body: object, *, face: str, admit_refusal: Callable[[float], bool], peer: str | None = None,
    tally: ExchangeTally | None = None, selection_windows: WindowLru | None = None,
) -> tuple[dict[str, Any], int, dict[str, str]]:
    """Trio: answer one ``POST /exchange`` body: parse it, mint, or refuse within the face's budget.

    Order (upstream-notes 3.5, 3.4): parse, then :func:`~cotal_trio.core.exchange.decide_exchange`'s
    (the view against the face and arm, 400 before any ledger read; the credential and its
    ledger grant; the view's required scope; for ``manager-caller`` the manager selection,
    :func:`select_manager_for`; provisioning; connect limits; sign). This function does the
    steps' I/O and the answer.

    Reads ``ctx.clock()`` after the body arrived, to check the IdP token and date refusals,
    and again just before signing (waiting shortens the bearer, never extends it). A refusal (a
    body that is not a JSON object, a bad field, a refused credential) is logged at warning on
    ``cotal.http`` and offered to ``admit_refusal``; while the budget admits it the caller sees
    its reason, once it is full a 429. A valid credential mints whatever the budget says (spec
    "Proxy attribution": successes are never throttled).

    Args:
        ctx: the face's ports.
        body: the decoded JSON body (any JSON value).
        face: ``"public"`` or ``"loopback"`` (which views it mints).
        admit_refusal: the face's budget: called with the wall time (unix seconds) once per
            refusal; returns ``True`` while the refusal fits (``SlidingWindow.try_acquire``).
        peer: the source a public face attributes the request to; named in the log line.
        tally: the request's :func:`counted_exchange` tally; its ``arm`` is set once the body
            names one.
        selection_windows: the public face's per-principal ``manager-caller`` selection
            windows (a 1024-key LRU); None on the loopback face.

    Returns:
        ``({"token", "owner", "exp"[, "managerInstanceId"]}, 200, {"Cache-Control": "no-store"})``
        (``exp`` unix s).

    Raises:
        Refused: BAD_REQUEST 400, BAD_CREDENTIAL/NOT_GRANTED 401, or RATE_LIMITED 429
            :data:`TOO_MANY_REFUSALS` once the budget is full, or a selection class's 429.
        RateLimited: 429 with the typed body and ``Retry-After`` while the actor or its owner
            is out of connects; logged at info, not offered to ``admit_refusal``.
        Exception: a port's I/O error (the edge answers a generic 500, or 503 for Unavailable).
    """
    now = ctx.clock()
    arm = "human"
    try:
        parsed = parse_exchange_body(body)
        arm = exchange_arm(parsed)
        if tally is not None:
            tally.arm = arm
        minted = await _performed(ctx, parsed, face=face, windows=selection_windows, now=now)
    except RateLimited as limited:  # not a refused exchange: no budget spent (spec "Connect limits")
        LOGGER.info("auth-service: rate-limited %s exchange: %s", arm, limited.detail)
        raise
    except Uncounted as uncounted:
        LOGGER.warning("auth-service: refused a manager selection%s: %s", _source(peer), uncounted.refusal.detail)
        raise uncounted.refusal from None
    except Refused as refusal:
        raise _throttled(ctx, refusal, arm=arm, source=_source(peer), admitted=admit_refusal(now)) from None
    return minted.body(), 200, {"Cache-Control": "no-store"}


async def _performed(
    ctx: ExchangeContext, parsed: HumanExchange | AgentExchange, *, face: str, windows: WindowLru | None, now: float
) -> Minted:
    """Trio: perform each step :func:`~cotal_trio.core.exchange.decide_exchange` names, in its
    order, and mint once it says so; the refusals are the steps' own (:func:`answer_exchange`)."""
    facts = ExchangeFacts(face=face, provisioning=ctx.provision is not None)
    caller: Caller | None = None
    for _ in ExchangeStep:  # each step records one fact, so MINT comes within as many rounds
        step = decide_exchange(parsed, facts)
        if step is ExchangeStep.AUTHENTICATE:
            caller = await authenticate(ctx, parsed, now=now)
            facts = replace(facts, row=caller.row)
            continue
        assert caller is not None  # every later step follows AUTHENTICATE
        if step is ExchangeStep.SELECT_MANAGER:
            instance = await select_manager_for(ctx, caller, parsed.manager_instance_id, face=face, windows=windows, now=now)
            facts = replace(facts, manager_instance_id=instance.instance_id)
        elif step is ExchangeStep.PROVISION:
            assert ctx.provision is not None  # decided only when the face provisions
            ctx.check_limits(caller.row.owner, caller.row.actor)  # a limited caller provisions nothing
            await ctx.provision(caller.row)
            facts = replace(facts, provisioned=True)
        else:
            chosen = facts.manager_instance_id
            view = ViewGrant(
                view=parsed.view, manager_instance_id=chosen, transfer_writer=getattr(parsed, "transfer_writer", None)
            )
            extra: dict[str, object] = {} if chosen is None else {"managerInstanceId": chosen}
            return mint_for(ctx, caller, ttl_s=parsed.ttl_s, view=view, extra=extra)
    raise AssertionError(f"decide_exchange named no mint within {len(ExchangeStep)} steps")


def _source(peer: str | None) -> str:
    return "" if peer is None else f" from {peer}"


@dataclass(slots=True)
class ExchangeTally:
    """The arm of one ``POST /exchange`` being answered: :data:`NO_ARM` until the body names one."""

    arm: str = NO_ARM


@contextmanager
def counted_exchange(ctx: ExchangeContext) -> Iterator[ExchangeTally]:
    """Report the ``POST /exchange`` answered inside the block to ``ctx.count``, exactly once.

    The status is 200 when the block returns (a face's exchange returns only a mint), else the
    status the edge answers the exception with (:func:`_answered_status`); the exception
    propagates unchanged. A cancelled request got no answer and is not reported.

    Yields:
        The request's :class:`ExchangeTally`; pass it to :func:`answer_exchange`.
    """
    tally = ExchangeTally()
    try:
        yield tally
    except Exception as error:
        ctx.count(tally.arm, _answered_status(error))
        raise
    ctx.count(tally.arm, 200)


def _answered_status(error: Exception) -> int:
    """The HTTP status :func:`~cotal_trio.http.errors.answer_error` gives ``error`` (same order)."""
    if isinstance(error, Refused):
        return REFUSAL_STATUS[error.code]
    if isinstance(error, Rejected):
        return error.status
    if isinstance(error, HTTPException) and error.code is not None and error.code < 500:
        return error.code
    return 503 if isinstance(error, Unavailable) else 500
