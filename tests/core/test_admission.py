"""Deadlines, clock skew and the drain estimate, pure (spec "Callout deadlines"; issue 14
items 1 and 2). Times are passed in; the limits make every time exact in binary floating
point (auth timeout 2.25 s: budget 2.0 s)."""

from __future__ import annotations

import pytest

from cotal_trio.core.admission import (
    DRAIN_IDLE_S,
    MAX_CLOCK_SKEW_S,
    SKEW_RANK,
    SKEW_WINDOW,
    CalloutLimits,
    ClockSkew,
    DrainEstimate,
    broker_gave_up,
    request_deadline,
)

LIMITS = CalloutLimits(auth_timeout_s=2.25)
WALL = 1_800_000_000


@pytest.mark.parametrize(
    ("received", "opened", "now", "iat", "deadline"),
    [
        # read at once: 0.75 s after the stamp's second began, within its resolution: ours
        (10.0, 10.0, WALL + 0.75, WALL, 12.0),
        # 1.25 s after it: within the stamp's second plus the skew tolerated, ours, but never
        # past exp + 1 less 0.25, when the broker surely gave up
        (10.0, 10.0, WALL + 1.25, WALL, 11.5),
        # 1.5 s after it: proven late, the broker's earliest give-up (exp = WALL + 2) less 0.25
        (10.0, 10.0, WALL + 1.5, WALL, 10.25),
        # queued 0.5 s before it was read: its age on arrival is what counts, on the trio clock
        (10.0, 10.5, WALL + 1.5, WALL, 11.75),
        (10.0, 10.5, WALL + 2.0, WALL, 10.25),
        # the broker's budget was spent before it arrived
        (10.0, 10.0, WALL + 2.0, WALL, 9.75),
    ],
)
def test_the_deadline_is_ours_unless_the_brokers_stamp_proves_the_request_late(received, opened, now, iat, deadline):
    got = request_deadline(received=received, opened=opened, now=now, iat=iat, exp=iat + 2, skew_s=0.0, limits=LIMITS)
    assert got == deadline


def test_skew_moves_the_brokers_deadline_on_our_clock():
    # our clock 0.5 s ahead: the request is 1.5 s old by our clock, 1.0 by the broker's: ours
    # (the broker surely gives up by exp + 1, WALL + 3.5 on our clock, 2.0 s away less 0.25)
    assert request_deadline(received=10.0, opened=10.0, now=WALL + 1.5, iat=WALL, exp=WALL + 2, skew_s=0.5,
                            limits=LIMITS) == 11.75
    # 2.0 s old by our clock, 1.5 by the broker's: proven late; it gives up at exp + 0.5 on our clock
    assert request_deadline(received=10.0, opened=10.0, now=WALL + 2.0, iat=WALL, exp=WALL + 2, skew_s=0.5,
                            limits=LIMITS) == 10.25
    # our clock behind: a request 1.0 s old by our clock is 1.5 s old by the broker's
    assert request_deadline(received=10.0, opened=10.0, now=WALL + 1.0, iat=WALL, exp=WALL + 2, skew_s=-0.5,
                            limits=LIMITS) == 10.25


def test_the_broker_has_surely_given_up_a_second_after_exp():
    assert not broker_gave_up(now=WALL + 2.875, exp=WALL + 2, skew_s=0.0)
    assert broker_gave_up(now=WALL + 3.0, exp=WALL + 2, skew_s=0.0)
    assert not broker_gave_up(now=WALL + 3.0, exp=WALL + 2, skew_s=0.25)


def test_the_skew_is_0_until_requests_in_skew_window_seconds_showed_one():
    skew = ClockSkew()
    for at in range(SKEW_WINDOW - 1):
        assert skew.observe(1.75, at=float(at)) == 0.0
    assert skew.observe(1.75, at=float(SKEW_WINDOW)) == 1.75  # the 16th second with requests
    assert skew.large


def test_ages_the_stamp_resolution_explains_are_small_and_not_large():
    skew = ClockSkew()
    for at, age in enumerate([0.0, 0.99, 0.5, 0.25, 0.125] + [0.75] * (SKEW_WINDOW - 5)):
        skew.observe(age, at=float(at))
    assert (skew.measured_s, skew.large) == (0.5, False)  # the 4th smallest least age


def test_a_broker_clock_ahead_is_learned_and_bounded():
    skew = ClockSkew()
    for at in range(SKEW_WINDOW):
        skew.observe(-3.0, at=float(at))
    assert (skew.measured_s, skew.skew_s, skew.large) == (-3.0, -MAX_CLOCK_SKEW_S, True)
    for at in range(SKEW_WINDOW, 2 * SKEW_WINDOW - SKEW_RANK):  # 12 seconds: 4 of -3 left
        skew.observe(-1.75, at=float(at))
    assert skew.measured_s == -3.0
    skew.observe(-1.75, at=float(2 * SKEW_WINDOW))
    assert (skew.measured_s, skew.skew_s, skew.large) == (-1.75, -1.75, True)
    for at in range(2 * SKEW_WINDOW + 1, 4 * SKEW_WINDOW):
        skew.observe(4.0, at=float(at))
    assert (skew.measured_s, skew.skew_s) == (4.0, MAX_CLOCK_SKEW_S)  # learned, and bounded


def test_a_paused_process_burst_in_a_few_seconds_teaches_nothing():
    skew = ClockSkew()
    for at in range(SKEW_WINDOW):
        skew.observe(0.25, at=float(at))
    for i in range(3000):  # a paused process's backlog, 10 s late, read over 3 s
        skew.observe(10.0, at=SKEW_WINDOW + i / 1000)
    assert skew.measured_s == 0.25


def test_the_drain_estimate_counts_only_busy_intervals():
    drain = DrainEstimate()
    drain.answered(at=0.0, backlog=False)
    drain.answered(at=5.0, backlog=True)  # after an idle gap: arrivals, not service
    assert drain.seconds_per_answer is None
    assert not drain.overfull(queued=1000, in_flight=32, limits=LIMITS, at=5.0)
    drain.answered(at=5.125, backlog=True)
    assert drain.seconds_per_answer == 0.125
    drain.answered(at=5.375, backlog=False)
    assert drain.seconds_per_answer == pytest.approx(0.125 + 0.1 * 0.125)
    drain.answered(at=9.0, backlog=False)  # the queue had emptied: no interval
    assert drain.seconds_per_answer == pytest.approx(0.1375)


def test_the_drain_estimate_is_forgotten_after_an_idle_gap():
    """A slow phase's rate must not shed a burst that comes after the lane sat idle."""
    drain = DrainEstimate()
    drain.answered(at=0.0, backlog=True)
    drain.answered(at=0.5, backlog=True)
    assert drain.overfull(queued=64, in_flight=32, limits=LIMITS, at=0.5)
    assert not drain.overfull(queued=64, in_flight=32, limits=LIMITS, at=0.5 + DRAIN_IDLE_S + 0.125)
    drain.answered(at=0.5 + DRAIN_IDLE_S + 0.125, backlog=True)  # after the gap: forgotten, no interval
    assert drain.seconds_per_answer is None
    drain.answered(at=0.75 + DRAIN_IDLE_S, backlog=False)
    assert drain.seconds_per_answer == 0.125


def test_a_new_request_is_shed_when_it_would_wait_more_than_half_the_budget_for_a_slot():
    drain = DrainEstimate()
    drain.answered(at=0.0, backlog=True)
    drain.answered(at=0.125, backlog=True)
    slots = LIMITS.max_in_flight
    # every slot taken: it waits for queued + 1 answers; 8 * 0.125 = 1.0 s is half the 2.0 s budget
    assert not drain.overfull(queued=7, in_flight=slots, limits=LIMITS, at=0.125)
    assert drain.overfull(queued=8, in_flight=slots, limits=LIMITS, at=0.125)
    # a slot free (the workers not yet scheduled): the queue ahead of it takes the free ones first
    assert not drain.overfull(queued=8, in_flight=slots - 1, limits=LIMITS, at=0.125)
    assert drain.overfull(queued=9, in_flight=slots - 1, limits=LIMITS, at=0.125)
    assert not drain.overfull(queued=0, in_flight=0, limits=LIMITS, at=0.125)
