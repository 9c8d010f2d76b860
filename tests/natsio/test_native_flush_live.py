"""The native connection's flush across a reconnect (natsio/_native.py), on real nats-servers on 127.0.0.1.

What flush promises: it returns once the broker has answered its own PING, so everything queued
before it has reached the broker. Across a lost socket that needs two things. A PING still
queued (never handed to a send) when the socket goes is carried to the next socket with the
rest of the queue; the broker answers it there, and that PONG must not be taken for the PONG
of a flush made after the reconnect. And a flush made during the outage waits for the next
socket without polling, then does its round trip there (or raises Unavailable when the
connection closes for good meanwhile). Every broker is the test's own, stopped by its scope
(and, when paused, killed by its pid).
"""

from __future__ import annotations

import os
import signal

import pytest
import trio
import trio.testing

from cotal_trio.broker.process import free_port
from cotal_trio.core.errors import Unavailable
from cotal_trio.natsio import Message, NativeConnection, open_native_connection
from cotal_trio.natsio._native import READ_BYTES
from tests.support.plain_brokers import start_stoppable

pytestmark = pytest.mark.broker

CEILING_S = 30.0  # loop bounds only; nothing here asserts a time
PACE_S = 0.05  # how often a loop looks again (no time is asserted)
FILL_BYTES = 1_000_000  # one publish that fills the kernel's buffers behind a paused broker
AHEAD_BYTES, AHEAD_COUNT = 400_000, 3  # queued behind the stuck send, before the stale PING
AFTER_BYTES = 3 * READ_BYTES  # a message the reader needs several reads (schedule points) for


async def _block_the_writer(conn: NativeConnection) -> None:
    """Publish to a subject nobody hears until the writer is stuck in ``send_all``: the paused
    broker reads nothing, so the kernel's buffers fill. This reads the connection's internals
    (``_in_send``, ``_out``): no counter tells a stuck send from a slow one, and the test needs
    exactly the state where what is queued next stays unsent when the socket goes."""
    while True:
        conn.publish_nowait("fill.x", bytes(FILL_BYTES))
        await trio.sleep(PACE_S)
        if conn._in_send and conn._out:
            await trio.sleep(4 * PACE_S)
            if conn._in_send and conn._out:
                return


async def test_a_ping_left_unsent_by_a_lost_socket_does_not_answer_a_later_flush(nursery, tmp_path):
    """Broker a paused and the writer stuck; AHEAD_COUNT publishes to our own subscription, then
    a flush's PING, queue behind the stuck send. a is killed (that flush raises Unavailable)
    and b starts on its port: the queue goes to b, which delivers the publishes and answers the
    stale PING. A flush made on b while those messages arrive (with a publish of AFTER_BYTES to
    our own subscription before it) returns only after its own PONG, so its publish has come
    back by then. Taking the stale PONG as its own, it returned before (the message still being
    read): ``delivered`` was 0."""
    port, first = free_port(), trio.CancelScope()
    pid = await start_stoppable(nursery, tmp_path, port, first, "a")
    ahead: list[Message] = []
    after: list[Message] = []
    lost: list[Unavailable] = []
    delivered: list[int] = []
    with trio.fail_after(CEILING_S):
        async with open_native_connection(f"nats://127.0.0.1:{port}", reconnect=True) as conn:

            async def flush_on_b() -> None:
                conn.publish_nowait("after.x", bytes(AFTER_BYTES))
                await conn.flush()
                delivered.append(len(after))

            def on_ahead(msg: Message) -> None:
                ahead.append(msg)
                if len(ahead) == 1:  # b's first message: the stale PONG is still about 800 kB away
                    nursery.start_soon(flush_on_b)

            async def stale_flush() -> None:
                try:
                    await conn.flush()
                except Unavailable as exc:
                    lost.append(exc)

            await conn.subscribe("ahead.x", on_message=on_ahead)
            await conn.subscribe("after.x", on_message=after.append)
            await conn.flush()
            os.kill(pid, signal.SIGSTOP)
            try:
                await _block_the_writer(conn)
                for _ in range(AHEAD_COUNT):
                    conn.publish_nowait("ahead.x", bytes(AHEAD_BYTES))
                nursery.start_soon(stale_flush)
                await trio.testing.wait_all_tasks_blocked()  # its PING is queued behind them
            finally:
                first.cancel()  # the run ends by the cancel, not by the exit the kill causes
                os.kill(pid, signal.SIGKILL)
            while not lost:
                await trio.sleep(PACE_S)
            await start_stoppable(nursery, tmp_path, port, trio.CancelScope(), "b")
            while not delivered:
                await trio.sleep(PACE_S)
            assert delivered == [1]
            assert len(ahead) == AHEAD_COUNT
            assert conn.statistics().reconnects == 1
            await conn.flush()  # the pairing holds on
            assert not conn.closed.is_set()


class _Steps(trio.abc.Instrument):
    """Counts the scheduler steps of one task (how often it was woken)."""

    def __init__(self) -> None:
        self.task: trio.lowlevel.Task | None = None
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.count += 1


async def _flush_during_an_outage(nursery, tmp_path, *, come_back: bool) -> tuple[str, list[BaseException | None], int]:
    """A flush started while the broker is gone (SIGTERMed); then, OUTAGE_S later, a broker on
    its port again (``come_back``) or the connection closed by its owner. Returns (the URL, the
    flush's outcome: None for a return, or its exception; how many scheduler steps its task took)."""
    port, first = free_port(), trio.CancelScope()
    url = f"nats://127.0.0.1:{port}"
    await start_stoppable(nursery, tmp_path, port, first, "a")
    outcome: list[BaseException | None] = []
    steps = _Steps()

    async def flush(conn: NativeConnection) -> None:
        steps.task = trio.lowlevel.current_task()
        try:
            await conn.flush()
            outcome.append(None)
        except Unavailable as exc:
            outcome.append(exc)

    trio.lowlevel.add_instrument(steps)
    try:
        with trio.fail_after(CEILING_S):
            async with open_native_connection(url, reconnect=True) as conn:
                await conn.flush()
                first.cancel()
                while conn.connected_url is not None:
                    await trio.sleep(PACE_S)
                nursery.start_soon(flush, conn)
                await trio.testing.wait_all_tasks_blocked()
                await trio.sleep(OUTAGE_S)
                assert outcome == []  # it waits for a socket
                if come_back:
                    await start_stoppable(nursery, tmp_path, port, trio.CancelScope(), "b")
                    while not outcome:
                        await trio.sleep(PACE_S)
                    assert conn.statistics().reconnects == 1
        while not outcome:
            await trio.sleep(PACE_S)
    finally:
        trio.lowlevel.remove_instrument(steps)
    return url, outcome, steps.count


# How long the broker stays away at least while a flush waits (seconds; no time is asserted).
OUTAGE_S = 0.5
# A flush that waits for the next socket is woken when it is up (or closed), not every 10 ms:
# a handful of steps for the whole outage (the wake-up, the PONG: 2 and 1 when measured), where
# a poll took one per 10 ms of the outage (OUTAGE_S and more), fifty or more.
MAX_FLUSH_STEPS = 8


async def test_a_flush_during_an_outage_returns_after_the_reconnect_woken_once(nursery, tmp_path):
    _, outcome, steps = await _flush_during_an_outage(nursery, tmp_path, come_back=True)
    assert outcome == [None]
    assert steps <= MAX_FLUSH_STEPS, steps


async def test_a_flush_during_an_outage_raises_unavailable_when_the_connection_closes(nursery, tmp_path):
    url, outcome, steps = await _flush_during_an_outage(nursery, tmp_path, come_back=False)
    assert [type(exc) for exc in outcome] == [Unavailable]
    assert str(outcome[0]) == f"flush {url}: the connection closed"
    assert steps <= MAX_FLUSH_STEPS, steps
