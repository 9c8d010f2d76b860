"""The manager doors' decisions: verify-enrollment and tool-result consent (spec "Host-only routes").

Two host-only doors of the loopback face decide here; ``http/manager_doors.py`` does the I/O.

* ``POST /manager-service-authority/verify-enrollment``, body exactly ``{owner, request}``:
  :func:`parse_enrollment_body` then :func:`decide_enrollment`, given the manager actor's fresh
  ledger rows and the registered manager instance ``mgr.<owner>.<instanceId>``. The manager's
  scope comes from the ledger, never from the body: a host that forwarded a participant-supplied
  scope could not grant itself ``supervise``, and a ``scope`` member is a 400 like any other
  unknown one. It decides only.
* ``POST /tool-result-consent/issue`` (opt-in), body exactly ``{idpToken, subject, actor,
  toolCallId, resultSha256}``: :func:`parse_consent_body`; after the password proof (``core/idp``)
  :func:`authorize_consent` (an interactive row of the same owner), then :func:`consent_claims`
  and :func:`sign_consent`; the record :func:`render_consent_record` goes at
  :func:`consent_key` with a TTL of :data:`CONSENT_RECORD_TTL_S`.

Pure and synchronous: time comes in as integer unix seconds, randomness as bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .bearer import space_issuer
from .errors import RefusalCode, Refused
from .identity import is_actor, is_lifecycle_uid, is_owner, principal
from .jose import IssuerKey, b64url_encode, shown, sign_ed25519_jws
from .ledger import LedgerKind, LedgerRow
from .managers import ManagerInstance
from .rowcodec import encode_row

__all__ = [
    "CONSENT_ID_RANDOM_BYTES",
    "CONSENT_KEY_PREFIX",
    "CONSENT_RECORD_TTL_S",
    "CONSENT_TTL_S",
    "CONSENT_TYP",
    "ENROLL_KINDS",
    "HOSTED_KINDS",
    "SUPERVISE_SCOPE",
    "ConsentRequest",
    "EnrollmentRequest",
    "authorize_consent",
    "consent_claims",
    "consent_key",
    "decide_enrollment",
    "new_consent_id",
    "parse_consent_body",
    "parse_enrollment_body",
    "render_consent_record",
    "sign_consent",
]

# The ledger scope a manager actor needs before any enrollment is decided for it.
SUPERVISE_SCOPE = "supervise"
# Request kinds: a managed agent enrolled or released by a serving manager, and the hosted runtime's.
ENROLL_KINDS = ("enroll", "release")
HOSTED_KINDS = ("create", "status")
_ENROLL_FIELDS = frozenset({"kind", "actor", "instanceId", "serveEpoch", "agent"})
_HOSTED_FIELDS = frozenset({"kind", "actor", "instanceId", "target"})
_BODY_FIELDS = frozenset({"owner", "request"})
_REGISTER_FIX = "register it first: cotal manager register"
_ENROLL_SHAPE = "request is exactly {kind: enroll|release, actor, instanceId, serveEpoch, agent}"
_HOSTED_SHAPE = "request is exactly {kind: create|status, actor, instanceId, target}"

# A consent is good for 300 s; its record outlives it by 60 s, so a replay inside the consent's
# lifetime always finds the record (create-only) and cannot be recorded again.
CONSENT_TTL_S = 300
CONSENT_RECORD_TTL_S = 360
CONSENT_TYP = "cotal-consent+jwt"
CONSENT_KEY_PREFIX = "consent."
# 16 random bytes: a 22-character base64url consent id (jti).
CONSENT_ID_RANDOM_BYTES = 16
_CONSENT_FIELDS = ("idpToken", "subject", "actor", "toolCallId", "resultSha256")
_TOOL_CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _bad(sentence: str) -> Refused:
    return Refused(RefusalCode.BAD_REQUEST, sentence)


def _closed(value: object, fields: frozenset[str], shape: str) -> dict[str, Any]:
    """``value`` as a dict with exactly ``fields`` (400 naming the first extra or missing one)."""
    if not isinstance(value, dict):
        raise _bad(f"{shape} must be a JSON object")
    extra = sorted(set(value) - fields)
    if extra:
        raise _bad(f"unknown field {shown(extra[0])} - {shape}")
    missing = sorted(fields - set(value))
    if missing:
        raise _bad(f"missing field {missing[0]!r} - {shape}")
    return value


# --- verify-enrollment -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class EnrollmentRequest:
    """A parsed verify-enrollment body.

    Attributes:
        owner: the authenticated owner ``u_…`` the manager acts under.
        kind: ``enroll``/``release`` (a serving manager) or ``create``/``status`` (hosted runtime).
        actor: the manager actor (its ledger row is read for ``supervise``).
        instance_id: the registered manager instance (lifecycle token ``[a-z0-9]{26,32}``).
        serve_epoch: the manager's serve epoch, an int >= 1 (``enroll``/``release`` only).
        agent: the managed agent's actor name (``enroll``/``release`` only).
        target: the hosted runtime's target actor (``create``/``status`` only).
    """

    owner: str
    kind: str
    actor: str
    instance_id: str
    serve_epoch: int | None = None
    agent: str | None = None
    target: str | None = None


def _check_field(ok: bool, sentence: str) -> None:
    if not ok:
        raise _bad(sentence)


def _parse_request(owner: str, request: object) -> EnrollmentRequest:
    if not isinstance(request, dict):
        raise _bad("request must be a JSON object {kind, actor, instanceId, ...}")
    kind = request.get("kind")
    if kind not in ENROLL_KINDS + HOSTED_KINDS:
        raise _bad(f"request kind {shown(kind)} is not one of enroll, release, create, status - send one of those")
    enroll = kind in ENROLL_KINDS
    fields = _closed(request, _ENROLL_FIELDS if enroll else _HOSTED_FIELDS, _ENROLL_SHAPE if enroll else _HOSTED_SHAPE)
    _check_field(is_actor(fields["actor"]), "request actor must be the manager's actor name (letters, digits and _)")
    _check_field(is_lifecycle_uid(fields["instanceId"]), "request instanceId must be 26 to 32 characters of a-z and 0-9")
    if not enroll:
        _check_field(is_actor(fields["target"]), "request target must be an actor name (letters, digits and _)")
        return EnrollmentRequest(owner=owner, kind=kind, actor=fields["actor"], instance_id=fields["instanceId"],
                                 target=fields["target"])  # fmt: skip
    epoch = fields["serveEpoch"]
    _check_field(type(epoch) is int and epoch >= 1, "request serveEpoch must be an integer of at least 1")
    _check_field(is_actor(fields["agent"]), "request agent must be the managed agent's actor name (letters, digits and _)")
    return EnrollmentRequest(owner=owner, kind=kind, actor=fields["actor"], instance_id=fields["instanceId"],
                             serve_epoch=epoch, agent=fields["agent"])  # fmt: skip


def parse_enrollment_body(body: object) -> EnrollmentRequest:
    """Parse a ``POST /manager-service-authority/verify-enrollment`` body (spec "Host-only routes").

    The body is exactly ``{owner, request}``; ``request`` is exactly ``{kind: "enroll"|"release",
    actor, instanceId, serveEpoch, agent}`` or ``{kind: "create"|"status", actor, instanceId,
    target}``. ``owner`` is a derived owner, ``actor``/``agent``/``target`` actor names,
    ``instanceId`` a lifecycle token, ``serveEpoch`` an integer >= 1. Nothing else is read: a
    ``scope`` anywhere is an unknown field.

    Raises:
        Refused: BAD_REQUEST naming the field that is missing, extra or malformed, or the
            unknown ``kind``.
    """
    fields = _closed(body, _BODY_FIELDS, "the body is exactly {owner, request}")
    _check_field(is_owner(fields["owner"]), "owner must be a derived owner (u_ followed by 26 characters a-z and 2-7)")
    return _parse_request(fields["owner"], fields["request"])


def _manager_row(request: EnrollmentRequest, interactive: LedgerRow | None, managed: LedgerRow | None) -> LedgerRow:
    name = principal(request.owner, request.actor)
    if interactive is not None and managed is not None:
        raise Refused(
            RefusalCode.NOT_GRANTED,
            f"manager actor {name} has both an interactive and a managed ledger row, which is a broken ledger - "
            f"revoke one of them with `cotal actor revoke`",
        )
    row = interactive if interactive is not None else managed
    if row is None or row.principal != name:
        raise Refused(
            RefusalCode.NOT_GRANTED,
            f'manager actor "{request.actor}" has no ledger row for owner {request.owner} - the operator grants it with '
            f"`cotal actor grant {request.actor} --owner {request.owner} --scope {SUPERVISE_SCOPE}`",
        )
    return row


def _check_instance(request: EnrollmentRequest, instance: ManagerInstance | None) -> ManagerInstance:
    if instance is None or instance.owner != request.owner or instance.instance_id != request.instance_id:
        raise Refused(
            RefusalCode.PRECONDITION_FAILED,
            f"manager instance {request.instance_id} is not registered for owner {request.owner} - {_REGISTER_FIX}",
        )
    if instance.actor != request.actor:
        raise Refused(
            RefusalCode.CONFLICT,
            f'manager instance {request.instance_id} is registered to another manager actor than "{request.actor}" - '
            f"send the instance's own actor, or register this actor's instance: cotal manager register",
        )
    if request.serve_epoch is not None and request.serve_epoch != instance.serve_epoch:
        raise Refused(
            RefusalCode.CONFLICT,
            f"serve epoch {request.serve_epoch} is not the registered serve epoch {instance.serve_epoch} of manager "
            f"instance {request.instance_id} - restart the manager so it serves under its current registration",
        )
    return instance


def decide_enrollment(
    request: EnrollmentRequest,
    *,
    interactive: LedgerRow | None,
    managed: LedgerRow | None,
    instance: ManagerInstance | None,
) -> dict[str, Any]:
    """Decide one verify-enrollment request (spec "Host-only routes"). Decides only.

    Checks, in order: the manager actor has exactly one fresh ledger row for ``owner`` (either
    kind); the row's scope has ``supervise``; ``mgr.<owner>.<instanceId>`` is registered; it is
    registered to this actor; for ``enroll``/``release`` its serve epoch is the request's.

    Args:
        request: from :func:`parse_enrollment_body`.
        interactive, managed: the manager actor's fresh ledger rows (``read_ledger(owner, actor)``).
        instance: ``RecordsStore.get_manager(owner, instanceId)``, or None when not registered.

    Returns:
        The 200 body: ``{"authorized": true, "owner", "actor", "instanceId", "serveEpoch"}``
        (enroll/release) or ``{"authorized": true, "owner", "instanceId", "actor", "target"}``
        (create/status).

    Raises:
        Refused: NOT_GRANTED 401 no ledger row (or a broken ledger with both kinds); FORBIDDEN
            403 the row lacks ``supervise``; PRECONDITION_FAILED 412 no registered instance;
            CONFLICT 409 registered to another actor, or a stale serve epoch.
    """
    row = _manager_row(request, interactive, managed)
    if SUPERVISE_SCOPE not in row.scope:
        raise Refused(
            RefusalCode.FORBIDDEN,
            f"manager actor {row.principal} lacks ledger scope {SUPERVISE_SCOPE} - the operator grants it with "
            f"`cotal actor grant {request.actor} --owner {request.owner} --scope {SUPERVISE_SCOPE}`",
        )
    instance = _check_instance(request, instance)
    if request.kind in HOSTED_KINDS:
        return {"authorized": True, "owner": request.owner, "instanceId": request.instance_id,
                "actor": request.actor, "target": request.target}  # fmt: skip
    return {"authorized": True, "owner": request.owner, "actor": request.actor,
            "instanceId": request.instance_id, "serveEpoch": instance.serve_epoch}  # fmt: skip


# --- tool-result consent ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsentRequest:
    """A parsed ``POST /tool-result-consent/issue`` body.

    Attributes:
        idp_token: the IdP JWT that must be a fresh password proof.
        subject: the host's authenticated session subject (IdP ``sub``).
        actor: the interactive actor the consent is for (same owner as the subject).
        tool_call_id: ``[A-Za-z0-9_-]{1,128}``.
        result_sha256: the tool result's SHA-256, 64 lowercase hex (the result itself never comes).
    """

    idp_token: str
    subject: str
    actor: str
    tool_call_id: str
    result_sha256: str


def parse_consent_body(body: object) -> ConsentRequest:
    """Parse the consent body, exactly ``{idpToken, subject, actor, toolCallId, resultSha256}``.

    Raises:
        Refused: BAD_REQUEST naming the field that is missing, extra or malformed.
    """
    fields = _closed(body, frozenset(_CONSENT_FIELDS), "the body is exactly {idpToken, subject, actor, toolCallId, resultSha256}")
    for name in ("idpToken", "subject"):
        _check_field(isinstance(fields[name], str) and bool(fields[name]), f"{name} must be a non-empty string")
    _check_field(is_actor(fields["actor"]), "actor must be an actor name (letters, digits and _)")
    _check_field(
        isinstance(fields["toolCallId"], str) and _TOOL_CALL_ID.fullmatch(fields["toolCallId"]) is not None,
        "toolCallId must be 1 to 128 characters of letters, digits, _ and -",
    )
    _check_field(
        isinstance(fields["resultSha256"], str) and _SHA256_HEX.fullmatch(fields["resultSha256"]) is not None,
        "resultSha256 must be the result's SHA-256 as 64 lowercase hex characters",
    )
    return ConsentRequest(idp_token=fields["idpToken"], subject=fields["subject"], actor=fields["actor"],
                          tool_call_id=fields["toolCallId"], result_sha256=fields["resultSha256"])  # fmt: skip


def authorize_consent(owner: str, actor: str, interactive: LedgerRow | None) -> LedgerRow:
    """The consenting person (``owner``) must hold an interactive row for ``actor``.

    Raises:
        Refused: NOT_GRANTED naming ``cotal actor grant`` when there is no interactive row for
            exactly ``<owner>.<actor>``.
    """
    if interactive is None or interactive.kind is not LedgerKind.INTERACTIVE or interactive.principal != principal(owner, actor):
        raise Refused(
            RefusalCode.NOT_GRANTED,
            f'actor "{actor}" is not granted to this user interactively, so they cannot consent for it - the operator '
            f"grants it with `cotal actor grant {actor} --owner {owner}`",
        )
    return interactive


def new_consent_id(random16: bytes) -> str:
    """A consent id (``jti``): base64url of 16 random bytes, 22 characters.

    Raises:
        ValueError: ``random16`` is not 16 bytes (a caller bug).
    """
    if not isinstance(random16, bytes) or len(random16) != CONSENT_ID_RANDOM_BYTES:
        raise ValueError("a consent id needs 16 random bytes")
    return b64url_encode(random16)


def consent_key(consent_id: str) -> str:
    """The records-store key of a consent: ``consent.<jti>``."""
    return CONSENT_KEY_PREFIX + consent_id


def consent_claims(request: ConsentRequest, *, space: str, owner: str, consent_id: str, now: int) -> dict[str, Any]:
    """The consent's claims, exactly ``{iss, aud, sub, act: {owner, actor}, toolCallId,
    resultSha256, jti, iat, exp}`` with ``exp = iat + 300`` (:data:`CONSENT_TTL_S`).

    Args:
        request: the parsed body (its token already decided a fresh password proof).
        space: the space (``aud``; ``iss`` is ``urn:cotal:auth:<space>``).
        owner: the owner derived from the proof's subject (``sub`` and ``act.owner``).
        consent_id: from :func:`new_consent_id`.
        now: integer unix seconds (``iat``).
    """
    return {
        "iss": space_issuer(space), "aud": space, "sub": owner, "act": {"owner": owner, "actor": request.actor},
        "toolCallId": request.tool_call_id, "resultSha256": request.result_sha256, "jti": consent_id,
        "iat": now, "exp": now + CONSENT_TTL_S,
    }  # fmt: skip


def sign_consent(claims: dict[str, Any], key: IssuerKey) -> str:
    """The consent JWS: header ``{alg: EdDSA, kid, typ: "cotal-consent+jwt"}``, signed by the
    space issuer key (verifiable with the space's published JWKS)."""
    return sign_ed25519_jws({"alg": "EdDSA", "kid": key.kid, "typ": CONSENT_TYP}, claims, key)


def render_consent_record(claims: dict[str, Any]) -> bytes:
    """The record stored at ``consent.<jti>``: ``{"ver": 1, "consentId", "owner", "actor",
    "toolCallId", "resultSha256", "iat", "exp"}`` as compact JSON (no token, no result content)."""
    record = {
        "ver": 1, "consentId": claims["jti"], "owner": claims["act"]["owner"], "actor": claims["act"]["actor"],
        "toolCallId": claims["toolCallId"], "resultSha256": claims["resultSha256"], "iat": claims["iat"],
        "exp": claims["exp"],
    }  # fmt: skip
    return encode_row(record)
