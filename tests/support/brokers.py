"""Fixtures for provisioning tests: a root under ``tmp_path`` and a real operator-mode broker.

Registered once in tests/conftest.py (broker, cli and ops tests use them). Also what the tests of
a rendered config share: the trust block every config carries, and ``nats-server -t`` on a file.
"""

from __future__ import annotations

import functools
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from cotal_trio.broker import provision
from cotal_trio.broker.config import write_config
from cotal_trio.broker.process import free_port, run_nats_server
from cotal_trio.state import BrokerMaterial, RootPaths, SpaceMaterial

SPACE = "demo"
START_CEILING_S = 15


@dataclass(frozen=True)
class Provisioned:
    """A provisioned root with one space (nothing pushed yet)."""

    paths: RootPaths
    broker: BrokerMaterial
    space: SpaceMaterial
    iat: int


@pytest.fixture
def provisioned(tmp_path) -> Provisioned:
    """ensure_root + ensure_space(SPACE) into ``tmp_path/root``, at the current wall time."""
    iat = int(time.time())
    paths = RootPaths(tmp_path / "root")
    broker = provision.ensure_root(paths, iat=iat)
    return Provisioned(paths, broker, provision.ensure_space(paths, broker, SPACE, iat=iat), iat)


@pytest.fixture
async def operator_broker(
    nursery: trio.Nursery, provisioned: Provisioned, nats_server_bin: str
) -> AsyncIterator[str]:
    """The provisioned root's broker (operator mode, random port); yields its URL."""
    port = free_port()
    config = write_config(provisioned.paths, provisioned.broker, port=port, auth_timeout_s=2)
    start = functools.partial(
        run_nats_server, config, executable=nats_server_bin,
        log_path=provisioned.paths.broker_log, port=port,
    )
    with trio.fail_after(START_CEILING_S):
        await nursery.start(start)
    yield f"nats://127.0.0.1:{port}"


def trust_lines(broker: BrokerMaterial, resolver_dir: Path | str) -> list[str]:
    """The operator-mode trust block of every config the root renders (the bundled broker's, a
    cluster node's, a leaf node's), line by line: the operator, the system account, the full
    resolver in ``resolver_dir`` and the system account preloaded."""
    return [
        f'operator: "{broker.operator_jwt}"',
        f"system_account: {broker.system_account}",
        "resolver {",
        "  type: full",
        f'  dir: "{resolver_dir}"',
        "  allow_delete: true",
        '  interval: "2m"',
        '  timeout: "1.9s"',
        "}",
        "resolver_preload {",
        f'  {broker.system_account}: "{broker.system_jwt}"',
        "}",
    ]


def nats_accepts(nats_server_bin: str, path: Path) -> None:
    """``nats-server -t -c <path>`` accepts the config (else the assert shows its stderr)."""
    checked = subprocess.run([nats_server_bin, "-t", "-c", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
