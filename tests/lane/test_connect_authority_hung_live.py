"""Issue 15 item 11 (reviewer): a hung or closed issuer session costs a connect its rows, never the connect
(lane/callout/authority.py "A store that fails ... costs the connect its rows, never the
connect"; spec "User-auth manager callers": a failed issuance is minted on the legacy rail).

The lane's issuer session is pointed at a second nats-server that is SIGSTOPped: its socket stays
open and takes the writes, and no ack ever comes, as for a broker or session that hangs rather
than fails. Before the fix the callout awaited those acks until its deadline and the connect timed
out; now it waits at most its deadline less a margin, takes each unacknowledged write as
Unavailable, and mints without ``ep.v1`` rows. Both paths: the prepared writes sent beside the
issuance row, and the port awaited after the re-check (remembered rows a ``stat`` does not
confirm). A closed issuer session the same: no rows, never a denial.
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
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.lane import sessions as space_module  # where the lane opens its issuer session
from cotal_trio.stores.issued import IssuedStores
from cotal_trio.natsio import open_connection
from cotal_trio.state import row_path
from tests.support.stack import SPACE, Stack, client, start_stack
from tests.support.connect_authority_live import _count_paths

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

CEILING_S = 40


@pytest.fixture
async def second_broker(nursery: trio.Nursery, tmp_path, nats_server_bin: str) -> tuple[str, int]:
    """A second nats-server (no auth, no JetStream) for the lane's issuer session: ``(url, pid)``."""
    port = free_port()
    config = tmp_path / "second.conf"
    config.write_text(f'listen: "127.0.0.1:{port}"\n')
    start = functools.partial(run_nats_server, config, executable=nats_server_bin, log_path=tmp_path / "second.log", port=port)
    with trio.fail_after(15):
        pid = await nursery.start(start)
    return f"nats://127.0.0.1:{port}", pid


@pytest.fixture
def hung_pid(second_broker: tuple[str, int], monkeypatch) -> int:
    """The lane's issuer session is on ``second_broker``; the test SIGSTOPs its pid."""
    url, pid = second_broker

    @asynccontextmanager
    async def hung_issuer(config, material) -> AsyncIterator[IssuedStores]:
        async with open_connection(url, name=f"cotal:issuer:{config.space}", reconnect=False) as conn:
            yield IssuedStores(conn, config.space)

    monkeypatch.setattr(space_module, "_open_issuer", hung_issuer)
    return pid


@pytest.fixture
async def hung_stack(hung_pid: int, nursery: trio.Nursery, tmp_path, nats_server_bin: str) -> AsyncIterator[Stack]:
    """conftest's ``stack`` (2 s auth timeout) whose lane's issuer session is on ``hung_pid``."""
    yield await start_stack(nursery, tmp_path, nats_server_bin)


async def _three_connects(stack: Stack, row: LedgerRow, bearer: str) -> None:
    """Three connects on fresh nonces, each admitted with its channels and no ``ep.v1`` rows: the
    first reads the row (then prepares from it), the second comes after the row file's ``stat``
    changed (the remembered rows unconfirmed: the port after the re-check), the third is prepared."""
    with trio.fail_after(CEILING_S):
        for n in range(3):
            if n == 1:
                os.utime(row_path(stack.space_paths, LedgerKind.INTERACTIVE, row.owner, row.actor))
            async with client(stack, bearer) as conn:  # admitted, not timed out or denied
                allow = await _pub_allow(conn)
            assert f"cotal.{SPACE}.ch.team.>" in allow
            assert not any(".ep.v1." in s for s in allow), allow


async def _pub_allow(conn) -> list[str]:
    return json.loads((await conn.request("$SYS.REQ.USER.INFO", b"")).data)["data"]["permissions"]["publish"]["allow"]


async def test_a_hung_issuer_session_costs_the_connect_its_rows_never_the_connect(hung_stack, hung_pid, monkeypatch):
    paths = _count_paths(monkeypatch)
    row = hung_stack.grant("alice", "cli", scope=())
    bearer = await hung_stack.bearer("alice", "cli")
    os.kill(hung_pid, signal.SIGSTOP)
    try:
        await _three_connects(hung_stack, row, bearer)
    finally:
        os.kill(hung_pid, signal.SIGCONT)
    assert paths == {"prepared": [None, None], "after the re-check": ["cancelled"]}


@pytest.fixture
async def closed_stack(
    second_broker: tuple[str, int], nursery: trio.Nursery, tmp_path, nats_server_bin: str, monkeypatch,
) -> AsyncIterator[Stack]:
    """conftest's ``stack`` whose lane's issuer session is closed from the start."""

    @asynccontextmanager
    async def closed_issuer(config, material) -> AsyncIterator[IssuedStores]:
        async with open_connection(second_broker[0], reconnect=False) as conn:
            await conn.flush()
        yield IssuedStores(conn, config.space)  # closed: every write is Unavailable

    monkeypatch.setattr(space_module, "_open_issuer", closed_issuer)
    yield await start_stack(nursery, tmp_path, nats_server_bin)


async def test_a_closed_issuer_session_mints_without_rows_on_both_paths(closed_stack, monkeypatch):
    paths = _count_paths(monkeypatch)
    row = closed_stack.grant("alice", "cli", scope=())
    bearer = await closed_stack.bearer("alice", "cli")
    await _three_connects(closed_stack, row, bearer)
    assert paths == {"prepared": [None, None], "after the re-check": [None]}
