"""natsio/_native.py's parser against a scripted peer that breaks the NATS client protocol.

A real nats-server never sends these; a scripted TCP peer on 127.0.0.1 does (after a correct
INFO / CONNECT / PING / PONG handshake), so the test owns every byte. What a broken MSG line
must do: drop the socket and, without ``reconnect``, close the connection for good naming it,
never raise out of the connection's nursery or spin the reader forever.
"""

from __future__ import annotations

import functools

import pytest
import trio

from cotal_trio.natsio import open_native_connection

CEILING_S = 10.0  # loop bound only; nothing here asserts a time
PACE_S = 0.05  # between a scripted peer's sends, so each is a read of its own (no time is asserted)
INFO = b'INFO {"server_id":"fake","version":"2.10.0","proto":1,"headers":true,"max_payload":1048576}\r\n'


async def _scripted(nursery: trio.Nursery, after_handshake: bytes, *more: bytes) -> int:
    """A one-connection peer on a free port: the handshake, then ``after_handshake`` and each of
    ``more`` in a send of its own (PACE_S apart, so they arrive in separate reads), then it holds
    the socket open (so any close is the client's). Returns the port."""

    async def serve(stream: trio.SocketStream) -> None:
        async with stream:
            await stream.send_all(INFO)
            seen = b""
            while not seen.endswith(b"PING\r\n"):
                seen += await stream.receive_some(65536)
            await stream.send_all(b"PONG\r\n" + after_handshake)
            for chunk in more:
                await trio.sleep(PACE_S)
                await stream.send_all(chunk)
            while await stream.receive_some(65536):
                pass

    [listener] = await nursery.start(functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
    return listener.socket.getsockname()[1]


@pytest.mark.parametrize("line", [
    b"MSG 1\r\nx\r\n",  # no sid: too few arguments
    b"MSG a 1 -15\r\n",  # a negative size that walks the parser back to the line's start
    b"HMSG a 1 9 3\r\nNATS/1.0\r\n\r\n",  # a header block longer than the message
])  # fmt: skip
async def test_a_malformed_msg_line_closes_the_connection_naming_it(nursery, line):
    port = await _scripted(nursery, line)
    with trio.fail_after(CEILING_S):
        async with open_native_connection(f"nats://127.0.0.1:{port}", reconnect=False) as conn:
            await conn.subscribe("a", on_message=lambda msg: None)
            await conn.closed.wait()
            assert conn.last_error is not None and conn.last_error.startswith("a malformed MSG/HMSG line"), conn.last_error
    nursery.cancel_scope.cancel()


async def test_messages_split_across_reads_are_assembled(nursery):
    """A MSG line cut mid-line, a payload that ends exactly where a read ends (its CRLF in the
    next read), a payload holding CRLF, and an HMSG with a 503 status line split inside the
    header block: each comes out whole, in order."""
    port = await _scripted(
        nursery, b"MS", b"G a 1 5\r\nhe", b"llo", b"\r\nMSG a 1 r.x 4\r\n\r\n\r\n", b"\r\nHMSG a 1 16 16\r\nNATS/1.0",
        b" 503\r\n\r\n\r\n",
    )
    got = []
    with trio.fail_after(CEILING_S):
        async with open_native_connection(f"nats://127.0.0.1:{port}", reconnect=False) as conn:
            await conn.subscribe("a", on_message=got.append)
            while len(got) < 3:
                await trio.sleep(PACE_S)
            assert [(m.subject, m.reply, m.data, m.headers) for m in got] == [
                ("a", None, b"hello", None), ("a", "r.x", b"\r\n\r\n", None), ("a", None, b"", {"Status": "503"}),
            ]
            assert conn.last_error is None
    nursery.cancel_scope.cancel()


async def test_an_info_that_is_not_an_object_closes_the_connection_naming_it(nursery):
    port = await _scripted(nursery, b"INFO [1]\r\n")
    with trio.fail_after(CEILING_S):
        async with open_native_connection(f"nats://127.0.0.1:{port}", reconnect=False) as conn:
            await conn.closed.wait()
            assert conn.last_error == "the broker's INFO is not a JSON object", conn.last_error
    nursery.cancel_scope.cancel()
