"""NATS JWTs (nats-io/jwt v2): encode, decode, verify, and the claim shapes we use.

Encoding (reference/stack-prototype.md section 3): ``b64url(header) . b64url(claims) .
b64url(signature)`` without padding; header ``{"typ":"JWT","alg":"ed25519-nkey"}``; the Ed25519
signature covers the ASCII ``"<header>.<claims>"`` and is made by the issuer's nkey. Every claim
set carries ``nats.version = 2`` (without it the broker reads a v1 claim and the signature check
fails with a misleading message) and a ``jti``: base32 (no padding) of SHA-512/256 over the
compact JSON of the other claims (serialised once, the jti appended). The broker does not check
the jti (a garbage one was admitted); hashing the claims keeps ours stable for golden tests and unique per claim set.

Claim shapes are those proven on a real broker (reference/nats-operator-mode.md section 4). The
builders return plain dicts without ``iss``/``iat``/``jti``; :func:`encode` adds those.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import CodecError
from .nkeys import KeyPair, Prefix, is_public_key, looks_like_public_key
from .nkeys import verify as verify_signature

__all__ = [
    "ALGORITHM",
    "AUTH_REQUEST_AUDIENCE",
    "MAX_JSON_DEPTH",
    "MAX_CLIENT_HOST_CHARS",
    "MAX_JWT_CHARS",
    "AuthorizationRequest",
    "Decoded",
    "UNLIMITED",
    "account_claims",
    "authorization_response_claims",
    "decode",
    "decode_authorization_request",
    "encode",
    "generic_claims",
    "is_plain_host",
    "operator_claims",
    "user_claims",
    "verify",
]

ALGORITHM = "ed25519-nkey"
HEADER = {"typ": "JWT", "alg": ALGORITHM}
AUTH_REQUEST_AUDIENCE = "nats-authorization-request"
# Account limits must be explicit: an omitted limit is 0 in operator mode (pitfall P1).
UNLIMITED = {
    "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
    "wildcards": True, "conn": -1, "leaf": -1,
}
JETSTREAM_UNLIMITED = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
# Bounds checked before any JSON is parsed (issue 15 item 2): a JWT longer than the broker's
# default max_payload (1 MiB) is not one we made or need, and no claim set of ours nests deeper
# than 6; past these the parser is never reached. Integers are int64 on the broker's side (at
# most 20 characters with the sign), so a longer one is refused before Python converts it.
MAX_JWT_CHARS = 1024 * 1024
MAX_JSON_DEPTH = 64
MAX_INT_CHARS = 20
# client_info.host is the peer's address as the broker saw it (an IPv4 or IPv6 address, with a
# zone perhaps): printable ASCII, far under a hostname's 253 characters. It keys a connect-limit
# bucket and is shown in a denial, so anything else (a lone surrogate, a 190 KB string) is "".
MAX_CLIENT_HOST_CHARS = 255
_PLAIN_HOST = re.compile(r"[!-~]{1,%d}" % MAX_CLIENT_HOST_CHARS)
_NOT_BRACKET = re.compile(r"[^\[\]{}]")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise CodecError("a JWT segment is not base64url") from None


def _compact(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


_HEADER_B64 = _b64(_compact(HEADER))


# Base32 (RFC 4648 alphabet) ten bits at a time: the jti is two per JWT on the callout's hot
# path, and base64.b32encode is a Python loop (about 9 us for 32 bytes here; this takes 5).
_B32_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_B32_PAIRS = [bytes((_B32_ALPHABET[i >> 5], _B32_ALPHABET[i & 31])) for i in range(1024)]
_JTI_SHIFTS = range(250, -1, -10)  # 256 bits and 4 zero bits: 26 pairs, 52 characters


def _jti_of(digest: bytes) -> bytes:
    """Base32 without padding of a 32-byte digest (``base64.b32encode(digest).rstrip(b"=")``)."""
    bits = int.from_bytes(digest, "big") << 4
    return b"".join([_B32_PAIRS[(bits >> shift) & 1023] for shift in _JTI_SHIFTS])


# hashlib.new looks the algorithm up by name on every call; a copy of a fresh one does not.
_SHA512_256 = hashlib.new("sha512_256")


def _with_jti(body: bytes) -> bytes:
    """Append ``"jti"`` to the compact JSON object ``body``: base32 of its SHA-512/256."""
    hasher = _SHA512_256.copy()
    hasher.update(body)
    digest = hasher.digest()
    return body[:-1] + b',"jti":"' + _jti_of(digest) + b'"}'


def encode(claims: Mapping[str, Any], signer: KeyPair, *, iat: int) -> str:
    """Sign a claim set as a NATS JWT.

    Args:
        claims: the claims without ``iss``/``iat``/``jti`` (a builder's output).
        signer: the issuer's key; its public key becomes ``iss``.
        iat: issued-at, unix seconds.

    Returns:
        The compact JWT string.
    """
    body = _compact({**claims, "iss": signer.public_key, "iat": int(iat)})
    signing_input = f"{_HEADER_B64}.{_b64(_with_jti(body))}"
    return f"{signing_input}.{_b64(signer.sign(signing_input.encode()))}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Decoded:
    """A JWT split into its parts; nothing is verified yet."""

    header: dict[str, Any]
    claims: dict[str, Any]
    signing_input: bytes
    signature: bytes


def _check_depth(text: str, what: str) -> None:
    """Refuse JSON nested deeper than ``MAX_JSON_DEPTH`` without parsing it.

    Fewer brackets than the bound cannot nest past it (the common case: two counts). Otherwise
    the strings are cut out and the depth is the running sum over the brackets left. Every step
    is one linear pass in C, whatever the text (no regex that can backtrack: an unterminated
    string of escaped quotes made the old one quadratic, 52 s at 80 KB): escaped backslashes
    are removed, then escaped quotes, so every quote left opens or closes a string, and the
    text between the 1st and 2nd, 3rd and 4th, ... quote is inside one. That is exact for
    JSON; a text with a backslash outside a string is not JSON, may be miscounted, and the
    parser refuses it (its RecursionError included).
    """
    if text.count("{") + text.count("[") <= MAX_JSON_DEPTH:
        return
    outside = text.replace("\\\\", "").replace('\\"', "").split('"')[::2]
    brackets = _NOT_BRACKET.sub("", "".join(outside))
    if max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0) > MAX_JSON_DEPTH:
        raise CodecError(f"the JWT {what} nests deeper than {MAX_JSON_DEPTH}")


def _bounded_int(text: str) -> int:
    if len(text) > MAX_INT_CHARS:
        raise CodecError(f"a JWT number has more than {MAX_INT_CHARS} digits")
    return int(text)


def _no_constant(name: str) -> None:
    raise CodecError(f"{name} is not JSON")


def _json_object(segment: str, what: str) -> dict[str, Any]:
    """Parse one segment: a JSON object, its depth bounded before parsing (issue 15 item 2).

    Every failure, whatever the parser would raise (RecursionError, ValueError of a huge
    number, a bad encoding), is a CodecError.
    """
    try:
        text = _unb64(segment).decode("utf-8")
        _check_depth(text, what)
        value = json.loads(text, parse_int=_bounded_int, parse_constant=_no_constant)
    except CodecError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError):  # JSONDecodeError is a ValueError
        raise CodecError(f"the JWT {what} is not JSON") from None
    if not isinstance(value, dict):
        raise CodecError(f"the JWT {what} is not a JSON object")
    return value


def decode(token: str | bytes) -> Decoded:
    """Split and parse a compact JWT without verifying it.

    Raises:
        CodecError: longer than ``MAX_JWT_CHARS``, not three base64url segments of JSON objects,
            JSON nested deeper than ``MAX_JSON_DEPTH``, or an integer longer than 20 characters;
            never anything else, whatever the token holds.
    """
    if len(token) > MAX_JWT_CHARS:
        raise CodecError(f"a JWT is at most {MAX_JWT_CHARS} characters")
    if isinstance(token, bytes):
        try:
            token = token.decode("ascii")
        except UnicodeDecodeError:
            raise CodecError("a JWT is ASCII") from None
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise CodecError("a JWT has three dot-separated parts")
    return Decoded(
        header=_json_object(parts[0], "header"),
        claims=_json_object(parts[1], "claims"),
        signing_input=f"{parts[0]}.{parts[1]}".encode(),
        signature=_unb64(parts[2]),
    )


def verify(token: str | bytes) -> dict[str, Any]:
    """Decode a NATS JWT and verify its signature against its own ``iss``; returns the claims.

    Who may issue what is the caller's check; this proves only that ``iss`` signed the claims.

    Raises:
        CodecError: malformed, header not ``ed25519-nkey``, ``iss`` not a signing nkey,
            ``nats.version`` not 2, or a bad signature.
    """
    decoded = decode(token)
    if decoded.header.get("alg") != ALGORITHM:
        raise CodecError("the JWT header is not a NATS ed25519-nkey header")
    claims = decoded.claims
    issuer = claims.get("iss")
    if not isinstance(issuer, str):
        raise CodecError("the JWT has no issuer")
    nats = claims.get("nats")
    if not isinstance(nats, dict) or nats.get("version") != 2:
        raise CodecError("the JWT is not a NATS v2 claim set")
    if not verify_signature(issuer, decoded.signing_input, decoded.signature):
        raise CodecError("the JWT signature does not verify against its issuer")
    return claims


# -- claim builders ---------------------------------------------------------------------------


def operator_claims(
    *, operator: str, name: str, signing_keys: Iterable[str], system_account: str
) -> dict[str, Any]:
    """Operator claims with strict signing-key use (DESIGN.md section 4)."""
    return {
        "sub": operator,
        "name": name,
        "nats": {
            "type": "operator",
            "version": 2,
            "signing_keys": list(signing_keys),
            "system_account": system_account,
            "strict_signing_key_usage": True,
        },
    }


def account_claims(
    *,
    account: str,
    name: str,
    signing_keys: Iterable[str],
    jetstream: bool = False,
    authorization: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Account claims with explicit unlimited limits (omitted limits mean zero: pitfall P1).

    Args:
        account: the account's public ``A...`` key (``sub``).
        jetstream: enable JetStream with unlimited storage (data accounts); when False the
            storage limits are 0 (auth accounts).
        authorization: the callout block ``{auth_users, allowed_accounts, xkey}`` for an auth
            account, or None.
    """
    limits = dict(UNLIMITED)
    limits.update(JETSTREAM_UNLIMITED if jetstream else {"mem_storage": 0, "disk_storage": 0})
    nats: dict[str, Any] = {
        "type": "account",
        "version": 2,
        "limits": limits,
        "default_permissions": {"pub": {}, "sub": {}},
        "signing_keys": list(signing_keys),
    }
    if authorization is not None:
        nats["authorization"] = dict(authorization)
    return {"sub": account, "name": name, "nats": nats}


def user_claims(
    *,
    user: str,
    name: str,
    issuer_account: str,
    permissions: Mapping[str, Any],
    exp: int | None = None,
    bearer_token: bool = False,
    tags: Iterable[str] = (),
    resp_max: int | None = None,
) -> dict[str, Any]:
    """User claims.

    Args:
        user: the user's public ``U...`` key (``sub``); for a callout mint, the request's
            ``user_nkey``.
        issuer_account: the account whose signing key signs this JWT.
        permissions: ``{"pub": {"allow": [...], "deny": [...]}, "sub": {...}}``; an empty
            mapping means no restrictions, so callers always pass a profile's grant.
        exp: unix seconds when the broker disconnects the user, or None for no expiry.
        bearer_token: True for the sentinel (no nonce signature needed).
        tags: JWT tags, e.g. ``owner:<owner>``.
        resp_max: allow this many replies to received requests (the callout user uses 1).
    """
    nats: dict[str, Any] = {
        "type": "user",
        "version": 2,
        "issuer_account": issuer_account,
        "subs": -1,
        "data": -1,
        "payload": -1,
        **{k: dict(v) for k, v in permissions.items()},
    }
    if bearer_token:
        nats["bearer_token"] = True
    if tags:
        nats["tags"] = list(tags)
    if resp_max is not None:
        nats["resp"] = {"max": resp_max, "ttl": 0}
    claims: dict[str, Any] = {"sub": user, "name": name, "nats": nats}
    if exp is not None:
        claims["exp"] = int(exp)
    return claims


def generic_claims(*, subject: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """Generic claims, e.g. a ``$SYS.REQ.CLAIMS.DELETE`` request ``{"accounts": [...]}``."""
    return {"sub": subject, "nats": {**data, "type": "generic", "version": 2}}


def authorization_response_claims(
    *,
    user_nkey: str,
    server_id: str,
    issuer_account: str,
    jwt: str | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """An auth callout response: exactly one of a user ``jwt`` or a denial ``error``.

    ``sub`` must equal the request's ``user_nkey`` and ``aud`` the server id
    (reference/nats-operator-mode.md 4.4, R7/R8).
    """
    if (jwt is None) == (error is None):
        raise ValueError("an authorization response carries exactly one of jwt or error")
    nats: dict[str, Any] = {
        "type": "authorization_response",
        "version": 2,
        "issuer_account": issuer_account,
    }
    nats["jwt" if jwt is not None else "error"] = jwt if jwt is not None else error
    return {"sub": user_nkey, "aud": server_id, "nats": nats}


# -- the authorization request ----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthorizationRequest:
    """The verified fields of a ``$SYS.REQ.USER.AUTH`` request we act on (NATS ADR-26).

    Attributes:
        server_id: the broker's ``N...`` key (``iss`` and ``nats.server_id.id``).
        server_xkey: the broker's ``X...`` key from ``nats.server_id.xkey``, or None.
        account: ``sub``, the auth account the request was published in.
        user_nkey: the ``U...`` key the broker generated for this connect.
        client_host: ``client_info.host`` when plain printable ASCII of at most
            ``MAX_CLIENT_HOST_CHARS``, else ``""`` (shown as ``-``).
        client_id: ``client_info.id``, the broker's ``cid``.
        auth_token: ``connect_opts.auth_token`` (the bearer) or None.
        connect_name: ``connect_opts.name`` (the inbox nonce) or None.
        sentinel_jwt: ``connect_opts.jwt`` or None.
        iat, exp: unix seconds from the request JWT.
    """

    server_id: str
    server_xkey: str | None
    account: str
    user_nkey: str
    client_host: str
    client_id: int
    auth_token: str | None
    connect_name: str | None
    sentinel_jwt: str | None
    iat: int
    exp: int


def _opt_str(mapping: Mapping[str, Any], key: str) -> str | None:
    value = mapping.get(key)
    return value if isinstance(value, str) and value else None


def is_plain_host(value: object) -> bool:
    """True for a string of 1 to ``MAX_CLIENT_HOST_CHARS`` printable ASCII characters, no space:
    safe as a bucket key and in a log line or denial as it is."""
    return isinstance(value, str) and _PLAIN_HOST.fullmatch(value) is not None


def _client_host(value: object) -> str:
    """``client_info.host`` when plain (:func:`is_plain_host`), else ``""``: it keys a
    connect-limit bucket and is shown in a denial."""
    return value if is_plain_host(value) else ""


def _section(nats: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = nats.get(key, {})
    if not isinstance(value, dict):
        raise CodecError(f"authorization request nats.{key} is not an object")
    return value


def decode_authorization_request(claims: Mapping[str, Any]) -> AuthorizationRequest:
    """Read a verified request's claims into an :class:`AuthorizationRequest`.

    Checks only shape (types, key roles); provenance (who sent it, for which account, expiry)
    is :func:`cotal_trio.core.callout.check_provenance`.

    Raises:
        CodecError: a missing or mistyped field, or a key of the wrong role.
    """
    nats = claims.get("nats")
    if not isinstance(nats, dict) or nats.get("type") != "authorization_request":
        raise CodecError("the JWT is not an authorization request")
    server = _section(nats, "server_id")
    client = _section(nats, "client_info")
    opts = _section(nats, "connect_opts")
    server_id, user_nkey = server.get("id"), nats.get("user_nkey")
    if not (isinstance(server_id, str) and is_public_key(server_id, Prefix.SERVER)):
        raise CodecError("authorization request server_id.id is not a server nkey")
    if not looks_like_public_key(user_nkey, Prefix.USER):
        raise CodecError("authorization request user_nkey is not a user nkey")
    iat, exp, cid = claims.get("iat"), claims.get("exp"), client.get("id", 0)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (iat, exp, cid)):
        raise CodecError("authorization request iat, exp or client_info.id is not an integer")
    return AuthorizationRequest(
        server_id=server_id,
        server_xkey=_opt_str(server, "xkey"),
        account=claims.get("sub") if isinstance(claims.get("sub"), str) else "",
        user_nkey=user_nkey,
        client_host=_client_host(client.get("host")),
        client_id=cid,
        auth_token=_opt_str(opts, "auth_token"),
        connect_name=_opt_str(opts, "name"),
        sentinel_jwt=_opt_str(opts, "jwt"),
        iat=iat,
        exp=exp,
    )
