"""The ledger reader from trio: each read of a row file in a worker thread (issue 15 item 7).

Everything else in :mod:`cotal_trio.state` blocks; this is the one trio-side adapter, shared by
the callout (``lane/callout/responder.py``), the exchange faces (``http/faces.py``) and the host doors
(``http/manager_doors.py``, ``http/lifecycle_doors.py``), so a stalled disk
holds the one request that reads it, never the trio thread a lane's callout and faces share.
It lives here, below ``stores``, ``lane`` and ``http``, so both can import it (docs/architecture.md).

One exception, kept on purpose (issue 14 item 4, it removed the thread hop from every mint):
:class:`LedgerPort` first asks a :class:`~cotal_trio.state.LedgerReader` its ``unchanged``
check, two ``stat`` calls, on the caller's thread, which is the lane's trio thread. The
trade-off: a read that hangs holds only its own request and its worker-thread slot, but a
``stat`` that hangs (a hard-mounted NFS root whose server is gone) holds the lane's trio
thread, and with it every connect and face of the lane, until the ``stat`` returns. On a local
disk a ``stat`` answers from the inode cache; a root on a network file system carries that risk.
The lane's self-probe reads through :meth:`LedgerPort.through_threads`, never the inline check,
so stalled reads holding every slot are noticed (issue 15 item 11).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from cotal_trio.core.errors import Unavailable
from cotal_trio.core.ledger import LedgerRow, ReadRows

__all__ = ["BlockingCalls", "LedgerPort", "ReadLedger", "read_in_threads"]

T = TypeVar("T")

ReadLedger = Callable[[str, str], Awaitable[tuple[LedgerRow | None, LedgerRow | None]]]
"""The awaited ledger port: ``await read_ledger(owner, actor) -> (interactive, managed)``.

Fresh per call; raises as :data:`~cotal_trio.core.ledger.ReadRows` (CodecError for a corrupt row).
"""


class BlockingCalls:
    """Blocking calls run in worker threads, at most ``max_threads`` of them at once.

    A call that stalls (a hung disk, a FIFO) holds its own caller and its own slot, never the
    trio thread: cancelling the caller (its deadline) stops the wait at once
    (``abandon_on_cancel``); the abandoned call finishes in its thread, its result dropped,
    and holds its slot until then. Once every slot is held by a stalled call, later calls wait
    for a slot, which their own deadline bounds too. Costs a thread hop per call (about 0.1 ms).

    Args:
        max_threads: the slots, at least 1.

    Raises:
        ValueError: ``max_threads`` is below 1 (trio's CapacityLimiter refuses it).
    """

    def __init__(self, *, max_threads: int) -> None:
        self._limiter = trio.CapacityLimiter(max_threads)

    async def run(self, call: Callable[..., T], *args: object) -> T:
        """Trio: ``call(*args)`` in a worker thread; its result, or what it raised."""
        return await trio.to_thread.run_sync(call, *args, limiter=self._limiter, abandon_on_cancel=True)

    async def run_within(self, limit_s: float, stalled: str, call: Callable[..., T], *args: object) -> T:
        """Trio: :meth:`run`, waiting at most ``limit_s`` seconds (for a slot and the call).

        Past ``limit_s`` the call is abandoned as a cancelled :meth:`run` is (it finishes in its
        thread, its result dropped), so its caller answers at the bound, never later.

        Raises:
            Unavailable: ``stalled`` (the sentence naming what did not answer), at ``limit_s``.
            Exception: what ``call`` raised.
        """
        with trio.move_on_after(limit_s):
            return await self.run(call, *args)
        raise Unavailable(stalled)


class LedgerPort:
    """The awaited ledger port over a blocking reader (a :class:`~cotal_trio.state.LedgerReader`);
    an instance is a :data:`ReadLedger`: ``await port(owner, actor) -> (interactive, managed)``.

    A reader with an ``unchanged(owner, actor)`` method (the LedgerReader's ``stat`` check,
    never a read) is asked that first, on the caller's thread: rows whose files are gone or
    unchanged since they were parsed come back with no thread hop (the callout's re-check after
    the issuance row, on every mint: issue 14 item 4). Only a file that must be read (new,
    changed, or a FIFO standing in for a hung disk) is read in a worker thread of one
    :class:`BlockingCalls`, at most ``max_threads`` at once for this port, so a read that stalls
    holds its own request and never the lane's trio thread: its deadline cancels the wait and
    the other requests go on (issue 4, "a ledger that stalls 1.3 s for one actor"; issue 15
    item 7). The trade-off (module docstring): a ``stat`` that hangs holds the caller's thread.

    :meth:`through_threads` is the same read always taken in a worker thread: the lane's
    self-probe (``lane/health.py``) reads through it, so it waits for a slot exactly as a
    connect's read of a changed file does, and notices slots all held by stalled reads.

    Args:
        read: the blocking reader (:data:`~cotal_trio.core.ledger.ReadRows`).
        max_threads: the worker-thread slots of this port, at least 1.

    Raises:
        ValueError: ``max_threads`` is below 1.
        CodecError (from a call): as ``read`` raises it (a corrupt or unreadable row).
    """

    def __init__(self, read: ReadRows, *, max_threads: int) -> None:
        self._read, self._calls = read, BlockingCalls(max_threads=max_threads)
        self._unchanged = getattr(read, "unchanged", None)

    async def __call__(self, owner: str, actor: str) -> tuple[LedgerRow | None, LedgerRow | None]:
        """Trio: the principal's rows, from the ``stat`` check when it suffices (class docstring)."""
        if self._unchanged is not None:
            rows = self._unchanged(owner, actor)
            if rows is not None:
                await trio.lowlevel.checkpoint_if_cancelled()  # no scheduler trip on the mint path
                return rows
        return await self._calls.run(self._read, owner, actor)

    def unchanged(self, owner: str, actor: str) -> tuple[LedgerRow | None, LedgerRow | None] | None:
        """Sync: the reader's ``unchanged`` check (two ``stat`` calls, never a read): the rows a
        read would return when no file must be read, else None; None for a reader without it."""
        return None if self._unchanged is None else self._unchanged(owner, actor)

    async def through_threads(self, owner: str, actor: str) -> tuple[LedgerRow | None, LedgerRow | None]:
        """Trio: the principal's rows, read in one of this port's worker threads (never inline)."""
        return await self._calls.run(self._read, owner, actor)


def read_in_threads(read: ReadRows, *, max_threads: int) -> LedgerPort:
    """The lane's awaited ledger port over a blocking reader: a :class:`LedgerPort`."""
    return LedgerPort(read, max_threads=max_threads)
