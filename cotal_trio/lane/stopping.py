"""A lane's graceful stop: a cancel drains what is in flight first (issue 15 item 8).

A lane stops by cancellation: the host cancels a removed or changed lane's scope, and SIGTERM
or ``systemctl stop`` cancels the whole service. Cancelled outright, a lane would cut every
callout and exchange it is answering. :func:`graceful_stop` turns that cancel into a drain::

    async with graceful_stop() as stop:        # wraps the whole lane (its loop, its connections)
        ...start...
        stop.serving()                          # from here, a cancel asks for a drain
        task_status.started(...)
        await stop.requested.wait()             # (raced with the lane's own failures)
        ...stop taking new requests, let the in-flight ones answer...
        stop.done()                             # or let DRAIN_S run out

Before :meth:`GracefulStop.serving` a cancel ends the lane at once, as before (nothing is in
flight while it starts, and a start stuck on an unreachable broker must stay cancellable).
After it, the lane's body is shielded: the cancel sets :attr:`GracefulStop.requested`, and
the body is cancelled once it calls :meth:`GracefulStop.done` or ``drain_s`` seconds have
passed, whichever comes first. The cancel then goes on up to whoever cancelled the lane.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

__all__ = ["DRAIN_S", "GracefulStop", "graceful_stop"]

# How long a stopping lane lets its in-flight requests answer before it cancels them (seconds).
# Above the two bounds its requests already have: an admitted callout is answered by its
# deadline (the broker's auth timeout, 2 s by default, less the deadline margin), and an
# in-flight exchange gets hypercorn's graceful 3 s (http.serve.GRACEFUL_TIMEOUT_S); so with the
# defaults every in-flight request meets its own bound first. Short enough that a changed lane
# restarts within seconds and far inside systemd's default TimeoutStopSec (90 s), so a stop
# never ends in SIGKILL. A callout budget above it (a long --auth-timeout) is cut at DRAIN_S.
DRAIN_S = 5.0


class GracefulStop:
    """One lane start's stop handle (made by :func:`graceful_stop`).

    Attributes:
        requested: set when the lane is cancelled from outside (a removal, a change, SIGTERM).
    """

    def __init__(self) -> None:
        self.requested = trio.Event()
        self._scope = trio.CancelScope()
        self._finished = trio.Event()  # the body has left its scope, or asked to be ended
        self._ended = False  # the body ended by itself: the watcher's cancel is not a stop

    def serving(self) -> None:
        """From now on a cancel of the lane drains first (call it right before ``started``)."""
        self._scope.shield = True

    def done(self) -> None:
        """The drain is over: cancel the body now (sync)."""
        self._finished.set()
        self._scope.cancel()

    async def _watch(self, drain_s: float) -> None:
        try:
            await trio.sleep_forever()
        finally:
            if not self._ended:
                self.requested.set()
                if self._scope.shield:
                    with trio.CancelScope(shield=True), trio.move_on_after(drain_s):
                        await self._finished.wait()
                self._scope.cancel()


@asynccontextmanager
async def graceful_stop(drain_s: float = DRAIN_S) -> AsyncIterator[GracefulStop]:
    """Trio: run the block so that a cancel after :meth:`GracefulStop.serving` drains first.

    Args:
        drain_s: seconds a requested stop waits for :meth:`GracefulStop.done` before it
            cancels the block.

    Yields:
        The :class:`GracefulStop` of this block.

    Errors raised in the block propagate (inside an exception group, as from any nursery).
    """
    stop = GracefulStop()
    async with trio.open_nursery() as watcher:
        watcher.start_soon(stop._watch, drain_s)
        try:
            with stop._scope:
                yield stop
        finally:
            stop._ended = not stop.requested.is_set()
            stop._finished.set()
            watcher.cancel_scope.cancel()
