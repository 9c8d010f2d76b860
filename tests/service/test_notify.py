"""The notify protocol's parts without a broker (``service/notify.py``; issue 7 item 4).

Addresses and the watchdog interval from the environment, the STATUS text, when READY is sent,
and the datagrams a :class:`ServiceNotifier` sends to an abstract (``@``) socket the test binds.
Every async test runs under a ``trio.fail_after`` ceiling (virtual time where it uses
``autojump_clock``).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path

import pytest
import trio
import trio.testing

from cotal_trio.core.manifest import LaneStatus
from cotal_trio.service.host import HostStatistics
from cotal_trio.service.notify import ServiceNotifier, notify_address, status_text, watchdog_interval_s

CEILING_S = 10
SERVING, STARTING, STOPPING = LaneStatus(state="serving"), LaneStatus(state="starting"), LaneStatus(state="stopping")


def retrying(reason: str) -> LaneStatus:
    return LaneStatus(state="retrying", reason=reason)


@pytest.mark.parametrize(("value", "address"), [
    (None, None), ("", None), ("/run/systemd/notify", "/run/systemd/notify"), ("@cotal/x", "\0cotal/x"),
    ("relative.sock", None), ("vsock:2:1234", None),
])
def test_notify_address(value, address):
    assert notify_address({} if value is None else {"NOTIFY_SOCKET": value}) == address


@pytest.mark.parametrize(("environ", "interval"), [
    ({}, None), ({"WATCHDOG_USEC": "400000"}, 0.2), ({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "42"}, 0.2),
    ({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "43"}, None), ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "-5"}, None), ({"WATCHDOG_USEC": "soon"}, None),
])
def test_watchdog_interval(environ, interval):
    assert watchdog_interval_s(environ, pid=42) == interval


@pytest.mark.parametrize(("lanes", "refused", "text"), [
    ({}, None, "0/0 lanes serving"),
    ({"a": SERVING, "b": STARTING}, None, "1/2 lanes serving"),
    ({"a": SERVING, "b": STOPPING}, None, "1/1 lanes serving"),
    ({"a": retrying("broker\n  gone"), "b": retrying("x" * 500)}, None,
     "0/2 lanes serving; retrying: a (broker gone), b (" + "x" * 117 + "...)"),
    ({"a": SERVING}, "bad key", "1/1 lanes serving; manifest refused: bad key"),
])
def test_status_text(lanes, refused, text):
    assert status_text(lanes, refused=refused) == text


@pytest.fixture
def systemd():
    """An abstract datagram socket: (its ``@`` name, the bound socket)."""
    name = f"@cotal-test-{os.getpid()}-{os.urandom(4).hex()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name[1:])
        sock.settimeout(5)
        yield name, sock


def received(sock: socket.socket) -> list[list[str]]:
    messages = []
    sock.setblocking(False)
    while True:
        try:
            messages.append(sock.recv(65536).decode().split("\n"))
        except BlockingIOError:
            return messages


async def test_ready_once_status_on_change_stopping_on_cancel(systemd):
    """READY once every lane has its first outcome: serving (flushed, auth-service.json
    written) or retrying with its reason in STATUS. One lane that cannot start must not keep
    the unit from starting, which would fail it and stop the lanes that serve."""
    name, sock = systemd
    notifier = ServiceNotifier.from_environ({"NOTIFY_SOCKET": name})
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(notifier.run)
            notifier.update({"a": STARTING, "b": STARTING})
            notifier.update({"a": STARTING, "b": STARTING})  # unchanged: nothing
            notifier.update({"a": SERVING, "b": STARTING})  # b not yet decided: no READY
            notifier.update({"a": SERVING, "b": retrying("no keys")}, applied=False)  # not applied: no READY
            notifier.update({"a": SERVING, "b": retrying("no keys")})  # every lane decided: READY
            notifier.update({"a": SERVING, "b": SERVING, "c": STOPPING})
            notifier.update({"a": SERVING, "b": retrying("gone")})  # READY is sent once
            assert notifier.ready
            nursery.cancel_scope.cancel()
    assert received(sock) == [
        ["STATUS=0/2 lanes serving"],
        ["STATUS=1/2 lanes serving"],
        ["STATUS=1/2 lanes serving; retrying: b (no keys)"],
        ["READY=1"],
        ["STATUS=2/2 lanes serving"],
        ["STATUS=1/2 lanes serving; retrying: b (gone)"],
        ["STOPPING=1"],
    ]


async def test_watchdog_pings_every_half_interval(systemd, autojump_clock):
    name, sock = systemd
    notifier = ServiceNotifier.from_environ({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "400000"})
    with trio.fail_after(CEILING_S), trio.move_on_after(1.05):
        await notifier.run()
    assert received(sock) == [["WATCHDOG=1"]] * 6 + [["STOPPING=1"]]  # at 0, 0.2, ... 1.0 s


async def test_follow_reports_each_written_state():
    """``follow`` reads the host after each ``.applied`` write; a refused start is never READY."""

    class FakeHost:
        def __init__(self) -> None:
            self.stats = HostStatistics(
                lanes={"a": STARTING}, manifest_sha256=None, refused="no file", rereads=1, reconciles=0, writes=1,
            )
            self.written = trio.Event()

        def statistics(self) -> HostStatistics:
            return self.stats

        async def wait_written(self) -> None:
            await self.written.wait()
            self.written = trio.Event()

    host, notifier = FakeHost(), ServiceNotifier(None)
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(notifier.follow, host)
            await trio.testing.wait_all_tasks_blocked()
            assert not notifier.ready
            host.stats = dataclasses.replace(host.stats, lanes={"a": SERVING}, manifest_sha256="abc", refused=None)
            host.written.set()
            await trio.testing.wait_all_tasks_blocked()
            assert notifier.ready
            nursery.cancel_scope.cancel()


async def test_a_missing_socket_is_logged_once_and_never_raises(tmp_path: Path, caplog):
    notifier = ServiceNotifier(str(tmp_path / "gone.sock"))
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(notifier.run)
            notifier.update({"a": SERVING})
            notifier.send("STATUS=again")
            nursery.cancel_scope.cancel()
    assert [r.message.split(" (")[0] for r in caplog.records] == [f"cannot notify systemd at {tmp_path / 'gone.sock'}"]


async def _notify_all(notifier: ServiceNotifier) -> None:
    """Run ``notifier``, report a serving lane and send a line directly, then cancel it."""
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(notifier.run)
            notifier.update({"a": SERVING})
            notifier.send("STATUS=direct")
            nursery.cancel_scope.cancel()


async def test_no_socket_sends_nothing(systemd, monkeypatch):
    """Given an environ without ``NOTIFY_SOCKET``, nothing is sent, not even to the process's
    own ``$NOTIFY_SOCKET``, which here names the test's socket. The same steps with the
    process's environ do reach that socket, so the first check can fail."""
    name, sock = systemd
    monkeypatch.setenv("NOTIFY_SOCKET", name)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    quiet = ServiceNotifier.from_environ({})
    await _notify_all(quiet)
    assert quiet.ready  # the state is kept; only the datagrams are skipped
    assert received(sock) == []
    await _notify_all(ServiceNotifier.from_environ())
    assert received(sock) == [["READY=1", "STATUS=1/1 lanes serving"], ["STATUS=direct"], ["STOPPING=1"]]
