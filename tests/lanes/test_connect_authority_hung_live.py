"""Issue 15 item 11 (reviewer): a hung issuer session costs a connect its rows, never the connect
(lanes/connect_authority.py "A store that fails ... costs the connect its rows, never the
connect"; spec "User-auth manager callers": a failed issuance is minted on the legacy rail).

The lane's issuer session is pointed at a second nats-server that is SIGSTOPped: its socket stays
open and takes the writes, and no ack ever comes, as for a broker or session that hangs rather
than fails. Before the fix the callout awaited those acks until its deadline and the connect timed
out; now it waits at most its deadline less a margin, takes each unacknowledged write as
Unavailable, and mints without ``ep.v1`` rows. Both paths: the first connect of a principal (no
remembered rows: the port is awaited after the re-check) and the next (the prepared writes sent
beside the issuance row).
"""

from __future__ import annotations

import functools
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from cotal_trio.broker.process import free_port, run_nats_server
from cotal_trio.lanes import space as space_module
from cotal_trio.lanes.embedded import UpConfig, run_up
from cotal_trio.lanes.issued import IssuedStores
from cotal_trio.natsio import open_connection
from cotal_trio.state import RootPaths
from tests.lanes.conftest import SPACE, Stack, client

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

CEILING_S = 40


@pytest.fixture
async def hung_pid(nursery: trio.Nursery, tmp_path, nats_server_bin: str, monkeypatch) -> AsyncIterator[int]:
    """A second nats-server the lane's issuer session connects to; the test SIGSTOPs it."""
    port = free_port()
    config = tmp_path / "hung.conf"
    config.write_text(f'listen: "127.0.0.1:{port}"\n')
    start = functools.partial(run_nats_server, config, executable=nats_server_bin, log_path=tmp_path / "hung.log", port=port)
    with trio.fail_after(15):
        pid = await nursery.start(start)

    @asynccontextmanager
    async def hung_issuer(config, material) -> AsyncIterator[IssuedStores]:
        async with open_connection(f"nats://127.0.0.1:{port}", name=f"cotal:issuer:{config.space}", reconnect=False) as conn:
            yield IssuedStores(conn, config.space)

    monkeypatch.setattr(space_module, "_open_issuer", hung_issuer)
    yield pid


@pytest.fixture
async def hung_stack(hung_pid: int, nursery: trio.Nursery, tmp_path, nats_server_bin: str) -> AsyncIterator[Stack]:
    """conftest's ``stack`` (2 s auth timeout) whose lane's issuer session is on ``hung_pid``."""
    paths = RootPaths(tmp_path / "root")
    config = UpConfig(paths=paths, space=SPACE, port=free_port(), auth_timeout_s=2, nats_server=nats_server_bin)
    with trio.fail_after(20):
        info = await nursery.start(functools.partial(run_up, config))
    yield Stack(info=info, paths=paths)


async def _pub_allow(conn) -> list[str]:
    return json.loads((await conn.request("$SYS.REQ.USER.INFO", b"")).data)["data"]["permissions"]["publish"]["allow"]


async def test_a_hung_issuer_session_costs_the_connect_its_rows_never_the_connect(hung_stack, hung_pid):
    hung_stack.grant("alice", "cli", scope=())
    bearer = await hung_stack.bearer("alice", "cli")
    os.kill(hung_pid, signal.SIGSTOP)
    try:
        with trio.fail_after(CEILING_S):
            for _ in ("first connect: the port after the re-check", "again: the prepared writes"):
                async with client(hung_stack, bearer) as conn:  # admitted, not timed out
                    allow = await _pub_allow(conn)
                assert f"cotal.{SPACE}.ch.team.>" in allow
                assert not any(".ep.v1." in s for s in allow), allow
    finally:
        os.kill(hung_pid, signal.SIGCONT)
