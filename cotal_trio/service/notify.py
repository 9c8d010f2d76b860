"""The systemd notify protocol for ``cotal auth-service`` (issue 7 item 4, "Service units").

A ``Type=notify`` unit learns the service's state from datagrams the service sends to the
``AF_UNIX`` socket named by ``$NOTIFY_SOCKET`` (sd_notify(3)): one datagram per message, each
message newline-separated ``KEY=VALUE`` assignments. The name is a filesystem path, or an
abstract socket written with a leading ``@`` (sent with a leading NUL byte instead). With
``$NOTIFY_SOCKET`` unset (not under systemd) nothing is sent, and nothing else changes.

Why our own twenty lines rather than a library: the protocol is one ``sendto`` on a datagram
socket, and the Python packages for it are either unmaintained (``sdnotify``) or bindings that
need libsystemd at build and run time (``systemd-python``, ``cysystemd``); a container image
would carry a C library for one syscall.

What the service sends, and when (:class:`ServiceNotifier`):

* ``READY=1``, once: when every lane of the applied manifest (or the one ``--space`` lane) has
  its first outcome. Normally that is ``serving``: the host marks a lane serving when its start
  returns, and a lane's start returns right after its callout subscription is flushed and its
  ``auth-service.json`` written (replica lanes: right after the flush;
  :func:`~cotal_trio.lane.run.run_lane`). A lane whose start failed counts as decided once it
  is ``retrying``, its reason in ``STATUS``: otherwise one space that cannot start (say, not
  provisioned yet) would keep the unit from ever becoming ready, systemd would fail the start at
  ``TimeoutStartSec`` and stop every lane that serves (DESIGN.md 5: one lane failing never
  affects the others). A manifest refused at start (missing, invalid) is not applied, so the
  unit does not become ready, and ``TimeoutStartSec`` fails the start, which names the problem
  in ``systemctl status``.
* ``STATUS=<n>/<m> lanes serving[; retrying: <space> (<reason>), ...][; manifest refused:
  <reason>]``, whenever that text changes (:func:`status_text`). Lanes the manifest dropped
  (``stopping``) are not counted.
* ``STOPPING=1`` when shutdown begins: the service's nursery is cancelled (SIGTERM, SIGINT) or a
  single-space lane fails; the lanes then drain.
* ``WATCHDOG=1`` every ``WATCHDOG_USEC / 2`` microseconds, sent from the trio loop (so a stalled
  loop stops the pings and systemd restarts the unit), when ``$WATCHDOG_USEC`` is set and
  ``$WATCHDOG_PID`` is unset or this process's pid.

Sending never blocks and never raises: the socket is non-blocking, and a datagram the receiver
cannot take (gone, full) is dropped with one warning per kind of failure. Notifications are
advice to the supervisor, never a reason for the callout to stop.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, NoReturn, Protocol

import trio

from cotal_trio.core.manifest import LaneStatus

if TYPE_CHECKING:
    from cotal_trio.service.host import HostStatistics

__all__ = ["HostView", "ServiceNotifier", "notify_address", "status_text", "watchdog_interval_s"]

log = logging.getLogger("cotal.host")

# Seconds between re-reads of the host's lanes when no `.applied` write woke us: a failed write
# (logged by the host) does not wake `wait_written`, and the status must still catch up.
RECHECK_S = 5.0
# systemd cuts STATUS= for display; keep the reasons' text bounded (characters).
_REASON_CHARS = 120
_SERVING = LaneStatus(state="serving")


class HostView(Protocol):
    """What :meth:`ServiceNotifier.follow` reads of a :class:`~cotal_trio.service.host.Host`."""

    def statistics(self) -> HostStatistics: ...

    async def wait_written(self) -> None: ...


def notify_address(environ: Mapping[str, str]) -> str | None:
    """``$NOTIFY_SOCKET`` as a socket address, or None when unset or not usable.

    ``@name`` is the abstract socket ``\\0name``; a path must be absolute. Other forms (a
    relative path, systemd's ``vsock:`` addresses) are not supported: one warning, None.
    """
    name = environ.get("NOTIFY_SOCKET", "")
    if not name:
        return None
    if name.startswith("@"):
        return "\0" + name[1:]
    if name.startswith("/"):
        return name
    log.warning("NOTIFY_SOCKET=%s is neither an absolute path nor an @abstract name; not notifying systemd", name)
    return None


def watchdog_interval_s(environ: Mapping[str, str], pid: int) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``$WATCHDOG_USEC``), or None for no pings.

    None when ``$WATCHDOG_USEC`` is unset, not a positive integer, or ``$WATCHDOG_PID`` is set
    to another pid than ``pid`` (the watchdog is some other process's).
    """
    usec, owner = environ.get("WATCHDOG_USEC", ""), environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if owner and owner != str(pid):
        return None
    return int(usec) / 2 / 1_000_000


def status_text(lanes: Mapping[str, LaneStatus], *, refused: str | None = None) -> str:
    """The ``STATUS=`` text: ``"<n>/<m> lanes serving"``, then retrying lanes and a refusal.

    Lanes in ``stopping`` (dropped or changed by the manifest) are left out of ``m``.
    """
    counted = {space: status for space, status in lanes.items() if status.state != "stopping"}
    serving = sum(status.state == "serving" for status in counted.values())
    text = f"{serving}/{len(counted)} lanes serving"
    retrying = [f"{space} ({_short(status.reason)})" for space, status in counted.items() if status.state == "retrying"]
    if retrying:
        text += "; retrying: " + ", ".join(retrying)
    if refused:
        text += f"; manifest refused: {_short(refused)}"
    return text


def _short(reason: str | None) -> str:
    text = " ".join((reason or "no reason given").split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


class ServiceNotifier:
    """The service's side of the notify protocol: READY once, STATUS on changes, STOPPING, WATCHDOG.

    Start :meth:`run` first (it opens the socket and owns it); feed :meth:`update` with the
    lanes' states, or let :meth:`follow` read them from a host. Without an address every method
    is a no-op apart from :meth:`run` sleeping until cancelled.

    Args:
        address: the socket address (:func:`notify_address`), or None for no notifications.
        watchdog_s: seconds between ``WATCHDOG=1`` pings (:func:`watchdog_interval_s`), or None.
    """

    def __init__(self, address: str | None, *, watchdog_s: float | None = None) -> None:
        self._address = address
        self._watchdog_s = watchdog_s if address is not None else None
        self._sock: socket.socket | None = None
        self._status: str | None = None
        self._ready = False
        self._failures: set[int] = set()  # errnos already warned about

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, *, pid: int | None = None) -> ServiceNotifier:
        """The notifier systemd asks for through ``environ`` (default ``os.environ``), ``pid`` ours."""
        environ = os.environ if environ is None else environ
        return cls(notify_address(environ), watchdog_s=watchdog_interval_s(environ, pid or os.getpid()))

    @property
    def ready(self) -> bool:
        """Whether ``READY=1`` has been sent (or would have been, without a socket)."""
        return self._ready

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> NoReturn:
        """Own the socket and send the watchdog pings until cancelled; then ``STOPPING=1``.

        Startable: ``started`` once the socket is open. Runs until cancelled; on the way out
        (cancelled or not) it sends ``STOPPING=1`` and closes the socket. A checkpoint.
        """
        if self._address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            task_status.started()
            if self._watchdog_s is None:
                await trio.sleep_forever()
            while True:
                self.send("WATCHDOG=1")
                await trio.sleep(self._watchdog_s)
        finally:
            self.send("STOPPING=1")
            if self._sock is not None:
                self._sock.close()
                self._sock = None
        raise AssertionError("unreachable")  # pragma: no cover

    def update(self, lanes: Mapping[str, LaneStatus], *, applied: bool = True, refused: str | None = None) -> None:
        """Report the lanes' states: ``STATUS=`` when its text changed, ``READY=1`` the first time
        every counted lane of an ``applied`` manifest has an outcome (serving, or retrying with
        its reason). Sync; sends at most one datagram."""
        status = status_text(lanes, refused=refused)
        counted = [s.state for s in lanes.values() if s.state != "stopping"]
        ready_now = applied and not self._ready and all(state in ("serving", "retrying") for state in counted)
        lines = ["READY=1"] if ready_now else []
        if status != self._status:
            lines.append(f"STATUS={status}")
        self._status, self._ready = status, self._ready or ready_now
        if lines:
            self.send(*lines)

    def serving(self, space: str) -> None:
        """Report a single-space service whose lane has started (``--space``)."""
        self.update({space: _SERVING})

    async def follow(self, host: HostView) -> NoReturn:
        """Report ``host``'s lanes after each ``.applied`` write (and every ``RECHECK_S``), until
        cancelled. Each write follows a lane state change (DESIGN.md 9), so none is missed."""
        while True:
            stats = host.statistics()
            self.update(stats.lanes, applied=stats.manifest_sha256 is not None, refused=stats.refused)
            with trio.move_on_after(RECHECK_S):
                await host.wait_written()

    def send(self, *assignments: str) -> None:
        """Send ``assignments`` as one datagram; never blocks, never raises (a failure is logged
        once per errno). Nothing happens before :meth:`run` opened the socket or without one."""
        if self._sock is None or self._address is None:
            return
        try:
            self._sock.sendto("\n".join(assignments).encode(), self._address)
        except OSError as exc:
            if (exc.errno or 0) not in self._failures:
                self._failures.add(exc.errno or 0)
                log.warning("cannot notify systemd at %s (%s); dropping %s", self._address.replace("\0", "@"),
                            exc.strerror or exc, assignments[0].split("=")[0])
