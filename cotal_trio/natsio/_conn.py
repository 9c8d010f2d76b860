"""One nats-py connection, seen from trio: connect, publish, request, subscribe, close.

Flavours: everything public here is trio-flavoured except where a docstring says "sync". The
nested ``async def`` callbacks handed to nats-py are asyncio-flavoured; they run on the lane's
trio-asyncio loop, in the same thread as trio, and only ever make synchronous calls.

nats-py internals relied on (nats-py 2.16; re-check on upgrade):

* ``Client.options["allow_reconnect"]`` is read at each disconnect, so we connect with it off
  (a refused first connect must fail, not retry forever: pitfall P5) and switch it on after.
* An exception raised by ``error_cb`` during ``connect()`` propagates out of ``connect()``. We
  use that to stop after the first failed attempt instead of nats-py's retry loop (60 attempts,
  2 s apart, even with ``allow_reconnect=False``).
* ``connect()`` may return while not connected (server closed the socket during an auth
  callout, or sent PING before PONG: pitfall P5/P11); we check ``is_connected``.
* ``Client._server_info`` (private) for :attr:`Connection.connected_server_id` and
  :attr:`Connection.connected_server_version`.
* ``Client.connected_url`` (a ``urllib`` ``ParseResult``) is the seed or learned node the socket
  is up to, updated before ``reconnected_cb`` runs: the reconnect line names it (issue 17 item 3).
* With several ``servers`` and ``allow_reconnect`` off, ``connect()`` still tries each seed once
  in turn (its server pool), calling ``error_cb`` per failed seed; so our ``error_cb`` lets a
  failed seed pass while another is left to try and stops only after the last.
* ``Client.options["connect_timeout"]`` is read at each reconnect attempt (TCP, INFO, PONG), so
  it is lowered to ``PONG_TIMEOUT_S`` once connected: a hung broker costs each attempt that long.
* ``Client.stats["reconnects"]`` counts completed reconnects; a reconnect drops the PONG futures
  of PINGs sent before it, so the keepalive ignores a PING that a reconnect overtook.
* ``Client.publish`` appends to ``Client._pending`` and kicks the flusher task only when its
  ``_flush_queue`` is empty; the flusher writes the whole pending buffer with one
  ``writelines`` when it next runs. So publishes handed over in one synchronous stretch (a
  :meth:`Connection.request_many` batch) leave in one socket write (issue 14 item 3).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import nats.aio.client
import nats.aio.msg
import nats.aio.subscription
import nats.errors
import trio

from cotal_trio.core.creds import parse_creds
from cotal_trio.core.errors import Unavailable
from cotal_trio.core.nkeys import KeyPair
from cotal_trio.core.servers import join_servers, parse_servers

from ._loop import DEFAULT_CAP_S, current_loop, run_aio

__all__ = [
    "KEEPALIVE_S", "MAX_OUTAGE_S", "PONG_TIMEOUT_S", "Connection", "Message", "NoResponders", "Subscription",
    "open_connection",
]

log = logging.getLogger("cotal.natsio")

# Bound on the initial connect (TCP + INFO + CONNECT + PONG) when the caller has no tighter
# deadline. Above the broker's default auth timeout (2 s), so a callout verdict or the broker's
# EOF (pitfall P5) arrives before our own bound. Seconds.
CONNECT_CAP_S = 5.0
# A lost socket is retried this many times, this many seconds apart, before the connection
# closes: a broker restart of a few seconds goes unnoticed, a longer outage ends the lane.
RECONNECT_ATTEMPTS = 5
RECONNECT_WAIT_S = 1.0
# Bound on closing a connection: flushing scheduled replies and nats-py's close. Seconds.
CLOSE_S = 5.0
# Keepalive (issue 15 item 5, spec "Callout replicas": a replica whose broker stops answering
# exits): each connection PINGs its broker this often and counts it lost when no PONG comes back
# within PONG_TIMEOUT_S, so a broker that holds the socket open but answers nothing (hung,
# SIGSTOPped, a dead path without RST) is noticed within about 6 s, not after nats-py's default
# pings (120 s apart, three missed). A connection that is reconnecting is lost once it has had
# no broker for MAX_OUTAGE_S (the reconnects themselves ride out a restart of a few seconds).
KEEPALIVE_S = 2.0
PONG_TIMEOUT_S = 4.0
MAX_OUTAGE_S = 10.0
# Pitfalls P5/P11: the broker hung up during CONNECT (an auth callout that did not answer in
# time) or sent PING before PONG (a callout slower than ~2 s); nats-py then returns unconnected.
_NOT_CONFIRMED = "the broker did not confirm CONNECT (closed, or a slow auth callout)"
# A subscription's callbacks run for about this long before letting other trio tasks run. Seconds.
CALLBACK_SLICE_S = 0.002
# The status header nats-py puts on a broker status message; 503 is "no responders".
_STATUS, _NO_RESPONDERS = "Status", "503"
# nats-py errors that mean our own call was malformed (a bug here), not a broker failure.
_CALLER_BUGS = (
    nats.errors.BadSubjectError,
    nats.errors.BadHeaderError,
    nats.errors.MaxPayloadError,
    nats.errors.BadTimeoutError,
)


@dataclass(frozen=True, slots=True)
class Message:
    """A received NATS message, copied out of nats-py's ``Msg``.

    Attributes:
        subject: the subject it was published to.
        reply: the reply subject, or None when the publisher expects no answer.
        data: the payload bytes.
        headers: the NATS headers, or None when the message had none.
    """

    subject: str
    reply: str | None
    data: bytes
    headers: dict[str, str] | None

    @classmethod
    def _from_nats(cls, msg: nats.aio.msg.Msg) -> Message:
        headers = dict(msg.headers) if msg.headers else None
        return cls(msg.subject, msg.reply or None, bytes(msg.data), headers)


class NoResponders(Unavailable):
    """A request reached no subscriber (the broker's 503 status): raised by :meth:`Connection.request`."""


class _Reply:
    """One request's reply slot: set by the reply subscription's callback, awaited by trio."""

    __slots__ = ("arrived", "msg")

    def __init__(self) -> None:
        self.arrived = trio.Event()
        self.msg: Message | None = None  # None once arrived: the connection closed


class _ConnectFailed(Exception):
    """Raised by our ``error_cb`` during the initial connect to stop nats-py's retry loop."""


def _translate(what: str, exc: Exception) -> Exception:
    """Map a nats-py or socket error to ours (STYLE 19): the exception to raise ``from exc``."""
    if isinstance(exc, _CALLER_BUGS):
        return ValueError(f"{what}: {exc}")
    return Unavailable(f"{what}: {exc}")


class Subscription:
    """A callback subscription made by :meth:`Connection.subscribe`."""

    def __init__(self, conn: Connection, sub: nats.aio.subscription.Subscription) -> None:
        self._conn = conn
        self._sub = sub
        self._unsubscribed = False
        self.subject: str = sub.subject
        self.queue: str | None = sub.queue or None

    async def unsubscribe(self) -> None:
        """Trio-flavoured: remove interest; no more ``on_message`` calls after it returns.

        Idempotent, and a no-op once the connection is closed (the broker dropped the interest
        with the socket). Cancellation: interest may or may not have been removed.

        Raises:
            Unavailable: the broker could not be told (connection broken).
        """
        if self._unsubscribed or self._conn._nc.is_closed:
            await trio.lowlevel.checkpoint()
            return
        await self._conn._call(lambda _: self._sub.unsubscribe(), f"unsubscribe {self.subject}")
        self._unsubscribed = True

    async def drain(self) -> None:
        """Trio-flavoured: remove interest, then deliver what had already arrived.

        Unlike :meth:`unsubscribe`, which drops the messages nats-py holds for the callback, it
        returns once the broker has the UNSUB (a PING round trip) and every message it sent
        before has been passed to ``on_message`` (a stopping lane: issue 15 item 8). Idempotent,
        and a no-op once the connection is closed. Cancellation: as :meth:`unsubscribe`.

        Raises:
            Unavailable: the broker could not be told (connection broken).
        """
        if self._unsubscribed or self._conn._nc.is_closed:
            await trio.lowlevel.checkpoint()
            return
        self._unsubscribed = True
        await self._conn._call(lambda _: self._sub.drain(), f"drain {self.subject}")


class Connection:
    """A connected nats-py client, trio-flavoured. Made only by :func:`open_connection`.

    Methods may be called from any trio task of the same ``trio.run`` while the connection is
    open (the lane's loop is held here, not looked up from the caller's context).

    Attributes:
        closed: set when the connection is closed for good (our close, the broker deleting the
            account, or a connection that may not reconnect losing its socket) or is lost: its
            broker answered no keepalive PING within ``PONG_TIMEOUT_S``, or a reconnecting
            connection had no broker for ``MAX_OUTAGE_S`` (``last_error`` says which).
        error_count: how many errors nats-py has reported (see :meth:`wait_error`).
        last_error: the text of the last error nats-py reported (permissions violations, socket
            errors, stale connection), or None.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, servers: tuple[str, ...]) -> None:
        self._loop = loop
        self._servers = servers
        self._url = join_servers(servers)  # log lines before a node is reached name every seed
        self._seeds_failed = 0  # seeds the initial connect has given up on (see _error_cb)
        self._at: str | None = None  # the node last reached: what later log lines name
        self._nc = nats.aio.client.Client()
        self._connecting = False
        self._stepped: set[asyncio.Task[None]] = set()  # publishes that had to suspend
        self._closing = False
        self.closed = trio.Event()
        self.last_error: str | None = None
        self.error_count = 0
        self._error_arrived = trio.Event()
        self._keeper: asyncio.Task[None] | None = None  # the keepalive, once connected
        # Requests (see `request`): one wildcard reply subscription, made at the first request.
        self._reply_prefix: str | None = None
        self._reply_lock = trio.Lock()
        self._replies: dict[str, _Reply] = {}
        self._next_token = 0

    # -- state -----------------------------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        """Sync: True while a socket is up (False while reconnecting and after close)."""
        return self._nc.is_connected

    @property
    def client_id(self) -> int | None:
        """Sync: the client id the broker assigned (from its INFO), or None."""
        return self._nc.client_id

    @property
    def servers(self) -> tuple[str, ...]:
        """Sync: the seed URLs this connection was opened with, in order."""
        return self._servers

    @property
    def connected_url(self) -> str | None:
        """Sync: ``nats://host:port`` of the node the socket is up to (a seed, or a node learned
        from the cluster's INFO), or None while not connected."""
        url = self._nc.connected_url if self._nc.is_connected else None
        return None if url is None else f"{url.scheme}://{url.hostname}:{url.port}"

    @property
    def connected_server_id(self) -> str | None:
        """Sync: the ``server_id`` (an ``N...`` key) of the broker we are connected to, or None."""
        info = getattr(self._nc, "_server_info", None) or {}
        return info.get("server_id")

    @property
    def connected_server_version(self) -> str | None:
        """Sync: the ``version`` the broker we are connected to announced (``2.10.22``), or None."""
        info = getattr(self._nc, "_server_info", None) or {}
        version = info.get("version")
        return version if isinstance(version, str) else None

    # -- operations ------------------------------------------------------------------------

    async def _call(self, make_coro: Callable[[float], Any], what: str, **kw: Any) -> Any:
        """Trio: run a nats-py coroutine through :func:`run_aio`, translating its errors."""
        try:
            return await run_aio(self._loop, make_coro, what=what, **kw)
        except (nats.errors.Error, OSError) as exc:
            raise _translate(what, exc) from exc

    async def publish(
        self, subject: str, payload: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        """Trio: publish ``payload`` (bytes) on ``subject``; returns once nats-py buffered it.

        Delivery is not confirmed; :meth:`flush` confirms the broker has everything sent so far.

        Raises:
            Unavailable: the connection is closed or draining.
            ValueError: a malformed subject or header, or a payload over the broker's max.
        """
        h = dict(headers) if headers else None
        what = f"publish {subject}"
        await self._call(lambda _: self._nc.publish(subject, payload, headers=h), what)

    def publish_nowait(
        self, subject: str, payload: bytes, headers: Mapping[str, str] | None = None, *, reply: str | None = None
    ) -> None:
        """Sync: hand a publish to nats-py now, without awaiting it (the callout's reply path).

        DESIGN.md section 5: no bridge crossing and no asyncio task per reply. nats-py's
        ``publish`` only appends to its outgoing buffer and kicks its flusher, which never
        suspends unless that buffer is over its limit; so the coroutine is stepped here, and
        only a publish that does suspend gets a task to finish it (tracked, awaited at close).
        Publishes of one connection leave in the order of these calls. A failure is logged,
        never raised here.

        Args:
            reply: the reply subject the receiver answers on, or None.

        Raises:
            Unavailable: the connection is already closed or closing.
        """
        try:
            self._publish_now(subject, payload, headers, reply)
        except Unavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - one reply; the connection goes on
            log.warning("publish to %s failed: %s", subject, exc)

    def _publish_now(
        self, subject: str, payload: bytes, headers: Mapping[str, str] | None, reply: str | None
    ) -> None:
        """Sync: :meth:`publish_nowait`, raising what nats-py raised at once (a bad subject)."""
        if self._closing or self._nc.is_closed or self._loop.is_closed():
            raise Unavailable(f"publish {subject}: the connection is closed")
        coro = self._nc.publish(subject, payload, reply=reply or "", headers=dict(headers) if headers else None)
        try:
            awaited = coro.send(None)
        except StopIteration:
            return
        task = self._loop.create_task(_finish_stepped(coro, awaited, subject))
        self._stepped.add(task)
        task.add_done_callback(self._stepped.discard)

    async def request(
        self, subject: str, payload: bytes, headers: Mapping[str, str] | None = None
    ) -> Message:
        """Trio: publish a request and return the first reply.

        The request is handed to nats-py at once (:meth:`publish_nowait`), so requests and
        publishes of one connection reach the broker in the order they were made (except a
        connection's very first request, which first subscribes to its replies). The reply
        comes back on one wildcard subscription per connection (``<inbox prefix>.<nuid>.*``,
        made at the first request) and wakes this task directly: no asyncio task per request,
        and a cancelled request leaves nothing to wait for (its late reply is dropped).

        Bounded by the caller's deadline (then ``Cancelled``, as any trio wait), or by
        ``DEFAULT_CAP_S`` (10 s) when the caller sets none (then ``Unavailable``).

        Raises:
            NoResponders: nothing subscribes to ``subject`` (the broker's 503 status).
            Unavailable: no reply within the 10 s cap, or the connection is (or got) closed.
            ValueError: a malformed subject or header.
        """
        answer = (await self.request_many(((subject, payload, headers),)))[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def request_many(
        self, requests: Sequence[tuple[str, bytes, Mapping[str, str] | None]]
    ) -> list[Message | Unavailable]:
        """Trio: publish several requests together and await their replies together (pipelining).

        Every request is handed to nats-py in one synchronous stretch, so they leave in this
        order and in one socket write (nats-py's flusher writes its whole pending buffer at once;
        it runs only once this task waits), then the replies are awaited together: the cost is
        one round trip, not one per request. Use it for requests that do not depend on each
        other's answers.

        Returns one entry per request, in order: its reply, or the :class:`NoResponders` /
        :class:`~cotal_trio.core.errors.Unavailable` it got (a missing reply within the 10 s
        cap, or the connection closed). Bounded like :meth:`request` (the cap is for the lot).

        Raises:
            Unavailable: the connection is closed before anything was sent.
            ValueError: a malformed subject or header (nothing after it is sent).
        """
        async with self.requests_sent(requests) as replies:
            return await replies()

    @asynccontextmanager
    async def requests_sent(
        self, requests: Sequence[tuple[str, bytes, Mapping[str, str] | None]]
    ) -> AsyncIterator[Callable[[], Awaitable[list[Message | Unavailable]]]]:
        """Trio: :meth:`request_many` in two halves: the requests are handed to nats-py on entry
        (one synchronous stretch, no checkpoint after the first use of this connection), and the
        block awaits ``replies()`` when it wants them. Work on another connection inside the
        block leaves in the same scheduler pass, so two connections' writes cost one round trip
        together (the callout's issuance row beside its issued-authority rows: issue 14 item 3).

        The reply slots are released on exit, whether or not ``replies()`` was awaited.

        Raises:
            As :meth:`request_many`, on entry.
        """
        await trio.lowlevel.checkpoint_if_cancelled()  # a deadline already passed sends nothing
        prefix = await self._reply_subject_prefix()
        slots: list[tuple[str, _Reply]] = []

        async def replies() -> list[Message | Unavailable]:
            with trio.move_on_after(DEFAULT_CAP_S):
                for _, slot in slots:
                    await slot.arrived.wait()
            return [_answer(subject, slot) for (subject, _, _), (_, slot) in zip(requests, slots, strict=True)]

        try:
            for subject, payload, headers in requests:
                self._next_token += 1
                token, slot = str(self._next_token), _Reply()
                self._replies[token] = slot
                slots.append((token, slot))
                try:
                    self._publish_now(subject, payload, headers, prefix + token)
                except (nats.errors.Error, OSError) as exc:
                    raise _translate(f"request {subject}", exc) from exc
            yield replies
        finally:
            for token, _ in slots:
                del self._replies[token]

    async def _reply_subject_prefix(self) -> str:
        """Trio: ``<inbox prefix>.<nuid>.``, subscribing to its wildcard at the first call."""
        if self._reply_prefix is not None:
            return self._reply_prefix
        async with self._reply_lock:
            if self._reply_prefix is None:
                inbox = self._nc.new_inbox()
                # Shielded (nats-py only queues the SUB): a cancelled first request must not
                # leave a subscription made but not recorded, and the next one make another.
                with trio.CancelScope(shield=True):
                    await self._call(
                        lambda _: self._nc.subscribe(f"{inbox}.*", cb=self._on_reply), f"subscribe {inbox}.*"
                    )
                self._reply_prefix = f"{inbox}."
        return self._reply_prefix

    async def _on_reply(self, msg: nats.aio.msg.Msg) -> None:  # asyncio-flavoured, never suspends
        prefix = self._reply_prefix
        slot = self._replies.get(msg.subject[len(prefix):]) if prefix else None
        if slot is not None and not slot.arrived.is_set():
            slot.msg = Message._from_nats(msg)
            slot.arrived.set()

    def _fail_requests(self) -> None:
        """Sync: wake every waiting request with no reply (the connection closed)."""
        for slot in self._replies.values():
            slot.arrived.set()

    async def subscribe(
        self, subject: str, *, queue: str | None = None, on_message: Callable[[Message], None]
    ) -> Subscription:
        """Trio: subscribe with a callback; returns once nats-py has queued the SUB.

        ``on_message(msg)`` is called synchronously on the lane's asyncio loop, which runs in
        trio's thread: it may call trio's synchronous API (``MemorySendChannel.send_nowait``,
        ``Event.set``) and must neither block nor await. An exception it raises is logged and
        the message dropped. A backlog is delivered in slices of about ``CALLBACK_SLICE_S``
        (2 ms) of callbacks, with other trio tasks run between slices. Call :meth:`flush` to
        know the broker has the interest.

        Raises:
            Unavailable: the connection is closed.
            ValueError: a malformed subject or queue name.
        """

        slice_start = last_end = 0.0

        async def cb(msg: nats.aio.msg.Msg) -> None:  # asyncio-flavoured
            # nats-py's subscription task hands over its whole backlog in one asyncio step, and
            # trio runs nothing else meanwhile: past CALLBACK_SLICE_S of callbacks it yields once,
            # so timers (the callout's deadlines) and workers keep running through a burst.
            nonlocal slice_start, last_end
            start = time.perf_counter()
            if start - last_end > CALLBACK_SLICE_S:
                slice_start = start  # the task was idle: a new slice
            try:
                on_message(Message._from_nats(msg))
            except Exception:
                log.exception("on_message for %s raised; message dropped", subject)
            last_end = time.perf_counter()
            if last_end - slice_start > CALLBACK_SLICE_S:
                await asyncio.sleep(0)
                slice_start = last_end = time.perf_counter()

        sub = await self._call(
            lambda _: self._nc.subscribe(subject, queue=queue or "", cb=cb), f"subscribe {subject}"
        )
        return Subscription(self, sub)

    async def flush(self) -> None:
        """Trio: round-trip a PING so everything sent before it has reached the broker.

        Raises:
            Unavailable: the connection is closed, or no PONG within the 10 s cap.
        """
        await self._call(lambda bound_s: self._nc.flush(timeout=bound_s), "flush")

    async def wait_error(self, *, after: int) -> str:
        """Trio: wait until more than ``after`` errors were reported; return the last one.

        Read :attr:`error_count` before the action that may fail, then pass it here, so an
        error that arrives before the wait starts is not missed. Bounded by the caller's scope.
        """
        while self.error_count <= after:
            await self._error_arrived.wait()
        return self.last_error or ""

    # -- lifecycle ---------------------------------------------------------------------------

    async def _error_cb(self, exc: Exception) -> None:  # asyncio-flavoured
        self.last_error = str(exc) or type(exc).__name__
        self.error_count += 1
        self._error_arrived.set()
        self._error_arrived = trio.Event()
        if self._connecting:
            # nats-py goes on to the next seed after a failed one; stop after each seed had its try.
            self._seeds_failed += 1
            if self._seeds_failed < len(self._servers):
                log.info("nats %s: seed %d of %d failed (%s); trying the next", self._url,
                         self._seeds_failed, len(self._servers), self.last_error)
                return
            raise _ConnectFailed(self.last_error) from exc
        log.warning("nats %s: %s", self._at or self._url, self.last_error)

    async def _disconnected_cb(self) -> None:  # asyncio-flavoured
        if not self._connecting and not self._nc.is_closed:
            log.warning("nats %s: disconnected", self._at or self._url)

    async def _reconnected_cb(self) -> None:  # asyncio-flavoured
        # The node reached, not the seeds: after a node loss the operator reads where it went.
        self._at = self.connected_url or self._at
        log.info("nats %s: reconnected", self._at or self._url)

    async def _closed_cb(self) -> None:  # asyncio-flavoured
        self._fail_requests()
        self.closed.set()

    def _lost(self, reason: str) -> None:
        """Sync: the broker stopped answering: report it as the connection closing for good."""
        self.last_error = reason
        self.error_count += 1
        self._error_arrived.set()
        self._error_arrived = trio.Event()
        log.warning("nats %s: %s", self._at or self._url, reason)
        self._fail_requests()
        self.closed.set()

    async def _keep_alive(self) -> None:  # asyncio-flavoured: a task on the lane's loop
        """PING every ``KEEPALIVE_S``; :meth:`_lost` when a PONG is late or the broker is gone long.

        A PING is sent only while connected (never into a reconnect's handshake), and a PING a
        reconnect overtook is not judged (the reconnect dropped its PONG future).
        """
        loop, nc = self._loop, self._nc
        down_since: float | None = None
        while not (nc.is_closed or self.closed.is_set()):
            await asyncio.sleep(KEEPALIVE_S)
            if nc.is_closed or self._closing:
                return
            if not nc.is_connected:
                down_since = loop.time() if down_since is None else down_since
                if loop.time() - down_since >= MAX_OUTAGE_S:
                    self._lost(f"no broker for {MAX_OUTAGE_S:g} s (reconnecting)")
                    return
                continue
            down_since, reconnects = None, nc.stats["reconnects"]
            try:
                await nc.flush(timeout=PONG_TIMEOUT_S)
            except nats.errors.FlushTimeoutError:
                if nc.is_connected and nc.stats["reconnects"] == reconnects and not self._closing:
                    self._lost(f"no PING answered within {PONG_TIMEOUT_S:g} s - the broker is hung or unreachable")
                    return
            except (nats.errors.Error, OSError) as exc:  # closed or reconnecting: judged next round
                log.debug("nats %s: keepalive: %r", self._at or self._url, exc)

    async def _connect(self, options: dict[str, Any], reconnect: bool) -> None:
        """Trio: the initial connect; see :func:`open_connection` for errors."""

        async def connect(bound_s: float) -> None:  # asyncio-flavoured
            self._connecting = True
            try:
                await self._nc.connect(connect_timeout=bound_s, **options)
            finally:
                self._connecting = False
            if not self._nc.is_connected:  # pitfall P5: returned without raising
                raise _ConnectFailed(self.last_error or _NOT_CONFIRMED)
            self._nc.options["allow_reconnect"] = reconnect
            self._nc.options["connect_timeout"] = PONG_TIMEOUT_S  # each reconnect attempt's bound
            self._keeper = asyncio.get_running_loop().create_task(self._keep_alive())
            self._at = self.connected_url

        what = f"connect {self._url}"
        try:
            await run_aio(self._loop, connect, cap_s=CONNECT_CAP_S, what=what)
        except _ConnectFailed as exc:
            raise Unavailable(f"{what}: {exc}") from exc.__cause__
        except (nats.errors.Error, OSError) as exc:
            raise _translate(what, exc) from exc
        log.debug("nats %s: connected to %s (client id %s)", self._url, self._at, self.client_id)

    async def _aclose(self) -> None:
        """Trio: wait for scheduled replies, then close nats-py. Call it shielded and bounded."""

        async def close(bound_s: float) -> None:  # asyncio-flavoured
            self._closing = True
            if self._keeper is not None:
                self._keeper.cancel()
            if self._stepped:
                await asyncio.wait(set(self._stepped), timeout=bound_s)
            if not self._nc.is_closed:
                await self._nc.close()

        try:
            await run_aio(self._loop, close, cap_s=CLOSE_S, what=f"close {self._url}")
        except Exception as exc:  # closing a never-connected client can trip nats-py asserts
            log.debug("nats %s: close: %r", self._url, exc)
        finally:
            self._fail_requests()
            self.closed.set()


def _answer(subject: str, slot: _Reply) -> Message | Unavailable:
    """A request's outcome from its reply slot: the reply, or the error to raise for it."""
    what = f"request {subject}"
    if not slot.arrived.is_set():
        return Unavailable(f"{what}: no answer within {DEFAULT_CAP_S:g} s")
    if slot.msg is None:
        return Unavailable(f"{what}: the connection closed")
    if slot.msg.headers and slot.msg.headers.get(_STATUS) == _NO_RESPONDERS:
        return NoResponders(f"{what}: no responders")
    return slot.msg


async def _finish_stepped(coro: Coroutine[Any, Any, None], awaited: Any, subject: str) -> None:
    """Asyncio-flavoured: run a coroutine that suspended on ``awaited`` after one manual step.

    Plays the part of the task that would have run it, as asyncio's ``Task`` does: wait for the
    future it yielded, then resume it (the coroutine reads the future's result or exception
    itself). A cancel of this task is thrown into the coroutine, as under its own task, so the
    publish stops there and this task ends cancelled.
    """
    try:
        while True:
            try:
                if awaited is None:  # a bare yield (``asyncio.sleep(0)``): one loop round
                    await asyncio.sleep(0)
                else:
                    # Future.__await__ marked the future blocking when it yielded it to our manual
                    # step; a task clears that mark before it waits (Task.__step), else awaiting
                    # it again fails at once with "await wasn't used with future".
                    awaited._asyncio_future_blocking = False
                    await awaited
            except asyncio.CancelledError as cancel:  # ours, or the future's: the coroutine's to see
                awaited = coro.throw(cancel)
                continue
            except Exception:  # noqa: BLE001 - the future's failure: the coroutine reads it itself
                pass
            awaited = coro.send(None)
    except StopIteration:
        pass
    except Exception as exc:  # noqa: BLE001 - one reply; the connection goes on
        log.warning("publish to %s failed: %s", subject, exc)


def _creds_options(creds: str) -> dict[str, Any]:
    """nats-py options that authenticate with the TEXT of a ``.creds`` file.

    nats-py's own ``user_credentials=RawCredentials(...)`` imports the ``nkeys`` package, which
    is not a dependency; we sign the nonce with our PyNaCl codec instead.

    Raises:
        CodecError: the text is not a creds file or its seed is malformed.
    """
    jwt, seed = parse_creds(creds)
    key = KeyPair.from_seed(seed)
    jwt_bytes = jwt.encode()

    def user_jwt_cb() -> bytes:
        return jwt_bytes

    def signature_cb(nonce: str) -> bytes:
        return base64.b64encode(key.sign(nonce.encode()))

    return {"user_jwt_cb": user_jwt_cb, "signature_cb": signature_cb}


@asynccontextmanager
async def open_connection(
    servers: str | Sequence[str],
    *,
    creds: str | None = None,
    token: str | None = None,
    name: str | None = None,
    reconnect: bool = True,
    inbox_prefix: str | None = None,
) -> AsyncIterator[Connection]:
    """Trio-flavoured async context manager: a connected :class:`Connection`.

    Must be entered inside :func:`~cotal_trio.natsio.open_loop`. The connection is closed in a
    shielded ``finally`` bounded by ``CLOSE_S`` (5 s), after scheduled replies are sent.

    Args:
        servers: the broker's seed URLs: ``nats://host:port``, a comma-separated list of them
            (a ``--server`` value), or a sequence. The first connect tries each in order, once,
            and uses the first that admits it; reconnects go to any seed or any node the cluster
            announced (nats-py's server pool).
        creds: the text of a NATS ``.creds`` file (user JWT + seed), not a path.
        token: sent as the CONNECT ``auth_token`` (next to ``creds`` when both are given: the
            bearer for an auth callout).
        name: the CONNECT ``name`` shown by the broker's monitoring.
        reconnect: after the first successful connect, ride out a lost socket: up to
            ``RECONNECT_ATTEMPTS`` (5) reconnects ``RECONNECT_WAIT_S`` (1 s) apart, nats-py
            re-subscribing by itself; then the connection closes (``closed`` is set), so a lane
            whose broker stays away ends and its host names it and retries it (issue 3 item 4).
            The first connect never retries.
        inbox_prefix: prefix of request reply subjects (default nats-py's ``_INBOX``).

    Every connection runs a keepalive once connected (``KEEPALIVE_S``, ``PONG_TIMEOUT_S``,
    ``MAX_OUTAGE_S``): a broker that stops answering sets ``closed`` within about 6 s, with
    ``last_error`` naming it, as a closed socket does (issue 15 item 5).

    Raises:
        Unavailable: no seed was reachable, or the first reachable one refused the connect (a
            refusal is not retried on the next seed); the message carries the last error's
            text, e.g. ``'Authorization Violation'``. Nothing is left open. Bounded by the
            caller's deadline (``Cancelled``) or ``CONNECT_CAP_S`` (5 s) without one, for all
            the seeds together.
        ConfigError: ``servers`` is empty or has an item that is not ``nats://`` / ``tls://``.
        CodecError: ``creds`` is malformed.
        RuntimeError: no enclosing ``open_loop()``.

    A seed that refuses TCP (a stopped node) costs nothing; one that accepts it and never
    answers (a hung node) uses up the connect bound, so later seeds are not reached in time.
    Log lines name the node reached (``nats nats://n2:4222: reconnected``) once there is one,
    every seed before.
    """
    loop = current_loop()
    seeds = parse_servers(servers) if isinstance(servers, str) else parse_servers(join_servers(list(servers)))
    options: dict[str, Any] = {
        "servers": list(seeds),
        "dont_randomize": True,  # seeds in the order given: the operator's first choice first
        "name": name,
        "allow_reconnect": False,  # switched to `reconnect` once connected
        "max_reconnect_attempts": RECONNECT_ATTEMPTS if reconnect else 0,
        "reconnect_time_wait": RECONNECT_WAIT_S,
        "token": token,
    }
    if creds is not None:
        options.update(_creds_options(creds))
    if inbox_prefix is not None:
        options["inbox_prefix"] = inbox_prefix
    conn = Connection(loop, seeds)
    options.update(
        error_cb=conn._error_cb,
        disconnected_cb=conn._disconnected_cb,
        reconnected_cb=conn._reconnected_cb,
        closed_cb=conn._closed_cb,
    )
    try:
        await conn._connect(options, reconnect)
        yield conn
    finally:
        with trio.move_on_after(CLOSE_S, shield=True) as scope:
            await conn._aclose()
        if scope.cancelled_caught:
            log.warning("nats %s: close did not finish within %.0f s", conn._url, CLOSE_S)
