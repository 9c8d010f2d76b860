"""Rolling-window counters for the exchange budgets (DESIGN 7; upstream-notes 3.5 and 4.1).

The loopback face keeps two budgets of this kind: invalid exchange capabilities, and refused
exchanges (spec "Listener policy": 30 refusals per rolling 60 s, one shared window). Both are a
:class:`SlidingWindow`. The public face keeps one window per source instead (spec "Proxy
attribution"), at most 1024 of them: a :class:`WindowLru`.

Pure and synchronous: the caller passes the time in (seconds, any consistent clock), so a test
drives it with plain numbers. Memory is bounded by the limit: only admitted events are kept,
and a :class:`WindowLru` holds at most ``max_keys`` windows.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Hashable

from cotal_trio.core.errors import ConfigError

__all__ = ["LRU_MAX_KEYS", "REFUSAL_LIMIT", "REFUSAL_PERIOD_S", "SlidingWindow", "WindowLru"]

# The budget every exchange window uses (upstream-notes 3.5: 30 per rolling minute).
REFUSAL_LIMIT = 30
REFUSAL_PERIOD_S = 60.0
# How many keys (peer buckets) a WindowLru keeps (spec "Proxy attribution": at most 1024).
LRU_MAX_KEYS = 1024


def _check_budget(limit: int, period_s: float) -> None:
    if type(limit) is not int or limit <= 0:
        raise ConfigError(f"a window limit must be a positive integer, got {limit!r}")
    if not isinstance(period_s, (int, float)) or not (0 < period_s < math.inf):
        raise ConfigError(f"a window period must be a positive number of seconds, got {period_s!r}")


class SlidingWindow:
    """At most ``limit`` events in any rolling ``period_s`` seconds.

    An event is admitted (:meth:`try_acquire` returns ``True``) when fewer than ``limit``
    admitted events happened in the ``period_s`` seconds before it; a refused event is not
    recorded, so a caller that keeps hammering a full window does not extend it: it reopens
    ``period_s`` after its oldest admitted event.

    Raises:
        ConfigError: ``limit`` is not a positive int or ``period_s`` is not a positive finite
            number (a caller bug).
    """

    __slots__ = ("_limit", "_period_s", "_times")

    def __init__(self, limit: int = REFUSAL_LIMIT, period_s: float = REFUSAL_PERIOD_S) -> None:
        _check_budget(limit, period_s)
        self._limit = limit
        self._period_s = float(period_s)
        self._times: collections.deque[float] = collections.deque()

    def _prune(self, now: float) -> None:
        horizon = now - self._period_s
        while self._times and self._times[0] <= horizon:
            self._times.popleft()

    def try_acquire(self, now: float) -> bool:
        """Record one event at ``now`` (seconds) if the window has room.

        Returns:
            ``True`` when the event was admitted and recorded; ``False`` when the window is
            full (nothing recorded).
        """
        self._prune(now)
        if len(self._times) >= self._limit:
            return False
        self._times.append(now)
        return True

    def is_full(self, now: float) -> bool:
        """True when an event at ``now`` would be refused; records nothing."""
        self._prune(now)
        return len(self._times) >= self._limit

    def count(self, now: float) -> int:
        """How many admitted events fall inside the window ending at ``now``."""
        self._prune(now)
        return len(self._times)

    def retry_after_s(self, now: float) -> float:
        """Seconds until an event would be admitted again (``0.0`` when it would be now)."""
        if not self.is_full(now):
            return 0.0
        return self._times[0] + self._period_s - now


class WindowLru:
    """One :class:`SlidingWindow` per key, at most ``max_keys`` of them (spec "Proxy attribution").

    A key's window is made on its first :meth:`try_acquire`; every :meth:`try_acquire` makes its
    key the most recently used, whether the event is admitted or not. Making a window for a new
    key while ``max_keys`` are held first drops the least recently used key, which then starts
    over with an empty window. That bounds memory (at most ``max_keys * limit`` times are kept)
    at a known price: a caller cycling more than ``max_keys`` keys can evict an earlier full
    window. The spec accepts it: a full window only turns refusals into 429, and no key ever
    mints without a valid credential.

    Raises:
        ConfigError: ``max_keys`` is not a positive int, or ``limit``/``period_s`` are not as
            :class:`SlidingWindow` needs them (a caller bug).
    """

    __slots__ = ("_limit", "_max_keys", "_period_s", "_windows")

    def __init__(
        self, max_keys: int = LRU_MAX_KEYS, limit: int = REFUSAL_LIMIT, period_s: float = REFUSAL_PERIOD_S
    ) -> None:
        if type(max_keys) is not int or max_keys <= 0:
            raise ConfigError(f"a window LRU needs a positive whole number of keys, got {max_keys!r}")
        _check_budget(limit, period_s)
        self._max_keys = max_keys
        self._limit = limit
        self._period_s = float(period_s)
        self._windows: collections.OrderedDict[Hashable, SlidingWindow] = collections.OrderedDict()

    def try_acquire(self, key: Hashable, now: float) -> bool:
        """Record one event for ``key`` at ``now`` (seconds) if its window has room.

        Returns:
            ``True`` when the event was admitted and recorded; ``False`` when ``key``'s window
            is full (nothing recorded). Either way ``key`` becomes the most recently used.
        """
        window = self._windows.get(key)
        if window is None:
            if len(self._windows) >= self._max_keys:
                self._windows.popitem(last=False)
            window = self._windows[key] = SlidingWindow(self._limit, self._period_s)
        else:
            self._windows.move_to_end(key)
        return window.try_acquire(now)

    def count(self, key: Hashable, now: float) -> int:
        """Admitted events of ``key`` inside the window ending at ``now`` (0 for an unknown key).

        A query: it neither makes a window nor changes which key is least recently used.
        """
        window = self._windows.get(key)
        return 0 if window is None else window.count(now)

    def is_full(self, key: Hashable, now: float) -> bool:
        """True when an event of ``key`` at ``now`` would be refused (False for an unknown key).

        A query like :meth:`count`: it records nothing and leaves the LRU order alone.
        """
        window = self._windows.get(key)
        return window is not None and window.is_full(now)

    def __contains__(self, key: object) -> bool:
        return key in self._windows

    def __len__(self) -> int:
        return len(self._windows)
