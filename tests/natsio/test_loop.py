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


async def test_a_cancelled_call_whose_coroutine_fails_as_it_is_cancelled_leaves_the_loop_nothing_to_raise():
    """A bug found by the cluster-root CLI tests: a lane stopping while its issuer session
    reconnected failed its stop. nats-py's connect, cancelled as its socket connect was refused,
    raises the refusal instead of the cancel (asyncio.wait_for hands back a finished future's
    result). ``asyncio.wait_for`` had run the coroutine in an inner task whose exception nobody
    retrieved; at its garbage collection asyncio reported "Task exception was never retrieved",
    and trio-asyncio raises what its loop reports into the loop's nursery: out of ``open_loop``,
    so out of the lane, as an ExceptionGroup with the refused connect."""
    async def refused_as_cancelled(bound_s: float) -> None:  # asyncio-flavoured
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise ConnectionRefusedError(111, "Connect call failed") from None

    reported: list[str] = []
    async with open_loop():
        loop = current_loop()
        loop.set_exception_handler(lambda loop, context: reported.append(context["message"]))
        with trio.move_on_after(0.05) as scope:
            await run_aio(loop, refused_as_cancelled, what="connect")
        for _ in range(3):
            gc.collect()
            await trio.sleep(0.01)
    assert scope.cancelled_caught
    assert reported == []
