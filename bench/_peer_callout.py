#!/usr/bin/env python3
"""The allow-all Python peer of bench/callout.py: PyPI ``nats-callout`` 0.1.1 answering one auth
account's callout (issue 14 item 5). Not part of the product; needs the ``bench`` extra.

Usage (bench/callout.py starts it)::

    python bench/_peer_callout.py <nats url> <callout user creds file> <signing key seed file> <auth account>

It connects as the auth account's callout user, answers every ``$SYS.REQ.USER.AUTH`` request
with a user of the auth account allowed everything (the library verifies the broker's signature
and signs the response and the user with the account's signing key, as ours does; no xkey, no
bearer check, no ledger, no store), prints
``ready`` once subscribed, and runs until SIGINT/SIGTERM. Only 127.0.0.1 is used by the bench.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import nats
import nkeys
from nats_callout import AdaptixEncoder, BaseAuthCalloutService
from nats_callout.claims import AuthRequestData, UserData
from nats_callout.claims.user import PubSubPermissions

SUBJECT = "$SYS.REQ.USER.AUTH"


class AllowAll(BaseAuthCalloutService):
    """Every connect gets a user of the auth account that may publish and subscribe anything."""

    def __init__(self, seed: bytes, account: str) -> None:
        self.encoder = AdaptixEncoder()
        # 0.1.1's encoder reads these attributes but its constructor sets none of them; and the
        # pyjwt it pulls in hands json_loads the payload already decoded.
        self.encoder.kp = nkeys.from_seed(seed)
        self.encoder.json_loads = lambda value: value if isinstance(value, dict) else json.loads(value)
        self.encoder.json_dumps = json.dumps
        self.nkey_seed = seed
        self.account = account

    async def _handle_auth_request_data(self, auth_request_data: AuthRequestData) -> UserData:
        return UserData(
            pub=PubSubPermissions(allow=[">"], deny=[]), sub=PubSubPermissions(allow=[">"], deny=[]),
            version=auth_request_data.version, tags=auth_request_data.tags, issuer_account=self.account,
        )


async def main(url: str, creds: Path, seed: Path, account: str) -> None:
    service = AllowAll(seed.read_bytes().strip(), account)
    nc = await nats.connect(url, user_credentials=str(creds), name="bench-peer-callout", allow_reconnect=False)

    async def answer(msg) -> None:  # nats-py Msg
        await msg.respond((await service(msg.data)).encode())

    await nc.subscribe(SUBJECT, cb=answer)
    await nc.flush()
    print("ready", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await nc.close()


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]))
