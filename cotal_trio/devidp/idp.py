"""The development IdP's key material and token minting (issue 2 item 8). DEVELOPMENT ONLY.

``cotal up`` uses this IdP when no real IdP is pinned, so a developer can sign in without
running one. It is an EdDSA IdP in the shape the human exchange arm expects (spec "Bridge
contract" step 1): tokens are compact JWS with ``alg: EdDSA`` and a ``kid`` header, verified
offline against :func:`jwks`.

Minting needs the private key, which lives only in the root's 0600 ``devidp.json``: whoever can
read that file can sign in as anyone, which is the same-user capability a development root
already implies. Over HTTP (``app.py``) a JWT is minted only for a device-code session that a
token signed with that key approved.

Synchronous and side-effect free: randomness comes in through ``random_bytes``, time as ``now``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from cotal_trio.core.errors import CodecError, ConfigError
from cotal_trio.core.idp import IdpPin
from cotal_trio.core.jose import IssuerKey, sign_ed25519_jws

__all__ = [
    "DEV_AUDIENCE",
    "DEV_ISSUER_PREFIX",
    "DevIdpMaterial",
    "TokenSigner",
    "create_dev_idp",
    "jwks",
    "mint_dev_token",
]

# Every dev issuer starts with this, so a dev-signed identity is recognisable wherever it lands.
DEV_ISSUER_PREFIX = "urn:cotal:dev-idp:"
DEV_AUDIENCE = "cotal-dev"
# Version of the devidp.json document this module writes and reads.
_DOC_VER = 1
_DEV_ISSUER = re.compile(re.escape(DEV_ISSUER_PREFIX) + r"[0-9a-f]{12}")
_ISSUER_RANDOM_BYTES = 6
_SEED_BYTES = 32
_NOTE = "development IdP - anyone who can read this file can sign in as anyone; never pin it in production"
_BAD_FILE = (
    "devidp.json is not a development IdP document ({problem}) - restore it from a backup; to start"
    " over instead, remove it and every space's idp.json pinned to it, run `cotal up`, and grant the"
    " actors again (a new development IdP gives every user a new owner)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class DevIdpMaterial:
    """A development IdP: its issuer, audience and Ed25519 signing key.

    Attributes:
        issuer: ``urn:cotal:dev-idp:<12 lowercase hex>``; stable once created, because owner
            derivation is keyed by the issuer (spec "Bridge contract" step 2).
        audience: the ``aud`` of its tokens, normally :data:`DEV_AUDIENCE`.
        key: the Ed25519 signing key (its ``kid`` is the RFC 7638 thumbprint).

    Raises:
        ConfigError: the issuer does not have the dev form, or the audience is empty.
    """

    issuer: str
    audience: str
    key: IssuerKey

    def __post_init__(self) -> None:
        if not isinstance(self.issuer, str) or _DEV_ISSUER.fullmatch(self.issuer) is None:
            raise ConfigError(_BAD_FILE.format(problem=f"issuer must be {DEV_ISSUER_PREFIX}<12 hex>"))
        if not isinstance(self.audience, str) or not self.audience:
            raise ConfigError(_BAD_FILE.format(problem="audience must be a non-empty string"))
        if not isinstance(self.key, IssuerKey):
            raise ConfigError(_BAD_FILE.format(problem="the key must be an Ed25519 key"))

    @property
    def kid(self) -> str:
        """The ``kid`` header of minted tokens."""
        return self.key.kid

    def pin(self) -> IdpPin:
        """The :class:`IdpPin` a space uses to trust this dev IdP (its JWKS pinned inline)."""
        return IdpPin(issuer=self.issuer, audience=self.audience)

    def to_json(self) -> str:
        """The ``devidp.json`` document (JSON text, secret: the state layer writes it 0600).

        Shape: ``{"ver": 1, "devOnly": true, "note": ..., "issuer", "audience",
        "privateJwk": {kty, crv, x, kid, alg, use, d}}``.
        """
        doc = {
            "ver": _DOC_VER,
            "devOnly": True,
            "note": _NOTE,
            "issuer": self.issuer,
            "audience": self.audience,
            "privateJwk": self.key.private_jwk(),
        }
        return json.dumps(doc, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> DevIdpMaterial:
        """Load a document written by :meth:`to_json`.

        Raises:
            ConfigError: not JSON, not an object, wrong ``ver``, not marked ``devOnly``, a bad
                issuer or audience, or a private JWK that is not a consistent Ed25519 key. The
                sentence says to delete the file and run ``cotal up`` again.
        """
        doc = _load_object(text)
        if doc.get("ver") != _DOC_VER or doc.get("devOnly") is not True:
            raise ConfigError(_BAD_FILE.format(problem=f"it must have ver {_DOC_VER} and devOnly true"))
        try:
            key = IssuerKey.from_private_jwk(doc.get("privateJwk"))
        except CodecError:
            raise ConfigError(_BAD_FILE.format(problem="privateJwk is not a consistent Ed25519 key")) from None
        return cls(issuer=doc.get("issuer"), audience=doc.get("audience"), key=key)


def _load_object(text: str | bytes) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except (UnicodeDecodeError, ValueError, TypeError):
        raise ConfigError(_BAD_FILE.format(problem="not JSON")) from None
    if not isinstance(doc, dict):
        raise ConfigError(_BAD_FILE.format(problem="not a JSON object"))
    return doc


def create_dev_idp(random_bytes: Callable[[int], bytes]) -> DevIdpMaterial:
    """Create a fresh development IdP.

    Args:
        random_bytes: a CSPRNG, ``n -> n bytes`` (``os.urandom`` or ``secrets.token_bytes``);
            called for 6 issuer bytes and a 32-byte Ed25519 seed.

    Returns:
        Material with issuer ``urn:cotal:dev-idp:<12 hex>`` and audience :data:`DEV_AUDIENCE`.

    Raises:
        ConfigError: ``random_bytes`` returned the wrong number of bytes (a caller bug).
    """
    issuer_bytes, seed = random_bytes(_ISSUER_RANDOM_BYTES), random_bytes(_SEED_BYTES)
    if len(issuer_bytes) != _ISSUER_RANDOM_BYTES or len(seed) != _SEED_BYTES:
        raise ConfigError("create_dev_idp needs a random source that returns exactly n bytes")
    return DevIdpMaterial(
        issuer=DEV_ISSUER_PREFIX + issuer_bytes.hex(), audience=DEV_AUDIENCE, key=IssuerKey.generate(seed)
    )


class TokenSigner(Protocol):
    """What signs IdP tokens: an issuer, an audience and an Ed25519 key (a
    :class:`DevIdpMaterial`, or a test's Better-Auth-shaped IdP whose issuer is its origin)."""

    @property
    def issuer(self) -> str: ...  # noqa: D102
    @property
    def audience(self) -> str: ...  # noqa: D102
    @property
    def key(self) -> IssuerKey: ...  # noqa: D102
    @property
    def kid(self) -> str: ...  # noqa: D102


def mint_dev_token(
    material: TokenSigner, *, sub: str, now: int, ttl_s: int = 3600, amr: Iterable[str] = ("pwd",),
    auth_time: int | None = None,
) -> str:
    """Mint a development IdP token for ``sub``.

    The token is a compact JWS, header ``{"alg": "EdDSA", "kid", "typ": "JWT"}``, claims
    ``{iss, aud, sub, iat: now, exp: now + ttl_s, auth_time, amr}``: by default it says the person
    signed in with a password just now (spec "Password proof" reads ``auth_time``/``amr``); a
    token fetched through a login session carries the session's sign-in time instead.

    Args:
        material: the dev IdP (loaded from the 0600 ``devidp.json``).
        sub: the subject, a non-empty string (owner derivation keys on it).
        now: unix seconds, positive integer.
        ttl_s: lifetime in seconds, positive integer.
        amr: authentication-method references, strings.
        auth_time: unix seconds of the sign-in (default ``now``).

    Raises:
        ConfigError: an empty ``sub``, a non-integer or non-positive ``now``/``ttl_s``, or a
            non-string ``amr`` entry.
    """
    if not isinstance(sub, str) or not sub:
        raise ConfigError("a development IdP token needs a non-empty subject - pass --sub <name>")
    if type(now) is not int or now <= 0 or type(ttl_s) is not int or ttl_s <= 0:
        raise ConfigError("mint_dev_token needs now and ttl_s as positive integer seconds")
    methods = list(amr)
    if not all(isinstance(method, str) for method in methods):
        raise ConfigError("amr entries must be strings such as pwd")
    claims = {
        "iss": material.issuer, "aud": material.audience, "sub": sub,
        "iat": now, "exp": now + ttl_s, "auth_time": now if auth_time is None else auth_time, "amr": methods,
    }  # fmt: skip
    return sign_ed25519_jws({"alg": "EdDSA", "kid": material.kid, "typ": "JWT"}, claims, material.key)


def jwks(material: TokenSigner) -> dict[str, list[dict[str, str]]]:
    """The public JWKS ``{"keys": [{kty, crv, x, kid, alg, use}]}`` (no private member)."""
    return {"keys": [material.key.public_jwk()]}
