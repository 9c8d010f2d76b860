"""A websocket client of a face's ``/events`` over a socket the test owns, and its refused handshake."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio_websocket
from trio_websocket import ConnectionRejected


@asynccontextmanager
async def events_socket(
    port: int, headers: list[tuple[bytes, bytes]], *, receive_buffer: int | None = None,
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A websocket to ``ws://127.0.0.1:<port>/events`` over a TCP socket the test owns and
    closes (trio-websocket leaves a refused handshake's socket open); ``receive_buffer`` sets
    its ``SO_RCVBUF``. A refused handshake raises ``ConnectionRejected`` in a group."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with sock:
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        await sock.connect(("127.0.0.1", port))
        async with trio.SocketStream(sock) as stream, trio.open_nursery() as nursery:
            ws = await trio_websocket.wrap_client_stream(nursery, stream, f"127.0.0.1:{port}", "/events", extra_headers=headers)
            try:
                yield ws
            finally:
                with trio.move_on_after(5, shield=True):
                    await ws.aclose()


async def refused(port: int, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict]:
    """The handshake's refusal: (HTTP status, JSON body)."""
    with pytest.RaisesGroup(ConnectionRejected) as rejected:
        async with events_socket(port, headers):
            pass
    [refusal] = rejected.value.exceptions
    return refusal.status_code, json.loads(refusal.body or b"null")
