"""Pushing and deleting account JWTs on a running broker, over a system-account connection.

Subjects and replies (reference/nats-operator-mode.md section 5):

==========================================  ==================  ===============================
subject                                     payload             reply
==========================================  ==================  ===============================
``$SYS.REQ.CLAIMS.UPDATE``                  account JWT         ``{"data": {"code": 200, ...}}``
                                                                or ``{"error": {"code", "description"}}``
``$SYS.REQ.ACCOUNT.<pub>.CLAIMS.LOOKUP``    empty               the stored JWT
``$SYS.REQ.CLAIMS.DELETE``                  generic JWT signed  ``{"data": {"code": 200, ...}}``
                                            by the operator SK
==========================================  ==================  ===============================

A 200 on update proves only that the JWT was well formed: the broker stores JWTs of an untrusted
operator too (pitfall P10; LOOKUP then returns the untrusted JWT as well, measured on 2.15.1), and
such a push replaces the good JWT in the resolver. So before pushing, each JWT's signature and
issuer are checked against the signing keys of the operators the broker trusts (from
``$SYS.REQ.SERVER.PING.VARZ``, ``trusted_operators_claim``); after pushing, it is read back with
LOOKUP and compared (catches a concurrent overwrite or a broker that did not store it).

All functions are trio-flavoured and bounded by the caller's deadline (STYLE 12): wrap them in
``trio.fail_after``. Cancellation: a push may or may not have reached the broker; pushing the
same JWTs again is harmless.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from cotal_trio import natsio
from cotal_trio.core import natsjwt
from cotal_trio.core.errors import CodecError, ConfigError, Unavailable
from cotal_trio.state import BrokerMaterial

__all__ = [
    "CLAIMS_DELETE",
    "CLAIMS_UPDATE",
    "delete_accounts",
    "lookup_subject",
    "open_system_connection",
    "push_accounts",
    "trusted_account_signers",
]

CLAIMS_UPDATE = "$SYS.REQ.CLAIMS.UPDATE"
CLAIMS_DELETE = "$SYS.REQ.CLAIMS.DELETE"
VARZ = "$SYS.REQ.SERVER.PING.VARZ"
PROVISION_CONNECTION_NAME = "cotal:provision"
HTTP_OK = 200


def lookup_subject(account: str) -> str:
    """``$SYS.REQ.ACCOUNT.<pub>.CLAIMS.LOOKUP``."""
    return f"$SYS.REQ.ACCOUNT.{account}.CLAIMS.LOOKUP"


def _check_reply(what: str, data: bytes) -> dict[str, Any]:
    """The ``data`` object of a successful system reply.

    Raises:
        ConfigError: the broker refused (its ``error.description`` is quoted).
        Unavailable: the reply is not the documented JSON shape.
    """
    try:
        reply = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise Unavailable(f"{what}: the broker's reply is not JSON") from None
    if not isinstance(reply, dict):
        raise Unavailable(f"{what}: the broker's reply is not a JSON object")
    body = reply.get("data")
    if isinstance(body, dict) and body.get("code") == HTTP_OK:
        return body
    error = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    message = error.get("description") or error.get("message") or json.dumps(reply)[:300]
    raise ConfigError(
        f"{what} was refused by the broker: {message} - check the broker's log, and that the "
        "root is the one the broker was started from"
    )


def _signers_of(operator: object) -> set[str]:
    """The keys that may sign account JWTs for one trusted operator claim (strict: SKs only)."""
    if not isinstance(operator, dict) or not isinstance(operator.get("nats"), dict):
        return set()
    nats = operator["nats"]
    keys = {key for key in nats.get("signing_keys") or () if isinstance(key, str)}
    if not nats.get("strict_signing_key_usage") and isinstance(operator.get("sub"), str):
        keys.add(operator["sub"])
    return keys


async def trusted_account_signers(conn: natsio.Connection) -> frozenset[str]:
    """The public keys the broker accepts as account JWT issuers, from its VARZ.

    Raises:
        Unavailable: no answer or an unreadable one.
    """
    reply = await conn.request(VARZ, b"")
    try:
        varz = json.loads(reply.data)["data"]
        operators = varz.get("trusted_operators_claim") or []
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise Unavailable("the broker's VARZ reply is unreadable") from None
    return frozenset().union(*(_signers_of(op) for op in operators))


def _trusted_account(jwt: str, signers: frozenset[str]) -> str:
    """The account a JWT is for, once it verifies and is issued by a trusted signer.

    Raises:
        ConfigError: malformed, not an account JWT, or not signed by a trusted signer.
    """
    try:
        claims = natsjwt.verify(jwt)
    except CodecError as exc:
        raise ConfigError(f"cannot push a malformed account JWT ({exc})") from None
    account = claims.get("sub")
    if not isinstance(account, str) or claims["nats"].get("type") != "account":
        raise ConfigError("cannot push a JWT that is not an account JWT")
    if claims.get("iss") not in signers:
        raise ConfigError(
            f"account {account} is signed by {claims.get('iss')}, which is not a signing key of "
            "the operator this broker trusts - the root's broker.json does not belong to this "
            "broker; point --root at the root the broker was started from"
        )
    return account


async def push_accounts(conn: natsio.Connection, jwts: Sequence[str]) -> None:
    """Push each account JWT in order, and read each one back.

    Every JWT is checked against the broker's trusted operators before anything is pushed, so
    an untrusted JWT never replaces a good one.

    Args:
        conn: a system-account connection (:func:`open_system_connection`).
        jwts: account JWTs; for a space, the data account then the auth account.

    Raises:
        ConfigError: a JWT is malformed, not an account JWT, or not signed by a signing key of
            an operator the broker trusts (nothing pushed); or the broker refused the update
            (its message is quoted).
        Unavailable: the broker did not answer, answered garbage, or LOOKUP returned another
            JWT than the one pushed (overwritten by someone else, or not stored).
    """
    signers = await trusted_account_signers(conn)
    accounts = [_trusted_account(jwt, signers) for jwt in jwts]
    for jwt, account in zip(jwts, accounts, strict=True):
        reply = await conn.request(CLAIMS_UPDATE, jwt.encode())
        _check_reply(f"pushing account {account}", reply.data)
        stored = await conn.request(lookup_subject(account), b"")
        if stored.data.strip() != jwt.encode():
            raise Unavailable(
                f"account {account} was pushed but the broker holds another JWT for it - another "
                "provisioner may have pushed in between; push again"
            )


async def delete_accounts(conn: natsio.Connection, claim_jwt: str) -> None:
    """Send a ``$SYS.REQ.CLAIMS.DELETE`` request (from
    :func:`cotal_trio.broker.provision.delete_accounts_claim`).

    The broker drops the accounts' clients at once; their JetStream data stays on disk
    (pitfall P8), and re-adding needs freshly signed JWTs (pitfall P7).

    Raises:
        ConfigError: the broker refused (for example, a claim not signed by the operator
            signing key, or a broker without ``allow_delete``).
        Unavailable: no answer or an unreadable one.
    """
    reply = await conn.request(CLAIMS_DELETE, claim_jwt.encode())
    _check_reply("deleting accounts", reply.data)


@asynccontextmanager
async def open_system_connection(url: str, broker: BrokerMaterial) -> AsyncIterator[natsio.Connection]:
    """Trio async CM: a non-reconnecting connection as the root's system user.

    Must be entered inside :func:`cotal_trio.natsio.open_loop`. Raises as
    :func:`cotal_trio.natsio.open_connection` (``Unavailable`` when refused or unreachable).
    """
    async with natsio.open_connection(
        url, creds=broker.system_user_creds, name=PROVISION_CONNECTION_NAME, reconnect=False
    ) as conn:
        yield conn
