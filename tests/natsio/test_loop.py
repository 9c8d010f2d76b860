"""``run_aio``: an asyncio task run from trio, cancelled from trio (no broker needed)."""

from __future__ import annotations

import asyncio
import gc
import warnings

import trio

from cotal_trio.natsio import open_loop
from cotal_trio.natsio._loop import current_loop, run_aio


async def test_cancelled_before_the_loop_starts_the_task_leaves_no_unawaited_coroutine():
    """A bug found by the flood test: the coroutine was built in the trio task, so a cancel
    landing before the asyncio loop first stepped the task left it never awaited (Python's
    ``RuntimeWarning: coroutine ... was never awaited`` on stderr, in production)."""
    async def work(bound_s: float) -> None:  # asyncio-flavoured
        await asyncio.sleep(0.01)

    async def victim(scope: trio.CancelScope) -> None:
        with scope:
            await run_aio(current_loop(), work, what="test")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with open_loop():
            for _ in range(50):
                scope = trio.CancelScope()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(victim, scope)
                    await trio.sleep(0)  # the victim creates its asyncio task...
                    scope.cancel()  # ...and is cancelled before the loop has run it
                gc.collect()
    never_awaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert never_awaited == []
