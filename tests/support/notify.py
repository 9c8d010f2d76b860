"""A fake systemd notify socket, and the auth service started under it."""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from tests.support.service import AUTH_TIMEOUT_S, Mesh

WATCHDOG_USEC = 400_000  # pings every 0.2 s


class Systemd:
    """The receiving end of ``NOTIFY_SOCKET``: each datagram as its list of ``KEY=VALUE`` lines."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self._sock = sock
        self.seen: list[list[str]] = []

    async def receive(self) -> list[str]:
        message = (await self._sock.recv(65536)).decode().split("\n")
        self.seen.append(message)
        return message

    async def until(self, line: str) -> list[str]:
        """Receive until a datagram holds ``line``; that datagram."""
        while line not in (message := await self.receive()):
            pass
        return message

    def statuses(self) -> list[str]:
        return [item.removeprefix("STATUS=") for message in self.seen for item in message if item.startswith("STATUS=")]


@pytest.fixture
async def systemd(tmp_path: Path) -> AsyncIterator[tuple[str, Systemd]]:
    """A bound datagram socket in ``tmp_path``: its path (for ``NOTIFY_SOCKET``) and reader."""
    path = str(tmp_path / "notify.sock")
    assert len(path) < 100, "AF_UNIX paths are limited to 107 bytes"
    with trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_DGRAM) as sock:
        await sock.bind(path)
        yield path, Systemd(sock)


async def start_service(nursery: trio.Nursery, mesh: Mesh, tmp_path: Path, notify: str, *args: str) -> trio.Process:
    """``cotal auth-service <args>`` on ``mesh`` as a child process, under our fake systemd."""
    env = {**os.environ, "NOTIFY_SOCKET": notify, "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    env.pop("WATCHDOG_PID", None)
    argv = [
        sys.executable, "-m", "cotal_trio", "auth-service", "--server", mesh.server_url,
        "--root", str(mesh.paths.root), "--auth-timeout", str(AUTH_TIMEOUT_S), *args,
    ]
    out = (tmp_path / "service.log").open("wb")
    try:
        run = functools.partial(trio.run_process, argv, check=False, env=env, stdout=out, stderr=out)
        return await nursery.start(run)
    finally:
        out.close()  # the child holds its own copy


async def stop(proc: trio.Process) -> int:
    """SIGTERM the process we started (by its pid); its exit code."""
    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(20):
        return await proc.wait()
