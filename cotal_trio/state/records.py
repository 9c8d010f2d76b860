"""Small records of a root: bearer issuer keys, the owner secret, the IdP pin, broker policy.

Same contract as :mod:`cotal_trio.state.material` (which re-exports everything here): ``load_*``
validates and raises :class:`ConfigError` naming the file; ``save_*`` writes atomically 0600 and,
with ``exclusive=True``, only creates (returns False when the file exists).

=====================  =================================================================
``issuer.json``        ``{ver, issuer: "urn:cotal:auth:<space>", activeKid,
                       keys: [{kid, privateJwk}]}`` (upstream-notes 3.1)
``owner-secret.json``  ``{ver, secretB64}``: at least 32 random bytes, standard base64
``idp.json``           ``{ver, kind: "dev"|"oidc", url, issuer, audience, jwksUri}``
``policy.json``        ``{ver, port, authTimeoutS: seconds|null}``
=====================  =================================================================
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path

from cotal_trio.core.bearer import space_issuer
from cotal_trio.core.errors import CodecError, ConfigError
from cotal_trio.core.idp import IdpPin
from cotal_trio.core.jose import IssuerKey

from .files import VERSION, Fields, read_fields, save_json

__all__ = [
    "IDP_KINDS",
    "OWNER_SECRET_BYTES",
    "BrokerPolicy",
    "IdpPinRecord",
    "IssuerKeys",
    "load_idp_pin",
    "load_issuer_keys",
    "load_owner_secret",
    "load_policy",
    "save_idp_pin",
    "save_issuer_keys",
    "save_owner_secret",
    "save_policy",
]

OWNER_SECRET_BYTES = 32
# The longest broker authorization timeout a root records (seconds); `inf` would break the config.
MAX_AUTH_TIMEOUT_S = 600.0


# -- issuer.json ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class IssuerKeys:
    """A space's bearer issuer: ``urn:cotal:auth:<space>`` and its keys, one of them active."""

    issuer: str
    active_kid: str
    keys: tuple[IssuerKey, ...]

    def __post_init__(self) -> None:
        if self.active_kid not in {key.kid for key in self.keys}:
            raise ConfigError("the active issuer kid is not among the issuer keys")

    @property
    def active(self) -> IssuerKey:
        """The key new bearers are signed with."""
        return next(key for key in self.keys if key.kid == self.active_kid)


def save_issuer_keys(path: Path, keys: IssuerKeys, *, exclusive: bool = False) -> bool:
    """Write ``issuer.json``; see the module docstring for ``exclusive``."""
    return save_json(path, {
        "ver": VERSION,
        "issuer": keys.issuer,
        "activeKid": keys.active_kid,
        "keys": [{"kid": key.kid, "privateJwk": key.private_jwk()} for key in keys.keys],
    }, exclusive=exclusive)


def load_issuer_keys(path: Path, space: str) -> IssuerKeys:
    """Read and validate ``issuer.json`` of ``space``.

    Raises:
        ConfigError: missing, corrupt, an issuer other than ``urn:cotal:auth:<space>``, a key
            whose kid is not its thumbprint, or an active kid with no key.
    """
    f = read_fields(path)
    if f.get("issuer", str) != space_issuer(space):
        raise f.bad(f"its issuer is not {space_issuer(space)}")
    entries = f.get("keys", list)
    keys = tuple(_issuer_key(f, i) for i in range(len(entries)))
    return f.build(IssuerKeys, issuer=space_issuer(space), active_kid=f.get("activeKid", str), keys=keys)


def _issuer_key(f: Fields, index: int) -> IssuerKey:
    try:
        key = IssuerKey.from_private_jwk(f.get(f"keys.{index}.privateJwk", dict))
    except CodecError as exc:
        raise f.bad(f"keys.{index}: {exc}") from None
    if key.kid != f.get(f"keys.{index}.kid", str):
        raise f.bad(f"keys.{index}.kid is not the key's thumbprint")
    return key


# -- owner-secret.json ------------------------------------------------------------------------------


def save_owner_secret(path: Path, secret: bytes, *, exclusive: bool = False) -> bool:
    """Write ``owner-secret.json`` ``{ver, secretB64}`` (standard base64 of the secret bytes)."""
    if len(secret) < OWNER_SECRET_BYTES:
        raise ConfigError(f"an owner secret has at least {OWNER_SECRET_BYTES} bytes")
    obj = {"ver": VERSION, "secretB64": base64.b64encode(secret).decode()}
    return save_json(path, obj, exclusive=exclusive)


def load_owner_secret(path: Path) -> bytes:
    """The owner secret bytes (at least 32).

    Raises:
        ConfigError: missing, corrupt, or shorter than 32 bytes. Never regenerate it: a new
            secret re-keys every owner of the space.
    """
    f = read_fields(path)
    try:
        secret = base64.b64decode(f.get("secretB64", str), validate=True)
    except (binascii.Error, ValueError):
        raise f.bad("secretB64 is not base64") from None
    if len(secret) < OWNER_SECRET_BYTES:
        raise f.bad(f"the secret is shorter than {OWNER_SECRET_BYTES} bytes")
    return secret


# -- idp.json ----------------------------------------------------------------------------------------


IDP_KINDS = ("dev", "oidc")


@dataclass(frozen=True, slots=True, kw_only=True)
class IdpPinRecord:
    """The IdP a space trusts (upstream-notes 4.4); changing it re-keys owners, so it is pinned.

    The ``idp.json`` record: :meth:`pin` is the part token verification uses.
    """

    kind: str  # "dev" | "oidc"
    url: str
    issuer: str
    audience: str
    jwks_uri: str  # "" when the JWKS is not fetched from a URL

    def __post_init__(self) -> None:
        if self.kind not in IDP_KINDS:
            raise ConfigError(f"an IdP pin kind is one of {', '.join(IDP_KINDS)}")

    def pin(self) -> IdpPin:
        """The core :class:`~cotal_trio.core.idp.IdpPin` (an empty ``jwks_uri`` becomes ``None``).

        Raises:
            ConfigError: an empty issuer or audience, or a ``jwks_uri`` that is not http(s).
        """
        return IdpPin(issuer=self.issuer, audience=self.audience, jwks_uri=self.jwks_uri or None)


def save_idp_pin(path: Path, pin: IdpPinRecord, *, exclusive: bool = False) -> bool:
    """Write ``idp.json``; see the module docstring for ``exclusive``."""
    return save_json(path, {
        "ver": VERSION, "kind": pin.kind, "url": pin.url, "issuer": pin.issuer,
        "audience": pin.audience, "jwksUri": pin.jwks_uri,
    }, exclusive=exclusive)


def load_idp_pin(path: Path) -> IdpPinRecord:
    """Read ``idp.json``.

    Raises:
        ConfigError: missing, corrupt, or an unknown kind.
    """
    f = read_fields(path)
    return f.build(
        IdpPinRecord, kind=f.get("kind", str), url=f.get("url", str), issuer=f.get("issuer", str),
        audience=f.get("audience", str), jwks_uri=f.get("jwksUri", str),
    )


# -- policy.json -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerPolicy:
    """How ``cotal up`` runs: the bundled broker's loopback port, the optional auth timeout
    (seconds), and the operator face's port (``--ops-port``, issue 18 item 8; None: not yet
    recorded, 0: a free one)."""

    port: int
    auth_timeout_s: float | None = None
    ops_port: int | None = None

    def __post_init__(self) -> None:
        ops = self.ops_port
        if ops is not None and (isinstance(ops, bool) or not isinstance(ops, int) or not 0 <= ops < 65536):
            raise ConfigError("the operator face's port is a whole number from 0 to 65535")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise ConfigError("the broker port is a whole number from 1 to 65535")
        timeout = self.auth_timeout_s
        number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
        if timeout is not None and not (number and 0 < timeout <= MAX_AUTH_TIMEOUT_S):
            raise ConfigError(f"the auth timeout is a number of seconds above 0 and at most {MAX_AUTH_TIMEOUT_S:g}")


def save_policy(path: Path, policy: BrokerPolicy, *, exclusive: bool = False) -> bool:
    """Write ``policy.json`` ``{ver, port, authTimeoutS[, opsPort]}``."""
    obj: dict[str, object] = {"ver": VERSION, "port": policy.port, "authTimeoutS": policy.auth_timeout_s}
    if policy.ops_port is not None:
        obj["opsPort"] = policy.ops_port
    return save_json(path, obj, exclusive=exclusive)


def load_policy(path: Path) -> BrokerPolicy:
    """Read ``policy.json``.

    Raises:
        ConfigError: missing, corrupt, a port outside 1-65535 or a non-positive timeout.
    """
    f = read_fields(path)
    return f.build(
        BrokerPolicy, port=f.get("port", int), auth_timeout_s=f.get("authTimeoutS", (int, float, type(None))),
        ops_port=f.get("opsPort", (int, type(None))) if "opsPort" in f.obj else None,
    )
