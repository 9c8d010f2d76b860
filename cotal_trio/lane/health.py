"""A lane that cannot answer is not serving (issue 15 item 11): the lane's self-probe.

A lane whose ledger reads hang or fail (a stalled or full disk, worker threads stuck on it), or
whose store connection stops answering, would time out every connect at the ledger step while
the host still said ``serving``. :class:`LaneHealth` notices it and ends the lane with a reason,
so the host marks it ``retrying`` with that reason (in ``.applied`` and the unit's STATUS) and
starts it again every ``retry_s``; a fresh start has fresh worker threads, and its first probe
runs before it subscribes, so the lane is ``serving`` again exactly once the cause is gone.

The probe is what a connect does at its ledger step, minus the principal: one ledger read
through the lane's own port's worker threads
(:meth:`~cotal_trio.state.ledger_threads.LedgerPort.through_threads`: the same slots a connect's
read takes, so slots all held by stalled reads make it wait; never the port's inline ``stat``
check, which answers a principal no one holds with no slot at all) of a principal no one holds, then a read of an issuance row no one
holds from the auth bucket (the store the connect writes its row to, over the same connection),
each bounded by the callout's deadline budget (slower than that, every connect would time out). It
runs every ``PROBE_EVERY_S``, at once when a connect timed out at the ledger step, and again
``PROBE_RETRY_S`` after a failure; ``PROBE_FAILURES`` failures in a row end the lane.
"""

from __future__ import annotations

from typing import NoReturn

import trio

from cotal_trio.core.callout_log import CalloutRecord, Outcome, Step
from cotal_trio.core.errors import AuthServiceError, Unavailable
from cotal_trio.state.ledger_threads import LedgerPort
from cotal_trio.lane.callout.ports import ReadLedger
from cotal_trio.stores.issuance import AuthBucketMissing, RowStore

__all__ = ["PROBE_EVERY_S", "PROBE_FAILURES", "PROBE_RETRY_S", "LaneHealth", "LaneUnhealthy"]

# Seconds between probes of a healthy lane: a dead ledger is found within this (plus the retries
# below) even when no connect comes to show it.
PROBE_EVERY_S = 5.0
# Seconds before a failed probe is tried again.
PROBE_RETRY_S = 1.0
# Failed probes in a row that end the lane: one slow read on a busy disk is not a dead ledger,
# and three take a few seconds (each at most the budget), well inside a client's retry patience.
PROBE_FAILURES = 3
# A principal no one holds (owners are derived `u_` + 26 base32 characters; `a` is 0): its rows
# are two missing files, so the probe costs two `stat` calls and reads nobody's row.
PROBE_OWNER = "u_" + "a" * 26
PROBE_ACTOR = "cotal_probe"
# An issuance row key no connect writes (theirs are `natkey.<user nkey>`, an `U...` nkey).
PROBE_ROW = "natkey.cotal_probe"


class LaneUnhealthy(Unavailable):
    """The lane cannot answer connects (its reason names the step and the cause)."""


class LaneHealth:
    """One lane start's self-probe (module docstring).

    Attributes:
        reason: why the last probe failed (a sentence), None while it passed; the faces'
            ``GET /health`` answers 503 with it (``lane.run``).

    Args:
        space: the lane's space, for the reason's sentence.
        read_ledger: the lane's ledger port (the callout's own); a :class:`LedgerPort` is read
            through its :meth:`~LedgerPort.through_threads` (module docstring), any other port
            as it is.
        store: the lane's issuance store (``issuance_store`` over its store connection).
        budget_s: each probe step's bound in seconds: the callout's deadline budget.
        every_s: seconds between probes of a healthy lane (:data:`PROBE_EVERY_S`; tests
            shorten it); a failed probe is tried again after ``min(PROBE_RETRY_S, every_s)``.
    """

    def __init__(
        self, space: str, *, read_ledger: ReadLedger, store: RowStore, budget_s: float,
        every_s: float = PROBE_EVERY_S,
    ) -> None:
        self._space, self._store, self._budget_s = space, store, budget_s
        # A probe must contend for the slots the connects' reads take (issue 15 item 11).
        self._read_ledger = read_ledger.through_threads if isinstance(read_ledger, LedgerPort) else read_ledger
        self._every_s, self._retry_s = every_s, min(PROBE_RETRY_S, every_s)
        self._suspect = trio.Event()
        self.reason: str | None = None  # why the last probe failed; None while it passed

    def answered(self, record: CalloutRecord) -> None:
        """Sync, from the callout's answer hook: a connect that timed out at the ledger step
        makes the next probe run now."""
        if record.outcome is Outcome.TIMEOUT and record.at is Step.LEDGER:
            self._suspect.set()

    async def probe(self) -> str | None:
        """Trio: one probe; None when the lane can answer, else why it cannot (a sentence)."""
        with trio.move_on_after(self._budget_s) as ledger:
            try:
                await self._read_ledger(PROBE_OWNER, PROBE_ACTOR)
            except (AuthServiceError, OSError) as exc:  # CodecError names the unreadable row
                return f"the ledger cannot be read ({exc})"
        if ledger.cancelled_caught:
            return f"a ledger read did not answer within {self._budget_s:g} s"
        with trio.move_on_after(self._budget_s) as store:
            try:
                await self._store.get(PROBE_ROW)
            except AuthBucketMissing:
                pass  # the store answered; a missing bucket is the start's to name, not a fault
            except Unavailable as exc:
                return f"the issuance store does not answer ({exc})"
        if store.cancelled_caught:
            return f"the issuance store did not answer within {self._budget_s:g} s"
        return None

    async def check(self) -> None:
        """Trio: probe once before the lane serves.

        Raises:
            LaneUnhealthy: the probe failed (the lane's start fails and the host retries it).
        """
        reason = self.reason = await self.probe()
        if reason is not None:
            raise LaneUnhealthy(f"space {self._space}: the lane cannot answer connects - {reason}")

    async def run(self) -> NoReturn:
        """Trio: probe until cancelled (module docstring for when).

        Raises:
            LaneUnhealthy: ``PROBE_FAILURES`` probes failed in a row (names the last reason).
        """
        failures = 0
        while True:
            with trio.move_on_after(self._retry_s if failures else self._every_s):
                await self._suspect.wait()
            self._suspect = trio.Event()
            reason = self.reason = await self.probe()
            failures = 0 if reason is None else failures + 1
            if reason is not None and failures >= PROBE_FAILURES:
                raise LaneUnhealthy(
                    f"space {self._space}: the lane cannot answer connects - {reason}"
                    f" ({failures} probes in a row); it is restarted until that is mended"
                )
