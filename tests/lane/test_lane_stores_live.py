"""A full lane creates the space's stores at start (spec "Issued authority"; docs/issued-authority.md,
docs/managers-and-sessions.md), on a real nats-server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from cotal_trio.stores.issued import IssuedStores
from cotal_trio.lane.service_endpoints import open_store_user
from cotal_trio.natsio import Connection, open_loop, stream_config
from cotal_trio.state import load_space
from tests.support.stack import SPACE, Stack

CEILING_S = 15


@asynccontextmanager
async def _store_user(stack: Stack) -> AsyncIterator[Connection]:
    """A data-account user of the test's, allowed the JetStream API (to look at the stores)."""
    material = load_space(stack.space_paths.callout_json, SPACE)
    permissions = {"pub": {"allow": ["$JS.API.>"]}, "sub": {"allow": ["_INBOX.>"]}}
    async with open_loop(), open_store_user(
        material, stack.info.server_url, name="test-stores", permissions=permissions, iat=int(time.time()),
        reconnect=False,
    ) as conn:
        yield conn


async def test_a_full_lane_creates_the_issued_records_and_sessions_stores(stack):
    with trio.fail_after(CEILING_S):
        async with _store_user(stack) as conn:
            await IssuedStores(conn, SPACE).check()  # both exist, in their exact shape
            names = [f"KV_cotal_records_{SPACE}", f"KV_cotal_sessions_{SPACE}"]
            configs = [await stream_config(conn, name) for name in names]
    assert all(config is not None for config in configs)


async def test_an_exchange_provisions_the_principals_dm_inbox_and_task_queue(stack):
    # spec credential-authority "Provisioning": bind-only durables pre-created before the agent binds
    from cotal_trio.natsio import consumer_info

    row = stack.grant("alice", "cli", scope=())
    from dataclasses import replace

    from cotal_trio.state import write_row

    write_row(stack.space_paths, replace(row, role="ops"))
    with trio.fail_after(CEILING_S):
        async with _store_user(stack) as conn:
            before = await consumer_info(conn, f"COTAL_DM_{SPACE}", f"dm-{row.owner}-cli")
            await stack.bearer("alice", "cli")
            inbox = await consumer_info(conn, f"COTAL_DM_{SPACE}", f"dm-{row.owner}-cli")
            queue = await consumer_info(conn, f"COTAL_TASK_{SPACE}", "task-ops")
    assert before is None
    assert inbox is not None and queue is not None
