"""Provenance on a live callout: hand-made requests, the server keys that seal them and their answers."""

from __future__ import annotations

import time

import trio

from cotal_trio.core import natsjwt
from cotal_trio.core.callout import SERVER_XKEY_HEADER, CalloutKeys
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.core.xkeys import XKeyPair
from cotal_trio.lane.callout.responder import CALLOUT_SUBJECT

SERVER = KeyPair.generate(Prefix.SERVER)
SERVER_X = XKeyPair.generate()
KEYS = CalloutKeys(
    space="alpha",
    auth_account=KeyPair.generate(Prefix.ACCOUNT).public_key,
    data_account=KeyPair.generate(Prefix.ACCOUNT).public_key,
    xkey=XKeyPair.generate(),
    auth_signer=KeyPair.generate(Prefix.ACCOUNT),
    data_signer=KeyPair.generate(Prefix.ACCOUNT),
)


def _request(signer: KeyPair = SERVER, *, seal: bool = True) -> tuple[bytes, dict[str, str]]:
    now = int(time.time())
    claims = {
        "aud": natsjwt.AUTH_REQUEST_AUDIENCE, "sub": KEYS.auth_account, "exp": now + 2,
        "nats": {
            "type": "authorization_request", "version": 2,
            "server_id": {"id": SERVER.public_key, "xkey": SERVER_X.public_key},
            "user_nkey": KeyPair.generate(Prefix.USER).public_key,
            "client_info": {"host": "127.0.0.1", "id": 5},
            "connect_opts": {"name": "ibx0123456789"},
        },
    }
    token = natsjwt.encode(claims, signer, iat=now).encode()
    headers = {SERVER_XKEY_HEADER: SERVER_X.public_key}
    return (SERVER_X.seal(token, KEYS.xkey.public_key), headers) if seal else (token, headers)


async def _ask(conn, payload: bytes, headers: dict[str, str]) -> bytes | None:
    with trio.move_on_after(0.5):
        return (await conn.request(CALLOUT_SUBJECT, payload, headers=headers)).data
    return None


async def _no_rows(owner: str, actor: str):
    return None, None
