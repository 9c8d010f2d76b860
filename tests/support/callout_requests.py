"""A callout request and its parts, as the core callout tests build them: keys, claims, sealed
requests, rows, bearers, and a NATS JWT validly signed over any claims text."""

from __future__ import annotations

import base64
import json

from cotal_trio.core import natsjwt
from cotal_trio.core.bearer import BearerGrant, BearerVerifier, issue_bearer
from cotal_trio.core.callout import SERVER_XKEY_HEADER, CalloutKeys
from cotal_trio.core.identity import derive_owner
from cotal_trio.core.jose import BearerKeySet, IssuerKey
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.core.xkeys import XKeyPair

NOW = 1_800_000_000
SPACE = "alpha"
OWNER = derive_owner(bytes(32) + b"x", "https://idp.example", "alice")
UID = "a" * 26


def _key(prefix, n):
    return KeyPair.from_raw(prefix, bytes([n]) * 32)


SERVER, OTHER_SERVER = _key(Prefix.SERVER, 1), _key(Prefix.SERVER, 2)
SERVER_X = XKeyPair.from_raw(bytes([3]) * 32)
KEYS = CalloutKeys(
    space=SPACE,
    auth_account=_key(Prefix.ACCOUNT, 4).public_key,
    data_account=_key(Prefix.ACCOUNT, 5).public_key,
    xkey=XKeyPair.from_raw(bytes([6]) * 32),
    auth_signer=_key(Prefix.ACCOUNT, 7),
    data_signer=_key(Prefix.ACCOUNT, 8),
)
USER_NKEY = _key(Prefix.USER, 9).public_key
ISSUER = IssuerKey.generate(bytes([10]) * 32)
VERIFIER = BearerVerifier(BearerKeySet.from_keys([ISSUER]))


def _claims(**changes):
    nats = {
        "type": "authorization_request", "version": 2,
        "server_id": {"id": SERVER.public_key, "xkey": SERVER_X.public_key, "name": "n"},
        "user_nkey": USER_NKEY,
        "client_info": {"host": "127.0.0.1", "id": 42},
        "connect_opts": {"auth_token": "tok", "name": "ibx0123456789"},
    }
    claims = {"aud": natsjwt.AUTH_REQUEST_AUDIENCE, "sub": KEYS.auth_account, "exp": NOW + 2, "nats": nats}
    claims.update(changes)
    return claims


def _sealed(claims=None, *, signer=SERVER, iat=NOW):
    token = natsjwt.encode(claims or _claims(), signer, iat=iat).encode()
    return SERVER_X.seal(token, KEYS.xkey.public_key), {SERVER_XKEY_HEADER: SERVER_X.public_key}


def _row(**changes):
    fields = dict(
        kind=LedgerKind.INTERACTIVE, owner=OWNER, actor="cli", scope=("spawn",),
        allow_subscribe=("team.>",), allow_publish=("team.news",), role=None, parent=None,
        label=None, token_hash=None, lifecycle_uid=UID, granted_at="2026-11-29T10:00:00Z",
    )
    fields.update(changes)
    return LedgerRow(**fields)


def _bearer(scope=("spawn",), uid=UID):
    token, _ = issue_bearer(BearerGrant(owner=OWNER, actor="cli", scope=scope, lifecycle_uid=uid), key=ISSUER, space=SPACE, now=NOW, ttl_s=600)
    return token


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def signed_with(signer: KeyPair, claims_text: str | bytes, *, header: str | bytes | None = None) -> str:
    """A compact NATS JWT over any claims text (lone surrogates kept), validly signed by ``signer``."""
    raw = claims_text.encode("utf-8", "surrogatepass") if isinstance(claims_text, str) else claims_text
    head = _b64(json.dumps(natsjwt.HEADER).encode()) if header is None else _b64(
        header.encode() if isinstance(header, str) else header
    )
    signing_input = f"{head}.{_b64(raw)}"
    return f"{signing_input}.{_b64(signer.sign(signing_input.encode()))}"
