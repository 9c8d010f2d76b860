"""nats-servers on 127.0.0.1 that a test kills by pid (issue 17 items 3 and 7), a root's 3-node
cluster rendered by ``cotal broker config`` as docs/deploy.md renders it, and a JetStream admin user."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from cotal_trio.broker import provision
from cotal_trio.broker.process import free_port, run_nats_server
from cotal_trio.core.errors import Unavailable
from cotal_trio.natsio import Connection, open_connection
from cotal_trio.state import RootPaths, load_space
from tests.support.cli_root import cotal

NODES = ("n1", "n2", "n3")


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


@dataclass
class RootCluster:
    """Nodes rendered from one root and started (see :func:`start_root_cluster`).

    Attributes:
        paths: the root.
        ports: node name -> (client port, route port).
        urls: node name -> its client URL.
        configs, logs: node name -> its rendered ``.conf`` and its log file.
        pids: node name -> the pid of its running nats-server (replaced by :meth:`start`).
    """

    paths: RootPaths
    ports: dict[str, tuple[int, int]]
    urls: dict[str, str]
    configs: dict[str, Path]
    logs: dict[str, Path]
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def seeds(self) -> str:
        """Every node's URL, comma-separated, in node order."""
        return ",".join(self.urls.values())

    async def start(self, nursery: trio.Nursery, name: str) -> int:
        """Start (or restart) node ``name`` from its rendered config; its pid."""
        self.pids[name] = await nursery.start(functools.partial(node, self.configs[name], self.ports[name][0]))
        return self.pids[name]


async def start_root_cluster(
    nursery: trio.Nursery, tmp_path: Path, capsys: pytest.CaptureFixture[str], space: str, names: tuple[str, ...] = NODES
) -> RootCluster:
    """A root made as docs/deploy.md makes one (``cotal space add SPACE --new-root``, nothing
    pushed), and one nats-server per name, each config rendered by ``cotal broker config`` with
    every node's route, on random 127.0.0.1 ports, and started. The nodes may not have met yet."""
    paths = RootPaths(tmp_path / "root")
    ports = {name: (free_port(), free_port()) for name in names}
    routes = ",".join(f"nats-route://127.0.0.1:{cluster}" for _, cluster in ports.values())
    cluster = RootCluster(
        paths=paths, ports=ports, urls={name: f"nats://127.0.0.1:{port}" for name, (port, _) in ports.items()},
        configs={name: tmp_path / f"{name}.conf" for name in names}, logs={name: tmp_path / f"{name}.log" for name in names},
    )  # fmt: skip
    code, _, err = await cotal(capsys, "space", "add", space, "--root", str(paths.root), "--new-root")
    assert (code, err) == (0, ""), err
    for name, (port, cluster_port) in ports.items():
        code, text, err = await cotal(
            capsys, "broker", "config", "--root", str(paths.root), "--node", name, "--port", str(port),
            "--cluster-port", str(cluster_port), "--cluster-routes", routes,
        )
        assert (code, err) == (0, ""), err
        cluster.configs[name].write_text(text)
        await cluster.start(nursery, name)
    return cluster


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
