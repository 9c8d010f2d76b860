"""Issue 14 item 1 on a real nats-server: nothing is minted, and no row kept, after the broker's
timeout (spec "Callout deadlines").

The stack is conftest's ``stack`` (``authorization { timeout: 2 }``). The lane is paused as a
SIGSTOPped or starved process is: its one thread (trio, with nats-py's asyncio loop on it) is
held in ``time.sleep`` while a client connects from a thread of its own, so the broker's request
waits in the lane's socket. The client starts 0.05 s into a second ``k``, so the broker stamps
``iat = k`` (``k + 1`` on a loaded machine), ``exp = iat + 2`` and gives up at about ``iat +
2.05``; the lane is held until the client's connect has failed, so it reads the request after
that and before ``exp + 1``. Its receipt is fresh, so a deadline counted from
receipt alone mints it and keeps its issuance row (what happened before, in the issue's words
"the broker logged an authentication error for cid 114, then the service outcome=minted cid=114
and kept its row"); counted from the broker's stamp too, it is past ``exp - 0.25`` when read: the
timeout denial at once, no bearer check, no ledger read, no row.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
import threading
import time

import nats
import pytest
import trio

from cotal_trio.core.creds import parse_creds
from cotal_trio.core.nkeys import KeyPair
from cotal_trio.core.plane import plane_bucket
from cotal_trio.natsio import kv_keys
from tests.support.stack import SPACE, Stack, client
from tests.support.issuance import callout_lines, store_reader

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

CEILING_S = 30


def _connect_from_a_thread(stack: Stack, bearer: str, outcome: list[str]) -> None:
    """Connect as a user-mode client on an asyncio loop of this thread's own; note the outcome."""
    jwt, seed = parse_creds(stack.sentinel_creds())
    key = KeyPair.from_seed(seed)

    async def connect() -> None:
        nonce = "ibx" + secrets.token_hex(8)
        try:
            conn = await nats.connect(
                stack.info.server_url, user_jwt_cb=jwt.encode,
                signature_cb=lambda nonce: base64.b64encode(key.sign(nonce.encode())), token=bearer, name=nonce,
                inbox_prefix=f"_INBOX_{nonce}", allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5,
            )
        except Exception as exc:  # the broker refused it (its own timeout): what the test expects
            outcome.append(f"refused: {type(exc).__name__}")
            return
        outcome.append("connected")
        await conn.close()

    asyncio.run(connect())


async def test_a_request_read_after_the_brokers_timeout_is_not_minted_and_leaves_no_row(stack, caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")
    stack.grant("alice", "cli")
    bearer = await stack.bearer("alice", "cli")
    with trio.fail_after(CEILING_S):
        async with client(stack, bearer):  # the lane answers normally first (and the skew is learned)
            pass
        outcome: list[str] = []
        second = int(time.time()) + 1
        await trio.sleep(second + 0.05 - time.time())
        thread = threading.Thread(target=_connect_from_a_thread, args=(stack, bearer, outcome))
        thread.start()
        # The lane's thread is held (a paused process) until the broker has given up on the client,
        # whenever it sent its request: a clock second counted from here would be wrong whenever the
        # client's connect is itself late (a loaded machine: iat = k + 1, the read in time, minted).
        thread.join(CEILING_S / 2)
        read_at = time.time()
        await trio.sleep(0.5)  # the lane has read and answered the request by now
        lines = callout_lines(caplog)
        async with store_reader(stack.space_paths, stack.info.server_url, SPACE) as conn:
            keys = await kv_keys(conn, plane_bucket(SPACE), prefix="natkey.")
    assert outcome and outcome[0].startswith("refused"), outcome  # the broker gave up before the read
    assert read_at < second + 1 + 2 + 1, "the read came after exp + 1 even for the latest iat (the dropped case)"
    first, late = lines
    assert first["outcome"] == "minted"
    assert (late["outcome"], late.get("at"), late["owner"], late["ledger_ms"]) == ("timeout", "queue", "-", 0)
    assert keys == [f"natkey.{first['owner']}.{first['actor']}.{first['req']}"]  # the late request left no row
