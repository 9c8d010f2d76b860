"""A full lane's issuance sweep: expired issuance rows pruned at start and every minute
(DESIGN.md 6 and 8; spec "Callout replicas": replicas hold no sweep). The rows and the prune are
:mod:`cotal_trio.stores.issuance`; this is the lane's task that runs it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn

import trio

from cotal_trio.core.errors import Unavailable
from cotal_trio.core.issuance import PRUNE_EVERY_S
from cotal_trio.stores.issuance import RowExpiries, RowStore, prune_rows

__all__ = ["run_issuance_sweep"]

log = logging.getLogger("cotal.issuance")


async def run_issuance_sweep(
    store: RowStore,
    *,
    space: str,
    clock: Callable[[], float],
    every_s: float = PRUNE_EVERY_S,
    expiries: RowExpiries | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Trio: prune expired issuance rows now and every ``every_s`` seconds; runs until cancelled.

    A full lane runs it in its nursery once it holds the plane claim (the bucket exists then);
    replicas never do (spec "Callout replicas"). A failed sweep is logged and tried again at the
    next tick; it never ends the lane. ``expiries`` is the lane's :class:`RowExpiries` (the
    callout notes the rows it keeps there), so only rows it does not know are read. Ticks are on
    trio time, rows are judged on ``clock`` (wall
    time, unix seconds).
    """
    task_status.started()
    next_t = trio.current_time()
    while True:
        try:
            pruned = await prune_rows(store, now=clock(), expiries=expiries)
        except Unavailable as exc:
            log.warning("space %s: issuance prune failed (%s); next try in %g s", space, exc, every_s)
        except Exception:  # a bug or a foreign row: the sweep is housekeeping, never the lane's end
            log.exception("space %s: issuance prune failed; next try in %g s", space, every_s)
        else:
            if pruned:
                log.info("space %s: pruned %d expired issuance rows", space, pruned)
        next_t += every_s
        await trio.sleep_until(next_t)
