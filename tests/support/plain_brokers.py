"""A plain nats-server a test can stop by its cancel scope, and a listener that never speaks.

For the connection tests of natsio (tests/natsio/test_keepalive_live.py, test_native_live.py):
a broker that goes away (its scope cancelled: SIGTERM) and, on its port, something that accepts
TCP and says nothing (no INFO), as a hung node does.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from cotal_trio.broker.process import run_nats_server

# How long the port may stay taken after the broker went (seconds; TIME_WAIT, the exit).
BIND_S = 10


async def start_stoppable(nursery: trio.Nursery, tmp_path: Path, port: int, scope: trio.CancelScope, tag: str = "plain") -> int:
    """Start a plain nats-server on ``port`` inside ``scope`` (cancel it to stop the broker); its pid."""
    config = tmp_path / f"{tag}.conf"
    config.write_text(f'listen: "127.0.0.1:{port}"\n')

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await run_nats_server(config, log_path=tmp_path / f"{tag}.log", port=port, task_status=task_status)

    return await nursery.start(run)


@asynccontextmanager
async def silent_listener(port: int) -> AsyncIterator[socket.socket]:
    """Trio: a socket listening on ``port`` (bound once the port is free, within ``BIND_S``) that
    accepts into its backlog and never reads or writes."""
    with socket.socket() as silent:
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with trio.fail_after(BIND_S):
            while True:
                try:
                    silent.bind(("127.0.0.1", port))
                    break
                except OSError:
                    await trio.sleep(0.05)
        silent.listen(64)
        yield silent
