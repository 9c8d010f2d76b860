"""The loopback face streams ``/events`` from any :class:`~cotal_trio.http.loopback.EventSource`
port (issue 16: "http/ faces only; takes its ports"): here a plain source that is not the lane's
bus, so the face needs nothing from ``lane/``. Real face (:func:`~cotal_trio.http.serve.serve_app`)
and a real websocket client on 127.0.0.1; no broker.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
from trio_websocket import ConnectionClosed, wrap_client_stream

from cotal_trio.http.loopback import EventSource, build_loopback_app
from cotal_trio.http.serve import serve_app
from tests.support.loopback import CAP, SPACE, _context

CEILING_S = 10


@dataclass
class _Feed:
    events: trio.MemoryReceiveChannel[Mapping[str, Any]]
    reason: str | None = None


class _ListSource:
    """A source of fixed events, then a drop with ``reason`` (None: the feed just ends)."""

    def __init__(self, events: list[dict[str, Any]], reason: str | None) -> None:
        self.events, self.reason, self.spaces = events, reason, []

    @asynccontextmanager
    async def subscribe(self, space: str | None) -> AsyncIterator[_Feed]:
        self.spaces.append(space)
        send, receive = trio.open_memory_channel[Mapping[str, Any]](len(self.events) + 1)
        for event in self.events:
            send.send_nowait(event)
        send.close()
        feed = _Feed(receive)
        yield feed
        feed.reason = self.reason


async def _received(source: EventSource) -> tuple[list[dict[str, Any]], int | None, str | None]:
    """The messages one ``/events`` client gets from a face on ``source``, and its close code/reason."""
    app = build_loopback_app(_context(), events=source)
    got: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(serve_app, app, port=0))
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream, trio.open_nursery() as client:
            headers = [(b"Authorization", f"Bearer {CAP}".encode())]
            ws = await wrap_client_stream(client, stream, f"127.0.0.1:{port}", "/events", extra_headers=headers)
            try:
                while True:
                    got.append(json.loads(await ws.get_message()))
            except ConnectionClosed as closed:
                code, reason = closed.reason.code, closed.reason.reason
        nursery.cancel_scope.cancel()
    return got, code, reason


async def test_the_face_streams_a_source_that_is_not_the_lane_bus():
    source = _ListSource([{"type": "hello", "seq": 0}, {"type": "lane", "seq": 1}], reason=None)
    with trio.fail_after(CEILING_S):
        got, code, _ = await _received(source)
    assert got == [{"type": "hello", "seq": 0}, {"type": "lane", "seq": 1}]
    assert source.spaces == [SPACE] and code == 1000
