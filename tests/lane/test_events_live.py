"""Issue 7 item 1: the event stream, on the host (fake lanes) and on a real nats-server.

* The host publishes lane events at start and on every manifest change, and manifest events.
* ``/events`` on the loopback face: a connect's callout event arrives within 100 ms of the
  broker's answer; a consumer that stops reading is dropped with its close reason while 300
  connects are answered and a reading consumer gets every one of their events; a bad or missing
  capability and a foreign ``Origin`` are refused; the public face has no ``/events``.
"""

from __future__ import annotations

import functools
import json
import secrets
import statistics
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio_websocket
from trio_websocket import ConnectionClosed

from cotal_trio.broker.process import free_port
from cotal_trio.core.manifest import SpaceEntry
from cotal_trio.http.status_page import session_cookie_name, session_token
from cotal_trio.service.embedded import UpConfig, run_up
from cotal_trio.lane.events import EventBus
from cotal_trio.lane.plane import Fenced
from cotal_trio.natsio import open_connection, open_loop
from cotal_trio.state import RootPaths, read_json

from tests.support.stack import SPACE, Stack, client
from tests.support.events_socket import events_socket, refused
from tests.support.host import FakeLanes, applied_when, config, manifest_bytes, move_over, serving, start_host

CEILING_S = 60
CLOCK = 1_800_000_000.0


def strip(event: dict) -> dict:
    """An event without its ``seq`` and ``at``."""
    return {k: v for k, v in event.items() if k not in ("seq", "at")}


def drain(feed) -> list[dict]:
    """Every event waiting in a subscription's channel now (sync)."""
    got = []
    while True:
        try:
            got.append(feed.events.receive_nowait())
        except trio.WouldBlock:
            return got


# --- the host's lane and manifest events (fake lanes) ------------------------------------------


class FencingLanes(FakeLanes):
    """Fake lanes whose :meth:`fence` makes the running lane raise :class:`Fenced`."""

    def __init__(self) -> None:
        super().__init__(cleanup_s=0.01)
        self._fence: dict[str, trio.Event] = {}

    def fence(self, space: str) -> None:
        self._fence[space].set()

    async def _run(self, entry: SpaceEntry, *, task_status: trio.TaskStatus[str]) -> None:
        self._fence[entry.space] = fence = trio.Event()
        async with trio.open_nursery() as nursery:
            task_status.started(await nursery.start(functools.partial(super()._run, entry)))
            await fence.wait()
            raise Fenced(entry.space, 3, "the lease lapsed")


async def test_host_publishes_lane_states_and_manifest_outcomes(nursery, tmp_path: Path):
    manifest = tmp_path / "spaces.json"
    manifest.write_bytes(manifest_bytes("a", "b", "c"))
    bus = EventBus(clock=lambda: CLOCK)
    lanes = FencingLanes()
    async with bus.subscribe(None) as feed:
        with trio.fail_after(CEILING_S):
            host = await start_host(nursery, config(manifest, lanes, events=bus))
            await applied_when(host, manifest, serving("a", "b", "c"))
            started = drain(feed)
            # drop b, change c, add d; then a manifest that is refused; then a's claim is fenced
            move_over(manifest, manifest_bytes("a", {"space": "c", "serviceEndpoints": True}, "d"))
            await applied_when(host, manifest, lambda d: host.statistics().reconciles == 2 and serving("a", "c", "d")(d))
            changed, lanes_then = drain(feed), bus.lanes()
            move_over(manifest, b'{"version": 3, "spaces": []}')
            await applied_when(host, manifest, lambda d: d["refused"] is not None)
            refused = drain(feed)
            lanes.fence("a")
            await applied_when(host, manifest, lambda d: d["spaces"]["a"]["state"] == "retrying")
            fenced = drain(feed)

    sha = host.statistics().manifest_sha256
    assert started[0] == {"seq": 0, "at": CLOCK, "type": "hello", "space": None, "lanes": {}}
    assert [e["seq"] for e in started[1:] + changed + refused + fenced] == list(range(1, bus.statistics().published + 1))
    assert all(e["at"] == CLOCK for e in started + changed)
    first = [strip(e) for e in started[1:]]
    assert first[:4] == [
        {"type": "manifest", "space": None, "outcome": "applied", "sha256": first[0]["sha256"],
         "spaces": ["a", "b", "c"], "added": ["a", "b", "c"], "removed": [], "changed": []},
        *({"type": "lane", "space": s, "state": "starting", "reason": None} for s in "abc"),
    ]
    assert sorted(e["space"] for e in first[4:]) == ["a", "b", "c"]
    assert {e["state"] for e in first[4:]} == {"serving"}

    second = [strip(e) for e in changed]
    assert second[:5] == [
        {"type": "lane", "space": "b", "state": "stopping", "reason": None},
        {"type": "lane", "space": "c", "state": "stopping", "reason": None},
        {"type": "lane", "space": "b", "state": "stopped", "reason": None},
        {"type": "lane", "space": "c", "state": "stopped", "reason": None},
        {"type": "manifest", "space": None, "outcome": "applied", "sha256": sha,
         "spaces": ["a", "c", "d"], "added": ["d"], "removed": ["b"], "changed": ["c"]},
    ]
    assert second[5:7] == [{"type": "lane", "space": s, "state": "starting", "reason": None} for s in "cd"]
    assert sorted((e["space"], e["state"]) for e in second[7:]) == [("c", "serving"), ("d", "serving")]
    assert lanes_then == {s: {"state": "serving", "reason": None} for s in "acd"}  # b is gone: stopped

    assert [strip(e) for e in refused] == [{
        "type": "manifest", "space": None, "outcome": "refused", "reason": host.statistics().refused}]
    assert "version" in refused[0]["reason"]

    reason = "space a: plane claim generation 3 fenced: the lease lapsed"
    assert [strip(e) for e in fenced] == [
        {"type": "lane", "space": "a", "state": "fenced", "reason": reason},
        {"type": "lane", "space": "a", "state": "retrying", "reason": reason},
    ]


# --- /events on a real stack -----------------------------------------------------------------


def _face(stack: Stack) -> tuple[str, int]:
    """The space's loopback face: (capability, port)."""
    service = read_json(stack.space_paths.auth_service_json)
    return service["cap"], int(service["url"].rsplit(":", 1)[1])


def _bearer(cap: str) -> list[tuple[bytes, bytes]]:
    return [(b"Authorization", f"Bearer {cap}".encode())]


class Feed:
    """A websocket consumer that reads every message as it comes, noting its trio arrival time."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws
        self.got: list[tuple[float, dict]] = []
        self.closed: ConnectionClosed | None = None
        self._more = trio.Event()

    async def run(self) -> None:
        try:
            while True:
                message = await self.ws.get_message()
                self.got.append((trio.current_time(), json.loads(message)))
                self._more.set()
                self._more = trio.Event()
        except ConnectionClosed as closed:
            self.closed = closed

    async def first(self, predicate: Callable[[dict], bool]) -> tuple[float, dict]:
        """The first message (arrival time, event) matching ``predicate``, waiting for it."""
        seen = 0
        while True:
            for arrival, event in self.got[seen:]:
                if predicate(event):
                    return arrival, event
            seen = len(self.got)
            await self._more.wait()

    async def nth(self, kind: str, n: int) -> tuple[float, dict]:
        """The ``n``-th (from 0) message of type ``kind``: (arrival time, event), waiting for it."""
        while True:
            found = [(arrival, event) for arrival, event in self.got if event["type"] == kind]
            if len(found) > n:
                return found[n]
            await self._more.wait()

    def events(self, kind: str) -> list[dict]:
        return [event for _, event in self.got if event["type"] == kind]


@asynccontextmanager
async def reading(port: int, cap: str) -> AsyncIterator[Feed]:
    async with events_socket(port, _bearer(cap)) as ws, trio.open_nursery() as nursery:
        feed = Feed(ws)
        nursery.start_soon(feed.run)
        yield feed
        nursery.cancel_scope.cancel()


async def test_a_connects_callout_event_arrives_within_100_ms(stack):
    stack.grant("alice", "cli")
    cap, port = _face(stack)
    latencies = []
    with trio.fail_after(CEILING_S):
        async with reading(port, cap) as feed:
            _, hello = await feed.first(lambda e: e["type"] == "hello")
            bearer = await stack.bearer("alice", "cli")
            _, exchange = await feed.first(lambda e: e["type"] == "exchange")
            for i in range(20):
                async with client(stack, bearer):
                    answered = trio.current_time()  # the client's connect has returned
                    arrival, _ = await feed.nth("callout", i)
                latencies.append(arrival - answered)
    print(f"callout event after connect returned: max {max(latencies) * 1000:.1f} ms,"
          f" median {statistics.median(latencies) * 1000:.1f} ms over 20 connects")
    assert max(latencies) < 0.1
    assert hello["type"] == "hello" and hello["space"] == SPACE
    assert hello["lanes"] == {SPACE: {"state": "serving", "reason": None}}
    assert strip(exchange) == {"type": "exchange", "space": SPACE, "arm": "human", "face": "loopback", "status": 200}
    callouts = feed.events("callout")
    assert len(callouts) == 20
    assert {(e["outcome"], e["owner"], e["actor"], e["limited"]) for e in callouts} == {
        ("minted", stack.owner("alice"), "cli", False)}
    assert len({e["req"] for e in callouts}) == 20 and all(e["req"].startswith("U") for e in callouts)
    assert set(callouts[0]) == {"seq", "at", "type", "space", "outcome", "req", "cid", "owner", "actor", "queueMs",
                                "verifyMs", "ledgerMs", "policyMs", "signMs", "totalMs", "limited"}
    seqs = [e["seq"] for _, e in feed.got[1:]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


# --- a slow consumer, refusals, the public face (one stack with a small bus and a public face) ----

BUFFER = 32  # the test bus's per-consumer buffer: small, so 300 connects overflow a stalled consumer
ACTORS = 6  # 300 connects over 6 actors of one owner: under the 60/actor and 600/owner limits
CONNECTS = 300


@pytest.fixture
async def small(nursery, tmp_path, nats_server_bin) -> AsyncIterator[tuple[Stack, EventBus, int]]:
    """``run_up`` with an event bus of :data:`BUFFER` events and a public face: (stack, bus, public port)."""
    bus, public_port = EventBus(buffer=BUFFER), free_port()
    paths = RootPaths(tmp_path / "root")
    up = UpConfig(
        paths=paths, space=SPACE, port=free_port(), auth_timeout_s=2, nats_server=nats_server_bin,
        exchange_public_port=public_port, events=bus,
    )
    with trio.fail_after(20):
        info = await nursery.start(functools.partial(run_up, up))
    yield Stack(info=info, paths=paths), bus, public_port


async def _connect_many(stack: Stack, bearers: list[str], count: int) -> list[str]:
    """``count`` connects, round-robin over ``bearers`` (sequential, one loop): the refusals."""
    failures = []
    async with open_loop():
        for i in range(count):
            nonce = "ibx" + secrets.token_hex(8)
            try:
                async with open_connection(
                    stack.info.server_url, creds=stack.sentinel_creds(), token=bearers[i % len(bearers)],
                    name=nonce, inbox_prefix=f"_INBOX_{nonce}", reconnect=False,
                ):
                    pass
            except Exception as exc:  # noqa: BLE001 - counted and asserted to be none
                failures.append(repr(exc))
    return failures


async def test_a_stalled_consumer_is_dropped_while_connects_go_on(small):
    stack, bus, _ = small
    actors = [f"a{i}" for i in range(ACTORS)]
    for sub in ("alice", "bob"):  # bob's connects are the baseline, alice's run beside the stall
        for actor in actors:
            stack.grant(sub, actor)
    cap, port = _face(stack)
    with trio.fail_after(CEILING_S):
        baseline_bearers = [await stack.bearer("bob", actor) for actor in actors]
        bearers = [await stack.bearer("alice", actor) for actor in actors]
        start = trio.current_time()
        assert await _connect_many(stack, baseline_bearers, CONNECTS) == []
        baseline = trio.current_time() - start
        # the stalled consumer reads nothing until the end: a 4 KiB socket receive buffer and
        # trio-websocket's one-message queue, so the face's sends to it block after a few KiB
        async with reading(port, cap) as feed, events_socket(port, _bearer(cap), receive_buffer=4096) as slow:
            await feed.first(lambda e: e["type"] == "hello")
            start = trio.current_time()
            failures = await _connect_many(stack, bearers, CONNECTS)
            took = trio.current_time() - start
            await feed.nth("callout", CONNECTS - 1)
            dropped = bus.statistics()
            # the stalled consumer reads again: what was in flight, then the close
            behind = 0
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await slow.get_message()
                    behind += 1
    callouts = feed.events("callout")
    p99 = sorted(e["totalMs"] for e in callouts)[int(0.99 * CONNECTS) - 1]
    print(f"{CONNECTS} connects: {CONNECTS / baseline:.0f}/s with no consumer, {CONNECTS / took:.0f}/s with a"
          f" stalled and a reading consumer (callout p99 {p99} ms); the stalled one got {behind} messages before its close")
    assert failures == []
    assert took < 2 * baseline  # the stall does not slow the callout (measured: within about 10 %)
    assert len(callouts) == CONNECTS and {e["outcome"] for e in callouts} == {"minted"}
    assert {e["actor"] for e in callouts} == set(actors) and len({e["req"] for e in callouts}) == CONNECTS
    assert feed.closed is None
    assert (dropped.dropped, dropped.subscribers) == (1, 1)  # the stalled one gone, the reader kept
    assert (closed.value.reason.code, closed.value.reason.reason) == (
        1008, f"slow consumer: more than {BUFFER} events behind - reconnect")
    assert 1 <= behind < CONNECTS  # it got the hello and what was in flight, not the 300


def _http(url: str, body: bytes | None = None) -> tuple[int, str]:
    """``GET`` (or with ``body``, a JSON ``POST``) ``url``: (status, body text) (blocking)."""
    headers = {} if body is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


async def test_events_refuses_without_the_capability_and_the_public_face_has_none(small):
    stack, bus, public_port = small
    cap, port = _face(stack)
    with trio.fail_after(CEILING_S):
        assert await refused(port, []) == (401, {
            "error": "missing/invalid exchange capability - read it from the space's auth-service.json"})
        assert (await refused(port, _bearer("0" * 64)))[0] == 401
        assert (await refused(port, [(b"Cookie", f"{session_cookie_name(port)}={'0' * 64}".encode())]))[0] == 401
        for name in ("cotal_session", session_cookie_name(public_port)):  # the token under another face's name
            assert (await refused(port, [(b"Cookie", f"{name}={session_token(cap)}".encode())]))[0] == 401
        own = f"http://127.0.0.1:{port}".encode()
        foreign = await refused(port, [*_bearer(cap), (b"Origin", b"http://evil.example")])
        assert foreign[0] == 403 and "cross-site" in foreign[1]["error"]
        assert (await refused(port, [*_bearer(cap), (b"Origin", b"http://localhost:%d" % port)]))[0] == 403
        for headers in (_bearer(cap), [*_bearer(cap), (b"Origin", own)],
                        [(b"Cookie", f"{session_cookie_name(port)}={session_token(cap)}".encode()), (b"Origin", own)]):
            async with events_socket(port, headers) as ws:
                assert json.loads(await ws.get_message())["type"] == "hello"
        plain = await trio.to_thread.run_sync(_http, f"http://127.0.0.1:{port}/events")
        assert plain[0] == 426 and "websocket" in json.loads(plain[1])["error"]

        assert (await refused(public_port, _bearer(cap)))[0] == 400  # no websocket route at all
        assert (await trio.to_thread.run_sync(_http, f"http://127.0.0.1:{public_port}/events"))[0] == 404
        # the public face's exchange answers are events of the loopback face, marked public
        async with reading(port, cap) as feed:
            await feed.first(lambda e: e["type"] == "hello")
            status, _ = await trio.to_thread.run_sync(_http, f"http://127.0.0.1:{public_port}/exchange", b"{}")
            _, event = await feed.first(lambda e: e["type"] == "exchange")
    assert status == 400
    assert strip(event) == {"type": "exchange", "space": SPACE, "arm": "none", "face": "public", "status": 400}
    assert bus.statistics().dropped == 0

