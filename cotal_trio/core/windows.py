"""Rolling-window counters for the exchange budgets (DESIGN 7; upstream-notes 3.5 and 4.1).

The HTTP faces keep two budgets of this kind on the loopback face: invalid exchange
capabilities, and refused exchanges (spec "Listener policy": 30 refusals per rolling 60 s, one
shared window on the loopback face). Both are a :class:`SlidingWindow`.

Pure and synchronous: the caller passes the time in (seconds, any consistent clock), so a test
drives it with plain numbers. Memory is bounded by the limit: only admitted events are kept.
"""

from __future__ import annotations

import collections
import math

from cotal_trio.core.errors import ConfigError

__all__ = ["REFUSAL_LIMIT", "REFUSAL_PERIOD_S", "SlidingWindow"]

# The budget both loopback windows use (upstream-notes 3.5: 30 per rolling minute).
REFUSAL_LIMIT = 30
REFUSAL_PERIOD_S = 60.0


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
        if type(limit) is not int or limit <= 0:
            raise ConfigError(f"a window limit must be a positive integer, got {limit!r}")
        if not isinstance(period_s, (int, float)) or not (0 < period_s < math.inf):
            raise ConfigError(f"a window period must be a positive number of seconds, got {period_s!r}")
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
