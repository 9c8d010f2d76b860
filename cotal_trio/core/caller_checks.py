"""The host check of standalone callers: what an endpoint host runs before it serves a request
(spec credential-authority "Standalone callers": the describe/invoke routes consume the caller's
paired private intent "only after native signature/current-issuer, user-key, time-window,
permission-builder and principal-tag checks"; issue 6 item 7; docs/static-credentials.md "Host
check").

A request carries the caller's user JWT in ``Cotal-Caller-Jwt``
(:data:`~cotal_trio.core.callers.CALLER_JWT_HEADER`). The check runs in two halves:
:func:`check_caller_jwt` needs no intent (signature, current issuer, revocation, time window, tags
against the request subject) and runs first; only then is the intent read by the coordinates it
verified, and :func:`check_caller_intent` runs the intent-bound checks (user key, times, builder
and ceiling digest, every other claim). :func:`check_standalone_caller` runs both on an intent at
hand. The data account's signing keys and revocations are a :class:`DataAccount`. The surface,
the builder and the intent are :mod:`cotal_trio.core.callers`.

The intent selects coordinates; it is no wire grant, accepted-generation proof or live lifecycle
check, and broker admission remains a separate requirement.

Pure and synchronous: no clock (``now`` is an argument), no randomness, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import natsjwt, wire
from .callers import (
    Intent,
    Surface,
    ceiling_digest,
    is_unix_time,
    parse_intent,
    standalone_caller_permissions,
)
from .credentials import credential_tags
from .errors import CodecError, RefusalCode, Refused
from .identity import is_actor, is_lifecycle_uid, is_owner
from .nkeys import Prefix, looks_like_public_key
from .sessions import is_endpoint

__all__ = [
    "CLOCK_SKEW_S",
    "CallerIntent",
    "DataAccount",
    "VerifiedCaller",
    "account_signers",
    "check_caller_intent",
    "check_caller_jwt",
    "check_standalone_caller",
]

# Seconds a caller JWT's iat may lie ahead of the host's clock.
CLOCK_SKEW_S = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class DataAccount:
    """What the host check needs of the space's data account, from its verified account JWT.

    Attributes:
        key: the account's public key (``A...``, the account JWT's ``sub``).
        signers: its current signing keys, plain and scoped (``nats.signing_keys``).
        revocations: ``nats.revocations``: user key (or ``*``, every user) -> unix seconds. As
            nats-server reads it, a user JWT whose ``iat`` is at or before that time is revoked.

    Spec "Standalone callers" (the "current-issuer" check); docs/static-credentials.md "Host check".
    """

    key: str
    signers: frozenset[str]
    revocations: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_claims(cls, claims: Mapping[str, Any]) -> DataAccount:
        """The account of verified account-JWT ``claims`` (malformed signing keys and revocation
        entries are left out: they grant and revoke nothing)."""
        nats = claims.get("nats")
        revoked = nats.get("revocations") if isinstance(nats, Mapping) else None
        entries = revoked.items() if isinstance(revoked, Mapping) else ()
        return cls(key=str(claims.get("sub")), signers=account_signers(claims),
                   revocations={k: v for k, v in entries if isinstance(k, str) and is_unix_time(v)})  # fmt: skip

    def revoked_at(self, user_key: str) -> int | None:
        """The latest revocation covering ``user_key`` (its own or ``*``), or None."""
        times = [t for t in (self.revocations.get(user_key), self.revocations.get("*")) if t is not None]
        return max(times) if times else None


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifiedCaller:
    """A request whose caller JWT passed every check that needs no intent (:func:`check_caller_jwt`).

    Attributes:
        claims: the JWT's verified claims.
        owner, actor, uid: its principal and lifecycle tags, equal to the request subject's
            principal: they select the intent's key (:func:`~cotal_trio.core.callers.intent_key`).
        verb: the verb asked (``describe`` or a surface verb).
    """

    claims: Mapping[str, Any]
    owner: str
    actor: str
    uid: str
    verb: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CallerIntent:
    """A request a host may serve: the caller's intent (its coordinates) and the verb asked.

    Selecting coordinates is all it does: it is no wire grant, accepted-generation proof or live
    lifecycle check, and broker admission remains a separate requirement.

    Spec "Standalone callers".
    """

    intent: Intent
    verb: str


def account_signers(account_claims: Mapping[str, Any]) -> frozenset[str]:
    """The current signing keys of a data account, from its (verified) account JWT claims.

    Spec "Standalone callers".
    """
    nats = account_claims.get("nats")
    keys = nats.get("signing_keys") if isinstance(nats, Mapping) else None
    found = set()
    for key in keys if isinstance(keys, list) else ():
        key = key.get("key") if isinstance(key, Mapping) else key  # scoped signing keys are objects
        if looks_like_public_key(key, Prefix.ACCOUNT):
            found.add(key)
    return frozenset(found)


def _refuse(code: RefusalCode, why: str) -> Refused:
    return Refused(code, f"standalone caller refused: {why}")


def _tag(tags: object, prefix: str) -> str | None:
    values = [t.removeprefix(prefix) for t in tags if isinstance(t, str) and t.startswith(prefix)] if isinstance(tags, list) else []
    return values[0] if len(values) == 1 else None


def _verified_claims(jwt: str, account: DataAccount) -> dict[str, Any]:
    try:
        claims = natsjwt.verify(jwt)
    except CodecError:
        raise _refuse(RefusalCode.BAD_CREDENTIAL, "its JWT's signature does not verify - send the JWT of the minted .creds") from None
    nats = claims["nats"]
    if claims.get("iss") not in account.signers or nats.get("issuer_account") != account.key or nats.get("type") != "user":
        raise _refuse(RefusalCode.BAD_CREDENTIAL, "its JWT is not signed by a current signing key of the space's data account")
    return claims


def _check_lifetime(claims: Mapping[str, Any], account: DataAccount, now: int) -> None:
    """Revocation (``nats.revocations``, as the broker reads it) and the ``[iat - 5 s, exp)`` window."""
    iat, exp = claims.get("iat"), claims.get("exp")
    if not (is_unix_time(iat) and is_unix_time(exp)):
        raise _refuse(RefusalCode.BAD_CREDENTIAL, "its JWT has no whole-second issue and expiry times")
    revoked = account.revoked_at(claims["sub"]) if isinstance(claims.get("sub"), str) else None
    if revoked is not None and revoked >= iat:
        raise _refuse(RefusalCode.BAD_CREDENTIAL, f"its user key was revoked at {revoked} (`cotal auth revoke-credential`) - "
                                                  "use the label's current file")  # fmt: skip
    if now + CLOCK_SKEW_S < iat or now >= exp:
        raise _refuse(RefusalCode.BAD_CREDENTIAL, f"its JWT is outside its time window [{iat}, {exp}) at {now} - mint it again")


def _parse_subject(subject: str, space: str, endpoint: str) -> tuple[str, str, str]:
    """``(verb, owner, actor)`` of ``cotal.S.ep.<endpoint>.<verb>.<o>.<a>``."""
    head = f"{wire.space_prefix(space)}.ep.{endpoint}."
    parts = subject.removeprefix(head).split(".") if subject.startswith(head) else []
    if len(parts) != 3 or not (is_endpoint(parts[0]) and is_owner(parts[1]) and is_actor(parts[2])):
        raise _refuse(RefusalCode.FORBIDDEN, f"{subject} is not a request on endpoint {endpoint}'s legacy rail")
    return parts[0], parts[1], parts[2]


def check_caller_jwt(
    jwt: str, *, subject: str, space: str, endpoint: str, surface: Surface, account: DataAccount, now: int,
) -> VerifiedCaller:
    """The host checks that need no intent, run before the intent is read (spec "Standalone
    callers": the routes consume the intent "only after native signature/current-issuer, ...,
    time-window, ... and principal-tag checks").

    In order: the JWT's signature, and its issuer a current signing key of ``account`` with
    ``issuer_account`` that account and type ``user``; its ``sub`` not revoked at or after its
    ``iat`` (``account.revocations``); ``now`` within ``[iat - 5 s, exp)``; one ``principal:`` and
    one ``lifecycle:`` tag; the ``subject`` on this endpoint's legacy rail, addressed as that
    principal, its verb ``describe`` or a verb of ``surface``.

    Args:
        jwt: the ``Cotal-Caller-Jwt`` header (a compact NATS user JWT).
        subject: the request's subject, ``cotal.S.ep.<endpoint>.<verb>.<o>.<a>``.
        space, endpoint, surface: the host's; account: the data account (:class:`DataAccount`).
        now: wall time, unix seconds.

    Returns:
        The verified claims and the coordinates that select the intent (:func:`~cotal_trio.core.callers.intent_key`).

    Raises:
        Refused: BAD_CREDENTIAL (signature, issuer, revoked, time window), NOT_GRANTED (tags,
            principal) or FORBIDDEN (the subject, the verb), each ``standalone caller refused: <reason>``.
    """
    claims = _verified_claims(jwt, account)
    _check_lifetime(claims, account, now)
    tags = claims["nats"].get("tags")
    who, uid = _tag(tags, "principal:"), _tag(tags, "lifecycle:")
    if who is None or not is_lifecycle_uid(uid):
        raise _refuse(RefusalCode.NOT_GRANTED, "its JWT carries no single principal and lifecycle tag - send the minted .creds' JWT")
    verb, owner, actor = _parse_subject(subject, space, endpoint)
    if f"{owner}.{actor}" != who:
        raise _refuse(RefusalCode.NOT_GRANTED, f"the request is addressed as {owner}.{actor}, not as its JWT's principal {who}")
    if verb not in surface.request_verbs:
        raise _refuse(RefusalCode.FORBIDDEN, f"{verb} is not describe or a verb of endpoint {endpoint}")
    return VerifiedCaller(claims=claims, owner=owner, actor=actor, uid=uid, verb=verb)  # type: ignore[arg-type]


def _built_fragment(nats: Mapping[str, Any], intent: Intent, surface: Surface) -> dict[str, Any]:
    """The JWT's ``pub``/``sub`` if they are the builder's output for the intent's coordinates
    (channels and inbox nonce read back from its own ``sub.allow``) with the intent's ceiling.

    Raises:
        Refused: NOT_GRANTED, they are not (a malformed fragment included).
    """
    fragment = {"pub": nats.get("pub"), "sub": nats.get("sub")}
    try:
        sub = fragment["sub"]["allow"]
        prefix = f"{wire.space_prefix(intent.space)}.ch."
        channels = tuple(s.removeprefix(prefix) for s in sub if s.startswith(prefix))
        [nonce] = [s[len("_INBOX_"):-2] for s in sub if s.startswith("_INBOX_") and s.endswith(".>")]
        built = standalone_caller_permissions(
            space=intent.space, owner=intent.owner, actor=intent.actor, channels=channels, inbox_nonce=nonce,
            endpoint=intent.endpoint, verbs=surface.verbs,
        ).to_nats()  # fmt: skip
        if built == fragment and ceiling_digest(fragment) == intent.ceiling:
            return built
    except (CodecError, Refused, TypeError, ValueError, KeyError, AttributeError):
        pass  # a malformed fragment is no builder output
    raise _refuse(RefusalCode.NOT_GRANTED, "its JWT's permissions are not what the standalone caller builder made for its intent")


def _check_minted(claims: Mapping[str, Any], intent: Intent, account: DataAccount, fragment: dict[str, Any]) -> None:
    """Every claim is what the mint writes (:func:`~cotal_trio.core.credentials.credential_claims`):
    no other member (``bearer_token``, ``resp``, ``src``, ``times``, other limits, ``aud``,
    ``nbf``, ...) and no other value; only the ``label:`` tag is read back (it is not in the intent)."""
    label = _tag(claims["nats"].get("tags"), "label:")
    tags = credential_tags(owner=intent.owner, actor=intent.actor, profile="agent", uid=intent.uid,
                           label=label if is_actor(label) else "?")  # fmt: skip
    want = natsjwt.user_claims(user=intent.user_key, name=f"{intent.owner}-{intent.actor}", issuer_account=account.key,
                               permissions=fragment, exp=intent.expires_at, tags=tags)  # fmt: skip
    top = {k: v for k, v in claims.items() if k not in ("iss", "iat", "jti", "nats")}
    differ = sorted(k for k in {*top, *want} - {"nats"} if top.get(k, _ABSENT) != want.get(k, _ABSENT))
    have_nats, want_nats = claims["nats"], want["nats"]
    differ += sorted(f"nats.{k}" for k in {*have_nats, *want_nats} if have_nats.get(k, _ABSENT) != want_nats.get(k, _ABSENT))
    if differ:
        raise _refuse(RefusalCode.NOT_GRANTED, f"its JWT carries claims the mint does not write ({', '.join(differ)}) - "
                                               "send the minted .creds' JWT unedited")  # fmt: skip


_ABSENT = object()


def check_caller_intent(
    caller: VerifiedCaller, intent: bytes | Mapping[str, Any], *, space: str, endpoint: str, surface: Surface,
    account: DataAccount,
) -> CallerIntent:
    """The host checks bound to the intent, run once :func:`check_caller_jwt` passed and the
    intent was read by its coordinates (spec "Standalone callers": "user-key, ...,
    permission-builder and principal-tag checks").

    In order: the intent parses; its space, endpoint and surface digest are the host's (the file
    was minted from this surface); its owner, actor and UID are the JWT's tags; ``sub`` is its
    ``userKey``; ``iat``/``exp`` are its ``issuedAt``/``expiresAt``; ``pub``/``sub`` are
    :func:`standalone_caller_permissions` for its coordinates with its ``ceiling`` digest; and
    every other claim is what the mint writes (:func:`~cotal_trio.core.credentials.credential_claims`).

    The intent selects coordinates; it is no wire grant, accepted-generation proof or live
    lifecycle check. Broker admission remains a separate requirement.

    Args:
        caller: what :func:`check_caller_jwt` returned; intent: the stored intent (bytes as read,
            or its object); space, endpoint, surface, account: the host's.

    Raises:
        Refused: NOT_GRANTED (intent unreadable or for another endpoint or surface, tags, user key,
            permissions, other claims) or BAD_CREDENTIAL (times), ``standalone caller refused: <reason>``.
    """
    try:
        found = parse_intent(intent)
    except CodecError:
        raise _refuse(RefusalCode.NOT_GRANTED, "its issuance intent is unreadable") from None
    if (found.space, found.endpoint) != (space, endpoint) or found.surface != surface.digest:
        raise _refuse(RefusalCode.NOT_GRANTED, f"its intent was minted for another endpoint or surface than {endpoint} {surface.digest} - mint it again")
    if (found.owner, found.actor, found.uid) != (caller.owner, caller.actor, caller.uid):
        raise _refuse(RefusalCode.NOT_GRANTED, "its JWT's principal or lifecycle tag is not its intent's")
    claims = caller.claims
    if claims.get("sub") != found.user_key:
        raise _refuse(RefusalCode.NOT_GRANTED, "its JWT's user key is not its intent's")
    if (claims["iat"], claims["exp"]) != (found.issued_at, found.expires_at):
        raise _refuse(RefusalCode.BAD_CREDENTIAL, "its JWT's issue and expiry times are not its intent's")
    fragment = _built_fragment(claims["nats"], found, surface)
    _check_minted(claims, found, account, fragment)
    return CallerIntent(intent=found, verb=caller.verb)


def check_standalone_caller(
    jwt: str, *, subject: str, space: str, endpoint: str, surface: Surface, account: DataAccount,
    intent: bytes | Mapping[str, Any], now: int,
) -> CallerIntent:
    """Both halves of the host check on an intent already at hand: :func:`check_caller_jwt`, then
    :func:`check_caller_intent`. A host that reads the intent from the store runs the first half
    before the read (:func:`cotal_trio.ops.callers.check_caller_request`).

    Raises:
        Refused: as the two halves.

    Spec "Standalone callers".
    """
    caller = check_caller_jwt(jwt, subject=subject, space=space, endpoint=endpoint, surface=surface, account=account, now=now)
    return check_caller_intent(caller, intent, space=space, endpoint=endpoint, surface=surface, account=account)
