"""A NATS client connection on trio sockets: the callout lane's hot path without the bridge (issue 14).

The callout's per-connect CPU was about 40 % runtime bridge (trio -> trio-asyncio -> nats-py
and back: docs/benchmarks.md "Issue 14"). This connection speaks the NATS client protocol
itself, on a ``trio.SocketStream``, for what a callout lane does on its connection: one queue
subscription, its replies, requests over one wildcard inbox (JetStream acks), PING/PONG. No
asyncio here; everything is trio-flavoured except where a docstring says "sync".

Protocol facts used (the NATS client protocol, protocol 1): the server speaks first with
``INFO {json}``; the client sends ``CONNECT {json}`` (``jwt`` and ``sig``, the nkey signature
of INFO's ``nonce`` in base64, for a creds user; ``headers`` and ``no_responders`` on, so a
request nobody serves comes back as ``HMSG`` with status line ``NATS/1.0 503``) and a ``PING``;
the server's ``PONG`` confirms the CONNECT, ``-ERR '<text>'`` refuses it. Messages arrive as
``MSG <subject> <sid> [reply] <#bytes>`` and ``HMSG <subject> <sid> [reply] <#hdr> <#total>``.
A cluster's INFO lists the other nodes' client URLs in ``connect_urls``.

Shape (trio owns every lifetime): :func:`open_native_connection` is an async context manager
with a nursery of its own: a reader task (parses, answers server PINGs, calls subscription
callbacks synchronously), one writer task, a keepalive task. Writes are coalesced: every
publish, SUB and PING appends to one output buffer and wakes the writer; what is queued before
the writer runs (one scheduler pass: a burst of replies, a batch of requests) leaves in one
``send_all``.

On loss it does what the nats-py connection of :mod:`cotal_trio.natsio._conn` does (the lane
relies on it: a cluster node going moves the callout connection to another node,
tests/service/test_cluster_failover_live.py): with ``reconnect``, it tries the seeds and the
nodes the cluster announced, the next one first, each at most ``RECONNECT_ATTEMPTS`` times and
``RECONNECT_WAIT_S`` apart, re-subscribes, then sends what was queued meanwhile (bounded by
``MAX_PENDING_BYTES``); with no broker for ``MAX_OUTAGE_S``, or every attempt used, or without
``reconnect``, the connection is closed for good (``closed`` set, ``last_error`` naming why).
The keepalive PINGs every ``KEEPALIVE_S`` and counts the broker lost when no PONG comes back
within ``PONG_TIMEOUT_S`` (issue 15 item 5). TLS is not spoken: a ``tls://`` seed, or a broker
whose INFO requires TLS, is refused with a sentence (the lane then uses the nats-py connection).
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

import trio

from cotal_trio.core.creds import parse_creds
from cotal_trio.core.errors import Unavailable
from cotal_trio.core.nkeys import KeyPair
from cotal_trio.core.servers import join_servers, parse_servers

from ._conn import (
    CALLBACK_SLICE_S,
    CLOSE_S,
    CONNECT_CAP_S,
    KEEPALIVE_S,
    MAX_OUTAGE_S,
    PONG_TIMEOUT_S,
    RECONNECT_ATTEMPTS,
    RECONNECT_WAIT_S,
    Connection,
    Message,
    _answer,
    _Reply,
)
from ._loop import DEFAULT_CAP_S

__all__ = [
    "CalloutConnection", "MAX_PENDING_BYTES", "NATIVE_VERSION", "NativeConnection", "NativeStatistics", "NativeSubscription", "open_native_connection",
    "speaks_native",
]

log = logging.getLogger("cotal.natsio")

# Bytes queued for the broker at most (while a reconnect runs, or behind a slow socket); a
# publish past it is dropped with a warning rather than held without bound.
MAX_PENDING_BYTES = 8 * 1024 * 1024
# One read from the socket at most (bytes); a larger message is assembled over several reads.
READ_BYTES = 256 * 1024
# A protocol line (INFO, MSG arguments) longer than this is the broker's fault: the socket is
# dropped (bytes). INFO of a large cluster is a few KiB.
MAX_LINE_BYTES = 1024 * 1024
# A payload larger than this is refused as the broker would (bytes); INFO's max_payload rules.
DEFAULT_MAX_PAYLOAD = 1024 * 1024
# How often a closing connection looks whether the writer has sent what was queued (seconds).
CLOSE_POLL_S = 0.001
_CRLF = b"\r\n"
_STATUS, _DESCRIPTION = "Status", "Description"  # the names nats-py gives a status line
# The CONNECT "version" this connection sends: the broker's CONNZ shows which connections are native.
NATIVE_VERSION = "cotal-trio-native/1"


@dataclass(frozen=True, slots=True, kw_only=True)
class NativeStatistics:
    """Counters of one native connection (STYLE.md practice 11).

    Attributes:
        sends: ``send_all`` calls made (one per writer wake-up: the coalescing made visible).
        sent_bytes: bytes handed to the socket.
        messages: MSG/HMSG received.
        reconnects: completed reconnects.
        dropped: publishes dropped because ``MAX_PENDING_BYTES`` were already queued.
    """

    sends: int
    sent_bytes: int
    messages: int
    reconnects: int
    dropped: int


class _Sub:
    __slots__ = ("on_message", "queue", "sid", "subject")

    def __init__(self, sid: int, subject: str, queue: str | None, on_message: Callable[[Message], None]) -> None:
        self.sid, self.subject, self.queue, self.on_message = sid, subject, queue, on_message


class _Pong:
    __slots__ = ("arrived", "ok")

    def __init__(self) -> None:
        self.arrived = trio.Event()
        self.ok = False  # False once arrived: the socket it was sent on was lost


class _Lost(Exception):
    """The socket is gone or the broker broke the protocol (internal: ends one socket's tasks)."""


class _Refused(Exception):
    """The broker answered the handshake with ``-ERR`` (its text is the message)."""


class NativeSubscription:
    """A callback subscription made by :meth:`NativeConnection.subscribe`."""

    def __init__(self, conn: NativeConnection, sub: _Sub) -> None:
        self._conn, self._sub = conn, sub
        self.subject, self.queue = sub.subject, sub.queue

    async def unsubscribe(self) -> None:
        """Trio: remove interest; no ``on_message`` call after it returns. Idempotent; a no-op
        once the connection is closed. Never raises for a lost connection (the interest went
        with the socket)."""
        if self._conn._subs.pop(self._sub.sid, None) is not None and not self._conn.closed.is_set():
            self._conn._write(b"UNSUB %d\r\n" % self._sub.sid)
        await trio.lowlevel.checkpoint()

    async def drain(self) -> None:
        """Trio: remove interest, and return once every message the broker sent before it has
        been passed to ``on_message`` (a PING round trip after the UNSUB: the broker answers in
        order, and the reader delivers in order). Idempotent; a no-op once closed.

        Raises:
            Unavailable: the connection was lost before the PONG.
        """
        conn, sid = self._conn, self._sub.sid
        if sid not in conn._subs or conn.closed.is_set():
            await trio.lowlevel.checkpoint()
            return
        conn._write(b"UNSUB %d\r\n" % sid)
        try:
            await conn.flush()
        finally:
            conn._subs.pop(sid, None)


class NativeConnection:
    """A NATS connection on a trio socket. Made only by :func:`open_native_connection`.

    Its methods may be called from any task of the same ``trio.run`` while it is open.

    Attributes:
        closed: set once the connection is closed for good (our close, no broker for
            ``MAX_OUTAGE_S``, every reconnect attempt used, no PONG within ``PONG_TIMEOUT_S``,
            or a lost socket without ``reconnect``); ``last_error`` says which.
        error_count: how many errors were reported (the broker's ``-ERR`` lines, lost sockets).
        last_error: the text of the last of them, or None.
        servers: the seed URLs, in the order given.
    """

    def __init__(self, servers: tuple[str, ...], *, creds: str | None, token: str | None, name: str | None,
                 reconnect: bool, inbox_prefix: str | None = None) -> None:
        self.servers = servers
        self._url = join_servers(servers)
        self._key: KeyPair | None = None
        self._jwt: str | None = None
        if creds is not None:
            self._jwt, seed = parse_creds(creds)
            self._key = KeyPair.from_seed(seed)
        self._token, self._name, self._reconnect = token, name, reconnect
        self._pool: list[str] = list(servers)  # the seeds, then the nodes the cluster announced
        self._at: str | None = None
        self._info: dict[str, object] = {}
        self._stream: trio.SocketStream | None = None
        self._connected = False
        # Set while a socket is up and once closed for good; a fresh one while a reconnect runs,
        # so a flush made meanwhile sleeps until then (trio events cannot be cleared).
        self._up = trio.Event()
        self._out = bytearray()
        self._writer_lot = trio.lowlevel.ParkingLot()
        self._pongs: deque[_Pong] = deque()
        self._unsent_pings = 0  # PINGs in _out, not yet handed to a send (see _reconnect_loop)
        self._subs: dict[int, _Sub] = {}
        self._next_sid = 0
        self._inbox = f"{inbox_prefix or '_INBOX'}.{secrets.token_hex(11)}"
        self._reply_sid: int | None = None
        self._replies: dict[str, _Reply] = {}
        self._next_token = 0
        self._closing = False
        self._in_send = False
        self._fatal: str | None = None  # this socket's -ERR other than a permissions violation
        self._max_payload = DEFAULT_MAX_PAYLOAD
        self._sends = self._sent_bytes = self._messages = self._reconnects = self._dropped = 0
        self.closed = trio.Event()
        self.error_count = 0
        self.last_error: str | None = None
        self._error_arrived = trio.Event()

    # -- what the lane calls --------------------------------------------------------------------

    @property
    def connected_url(self) -> str | None:
        """The seed or announced node the socket is up to, or None while there is none."""
        return self._at if self._connected else None

    @property
    def client_id(self) -> int | None:
        """The broker's client id for this connection (INFO ``client_id``), or None."""
        value = self._info.get("client_id")
        return value if isinstance(value, int) else None

    @property
    def connected_server_version(self) -> str | None:
        """The ``version`` the broker we are connected to announced in INFO (``2.10.22``), or
        None; what :attr:`Connection.connected_server_version` says for a nats-py connection."""
        version = self._info.get("version")
        return version if isinstance(version, str) else None

    def statistics(self) -> NativeStatistics:
        """Sync: the connection's counters (:class:`NativeStatistics`)."""
        return NativeStatistics(sends=self._sends, sent_bytes=self._sent_bytes, messages=self._messages,
                                reconnects=self._reconnects, dropped=self._dropped)

    def publish_nowait(
        self, subject: str, payload: bytes, headers: Mapping[str, str] | None = None, *, reply: str | None = None
    ) -> None:
        """Sync: queue a PUB (HPUB with ``headers``); it leaves with the writer's next send.

        Never blocks. While a reconnect runs it is held (up to ``MAX_PENDING_BYTES`` queued),
        and sent after; on a closed connection it is dropped, as are publishes past that bound
        (a warning each, counted in ``dropped``).

        Raises:
            ValueError: an empty subject or one with whitespace, a header name or value with a
                line break, or a payload above the broker's ``max_payload``.
        """
        self._write(_encode_pub(subject, reply, payload, headers, self._max_payload), publish=True)

    async def flush(self) -> None:
        """Trio: a PING round trip, so everything queued before it has reached the broker.

        While a reconnect runs it waits for the next socket (woken when that is up, or when the
        connection closes for good) and does its round trip there. A PING still queued when a
        socket went is answered on the next one by a PONG no flush takes (its flush raised).

        Raises:
            Unavailable: the connection is closed or its socket was lost before the PONG, or no
                PONG within the 10 s cap (the caller's deadline, when sooner, cancels instead).
        """
        if self.closed.is_set():
            raise Unavailable(f"flush {self._at or self._url}: the connection is closed")
        pong = _Pong()
        with trio.move_on_after(DEFAULT_CAP_S):
            while not self._connected:  # a reconnect is running: the PING goes on the next socket
                await self._up.wait()
                if self.closed.is_set():
                    raise Unavailable(f"flush {self._url}: the connection closed")
            self._ping(pong)
            await pong.arrived.wait()
        if not pong.ok:
            raise Unavailable(f"flush {self._at or self._url}: no PONG (the connection was lost or is closed)")

    async def subscribe(
        self, subject: str, *, queue: str | None = None, on_message: Callable[[Message], None]
    ) -> NativeSubscription:
        """Trio: subscribe with a callback; returns once the SUB is queued (:meth:`flush` to know
        the broker has it). Re-sent on every reconnect.

        ``on_message(msg)`` is called synchronously by the reader task; it may call trio's
        synchronous API and must neither block nor await. An exception it raises is logged and
        the message dropped. A backlog is delivered in slices of about ``CALLBACK_SLICE_S``
        (2 ms), other tasks running between slices.

        Raises:
            Unavailable: the connection is closed.
            ValueError: a malformed subject or queue name (empty, or with whitespace).
        """
        _check_token(subject, "subject")
        if queue is not None:
            _check_token(queue, "queue group")
        if self.closed.is_set():
            raise Unavailable(f"subscribe {subject}: the connection is closed")
        sub = self._add_sub(subject, queue, on_message)
        await trio.lowlevel.checkpoint()
        return NativeSubscription(self, sub)

    async def publish(self, subject: str, payload: bytes, headers: Mapping[str, str] | None = None) -> None:
        """Trio: :meth:`publish_nowait` and a checkpoint (the shape of ``Connection.publish``).

        Raises:
            Unavailable: the connection is closed.
            ValueError: as :meth:`publish_nowait`.
        """
        if self.closed.is_set():
            raise Unavailable(f"publish {subject}: the connection is closed")
        self.publish_nowait(subject, payload, headers)
        await trio.lowlevel.checkpoint()

    async def request(self, subject: str, payload: bytes, headers: Mapping[str, str] | None = None) -> Message:
        """Trio: one request, its first reply; raises as ``Connection.request`` (NoResponders for
        the broker's 503, Unavailable for no reply within 10 s or a closed connection, ValueError
        for a malformed subject or header)."""
        [answer] = await self.request_many(((subject, payload, headers),))
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def request_many(self, requests: Sequence[tuple[str, bytes, Mapping[str, str] | None]]) -> list[Message | Unavailable]:
        """Trio: publish every request at once (one send) and await every reply together.

        Replies come back on one wildcard subscription of this connection
        (``<inbox prefix>.<random>.*``), made on the first call. Each result is the reply, or
        :class:`NoResponders` (the broker's 503) or ``Unavailable`` (no reply within the 10 s
        cap, or the connection lost) for that request; the caller's deadline cancels.

        Raises:
            Unavailable: the connection is closed.
            ValueError: a malformed subject, header or payload (nothing is sent).
        """
        async with self.requests_sent(requests) as replies:
            return await replies()

    @asynccontextmanager
    async def requests_sent(
        self, requests: Sequence[tuple[str, bytes, Mapping[str, str] | None]]
    ) -> AsyncIterator[Callable[[], Awaitable[list[Message | Unavailable]]]]:
        """Trio: :meth:`request_many` in two halves (the shape of ``Connection.requests_sent``):
        the requests are queued on entry, with no checkpoint, so writes on another connection
        inside the block leave in the same scheduler pass; ``await replies()`` gives the
        results. The reply slots are released on exit.

        Raises:
            As :meth:`request_many`, on entry (a deadline already passed sends nothing).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.closed.is_set():
            raise Unavailable(f"request {requests[0][0] if requests else ''}: the connection is closed")
        encoded, slots = [], []
        for subject, payload, headers in requests:
            self._next_token += 1
            token = str(self._next_token)
            encoded.append(_encode_pub(subject, f"{self._inbox}.{token}", payload, headers, self._max_payload))
            slots.append((token, _Reply()))
        if self._reply_sid is None:
            self._reply_sid = self._add_sub(f"{self._inbox}.*", None, self._on_reply).sid

        async def replies() -> list[Message | Unavailable]:
            with trio.move_on_after(DEFAULT_CAP_S):
                for _, slot in slots:
                    await slot.arrived.wait()
            return [_answer(subject, slot) for (subject, _, _), (_, slot) in zip(requests, slots, strict=True)]

        try:
            for (token, slot), data in zip(slots, encoded, strict=True):
                self._replies[token] = slot
                self._write(data, publish=True)
            yield replies
        finally:
            for token, _ in slots:
                self._replies.pop(token, None)

    async def wait_error(self, *, after: int) -> str:
        """Trio: wait until more than ``after`` errors were reported; return the last one
        (bounded by the caller's scope)."""
        while self.error_count <= after:
            await self._error_arrived.wait()
        return self.last_error or ""

    # -- internals ------------------------------------------------------------------------------

    def _add_sub(self, subject: str, queue: str | None, on_message: Callable[[Message], None]) -> _Sub:
        self._next_sid += 1
        sub = _Sub(self._next_sid, subject, queue, on_message)
        self._subs[sub.sid] = sub
        self._write(_encode_sub(sub))
        return sub

    def _write(self, data: bytes, *, publish: bool = False) -> None:
        """Sync: append to the output buffer and wake the writer (the coalescing point).

        Only a ``publish`` is dropped past ``MAX_PENDING_BYTES``: PING, PONG, SUB and UNSUB are a
        few bytes each and always queued, since a dropped PING leaves its waiter in the FIFO of
        PONGs (every later flush would take the PONG of the one before it) and a dropped SUB
        loses the subscription without a word."""
        if self.closed.is_set():
            log.debug("nats %s: a write after close was dropped", self._url)
            return
        if publish and len(self._out) + len(data) > MAX_PENDING_BYTES:
            self._dropped += 1
            log.warning("nats %s: %d bytes already queued for the broker; a publish is dropped",
                        self._at or self._url, len(self._out))
            return
        if not self._out:
            self._writer_lot.unpark()
        self._out += data

    def _ping(self, pong: _Pong) -> None:
        """Sync: queue a PING whose PONG wakes ``pong`` (the broker answers PINGs in order, so
        the PONGs pair with the waiters in ``_pongs`` first in, first out)."""
        self._pongs.append(pong)
        self._write(b"PING\r\n")
        self._unsent_pings += 1

    def _on_reply(self, msg: Message) -> None:
        slot = self._replies.get(msg.subject[len(self._inbox) + 1:])
        if slot is not None and not slot.arrived.is_set():
            slot.msg = msg
            slot.arrived.set()

    def _error(self, text: str) -> None:
        self.last_error = text
        self.error_count += 1
        self._error_arrived.set()
        self._error_arrived = trio.Event()

    def _close_for_good(self, reason: str | None) -> None:
        if reason is not None and not self.closed.is_set():
            self._error(reason)
            log.warning("nats %s: %s", self._at or self._url, reason)
        self._connected = False
        self.closed.set()
        self._up.set()
        self._fail_waiters()
        for slot in self._replies.values():
            slot.arrived.set()

    def _fail_waiters(self) -> None:
        while self._pongs:
            self._pongs.popleft().arrived.set()

    def _learn(self, info: dict[str, object]) -> None:
        self._info = info
        max_payload = info.get("max_payload")
        if isinstance(max_payload, int) and max_payload > 0:
            self._max_payload = max_payload
        urls = info.get("connect_urls")
        if isinstance(urls, list):
            for hostport in urls:
                url = f"nats://{hostport}"
                if isinstance(hostport, str) and url not in self._pool:
                    self._pool.append(url)

    async def _handshake(self, url: str) -> tuple[trio.SocketStream, bytearray]:
        """Trio: TCP, INFO, CONNECT + PING, PONG; the stream and what was read past the PONG.

        Raises:
            _Refused: the broker answered ``-ERR``. OSError, _Lost: the socket failed or closed.
        """
        parts = urlsplit(url)
        if parts.scheme != "nats":
            raise _Refused(f"{url}: the native connection speaks no TLS")
        stream = await trio.open_tcp_stream(parts.hostname or "127.0.0.1", parts.port or 4222)
        try:
            buf = bytearray()
            line = await _read_line(stream, buf)
            if not line.startswith(b"INFO "):
                raise _Lost(f"the broker's first line is not INFO: {line[:40]!r}")
            info = _info_object(line)
            if info.get("tls_required"):
                raise _Refused(f"{url}: the broker requires TLS, which the native connection does not speak")
            await stream.send_all(b"CONNECT " + json.dumps(self._connect_options(info, parts)).encode() + b"\r\nPING\r\n")
            while True:
                line = await _read_line(stream, buf)
                if line == b"PONG":
                    break
                if line == b"PING":
                    await stream.send_all(b"PONG\r\n")
                elif line.startswith(b"-ERR"):
                    raise _Refused(_err_text(line))
                elif line.startswith(b"INFO "):
                    info = _info_object(line)
                # +OK (verbose is off) and anything else before the PONG is ignored
            self._learn(info)
            return stream, buf
        except BaseException:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            raise

    def _connect_options(self, info: dict[str, object], parts: SplitResult) -> dict[str, object]:
        options: dict[str, object] = {
            "verbose": False, "pedantic": False, "lang": "python3", "version": NATIVE_VERSION, "protocol": 1,
            "headers": True, "no_responders": True, "name": self._name,
        }
        if self._jwt is not None and self._key is not None:
            nonce = str(info.get("nonce", ""))
            options["jwt"] = self._jwt
            options["sig"] = base64.b64encode(self._key.sign(nonce.encode())).decode()
        if self._token is not None:
            options["auth_token"] = self._token
        user, password = parts.username, parts.password
        if user and self._token is None and self._jwt is None:
            options["user"], options["pass"] = user, password or ""
        return options

    async def _first_connect(self) -> tuple[trio.SocketStream, bytearray]:
        """Trio: each seed once, in order; the first that admits us. See :func:`open_native_connection`."""
        what = f"connect {self._url}"
        failure: BaseException | None = None  # the last seed's, kept as the Unavailable's cause
        with trio.move_on_after(CONNECT_CAP_S) as bound:
            for i, url in enumerate(self.servers):
                try:
                    stream, rest = await self._handshake(url)
                except _Refused as exc:  # a refusal is final, as with nats-py's connect
                    self._error(str(exc))
                    raise Unavailable(f"{what}: {exc}") from None
                except (OSError, _Lost, ValueError) as exc:
                    failure = exc
                    self._error(str(exc) or type(exc).__name__)
                    if i + 1 < len(self.servers):
                        log.info("nats %s: seed %d of %d failed (%s); trying the next", self._url, i + 1,
                                 len(self.servers), self.last_error)
                    continue
                self._at = url
                return stream, rest
        if bound.cancelled_caught:
            raise Unavailable(f"{what}: no broker confirmed the connect within {CONNECT_CAP_S:g} s")
        # from the socket's error, so a caller can tell a refused connect (nothing listens: name
        # the broker to start) from a refusal or a lost handshake (cli/_servers.refused_connect)
        raise Unavailable(f"{what}: {self.last_error}") from failure

    async def _run(self, stream: trio.SocketStream, rest: bytearray) -> None:
        """Trio: serve sockets until closed for good (the connection's one long task)."""
        while True:
            self._stream, self._connected, self._fatal = stream, True, None
            self._up.set()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._read, stream, rest, nursery.cancel_scope)
                    nursery.start_soon(self._send, stream, nursery.cancel_scope)
                    nursery.start_soon(self._keep_alive, nursery.cancel_scope)
            finally:
                self._connected, self._stream = False, None
                if not self.closed.is_set():
                    self._up = trio.Event()
                self._fail_waiters()
                with trio.CancelScope(shield=True):
                    await stream.aclose()
            if self.closed.is_set() or self._closing:
                return
            if not self._reconnect:
                self._close_for_good(self.last_error or "the broker closed the connection")
                return
            log.warning("nats %s: disconnected", self._at or self._url)
            reconnected = await self._reconnect_loop()
            if reconnected is None:
                return
            stream, rest = reconnected
            self._reconnects += 1
            log.info("nats %s: reconnected", self._at)

    async def _reconnect_loop(self) -> tuple[trio.SocketStream, bytearray] | None:
        """Trio: the next node first, each at most ``RECONNECT_ATTEMPTS`` times ``RECONNECT_WAIT_S``
        apart, for at most ``MAX_OUTAGE_S``; re-subscribes on the new socket. None: closed for good."""
        tries: dict[str, int] = {}
        last: dict[str, float] = {self._at or "": trio.current_time()}
        start = (self._pool.index(self._at) + 1) if self._at in self._pool else 0
        with trio.move_on_after(MAX_OUTAGE_S):
            while True:
                pool = self._pool[start:] + self._pool[:start]
                candidates = [url for url in pool if tries.get(url, 0) < RECONNECT_ATTEMPTS]
                if not candidates:
                    self._close_for_good(f"no broker after {RECONNECT_ATTEMPTS} attempts at each node ({self.last_error})")
                    return None
                for url in candidates:
                    wait = last.get(url, -RECONNECT_WAIT_S) + RECONNECT_WAIT_S - trio.current_time()
                    if wait > 0:
                        await trio.sleep(wait)
                    tries[url] = tries.get(url, 0) + 1
                    last[url] = trio.current_time()
                    try:
                        with trio.fail_after(PONG_TIMEOUT_S):
                            stream, rest = await self._handshake(url)
                    except (OSError, _Lost, _Refused, ValueError, trio.TooSlowError) as exc:
                        self._error(str(exc) or type(exc).__name__)
                        log.debug("nats %s: reconnect to %s failed: %s", self._url, url, self.last_error)
                        continue
                    self._at = url
                    pending = bytes(self._out)  # what was queued during the outage goes after the SUBs
                    self._out.clear()
                    # A PING queued before the loss goes with it, and this broker answers it; its
                    # waiter was failed with the old socket. A waiter nobody awaits takes each such
                    # PONG, or it would wake the next flush before that flush's own PONG.
                    self._pongs.extendleft(_Pong() for _ in range(self._unsent_pings))
                    for sub in self._subs.values():
                        self._out += _encode_sub(sub)
                    self._out += pending
                    return stream, rest
        self._close_for_good(f"no broker for {MAX_OUTAGE_S:g} s (reconnecting)")
        return None

    async def _send(self, stream: trio.SocketStream, scope: trio.CancelScope) -> None:
        """The one writer: whatever is queued when it runs leaves in one ``send_all``."""
        try:
            while True:
                if not self._out:
                    await self._writer_lot.park()
                    continue
                data = bytes(self._out)
                self._out.clear()
                self._unsent_pings = 0  # what a failed send took is lost with its socket
                self._sends += 1
                self._sent_bytes += len(data)
                self._in_send = True
                await stream.send_all(data)
                self._in_send = False
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._socket_lost(str(exc) or type(exc).__name__, scope)

    def _socket_lost(self, reason: str, scope: trio.CancelScope) -> None:
        if self._fatal is not None:  # 'User Authentication Expired', 'Stale Connection', ...
            reason = f"the broker closed the connection after -ERR '{self._fatal}' ({reason})"
        if not self._closing and not self.closed.is_set():
            self._error(reason)
        scope.cancel()

    async def _keep_alive(self, scope: trio.CancelScope) -> None:
        """PING every ``KEEPALIVE_S``; closed for good when no PONG within ``PONG_TIMEOUT_S``."""
        while True:
            await trio.sleep(KEEPALIVE_S)
            pong = _Pong()
            self._ping(pong)
            with trio.move_on_after(PONG_TIMEOUT_S):
                await pong.arrived.wait()
            if not pong.arrived.is_set() and not self._closing:
                self._close_for_good(f"no PING answered within {PONG_TIMEOUT_S:g} s - the broker is hung or unreachable")
                scope.cancel()
                return
            if not pong.ok:
                return  # the socket went meanwhile: the reader's loss ends this socket's tasks

    async def _read(self, stream: trio.SocketStream, buf: bytearray, scope: trio.CancelScope) -> None:
        """The reader: parse what arrives, answer PINGs, deliver messages in order."""
        try:
            while True:
                await self._parse(buf)
                data = await stream.receive_some(READ_BYTES)
                if not data:
                    raise _Lost("the broker closed the connection")
                buf += data
        except (_Lost, trio.BrokenResourceError, trio.ClosedResourceError, OSError, ValueError) as exc:
            self._socket_lost(str(exc) or type(exc).__name__, scope)

    async def _parse(self, buf: bytearray) -> None:
        """Consume every complete operation in ``buf`` (the rest stays for the next read)."""
        pos, end, slice_start = 0, len(buf), time.perf_counter()
        try:
            while True:
                eol = buf.find(_CRLF, pos)
                if eol < 0:
                    if end - pos > MAX_LINE_BYTES:
                        raise _Lost("a protocol line longer than the bound")
                    return
                op = buf[pos:pos + 4]
                if op in (b"MSG ", b"HMSG"):
                    subject, sid, reply, header_len, total = _msg_args(bytes(buf[pos:eol]))
                    start = eol + 2
                    if end < start + total + 2:
                        return  # its payload is still on the way
                    headers = _parse_headers(bytes(buf[start:start + header_len])) if header_len else None
                    msg = Message(subject, reply, bytes(buf[start + header_len:start + total]), headers)
                    pos = start + total + 2
                    self._messages += 1
                    self._deliver(sid, msg)
                    if time.perf_counter() - slice_start > CALLBACK_SLICE_S:
                        del buf[:pos]
                        pos, end = 0, len(buf)
                        await trio.lowlevel.checkpoint()  # timers and workers run through a burst
                        slice_start = time.perf_counter()
                    continue
                line = bytes(buf[pos:eol])
                pos = eol + 2
                if line == b"PING":
                    self._write(b"PONG\r\n")
                elif line == b"PONG":
                    if self._pongs:
                        pong = self._pongs.popleft()
                        pong.ok = True
                        pong.arrived.set()
                elif line.startswith(b"INFO "):
                    self._learn(_info_object(line))
                elif line.startswith(b"-ERR"):
                    text = _err_text(line)
                    if not text.lower().startswith("permissions violation"):
                        self._fatal = text  # the broker closes the socket after it: the reason why
                    self._error(text)
                    log.warning("nats %s: %s", self._at or self._url, text)
                # +OK: verbose is off, ignored
        finally:
            del buf[:pos]

    def _deliver(self, sid: int, msg: Message) -> None:
        sub = self._subs.get(sid)
        if sub is None:
            return  # unsubscribed meanwhile
        try:
            sub.on_message(msg)
        except Exception:
            log.exception("on_message for %s raised; message dropped", sub.subject)

    async def _aclose(self, nursery: trio.Nursery) -> None:
        """Trio: hand what is queued to the socket (bounded by ``CLOSE_S``), then close. Call it
        shielded. No PING round trip: a hung broker must not hold a stopping lane (the lane's
        drain flushes first when it wants its answers on the broker)."""
        self._closing = True
        with trio.move_on_after(CLOSE_S):
            while (self._out or self._in_send) and self._connected:  # noqa: ASYNC110 - once per close
                await trio.sleep(CLOSE_POLL_S)
        self._close_for_good(None)
        nursery.cancel_scope.cancel()


CalloutConnection = Connection | NativeConnection
"""The callout lane's connection: the trio-native one (:func:`open_native_connection`) on
``nats://`` seeds, nats-py's (:func:`~cotal_trio.natsio.open_connection`) on ``tls://`` ones."""


def speaks_native(servers: str) -> bool:
    """Sync: True when every seed of ``servers`` (a ``--server`` value) is ``nats://``, the
    scheme this connection speaks; a ``tls://`` one needs nats-py's connection.

    Raises:
        ConfigError: ``servers`` is empty or malformed (as :func:`parse_servers`).
    """
    return all(url.startswith("nats://") for url in parse_servers(servers))


def _check_token(text: str, what: str) -> None:
    if not text or any(c in text for c in " \t\r\n"):
        raise ValueError(f"a NATS {what} must be non-empty without whitespace: {text!r}")


def _encode_sub(sub: _Sub) -> bytes:
    if sub.queue:
        return f"SUB {sub.subject} {sub.queue} {sub.sid}\r\n".encode()
    return f"SUB {sub.subject} {sub.sid}\r\n".encode()


def _encode_pub(subject: str, reply: str | None, payload: bytes, headers: Mapping[str, str] | None, max_payload: int) -> bytes:
    """One PUB or HPUB operation (sync). Raises ValueError as :meth:`NativeConnection.publish_nowait`."""
    _check_token(subject, "subject")
    target = f"{subject} {reply}" if reply else subject
    if headers:
        lines = ["NATS/1.0"]
        for key, value in headers.items():
            if any(c in key for c in ":\r\n ") or any(c in value for c in "\r\n"):
                raise ValueError(f"a NATS header must have no line break (and its name no ':' or space): {key!r}")
            lines.append(f"{key}: {value}")
        block = ("\r\n".join(lines) + "\r\n\r\n").encode()
        if len(block) + len(payload) > max_payload:
            raise ValueError(f"a payload of {len(payload)} bytes is above the broker's max_payload {max_payload}")
        return b"HPUB %s %d %d\r\n%s%s\r\n" % (target.encode(), len(block), len(block) + len(payload), block, payload)
    if len(payload) > max_payload:
        raise ValueError(f"a payload of {len(payload)} bytes is above the broker's max_payload {max_payload}")
    return b"PUB %s %d\r\n%s\r\n" % (target.encode(), len(payload), payload)


def _msg_args(line: bytes) -> tuple[str, int, str | None, int, int]:
    """``MSG <subject> <sid> [reply] <#bytes>`` or ``HMSG <subject> <sid> [reply] <#hdr> <#total>``
    as (subject, sid, reply or None, header bytes, total bytes); sync.

    Raises:
        ValueError: the wrong number of arguments, a size that is not a non-negative integer,
            or a header block longer than the message (the broker broke the protocol: the
            reader drops the socket, naming it).
    """
    args = line.split()
    sizes = 2 if args[0] == b"HMSG" else 1
    try:
        if len(args) not in (3 + sizes, 4 + sizes):
            raise ValueError("wrong number of arguments")
        header_len, total = (int(args[-2]), int(args[-1])) if sizes == 2 else (0, int(args[-1]))
        if not 0 <= header_len <= total:
            raise ValueError("a negative size, or a header block longer than the message")
        reply = args[3].decode() if len(args) == 4 + sizes else None
        return args[1].decode(), int(args[2]), reply, header_len, total
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"a malformed MSG/HMSG line ({exc}): {line[:80]!r}") from None


def _parse_headers(block: bytes) -> dict[str, str] | None:
    """A header block as a dict; the status line's code and text as ``Status`` / ``Description``
    (what nats-py gives, so callers read one shape from either connection). Raises ValueError
    when it does not start with ``NATS/1.0``."""
    lines = block.decode("utf-8", "replace").split("\r\n")
    if not lines[0].startswith("NATS/1.0"):
        raise ValueError(f"a header block without NATS/1.0: {lines[0][:40]!r}")
    headers: dict[str, str] = {}
    status = lines[0][8:].strip()
    if status:
        code, _, description = status.partition(" ")
        headers[_STATUS] = code
        if description:
            headers[_DESCRIPTION] = description.strip()
    for line in lines[1:]:
        if line:
            key, _, value = line.partition(":")
            headers[key.strip()] = value.strip()
    return headers or None


def _info_object(line: bytes) -> dict[str, object]:
    """The JSON object of an ``INFO {...}`` line; sync.

    Raises:
        ValueError: it is not JSON, or not an object (the reader drops the socket, naming it).
    """
    info = json.loads(line[5:])
    if not isinstance(info, dict):
        raise ValueError("the broker's INFO is not a JSON object")
    return info


def _err_text(line: bytes) -> str:
    """``-ERR 'Authorization Violation'`` as ``Authorization Violation``."""
    return line[4:].decode("utf-8", "replace").strip().strip("'")


async def _read_line(stream: trio.SocketStream, buf: bytearray) -> bytes:
    """Trio: the next protocol line from ``buf`` and the stream (consumed from ``buf``)."""
    while True:
        eol = buf.find(_CRLF)
        if eol >= 0:
            line = bytes(buf[:eol])
            del buf[:eol + 2]
            return line
        if len(buf) > MAX_LINE_BYTES:
            raise _Lost("a protocol line longer than the bound")
        data = await stream.receive_some(READ_BYTES)
        if not data:
            raise _Lost("the broker closed the connection")
        buf += data


@asynccontextmanager
async def open_native_connection(
    servers: str | Sequence[str],
    *,
    creds: str | None = None,
    token: str | None = None,
    name: str | None = None,
    reconnect: bool = True,
    inbox_prefix: str | None = None,
) -> AsyncIterator[NativeConnection]:
    """Trio async context manager: a connected :class:`NativeConnection` (no ``open_loop`` needed).

    Args:
        servers: seed URLs (``nats://host:port``, comma-separated, or a sequence); the first
            connect tries each once, in order, and uses the first that admits it.
        creds: the TEXT of a ``.creds`` file (user JWT + seed): CONNECT carries the JWT and the
            nonce signed by the seed.
        token: CONNECT ``auth_token``.
        name: CONNECT ``name`` (the broker's monitoring shows it).
        reconnect: ride out a lost socket (module docstring); without it a loss closes for good.
        inbox_prefix: prefix of request reply subjects (default ``_INBOX``): a service user
            may subscribe only under its own (``_INBOX_<nonce>``).

    On exit what is queued is handed to the socket (at most ``CLOSE_S``), then it closes.

    Raises:
        Unavailable: no seed admitted the connect within ``CONNECT_CAP_S`` (5 s), or one refused
            it (``-ERR``: the text is in the message, e.g. ``Authorization Violation``; a
            refusal is not retried on the next seed), or a seed is ``tls://``. Nothing is left open.
        ConfigError: ``servers`` is empty or malformed. CodecError: ``creds`` is malformed.
    """
    seeds = parse_servers(servers) if isinstance(servers, str) else parse_servers(join_servers(list(servers)))
    conn = NativeConnection(seeds, creds=creds, token=token, name=name, reconnect=reconnect, inbox_prefix=inbox_prefix)
    stream, rest = await conn._first_connect()
    conn._stream, conn._connected = stream, True  # connected from here, before _run's first step
    log.debug("nats %s: connected to %s (client id %s, native)", conn._url, conn._at, conn.client_id)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn._run, stream, rest)
        try:
            yield conn
        finally:
            with trio.CancelScope(shield=True):
                await conn._aclose(nursery)
