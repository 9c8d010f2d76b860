"""The lane host: one lane per manifest space, reconciled live (DESIGN.md 5 and 9; issue 3).

``run_host`` is a startable (STYLE.md practice 7) that owns the host nursery of DESIGN.md 5::

    run_host                 host nursery; its own task is the reconcile loop
    ├─ manifest watcher      watchfiles on the manifest's folder (and its symlink target's)
    ├─ SIGHUP receiver
    └─ lane[S]               one supervisor per space, in its own CancelScope

Every trigger (a file event touching the manifest, SIGHUP, or ``backstop_s`` without one) wakes
the reconcile loop through a one-slot channel (:mod:`cotal_trio.service.triggers`), so triggers coalesce; the loop then waits until
no trigger has arrived for ``settle_s`` (a burst of edits applies once) and rereads the file.
Bytes with an unchanged SHA-256 change nothing. New bytes are parsed (``parse_manifest``) and
reconciled (``diff``): removed and changed lanes are cancelled and awaited until fully exited,
then changed and added lanes start. A manifest that cannot be read or parsed is refused whole;
the lanes keep serving (DESIGN.md 9).

A lane moves through ``starting -> serving -> retrying -> starting ...`` (:data:`_NEXT`, the one
table of transitions) and ``stopping`` when the manifest drops or changes it, or the host itself
is cancelled (SIGTERM); a cancelled host's last ``.applied`` lists no lane (issue 15 item 11). A lane whose start
or run raises any ``Exception`` is named in the log and in ``.applied`` and retried every
``retry_s``; the other lanes and the host carry on (DESIGN.md 5, STYLE.md practice 10).
``<manifest>.applied`` is rewritten atomically after every reconcile and every state change,
naming the host's pid so that its readers can tell a killed host's last file from a live one's
(:mod:`cotal_trio.state.applied`).

With an event bus (``HostConfig.events``; issue 7 item 1) the host publishes, synchronously at
the moment it happens: a ``lane`` event on every state change (``starting`` when a lane is
created, then each transition of :data:`_NEXT`), ``fenced`` (with the reason) when a lane's
start or run ended because it lost its plane claim, just before its ``retrying``, and
``stopped`` once a dropped or changed lane has fully exited; and a ``manifest`` event for every
apply (``applied``, with the reconcile) and every refusal (``refused``).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import NoReturn

import trio

from cotal_trio.core.errors import AuthServiceError, ConfigError, leaves
from cotal_trio.core.events import lane_event, manifest_applied, manifest_refused
from cotal_trio.core.manifest import (
    LaneStatus,
    Manifest,
    ManifestRefused,
    SpaceEntry,
    diff,
    format_utc,
    parse_manifest,
    render_applied,
)
from cotal_trio.state.files import atomic_write
from cotal_trio.state.lock import hold_manifest
from cotal_trio.lane.events import EventBus
from cotal_trio.lane.plane import Fenced
from cotal_trio.service.triggers import receive_sighup, settle, watch_manifest

__all__ = ["DEFAULT_SETTLE_S", "Host", "HostConfig", "HostStatistics", "LaneInput", "LaneOutcome", "LaneState", "run_host"]

log = logging.getLogger("cotal.host")

StartLane = Callable[[SpaceEntry], Callable[..., Awaitable[object]]]

# Quiet awaited after a trigger before rereading: longer than the gaps inside one burst of edits
# (watchfiles reports a busy folder in batches up to ~0.1 s apart, more on a loaded host), short enough that an add
# still serves well inside a second.
DEFAULT_SETTLE_S = 0.25
# `.applied` is read by orchestrators and holds no secret.
APPLIED_MODE = 0o644
# The last `.applied` writes of a host being stopped are bounded (seconds): a hung disk must
# not hold the process's exit.
FINAL_WRITE_S = 5.0
# A reason's cap in `.applied`: room for a sentence that names its remedy with the root's path
# and the broker's URL (a missing auth_users entry, lane/refusals.py) before it is cut.
_REASON_CHARS = 600


class LaneState(enum.StrEnum):
    """A lane's state; its value is the ``state`` ``.applied`` and the ``lane`` event name
    (:data:`~cotal_trio.core.manifest.LANE_STATES`)."""

    STARTING = "starting"
    SERVING = "serving"
    RETRYING = "retrying"
    STOPPING = "stopping"


class LaneInput(enum.StrEnum):
    """What happens to a lane: its start ended ``STARTED`` or ``FAILED`` (or its run failed),
    its retry delay passed (``RETRY``), or the manifest or the host stops it (``STOP``)."""

    STARTED = "started"
    FAILED = "failed"
    RETRY = "retry"
    STOP = "stop"


# (state, input) -> next state; the only place lane states change (STYLE.md practice 3).
_NEXT: Mapping[tuple[LaneState, LaneInput], LaneState] = MappingProxyType({
    (LaneState.STARTING, LaneInput.STARTED): LaneState.SERVING,
    (LaneState.STARTING, LaneInput.FAILED): LaneState.RETRYING,
    (LaneState.SERVING, LaneInput.FAILED): LaneState.RETRYING,
    (LaneState.RETRYING, LaneInput.RETRY): LaneState.STARTING,
    **{(state, LaneInput.STOP): LaneState.STOPPING for state in (LaneState.STARTING, LaneState.SERVING, LaneState.RETRYING)},
    # A stopping lane's supervisor may still report what it saw before the cancel reached it.
    **{(LaneState.STOPPING, event): LaneState.STOPPING for event in (LaneInput.STARTED, LaneInput.FAILED, LaneInput.RETRY)},
})


@dataclass(frozen=True, slots=True, kw_only=True)
class HostConfig:
    """What a lane host serves and how it follows its manifest.

    Attributes:
        manifest: the manifest file (may be a symlink); ``.applied`` is written beside it.
        start_lane: for one entry, a startable ``f(*, task_status)`` running that space's lane
            until cancelled (production: ``functools.partial(run_lane, FullLane(...))``).
        callout_only: parse the manifest as a callout-only host (only ``space`` is read).
        retry_s: seconds between a lane's failure and its next start (DESIGN.md 5: 5 s).
        backstop_s: seconds without a trigger after which the manifest is reread anyway.
        settle_s: seconds of quiet awaited after a trigger before rereading (coalesces bursts).
        watch: watch the manifest's folder for file events (off: SIGHUP and backstop only).
        clock: wall time in unix seconds, for ``appliedAt``.
        events: the process's event bus, for lane and manifest events (module docstring); None:
            none are published.

    Raises:
        ConfigError: a duration is not a positive number.
    """

    manifest: Path
    start_lane: StartLane
    callout_only: bool = False
    retry_s: float = 5.0
    backstop_s: float = 30.0
    settle_s: float = DEFAULT_SETTLE_S
    watch: bool = True
    clock: Callable[[], float] = time.time
    events: EventBus | None = None

    def __post_init__(self) -> None:
        for name in ("retry_s", "backstop_s", "settle_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"the host's {name} must be a positive number of seconds, not {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class HostStatistics:
    """A snapshot of a host (STYLE.md practice 11).

    Attributes:
        lanes: every lane the host has, removed ones until fully stopped.
        manifest_sha256: the applied manifest's SHA-256 (hex), ``None`` before any was applied.
        refused: the last refusal's sentence, ``None`` once a manifest was applied after it.
        rereads: manifest reads so far (including those that found unchanged bytes).
        reconciles: manifests applied so far.
        writes: ``.applied`` writes so far.
    """

    lanes: dict[str, LaneStatus]
    manifest_sha256: str | None
    refused: str | None
    rereads: int
    reconciles: int
    writes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneOutcome:
    """How a lane's latest start ended (:meth:`Host.next_outcome`).

    Attributes:
        count: outcomes reported by this lane so far (pass it back as ``seen``).
        status: the lane's status then: ``serving``, or ``retrying`` with its reason.
        failure: the exception (group) that ended it, ``None`` while serving.
    """

    count: int
    status: LaneStatus
    failure: BaseException | None


@dataclass(slots=True, eq=False)
class _Lane:
    """One space's lane: the entry it runs, its state, its scope and its exit signal."""

    entry: SpaceEntry
    status: LaneStatus = field(default_factory=lambda: LaneStatus(state=LaneState.STARTING))
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)
    outcomes: int = 0  # starts that ended in `started` or `failed`, so far
    failure: BaseException | None = None  # what ended the last failed start or run


class Host:
    """A running host, as ``run_host`` hands it to ``task_status.started``.

    Read it with :meth:`current_states` and :meth:`statistics`; await :meth:`wait_written` for
    the next ``.applied`` write. The nursery is never stored: the methods that start lanes take it.
    """

    def __init__(self, config: HostConfig) -> None:
        self._config = config
        self._path = Path(os.path.abspath(config.manifest))
        self._applied_path = self._path.with_name(self._path.name + ".applied")
        self._lanes: dict[str, _Lane] = {}
        self._manifest: Manifest | None = None
        self._refused: str | None = None
        self._seen: str | None = None  # SHA-256 of the last bytes read, or why the read failed
        self._write_lock = trio.Lock()
        self._written = trio.Event()
        self._outcome = trio.Event()  # set (and replaced) on each lane outcome and each stop
        self._counts = {"rereads": 0, "reconciles": 0, "writes": 0}

    @property
    def manifest(self) -> Path:
        """The manifest's absolute path (``.applied`` is beside it)."""
        return self._path

    @property
    def retry_s(self) -> float:
        """Seconds between a lane's failure and its next start (:attr:`HostConfig.retry_s`)."""
        return self._config.retry_s

    def current_states(self) -> dict[str, LaneStatus]:
        """Every lane's status by space (a copy)."""
        return {space: lane.status for space, lane in sorted(self._lanes.items())}

    async def first_outcomes(self) -> dict[str, LaneStatus]:
        """Every lane's status by space once each has ended its first start (``serving``, or
        ``retrying`` with its reason), as :meth:`current_states` then: what a start banner may
        claim. A lane stopping meanwhile is not waited for.
        """
        while any(lane.outcomes == 0 and lane.status.state != LaneState.STOPPING for lane in self._lanes.values()):
            await self._outcome.wait()
        return self.current_states()

    def statistics(self) -> HostStatistics:
        """The host's :class:`HostStatistics` now."""
        sha = self._manifest.sha256 if self._manifest else None
        return HostStatistics(lanes=self.current_states(), manifest_sha256=sha, refused=self._refused, **self._counts)

    async def wait_written(self) -> None:
        """Return after the next successful ``.applied`` write (a checkpoint; nothing to undo)."""
        await self._written.wait()

    async def next_outcome(self, space: str, seen: int = 0) -> LaneOutcome:
        """Wait until ``space``'s lane has reported more than ``seen`` outcomes; the latest.

        An outcome is a start that ended ``serving`` or ``retrying``. Pass the previous
        :attr:`LaneOutcome.count` as ``seen`` to wait for the next one (``cotal up`` uses this
        to wait for its own space, and to see why it failed).

        Raises:
            KeyError: the manifest does not list ``space``, or the lane is stopping because
                the manifest dropped or changed it or the host is being cancelled (also while
                waiting).
        """
        while True:
            lane = self._lanes.get(space)
            if lane is None or lane.status.state == LaneState.STOPPING:
                raise KeyError(space)
            if lane.outcomes > seen:
                return LaneOutcome(count=lane.outcomes, status=lane.status, failure=lane.failure)
            await self._outcome.wait()

    # --- reconcile --------------------------------------------------------------------------

    async def _follow(self, nursery: trio.Nursery, wake: trio.MemoryReceiveChannel[None]) -> NoReturn:
        """Trigger -> settle -> reread, forever; ``backstop_s`` without a trigger is one."""
        while True:
            with trio.move_on_after(self._config.backstop_s):
                await wake.receive()
            await settle(wake, self._config.settle_s, cap_s=self._config.backstop_s)
            await self._reread(nursery)

    async def _reread(self, nursery: trio.Nursery) -> None:
        """Read the manifest; apply it or refuse it unless its bytes (or read error) are unchanged."""
        self._counts["rereads"] += 1
        got = await _read_manifest(self._path)
        seen = hashlib.sha256(got).hexdigest() if isinstance(got, bytes) else got
        if seen == self._seen:
            return
        self._seen = seen
        try:
            if isinstance(got, str):
                raise ManifestRefused((got,))
            new = parse_manifest(got, callout_only=self._config.callout_only)
        except ManifestRefused as exc:
            log.warning("manifest %s refused, the current lanes keep serving: %s", self._path, exc)
            self._refused = str(exc)
            self._emit(manifest_refused(self._refused))
            await self._publish()
            return
        await self._apply(nursery, new)

    async def _apply(self, nursery: trio.Nursery, new: Manifest) -> None:
        """Reconcile to ``new``: stop removed and changed lanes (awaited), then start lanes."""
        change = diff(self._manifest, new)
        log.info(
            "manifest %s applied: added %s, removed %s, changed %s", self._path,
            list(change.added), list(change.removed), list(change.changed),
        )
        await self._stop(change.removed + change.changed)
        for space in change.removed:
            del self._lanes[space]
        self._manifest, self._refused = new, None
        self._counts["reconciles"] += 1
        self._emit(manifest_applied(
            sha256=new.sha256, spaces=new.names, added=change.added, removed=change.removed, changed=change.changed,
        ))
        for space in change.changed + change.added:
            entry = new.entry(space)
            assert entry is not None  # diff only names spaces of `new` here
            self._start(nursery, entry)
        await self._publish()

    async def _stop(self, spaces: Iterable[str]) -> None:
        """Cancel these lanes and wait until each lane task and its nursery have exited."""
        lanes = [self._lanes[space] for space in spaces]
        for lane in lanes:
            self._mark(lane, LaneInput.STOP)
            lane.scope.cancel()
        self._wake_waiters()  # a stopping lane has no next outcome
        if lanes:
            await self._publish()
        for lane in lanes:
            await lane.done.wait()
            self._emit(lane_event(lane.entry.space, "stopped"))

    def _start(self, nursery: trio.Nursery, entry: SpaceEntry) -> None:
        lane = _Lane(entry=entry)
        self._lanes[entry.space] = lane
        self._emit(lane_event(entry.space, lane.status.state))
        nursery.start_soon(self._supervise, lane, name=f"lane[{entry.space}]")

    def _emit(self, event: dict[str, object]) -> None:
        """Publish ``event`` on the host's event bus, if it has one (sync, never blocks)."""
        if self._config.events is not None:
            self._config.events.publish(event)

    # --- one lane ---------------------------------------------------------------------------

    async def _supervise(self, lane: _Lane) -> None:
        """Run one lane until its scope is cancelled: start, serve, and after a failure wait
        ``retry_s`` and start again (DESIGN.md 5). Sets ``lane.done`` once fully exited."""
        try:
            with lane.scope:
                while True:
                    reason = await self._serve_once(lane)
                    await self._move(lane, LaneInput.FAILED, reason)
                    await trio.sleep(self._config.retry_s)
                    await self._move(lane, LaneInput.RETRY)
        finally:
            lane.done.set()

    async def _serve_once(self, lane: _Lane) -> str:
        """Start the lane in its own nursery and serve until it ends; the one-line reason why.

        Any ``Exception`` (grouped or not) is a failure of this lane only; ``Cancelled`` and
        other ``BaseException`` propagate untouched.
        """
        space = lane.entry.space
        failure: BaseExceptionGroup[Exception] | None = None
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._config.start_lane(lane.entry))
                log.info("space %s: lane serving", space)
                lane.failure = None
                await self._move(lane, LaneInput.STARTED)
        except* Exception as group:  # noqa: BLE001 - one lane fails alone (STYLE.md practice 10)
            failure = group  # `return` is not allowed in except*
        lane.failure = failure
        if failure is None:
            log.warning("space %s: lane ended without an error, retrying in %g s", space, self._config.retry_s)
            return "the lane ended without an error"
        reason = _one_line(failure)
        if any(isinstance(leaf, Fenced) for leaf in leaves(failure)) and lane.status.state != LaneState.STOPPING:
            self._emit(lane_event(space, "fenced", reason))  # DESIGN.md 8: it lost its plane claim
        bug = not all(isinstance(leaf, AuthServiceError) for leaf in leaves(failure))
        log.warning(
            "space %s: lane failed, retrying in %g s: %s", space, self._config.retry_s, reason,
            exc_info=failure if bug else None,
        )
        return reason

    def _mark(self, lane: _Lane, event: LaneInput, reason: str | None = None) -> bool:
        """Apply ``event`` to the lane's state (:data:`_NEXT`); True when the status changed.

        Raises:
            RuntimeError: no transition for (state, event): a host bug.
        """
        try:
            state = _NEXT[(lane.status.state, event)]
        except KeyError:
            raise RuntimeError(f"no lane transition from {lane.status.state} on {event} (a host bug)") from None
        status = LaneStatus(state=state, reason=reason if state is LaneState.RETRYING else None)
        changed, lane.status = status != lane.status, status
        if changed:
            self._emit(lane_event(lane.entry.space, status.state, status.reason))
        return changed

    def _wake_waiters(self) -> None:
        """Wake :meth:`next_outcome` callers to look at their lanes again."""
        self._outcome.set()
        self._outcome = trio.Event()

    async def _move(self, lane: _Lane, event: LaneInput, reason: str | None = None) -> None:
        changed = self._mark(lane, event, reason)
        if event in (LaneInput.STARTED, LaneInput.FAILED):
            lane.outcomes += 1
            self._wake_waiters()
        if changed:
            await self._publish()

    async def _stopping(self) -> None:
        """The host is being cancelled: every lane is ``stopping`` (its scope is cancelled with
        the host's nursery); say so in ``.applied``."""
        changed = [self._mark(lane, LaneInput.STOP) for lane in self._lanes.values() if lane.status.state != LaneState.STOPPING]
        self._wake_waiters()
        if any(changed):
            await self._publish()

    async def _stopped(self) -> None:
        """Every lane has exited with the host: ``.applied`` lists none (only if it was written)."""
        if self._counts["writes"] == 0:
            return
        self._lanes.clear()
        await self._publish()

    async def _publish(self) -> None:
        """Rewrite ``.applied`` atomically from the state now (DESIGN.md 9).

        Writes are serialized and each renders the latest state. A failed write is logged and
        the next change writes again; waiters of :meth:`wait_written` wake only on success.
        """
        async with self._write_lock:
            data = render_applied(
                manifest_sha256=self._manifest.sha256 if self._manifest else None,
                applied_at=format_utc(self._config.clock()),
                spaces=self.current_states(),
                refused=self._refused,
                pid=os.getpid(),  # so a reader can tell this file from a killed host's (issue 15 item 11)
            )
            write = functools.partial(atomic_write, self._applied_path, data, mode=APPLIED_MODE)
            try:
                await trio.to_thread.run_sync(write)
            except (OSError, ConfigError) as exc:
                log.error("cannot write %s (%s); the next change writes it again", self._applied_path, exc)
                return
            self._counts["writes"] += 1
            self._written.set()
            self._written = trio.Event()


async def run_host(config: HostConfig, *, task_status: trio.TaskStatus[Host] = trio.TASK_STATUS_IGNORED) -> NoReturn:
    """Serve the manifest's spaces until cancelled (startable; ``started`` with the :class:`Host`).

    ``started`` fires once the watchers are armed, the first reconcile is applied and
    ``.applied`` written; lanes may still be ``starting`` then. A missing or invalid manifest
    at start serves nothing and is recorded as ``refused``; the host keeps watching.

    Cancellation (SIGTERM, ``systemctl stop``) cancels every lane, marks each ``stopping`` in
    ``.applied`` while it drains, and returns once all have exited, with ``.applied`` rewritten
    to list no lane: a stopped host claims nothing (issue 15 item 11). The manifest is left as
    it is.

    One host per manifest: it holds ``<manifest>.applied.lock`` while it runs
    (:func:`~cotal_trio.state.lock.hold_manifest`), since ``.applied`` is one host's account.

    Raises:
        RuntimeError: not in the main thread (SIGHUP needs a signal handler).
        ConfigError: another host holds the manifest (the sentence names its pid and the fix).
    """
    host = Host(config)
    with hold_manifest(host.manifest):  # one host per .applied (DESIGN.md 9); instant file I/O
        await _serve_host(host, config, task_status)


async def _serve_host(host: Host, config: HostConfig, task_status: trio.TaskStatus[Host]) -> NoReturn:
    """:func:`run_host` once it holds the manifest."""
    wake_tx, wake_rx = trio.open_memory_channel[None](1)
    stop_watching = trio.Event()  # watchfiles polls is_set() from its thread
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(receive_sighup, wake_tx)
            if config.watch:
                await nursery.start(watch_manifest, host._path, wake_tx, stop_watching)
            try:
                await host._reread(nursery)
                task_status.started(host)
                await host._follow(nursery, wake_rx)
            finally:
                stop_watching.set()  # lets the watcher's thread return now, not at its next poll
                with trio.CancelScope(shield=True), trio.move_on_after(FINAL_WRITE_S):
                    await host._stopping()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(FINAL_WRITE_S):
            await host._stopped()


# --- files ---------------------------------------------------------------------------------------


async def _read_manifest(path: Path) -> bytes | str:
    """The manifest's bytes, or the sentence refusing it when it cannot be read."""
    try:
        return await trio.Path(path).read_bytes()
    except FileNotFoundError:
        return f'{path} does not exist - write it (an empty manifest is {{"version": 2, "spaces": []}})'
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc}) - check that it is a readable file"


def _one_line(error: BaseException) -> str:
    """The first line of the first leaf error; our own errors as is, others with their type."""
    leaf = leaves(error)[0]
    lines = str(leaf).strip().splitlines()
    text = lines[0] if lines else ""
    if not isinstance(leaf, AuthServiceError):
        text = f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__
    text = text or type(leaf).__name__
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."
