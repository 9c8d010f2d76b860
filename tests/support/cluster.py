"""nats-servers on 127.0.0.1 that a test kills by pid (issue 17 items 3 and 7), and a JetStream admin user."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from cotal_trio.broker import provision
from cotal_trio.broker.process import free_port, run_nats_server
from cotal_trio.core.errors import Unavailable
from cotal_trio.natsio import Connection, open_connection
from cotal_trio.state import RootPaths, load_space


async def node(config: Path, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A nats-server the test may kill by pid: its exit ends this task quietly."""
    try:
        await run_nats_server(config, log_path=config.with_suffix(".log"), port=port, task_status=task_status)
    except Unavailable:  # exited after start: the test's own kill
        pass


async def start_cluster(nursery: trio.Nursery, tmp_path: Path, count: int) -> tuple[list[str], list[int]]:
    """``count`` plain nats-servers routed into one cluster; (client URLs, pids)."""
    ports, cports = [free_port() for _ in range(count)], [free_port() for _ in range(count)]
    routes = ", ".join(f'"nats://127.0.0.1:{c}"' for c in cports)
    pids = []
    for i, (port, cport) in enumerate(zip(ports, cports, strict=True)):
        config = tmp_path / f"n{i + 1}.conf"
        config.write_text(
            f'server_name: n{i + 1}\nlisten: "127.0.0.1:{port}"\n'
            f'cluster {{\n  name: c\n  listen: "127.0.0.1:{cport}"\n  routes: [{routes}]\n}}\n'
        )
        pids.append(await nursery.start(functools.partial(node, config, port)))
    return [f"nats://127.0.0.1:{port}" for port in ports], pids


@asynccontextmanager
async def js_admin(paths: RootPaths, space: str, url: str) -> AsyncIterator[Connection]:
    """A short-lived user of ``space``'s data account allowed the JetStream and KV API (what a test
    reads stores and moves their leaders with), connected through ``url`` (seed URLs)."""
    material = load_space(paths.space(space).callout_json, space)
    now = int(time.time())
    creds = provision.mint_service_user(
        material, name="test-cluster-admin", permissions={"pub": {"allow": ["$JS.API.>", "$KV.>"]}, "sub": {"allow": ["_INBOX.>"]}},
        iat=now, exp=now + 600,
    )  # fmt: skip
    async with open_connection(url, creds=creds, name="test-cluster-admin", reconnect=False) as conn:
        yield conn
