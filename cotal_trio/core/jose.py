"""Compact JWS and Ed25519 JWK machinery shared by bearers and IdP tokens (RFC 7515, 7638, 8037).

* base64url (RFC 7515 section 2), written and read strictly: one token has exactly one spelling;
* JSON objects parsed strictly: UTF-8, no duplicate keys, no ``NaN``/``Infinity``;
* Ed25519 OKP JWKs: the RFC 7638 thumbprint, public keys and JWKS documents, and
  :class:`IssuerKey` (a signing key with its published JWK) and :class:`BearerKeySet` (pinned
  verify keys by ``kid``);
* :func:`sign_ed25519_jws`: a compact JWS signed with an :class:`IssuerKey` (``core/bearer.py``
  issues bearers with it and ``devidp/idp.py`` development IdP tokens);
* :func:`verify_ed25519_jws`: a compact JWS checked against pinned keys, with refusal sentences
  worded per kind of token (:class:`JwsWording`). ``core/bearer.py`` verifies bearers with it and
  ``core/idp.py`` IdP tokens.

The JWS is parsed here by hand and verified with libsodium (PyNaCl), because this runs on
every connect: measured at about 90 us for the whole bearer validation (libsodium's verify is
about 60 us of it), where joserfc's ``jwt.decode`` alone took about 170 us.

Pure and synchronous: seeds come in as bytes.
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

from cotal_trio.core.errors import CodecError, RefusalCode, Refused

__all__ = [
    "EDDSA_ALGS",
    "EMBEDDED_KEY_HEADERS",
    "MAX_TOKEN_CHARS",
    "BearerKeySet",
    "IssuerKey",
    "JwsWording",
    "b64url_encode",
    "header_kid",
    "okp_thumbprint",
    "parse_ed25519_jwks",
    "verify_ed25519_jws",
    "verify_key_from_jwk",
    "refuse_jws",
    "shown",
    "sign_ed25519_jws",
]

# "EdDSA" is the RFC 8037 name; "Ed25519" is the fully specified RFC 9864 name.
EDDSA_ALGS = frozenset({"EdDSA", "Ed25519"})
# Headers that would let a token choose its own verification key (spec "Bridge contract" 1).
EMBEDDED_KEY_HEADERS = ("jku", "jwk", "x5u", "x5c")
# A compact JWS longer than this is refused before any decoding (a bearer is under 1 KiB).
MAX_TOKEN_CHARS = 16384

_SEED_BYTES = 32
_SIGNATURE_BYTES = 64
_B64URL = re.compile(r"[A-Za-z0-9_-]*")


# --- base64url and JSON helpers -------------------------------------------------------------


def b64url_encode(data: bytes) -> str:
    """Unpadded base64url (RFC 7515 section 2) of ``data``."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _is_eddsa(alg: object) -> bool:
    """``alg`` names EdDSA; any JSON value may come in (a list or object is no alg, not a crash)."""
    return isinstance(alg, str) and alg in EDDSA_ALGS


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


def shown(value: object) -> str:
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
    if not _is_eddsa(jwk.get("alg", "EdDSA")) or jwk.get("use", "sig") != "sig":
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
            raise CodecError(f"the JWKS lists kid {shown(kid)} twice - publish each key once")
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


# --- compact JWS signing --------------------------------------------------------------------


def _json_b64(value: dict[str, Any]) -> str:
    """Compact UTF-8 JSON (no spaces, non-ASCII kept as is) of ``value``, base64url."""
    return b64url_encode(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def sign_ed25519_jws(header: dict[str, Any], claims: dict[str, Any], key: IssuerKey) -> str:
    """The compact JWS ``<header>.<claims>.<signature>`` of ``claims`` signed by ``key`` (RFC 7515).

    Deterministic: header and claims are serialized as compact JSON in their insertion order,
    and Ed25519 signatures are deterministic, so equal inputs give equal bytes (golden tests).

    Args:
        header: the protected header as written, e.g. ``{"alg": "EdDSA", "kid": key.kid,
            "typ": "JWT"}``; the caller names ``alg`` and ``kid``.
        claims: the payload object (JSON-serializable).
        key: the signing key.

    Raises:
        TypeError, ValueError: a header or claim that JSON cannot serialize (a caller bug).
    """
    signing_input = f"{_json_b64(header)}.{_json_b64(claims)}"
    return f"{signing_input}.{b64url_encode(key.sign(signing_input.encode('ascii')))}"


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


def header_kid(token: object) -> str | None:
    """The ``kid`` a compact JWS's header names, trusting nothing; None when there is none.

    Only to decide whether a key set is worth re-reading before verifying (the IdP's JWKS on an
    unknown ``kid``); verification itself is :func:`verify_ed25519_jws`.
    """
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
        return None
    raw = _b64url_decode(token.split(".", 1)[0])
    header = _json_object(raw) if raw is not None else None
    kid = header.get("kid") if header is not None else None
    return kid if isinstance(kid, str) and kid else None


def refuse_jws(wording: JwsWording, problem: str) -> Refused:
    return Refused(RefusalCode.BAD_CREDENTIAL, f"{wording.what} {problem} - {wording.fix}")


def _split_compact(token: object, wording: JwsWording) -> tuple[str, str, str]:
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
        raise refuse_jws(wording, "is missing, empty or too long")
    parts = token.split(".")
    if len(parts) != 3 or not all(_B64URL.fullmatch(part) for part in parts):
        raise refuse_jws(wording, "is not a compact JWS (three dot-separated base64url parts)")
    return parts[0], parts[1], parts[2]


def _check_header(
    header: dict[str, Any], keys: Mapping[str, VerifyKey], wording: JwsWording, typ: frozenset[str] | None
) -> VerifyKey:
    if typ is not None and "typ" in header and not (isinstance(header["typ"], str) and header["typ"] in typ):
        raise refuse_jws(wording, f"header typ {shown(header['typ'])} is not this token's type (RFC 8725 3.11)")
    embedded = [name for name in EMBEDDED_KEY_HEADERS if name in header]
    if embedded:
        raise refuse_jws(wording, f"header carries key material ({', '.join(embedded)}); keys come only from the pinned key set")
    if "crit" in header:
        raise refuse_jws(wording, "header marks critical extensions (crit), which are not supported")
    if not _is_eddsa(header.get("alg")):
        raise refuse_jws(wording, f"alg {shown(header.get('alg'))} is not accepted (EdDSA only)")
    kid = header.get("kid")
    verify_key = keys.get(kid) if isinstance(kid, str) else None
    if verify_key is None:
        raise Refused(RefusalCode.BAD_CREDENTIAL, wording.unknown_key.format(kid=shown(kid)))
    return verify_key


def verify_ed25519_jws(
    token: object, keys: Mapping[str, VerifyKey], *, wording: JwsWording, typ: frozenset[str] | None = None
) -> dict[str, Any]:
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
        typ: the header ``typ`` values this kind of token may carry (absent is fine), so a
            token of another kind signed by the same key (a consent) is not taken for it;
            None: any.

    Returns:
        The payload object (claims not yet checked).

    Raises:
        Refused: BAD_CREDENTIAL, with a sentence from ``wording``, on any rule above.
    """
    header_b64, payload_b64, signature_b64 = _split_compact(token, wording)
    header_raw = _b64url_decode(header_b64)
    header = _json_object(header_raw) if header_raw is not None else None
    if header is None:
        raise refuse_jws(wording, "header is not a base64url JSON object")
    verify_key = _check_header(header, keys, wording, typ)
    signature = _b64url_decode(signature_b64)
    try:
        if signature is None or len(signature) != _SIGNATURE_BYTES:
            raise BadSignatureError
        verify_key.verify(f"{header_b64}.{payload_b64}".encode("ascii"), signature)
    except BadSignatureError:
        raise refuse_jws(wording, "signature does not verify") from None
    payload_raw = _b64url_decode(payload_b64)
    claims = _json_object(payload_raw) if payload_raw is not None else None
    if claims is None:
        raise refuse_jws(wording, "payload is not a base64url JSON object")
    return claims
