"""Standalone callers: the surface, the permission builder, the private intent and the host check
(spec credential-authority "Standalone callers"; issue 6 item 7; docs/static-credentials.md).

``cotal auth mint --endpoint E --out PATH`` hands out an ordinary native ``agent`` footprint plus
explicit request rows on the legacy endpoint rail of one **surface**, read fresh from the endpoint
itself. This module is the pure part; the I/O is :mod:`cotal_trio.lanes.callers` and the command
``cotal_trio.cli.auth``.

* **Surface** (:class:`Surface`): the endpoint's answer to ``describe`` is canonical JSON
  ``{"ver": 1, "surface": {...}, "digest": "sha256:<64 hex>"}`` whose digest is the sha256 of the
  canonical JSON of ``surface`` (:func:`~cotal_trio.core.issued.canonical_json`). The surface is
  a closed shape: ``endpoint``, ``verbs``, ``targeted``, ``synchronous``, ``ephemeral``,
  ``journaled``, ``action``. Only untargeted synchronous ephemeral surfaces that are neither
  journaled nor actions are supported (:func:`check_supported`).
* **Permissions** (:func:`standalone_caller_permissions`): the ``agent`` builder with no role and
  no capability, its channels both read and post ACL, plus ``cotal.S.ep.E.<verb>.<o>.<a>`` for
  ``describe`` and each surface verb, before ``$SYS.REQ.USER.INFO``.
* **Intent** (:class:`Intent`): a create-only row ``intent.v1.<o>.<a>.<uid>`` in
  ``cotal_issued_<S>``, canonical JSON, no credential inside, written before any native footprint
  work, with a per-message TTL of ``expiresAt + 60 - now``.
* **Host check**: what an endpoint host runs before it serves a describe with the header
  ``Cotal-Caller-Jwt`` (the caller's user JWT) or any other verb, in two halves:
  :func:`check_caller_jwt` needs no intent (signature, current issuer, revocation, time window,
  tags against the request subject) and runs first; only then is the intent read by the
  coordinates it verified, and :func:`check_caller_intent` runs the intent-bound checks (user key,
  times, builder and ceiling digest, every other claim). :func:`check_standalone_caller` runs both
  on an intent at hand. The data account's signing keys and revocations are a :class:`DataAccount`.

The intent selects coordinates; it is no wire grant, accepted-generation proof or live lifecycle
check, and broker admission remains a separate requirement.

Pure and synchronous: no clock (``now`` is an argument), no randomness, no I/O.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import natsjwt, wire
from .credentials import credential_tags
from .errors import CodecError, ConfigError, RefusalCode, Refused
from .identity import is_actor, is_lifecycle_uid, is_owner, is_space
from .issued import ROW_GRACE_S, canonical_json, ceiling_from_native
from .nkeys import Prefix, looks_like_public_key
from .profiles import USER_INFO_SUBJECT, Permissions, agent_permissions, provisioner_permissions
from .sessions import is_endpoint

__all__ = [
    "CALLER_JWT_HEADER",
    "CLOCK_SKEW_S",
    "DESCRIBE",
    "INTENT_PREFIX",
    "MAX_VERBS",
    "CallerIntent",
    "DataAccount",
    "Intent",
    "Surface",
    "VerifiedCaller",
    "account_signers",
    "ceiling_digest",
    "check_caller_intent",
    "check_caller_jwt",
    "check_endpoint",
    "check_standalone_caller",
    "check_supported",
    "intent_key",
    "is_digest",
    "intent_ttl_s",
    "minter_permissions",
    "parse_describe_answer",
    "parse_intent",
    "render_describe_answer",
    "render_intent",
    "standalone_caller_permissions",
]

VERSION = 1
DESCRIBE = "describe"
CALLER_JWT_HEADER = "Cotal-Caller-Jwt"
"""The request header carrying the caller's user JWT (the public half of its ``.creds``, no seed)."""
INTENT_PREFIX = "intent.v1."
# A surface lists at most this many verbs: each becomes a publish row in the caller's JWT.
MAX_VERBS = 32
# The host accepts a JWT issued up to this many seconds in its future (the bearer's skew).
CLOCK_SKEW_S = 5
# Surface properties and the value a standalone caller file supports (spec "Standalone callers").
SUPPORTED: Mapping[str, bool] = {
    "targeted": False, "synchronous": True, "ephemeral": True, "journaled": False, "action": False,
}  # fmt: skip
_SURFACE_KEYS = frozenset({"endpoint", "verbs", *SUPPORTED})
_ANSWER_KEYS = frozenset({"ver", "surface", "digest"})
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_INTENT_KEYS = frozenset({
    "ver", "space", "endpoint", "owner", "actor", "uid", "userKey", "surface", "ceiling", "issuedAt", "expiresAt",
})  # fmt: skip
_MAX_SAFE_INT = 2**53 - 1


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_digest(value: object) -> bool:
    """True when ``value`` is ``sha256:`` followed by 64 lowercase hex digits.

    Spec "Standalone callers".
    """
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


def check_endpoint(endpoint: object) -> str:
    """Return ``endpoint`` if it names an endpoint of the legacy rail (``--endpoint``).

    Raises:
        ConfigError: not 1 to 64 of ``[A-Za-z0-9_-]``, or ``v1`` (that token is the issued rail).

    Spec "Standalone callers".
    """
    if not is_endpoint(endpoint) or endpoint == "v1":
        raise ConfigError(
            f"--endpoint {endpoint!s} is not an endpoint name - pass 1 to 64 letters, digits, _ and - (not v1)"
        )
    return endpoint  # type: ignore[return-value]


# -- the surface -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Surface:
    """An endpoint's surface, version 1 (spec "Standalone callers": "a fresh digest-verified surface").

    Attributes:
        endpoint: the endpoint name (``[A-Za-z0-9_-]{1,64}``, not ``v1``).
        verbs: its verbs, 1 to :data:`MAX_VERBS` distinct endpoint tokens in the host's order;
            ``describe`` may be listed once (every caller gets it anyway).
        targeted, synchronous, ephemeral, journaled, action: booleans; see :func:`check_supported`.

    Raises:
        CodecError: a field breaks its grammar; the message names the field.
    """

    endpoint: str
    verbs: tuple[str, ...]
    targeted: bool
    synchronous: bool
    ephemeral: bool
    journaled: bool
    action: bool

    def __post_init__(self) -> None:
        if not is_endpoint(self.endpoint) or self.endpoint == "v1":
            raise CodecError("surface.endpoint is not an endpoint name (1 to 64 of A-Za-z0-9_-, not v1)")
        verbs = self.verbs
        if not isinstance(verbs, tuple) or not 1 <= len(verbs) <= MAX_VERBS:
            raise CodecError(f"surface.verbs must list 1 to {MAX_VERBS} verbs")
        for verb in verbs:
            if not is_endpoint(verb):
                raise CodecError(f"surface.verbs holds {verb!r}, which is not an endpoint verb (1 to 64 of A-Za-z0-9_-)")
        if len(set(verbs)) != len(verbs):
            twice = next(v for v in verbs if verbs.count(v) > 1)
            raise CodecError(f"surface.verbs lists {twice} twice")
        for name in SUPPORTED:
            if type(getattr(self, name)) is not bool:
                raise CodecError(f"surface.{name} must be true or false")

    @property
    def request_verbs(self) -> tuple[str, ...]:
        """``describe`` then the other verbs: the rows a caller of this surface publishes on."""
        return (DESCRIBE, *(v for v in self.verbs if v != DESCRIBE))

    def to_json(self) -> dict[str, Any]:
        """The surface object ``{"endpoint", "verbs", "targeted", ...}``."""
        return {"endpoint": self.endpoint, "verbs": list(self.verbs), **{name: getattr(self, name) for name in SUPPORTED}}

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` of the canonical JSON of :meth:`to_json`."""
        return _sha256(canonical_json(self.to_json()))


def render_describe_answer(surface: Surface) -> bytes:
    """What a host answers to ``describe``: canonical ``{"ver": 1, "surface": ..., "digest": ...}``.

    Spec "Standalone callers".
    """
    return canonical_json({"ver": VERSION, "surface": surface.to_json(), "digest": surface.digest})


def _describe_refusal(endpoint: str, problem: str) -> ConfigError:
    return ConfigError(
        f"endpoint {endpoint} answered describe with {problem} - fix its host's surface (the version 1 shape in "
        "docs/static-credentials.md), then mint again"
    )


def parse_describe_answer(data: bytes, *, endpoint: str) -> Surface:
    """The surface an endpoint answered to ``describe``, once its shape and digest check.

    Args:
        data: the answer's payload (UTF-8 JSON).
        endpoint: the endpoint that was asked; the surface must name it.

    Raises:
        ConfigError: not a JSON object of exactly ``ver``, ``surface``, ``digest``; another
            version; a surface with unknown or missing keys or a malformed field (named); a
            surface of another endpoint; or a digest that is not the sha256 of the canonical
            surface (named as a mismatch). Nothing was written.

    Spec "Standalone callers".
    """
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _describe_refusal(endpoint, "something that is not JSON") from None
    if not isinstance(obj, dict) or set(obj) != _ANSWER_KEYS:
        raise _describe_refusal(endpoint, "an object whose keys are not exactly ver, surface, digest")
    if type(obj["ver"]) is not int or obj["ver"] != VERSION:
        raise _describe_refusal(endpoint, f"version {obj['ver']!r}, not {VERSION}")
    raw = obj["surface"]
    if not isinstance(raw, dict) or set(raw) != _SURFACE_KEYS:
        extra = sorted(set(raw) - _SURFACE_KEYS) if isinstance(raw, dict) else []
        missing = sorted(_SURFACE_KEYS - set(raw)) if isinstance(raw, dict) else []
        detail = f" (unknown {', '.join(extra)})" if extra else f" (missing {', '.join(missing)})" if missing else ""
        raise _describe_refusal(endpoint, f"a surface that is not the closed version 1 shape{detail}")
    if not isinstance(raw["verbs"], list):
        raise _describe_refusal(endpoint, "surface.verbs that is not a list")
    try:
        surface = Surface(endpoint=raw["endpoint"], verbs=tuple(raw["verbs"]), **{name: raw[name] for name in SUPPORTED})
        digest = _sha256(canonical_json(raw))
    except CodecError as exc:
        raise _describe_refusal(endpoint, str(exc).removeprefix("canonical JSON: ")) from None
    if surface.endpoint != endpoint:
        raise _describe_refusal(endpoint, f"surface.endpoint {surface.endpoint}")
    if obj["digest"] != digest:
        raise ConfigError(
            f"endpoint {endpoint}'s surface digest {obj['digest']!s} does not match its surface ({digest}) - fix its "
            "host: the digest is the sha256 of the surface's canonical JSON (RFC 8785)"
        )
    return surface


def check_supported(surface: Surface) -> None:
    """Refuse a surface a standalone caller file cannot serve (spec "Standalone callers": only
    untargeted synchronous ephemeral surfaces; targeted, journaled and action surfaces refuse
    "instead of receiving guessed or incomplete authority").

    Raises:
        ConfigError: the surface is targeted, journaled, an action, not synchronous or not
            ephemeral; the sentence names every property that refuses.
    """
    words = {"targeted": "targeted", "synchronous": "asynchronous", "ephemeral": "non-ephemeral",
             "journaled": "journaled", "action": "action"}  # fmt: skip
    refusing = [words[name] for name, want in SUPPORTED.items() if getattr(surface, name) is not want]
    if refusing:
        article = "an" if refusing[0][0] in "aeiou" else "a"
        raise ConfigError(
            f"endpoint {surface.endpoint} is {article} {', '.join(refusing)} surface: standalone caller files support only "
            "untargeted synchronous ephemeral surfaces - call it from a managed seat or through service caller "
            "policy instead"
        )


# -- the permissions ---------------------------------------------------------------------------


def standalone_caller_permissions(
    *, space: str, owner: str, actor: str, channels: tuple[str, ...], inbox_nonce: str, endpoint: str,
    verbs: tuple[str, ...],
) -> Permissions:
    """The permissions of a standalone caller ``<owner>.<actor>`` (spec "Standalone callers";
    docs/wire-layout.md "standalone caller").

    ``pub.allow``: the :func:`~cotal_trio.core.profiles.agent_permissions` list with
    ``allow_publish = allow_subscribe = channels``, no role and no capability (so no
    ``ctl.spawn``, ``ctl.stop``, ``ctl.persona`` or ``ctl.run``), then
    ``cotal.S.ep.<endpoint>.<verb>.<owner>.<actor>`` for ``describe`` and each of ``verbs``
    (duplicates and a listed ``describe`` dropped), then ``$SYS.REQ.USER.INFO``. ``sub.allow``:
    the agent's (each channel, its DMs, ``_INBOX_<nonce>.>``). Replies to its requests come to
    its own inbox.

    Args:
        channels: channel patterns, its read and post ACL both.
        inbox_nonce: the connection's ``name``; grants ``_INBOX_<nonce>.>``.
        endpoint: the endpoint (not ``v1``); verbs: the surface's verbs.

    Raises:
        Refused: BAD_REQUEST when an input breaks its grammar.
    """
    agent = agent_permissions(space=space, owner=owner, actor=actor, allow_publish=tuple(channels),
                              allow_subscribe=tuple(channels), inbox_nonce=inbox_nonce)  # fmt: skip
    rows = [wire.ep_subject(space, endpoint, verb, owner, actor) for verb in dict.fromkeys((DESCRIBE, *verbs))]
    pub = [s for s in agent.pub_allow if s != USER_INFO_SUBJECT]
    return Permissions(pub_allow=tuple(dict.fromkeys([*pub, *rows, USER_INFO_SUBJECT])), sub_allow=agent.sub_allow)


def minter_permissions(*, space: str, owner: str, actor: str, uid: str, endpoint: str, inbox_nonce: str) -> Permissions:
    """The mint's own temporary connection: the ``provisioner`` profile (the space's streams, its
    presence and admission stores, the new principal's DM inbox durable), the issued stores'
    ``STREAM.INFO`` and ``STREAM.CREATE`` (:meth:`~cotal_trio.lanes.issued.IssuedStores.ensure`),
    the publish of the one intent key ``$KV.cotal_issued_S.intent.v1.<o>.<a>.<uid>``, and the
    ``describe`` request ``cotal.S.ep.<endpoint>.describe.<o>.<a>`` as the new principal.

    Raises:
        Refused: BAD_REQUEST when an input breaks its grammar.

    Spec "Standalone callers".
    """
    issued = [wire.kv_stream(wire.issued_bucket(space)), wire.kv_stream(wire.accepted_bucket(space))]
    extra = [api(stream) for stream in issued for api in (wire.js_stream_info, wire.js_stream_create)]
    extra += [wire.kv_subject(wire.issued_bucket(space), intent_key(owner, actor, uid)),
              wire.ep_subject(space, endpoint, DESCRIBE, owner, actor)]  # fmt: skip
    base = provisioner_permissions(space=space, inbox_nonce=inbox_nonce)
    pub = [s for s in base.pub_allow if s != USER_INFO_SUBJECT]
    return Permissions(pub_allow=tuple(dict.fromkeys([*pub, *extra, USER_INFO_SUBJECT])), sub_allow=base.sub_allow)


def ceiling_digest(fragment: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of a NATS permissions fragment's canonical ceiling.

    The ceiling is :func:`~cotal_trio.core.issued.ceiling_from_native` (each list a sorted set),
    rendered as canonical JSON: the same bytes issued evidence records, so list order does not
    change the digest.

    Raises:
        CodecError: the fragment is not the NATS ``{pub, sub}`` shape.

    Spec "Standalone callers".
    """
    return _sha256(ceiling_from_native(fragment).canonical())


# -- the intent --------------------------------------------------------------------------------


def intent_key(owner: str, actor: str, uid: str) -> str:
    """``intent.v1.<owner>.<actor>.<uid>``: the intent's key in ``cotal_issued_<space>``.

    Raises:
        Refused: BAD_REQUEST for a malformed owner, actor or lifecycle UID.

    Spec "Standalone callers".
    """
    if not (is_owner(owner) and is_actor(actor) and is_lifecycle_uid(uid)):
        raise Refused(RefusalCode.BAD_REQUEST, "an intent key needs an owner, an actor and a lifecycle UID")
    return f"{INTENT_PREFIX}{owner}.{actor}.{uid}"


def _is_time(value: object) -> bool:
    return type(value) is int and 0 < value <= _MAX_SAFE_INT


@dataclass(frozen=True, slots=True, kw_only=True)
class Intent:
    """A private create-only issuance intent, version 1 (spec "Standalone callers": it "precedes
    native footprint work and blocks blind replay after interruption"; it "contains no credential
    and proves no submission/completion").

    Attributes:
        space, endpoint: where the caller calls.
        owner, actor: its principal; uid: its lifecycle UID.
        user_key: its user nkey (``U...``), the JWT's ``sub``.
        surface: ``sha256:<hex>`` of the surface it was minted from.
        ceiling: ``sha256:<hex>`` of its permissions' canonical ceiling (:func:`ceiling_digest`).
        issued_at, expires_at: unix seconds, the JWT's ``iat`` and ``exp``.

    Raises:
        CodecError: a field breaks its grammar, or ``expires_at`` is not after ``issued_at``.
    """

    space: str
    endpoint: str
    owner: str
    actor: str
    uid: str
    user_key: str
    surface: str
    ceiling: str
    issued_at: int
    expires_at: int

    def __post_init__(self) -> None:
        checks = (
            (is_space(self.space), "space"), (is_endpoint(self.endpoint) and self.endpoint != "v1", "endpoint"),
            (is_owner(self.owner), "owner"), (is_actor(self.actor), "actor"), (is_lifecycle_uid(self.uid), "uid"),
            (looks_like_public_key(self.user_key, Prefix.USER), "userKey"), (is_digest(self.surface), "surface"),
            (is_digest(self.ceiling), "ceiling"), (_is_time(self.issued_at), "issuedAt"),
            (_is_time(self.expires_at) and self.expires_at > self.issued_at, "expiresAt"),
        )  # fmt: skip
        for ok, what in checks:
            if not ok:
                raise CodecError(f"issuance intent: {what} is malformed")

    @property
    def key(self) -> str:
        """Its key, :func:`intent_key`."""
        return intent_key(self.owner, self.actor, self.uid)

    def to_json(self) -> dict[str, Any]:
        """``{"ver": 1, "space", "endpoint", "owner", "actor", "uid", "userKey", "surface",
        "ceiling", "issuedAt", "expiresAt"}``."""
        return {
            "ver": VERSION, "space": self.space, "endpoint": self.endpoint, "owner": self.owner, "actor": self.actor,
            "uid": self.uid, "userKey": self.user_key, "surface": self.surface, "ceiling": self.ceiling,
            "issuedAt": self.issued_at, "expiresAt": self.expires_at,
        }  # fmt: skip


def render_intent(intent: Intent) -> bytes:
    """The intent's stored bytes: canonical JSON of :meth:`Intent.to_json`.

    Spec "Standalone callers".
    """
    return canonical_json(intent.to_json())


def parse_intent(data: bytes | Mapping[str, Any]) -> Intent:
    """Decode a stored intent (bytes: they must be exactly its canonical JSON) or its object.

    Raises:
        CodecError: not JSON, not exactly the version 1 keys, a malformed field, or bytes that
            are not the canonical form.

    Spec "Standalone callers".
    """
    if isinstance(data, bytes | bytearray):
        try:
            obj = json.loads(data)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise CodecError("issuance intent: it is not UTF-8 JSON") from None
    else:
        obj = data
    if not isinstance(obj, Mapping) or set(obj) != _INTENT_KEYS or obj.get("ver") != VERSION or type(obj["ver"]) is not int:
        raise CodecError(f"issuance intent: it is not a version {VERSION} intent of exactly its keys")
    intent = Intent(
        space=obj["space"], endpoint=obj["endpoint"], owner=obj["owner"], actor=obj["actor"], uid=obj["uid"],
        user_key=obj["userKey"], surface=obj["surface"], ceiling=obj["ceiling"], issued_at=obj["issuedAt"],
        expires_at=obj["expiresAt"],
    )  # fmt: skip
    if isinstance(data, bytes | bytearray) and render_intent(intent) != bytes(data):
        raise CodecError("issuance intent: it is not in canonical form (RFC 8785)")
    return intent


def intent_ttl_s(intent: Intent, *, now: float) -> int:
    """The intent's per-message TTL written at ``now``: whole seconds until ``expiresAt + 60``,
    at least 1 (the issued rows' grace, spec "Issued authority")."""
    return max(1, math.ceil(intent.expires_at + ROW_GRACE_S - now))


# -- the host check ----------------------------------------------------------------------------


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
                   revocations={k: v for k, v in entries if isinstance(k, str) and _is_time(v)})  # fmt: skip

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
            principal: they select the intent's key (:func:`intent_key`).
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
    if not (_is_time(iat) and _is_time(exp)):
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
        The verified claims and the coordinates that select the intent (:func:`intent_key`).

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
    before the read (:func:`cotal_trio.lanes.callers.check_caller_request`).

    Raises:
        Refused: as the two halves.

    Spec "Standalone callers".
    """
    caller = check_caller_jwt(jwt, subject=subject, space=space, endpoint=endpoint, surface=surface, account=account, now=now)
    return check_caller_intent(caller, intent, space=space, endpoint=endpoint, surface=surface, account=account)
