"""The callout responder of one lane, its admission half: queue, workers, deadlines, sheds and the log line.

Shape (DESIGN.md section 5): the nats-py subscription callback only calls :meth:`on_message`,
which queues the request (or sheds it at once) without blocking. Each of ``max_in_flight``
worker tasks takes the oldest queued request and runs the pure steps of
:mod:`cotal_trio.core.callout`, with its I/O between them, under ``trio.move_on_at(deadline)``:
the deadline is a cancel scope, checked between steps, so a request whose deadline passes stops
at its next step and gets the signed ``timeout:`` denial and nothing after it (spec "Callout
deadlines"). One more task keeps the deadlines: at a request's deadline, if nothing has
answered it yet (still queued behind busy workers, or its worker is waiting on I/O), it sends
the timeout denial then and there and cancels the worker's scope, whatever the request was
waiting for. On a saturated thread that task itself runs late; it learns by how much and wakes
that much early (at most ``KEEPER_MAX_LEAD_S``), and earlier still by the measured cost of the
pass it is about to run, so the denial may leave a little before the deadline rather than after
it. A request whose handling raises is dropped with its line, in the workers, the keeper and
the shed path alike: the lane never dies of one request (issue 15 item 2). The wall clock is
read once per request. Replies go out through ``publish_nowait`` (no await across the bridge per
message).

What a worker runs under the deadline scope is the connect half
(:class:`~cotal_trio.lane.callout.connect.ConnectCheck`: bearer, connect limits, ledger, issuance
row and re-check, issued authority, the mint); the responder withdraws a row that request sent
but did not answer with a mint (deadline, re-check denial) after the answer, in a task of its
own, so the worker is free for the next request. Its ports come in two groups
(:mod:`cotal_trio.lane.callout.ports`): :class:`AnswerPorts` and :class:`ConnectPorts`.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import trio

from cotal_trio.core.admission import (
    MAX_CLOCK_SKEW_S,
    ClockSkew,
    DrainEstimate,
    broker_gave_up,
    request_deadline,
    should_shed,
)
from cotal_trio.core.callout import TIMEOUT_REASON, Dropped, open_request
from cotal_trio.core.callout_log import CalloutRecord, Outcome, Step, format_callout_line, format_dropped_line, is_slow
from cotal_trio.core.natsjwt import AuthorizationRequest
from cotal_trio.natsio import Message
from cotal_trio.state.ledger_threads import read_in_threads
from cotal_trio.stores.issuance import Issuance
from cotal_trio.lane.callout.connect import ConnectCheck
from cotal_trio.lane.callout.ports import AnswerPorts, ConnectPorts

__all__ = ["CalloutResponder", "CALLOUT_QUEUE_GROUP", "CALLOUT_SUBJECT", "CalloutStatistics", "read_in_threads"]

log = logging.getLogger("cotal.callout")

CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
CALLOUT_QUEUE_GROUP = "cotal-auth-callout"
# Requests queued between the nats-py callback and the workers; beyond this a burst is shed at
# once rather than queued where it could never meet its deadline.
QUEUE_CAPACITY = 1024
# The deadline keeper wakes this much early at most (seconds): its own recent scheduling lag,
# so that on a busy thread the timeout denial still leaves by the deadline, not after it. The
# lag it remembers halves every KEEPER_LEAD_HALF_LIFE_S seconds.
KEEPER_MAX_LEAD_S = 0.1
KEEPER_LEAD_HALF_LIFE_S = 10.0
# Requests the deadline keeper answers in one pass at most (each costs an unseal, a verify and
# a signed denial, about 0.3 ms), so a backlog of expiries holds the thread for tens of ms.
KEEPER_BATCH = 256
# Issuance rows being withdrawn at once (each at most WITHDRAW_S); past this, a row that must
# go is left to its own TTL, with a warning.
MAX_WITHDRAWALS = 1024

# Distinct broker timeouts named in a lane's life at most (each once).
MAX_TIMEOUTS_WARNED = 16

# How often a draining responder looks whether its last request has been answered (seconds).
DRAIN_POLL_S = 0.01

@dataclass(slots=True, kw_only=True)
class _Statistics:
    answered: dict[Outcome, int] = field(default_factory=lambda: dict.fromkeys(Outcome, 0))
    dropped: int = 0
    in_flight: int = 0


@dataclass(slots=True, eq=False)
class _Pending:
    """One admitted request, from :meth:`CalloutResponder.on_message` until it is answered.

    Trio times (seconds): ``received`` and ``deadline`` (from receipt, moved earlier by the
    broker's stamp once it is read). ``request``, ``record``, ``now`` (wall time, unix seconds)
    and ``opened`` (the trio time ``now`` was read) are set by the worker that takes it.
    """

    msg: Message
    received: float
    deadline: float
    started: bool = False
    answered: bool = False
    scope: trio.CancelScope | None = None  # the worker's deadline scope, once started
    request: AuthorizationRequest | None = None
    record: CalloutRecord | None = None
    now: float = 0.0
    opened: float = 0.0  # trio time ``now`` was read


@dataclass(frozen=True, slots=True, kw_only=True)
class CalloutStatistics:
    """A snapshot of one lane's callout (STYLE.md practice 11)."""

    answered: dict[str, int]
    dropped: int
    waiting: int
    in_flight: int


class CalloutResponder:
    """Answers one space's ``$SYS.REQ.USER.AUTH`` requests.

    ``max_in_flight`` worker tasks take requests from one bounded FIFO queue, so requests
    start oldest first and at most that many are in progress; a request not answered by its
    deadline, queued or in progress, is answered with the timeout denial by the deadline keeper
    (spec "Callout deadlines"; see :meth:`_keep_deadlines` for when exactly).

    Args:
        answer: :class:`~cotal_trio.lane.callout.ports.AnswerPorts`: the keys, limits, clock,
            reply and answer hook every answer uses.
        connect: :class:`~cotal_trio.lane.callout.ports.ConnectPorts`: what the connect check
            (:class:`~cotal_trio.lane.callout.connect.ConnectCheck`) reads and writes.
    """

    def __init__(self, answer: AnswerPorts, connect: ConnectPorts) -> None:
        self._keys, self._limits, self._clock = answer.keys, answer.limits, answer.clock
        self._publish, self._on_answer = answer.publish, answer.on_answer
        self._connect = ConnectCheck(answer.keys, connect)
        self._queue: deque[_Pending] = deque()  # admitted, not yet taken by a worker; oldest first
        self._pending: deque[_Pending] = deque()  # admitted, in receipt (= deadline) order; the
        # deadline keeper drops answered ones from the front
        self._idle_workers = trio.lowlevel.ParkingLot()
        self._arrived: trio.Event | None = None  # set by on_message while the keeper has nothing
        self._lead, self._lead_at = 0.0, 0.0  # seconds the keeper wakes early (its recent lag), since when
        self._expiry_s, self._passes = 0.0, 0  # one expiry's measured cost (seconds), passes measured
        self._withdrawals: trio.Nursery | None = None
        self._withdrawing = 0
        self._stats = _Statistics()
        self._timeouts_warned: set[int] = set()  # broker timeouts (exp - iat) already named
        self._skew = ClockSkew()  # our wall clock against the broker's stamps
        self._drain = DrainEstimate()  # seconds per answer while busy: the predictive shed
        self._shortened: list[_Pending] = []  # started, deadline moved before receipt order's
        self._rearm: trio.Event | None = None  # set when a shortened deadline needs the keeper

    # -- the asyncio side ----------------------------------------------------------------------

    def on_message(self, msg: Message) -> None:
        """Subscription callback: queue without blocking, or shed at once.

        A request is shed when the oldest queued request has waited more than half the budget
        (the queue is not draining in time), when it would wait more than half the budget for a
        slot at the rate answers were observed to leave (shed before the queue holds what the
        budget cannot drain, issue 14 item 2), or when the queue is full.
        """
        received = trio.current_time()
        queued = len(self._queue)
        if (
            queued >= QUEUE_CAPACITY
            or should_shed(self._oldest_waited(received), self._limits)
            or self._drain.overfull(queued=queued, in_flight=self._stats.in_flight, limits=self._limits, at=received)
        ):
            self._shed(msg)
            return
        pending = _Pending(msg, received, received + self._limits.budget_s)
        self._queue.append(pending)
        self._pending.append(pending)
        self._idle_workers.unpark()
        if self._arrived is not None:
            self._arrived.set()

    # -- the trio side -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve requests until cancelled, ``max_in_flight`` at a time (startable)."""
        async with trio.open_nursery() as nursery:
            self._withdrawals = nursery
            nursery.start_soon(self._keep_deadlines)
            for _ in range(self._limits.max_in_flight):
                nursery.start_soon(self._worker)
            task_status.started()

    def statistics(self) -> CalloutStatistics:
        """Counts of answers by outcome, drops, and the current queue and in-flight."""
        return CalloutStatistics(
            answered={str(k): v for k, v in self._stats.answered.items()},
            dropped=self._stats.dropped,
            waiting=len(self._queue),
            in_flight=self._stats.in_flight,
        )

    # -- stopping (issue 15 item 8) -------------------------------------------------------------

    async def drained(self) -> None:
        """Trio: return once every admitted request has been answered and no issuance row is
        being withdrawn (the lane's drain, after its subscription stopped delivering).

        Nothing new is refused here: the caller has stopped :meth:`on_message` calls first. The
        deadline keeper keeps running, so every admitted request is answered by its deadline,
        and this returns at the latest a budget after the last request arrived (the caller
        bounds it anyway). Looked at every ``DRAIN_POLL_S`` rather than woken by an event: that
        would need a hook in the workers, the deadline keeper and the withdrawals alike, and only
        a stopping lane waits here (at most ``DRAIN_S / DRAIN_POLL_S`` looks, once per stop).
        """
        while self._queue or self._stats.in_flight or self._withdrawing or any(  # noqa: ASYNC110 - the docstring's why
            not pending.answered for pending in self._pending
        ):
            await trio.sleep(DRAIN_POLL_S)
        await trio.lowlevel.checkpoint()

    async def _worker(self) -> None:
        while True:
            if not self._queue:
                await self._idle_workers.park()
                continue
            pending = self._queue.popleft()  # FIFO: the oldest queued request
            pending.started = True
            self._stats.in_flight += 1
            try:
                await self._serve(pending)
            except Exception:  # our bug: this request's drop, never the worker's end (STYLE.md 10)
                self._failed(pending)
            finally:
                self._stats.in_flight -= 1
                self._drain.answered(at=trio.current_time(), backlog=bool(self._queue))  # a slot is free

    def _failed(self, pending: _Pending | None) -> None:
        """A request whose handling raised: logged with its traceback, dropped with its line, and
        marked answered so nothing else answers it (the lane never dies of one request)."""
        log.exception("auth callout: space=%s failed on one request; it is dropped", self._keys.space)
        if pending is not None:
            pending.answered = True
        self._drop("the auth callout failed on this request - see the auth service log")

    async def _keep_deadlines(self) -> None:
        """Answer each request nothing answered by its deadline, at its deadline.

        Deadlines come in receipt order, so only the oldest unanswered request is watched. trio
        wakes a sleeping task only once the tasks ahead of it have run, so on a busy thread the
        keeper wakes late; it measures that lag and wakes that much earlier (at most
        ``KEEPER_MAX_LEAD_S``; the lead halves every ``KEEPER_LEAD_HALF_LIFE_S`` unless a larger
        lag is seen), so its denial goes out by the deadline. On an idle thread the lag, and so
        the lead, is zero. A started request whose broker stamp moved its deadline earlier than
        receipt order (:meth:`_serve`) is watched too, from the short list of those. Every
        request due when it wakes is answered in that one pass (at most ``KEEPER_BATCH``), not
        one per scheduler pass: behind a backlog a pass takes milliseconds, and the owed denials
        would leave one such pass apart, after their deadlines (issue 14 item 2). The pass itself
        takes time (each expiry about 0.3 ms, measured), so the keeper also wakes early by the
        pass it will run (:meth:`_pass_s`): its last denial leaves by its deadline, and the first
        up to that much early (at most ``KEEPER_MAX_LEAD_S`` more). The very first pass of a
        lane, with no cost measured yet, may still end after the deadlines it serves.
        """
        while True:
            oldest = self._oldest_unanswered()
            if oldest is None:
                self._arrived = trio.Event()
                await self._arrived.wait()
                self._arrived = None
                continue
            early = self._lead + self._pass_s(oldest)
            wake = oldest.deadline - early
            if wake > trio.current_time():
                self._rearm = trio.Event()
                with trio.move_on_at(wake):
                    await self._rearm.wait()
                self._rearm = None
                if trio.current_time() < wake:
                    continue  # a deadline moved earlier: look again
                self._remember_lag(trio.current_time() - wake)  # a wake-up, not a backlog of expiries
            else:
                await trio.lowlevel.checkpoint()
            started, expired = trio.current_time(), 0
            if not oldest.answered:
                self._expire(oldest)
                expired = 1
            for _ in range(KEEPER_BATCH - 1):  # the rest already due, or due before this pass ends
                due = self._oldest_unanswered()
                if due is None or due.deadline - early > trio.current_time():
                    break
                self._expire(due)
                expired += 1
            if expired:
                self._learn_expiry_cost((trio.current_time() - started) / expired)

    def _pass_s(self, oldest: _Pending) -> float:
        """Seconds the keeper's pass for ``oldest`` will take: the unanswered requests due with
        it (deadline within ``KEEPER_MAX_LEAD_S`` after its, at most ``KEEPER_BATCH``) times the
        measured cost of one expiry, at most ``KEEPER_MAX_LEAD_S``. Waking that much earlier
        lets the pass's last denial leave by its deadline, not a pass later."""
        if self._expiry_s == 0.0:
            return 0.0
        horizon, due = oldest.deadline + KEEPER_MAX_LEAD_S, 0
        for pending in self._pending:  # receipt (= deadline) order
            if due >= KEEPER_BATCH or pending.deadline > horizon:
                break
            due += not pending.answered
        return min(KEEPER_MAX_LEAD_S, due * self._expiry_s)

    def _learn_expiry_cost(self, seconds: float) -> None:
        """One expiry's cost (trio seconds), smoothed: the first pass's as it is, then weight 0.1."""
        previous = self._expiry_s
        self._expiry_s = seconds if self._passes == 0 else previous + 0.1 * (seconds - previous)
        self._passes += 1

    def _oldest_unanswered(self) -> _Pending | None:
        """The unanswered request whose deadline comes first, or None."""
        pending = self._pending
        while pending and pending[0].answered:
            pending.popleft()
        if not pending:
            return None
        if self._shortened:
            self._shortened = [p for p in self._shortened if not p.answered]
            return min([pending[0], *self._shortened], key=_deadline_of)
        return pending[0]

    def _remember_lag(self, lag: float) -> None:
        now = trio.current_time()
        decayed = self._lead * 0.5 ** ((now - self._lead_at) / KEEPER_LEAD_HALF_LIFE_S)
        self._lead, self._lead_at = min(KEEPER_MAX_LEAD_S, max(lag, decayed)), now

    def _expire(self, pending: _Pending) -> None:
        """The deadline has come (less the keeper's lead) with no answer: send the timeout
        denial now and stop the request's worker, if it has one (sync). A failure is this
        request's drop (:meth:`_failed`), never the keeper's end."""
        try:
            self._expire_one(pending)
        except Exception:
            self._failed(pending)

    def _expire_one(self, pending: _Pending) -> None:
        pending.answered = True
        if pending.started:  # its worker stops at its next step and sends nothing
            if pending.scope is not None:
                pending.scope.cancel()  # the deadline may be a little ahead yet (the lead)
            request, record, now = pending.request, pending.record, pending.now
            if record is not None:
                record.cut(trio.current_time())
        else:  # still queued behind busy workers
            if self._queue and self._queue[0] is pending:
                self._queue.popleft()
            else:
                self._queue.remove(pending)
            self._drain.answered(at=trio.current_time(), backlog=bool(self._queue))  # one fewer ahead
            opened, now = trio.current_time(), self._clock()
            request = self._open(pending.msg, now)
            if request is not None:
                self._deadline(pending.received, opened, now, request)  # learns the skew
            record = None if request is None else self._record(request)
            if record is not None:
                record.add(Step.QUEUE, trio.current_time() - pending.received)
                record.at = Step.QUEUE
        if request is None or record is None:
            return  # dropped, and logged, by _open
        if self._gave_up(request, now + trio.current_time() - (pending.opened if pending.started else opened)):
            return  # nobody waits for this answer: dropped, and logged
        record.outcome = Outcome.TIMEOUT
        self._publish(pending.msg.reply, self._deny(request, TIMEOUT_REASON, now))
        self._finish(record)

    def _open(self, msg: Message, now: float) -> AuthorizationRequest | None:
        """Provenance (:func:`open_request`), or None: dropped and logged, or no reply subject.

        Every failure of any kind while decoding is a drop with its line, never an exception out
        of here: this runs in the workers, in the deadline keeper and in the subscription
        callback, and one request must not stop any of them (issue 15 item 2).
        """
        try:
            request = open_request(msg.data, msg.headers, keys=self._keys, now=now, skew_s=self._skew.skew_s)
        except Dropped as exc:
            self._drop(str(exc))
            return None
        except Exception as exc:  # our bug, not the request's: still only this request's (STYLE.md 10)
            log.debug("auth callout: space=%s a request failed to decode", self._keys.space, exc_info=True)
            self._drop(f"request could not be decoded ({type(exc).__name__})")
            return None
        self._check_broker_timeout(request)
        return request if msg.reply else None

    def _drop(self, reason: str) -> None:
        self._stats.dropped += 1
        log.warning(format_dropped_line(self._keys.space, reason))

    def _deadline(self, received: float, opened: float, now: float, request: AuthorizationRequest) -> float:
        """The request's deadline (trio seconds): from receipt, or the broker's when its stamp
        proves the request late (spec "Callout deadlines",
        :func:`~cotal_trio.core.admission.request_deadline`); learns the clock skew from the
        request's age on arrival and names a large one, once."""
        skew_s = self._skew.observe(now - (opened - received) - request.iat, at=opened)
        if self._skew.newly_large():
            log.warning(
                "auth callout: space=%s requests arrive stamped %.1fs %s this host's clock - the broker's "
                "clock and this host's differ; deadlines allow for at most %.1fs of it, so synchronise the "
                "clocks (NTP)",
                self._keys.space, abs(self._skew.measured_s),
                "before" if self._skew.measured_s > 0 else "after", MAX_CLOCK_SKEW_S,
            )
        return request_deadline(
            received=received, opened=opened, now=now, iat=request.iat, exp=request.exp, skew_s=skew_s,
            limits=self._limits,
        )

    def _gave_up(self, request: AuthorizationRequest, now: float) -> bool:
        """True, after dropping it with its line, when the broker may have stopped waiting."""
        if not broker_gave_up(now=now, exp=request.exp, skew_s=self._skew.skew_s):
            return False
        self._drop(f"the broker's authorization timeout passed before the answer (cid {request.client_id})")
        return True

    def _check_broker_timeout(self, request: AuthorizationRequest) -> None:
        """Name a broker timeout (``exp - iat``) unlike ours, once per distinct value (at most
        ``MAX_TIMEOUTS_WARNED`` of them): one request's odd stamp must not hide a real one."""
        broker_s = request.exp - request.iat
        warned = self._timeouts_warned
        if abs(broker_s - self._limits.auth_timeout_s) > 1 and broker_s not in warned and len(warned) < MAX_TIMEOUTS_WARNED:
            warned.add(broker_s)
            log.warning(
                "auth callout: space=%s the broker's authorization timeout is %ss but this auth "
                "service uses %ss - start it with --auth-timeout %s",
                self._keys.space, broker_s, self._limits.auth_timeout_s, broker_s,
            )

    def _record(self, request: AuthorizationRequest) -> CalloutRecord:
        return CalloutRecord(space=self._keys.space, req=request.user_nkey, cid=request.client_id)

    def _oldest_waited(self, now: float) -> float | None:
        return now - self._queue[0].received if self._queue else None

    async def _serve(self, pending: _Pending) -> None:
        """Answer one request a worker took from the queue.

        Its deadline becomes the broker's when the broker's stamp proves the request late
        (:meth:`_deadline`). A request whose deadline has already passed when it is read costs
        only that check (no bearer, no ledger, no row): it gets the signed timeout denial while
        the broker may still be waiting (before ``exp + 1``), as spec "Callout deadlines" owes
        every request unanswered at its deadline and so the broker logs why, and it is dropped
        with its line once the broker has surely given up, since no answer can reach a client
        then and signing one would spend the thread on nothing (issue 14 item 1). Whatever
        happens later, nothing is published after the deadline but the timeout denial, so a
        late request is never minted, and a row written for it is withdrawn.
        """
        start, now = trio.current_time(), self._clock()
        request = self._open(pending.msg, now)
        if request is None:
            pending.answered = True  # dropped (logged), or no reply subject: nothing to send
            return
        deadline = self._deadline(pending.received, start, now, request)
        if deadline < pending.deadline:
            pending.deadline = deadline
            self._shortened.append(pending)
            if self._rearm is not None:
                self._rearm.set()
        if start >= pending.deadline:
            pending.answered = True
            if not self._gave_up(request, now):
                self._answer_spent(pending, request, now, start)
            return
        record = self._record(request)
        pending.request, pending.record, pending.now, pending.opened = request, record, now, start
        record.add(Step.QUEUE, start - pending.received)
        record.add(Step.VERIFY, trio.current_time() - start)
        record.enter(Step.QUEUE, trio.current_time())
        issuance, payload = self._connect.issuance(), None
        try:
            with trio.move_on_at(pending.deadline) as scope:
                pending.scope = scope
                payload = await self._connect.answer(request, record, now, scope, issuance)
            if pending.answered:
                return  # the deadline keeper sent the timeout denial
            if payload is None or trio.current_time() >= pending.deadline:
                record.outcome = Outcome.TIMEOUT
                payload = self._deny(request, TIMEOUT_REASON, now)
            if self._gave_up(request, now + trio.current_time() - start):
                pending.answered = True  # a step held the thread past the broker's timeout: nobody waits
                return  # (and a row it wrote is withdrawn below)
            if record.outcome is Outcome.MINTED:
                issuance.keep()
            pending.answered = True
            self._publish(pending.msg.reply, payload)
            self._finish(record)
        finally:
            if issuance.unsettled:  # a row sent but not answered with a mint (issue 4 item 1)
                self._withdraw_soon(issuance)

    def _answer_spent(self, pending: _Pending, request: AuthorizationRequest, now: float, start: float) -> None:
        """The signed timeout denial for a request read at or past its deadline (``at=queue``)."""
        record = self._record(request)
        record.add(Step.QUEUE, start - pending.received)
        record.at, record.outcome = Step.QUEUE, Outcome.TIMEOUT
        self._publish(pending.msg.reply, self._deny(request, TIMEOUT_REASON, now))
        self._finish(record)

    def _withdraw_soon(self, issuance: Issuance) -> None:
        """Withdraw a request's row in a task of its own, after its answer went out."""
        if self._withdrawals is None or self._withdrawing >= MAX_WITHDRAWALS:
            log.warning(
                "auth callout: space=%s too many issuance rows being withdrawn; one is left to its TTL",
                self._keys.space,
            )
            return
        self._withdrawing += 1

        async def withdraw() -> None:
            try:
                await issuance.settle()
            finally:
                self._withdrawing -= 1

        self._withdrawals.start_soon(withdraw)

    def _deny(self, request: AuthorizationRequest, reason: str, now: float) -> bytes:
        return self._connect.deny(request, reason, now)

    def _shed(self, msg: Message) -> None:
        """Answer a request with the timeout denial at once, in the subscription callback; a
        failure is this request's drop (:meth:`_failed`), never an exception into nats-py."""
        try:
            self._shed_one(msg)
        except Exception:
            self._failed(None)

    def _shed_one(self, msg: Message) -> None:
        start, now = trio.current_time(), self._clock()
        request = self._open(msg, now)
        if request is None:
            return
        self._deadline(start, start, now, request)  # learns the skew
        if self._gave_up(request, now):
            return
        record = self._record(request)
        record.outcome = Outcome.SHED
        record.waited_s = self._oldest_waited(start) or 0.0
        record.ahead = len(self._queue) + self._stats.in_flight
        self._publish(msg.reply, self._deny(request, TIMEOUT_REASON, now))
        record.add(Step.VERIFY, trio.current_time() - start)
        self._finish(record)

    def _finish(self, record: CalloutRecord) -> None:
        self._stats.answered[record.outcome] += 1
        if self._on_answer is not None:
            self._on_answer(record)
        level = logging.WARNING if is_slow(record, slow_ms=self._limits.slow_ms) else logging.INFO
        log.log(level, format_callout_line(record, slow_ms=self._limits.slow_ms))


def _deadline_of(pending: _Pending) -> float:
    return pending.deadline


