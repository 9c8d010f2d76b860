"""Callout limits, deadlines and the admission rule (spec "Callout deadlines").

nats-server waits ``authorization { timeout }`` (2 s by default) for the callout. A request's
deadline is that budget less 250 ms, counted from receipt; a request the broker's stamp proves
late (:func:`request_deadline`), one that sat in a socket or a paused process, is not given a
fresh budget the broker no longer has. Requests start oldest first, at most
``max_in_flight`` at a time; while the oldest request still waiting for a slot has waited more
than half the budget, or the queue already holds more than half the budget can drain at the
observed rate (:class:`DrainEstimate`), the queue is not draining in time and a new request is
shed at once.

Everything here is pure: times are passed in, in seconds (``trio`` for monotonic times, wall
for unix seconds, named in each signature).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

__all__ = [
    "CLOCK_SKEW_TOLERANCE_S", "CalloutLimits", "DRAIN_IDLE_S", "ClockSkew", "DEADLINE_MARGIN_S", "DrainEstimate", "MAX_CLOCK_SKEW_S",
    "PROVEN_LATE_S", "SKEW_RANK", "SKEW_WINDOW",
    "broker_gave_up", "proven_late", "request_deadline", "should_shed",
]

DEADLINE_MARGIN_S = 0.25
# The broker's stamps are whole seconds, truncated, so a fresh request reads as 0 to 1 s old,
# plus the skew (how far our wall clock runs ahead of the broker's). The skew estimate
# (:class:`ClockSkew`) is a low order statistic of the recent ages: the SKEW_RANK-th smallest of
# the least ages of the last SKEW_WINDOW seconds that had requests (0 until there are that many),
# so requests in fewer than
# SKEW_RANK distinct seconds (a handful of hostile stamps, a paused process's burst) cannot move
# it. The correction applied is bounded to MAX_CLOCK_SKEW_S either way (beyond it the clocks are broken, not
# skewed); a skew the stamp's resolution cannot explain by more than CLOCK_SKEW_TOLERANCE_S is
# logged once per episode.
MAX_CLOCK_SKEW_S = 2.0
CLOCK_SKEW_TOLERANCE_S = 0.5
SKEW_WINDOW = 16
SKEW_RANK = 4
# A request older than this on arrival (by the broker's stamp, skew corrected) was delayed
# before it reached the lane: the stamp's second plus the transit it tolerates.
PROVEN_LATE_S = 1.0 + CLOCK_SKEW_TOLERANCE_S
# The drain estimate: the smoothing weight of each new interval between answers, and the gap
# without answers after which it is forgotten (a slow phase's rate says nothing about a burst
# after an idle spell).
DRAIN_WEIGHT = 0.1
DRAIN_IDLE_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CalloutLimits:
    """``calloutLimits = {authTimeoutMs, maxInFlight, slowMs}`` of the spec, in our units.

    Attributes:
        auth_timeout_s: the broker's ``authorization { timeout }`` in seconds (default 2.0);
            must match the broker or connects are refused early or answered late.
        max_in_flight: requests in progress at once (default 32).
        slow_ms: a request slower than this logs at ``level=warn`` (default 500).

    Raises:
        ValueError: a timeout not above the 250 ms margin, or a non-positive count.
    """

    auth_timeout_s: float = 2.0
    max_in_flight: int = 32
    slow_ms: int = 500

    def __post_init__(self) -> None:
        if not self.auth_timeout_s > DEADLINE_MARGIN_S:
            raise ValueError("the auth timeout must be more than 0.25 seconds")
        if self.max_in_flight < 1 or self.slow_ms < 0:
            raise ValueError("max_in_flight must be at least 1 and slow_ms not negative")

    @property
    def budget_s(self) -> float:
        """Seconds from receipt to a request's deadline: the timeout less 250 ms."""
        return self.auth_timeout_s - DEADLINE_MARGIN_S


def should_shed(oldest_waited_s: float | None, limits: CalloutLimits) -> bool:
    """True when a new request must be shed: the oldest waiter passed half the budget.

    Args:
        oldest_waited_s: how long the oldest request still waiting for a slot has waited,
            or None when nothing waits.
    """
    return oldest_waited_s is not None and oldest_waited_s > limits.budget_s / 2


def request_deadline(
    *, received: float, opened: float, now: float, iat: int, exp: int, skew_s: float, limits: CalloutLimits
) -> float:
    """A request's deadline, in trio seconds: ours, or the broker's when its stamp proves it late.

    Ours is ``received + budget`` (spec "Callout deadlines"). The broker stamps ``iat`` and
    ``exp`` (its send time, and that plus its timeout) truncated to the second, so it gives up
    somewhere in ``[exp, exp + 1)`` and a request that reached us at once reads as 0 to 1 s old.
    Within that (plus ``CLOCK_SKEW_TOLERANCE_S``) the stamp cannot tell a fresh request from one
    delayed before it reached us, and the receipt counts, as the spec says (never past
    ``exp + 1`` less the margin, when the broker has surely given up): taking ``exp`` as
    the give-up time for every request would shorten every budget by the unknown part of a
    second and, with a 1 s broker timeout, refuse a quarter of fresh connects. A request older
    than that was delayed (a paused or starved process, a full socket) by an amount the stamp
    cannot narrow to less than a second, so it gets the earliest deadline the broker allows:
    ``exp`` less the margin, on our clock ``exp + skew_s - DEADLINE_MARGIN_S``.

    Args:
        received: trio time the request arrived; opened: trio time ``now`` was read.
        now: wall time, unix seconds, read at ``opened``.
        iat, exp: the request JWT's stamps (broker clock, unix seconds).
        skew_s: how far our wall clock runs ahead of the broker's (:class:`ClockSkew`).
    """
    ours = received + limits.budget_s
    received_wall = now - (opened - received)
    if not proven_late(received_wall - iat, skew_s):  # by exp + 1 it surely gave up
        return min(ours, received + (exp + 1 + skew_s - DEADLINE_MARGIN_S - received_wall))
    return min(ours, received + (exp + skew_s - DEADLINE_MARGIN_S - received_wall))


def broker_gave_up(*, now: float, exp: int, skew_s: float) -> bool:
    """True once the broker has surely stopped waiting: wall ``now`` at or past ``exp + 1 + skew_s``.

    Its ``exp`` is truncated to the second, so it gives up somewhere in ``[exp, exp + 1)`` on its
    clock: before ``exp`` a mint may still be let in (the deadline stops one at ``exp`` less the
    margin), inside that second a timeout denial may still reach it (the broker then logs its
    reason), and after it no answer reaches anyone, so the request is dropped, not answered
    (:meth:`~cotal_trio.lane.callout.responder.CalloutResponder._serve`, spec "Callout deadlines").
    """
    return now >= exp + 1 + skew_s


def proven_late(age_s: float, skew_s: float) -> bool:
    """True when a request ``age_s`` old on arrival (by our clock, from the broker's ``iat``) was
    delayed before it reached us: older than the stamp's second and the transit tolerated,
    ``PROVEN_LATE_S``, once the skew is taken off."""
    return age_s - skew_s >= PROVEN_LATE_S


class ClockSkew:
    """How far this host's wall clock runs ahead of the broker's, learned from request stamps.

    Each request gives its age on arrival, ``received_wall - iat``: transit plus the part of a
    second the broker's truncated stamp dropped (0 to 1 s) plus the skew ``s``, so a fresh
    request's age lies in ``[s, s + 1)`` plus transit. The least age of each second of trio time
    that had requests is kept, for the last ``SKEW_WINDOW`` such seconds; the estimate
    (:attr:`measured_s`) is the ``SKEW_RANK``-th smallest of them, and 0 (the clocks agree) until
    the window is full: with fewer, the rank would sit near their largest, biased a second high
    (a later mint than the broker allows). So requests in at most ``SKEW_RANK - 1`` distinct seconds among the window, whatever
    their stamps, cannot lower it below the least honest age (no honest fresh request is made
    "proven late"), nor raise it above an honest one (no truly late one is made fresh); a real
    skew is learned in the first ``SKEW_WINDOW`` seconds with requests after the lane starts, and
    a change later once ``SKEW_WINDOW - SKEW_RANK + 1`` such seconds showed it (fewer when the
    clocks move apart than when they come together). No age is ignored, however far
    in the future it is stamped: the rank is the protection, and a broker clock far ahead is
    still measured and named. Bounding each age to +-``MAX_CLOCK_SKEW_S`` before taking the
    order statistic or the statistic after is the same; :attr:`skew_s` is bounded,
    :attr:`measured_s` is not (it names the skew in the warning).
    The estimate sits in ``[s, s + 1)``: the stamp's resolution, small under steady traffic
    (the least of many ages a second), at most a second with one request every few seconds.
    Costs a sort of 17 floats per request. Mutable; one per lane; trio seconds for ``at``.
    """

    __slots__ = ("_minima", "_second", "_least", "measured_s", "_warned")

    def __init__(self) -> None:
        self._minima: deque[float] = deque(maxlen=SKEW_WINDOW - 1)  # closed seconds' least ages
        self._second: int | None = None  # the open second (trio time, floored) and its least age
        self._least = math.inf
        self.measured_s = 0.0  # the skew the stamps show, unbounded (0 until SKEW_WINDOW seconds)
        self._warned = False

    def observe(self, age_s: float, *, at: float) -> float:
        """Note one request's arrival age (seconds, by our clock) at trio time ``at``; returns
        :attr:`skew_s` after it."""
        second = math.floor(at)
        if second != self._second:
            if self._second is not None:
                self._minima.append(self._least)
            self._second, self._least = second, age_s
        else:
            self._least = min(self._least, age_s)
        if len(self._minima) + 1 >= SKEW_WINDOW:
            self.measured_s = sorted([*self._minima, self._least])[SKEW_RANK - 1]
        return self.skew_s

    @property
    def skew_s(self) -> float:
        """The correction the deadlines use: :attr:`measured_s` bounded to +-MAX_CLOCK_SKEW_S."""
        return max(-MAX_CLOCK_SKEW_S, min(MAX_CLOCK_SKEW_S, self.measured_s))

    @property
    def large(self) -> bool:
        """True while the estimate shows a skew past ``CLOCK_SKEW_TOLERANCE_S`` that the stamp's
        resolution cannot explain: above ``1 + CLOCK_SKEW_TOLERANCE_S`` or below its negative."""
        return self.measured_s > 1.0 + CLOCK_SKEW_TOLERANCE_S or self.measured_s < -CLOCK_SKEW_TOLERANCE_S

    def newly_large(self) -> bool:
        """True once per episode of a :attr:`large` estimate (log it then); an estimate back
        within the tolerance ends the episode, so the next one is named too."""
        if not self.large:
            self._warned = False
            return False
        if self._warned:
            return False
        self._warned = True
        return True


class DrainEstimate:
    """Seconds per answer while the callout is busy: how fast its queue drains.

    Every request that leaves the queue or a slot counts, whatever its outcome (a mint, a
    denial, a timeout, a drop, an expiry while queued): each shortens a newcomer's wait. Only
    the interval between two answers with work still waiting at the first counts (an idle
    gap measures arrivals, not service), and the estimate is forgotten after ``DRAIN_IDLE_S``
    without answers. Smoothed with weight ``DRAIN_WEIGHT``. Mutable; one per
    lane; trio seconds.
    """

    __slots__ = ("_last", "_busy", "seconds_per_answer")

    def __init__(self) -> None:
        self._last: float | None = None
        self._busy = False
        self.seconds_per_answer: float | None = None  # None until two busy answers were seen

    def answered(self, *, at: float, backlog: bool) -> None:
        """One request left at ``at`` (answered by its worker whatever the outcome, dropped, or
        expired while queued); ``backlog``: others were queued at that moment. After
        ``DRAIN_IDLE_S`` without one the estimate is forgotten."""
        if self._last is not None and at - self._last > DRAIN_IDLE_S:
            self.seconds_per_answer, self._busy = None, False
        if self._busy and self._last is not None:
            interval = at - self._last
            previous = self.seconds_per_answer
            self.seconds_per_answer = interval if previous is None else previous + DRAIN_WEIGHT * (interval - previous)
        self._last, self._busy = at, backlog

    def overfull(self, *, queued: int, in_flight: int, limits: CalloutLimits, at: float) -> bool:
        """True when a new request would wait more than half the budget for a slot at the
        observed rate: past what the spec's shed rule allows, so it is shed now rather than
        queued to time out.

        It gets a slot after ``queued + in_flight + 1 - max_in_flight`` answers (none while a
        slot is free). Never while the estimate is stale: no answer for ``DRAIN_IDLE_S`` before
        trio time ``at`` (a stalled queue is shed by the oldest-waiter rule instead).
        """
        if self._last is None or at - self._last > DRAIN_IDLE_S:
            return False
        per = self.seconds_per_answer
        answers = queued + in_flight + 1 - limits.max_in_flight
        return per is not None and answers > 0 and answers * per > limits.budget_s / 2
