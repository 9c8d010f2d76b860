"""Provisioning: the operator, the system account, and each space's accounts and users.

Layout (DESIGN.md section 4; reference/nats-operator-mode.md sections 3, 4 and 13)::

    operator (identity key signs only the operator JWT; strict_signing_key_usage)
     ├─ operator signing key        signs every account JWT and CLAIMS.DELETE requests
     ├─ system account + SK         preloaded; its user (signed by the SK) is provisioning's
     └─ per space S:
         ├─ data account "S"        JetStream, limits -1, signing keys [callout SK, service SK]
         └─ auth account "AUTH_S"   no JetStream, one SK, authorization {auth_users: [callout],
              │                     allowed_accounts: [S], xkey}
              ├─ user "callout"     sub $SYS.REQ.USER.AUTH, pub deny >, resp {max: 1}
              └─ user "sentinel"    bearer token, pub and sub deny >

Keys are generated once and never again: ``ensure_*`` loads what exists and only creates what is
missing, each file created exclusively (a racing provisioner loads the winner's file). Claim
assembly is synchronous and takes ``iat`` (unix seconds) as an argument; the ``ensure_*``
functions do blocking file I/O (call them through ``trio.to_thread.run_sync`` from trio).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

from cotal_trio.core import natsjwt
from cotal_trio.core.bearer import space_issuer
from cotal_trio.core.creds import format_creds
from cotal_trio.core.errors import ConfigError
from cotal_trio.core.identity import is_space
from cotal_trio.core.jose import IssuerKey
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.core.xkeys import XKeyPair
from cotal_trio.state.credentials import records_dir
from cotal_trio.state import (
    OWNER_SECRET_BYTES,
    AccountsRecord,
    BrokerMaterial,
    IssuerKeys,
    RootPaths,
    SpaceMaterial,
    SpacePaths,
    atomic_create,
    ensure_dir,
    load_accounts,
    load_broker,
    load_issuer_keys,
    load_owner_secret,
    load_space,
    save_accounts,
    save_broker,
    save_issuer_keys,
    save_owner_secret,
    save_space,
)

__all__ = [
    "AUTH_REQUEST_SUBJECT",
    "auth_account_name",
    "build_root",
    "build_space",
    "delete_accounts_claim",
    "ensure_root",
    "ensure_space",
    "load_space_accounts",
    "mint_service_user",
    "resign_space",
    "sign_space_accounts",
]

OPERATOR_NAME = "cotal"
SYSTEM_ACCOUNT_NAME = "SYS"
SYSTEM_USER_NAME = "cotal-provision"
CALLOUT_USER_NAME = "callout"
SENTINEL_USER_NAME = "sentinel"
AUTH_REQUEST_SUBJECT = "$SYS.REQ.USER.AUTH"
DENY_ALL = {"deny": [">"]}
ISSUER_SEED_BYTES = 32


def auth_account_name(space: str) -> str:
    """The auth account's JWT name: ``AUTH_<space>``."""
    return f"AUTH_{space}"


def _user_creds(
    signer: KeyPair, account: str, *, name: str, permissions: Mapping[str, Any], iat: int,
    **extra: Any,
) -> str:
    """Creds text of a fresh user in ``account``, signed by that account's signing key."""
    user = KeyPair.generate(Prefix.USER)
    claims = natsjwt.user_claims(
        user=user.public_key, name=name, issuer_account=account, permissions=permissions, **extra
    )
    return format_creds(natsjwt.encode(claims, signer, iat=iat), user.seed)


# -- the root --------------------------------------------------------------------------------


def build_root(*, iat: int) -> BrokerMaterial:
    """Fresh operator and system material (pure apart from drawing keys from the OS CSPRNG).

    The operator JWT is self-signed by the operator identity key; the system account JWT is
    signed by the operator signing key (strict mode: identity keys sign nothing else, pitfall
    P2); the system user by the system signing key. The system identity seed is discarded.
    """
    operator, osk = KeyPair.generate(Prefix.OPERATOR), KeyPair.generate(Prefix.OPERATOR)
    system, ssk = KeyPair.generate(Prefix.ACCOUNT), KeyPair.generate(Prefix.ACCOUNT)
    operator_jwt = natsjwt.encode(natsjwt.operator_claims(
        operator=operator.public_key, name=OPERATOR_NAME, signing_keys=[osk.public_key],
        system_account=system.public_key,
    ), operator, iat=iat)
    system_jwt = natsjwt.encode(natsjwt.account_claims(
        account=system.public_key, name=SYSTEM_ACCOUNT_NAME, signing_keys=[ssk.public_key],
    ), osk, iat=iat)
    creds = _user_creds(ssk, system.public_key, name=SYSTEM_USER_NAME, permissions={}, iat=iat)
    return BrokerMaterial(
        operator=operator, operator_signing=osk, operator_jwt=operator_jwt,
        system_account=system.public_key, system_signing=ssk, system_jwt=system_jwt,
        system_user_creds=creds,
    )


def ensure_root(paths: RootPaths, *, iat: int) -> BrokerMaterial:
    """The root's broker material: loaded from ``broker.json``, or created on first run.

    Raises:
        ConfigError: ``broker.json`` exists but is corrupt (it is never overwritten), or the
            root cannot be created.
    """
    ensure_dir(paths.root)
    if not paths.broker_json.exists():
        material = build_root(iat=iat)
        if save_broker(paths.broker_json, material, exclusive=True):
            return material
    return load_broker(paths.broker_json)


# -- a space ---------------------------------------------------------------------------------


def build_space(space: str, *, iat: int) -> SpaceMaterial:
    """Fresh keys and auth-account users for ``space`` (nothing signed by the operator here).

    Account identity seeds are discarded: only their public keys are kept (see
    :mod:`cotal_trio.state.material`). The callout and sentinel users never expire; account
    JWTs are signed separately by :func:`sign_space_accounts`.

    Raises:
        ConfigError: ``space`` is not a space name.
    """
    _check_space(space)
    data, auth = KeyPair.generate(Prefix.ACCOUNT), KeyPair.generate(Prefix.ACCOUNT)
    ask = KeyPair.generate(Prefix.ACCOUNT)
    callout = _user_creds(
        ask, auth.public_key, name=CALLOUT_USER_NAME, iat=iat, resp_max=1,
        permissions={"pub": DENY_ALL, "sub": {"allow": [AUTH_REQUEST_SUBJECT]}},
    )
    sentinel = _user_creds(
        ask, auth.public_key, name=SENTINEL_USER_NAME, iat=iat, bearer_token=True,
        permissions={"pub": DENY_ALL, "sub": DENY_ALL},
    )
    return SpaceMaterial(
        space=space, data_account=data.public_key,
        data_callout_signing=KeyPair.generate(Prefix.ACCOUNT),
        data_service_signing=KeyPair.generate(Prefix.ACCOUNT),
        auth_account=auth.public_key, auth_signing=ask, xkey=XKeyPair.generate(),
        callout_creds=callout, sentinel_creds=sentinel,
    )


def _check_space(space: str) -> None:
    if not is_space(space):
        raise ConfigError(
            f"{space!r} is not a space name - use 1 to 64 letters, digits, _ and -"
        )


def _unsigned_record(material: SpaceMaterial) -> AccountsRecord:
    return AccountsRecord(
        space=material.space, data_account=material.data_account,
        data_signing_keys=(material.data_callout_signing.public_key,
                           material.data_service_signing.public_key),
        auth_account=material.auth_account, auth_signing_key=material.auth_signing.public_key,
        callout_user=material.callout_user, xkey=material.xkey.public_key, data_jwt="", auth_jwt="",
    )


def sign_space_accounts(
    record: AccountsRecord, broker: BrokerMaterial, *, iat: int, revocations: Mapping[str, int] | None = None
) -> tuple[str, str]:
    """Sign the space's data and auth account JWTs with the operator signing key.

    Reads only the public keys of ``record`` (its JWT fields are ignored). Used at creation and
    when a deleted space is added again: a deleted account ignores an identical JWT (pitfall
    P7), so pass an ``iat`` later than the previous JWTs' (see :func:`resign_space`).

    Args:
        revocations: the data account's ``nats.revocations`` (user key -> unix seconds), kept
            across a re-sign (``cotal auth revoke-credential`` writes them); None or empty: none.

    Returns:
        ``(data_jwt, auth_jwt)``; push them in that order.
    """
    data = natsjwt.account_claims(
        account=record.data_account, name=record.space,
        signing_keys=record.data_signing_keys, jetstream=True,
    )
    if revocations:
        data["nats"]["revocations"] = dict(revocations)
    auth = natsjwt.account_claims(
        account=record.auth_account, name=auth_account_name(record.space),
        signing_keys=[record.auth_signing_key],
        authorization={"auth_users": [record.callout_user],
                       "allowed_accounts": [record.data_account], "xkey": record.xkey},
    )
    osk = broker.operator_signing
    return natsjwt.encode(data, osk, iat=iat), natsjwt.encode(auth, osk, iat=iat)


def _signed_record(
    record: AccountsRecord, broker: BrokerMaterial, iat: int, revocations: Mapping[str, int] | None = None
) -> AccountsRecord:
    data_jwt, auth_jwt = sign_space_accounts(record, broker, iat=iat, revocations=revocations)
    return dataclasses.replace(record, data_jwt=data_jwt, auth_jwt=auth_jwt)


def load_space_accounts(paths: RootPaths, broker: BrokerMaterial, space: str) -> AccountsRecord:
    """The space's ``accounts.json``, validated against the operator signing key.

    Raises:
        ConfigError: missing or corrupt.
    """
    return load_accounts(
        paths.space(space).accounts_json, space, operator_signing_key=broker.operator_signing.public_key
    )


def resign_space(paths: RootPaths, broker: BrokerMaterial, space: str, *, iat: int) -> AccountsRecord:
    """Re-sign both account JWTs and save them in ``accounts.json``; returns the new record.

    The ``iat`` used is at least one second past the recorded JWTs', so the new JWTs always
    differ from the old ones (pitfall P7) even within the same second. The data account's
    ``revocations`` are carried over.

    Raises:
        ConfigError: ``accounts.json`` missing or corrupt.
    """
    record = load_space_accounts(paths, broker, space)
    previous = max(natsjwt.decode(jwt).claims.get("iat", 0) for jwt in (record.data_jwt, record.auth_jwt))
    # A re-sign keeps the data account's revocations: a revoked credential stays refused.
    revoked = natsjwt.decode(record.data_jwt).claims.get("nats", {}).get("revocations")
    fresh = _signed_record(record, broker, max(iat, int(previous) + 1), revoked if isinstance(revoked, dict) else None)
    save_accounts(paths.space(space).accounts_json, fresh)
    return fresh


def _ensure_material(sp: SpacePaths, space: str, iat: int) -> SpaceMaterial:
    if not sp.callout_json.exists() and sp.accounts_json.exists():
        # The accounts were signed for keys that are gone: new keys would never match them.
        raise ConfigError(
            f"{sp.callout_json} is missing but {sp.accounts_json} exists - restore callout.json "
            "from a backup, or move the space folder aside and add the space again"
        )
    if not sp.callout_json.exists():
        material = build_space(space, iat=iat)
        if save_space(sp.callout_json, material, exclusive=True):
            return material
    return load_space(sp.callout_json, space)


def _ensure_accounts(sp: SpacePaths, broker: BrokerMaterial, material: SpaceMaterial, iat: int) -> None:
    expected = _unsigned_record(material)
    if not sp.accounts_json.exists():
        save_accounts(sp.accounts_json, _signed_record(expected, broker, iat), exclusive=True)
    record = load_accounts(sp.accounts_json, material.space,
                           operator_signing_key=broker.operator_signing.public_key)
    if dataclasses.replace(record, data_jwt="", auth_jwt="") != expected:
        raise ConfigError(
            f"{sp.accounts_json} does not match {sp.callout_json} - restore both from the same "
            "backup or move the space folder aside and add the space again"
        )


def _ensure_issuer(sp: SpacePaths, space: str) -> None:
    if not sp.issuer_json.exists():
        key = IssuerKey.generate(secrets.token_bytes(ISSUER_SEED_BYTES))
        keys = IssuerKeys(issuer=space_issuer(space), active_kid=key.kid, keys=(key,))
        if save_issuer_keys(sp.issuer_json, keys, exclusive=True):
            return
    load_issuer_keys(sp.issuer_json, space)


def _ensure_owner_secret(sp: SpacePaths) -> None:
    if not sp.owner_secret_json.exists():
        # Every owner id is derived from this secret: a new one under existing rows re-keys them all.
        for folder in (sp.actors_dir, sp.managed_dir, records_dir(sp)):
            if folder.is_dir() and any(folder.iterdir()):
                raise ConfigError(
                    f"{sp.owner_secret_json} is missing but {folder} holds rows keyed by it - put it back (from a"
                    " backup, or from the .deprovision-* folder an interrupted reset left; a new one would give"
                    " every owner of the space a new id), or move the space folder aside and add the space again"
                )
        if save_owner_secret(sp.owner_secret_json, secrets.token_bytes(OWNER_SECRET_BYTES), exclusive=True):
            return
    load_owner_secret(sp.owner_secret_json)


def ensure_space(paths: RootPaths, broker: BrokerMaterial, space: str, *, iat: int) -> SpaceMaterial:
    """The space's lane material, creating on first run whatever file is missing.

    Writes (each only if missing, 0600, in a 0700 folder): ``callout.json`` (the keys; the
    commit point), ``accounts.json`` (account pubs and JWTs signed at ``iat``), ``issuer.json``,
    ``owner-secret.json`` and ``sentinel.creds``. Existing files are loaded and validated,
    never regenerated. Nothing is pushed to a broker here.

    Raises:
        ConfigError: an invalid space name, or a corrupt or mismatched file (left untouched);
            ``callout.json`` missing beside ``accounts.json``; ``owner-secret.json`` missing while
            ledger rows or credential records keyed by it exist (spec "Offline secret inventory":
            an interrupted reset moves it aside before ``callout.json``).
    """
    _check_space(space)
    sp = paths.space(space)
    ensure_dir(sp.dir)
    material = _ensure_material(sp, space, iat)
    _ensure_accounts(sp, broker, material, iat)
    _ensure_issuer(sp, space)
    _ensure_owner_secret(sp)
    atomic_create(sp.sentinel_creds, material.sentinel_creds.encode())
    return material


# -- broker requests and service users ---------------------------------------------------------


def delete_accounts_claim(broker: BrokerMaterial, account_pubs: Iterable[str], *, iat: int) -> str:
    """The generic JWT for ``$SYS.REQ.CLAIMS.DELETE``: ``sub == iss ==`` the operator signing
    key (strict mode refuses the identity key), ``nats.accounts`` = ``account_pubs``."""
    osk = broker.operator_signing
    claims = natsjwt.generic_claims(subject=osk.public_key, data={"accounts": list(account_pubs)})
    return natsjwt.encode(claims, osk, iat=iat)


def mint_service_user(
    material: SpaceMaterial, *, name: str, permissions: Mapping[str, Any], iat: int, exp: int | None
) -> str:
    """Creds text of a fresh data-account user signed by the space's SERVICE signing key.

    Args:
        name: the user JWT ``name`` (shows in the broker's monitoring).
        permissions: ``{"pub": {"allow"|"deny": [...]}, "sub": {...}}``; an empty mapping means
            no restrictions.
        iat, exp: unix seconds; ``exp`` None for a user that never expires.
    """
    return _user_creds(
        material.data_service_signing, material.data_account, name=name,
        permissions=permissions, iat=iat, exp=exp,
    )
