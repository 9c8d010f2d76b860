"""The one log line per answered callout request (spec "Callout deadlines").

Format, exactly as the spec gives it::

    auth callout: level=info outcome=minted space=<space> req=<user nkey> cid=<broker client id>
    owner=<owner> actor=<actor> queue_ms=0 verify_ms=1 ledger_ms=2 policy_ms=0 sign_ms=1 total_ms=4

(one line). ``denied`` adds ``reason="<message>"``, ``timeout`` adds ``at=<step>``, ``shed`` adds
``waited_ms=<ms> ahead=<n>``. ``level=warn`` when the request took longer than ``slow_ms`` or the
outcome is ``timeout`` or ``shed``. Unknown owner or actor (the bearer did not verify) is ``-``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["CalloutRecord", "Outcome", "Step", "format_callout_line", "format_dropped_line", "is_slow"]


class Outcome(enum.StrEnum):
    """What happened to an answered request."""

    MINTED = "minted"
    DENIED = "denied"
    TIMEOUT = "timeout"
    SHED = "shed"


class Step(enum.StrEnum):
    """The step a request was in; a ``timeout`` line names it as ``at=<step>``."""

    QUEUE = "queue"
    VERIFY = "verify"
    LEDGER = "ledger"
    POLICY = "policy"
    SIGN = "sign"


TIMED_STEPS = (Step.QUEUE, Step.VERIFY, Step.LEDGER, Step.POLICY, Step.SIGN)


@dataclass(slots=True, kw_only=True)
class CalloutRecord:
    """What the lane measured for one request; filled in as the request moves.

    Times are seconds (trio clock); the line renders whole milliseconds.
    """

    space: str
    req: str
    cid: int
    owner: str = "-"
    actor: str = "-"
    durations_s: dict[Step, float] = field(default_factory=dict)
    outcome: Outcome = Outcome.MINTED
    reason: str | None = None
    at: Step | None = None
    at_since: float | None = None
    waited_s: float = 0.0
    ahead: int = 0

    def add(self, step: Step, seconds: float) -> None:
        """Add ``seconds`` spent in ``step``."""
        self.durations_s[step] = self.durations_s.get(step, 0.0) + seconds

    def enter(self, step: Step, at: float) -> None:
        """Mark ``step`` as the one in progress since ``at`` (seconds, the clock of the durations)."""
        self.at, self.at_since = step, at

    def cut(self, at: float) -> None:
        """Close the step in progress at ``at``: add its time so far (an answer sent mid-step)."""
        if self.at is not None and self.at_since is not None:
            self.add(self.at, at - self.at_since)
            self.at_since = None

    def total_s(self) -> float:
        """Seconds from receipt to answer, the sum of the steps."""
        return sum(self.durations_s.values())


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def _quote(text: str) -> str:
    one_line = " ".join(text.splitlines())  # every kind of line break: the line stays one line
    return '"' + one_line.replace("\\", "\\\\").replace('"', '\\"') + '"'


def is_slow(record: CalloutRecord, *, slow_ms: int) -> bool:
    """True when the line logs at ``level=warn``: slower than ``slow_ms``, or timeout or shed."""
    return _ms(record.total_s()) > slow_ms or record.outcome in (Outcome.TIMEOUT, Outcome.SHED)


def format_callout_line(record: CalloutRecord, *, slow_ms: int) -> str:
    """Render ``record`` as the spec's single line (no trailing newline)."""
    total_ms = _ms(record.total_s())
    parts = [
        f"auth callout: level={'warn' if is_slow(record, slow_ms=slow_ms) else 'info'} outcome={record.outcome}",
        f"space={record.space} req={record.req} cid={record.cid}",
        f"owner={record.owner} actor={record.actor}",
        *(f"{step}_ms={_ms(record.durations_s.get(step, 0.0))}" for step in TIMED_STEPS),
        f"total_ms={total_ms}",
    ]
    if record.outcome is Outcome.DENIED:
        parts.append(f"reason={_quote(record.reason or '')}")
    elif record.outcome is Outcome.TIMEOUT:
        parts.append(f"at={record.at or Step.QUEUE}")
    elif record.outcome is Outcome.SHED:
        parts.append(f"waited_ms={_ms(record.waited_s)} ahead={record.ahead}")
    return " ".join(parts)


def format_dropped_line(space: str, reason: str) -> str:
    """The line for a request that failed provenance and got no answer at all."""
    return f"auth callout: level=warn outcome=dropped space={space} reason={_quote(reason)}"
