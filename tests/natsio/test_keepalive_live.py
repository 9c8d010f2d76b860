"""natsio's keepalive against a real nats-server (issue 15 item 5).

A broker that keeps the socket open but answers nothing must be noticed in seconds, on every
connection: ``closed`` is set and ``last_error`` names it, whether or not the connection may
reconnect. Brokers and the silent listener are the test's own, stopped by it (a paused broker
is resumed in a ``finally``).
"""

from __future__ import annotations

import os
import signal

import pytest
import trio

from cotal_trio.broker.process import free_port
from cotal_trio.natsio import open_connection, open_loop
from cotal_trio.natsio._conn import KEEPALIVE_S, MAX_OUTAGE_S, PONG_TIMEOUT_S
from tests.support.plain_brokers import silent_listener, start_stoppable

pytestmark = pytest.mark.broker

# Loop bound only (the measured time is printed); the keepalive's own bound is ~6 s.
CEILING_S = 30.0


@pytest.mark.parametrize("reconnect", [False, True])
async def test_a_paused_broker_closes_the_connection_within_seconds(nursery, tmp_path, reconnect):
    port, scope = free_port(), trio.CancelScope()
    pid = await start_stoppable(nursery, tmp_path, port, scope)
    async with open_loop(), open_connection(f"nats://127.0.0.1:{port}", reconnect=reconnect) as conn:
        await conn.flush()
        os.kill(pid, signal.SIGSTOP)
        try:
            paused = trio.current_time()
            with trio.move_on_after(CEILING_S):
                await conn.closed.wait()
            took = trio.current_time() - paused
        finally:
            os.kill(pid, signal.SIGCONT)
        print(f"reconnect={reconnect}: closed {took:.1f} s after the broker paused: {conn.last_error}")
        assert conn.closed.is_set()
        assert conn.last_error == f"no PING answered within {PONG_TIMEOUT_S:g} s - the broker is hung or unreachable"
    scope.cancel()


async def test_a_reconnect_to_a_listener_that_never_speaks_ends_after_the_outage_bound(nursery, tmp_path):
    """The broker goes; something accepts on its port and says nothing (no INFO): the reconnect
    attempts hang, and the connection is lost once it has had no broker for MAX_OUTAGE_S."""
    port, scope = free_port(), trio.CancelScope()
    await start_stoppable(nursery, tmp_path, port, scope)
    async with open_loop(), open_connection(f"nats://127.0.0.1:{port}", reconnect=True) as conn:
        await conn.flush()
        scope.cancel()  # SIGTERM; the run returns once it has exited
        async with silent_listener(port):  # accepts into the backlog; never reads, never writes
            gone = trio.current_time()
            with trio.move_on_after(CEILING_S):
                await conn.closed.wait()
            took = trio.current_time() - gone
        print(f"closed {took:.1f} s after the broker went: {conn.last_error}")
        assert conn.closed.is_set()
        assert conn.last_error == f"no broker for {MAX_OUTAGE_S:g} s (reconnecting)"
        assert took < CEILING_S
    assert KEEPALIVE_S < PONG_TIMEOUT_S < MAX_OUTAGE_S
