"""The manager host doors of the loopback face (spec "Host-only routes" and "Password proof").

=================================================  ============================================
``POST /manager-service-authority/verify-enrollment``  may this registered manager instance have
                                                   a managed agent enrolled/released (or a hosted
                                                   runtime create/status) under ``owner``?
                                                   Decides only; writes nothing.
``POST /tool-result-consent/issue``                opt-in (:attr:`ManagerDoors.tool_result_consent`):
                                                   a same-owner consent JWS for one tool result,
                                                   after a fresh password proof; recorded once.
=================================================  ============================================

The decisions are :mod:`cotal_trio.core.enrollment`; this module reads the ledger and the records
store and answers. The ledger read blocks on a disk (a fresh small file read), so it never runs
on the trio thread the lane's callout and exchange also run on: each read runs in a worker
thread of the doors' own :class:`~cotal_trio.state.ledger_threads.BlockingCalls` (at most
:data:`~cotal_trio.http.faces.LEDGER_THREADS` at once) and is abandoned at
:data:`~cotal_trio.http.faces.LEDGER_READ_S` with a 503, as the exchange's is (issue 15 item 7).

The loopback face supplies ``guard``: it runs the transport checks (Origin 403, media type 415),
the capability check (401/429) and reads the JSON body (413, 400), and returns the decoded body;
these doors never see the capability. Refusals are logged on ``cotal.http`` and offered to
:attr:`ManagerDoors.admit_refusal`, the face's shared refused-request window, as the exchange's
are; every answer carries ``Cache-Control: no-store``.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from nacl.signing import VerifyKey

from cotal_trio.core.enrollment import (
    CONSENT_ID_RANDOM_BYTES,
    CONSENT_RECORD_TTL_S,
    ConsentRequest,
    authorize_consent,
    consent_claims,
    consent_key,
    decide_enrollment,
    new_consent_id,
    parse_consent_body,
    parse_enrollment_body,
    render_consent_record,
    sign_consent,
)
from cotal_trio.core.errors import CodecError, RefusalCode, Refused
from cotal_trio.core.identity import derive_owner
from cotal_trio.core.idp import IdpPin, check_password_proof, verify_idp_token
from cotal_trio.core.jose import IssuerKey
from cotal_trio.core.ledger import LedgerRow, ReadRows
from cotal_trio.core.managers import ManagerInstance
from cotal_trio.http import faces
from cotal_trio.http.errors import LOGGER, Handler
from cotal_trio.http.faces import TOO_MANY_REFUSALS
from cotal_trio.natsio import KeyExists
from cotal_trio.state.ledger_threads import BlockingCalls

__all__ = ["CONSENT_PATH", "VERIFY_ENROLLMENT_PATH", "ManagerDoors", "RecordsPort", "routes"]

VERIFY_ENROLLMENT_PATH = "/manager-service-authority/verify-enrollment"
CONSENT_PATH = "/tool-result-consent/issue"
CONSENT_ID_TAKEN = "this consent id is already recorded, so it is not issued twice - request a fresh consent"
_NO_STORE = {"Cache-Control": "no-store"}

Answer = tuple[dict[str, Any], int, dict[str, str]]


def _ledger_threads() -> BlockingCalls:
    return BlockingCalls(max_threads=faces.LEDGER_THREADS)


class RecordsPort(Protocol):
    """What these doors use of ``stores.records.RecordsStore`` (trio; each call is a checkpoint).

    ``get_manager`` answers the registered instance ``mgr.<owner>.<instanceId>`` or None;
    ``create_record`` writes ``key`` create-only with a per-message TTL (seconds) and raises
    :class:`~cotal_trio.natsio.KeyExists` when the key already holds a live record. Either may
    raise ``Unavailable`` (answered 503).
    """

    async def get_manager(self, owner: str, instance_id: str) -> ManagerInstance | None: ...

    async def create_record(self, key: str, value: bytes, *, ttl_s: int | None = None) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ManagerDoors:
    """The ports of the manager doors of one space's loopback face.

    Attributes:
        space: the space (the consent's ``aud``; ``iss`` is ``urn:cotal:auth:<space>``).
        read_ledger: :data:`~cotal_trio.core.ledger.ReadRows`; sync, a fresh read per call,
            blocking: the doors call it only from a worker thread of :attr:`threads`.
        records: the space's records store (``stores.records.RecordsStore``; :class:`RecordsPort`).
        issuer_key: the space's active issuer key; signs consents.
        idp_pin: the pinned IdP; ``idp_pin.issuer`` keys owner derivation.
        idp_keys: ``() -> {kid: VerifyKey}``, the pinned IdP key set now; sync.
        owner_secret: the space's owner-derivation secret (at least 32 bytes).
        clock: wall time, unix seconds as a float.
        tool_result_consent: serve ``POST /tool-result-consent/issue`` (opt-in; else 404).
        admit_refusal: optional; the face's refused-request window, called with the wall time
            once per refusal, ``True`` while it fits (``SlidingWindow.try_acquire``); once it
            answers ``False`` a refusal is a 429. None: refusals are never throttled here.
        random_bytes: ``n -> n random bytes`` for consent ids (``secrets.token_bytes``).
        threads: the worker threads the ledger reads run in, at most
            :data:`~cotal_trio.http.faces.LEDGER_THREADS` at once; fresh for each instance (a
            ``dataclasses.replace`` copy gets its own). Apart from the exchange's, so stalled
            door reads never take the exchange's slots.
    """

    space: str
    read_ledger: ReadRows
    records: RecordsPort
    issuer_key: IssuerKey
    idp_pin: IdpPin
    idp_keys: Callable[[], Mapping[str, VerifyKey]]
    owner_secret: bytes = field(repr=False)
    clock: Callable[[], float]
    tool_result_consent: bool = False
    admit_refusal: Callable[[float], bool] | None = None
    random_bytes: Callable[[int], bytes] = secrets.token_bytes
    threads: BlockingCalls = field(init=False, repr=False, compare=False, default_factory=_ledger_threads)

    def refused(self, refusal: Refused, what: str) -> Refused:
        """Log ``refusal`` and return what to answer: itself, or 429 once the window is full."""
        LOGGER.warning("auth-service: refused %s: %s", what, refusal.detail)
        if self.admit_refusal is None or self.admit_refusal(self.clock()):
            return refusal
        return Refused(RefusalCode.RATE_LIMITED, TOO_MANY_REFUSALS)


async def _read_rows(ctx: ManagerDoors, owner: str, actor: str) -> tuple[LedgerRow | None, LedgerRow | None]:
    """Trio: the principal's fresh rows, read in a worker thread within ``faces.LEDGER_READ_S``
    (read at each call); a corrupt row is a refusal naming it (never a 500).

    Raises:
        Refused: NOT_GRANTED naming the corrupt row.
        Unavailable: :data:`~cotal_trio.http.faces.LEDGER_STALLED`, no answer within the bound
            (503; the edge logs the sentence at warning, no traceback).
    """
    limit_s = faces.LEDGER_READ_S
    stalled = faces.LEDGER_STALLED.format(s=limit_s)
    try:
        return await ctx.threads.run_within(limit_s, stalled, ctx.read_ledger, owner, actor)
    except CodecError as corrupt:
        raise Refused(RefusalCode.NOT_GRANTED, str(corrupt)) from None


async def verify_enrollment(ctx: ManagerDoors, body: object) -> Answer:
    """Answer one verify-enrollment body (spec "Host-only routes"; ``core.enrollment``).

    A checkpoint (reads the ledger in a worker thread, then the records store). Writes nothing.

    Returns:
        ``(200 body of decide_enrollment, 200, {"Cache-Control": "no-store"})``.

    Raises:
        Refused: 400 bad body or kind; 401 no ledger row; 403 no ``supervise``; 412 not
            registered; 409 another actor's instance or a stale serve epoch; 429 once the
            face's window is full.
        Unavailable: the records store, or the ledger within ``faces.LEDGER_READ_S``, did not
            answer (503).
    """
    try:
        request = parse_enrollment_body(body)
        interactive, managed = await _read_rows(ctx, request.owner, request.actor)
        instance = await ctx.records.get_manager(request.owner, request.instance_id)
        answer = decide_enrollment(request, interactive=interactive, managed=managed, instance=instance)
    except Refused as refusal:
        raise ctx.refused(refusal, "a manager enrollment") from None
    return answer, 200, dict(_NO_STORE)


async def _consenting_owner(ctx: ManagerDoors, request: ConsentRequest, now: float) -> str:
    """Trio: the owner of a fresh password proof who holds an interactive row for
    ``request.actor`` (the proof is checked before any ledger read)."""
    identity = verify_idp_token(request.idp_token, pin=ctx.idp_pin, keys=ctx.idp_keys(), now=now)
    check_password_proof(identity, subject=request.subject, now=now)
    owner = derive_owner(ctx.owner_secret, ctx.idp_pin.issuer, identity.sub)
    interactive, _managed = await _read_rows(ctx, owner, request.actor)
    authorize_consent(owner, request.actor, interactive)
    return owner


async def _record_once(ctx: ManagerDoors, key: str, value: bytes) -> None:
    """Create the consent record, create-only; one already there (a replayed id) is a 409."""
    try:
        await ctx.records.create_record(key, value, ttl_s=CONSENT_RECORD_TTL_S)
    except KeyExists:
        raise Refused(RefusalCode.CONFLICT, CONSENT_ID_TAKEN) from None


async def issue_consent(ctx: ManagerDoors, body: object) -> Answer:
    """Answer one consent body (spec "Host-only routes" and "Password proof").

    Reads ``ctx.clock()`` once to decide the password proof (as
    ``/tool-result-human-proof/verify`` does), then checks the derived owner's interactive row
    for ``actor``, signs the consent dated ``ctx.clock()`` read again, and records it at
    ``consent.<jti>`` (TTL 360 s, create-only) before answering. A checkpoint.

    Returns:
        ``({"consentId": jti, "consent": <JWS>, "exp": <unix s>}, 200, no-store)``; no result
        content, key or capability.

    Raises:
        Refused: 400 bad body; 401 no fresh password proof for ``subject`` or no interactive row
            for ``actor``; 409 the consent id is already recorded; 429 once the window is full.
        Unavailable: the records store, or the ledger within ``faces.LEDGER_READ_S``, did not
            answer (503); nothing was issued.
    """
    try:
        request = parse_consent_body(body)
        owner = await _consenting_owner(ctx, request, ctx.clock())
    except Refused as refusal:
        raise ctx.refused(refusal, "a tool-result consent") from None
    consent_id = new_consent_id(ctx.random_bytes(CONSENT_ID_RANDOM_BYTES))
    claims = consent_claims(request, space=ctx.space, owner=owner, consent_id=consent_id, now=int(ctx.clock()))
    token = sign_consent(claims, ctx.issuer_key)
    await _record_once(ctx, consent_key(consent_id), render_consent_record(claims))
    return {"consentId": consent_id, "consent": token, "exp": claims["exp"]}, 200, dict(_NO_STORE)


def routes(ctx: ManagerDoors, *, guard: Callable[[], Awaitable[object]]) -> dict[str, dict[str, Handler]]:
    """The manager doors, for :func:`~cotal_trio.http.errors.install_edge` on the loopback face.

    Args:
        ctx: the doors' ports.
        guard: ``await guard() -> body``: the face's transport and capability checks, then the
            decoded JSON body (it raises its own refusals).

    Returns:
        ``{VERIFY_ENROLLMENT_PATH: {"POST": ...}}`` plus ``{CONSENT_PATH: {"POST": ...}}`` when
        ``ctx.tool_result_consent`` is set (otherwise that path stays a 404).
    """

    async def enrollment() -> Answer:
        return await verify_enrollment(ctx, await guard())

    async def consent() -> Answer:
        return await issue_consent(ctx, await guard())

    table: dict[str, dict[str, Handler]] = {VERIFY_ENROLLMENT_PATH: {"POST": enrollment}}
    if ctx.tool_result_consent:
        table[CONSENT_PATH] = {"POST": consent}
    return table
