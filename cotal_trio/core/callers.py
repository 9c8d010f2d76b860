"""Standalone callers: the surface, the permission builder and the private intent
(spec credential-authority "Standalone callers"; issue 6 item 7; docs/static-credentials.md).

``cotal auth mint --endpoint E --out PATH`` hands out an ordinary native ``agent`` footprint plus
explicit request rows on the legacy endpoint rail of one **surface**, read fresh from the endpoint
itself. This module is the pure part; the I/O is :mod:`cotal_trio.ops.callers` and the command
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
* **Host check**: what an endpoint host runs before it serves a request carrying
  ``Cotal-Caller-Jwt`` is :mod:`cotal_trio.core.caller_checks`.

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
from dataclasses import dataclass
from typing import Any

from . import wire
from .errors import CodecError, ConfigError, RefusalCode, Refused
from .identity import is_actor, is_lifecycle_uid, is_owner, is_space
from .issued import ROW_GRACE_S, canonical_json, ceiling_from_native
from .nkeys import Prefix, looks_like_public_key
from .profiles import USER_INFO_SUBJECT, Permissions, agent_permissions, provisioner_permissions
from .sessions import is_endpoint

__all__ = [
    "CALLER_JWT_HEADER",
    "DESCRIBE",
    "INTENT_PREFIX",
    "MAX_VERBS",
    "Intent",
    "Surface",
    "ceiling_digest",
    "check_endpoint",
    "check_supported",
    "intent_key",
    "is_digest",
    "is_unix_time",
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
    presence, channel-registry and admission stores, the new principal's DM inbox durable and
    watch readers), the issued stores' ``STREAM.INFO`` and ``STREAM.CREATE`` (:meth:`~cotal_trio.stores.issued.IssuedStores.ensure`),
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


def is_unix_time(value: object) -> bool:
    """Whether ``value`` is a unix time this module writes: a positive int JSON carries exactly."""
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
            (is_digest(self.ceiling), "ceiling"), (is_unix_time(self.issued_at), "issuedAt"),
            (is_unix_time(self.expires_at) and self.expires_at > self.issued_at, "expiresAt"),
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
