"""The rolling-window counters behind the exchange budgets (core/windows.py).

:class:`SlidingWindow` is the loopback face's shared window; :class:`WindowLru` the public face's
per-source buckets (spec "Proxy attribution": 30 refusals a minute each, at most 1024 sources).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cotal_trio.core.errors import ConfigError
from cotal_trio.core.windows import LRU_MAX_KEYS, REFUSAL_LIMIT, REFUSAL_PERIOD_S, SlidingWindow, WindowLru


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


# --- WindowLru: per-key windows, least recently used evicted -----------------------------------


def _fill(lru: WindowLru, key: object, now: float, times: int = REFUSAL_LIMIT) -> list[bool]:
    return [lru.try_acquire(key, now) for _ in range(times)]


def test_lru_defaults_are_1024_keys_of_thirty_per_minute():
    assert LRU_MAX_KEYS == 1024
    lru = WindowLru()
    assert _fill(lru, "peer", 0.0, 31) == [True] * 30 + [False]  # the 31st refusal is the first refused
    assert lru.count("peer", 0.0) == 30


def test_lru_keys_are_independent():
    lru = WindowLru()
    _fill(lru, "a", 0.0)
    assert not lru.try_acquire("a", 0.0)
    assert lru.try_acquire("b", 0.0)


@pytest.mark.parametrize(("now", "admitted"), [(59.999, False), (60.0, True)])
def test_a_full_key_reopens_exactly_sixty_seconds_after_its_oldest_event(now, admitted):
    lru = WindowLru()
    _fill(lru, "peer", 0.0)
    assert lru.try_acquire("peer", now) is admitted


def test_the_1025th_key_evicts_the_least_recently_used():
    lru = WindowLru()
    _fill(lru, "first", 0.0)  # full: refusals would be 429
    for n in range(1, LRU_MAX_KEYS):
        lru.try_acquire(n, 1.0)
    assert len(lru) == LRU_MAX_KEYS and "first" in lru
    lru.try_acquire("newcomer", 2.0)  # the 1025th key
    assert len(lru) == LRU_MAX_KEYS and "first" not in lru and 1 in lru
    assert lru.try_acquire("first", 3.0)  # starts over with an empty window


def test_using_a_key_protects_it_from_eviction():
    lru = WindowLru(max_keys=3)
    for key in ("a", "b", "c"):
        lru.try_acquire(key, 0.0)
    lru.try_acquire("a", 1.0)  # refreshed: "b" is now the least recently used
    lru.try_acquire("d", 2.0)
    assert ("a" in lru, "b" in lru, "c" in lru, "d" in lru) == (True, False, True, True)


def test_a_refused_event_also_counts_as_use():
    lru = WindowLru(max_keys=2, limit=1)
    lru.try_acquire("a", 0.0)
    lru.try_acquire("b", 0.0)
    assert not lru.try_acquire("a", 1.0)  # throttled, and still the most recently used
    lru.try_acquire("c", 2.0)
    assert "a" in lru and "b" not in lru


def test_count_is_a_query_that_neither_creates_nor_refreshes():
    lru = WindowLru(max_keys=2)
    assert lru.count("ghost", 0.0) == 0 and "ghost" not in lru
    lru.try_acquire("a", 0.0)
    lru.try_acquire("b", 0.0)
    assert lru.count("a", 1.0) == 1  # does not make "a" the most recently used
    lru.try_acquire("c", 2.0)
    assert "a" not in lru and "b" in lru


@given(st.lists(st.tuples(st.integers(0, 9), st.floats(0, 1000, allow_nan=False)), max_size=200))
def test_lru_holds_at_most_max_keys_and_each_held_key_acts_as_its_own_window(events):
    lru, reference = WindowLru(max_keys=4, limit=3, period_s=10.0), {}
    for key, now in sorted(events, key=lambda event: event[1]):  # time only moves forward
        admitted = lru.try_acquire(key, now)
        assert len(lru) <= 4
        reference = {k: window for k, window in reference.items() if k in lru}  # evicted: starts over
        assert admitted == reference.setdefault(key, SlidingWindow(3, 10.0)).try_acquire(now)


@pytest.mark.parametrize(
    ("max_keys", "limit", "period_s"),
    [(0, 30, 60.0), (-1, 30, 60.0), (1.0, 30, 60.0), (True, 30, 60.0), (1024, 0, 60.0), (1024, 30, 0.0)],
)
def test_bad_lru_parameters_are_a_config_error(max_keys, limit, period_s):
    with pytest.raises(ConfigError):
        WindowLru(max_keys, limit, period_s)


def test_is_full_is_a_query_per_key():
    lru = WindowLru(max_keys=2, limit=2, period_s=60)
    assert not lru.is_full("unknown", 0) and len(lru) == 0
    assert lru.try_acquire(("u_a", "pinned"), 0) and lru.try_acquire(("u_a", "pinned"), 1)
    assert lru.is_full(("u_a", "pinned"), 2) and not lru.is_full(("u_a", "unpinned"), 2)
    assert lru.count(("u_a", "pinned"), 2) == 2  # nothing recorded by the query
    assert not lru.is_full(("u_a", "pinned"), 60.0)  # the first event left the window
    assert lru.try_acquire("b", 3) and lru.try_acquire("c", 3)  # the query did not refresh ("u_a", "pinned")
    assert ("u_a", "pinned") not in lru and not lru.is_full(("u_a", "pinned"), 3)
