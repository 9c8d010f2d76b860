"""The rolling-window counter behind the loopback exchange budgets (core/windows.py)."""

from __future__ import annotations

import pytest

from cotal_trio.core.errors import ConfigError
from cotal_trio.core.windows import REFUSAL_LIMIT, REFUSAL_PERIOD_S, SlidingWindow


def test_defaults_are_thirty_per_minute():
    assert (REFUSAL_LIMIT, REFUSAL_PERIOD_S) == (30, 60.0)
    window = SlidingWindow()
    assert [window.try_acquire(100.0) for _ in range(31)] == [True] * 30 + [False]


def test_admits_up_to_the_limit_then_refuses():
    window = SlidingWindow(3, 10.0)
    assert [window.try_acquire(t) for t in (0.0, 1.0, 2.0, 3.0)] == [True, True, True, False]
    assert window.count(3.0) == 3
    assert window.is_full(3.0)


def test_reopens_one_period_after_the_oldest_admitted_event():
    window = SlidingWindow(2, 10.0)
    window.try_acquire(0.0)
    window.try_acquire(5.0)
    assert not window.try_acquire(9.999)
    assert window.retry_after_s(9.0) == pytest.approx(1.0)
    assert window.try_acquire(10.0)  # the event at 0.0 has left the window
    assert not window.try_acquire(14.0)
    assert window.try_acquire(15.0)


def test_refused_events_do_not_extend_a_full_window():
    window = SlidingWindow(1, 60.0)
    assert window.try_acquire(0.0)
    for t in range(1, 60):
        assert not window.try_acquire(float(t))
    assert window.try_acquire(60.0)


def test_queries_record_nothing():
    window = SlidingWindow(1, 60.0)
    assert not window.is_full(0.0)
    assert window.count(0.0) == 0
    assert window.retry_after_s(0.0) == 0.0
    assert window.try_acquire(0.0)


@pytest.mark.parametrize(
    ("limit", "period_s"),
    [(0, 60.0), (-1, 60.0), (1.5, 60.0), (True, 60.0), (30, 0.0), (30, -1.0), (30, float("inf")), (30, "60")],
)
def test_bad_parameters_are_a_config_error(limit, period_s):
    with pytest.raises(ConfigError):
        SlidingWindow(limit, period_s)
