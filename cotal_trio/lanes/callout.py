"""The callout responder of one lane: admission, deadlines and the log line (DESIGN.md 5-6).

Shape (DESIGN.md section 5): the nats-py subscription callback only calls :meth:`on_message`,
which does ``send_nowait`` into a bounded trio channel (or sheds the request at once). Each of
``max_in_flight`` worker tasks takes the oldest request and runs the pure steps of
:mod:`cotal_trio.core.callout`, with its I/O between them, under ``trio.move_on_at(deadline)``:
the deadline is a cancel scope, checked between steps, so a request whose deadline passes stops
at its next step and gets the signed ``timeout:`` denial and nothing after it (spec "Callout
deadlines"). The wall clock is read once per request. Replies go out through
``publish_nowait`` (no await across the bridge per message).
"""

from __future__ import annotations

import functools
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from ..core.admission import CalloutLimits, should_shed
from ..core.callout import (
    TIMEOUT_REASON,
    CalloutKeys,
    Dropped,
    check_bearer,
    decide_connect,
    encode_response,
    mint_user_jwt,
    open_request,
)
from ..core.callout_log import CalloutRecord, Outcome, Step, format_callout_line, format_dropped_line, is_slow
from ..core.errors import CodecError, Refused
from ..core.bearer import BearerVerifier
from ..core.ledger import ReadRows
from ..core.natsjwt import AuthorizationRequest
from ..natsio import Message

__all__ = ["CalloutResponder", "CALLOUT_QUEUE_GROUP", "CALLOUT_SUBJECT"]

log = logging.getLogger("cotal.callout")

CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
CALLOUT_QUEUE_GROUP = "cotal-auth-callout"
# Requests buffered between the nats-py callback and the dispatcher; beyond this a burst is
# shed at once rather than queued where it could never meet its deadline.
CHANNEL_CAPACITY = 1024

INTERNAL_ERROR_REASON = "internal error in the auth callout - see the auth service log"
Publish = Callable[[str, bytes], None]


@dataclass(slots=True, kw_only=True)
class _Statistics:
    answered: dict[Outcome, int] = field(default_factory=lambda: dict.fromkeys(Outcome, 0))
    dropped: int = 0
    in_flight: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CalloutStatistics:
    """A snapshot of one lane's callout (STYLE.md practice 11)."""

    answered: dict[str, int]
    dropped: int
    waiting: int
    in_flight: int


class CalloutResponder:
    """Answers one space's ``$SYS.REQ.USER.AUTH`` requests.

    ``max_in_flight`` worker tasks take requests from one bounded FIFO channel, so requests
    start oldest first and at most that many are in progress (spec "Callout deadlines").

    Args:
        keys: the lane's callout keys (provenance, signing, sealing).
        verifier: the space's bearer verifier (issuer keys plus the verified-token memo).
        read_ledger: ``(owner, actor) -> (interactive, managed)`` rows, fresh; a
            :class:`~cotal_trio.state.LedgerReader` (a ``stat`` per row, inline).
        limits: callout limits (deadline budget, in-flight cap, slow threshold).
        clock: wall time, unix seconds.
        publish: schedules a reply without awaiting (``Connection.publish_nowait``).
    """

    def __init__(
        self,
        *,
        keys: CalloutKeys,
        verifier: BearerVerifier,
        read_ledger: ReadRows,
        limits: CalloutLimits,
        clock: Callable[[], float],
        publish: Publish,
    ) -> None:
        self._keys, self._verifier, self._read_ledger = keys, verifier, read_ledger
        self._limits, self._clock, self._publish = limits, clock, publish
        self._send, self._recv = trio.open_memory_channel[tuple[Message, float]](CHANNEL_CAPACITY)
        self._waiting: deque[float] = deque()  # receipt times of queued requests, oldest first
        self._stats = _Statistics()
        self._timeout_warned = False

    # -- the asyncio side ----------------------------------------------------------------------

    def on_message(self, msg: Message) -> None:
        """Subscription callback: enqueue without blocking, or shed at once.

        A request is shed when the oldest queued request has waited more than half the budget
        (the queue is not draining in time), or when the queue is full.
        """
        received = trio.current_time()
        if len(self._waiting) >= CHANNEL_CAPACITY or should_shed(self._oldest_waited(received), self._limits):
            self._shed(msg)
            return
        self._waiting.append(received)
        self._send.send_nowait((msg, received))  # never full: checked above

    # -- the trio side -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve requests until cancelled, ``max_in_flight`` at a time (startable)."""
        async with trio.open_nursery() as nursery:
            for _ in range(self._limits.max_in_flight):
                nursery.start_soon(self._worker)
            task_status.started()

    def statistics(self) -> CalloutStatistics:
        """Counts of answers by outcome, drops, and the current queue and in-flight."""
        return CalloutStatistics(
            answered={str(k): v for k, v in self._stats.answered.items()},
            dropped=self._stats.dropped,
            waiting=len(self._waiting),
            in_flight=self._stats.in_flight,
        )

    async def _worker(self) -> None:
        async for msg, received in self._recv:
            self._waiting.popleft()  # FIFO: the request received is the oldest queued
            self._stats.in_flight += 1
            try:
                await self._serve(msg, received)
            finally:
                self._stats.in_flight -= 1

    def _open(self, msg: Message, now: float) -> AuthorizationRequest | None:
        try:
            request = open_request(msg.data, msg.headers, keys=self._keys, now=now)
        except Dropped as exc:
            self._stats.dropped += 1
            log.warning(format_dropped_line(self._keys.space, str(exc)))
            return None
        self._check_broker_timeout(request)
        return request if msg.reply else None

    def _check_broker_timeout(self, request: AuthorizationRequest) -> None:
        broker_s = request.exp - request.iat
        if not self._timeout_warned and abs(broker_s - self._limits.auth_timeout_s) > 1:
            self._timeout_warned = True
            log.warning(
                "auth callout: space=%s the broker's authorization timeout is %ss but this auth "
                "service uses %ss - start it with --auth-timeout %s",
                self._keys.space, broker_s, self._limits.auth_timeout_s, broker_s,
            )

    def _record(self, request: AuthorizationRequest) -> CalloutRecord:
        return CalloutRecord(space=self._keys.space, req=request.user_nkey, cid=request.client_id)

    def _oldest_waited(self, now: float) -> float | None:
        return now - self._waiting[0] if self._waiting else None

    async def _serve(self, msg: Message, received: float) -> None:
        start, now = trio.current_time(), self._clock()
        request = self._open(msg, now)
        if request is None:
            return
        record = self._record(request)
        record.add(Step.QUEUE, start - received)
        record.add(Step.VERIFY, trio.current_time() - start)
        record.at = Step.QUEUE
        deadline, payload = received + self._limits.budget_s, None
        with trio.move_on_at(deadline) as scope:
            payload = await self._decide(request, record, now, scope)
        if payload is None or trio.current_time() >= deadline:
            record.outcome = Outcome.TIMEOUT
            payload = self._deny(request, TIMEOUT_REASON, now)
        self._publish(msg.reply, payload)
        self._finish(record)

    async def _decide(
        self, request: AuthorizationRequest, record: CalloutRecord, now: float, scope: trio.CancelScope
    ) -> bytes:
        """The answer to one admitted request; Cancelled (the deadline) between its steps."""
        try:
            return await self._allow(request, record, now, scope)
        except (Refused, CodecError) as refused:  # CodecError: a corrupt ledger row, named
            reason = refused.reason() if isinstance(refused, Refused) else str(refused)
        except Exception:  # our bug: deny this connect, keep the lane (STYLE.md practice 10)
            log.exception("auth callout: space=%s failed on one request", self._keys.space)
            reason = INTERNAL_ERROR_REASON
        record.outcome, record.reason = Outcome.DENIED, reason
        with _timed(record, Step.SIGN):
            return self._deny(request, reason, now)

    async def _allow(
        self, request: AuthorizationRequest, record: CalloutRecord, now: float, scope: trio.CancelScope
    ) -> bytes:
        space, next_step = self._keys.space, functools.partial(_next_step, scope)
        await next_step()  # a request that waited out its deadline in the queue stops here
        with _timed(record, Step.VERIFY):
            bearer = check_bearer(request, space=space, verifier=self._verifier, now=now)
            record.owner, record.actor = bearer.owner, bearer.actor
        await next_step()
        with _timed(record, Step.LEDGER):
            rows = self._read_ledger(bearer.owner, bearer.actor)
        await next_step()
        with _timed(record, Step.POLICY):
            grant = decide_connect(request, bearer, rows, space=space, now=now)
        await next_step()
        with _timed(record, Step.SIGN):
            user_jwt = mint_user_jwt(request, grant, keys=self._keys, now=int(now))
            return encode_response(request, keys=self._keys, now=int(now), jwt=user_jwt)

    def _deny(self, request: AuthorizationRequest, reason: str, now: float) -> bytes:
        return encode_response(request, keys=self._keys, now=int(now), error=reason)

    def _shed(self, msg: Message) -> None:
        start, now = trio.current_time(), self._clock()
        request = self._open(msg, now)
        if request is None:
            return
        record = self._record(request)
        record.outcome = Outcome.SHED
        record.waited_s = self._oldest_waited(start) or 0.0
        record.ahead = len(self._waiting) + self._stats.in_flight
        self._publish(msg.reply, self._deny(request, TIMEOUT_REASON, now))
        record.add(Step.VERIFY, trio.current_time() - start)
        self._finish(record)

    def _finish(self, record: CalloutRecord) -> None:
        self._stats.answered[record.outcome] += 1
        level = logging.WARNING if is_slow(record, slow_ms=self._limits.slow_ms) else logging.INFO
        log.log(level, format_callout_line(record, slow_ms=self._limits.slow_ms))


async def _next_step(scope: trio.CancelScope) -> None:
    """Stop here if the deadline passed, even inside one synchronous stretch of a task.

    trio turns an expired deadline into a cancellation only between task steps, so a step that
    ran past it (a slow disk) would otherwise carry on to the next one.
    """
    if trio.current_time() >= scope.deadline:
        scope.cancel()
    await trio.lowlevel.checkpoint_if_cancelled()


class _timed:
    """Context manager adding the elapsed trio time to ``record`` under ``step``.

    It also marks ``step`` as the one in progress, so a deadline names it as ``at=<step>``.
    """

    __slots__ = ("_record", "_step", "_start")

    def __init__(self, record: CalloutRecord, step: Step) -> None:
        self._record, self._step, self._start = record, step, math.nan

    def __enter__(self) -> None:
        self._record.at = self._step
        self._start = trio.current_time()

    def __exit__(self, *exc_info: object) -> None:
        self._record.add(self._step, trio.current_time() - self._start)
