"""Issued authority: generations, evidence, attempt, source-index and accepted rows (SPEC §13.15;
spec credential-authority "Issued authority"; upstream-notes 9; docs/issued-authority.md).

An issuance records a credential's final permission ceiling as **evidence**, keyed by a fresh
**generation**, before the credential is handed out. Two stores per space hold the rows
(:mod:`cotal_trio.stores.issued` does the I/O):

* ``cotal_issued_<space>`` (append-only: the broker refuses message deletes and purges):
  evidence ``v1.<owner>.<actor>.<uid>.<generation>``, read as the FIRST message on its key;
  the attempt row ``attempt.v1.<owner>.<actor>.<uid>.<generation>``, read as the LAST message,
  moved by compare-and-set; source index rows
  ``bysource.v1.<sha256hex([1,space,bucket,key])>.<owner>.<actor>.<uid>.<generation>``.
* ``cotal_accepted_<space>`` (write-once per key): ``accepted.v1.<token>``.

Generation: 32 lowercase hex digits. The first 8 are the **horizon** (unix seconds, big-endian
hex: ``0x6955a4c0`` is 1767220416), the second from which the generation authorizes nothing; the
other 24 are random (12 bytes from a CSPRNG). A host refuses a generation at or after its horizon
(:func:`check_live`) before it reads any store, so nothing read afterwards (a row the broker
removed, or something written on its key since) can matter. Every row of a generation is written
with a per-message TTL of ``horizon + 60 - now`` seconds (:func:`row_ttl_s`).

Values are canonical JSON (:func:`canonical_json`: RFC 8785 for the value types used here:
objects with string keys, arrays, strings, integers, booleans, null), so the attempt's digest
and a renewal's byte comparison do not depend on who wrote the row.

Pure and synchronous: no clock (``now`` is an argument), no randomness (``random12`` is one).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from .errors import CodecError, RefusalCode, Refused
from .identity import is_actor, is_lifecycle_uid, is_space
from .wire import accepted_bucket, is_generation, is_subject, issued_bucket  # one source of these (re-exported)

__all__ = [
    "ACCEPTED_PREFIX",
    "ATTEMPT_PREFIX",
    "ATTEMPT_STATES",
    "BYSOURCE_PREFIX",
    "EVIDENCE_PREFIX",
    "INSTRUMENT_HORIZON_S",
    "ROW_GRACE_S",
    "STATIC_AGENT_HORIZON_S",
    "VERSION",
    "Accepted",
    "Attempt",
    "Ceiling",
    "Evidence",
    "IssuedRef",
    "Rule",
    "Source",
    "SourceRow",
    "accepted_bucket",
    "accepted_key",
    "attempt_key",
    "bysource_key",
    "bysource_prefix",
    "canonical_json",
    "ceiling_from_native",
    "check_live",
    "connection_accepted_token",
    "digest_of",
    "evidence_digest",
    "evidence_key",
    "horizon_of",
    "instrument_horizon",
    "is_accepted_token",
    "is_generation",
    "issued_bucket",
    "manager_caller_horizon",
    "new_generation",
    "parse_accepted",
    "parse_attempt",
    "parse_evidence",
    "parse_source_row",
    "ref_from_key",
    "render_accepted",
    "render_attempt",
    "render_evidence",
    "render_source_row",
    "row_ttl_s",
    "source_hash",
    "static_agent_horizon",
]

T = TypeVar("T")

VERSION = 1
# Rows outlive their generation's horizon by this much: the per-message TTL is
# horizon + ROW_GRACE_S - now (spec "Issued authority": "60 seconds after the horizon").
ROW_GRACE_S = 60
# Horizons (spec "Issued authority"): a control-caller instrument's five-minute expiry, a static
# agent's 30 days after spawn; a user-auth manager-caller view's is its bearer's expiry.
INSTRUMENT_HORIZON_S = 300
STATIC_AGENT_HORIZON_S = 30 * 24 * 3600
EVIDENCE_PREFIX = "v1."
ATTEMPT_PREFIX = "attempt.v1."
BYSOURCE_PREFIX = "bysource.v1."
ACCEPTED_PREFIX = "accepted.v1."
ATTEMPT_STATES = ("prepared", "active", "aborted", "revoked")
# Largest integer JSON carries exactly (I-JSON, RFC 7493 section 2.2; RFC 8785 relies on it).
_MAX_SAFE_INT = 2**53 - 1
_HORIZON_HEX = 8
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ACCEPTED_TOKEN = re.compile(r"[0-9a-f]{32}")
# A KV key: tokens of [-/_=A-Za-z0-9] joined by dots (nats-py's VALID_KEY_RE, no empty token).
_KV_KEY = re.compile(r"[-/_=A-Za-z0-9]+(?:\.[-/_=A-Za-z0-9]+)*")
_BUCKET = re.compile(r"[A-Za-z0-9_-]{1,255}")


# -- canonical JSON ------------------------------------------------------------------------------


def canonical_json(value: Any) -> bytes:
    """``value`` as RFC 8785 canonical JSON, UTF-8.

    Objects' members sorted by the UTF-16 code units of their names, no whitespace, strings with
    only the escapes JSON requires (control characters as lowercase ``\\u00xx``), integers in
    decimal. Floats are refused (none of our values has one), and so are integers outside
    +-(2**53 - 1), lone surrogates and non-string object keys.

    Rendered by the standard library's C encoder once :func:`_plain` has checked the value's
    types (its string escapes and ``sort_keys`` order are RFC 8785's for ASCII member names);
    a value with a non-ASCII member name takes the exact, slower path (:func:`_emit`), where
    code-point order and UTF-16 order can differ.

    Raises:
        CodecError: a value of another type, or one of the refused values above.
    """
    if _plain(value):
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False)
    else:
        parts: list[str] = []
        _emit(value, parts)
        text = "".join(parts)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise CodecError("canonical JSON: a string holds a lone surrogate") from None


def _ours(value: Any) -> bytes:
    """:func:`canonical_json` of a row built from one of our checked dataclasses (member names
    are our ASCII literals, integers checked in range, no floats), without the type walk: the
    callout renders one evidence per connect (issue 14 item 4).

    Raises:
        CodecError: a string holds a lone surrogate.
    """
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
    except UnicodeEncodeError:
        raise CodecError("canonical JSON: a string holds a lone surrogate") from None


def _plain(value: Any) -> bool:
    """Whether ``value`` holds only our value types with ASCII member names (True), or has a
    non-ASCII member name (False: render it with :func:`_emit`).

    Raises:
        CodecError: as :func:`canonical_json`.
    """
    plain = True
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None or isinstance(item, bool | str):
            continue
        if isinstance(item, int):
            if abs(item) > _MAX_SAFE_INT:
                raise CodecError(f"canonical JSON: integer {item} is outside +-(2**53 - 1)")
        elif isinstance(item, Mapping):
            plain = plain and isinstance(item, dict)  # the C encoder takes dicts only
            for key in item:
                if not isinstance(key, str):
                    raise CodecError("canonical JSON: object keys must be strings")
                plain = plain and key.isascii()
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        else:
            raise CodecError(f"canonical JSON: {type(item).__name__} is not one of our value types")
    return plain


def _emit(value: Any, out: list[str]) -> None:
    if value is None or isinstance(value, bool):
        out.append({None: "null", True: "true", False: "false"}[value])
    elif isinstance(value, int):
        if abs(value) > _MAX_SAFE_INT:
            raise CodecError(f"canonical JSON: integer {value} is outside +-(2**53 - 1)")
        out.append(str(value))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise CodecError("canonical JSON: object keys must be strings")
        out.append("{")
        for index, key in enumerate(sorted(value, key=lambda k: k.encode("utf-16-be", "surrogatepass"))):
            out.append("," if index else "")
            out.append(json.dumps(key, ensure_ascii=False) + ":")
            _emit(value[key], out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for index, item in enumerate(value):
            out.append("," if index else "")
            _emit(item, out)
        out.append("]")
    else:
        raise CodecError(f"canonical JSON: {type(value).__name__} is not one of our value types")


def _load(data: bytes, what: str) -> dict[str, Any]:
    """The JSON object in ``data``, which must be exactly its canonical form."""
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CodecError(f"{what}: it is not UTF-8 JSON") from None
    if not isinstance(obj, dict):
        raise CodecError(f"{what}: it is not a JSON object")
    try:
        canonical = canonical_json(obj)
    except CodecError as exc:
        raise CodecError(f"{what}: {exc}") from None
    if canonical != data:
        raise CodecError(f"{what}: it is not in canonical form (RFC 8785)")
    return obj


def _as_written(value: T, rendered: bytes, data: bytes, what: str) -> T:
    """``value`` once ``data`` is exactly what rendering it gives (sorted sets, no extra members)."""
    if rendered != data:
        raise CodecError(f"{what}: it is not in the form version {VERSION} writes (sorted, canonical, no empty patterns)")
    return value


def _keys(obj: Mapping[str, Any], what: str, required: Sequence[str], optional: Sequence[str] = ()) -> None:
    if not (set(required) <= set(obj) <= set(required) | set(optional)):
        shown = ", ".join(required) + "".join(f", [{k}]" for k in optional)
        raise CodecError(f"{what}: keys must be exactly {shown}")


def _version(obj: Mapping[str, Any], what: str) -> None:
    if not (type(obj["version"]) is int and obj["version"] == VERSION):
        raise CodecError(f"{what}: version {obj['version']!r} is not understood")


def _require(ok: bool, what: str, problem: str) -> None:
    if not ok:
        raise CodecError(f"{what}: {problem}")


# -- generations and horizons -------------------------------------------------------------------


def new_generation(horizon: int, random12: bytes) -> str:
    """A fresh generation: ``horizon`` as 8 hex digits (big-endian) then ``random12`` in hex.

    Args:
        horizon: unix seconds, 1 to 2**32 - 1 (the year 2106).
        random12: exactly 12 bytes from a CSPRNG; a generation is never reused.

    Raises:
        ValueError: ``horizon`` out of range, or ``random12`` not 12 bytes.
    """
    if type(horizon) is not int or not 0 < horizon < 2 ** (4 * _HORIZON_HEX):
        raise ValueError(f"horizon must be whole unix seconds in 1..2**32-1, got {horizon!r}")
    if not isinstance(random12, bytes) or len(random12) != 12:
        raise ValueError("random12 must be exactly 12 bytes")
    return f"{horizon:08x}{random12.hex()}"


def horizon_of(generation: str) -> int:
    """The horizon a generation carries: its first 8 hex digits as unix seconds.

    Raises:
        CodecError: ``generation`` is not 32 lowercase hex digits.
    """
    if not is_generation(generation):
        raise CodecError("a generation is 32 lowercase hex digits")
    return int(generation[:_HORIZON_HEX], 16)


def check_live(generation: str, *, now: float) -> int:
    """Refuse ``generation`` at or after its horizon; return the horizon otherwise.

    Call it before any store read (spec "Issued authority": every host refuses such a
    generation before it reads the store).

    Args:
        now: wall time, unix seconds.

    Raises:
        Refused: NOT_GRANTED, the generation reached its horizon (or is malformed).
    """
    try:
        horizon = horizon_of(generation)
    except CodecError:
        raise Refused(RefusalCode.NOT_GRANTED, "the issued generation is malformed - it authorizes nothing") from None
    if now >= horizon:
        raise Refused(
            RefusalCode.NOT_GRANTED,
            f"issued generation {generation} reached its horizon (unix {horizon}) and authorizes nothing"
            " - connect with a freshly issued credential (respawn a static agent)",
        )
    return horizon


def row_ttl_s(generation: str, *, now: float, grace_s: int = ROW_GRACE_S) -> int:
    """The per-message TTL of a row of ``generation`` written at ``now``: whole seconds until
    ``horizon + grace_s``, at least 1.

    Raises:
        CodecError: ``generation`` is malformed.
    """
    return max(1, math.ceil(horizon_of(generation) + grace_s - now))


def manager_caller_horizon(bearer_exp: int) -> int:
    """A user-auth ``manager-caller`` view's horizon: its bearer's expiry (unix seconds)."""
    return bearer_exp


def instrument_horizon(now: float) -> int:
    """A control-caller instrument's horizon: its five-minute expiry from ``now``."""
    return math.floor(now) + INSTRUMENT_HORIZON_S


def static_agent_horizon(spawned_at: int) -> int:
    """A static agent's horizon: 30 days after its spawn (renewals stop there)."""
    return spawned_at + STATIC_AGENT_HORIZON_S


# -- keys ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class IssuedRef:
    """What an issuance is about: ``{space, owner, actor, uid, generation}``.

    Attributes:
        space: the space.
        owner, actor: the principal (an owner is any actor-grammar token: ``u_...`` or static).
        uid: the credential's lifecycle UID.
        generation: 32 lowercase hex digits, the first 8 the horizon.

    Raises:
        CodecError: a field breaks its grammar.
    """

    space: str
    owner: str
    actor: str
    uid: str
    generation: str

    def __post_init__(self) -> None:
        what = "issued reference"
        _require(is_space(self.space), what, "space is not a space name")
        _require(is_actor(self.owner), what, "owner is not an owner token")
        _require(is_actor(self.actor), what, "actor is not an actor name")
        _require(is_lifecycle_uid(self.uid), what, "uid is not a lifecycle UID")
        _require(is_generation(self.generation), what, "generation is not 32 lowercase hex digits")

    @property
    def horizon(self) -> int:
        """The generation's horizon, unix seconds."""
        return horizon_of(self.generation)

    def to_json(self) -> dict[str, str]:
        return {"space": self.space, "owner": self.owner, "actor": self.actor, "uid": self.uid, "generation": self.generation}

    @classmethod
    def from_json(cls, obj: object, what: str) -> IssuedRef:
        _require(isinstance(obj, dict), what, "ref is not an object")
        assert isinstance(obj, dict)
        _keys(obj, what + " ref", ("space", "owner", "actor", "uid", "generation"))
        return cls(**obj)

    @property
    def _tail(self) -> str:
        return f"{self.owner}.{self.actor}.{self.uid}.{self.generation}"


def evidence_key(ref: IssuedRef) -> str:
    """``v1.<owner>.<actor>.<uid>.<generation>`` in ``cotal_issued_<space>``."""
    return EVIDENCE_PREFIX + ref._tail


def attempt_key(ref: IssuedRef) -> str:
    """``attempt.v1.<owner>.<actor>.<uid>.<generation>`` in ``cotal_issued_<space>``."""
    return ATTEMPT_PREFIX + ref._tail


def ref_from_key(space: str, key: str) -> IssuedRef:
    """The reference an evidence, attempt or source index key names.

    Raises:
        CodecError: ``key`` is none of the three shapes.
    """
    for prefix, extra in ((EVIDENCE_PREFIX, 0), (ATTEMPT_PREFIX, 0), (BYSOURCE_PREFIX, 1)):
        if key.startswith(prefix):
            tokens = key[len(prefix):].split(".")
            if len(tokens) == 4 + extra:
                owner, actor, uid, generation = tokens[extra:]
                return IssuedRef(space=space, owner=owner, actor=actor, uid=uid, generation=generation)
    raise CodecError(f"issued key {key!r} is not an evidence, attempt or source index key")


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    """A row an issuance depends on: ``{space, bucket, key}`` (a credential ledger family)."""

    space: str
    bucket: str
    key: str

    def __post_init__(self) -> None:
        what = "issued source"
        _require(is_space(self.space), what, "space is not a space name")
        _require(isinstance(self.bucket, str) and _BUCKET.fullmatch(self.bucket) is not None, what, "bucket is malformed")
        _require(isinstance(self.key, str) and _KV_KEY.fullmatch(self.key) is not None, what, "key is not a KV key")

    def to_json(self) -> dict[str, str]:
        return {"space": self.space, "bucket": self.bucket, "key": self.key}

    @classmethod
    def from_json(cls, obj: object, what: str) -> Source:
        _require(isinstance(obj, dict), what, "a source is not an object")
        assert isinstance(obj, dict)
        _keys(obj, what + " source", ("space", "bucket", "key"))
        return cls(**obj)


def source_hash(source: Source) -> str:
    """``sha256hex([1, space, bucket, key])`` over canonical JSON: the source index's token."""
    return hashlib.sha256(canonical_json([1, source.space, source.bucket, source.key])).hexdigest()


def bysource_prefix(source: Source) -> str:
    """``bysource.v1.<source hash>.``: the key prefix of one source's index rows."""
    return f"{BYSOURCE_PREFIX}{source_hash(source)}."


def bysource_key(source: Source, ref: IssuedRef) -> str:
    """``bysource.v1.<source hash>.<owner>.<actor>.<uid>.<generation>``."""
    return bysource_prefix(source) + ref._tail


def is_accepted_token(value: object) -> bool:
    """True when ``value`` is an accepted token: 32 lowercase hex digits."""
    return isinstance(value, str) and _ACCEPTED_TOKEN.fullmatch(value) is not None


def accepted_key(token: str) -> str:
    """``accepted.v1.<token>`` in ``cotal_accepted_<space>``.

    Raises:
        CodecError: ``token`` is not 32 lowercase hex digits.
    """
    _require(is_accepted_token(token), "accepted row", "the token is not 32 lowercase hex digits")
    return ACCEPTED_PREFIX + token


def connection_accepted_token(connection_id: str) -> str:
    """The older per-connection token: ``sha256("cotal.accepted.v1\\0" + connId)``, first 32 hex."""
    return hashlib.sha256(b"cotal.accepted.v1\0" + connection_id.encode()).hexdigest()[:32]


# -- the permission ceiling ----------------------------------------------------------------------

Mode = Literal["all", "none", "patterns"]


def _subjects(value: object, what: str) -> tuple[str, ...]:
    ok = isinstance(value, list | tuple) and all(is_subject(s) for s in value)
    _require(ok, what, "subjects must be NATS subjects (no empty tokens, > only last)")
    return tuple(sorted(set(value)))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One direction of a ceiling: ``allow`` (everything, nothing, or the patterns) minus ``deny``.

    Patterns and deny are sets, kept sorted (by code point) without duplicates, so equal grants
    have byte-identical ceilings whatever order a builder listed them in.

    Raises:
        CodecError: ``mode`` is unknown, patterns are empty for ``patterns`` (or given for another
            mode), or a subject is malformed.
    """

    mode: Mode
    patterns: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        what = "permission ceiling"
        _require(self.mode in ("all", "none", "patterns"), what, "allow mode must be all, none or patterns")
        _require((self.mode == "patterns") == bool(self.patterns), what, "patterns go with mode patterns, non-empty")
        object.__setattr__(self, "patterns", _subjects(self.patterns, what))
        object.__setattr__(self, "deny", _subjects(self.deny, what))

    @classmethod
    def of_valid(cls, patterns: tuple[str, ...], deny: tuple[str, ...]) -> Rule:
        """A rule from patterns and deny subjects the caller has already checked with
        :func:`~cotal_trio.core.wire.is_subject` and put in sorted order without duplicates
        (``patterns`` empty: mode ``all``), built without checking them again (the callout
        builds one per connect: issue 14 item 4)."""
        rule = object.__new__(cls)
        object.__setattr__(rule, "mode", "patterns" if patterns else "all")
        object.__setattr__(rule, "patterns", patterns)
        object.__setattr__(rule, "deny", deny)
        return rule

    def to_json(self) -> dict[str, Any]:
        allow: dict[str, Any] = {"mode": self.mode}
        if self.mode == "patterns":
            allow["patterns"] = list(self.patterns)
        return {"allow": allow, "deny": list(self.deny)}

    @classmethod
    def from_json(cls, obj: object, what: str) -> Rule:
        _require(isinstance(obj, dict), what, "a direction is not an object")
        assert isinstance(obj, dict)
        _keys(obj, what, ("allow", "deny"))
        allow = obj["allow"]
        _require(isinstance(allow, dict) and "mode" in allow, what, "allow must be an object with a mode")
        _keys(allow, what + " allow", ("mode",), ("patterns",))
        return cls(mode=allow["mode"], patterns=_subjects(allow.get("patterns", []), what), deny=_subjects(obj["deny"], what))


@dataclass(frozen=True, slots=True, kw_only=True)
class Ceiling:
    """A credential's final permission ceiling: ``{publish, subscribe}``."""

    publish: Rule
    subscribe: Rule

    def to_json(self) -> dict[str, Any]:
        return {"publish": self.publish.to_json(), "subscribe": self.subscribe.to_json()}

    def canonical(self) -> bytes:
        """The ceiling's canonical bytes: a renewal keeps its generation only when these match."""
        return canonical_json(self.to_json())

    @classmethod
    def from_json(cls, obj: object, what: str) -> Ceiling:
        _require(isinstance(obj, dict), what, "permissions is not an object")
        assert isinstance(obj, dict)
        _keys(obj, what + " permissions", ("publish", "subscribe"))
        return cls(publish=Rule.from_json(obj["publish"], what), subscribe=Rule.from_json(obj["subscribe"], what))


def ceiling_from_native(fragment: Mapping[str, Any]) -> Ceiling:
    """The ceiling of a NATS user JWT fragment ``{"pub": {"allow", "deny"}, "sub": {...}}``.

    As upstream's import: an empty or omitted allow list is ``all`` (NATS reads it as no allow
    restriction); deny lists are kept. Other members of the fragment (``resp``, limits) are not
    part of the ceiling.

    Raises:
        CodecError: a direction or list is not the NATS shape, or a subject is malformed.
    """

    def rule(name: str) -> Rule:
        block = fragment.get(name) or {}
        _require(isinstance(block, Mapping), "permission ceiling", f"{name} is not an object")
        allow, deny = block.get("allow") or [], block.get("deny") or []
        return Rule.of_valid(_subjects(allow, "permission ceiling"), _subjects(deny, "permission ceiling"))

    return Ceiling(publish=rule("pub"), subscribe=rule("sub"))


# -- rows ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """``{version: 1, ref, sources, permissions, expiresAt?}``: what the issuer accepted.

    Attributes:
        ref: the issuance.
        sources: rows it depends on (may be empty, then ``expires_at`` is required).
        permissions: the credential's final ceiling.
        expires_at: unix seconds, or None.

    Raises:
        CodecError: no sources and no ``expires_at``, a repeated source, or a bad field.
    """

    ref: IssuedRef
    sources: tuple[Source, ...]
    permissions: Ceiling
    expires_at: int | None = None

    def __post_init__(self) -> None:
        what = "evidence"
        _require(isinstance(self.sources, tuple) and all(isinstance(s, Source) for s in self.sources), what, "sources must be a tuple of Source")
        _require(self.expires_at is None or (type(self.expires_at) is int and 0 < self.expires_at <= _MAX_SAFE_INT), what, "expiresAt must be whole unix seconds")
        _require(bool(self.sources) or self.expires_at is not None, what, "expiresAt is required when there are no sources")
        _require(len(set(self.sources)) == len(self.sources), what, "sources repeat")

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "version": VERSION, "ref": self.ref.to_json(), "sources": [s.to_json() for s in self.sources],
            "permissions": self.permissions.to_json(),
        }
        if self.expires_at is not None:
            obj["expiresAt"] = self.expires_at
        return obj


def render_evidence(evidence: Evidence) -> bytes:
    """The evidence's stored bytes (canonical JSON)."""
    return _ours(evidence.to_json())


def evidence_digest(evidence: Evidence) -> str:
    """``sha256:<hex of the canonical evidence>``: what the attempt row names."""
    return digest_of(render_evidence(evidence))


def digest_of(rendered: bytes) -> str:
    """``sha256:<hex>`` of evidence already rendered (:func:`render_evidence`, or the stored
    bytes :func:`parse_evidence` accepted, which are the same): render once, digest that."""
    return "sha256:" + hashlib.sha256(rendered).hexdigest()


def parse_evidence(data: bytes) -> Evidence:
    """Decode stored evidence; it must be canonical JSON with exactly the version-1 members.

    Raises:
        CodecError: anything else, named.
    """
    what = "evidence"
    obj = _load(data, what)
    _keys(obj, what, ("version", "ref", "sources", "permissions"), ("expiresAt",))
    _version(obj, what)
    _require(isinstance(obj["sources"], list), what, "sources is not an array")
    evidence = Evidence(
        ref=IssuedRef.from_json(obj["ref"], what),
        sources=tuple(Source.from_json(s, what) for s in obj["sources"]),
        permissions=Ceiling.from_json(obj["permissions"], what),
        expires_at=obj.get("expiresAt"),
    )
    return _as_written(evidence, render_evidence(evidence), data, what)


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """``{version: 1, state, digest}``: an issuance's state (prepared, active, aborted, revoked)."""

    state: Literal["prepared", "active", "aborted", "revoked"]
    digest: str

    def __post_init__(self) -> None:
        _require(self.state in ATTEMPT_STATES, "attempt row", "state must be prepared, active, aborted or revoked")
        ok = isinstance(self.digest, str) and self.digest.startswith("sha256:") and _HEX64.fullmatch(self.digest[7:]) is not None
        _require(ok, "attempt row", "digest must be sha256:<64 lowercase hex>")


def render_attempt(attempt: Attempt) -> bytes:
    """The attempt row's stored bytes (canonical JSON)."""
    return _ours({"version": VERSION, "state": attempt.state, "digest": attempt.digest})


def parse_attempt(data: bytes) -> Attempt:
    """Decode a stored attempt row.

    Raises:
        CodecError: not canonical JSON with exactly ``version``, ``state``, ``digest``.
    """
    obj = _load(data, "attempt row")
    _keys(obj, "attempt row", ("version", "state", "digest"))
    _version(obj, "attempt row")
    attempt = Attempt(state=obj["state"], digest=obj["digest"])
    return _as_written(attempt, render_attempt(attempt), data, "attempt row")


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceRow:
    """``{source, ref}``: one source index row."""

    source: Source
    ref: IssuedRef


def render_source_row(row: SourceRow) -> bytes:
    """The source index row's stored bytes (canonical JSON)."""
    return canonical_json({"source": row.source.to_json(), "ref": row.ref.to_json()})


def parse_source_row(data: bytes) -> SourceRow:
    """Decode a stored source index row.

    Raises:
        CodecError: not canonical JSON with exactly ``source`` and ``ref``.
    """
    obj = _load(data, "source index row")
    _keys(obj, "source index row", ("source", "ref"))
    row = SourceRow(source=Source.from_json(obj["source"], "source index row"), ref=IssuedRef.from_json(obj["ref"], "source index row"))
    return _as_written(row, render_source_row(row), data, "source index row")


@dataclass(frozen=True, slots=True, kw_only=True)
class Accepted:
    """``{version: 1, ref}``: the row a connected client reads to learn its generation."""

    ref: IssuedRef


def render_accepted(row: Accepted) -> bytes:
    """The accepted row's stored bytes (canonical JSON)."""
    return _ours({"version": VERSION, "ref": row.ref.to_json()})


def parse_accepted(data: bytes) -> Accepted:
    """Decode a stored accepted row.

    Raises:
        CodecError: not canonical JSON with exactly ``version`` and ``ref``.
    """
    obj = _load(data, "accepted row")
    _keys(obj, "accepted row", ("version", "ref"))
    _version(obj, "accepted row")
    row = Accepted(ref=IssuedRef.from_json(obj["ref"], "accepted row"))
    return _as_written(row, render_accepted(row), data, "accepted row")
