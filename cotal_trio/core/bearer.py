"""Cotal bearers: issuer keys, issuance and validation (upstream-notes 3.1-3.3; DESIGN 6 step 3, 7).

A bearer is a compact JWS (RFC 7515) signed with Ed25519 by the space's issuer key:

* header ``{"alg": "EdDSA", "kid": <RFC 7638 thumbprint>, "typ": "JWT"}``;
* claims ``{scope, ver: 1, act: {owner, actor, scope?, parent?, lifecycleUid, view?,
  credentialId?}, sub: owner, iss: "urn:cotal:auth:<space>", aud: <space>, iat, nbf, exp}``.

Validation is split so connect limits can charge an actor whose signature verified even when
the bearer is expired: :func:`verify_bearer_signature` (the key and header rules, then the
signature) and :func:`check_bearer_claims` (issuer, audience, times and claim shapes).
:func:`validate_bearer` runs both.

The JWS is parsed here by hand and verified with libsodium (PyNaCl), because this runs on
every connect: measured at about 90 us for the whole :func:`validate_bearer` (libsodium's verify
is about 60 us of it), where joserfc's ``jwt.decode`` alone took about 170 us. The same primitive
(:func:`verify_ed25519_jws`) verifies IdP tokens (``core/idp.py``).

Pure and synchronous: time comes in as ``now`` (unix seconds), seeds come in as bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from cotal_trio.core.errors import CodecError, ConfigError, RefusalCode, Refused
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

__all__ = [
    "BEARER_VER",
    "CLOCK_SKEW_S",
    "EDDSA_ALGS",
    "EMBEDDED_KEY_HEADERS",
    "KNOWN_VIEWS",
    "MAX_TOKEN_CHARS",
    "MAX_TOKEN_TTL_S",
    "BearerGrant",
    "BearerKeySet",
    "IssuerKey",
    "JwsWording",
    "ValidatedBearer",
    "b64url_encode",
    "check_bearer_claims",
    "is_credential_id",
    "issue_bearer",
    "okp_thumbprint",
    "parse_ed25519_jwks",
    "space_issuer",
    "validate_bearer",
    "verify_bearer_signature",
    "verify_ed25519_jws",
    "verify_key_from_jwk",
]

# Longest bearer lifetime the issuer signs and the validator accepts (upstream MAX_TOKEN_TTL_SEC).
MAX_TOKEN_TTL_S = 900
# Tolerance for clock differences between the issuing and the validating host (DESIGN 6 step 3).
CLOCK_SKEW_S = 5
# The claims version this code writes and accepts (upstream USER_TOKEN_VER).
BEARER_VER = 1
# "EdDSA" is the RFC 8037 name; "Ed25519" is the fully specified RFC 9864 name.
EDDSA_ALGS = frozenset({"EdDSA", "Ed25519"})
# Headers that would let a token choose its own verification key (spec "Bridge contract" 1).
EMBEDDED_KEY_HEADERS = ("jku", "jwk", "x5u", "x5c")
# A compact JWS longer than this is refused before any decoding (a bearer is under 1 KiB).
MAX_TOKEN_CHARS = 16384
# Views a bearer may name (upstream-notes 3.4); this service does not mint any of them yet.
KNOWN_VIEWS = frozenset(
    {
        "admin",
        "purger",
        "channel-purger",
        "channel-writer",
        "deployer",
        "manager-service",
        "manager-caller",
        "session-caller",
        "transfer-writer",
    }
)

_SEED_BYTES = 32
_SIGNATURE_BYTES = 64
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_CREDENTIAL_ID = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_MAX_CREDENTIAL_ID_CHARS = 256
_ACT_KEYS = frozenset({"owner", "actor", "scope", "parent", "lifecycleUid", "view", "credentialId"})


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


# --- base64url and JSON helpers -------------------------------------------------------------


def b64url_encode(data: bytes) -> str:
    """Unpadded base64url (RFC 7515 section 2) of ``data``."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64url_decode(segment: str) -> bytes | None:
    """Strict unpadded base64url decode; ``None`` for any non-canonical or invalid text."""
    if _B64URL.fullmatch(segment) is None or len(segment) % 4 == 1:
        return None
    try:
        data = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (binascii.Error, ValueError):
        return None
    # Refuse non-zero padding bits, so one token has exactly one spelling.
    return data if b64url_encode(data) == segment else None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate key")
    return result


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _json_object(raw: bytes) -> dict[str, Any] | None:
    """Parse UTF-8 JSON that must be an object without duplicate keys; ``None`` otherwise."""
    try:
        value = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_no_duplicate_keys,
            parse_constant=_reject_constant,
        )
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _shown(value: object) -> str:
    """A caller-supplied value for a refusal sentence: a string JSON-quoted, at most 64 chars."""
    return json.dumps(value[:64]) if isinstance(value, str) else repr(value)[:64]


# --- keys -----------------------------------------------------------------------------------


def okp_thumbprint(x: str) -> str:
    """RFC 7638 thumbprint of the Ed25519 OKP public JWK with base64url ``x``.

    SHA-256 over the canonical members ``{"crv":"Ed25519","kty":"OKP","x":...}``, base64url.
    """
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"))
    return b64url_encode(hashlib.sha256(canonical.encode("ascii")).digest())


def _jwk_bytes(jwk: Mapping[str, Any], member: str) -> bytes:
    raw = jwk.get(member)
    data = _b64url_decode(raw) if isinstance(raw, str) else None
    if data is None or len(data) != _SEED_BYTES:
        raise CodecError(f"JWK member {member} must be 32 bytes of unpadded base64url")
    return data


def verify_key_from_jwk(jwk: object) -> VerifyKey:
    """The Ed25519 verify key of a public OKP JWK (RFC 8037).

    Args:
        jwk: a dict with ``kty == "OKP"``, ``crv == "Ed25519"`` and a 32-byte base64url ``x``;
            ``alg`` when present must be ``EdDSA``/``Ed25519`` and ``use`` when present ``sig``.

    Raises:
        CodecError: any other shape, or a ``d`` member (private key material in a public set).
    """
    if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
        raise CodecError("only Ed25519 keys (kty OKP, crv Ed25519) are accepted - use an EdDSA key set")
    if "d" in jwk:
        raise CodecError("a public key set carries private key material (d) - publish public keys only")
    if jwk.get("alg", "EdDSA") not in EDDSA_ALGS or jwk.get("use", "sig") != "sig":
        raise CodecError("an Ed25519 JWK must have alg EdDSA (or Ed25519) and use sig when it states them")
    return VerifyKey(_jwk_bytes(jwk, "x"))


def parse_ed25519_jwks(doc: object) -> dict[str, VerifyKey]:
    """Parse a JWKS document ``{"keys": [...]}`` holding only Ed25519 keys, each with a ``kid``.

    Returns:
        ``{kid: VerifyKey}``.

    Raises:
        CodecError: not an object with a non-empty ``keys`` list, a key that is not a public
            Ed25519 OKP JWK (see :func:`verify_key_from_jwk`), a missing or empty ``kid``, or
            two keys with the same ``kid``.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list) or not doc["keys"]:
        raise CodecError('a JWKS must be a JSON object {"keys": [...]} with at least one key')
    keys: dict[str, VerifyKey] = {}
    for jwk in doc["keys"]:
        kid = jwk.get("kid") if isinstance(jwk, dict) else None
        if not isinstance(kid, str) or not kid:
            raise CodecError("every key in a JWKS needs a non-empty string kid")
        if kid in keys:
            raise CodecError(f"the JWKS lists kid {_shown(kid)} twice - publish each key once")
        keys[kid] = verify_key_from_jwk(jwk)
    return keys


@dataclass(frozen=True, slots=True, kw_only=True)
class IssuerKey:
    """A space's Ed25519 bearer-signing key (upstream-notes 3.1).

    Attributes:
        seed: the 32-byte Ed25519 seed (secret; never shown in ``repr``).
        x: the base64url public key (derived).
        kid: the RFC 7638 thumbprint of the public OKP JWK (derived).

    Raises:
        CodecError: the seed is not exactly 32 bytes.
    """

    seed: bytes = field(repr=False)
    x: str = field(init=False)
    kid: str = field(init=False)
    _signing_key: SigningKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.seed, bytes) or len(self.seed) != _SEED_BYTES:
            raise CodecError("an Ed25519 issuer seed must be exactly 32 bytes")
        signing_key = SigningKey(self.seed)
        x = b64url_encode(bytes(signing_key.verify_key))
        object.__setattr__(self, "_signing_key", signing_key)
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "kid", okp_thumbprint(x))

    @classmethod
    def generate(cls, seed32: bytes) -> IssuerKey:
        """A key from 32 fresh random bytes supplied by the caller (the shell owns randomness)."""
        return cls(seed=seed32)

    @classmethod
    def from_private_jwk(cls, jwk: object) -> IssuerKey:
        """Load a private OKP JWK ``{kty, crv, x, d}`` (as stored in ``issuer.json``).

        Raises:
            CodecError: not an Ed25519 OKP JWK, ``d`` or ``x`` not 32 base64url bytes, ``x``
                not the public key of ``d``, or a ``kid`` that is not the thumbprint.
        """
        if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            raise CodecError("the issuer key must be an Ed25519 OKP JWK - regenerate the space's issuer key")
        key = cls(seed=_jwk_bytes(jwk, "d"))
        if jwk.get("x") != key.x or jwk.get("kid", key.kid) != key.kid:
            raise CodecError("the issuer JWK's x or kid does not match its d - the key file is corrupt")
        return key

    @property
    def verify_key(self) -> VerifyKey:
        """The public half, for a :class:`BearerKeySet`."""
        return self._signing_key.verify_key

    def public_jwk(self) -> dict[str, str]:
        """The published JWK ``{kty, crv, x, kid, alg: "EdDSA", use: "sig"}`` (a fresh dict)."""
        return {"kty": "OKP", "crv": "Ed25519", "x": self.x, "kid": self.kid, "alg": "EdDSA", "use": "sig"}

    def private_jwk(self) -> dict[str, str]:
        """:meth:`public_jwk` plus the private member ``d`` (for the 0600 issuer file only)."""
        return {**self.public_jwk(), "d": b64url_encode(self.seed)}

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message`` (deterministic)."""
        return self._signing_key.sign(message).signature


class BearerKeySet(Mapping[str, VerifyKey]):
    """An immutable ``{kid: VerifyKey}`` map: the keys bearers are verified against.

    Building a ``VerifyKey`` is done once here, not per connect.
    """

    __slots__ = ("_by_kid",)

    def __init__(self, by_kid: Mapping[str, VerifyKey]) -> None:
        self._by_kid = dict(by_kid)

    @classmethod
    def from_keys(cls, keys: Iterable[IssuerKey]) -> BearerKeySet:
        """The set of the public halves of ``keys``, keyed by their thumbprint ``kid``."""
        return cls({key.kid: key.verify_key for key in keys})

    @classmethod
    def from_jwks(cls, doc: object) -> BearerKeySet:
        """Parse a JWKS document; raises :class:`CodecError` as :func:`parse_ed25519_jwks`."""
        return cls(parse_ed25519_jwks(doc))

    def __getitem__(self, kid: str) -> VerifyKey:
        return self._by_kid[kid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_kid)

    def __len__(self) -> int:
        return len(self._by_kid)

    def __contains__(self, kid: object) -> bool:
        return kid in self._by_kid

    def get(self, kid: str, default: Any = None) -> Any:  # noqa: D102 - Mapping.get, fast path
        return self._by_kid.get(kid, default)


# --- compact JWS verification (shared with core/idp.py) -------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JwsWording:
    """How refusals of one kind of token read.

    Attributes:
        what: the token's name in sentences (``"bearer"``, ``"IdP token"``).
        fix: the remedy appended to every sentence (``"exchange a fresh bearer"``).
        unknown_key: the whole sentence for a ``kid`` not in the key set.
    """

    what: str
    fix: str
    unknown_key: str


def _refuse(wording: JwsWording, problem: str) -> Refused:
    return Refused(RefusalCode.BAD_CREDENTIAL, f"{wording.what} {problem} - {wording.fix}")


def _split_compact(token: object, wording: JwsWording) -> tuple[str, str, str]:
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
        raise _refuse(wording, "is missing, empty or too long")
    parts = token.split(".")
    if len(parts) != 3:
        raise _refuse(wording, "is not a compact JWS (three dot-separated parts)")
    return parts[0], parts[1], parts[2]


def _check_header(header: dict[str, Any], keys: Mapping[str, VerifyKey], wording: JwsWording) -> VerifyKey:
    embedded = [name for name in EMBEDDED_KEY_HEADERS if name in header]
    if embedded:
        raise _refuse(wording, f"header carries key material ({', '.join(embedded)}); keys come only from the pinned key set")
    if "crit" in header:
        raise _refuse(wording, "header marks critical extensions (crit), which are not supported")
    if header.get("alg") not in EDDSA_ALGS:
        raise _refuse(wording, f"alg {_shown(header.get('alg'))} is not accepted (EdDSA only)")
    kid = header.get("kid")
    verify_key = keys.get(kid) if isinstance(kid, str) else None
    if verify_key is None:
        raise Refused(RefusalCode.BAD_CREDENTIAL, wording.unknown_key.format(kid=_shown(kid)))
    return verify_key


def verify_ed25519_jws(token: object, keys: Mapping[str, VerifyKey], *, wording: JwsWording) -> dict[str, Any]:
    """Verify a compact Ed25519 JWS against pinned keys and return its JSON-object payload.

    Rules (spec "Bridge contract" step 1; upstream-notes 3.3): three strict base64url parts;
    the header a JSON object without duplicate keys; no ``jku``/``jwk``/``x5u``/``x5c`` (checked
    before the signature, so a good signature does not excuse them); no ``crit``; ``alg``
    ``EdDSA`` or ``Ed25519``; ``kid`` a key of ``keys``; a 64-byte signature that verifies over
    ``<header>.<payload>``; the payload a JSON object without duplicate keys.

    Args:
        token: the compact JWS as received (any type; non-strings are refused).
        keys: ``{kid: VerifyKey}``, e.g. a :class:`BearerKeySet`.
        wording: how the refusal sentences name the token and its fix.

    Returns:
        The payload object (claims not yet checked).

    Raises:
        Refused: BAD_CREDENTIAL, with a sentence from ``wording``, on any rule above.
    """
    header_b64, payload_b64, signature_b64 = _split_compact(token, wording)
    header_raw = _b64url_decode(header_b64)
    header = _json_object(header_raw) if header_raw is not None else None
    if header is None:
        raise _refuse(wording, "header is not a base64url JSON object")
    verify_key = _check_header(header, keys, wording)
    signature = _b64url_decode(signature_b64)
    try:
        if signature is None or len(signature) != _SIGNATURE_BYTES:
            raise BadSignatureError
        verify_key.verify(f"{header_b64}.{payload_b64}".encode("ascii"), signature)
    except BadSignatureError:
        raise _refuse(wording, "signature does not verify") from None
    payload_raw = _b64url_decode(payload_b64)
    claims = _json_object(payload_raw) if payload_raw is not None else None
    if claims is None:
        raise _refuse(wording, "payload is not a base64url JSON object")
    return claims


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
        view: one of :data:`KNOWN_VIEWS`, or ``None`` (views are not minted yet).
        credential_id: the root credential id, or ``None``.

    Raises:
        Refused: BAD_REQUEST when a field breaks its grammar (see ``core/identity.py``).
    """

    owner: str
    actor: str
    scope: tuple[str, ...]
    lifecycle_uid: str
    parent: str | None = None
    view: str | None = None
    credential_id: str | None = None

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
    if value.view is not None and value.view not in KNOWN_VIEWS:
        raise Refused(RefusalCode.BAD_REQUEST, f"view {_shown(value.view)} is not a known view")
    if value.credential_id is not None and not is_credential_id(value.credential_id):
        raise Refused(RefusalCode.BAD_REQUEST, "a credential id is dot-separated [A-Za-z0-9_-] segments, at most 256 chars")


def _act_claim(grant: BearerGrant) -> dict[str, Any]:
    act: dict[str, Any] = {"owner": grant.owner, "actor": grant.actor}
    if grant.scope:
        act["scope"] = list(grant.scope)
    if grant.parent is not None:
        act["parent"] = grant.parent
    act["lifecycleUid"] = grant.lifecycle_uid
    if grant.view is not None:
        act["view"] = grant.view
    if grant.credential_id is not None:
        act["credentialId"] = grant.credential_id
    return act


def _json_b64(value: dict[str, Any]) -> str:
    return b64url_encode(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def issue_bearer(grant: BearerGrant, *, key: IssuerKey, space: str, now: int, ttl_s: int) -> tuple[str, int]:
    """Sign a bearer for ``grant`` (upstream-notes 3.2).

    Args:
        grant: the claims source (already authorized against the ledger).
        key: the space's active issuer key; its ``kid`` goes in the header.
        space: the space name (``aud``; ``iss`` is :func:`space_issuer`).
        now: unix seconds, integer; becomes ``iat`` and ``nbf``.
        ttl_s: lifetime in seconds, 1 to :data:`MAX_TOKEN_TTL_S`.

    Returns:
        ``(token, exp)`` with ``exp = now + ttl_s`` (unix seconds).

    Raises:
        ConfigError: ``ttl_s`` or ``now`` is not a positive integer, or ``ttl_s`` exceeds 900
            (a caller bug: callers cap the lifetime first).
        Refused: BAD_REQUEST when ``space`` breaks the space grammar.
    """
    if type(ttl_s) is not int or not 0 < ttl_s <= MAX_TOKEN_TTL_S:
        raise ConfigError(f"a bearer lifetime must be 1 to {MAX_TOKEN_TTL_S} seconds, got {ttl_s!r}")
    if type(now) is not int or now <= 0:
        raise ConfigError(f"issue_bearer needs now as positive integer unix seconds, got {now!r}")
    check_space(space)
    exp = now + ttl_s
    claims = {
        "scope": list(grant.scope), "ver": BEARER_VER, "act": _act_claim(grant), "sub": grant.owner,
        "iss": space_issuer(space), "aud": space, "iat": now, "nbf": now, "exp": exp,
    }  # fmt: skip
    signing_input = f"{_json_b64({'alg': 'EdDSA', 'kid': key.kid, 'typ': 'JWT'})}.{_json_b64(claims)}"
    return f"{signing_input}.{b64url_encode(key.sign(signing_input.encode('ascii')))}", exp


# --- validation -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidatedBearer:
    """A bearer whose signature and claims passed :func:`validate_bearer`.

    Attributes are those of :class:`BearerGrant` plus ``iat`` and ``exp`` (unix seconds).
    ``scope`` is ``act.scope`` in token order (empty when absent).

    Raises:
        Refused: BAD_REQUEST when a field breaks its grammar.
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
    return _refuse(_BEARER_WORDING, problem)


def verify_bearer_signature(token: object, keys: Mapping[str, VerifyKey]) -> dict[str, Any]:
    """Verify a bearer's header and signature; return its claims, unchecked.

    The first half of :func:`validate_bearer` (DESIGN 6 step 3): a caller may charge the
    ``act`` of a bearer that passed this step to connect limits even if its claims then fail.

    Args:
        token: the ``auth_token`` as received.
        keys: the space's issuer keys, ``{kid: VerifyKey}`` (a :class:`BearerKeySet`).

    Returns:
        The claims object.

    Raises:
        Refused: BAD_CREDENTIAL on any rule of :func:`verify_ed25519_jws`.
    """
    return verify_ed25519_jws(token, keys, wording=_BEARER_WORDING)


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
        raise _bad(f"is not for space {space} (aud must be {_shown(space)})")
    ver = claims.get("ver")
    if type(ver) is not int or ver != BEARER_VER:
        raise _bad(f"version {_shown(ver)} is not understood (ver 1 only)")


def _check_times(claims: Mapping[str, Any], now: float) -> tuple[int, int]:
    exp, iat, nbf = (_int_claim(claims, name) for name in ("exp", "iat", "nbf"))
    if now >= exp + CLOCK_SKEW_S:
        raise Refused(RefusalCode.BAD_CREDENTIAL, "bearer expired - exchange a fresh one")
    if nbf > now + CLOCK_SKEW_S or iat > now + CLOCK_SKEW_S:
        raise Refused(
            RefusalCode.BAD_CREDENTIAL,
            "bearer is not valid yet (issued in the future) - check the clocks of this host "
            "and of the auth service host, then exchange a fresh bearer",
        )
    if not 0 < exp - iat <= MAX_TOKEN_TTL_S:
        raise _bad(f"lifetime exp - iat must be 1 to {MAX_TOKEN_TTL_S} seconds")
    return iat, exp


def _scope_list(value: object, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(is_scope_token(token) for token in value):
        raise _bad(f"{name} must be a list of scope tokens")
    return tuple(value)


def _optional(act: Mapping[str, Any], name: str, valid: Any) -> str | None:
    value = act.get(name)
    if value is not None and not valid(value):
        raise _bad(f"act.{name} is malformed")
    return value


def _check_act(claims: Mapping[str, Any]) -> dict[str, Any]:
    act = claims.get("act")
    if not isinstance(act, dict) or not act.keys() <= _ACT_KEYS:
        raise _bad("act must be an object with only owner, actor, scope, parent, lifecycleUid, view, credentialId")
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
    return {
        "owner": act["owner"], "actor": act["actor"], "scope": scope, "lifecycle_uid": act["lifecycleUid"],
        "parent": _optional(act, "parent", is_principal),
        "view": _optional(act, "view", KNOWN_VIEWS.__contains__),
        "credential_id": _optional(act, "credentialId", is_credential_id),
    }  # fmt: skip


def check_bearer_claims(claims: Mapping[str, Any], *, space: str, now: float) -> ValidatedBearer:
    """Check the claims of a bearer whose signature verified (upstream-notes 3.3).

    Rules: ``iss == urn:cotal:auth:<space>``; ``aud == space`` or ``[space]``; ``ver == 1``;
    integer ``exp``, ``iat``, ``nbf``; with skew :data:`CLOCK_SKEW_S`, expired when
    ``now >= exp + 5`` and not yet valid when ``nbf`` or ``iat`` exceeds ``now + 5``;
    ``0 < exp - iat <= 900``; ``sub`` a derived owner equal to ``act.owner``; ``act`` an object
    with only known keys, an actor name, a lifecycle UID (required), optional ``scope`` list of
    scope tokens, ``parent`` ``<u_…>.<actor>``, ``view`` a known view, ``credentialId``; a
    top-level ``scope`` list that, when non-empty, equals ``act.scope`` as a set.

    Args:
        claims: the output of :func:`verify_bearer_signature`.
        space: this lane's space.
        now: wall time, unix seconds.

    Raises:
        Refused: BAD_CREDENTIAL, with a sentence naming the broken rule; expired and
            not-yet-valid bearers get distinct sentences.
    """
    _check_issuer_and_audience(claims, space)
    iat, exp = _check_times(claims, now)
    return ValidatedBearer(iat=iat, exp=exp, **_check_act(claims))


def validate_bearer(token: object, *, keys: Mapping[str, VerifyKey], space: str, now: float) -> ValidatedBearer:
    """Verify and check a bearer: :func:`verify_bearer_signature` then :func:`check_bearer_claims`.

    Raises:
        Refused: BAD_CREDENTIAL as either step.
    """
    return check_bearer_claims(verify_bearer_signature(token, keys), space=space, now=now)
