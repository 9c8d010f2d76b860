"""The pinned IdP's key cache re-reads its JWKS for an unknown ``kid`` (issue 5 item 6: "an
unknown kid triggers at most one refetch per 30 s"), on virtual time with a fake fetch; and a
misbehaving IdP over real loopback sockets."""

from __future__ import annotations

import functools
import logging

import pytest
import trio
from nacl.signing import SigningKey

from cotal_trio.core.errors import Unavailable
from cotal_trio.service.idp_keys import REFETCH_COOLDOWN_S, REFETCH_WAIT_S, IdpKeyCache, fetch_jwks

URI = "https://idp.example/jwks"
OLD, NEW = SigningKey(bytes([1] * 32)).verify_key, SigningKey(bytes([2] * 32)).verify_key
CEILING_S = 600


class FakeJwks:
    """The IdP's JWKS endpoint: what it serves, how long it takes, when it was read."""

    def __init__(self, keys: dict, *, latency_s: float = 0.0) -> None:
        self.keys, self.latency_s = keys, latency_s
        self.reads: list[float] = []
        self.down = False

    async def __call__(self, uri: str) -> dict:
        assert uri == URI
        self.reads.append(trio.current_time())
        await trio.sleep(self.latency_s)
        if self.down:
            raise Unavailable(f"could not read the IdP JWKS at {uri}: connection refused")
        return dict(self.keys)


async def test_an_unknown_kid_rereads_at_most_once_per_30_s(autojump_clock):
    """The IdP rotated to "new". The first token naming it re-reads the JWKS; tokens naming a
    made-up kid within the next 30 s read nothing; after 30 s one more read happens."""
    with trio.fail_after(CEILING_S):
        jwks = FakeJwks({"old": OLD, "new": NEW})
        cache = IdpKeyCache({"old": OLD}, uri=URI, fetch=jwks)
        await cache.refetch("new")
        assert sorted(cache.keys()) == ["new", "old"] and jwks.reads == [0.0]
        await cache.refetch("new")  # known now: no read
        for t in (1.0, 10.0, 29.5):
            await trio.sleep_until(t)
            await cache.refetch("made-up")
        assert jwks.reads == [0.0]
        await trio.sleep_until(REFETCH_COOLDOWN_S)
        await cache.refetch("made-up")
        assert jwks.reads == [0.0, REFETCH_COOLDOWN_S]


async def test_concurrent_unknown_kids_share_one_read(autojump_clock):
    with trio.fail_after(CEILING_S):
        jwks = FakeJwks({"old": OLD, "new": NEW}, latency_s=0.5)
        cache = IdpKeyCache({"old": OLD}, uri=URI, fetch=jwks)
        done = []

        async def exchange() -> None:
            await cache.refetch("new")
            done.append((trio.current_time(), "new" in cache.keys()))

        async with trio.open_nursery() as requests:
            for _ in range(5):
                requests.start_soon(exchange)
    assert jwks.reads == [0.0]
    assert done == [(0.5, True)] * 5  # each waited for the one read, and sees its keys


async def test_a_failed_reread_keeps_the_last_good_keys_and_counts(autojump_clock, caplog):
    with trio.fail_after(CEILING_S):
        jwks = FakeJwks({"new": NEW})
        jwks.down = True
        cache = IdpKeyCache({"old": OLD}, uri=URI, fetch=jwks)
        with caplog.at_level(logging.WARNING, logger="cotal.idp"):
            await cache.refetch("new")
        assert sorted(cache.keys()) == ["old"]
        jwks.down = False
        await trio.sleep(10)
        await cache.refetch("new")  # inside the cooldown: the IdP is not asked again yet
        assert len(jwks.reads) == 1 and "new" not in cache.keys()
    assert caplog.messages == [
        f'idp: could not re-read the JWKS at {URI} for key "new" (could not read the IdP JWKS at {URI}: connection refused)'
    ]


async def test_a_slow_idp_holds_a_request_at_most_the_wait(autojump_clock):
    with trio.fail_after(CEILING_S):
        jwks = FakeJwks({"new": NEW}, latency_s=60.0)
        cache = IdpKeyCache({"old": OLD}, uri=URI, fetch=jwks)
        await cache.refetch("new")
        assert trio.current_time() == REFETCH_WAIT_S and sorted(cache.keys()) == ["old"]


async def test_a_fixed_key_set_never_reads(autojump_clock):
    """A development IdP's key set (no URI) is what it is."""
    jwks = FakeJwks({"new": NEW})
    cache = IdpKeyCache({"old": OLD}, fetch=jwks)
    await cache.refetch("new")
    assert jwks.reads == [] and sorted(cache.keys()) == ["old"]


@pytest.mark.parametrize(
    "answer",
    [
        b"garbage\r\n\r\n",  # not an HTTP status line: http.client.BadStatusLine
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # broken chunked body
    ],
    ids=["bad status line", "broken chunked body"],
)
async def test_a_misbehaving_idp_is_unavailable_not_a_crash(nursery, answer):
    """A review finding: http.client's own errors (not OSError) escaped fetch_jwks, so a refetch
    for an unknown kid answered 500 and a failed 5-minute refresh ended the lane."""

    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            await stream.receive_some(65536)
            await stream.send_all(answer)

    with trio.fail_after(30):
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        with pytest.raises(Unavailable, match=f"could not read the IdP JWKS at http://127.0.0.1:{port}/jwks"):
            await fetch_jwks(f"http://127.0.0.1:{port}/jwks")
