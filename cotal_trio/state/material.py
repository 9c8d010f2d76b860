"""Key material in the root: frozen values, their JSON files (``ver: 1``, camelCase), load/save.

Files and who reads them (DESIGN.md section 4):

=====================  ====================================================  ================
file                   holds                                                 read by
=====================  ====================================================  ================
``broker.json``        operator identity + signing seeds, operator JWT,      provisioning only
                       system account pub, its signing seed and JWT, the
                       system user's creds
``callout.json``       one space's lane material (:class:`SpaceMaterial`)    the lane
``accounts.json``      one space's account pubs and current account JWTs     provisioning
``issuer.json``        bearer issuer keys                                    the lane
``owner-secret.json``  32 random bytes that key owner derivation             the lane
``idp.json``           the IdP pin                                           the lane
``policy.json``        the bundled broker's port and auth timeout            ``cotal up``
=====================  ====================================================  ================

Account identity seeds (system, data, auth) are discarded once the account JWT is signed: under
``strict_signing_key_usage`` an identity key can sign nothing the broker accepts (pitfall P2), and
re-signing an account JWT needs only its public key plus the operator signing key. The operator
identity seed is kept: it alone can re-sign the operator JWT.

The four small records (issuer, owner secret, IdP pin, policy) live in
:mod:`cotal_trio.state.records` and are re-exported here.

Every ``load_*`` validates what it reads (keys parse and have the right role, JWTs verify and
agree with the keys beside them, the issuer matches the space) and raises :class:`ConfigError`
naming the file (see :func:`cotal_trio.state.files.corrupt`); it never modifies the file.
Every ``save_*`` writes atomically, 0600; with ``exclusive=True`` it only creates (returns False
and writes nothing when the file exists), which is how keys are never regenerated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cotal_trio.core import natsjwt
from cotal_trio.core.creds import parse_creds
from cotal_trio.core.errors import CodecError
from cotal_trio.core.nkeys import KeyPair, Prefix, decode_public_key
from cotal_trio.core.xkeys import XKeyPair

from .files import VERSION, Fields, read_fields, save_json
from .records import (
    OWNER_SECRET_BYTES,
    BrokerPolicy,
    IdpPinRecord,
    IssuerKeys,
    load_idp_pin,
    load_issuer_keys,
    load_owner_secret,
    load_policy,
    save_idp_pin,
    save_issuer_keys,
    save_owner_secret,
    save_policy,
)

__all__ = [
    "AccountsRecord",
    "BrokerMaterial",
    "BrokerPolicy",
    "IdpPinRecord",
    "IssuerKeys",
    "OWNER_SECRET_BYTES",
    "SpaceMaterial",
    "load_accounts",
    "load_broker",
    "load_idp_pin",
    "load_issuer_keys",
    "load_owner_secret",
    "load_policy",
    "load_space",
    "save_accounts",
    "save_broker",
    "save_idp_pin",
    "save_issuer_keys",
    "save_owner_secret",
    "save_policy",
    "save_space",
]


# -- validating readers: each raises the file's ConfigError ------------------------------------


def _keypair(f: Fields, dotted: str, role: Prefix) -> KeyPair:
    try:
        key = KeyPair.from_seed(f.get(dotted, str))
    except CodecError as exc:
        raise f.bad(f"{dotted}: {exc}") from None
    if key.prefix != role:
        actual, wanted = key.prefix.name.lower(), role.name.lower()
        raise f.bad(f"{dotted} is a {actual} seed where the {wanted} seed belongs")
    return key


def public_key_field(f: Fields, dotted: str, role: Prefix) -> str:
    """The public key of ``role`` at ``dotted`` in ``f`` (for this package's readers).

    Raises:
        ConfigError: the field is missing, not a string, or not a key of that role.
    """
    value = f.get(dotted, str)
    try:
        decode_public_key(value, role)
    except CodecError as exc:
        raise f.bad(f"{dotted}: {exc}") from None
    return value


def _xkey(f: Fields, dotted: str) -> XKeyPair:
    try:
        return XKeyPair.from_seed(f.get(dotted, str))
    except CodecError as exc:
        raise f.bad(f"{dotted}: {exc}") from None


def _jwt(f: Fields, dotted: str, *, subject: str, issuer: str) -> dict[str, Any]:
    """Verify the JWT at ``dotted`` and require its ``sub`` and ``iss``; returns its claims."""
    try:
        claims = natsjwt.verify(f.get(dotted, str))
    except CodecError as exc:
        raise f.bad(f"{dotted}: {exc}") from None
    if claims.get("sub") != subject or claims.get("iss") != issuer:
        raise f.bad(f"{dotted} is not issued by the expected key for the expected subject")
    return claims


def _account_jwt(f: Fields, dotted: str, account: str, issuer: str, signing: list[str]) -> None:
    claims = _jwt(f, dotted, subject=account, issuer=issuer)
    if list(claims["nats"].get("signing_keys", ())) != list(signing):
        raise f.bad(f"{dotted} does not list the recorded signing keys")


def _creds(f: Fields, dotted: str, *, signer: str, account: str) -> dict[str, Any]:
    """Parse creds text; the user JWT must be issued by ``signer`` into ``account``."""
    try:
        jwt, seed = parse_creds(f.get(dotted, str))
        user = KeyPair.from_seed(seed)
        claims = natsjwt.verify(jwt)
    except CodecError as exc:
        raise f.bad(f"{dotted}: {exc}") from None
    if claims.get("sub") != user.public_key or user.prefix != Prefix.USER:
        raise f.bad(f"{dotted}: the seed is not the user's")
    if claims.get("iss") != signer or claims["nats"].get("issuer_account") != account:
        raise f.bad(f"{dotted} is not signed by the expected key into the expected account")
    return claims


# -- broker.json ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerMaterial:
    """The operator and system account of one broker (root). Provisioning only."""

    operator: KeyPair
    operator_signing: KeyPair
    operator_jwt: str
    system_account: str
    system_signing: KeyPair
    system_jwt: str
    system_user_creds: str = field(repr=False)  # holds a seed


def save_broker(path: Path, material: BrokerMaterial, *, exclusive: bool = False) -> bool:
    """Write ``broker.json``; see the module docstring for ``exclusive`` and the return value."""
    return save_json(path, {
        "ver": VERSION,
        "operator": {
            "seed": material.operator.seed,
            "signingSeed": material.operator_signing.seed,
            "jwt": material.operator_jwt,
        },
        "system": {
            "account": material.system_account,
            "signingSeed": material.system_signing.seed,
            "jwt": material.system_jwt,
            "userCreds": material.system_user_creds,
        },
    }, exclusive=exclusive)


def load_broker(path: Path) -> BrokerMaterial:
    """Read and validate ``broker.json``.

    Raises:
        ConfigError: missing, corrupt, or the keys and JWTs do not belong together.
    """
    f = read_fields(path)
    operator = _keypair(f, "operator.seed", Prefix.OPERATOR)
    osk = _keypair(f, "operator.signingSeed", Prefix.OPERATOR)
    system = public_key_field(f, "system.account", Prefix.ACCOUNT)
    ssk = _keypair(f, "system.signingSeed", Prefix.ACCOUNT)
    op_claims = _jwt(f, "operator.jwt", subject=operator.public_key, issuer=operator.public_key)
    if osk.public_key not in op_claims["nats"].get("signing_keys", ()):
        raise f.bad("the operator JWT does not list the operator signing key")
    if op_claims["nats"].get("system_account") != system:
        raise f.bad("the operator JWT names another system account")
    _account_jwt(f, "system.jwt", system, osk.public_key, [ssk.public_key])
    _creds(f, "system.userCreds", signer=ssk.public_key, account=system)
    return BrokerMaterial(
        operator=operator, operator_signing=osk, operator_jwt=f.get("operator.jwt", str),
        system_account=system, system_signing=ssk, system_jwt=f.get("system.jwt", str),
        system_user_creds=f.get("system.userCreds", str),
    )


# -- callout.json ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SpaceMaterial:
    """What a lane holds for its space (DESIGN.md section 4, last paragraph); no operator keys.

    Attributes:
        data_callout_signing: signs the users the callout mints into the data account.
        data_service_signing: signs the service's own data-account users (stores, sessions).
        auth_signing: signs callout responses (and the callout user and sentinel).
        xkey: the space xkey that callout requests are sealed to.
        callout_creds, sentinel_creds: creds text of the two auth-account users.
    """

    space: str
    data_account: str
    data_callout_signing: KeyPair
    data_service_signing: KeyPair
    auth_account: str
    auth_signing: KeyPair
    xkey: XKeyPair
    callout_creds: str = field(repr=False)  # holds a seed
    sentinel_creds: str = field(repr=False)

    @property
    def callout_user(self) -> str:
        """The callout user's public ``U...`` key (from its creds)."""
        return _creds_subject(self.callout_creds)

    @property
    def sentinel_user(self) -> str:
        """The sentinel's public ``U...`` key: a callout request's sentinel JWT must name it."""
        return _creds_subject(self.sentinel_creds)


def _creds_subject(creds: str) -> str:
    return natsjwt.decode(parse_creds(creds)[0]).claims["sub"]


def save_space(path: Path, material: SpaceMaterial, *, exclusive: bool = False) -> bool:
    """Write ``callout.json``; see the module docstring for ``exclusive`` and the return value."""
    return save_json(path, {
        "ver": VERSION,
        "space": material.space,
        "data": {
            "account": material.data_account,
            "calloutSigningSeed": material.data_callout_signing.seed,
            "serviceSigningSeed": material.data_service_signing.seed,
        },
        "auth": {"account": material.auth_account, "signingSeed": material.auth_signing.seed},
        "xkeySeed": material.xkey.seed,
        "calloutCreds": material.callout_creds,
        "sentinelCreds": material.sentinel_creds,
    }, exclusive=exclusive)


def load_space(path: Path, space: str) -> SpaceMaterial:
    """Read and validate ``callout.json`` of ``space``.

    Raises:
        ConfigError: missing, corrupt, written for another space, or the creds are not signed
            by the auth signing key into the auth account.
    """
    f = read_fields(path)
    if f.get("space", str) != space:
        raise f.bad(f"it belongs to space {f.get('space', str)!r}, not {space!r}")
    auth = public_key_field(f, "auth.account", Prefix.ACCOUNT)
    ask = _keypair(f, "auth.signingSeed", Prefix.ACCOUNT)
    _creds(f, "calloutCreds", signer=ask.public_key, account=auth)
    sentinel = _creds(f, "sentinelCreds", signer=ask.public_key, account=auth)
    if sentinel["nats"].get("bearer_token") is not True:
        raise f.bad("the sentinel is not a bearer-token user")
    return SpaceMaterial(
        space=space,
        data_account=public_key_field(f, "data.account", Prefix.ACCOUNT),
        data_callout_signing=_keypair(f, "data.calloutSigningSeed", Prefix.ACCOUNT),
        data_service_signing=_keypair(f, "data.serviceSigningSeed", Prefix.ACCOUNT),
        auth_account=auth,
        auth_signing=ask,
        xkey=_xkey(f, "xkeySeed"),
        callout_creds=f.get("calloutCreds", str),
        sentinel_creds=f.get("sentinelCreds", str),
    )


# -- accounts.json --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AccountsRecord:
    """The provisioning record of a space: public keys and the current account JWTs.

    Everything needed to re-sign both account JWTs with the operator signing key.
    """

    space: str
    data_account: str
    data_signing_keys: tuple[str, ...]  # (callout SK, service SK)
    auth_account: str
    auth_signing_key: str
    callout_user: str
    xkey: str
    data_jwt: str
    auth_jwt: str


def save_accounts(path: Path, record: AccountsRecord, *, exclusive: bool = False) -> bool:
    """Write ``accounts.json``; see the module docstring for ``exclusive``."""
    return save_json(path, {
        "ver": VERSION,
        "space": record.space,
        "data": {
            "account": record.data_account,
            "signingKeys": list(record.data_signing_keys),
            "jwt": record.data_jwt,
        },
        "auth": {
            "account": record.auth_account,
            "signingKey": record.auth_signing_key,
            "calloutUser": record.callout_user,
            "xkey": record.xkey,
            "jwt": record.auth_jwt,
        },
    }, exclusive=exclusive)


def load_accounts(path: Path, space: str, *, operator_signing_key: str) -> AccountsRecord:
    """Read and validate ``accounts.json`` of ``space``.

    Raises:
        ConfigError: missing, corrupt, another space's, or a JWT not issued by
            ``operator_signing_key`` for the recorded account and signing keys.
    """
    f = read_fields(path)
    if f.get("space", str) != space:
        raise f.bad(f"it belongs to space {f.get('space', str)!r}, not {space!r}")
    data = public_key_field(f, "data.account", Prefix.ACCOUNT)
    data_sks = tuple(public_key_field(f, f"data.signingKeys.{i}", Prefix.ACCOUNT) for i in range(2))
    if len(f.get("data.signingKeys", list)) != 2:
        raise f.bad("data.signingKeys must hold the callout and the service signing keys")
    auth = public_key_field(f, "auth.account", Prefix.ACCOUNT)
    ask = public_key_field(f, "auth.signingKey", Prefix.ACCOUNT)
    _account_jwt(f, "data.jwt", data, operator_signing_key, list(data_sks))
    _account_jwt(f, "auth.jwt", auth, operator_signing_key, [ask])
    return AccountsRecord(
        space=space, data_account=data, data_signing_keys=data_sks, auth_account=auth,
        auth_signing_key=ask, callout_user=public_key_field(f, "auth.calloutUser", Prefix.USER),
        xkey=public_key_field(f, "auth.xkey", Prefix.CURVE),
        data_jwt=f.get("data.jwt", str), auth_jwt=f.get("auth.jwt", str),
    )
