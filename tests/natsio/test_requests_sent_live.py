"""The hand-made halves of a batch of requests (issue 14 item 3), on a real nats-server:
``Connection.requests_sent``, ``js_publishes_sent`` and ``IssuedStores.writes_sent``.

The callout hands its issued-authority writes to the issuer session and awaits their acks later
(lane/callout/responder.py ``_issue``); these halves must release their reply slots however the block
ends, drop a reply that arrives after, and give a session that cannot send an Unavailable per
write instead of raising (a connect then gets no rows, never a refusal).
"""

from __future__ import annotations

import pytest
import trio

from cotal_trio.core.errors import Unavailable
from cotal_trio.stores.issued import IssuedStores
from cotal_trio.natsio import Message, js_publishes_sent, open_connection, open_loop

pytestmark = pytest.mark.broker

CEILING_S = 20


async def test_a_cancelled_block_releases_its_slots_and_a_late_reply_is_dropped(plain_broker: str) -> None:
    with trio.fail_after(CEILING_S):
        async with open_loop(), open_connection(plain_broker) as responder, open_connection(plain_broker) as conn:
            held: list[Message] = []
            await responder.subscribe("slow.*", on_message=held.append)  # answers nothing, yet
            await responder.flush()
            with trio.move_on_after(0.3) as waited:
                async with conn.requests_sent([("slow.1", b"", None), ("slow.2", b"", None)]) as replies:
                    await replies()
            assert waited.cancelled_caught
            assert [m.subject for m in held] == ["slow.1", "slow.2"]  # both were sent
            assert conn._replies == {}  # released on the cancelled exit
            for m in held:  # the replies arrive after the block: nobody waits, nothing is kept
                responder.publish_nowait(m.reply, b"late")
            await responder.flush()
            await conn.flush()
            assert conn._replies == {}
            await responder.subscribe("echo", on_message=lambda m: responder.publish_nowait(m.reply, m.data))
            await responder.flush()
            async with conn.requests_sent([("echo", b"next", None)]) as replies:
                [answer] = await replies()
            assert isinstance(answer, Message) and answer.data == b"next"  # the late ones went nowhere
            assert conn._replies == {}


async def test_requests_on_a_closed_connection_raise_unavailable_on_entry(plain_broker: str) -> None:
    with trio.fail_after(CEILING_S):
        async with open_loop():
            async with open_connection(plain_broker) as conn:
                await conn.flush()
            with pytest.raises(Unavailable):
                async with js_publishes_sent(conn, [("$KV.x.a", b"", None)]):
                    pass
            assert conn._replies == {}


async def test_writes_sent_on_a_closed_session_give_each_write_unavailable(plain_broker: str) -> None:
    with trio.fail_after(CEILING_S):
        async with open_loop():
            async with open_connection(plain_broker) as conn:
                await conn.flush()
            stores = IssuedStores(conn, "demo")
            async with stores.writes_sent([("$KV.x.a", b"", None)] * 3) as acks:
                got = await acks()
    assert len(got) == 3 and all(isinstance(g, Unavailable) for g in got), got
    assert "issued-authority writes not sent" in str(got[0])
