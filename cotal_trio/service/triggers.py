"""What wakes the lane host to reread its manifest: file events and SIGHUP (DESIGN.md 9; issue 3).

Every trigger goes through one one-slot channel (:func:`wake_up`), so triggers coalesce; the
host then waits until no trigger has arrived for its ``settle_s`` (:func:`settle`) and rereads
the file. :func:`watch_manifest` watches the manifest's folder and, for a symlinked manifest, each
folder on the way to its file (a swapped ``..data`` link included), re-derived after each event;
:func:`receive_sighup` turns each SIGHUP into a trigger. The host's backstop rereads what both
missed (:mod:`cotal_trio.service.host`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import NoReturn

import trio
from watchfiles import Change, awatch

__all__ = ["WATCH_POLL_MS", "WATCH_RETRY_S", "receive_sighup", "settle", "wake_up", "watch_manifest"]

log = logging.getLogger("cotal.host")

# The watcher thread returns at least this often (ms): the watcher is armed by its first return,
# and a cancelled watcher whose stop event was not set exits within this bound.
WATCH_POLL_MS = 250
# Wait before watching again when the manifest's folder cannot be watched (missing, no access).
WATCH_RETRY_S = 5.0
_MAX_HOPS = 40  # symlink hops followed when locating the manifest's file


def wake_up(wake: trio.MemorySendChannel[None]) -> None:
    """Ask for a reread; a request already pending absorbs this one."""
    with contextlib.suppress(trio.WouldBlock):
        wake.send_nowait(None)


async def settle(wake: trio.MemoryReceiveChannel[None], settle_s: float, *, cap_s: float) -> None:
    """Return once no trigger has arrived for ``settle_s`` seconds, or after ``cap_s`` seconds."""
    with trio.move_on_after(cap_s):
        while True:
            with trio.move_on_after(settle_s) as quiet:
                await wake.receive()
            if quiet.cancelled_caught:
                return


async def receive_sighup(
    wake: trio.MemorySendChannel[None], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Wake the host on each SIGHUP; ``started`` once the handler is installed. Runs until cancelled."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        task_status.started()
        async for _ in signals:
            log.info("SIGHUP: rereading the manifest")
            wake_up(wake)
    raise AssertionError("a signal receiver never ends")  # pragma: no cover


async def watch_manifest(
    manifest: Path, wake: trio.MemorySendChannel[None], stop: trio.Event,
    *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Wake the host on file events touching the manifest, until cancelled or ``stop`` is set.

    ``started`` once the first watch is armed (or has failed: the backstop still rereads).
    The folders watched follow the manifest's symlinks and are re-derived after each event.
    """
    ready = _Once(task_status.started)
    while not stop.is_set():
        folders = await trio.to_thread.run_sync(_folders, manifest)
        try:
            await _watch_folders(manifest, folders, wake, stop, ready)
        except OSError as exc:
            log.warning("cannot watch %s (%s); retrying in %g s, SIGHUP and the backstop still reread",
                        manifest.parent, exc, WATCH_RETRY_S)
            ready()
            await trio.sleep(WATCH_RETRY_S)


async def _watch_folders(
    manifest: Path, folders: frozenset[Path], wake: trio.MemorySendChannel[None], stop: trio.Event,
    ready: Callable[[], None],
) -> None:
    """Watch ``folders`` (not recursively); return when the folders to watch have changed."""
    batches = awatch(
        *folders, watch_filter=None, recursive=False, stop_event=stop,
        rust_timeout=WATCH_POLL_MS, yield_on_timeout=True,
    )
    async with aclosing(batches):
        async for batch in batches:
            ready()
            if not batch:
                continue
            touched, now = await trio.to_thread.run_sync(_inspect, manifest, folders, batch)
            if touched:
                wake_up(wake)
            if now != folders:
                return


class _Once:
    """Call ``fn`` on the first call only (``task_status.started`` may be called once)."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn: Callable[[], None] | None = fn

    def __call__(self) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            fn()


# --- files (blocking; called through trio.to_thread) --------------------------------------------


def _route(manifest: Path) -> set[Path]:
    """The manifest's path, each symlink hop toward its file, and its resolved file."""
    route, hop = {manifest}, manifest
    for _ in range(_MAX_HOPS):
        try:
            target = os.readlink(hop)
        except OSError:  # not a symlink (or gone): the chain ends here
            break
        hop = Path(os.path.normpath(hop.parent / target))
        route.add(hop)
    route.add(manifest.resolve())
    return route


def _folders(manifest: Path) -> frozenset[Path]:
    """The folders to watch: the manifest's own, and each existing folder on its route."""
    return frozenset({manifest.parent} | {p.parent for p in _route(manifest) if p.parent.is_dir()})


def _inspect(manifest: Path, watched: frozenset[Path], batch: set[tuple[Change, str]]) -> tuple[bool, frozenset[Path]]:
    """Whether ``batch`` touches the manifest's route (a path on it, or a folder it goes
    through, such as a swapped ``..data`` link), and the folders to watch now."""
    route = _route(manifest)
    paths = {Path(p) for _, p in batch} - watched
    touched = any(p == hop or p in hop.parents for p in paths for hop in route)
    return touched, _folders(manifest)
