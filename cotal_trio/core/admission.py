"""Callout limits and the admission rule (spec "Callout deadlines").

nats-server waits ``authorization { timeout }`` (2 s by default) for the callout. A request's
deadline is that budget less 250 ms, counted from receipt. Requests start oldest first, at most
``max_in_flight`` at a time; while the oldest request still waiting for a slot has waited more
than half the budget, the queue is not draining in time and a new request is shed at once.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CalloutLimits", "DEADLINE_MARGIN_S", "should_shed"]

DEADLINE_MARGIN_S = 0.25


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
