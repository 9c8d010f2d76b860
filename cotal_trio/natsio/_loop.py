"""The lane's asyncio loop and the one way across the trio <-> asyncio bridge.

Flavours: :func:`open_loop` and :func:`run_aio` are trio-flavoured (call them from trio tasks).
The coroutine a caller hands to :func:`run_aio` is asyncio-flavoured: it runs as an asyncio task
on the lane's trio-asyncio loop.

Why not ``await aio_as_trio(...)``: cancelling trio while it awaits an asyncio future across
trio-asyncio 0.16 crashed the whole run with ``TrioInternalError`` (reference
nats-operator-mode.md pitfall P12). :func:`run_aio` therefore never lets trio await an asyncio
future. It starts the coroutine as an asyncio task with a plain synchronous call and waits on a
``trio.Event`` that the task's done-callback sets. trio-asyncio runs both loops in one thread,
so that callback may call trio's synchronous API.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import trio
import trio_asyncio

from cotal_trio.core.errors import Unavailable

__all__ = ["DEFAULT_CAP_S", "current_loop", "open_loop", "run_aio"]

log = logging.getLogger("cotal.natsio")

T = TypeVar("T")

# Bound on one bridged operation when the caller set no trio deadline (or a later one): a lane
# cancelled mid-operation waits at most this long. Seconds.
DEFAULT_CAP_S = 10.0
# After trio cancels a bridged operation, how long (shielded) we wait for the asyncio task to
# finish. nats-py operations unwind at their next await, so this is normally microseconds.
CANCEL_GRACE_S = 2.0


@asynccontextmanager
async def open_loop() -> AsyncIterator[None]:
    """Trio-flavoured async context manager: a trio-asyncio loop for one lane.

    Open exactly one per lane and open every :func:`~cotal_trio.natsio.open_connection` of that
    lane inside it. On exit the loop cancels the asyncio tasks still pending; close the lane's
    connections before that (``open_connection`` does it in its shielded ``finally``).

    Yields:
        None. The loop is found again by :func:`open_connection` in this task tree.
    """
    async with trio_asyncio.open_loop():
        yield


def current_loop() -> asyncio.AbstractEventLoop:
    """Sync: the trio-asyncio loop of the enclosing :func:`open_loop`.

    Raises:
        RuntimeError: called outside any ``open_loop()`` (a programming error).
    """
    loop = trio_asyncio.current_loop.get()
    if loop is None or loop.is_closed():
        raise RuntimeError("cotal_trio.natsio needs an enclosing `async with open_loop():`")
    return loop


def _bound(cap_s: float) -> tuple[float, float | None]:
    """``(bound_s, deadline)``: the asyncio-side time budget and the trio deadline it came from.

    ``deadline`` is None when ``cap_s`` was the tighter bound (no caller deadline, or a later one).
    """
    deadline = trio.current_effective_deadline()
    remaining = deadline - trio.current_time()
    if math.isinf(remaining) or remaining >= cap_s:
        return cap_s, None
    # nats-py refuses a timeout <= 0 (BadTimeoutError); the trio side enforces the deadline.
    return max(remaining, 0.001), deadline


async def run_aio(
    loop: asyncio.AbstractEventLoop,
    make_coro: Callable[[float], Awaitable[T]],
    *,
    cap_s: float = DEFAULT_CAP_S,
    what: str,
) -> T:
    """Trio-flavoured: run ``make_coro(bound_s)`` as an asyncio task on ``loop``; return its result.

    ``bound_s`` (seconds) is the caller's remaining trio deadline, capped at ``cap_s``; the
    coroutine passes it to nats-py's own ``timeout`` arguments and the task as a whole is also
    bounded by it on the asyncio side.

    Cancellation: if the caller's scope is cancelled (deadline or explicit), the asyncio task is
    cancelled with a sync call, its end is awaited in a shielded scope (at most
    ``CANCEL_GRACE_S``), and ``trio.Cancelled`` propagates. The operation may or may not have
    reached the broker; nats-py removes its own bookkeeping (response futures, pongs).

    Raises:
        Unavailable: the ``cap_s`` bound (not a caller deadline) expired first, or the loop is
            closed. When the caller's own deadline expires the caller sees ``Cancelled``.
        Exception: whatever the coroutine raised (the caller translates nats errors).
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    bound_s, deadline = _bound(cap_s)
    if loop.is_closed():
        raise Unavailable(f"{what}: the lane's asyncio loop is closed")

    async def bounded() -> T:  # asyncio-flavoured
        # The coroutine is built here, inside the task: a task cancelled before its first step
        # never calls make_coro, so nothing is left unawaited. It runs in this task, not in
        # wait_for's inner one: an error raised as it is cancelled (nats-py's refused connect)
        # is then read by _on_done, never left for trio-asyncio to raise out of open_loop.
        async with asyncio.timeout(bound_s):
            return await make_coro(bound_s)

    coro = bounded()
    try:
        task = loop.create_task(coro)
    except RuntimeError as exc:  # the loop closed under us
        coro.close()
        raise Unavailable(f"{what}: the lane's asyncio loop is closed") from exc
    done = trio.Event()

    def _on_done(t: asyncio.Future[T]) -> None:
        done.set()
        if not t.cancelled():
            t.exception()  # mark it retrieved: we either return it or deliberately drop it

    task.add_done_callback(_on_done)
    try:
        await done.wait()
    except trio.Cancelled:
        task.cancel()
        with trio.move_on_after(CANCEL_GRACE_S, shield=True) as scope:
            await done.wait()
        if scope.cancelled_caught:
            log.warning("%s: asyncio task did not finish %.1f s after cancel", what, CANCEL_GRACE_S)
        raise
    if task.cancelled():  # cancelled from the asyncio side (loop shutting down)
        raise Unavailable(f"{what}: the lane's asyncio loop is shutting down")
    if not isinstance(task.exception(), TimeoutError):
        return task.result()  # the value, or the coroutine's own exception
    if deadline is None:
        raise Unavailable(f"{what}: no answer within {cap_s:g} s") from task.exception()
    # The caller's deadline is what ran out: let its scope see that (the asyncio timer may fire
    # a hair before trio's), so callers using move_on_after/fail_after get their usual answer.
    await trio.sleep_until(deadline)
    await trio.lowlevel.checkpoint()
    raise Unavailable(f"{what}: no answer before the deadline")  # unreachable in practice
