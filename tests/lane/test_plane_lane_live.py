"""A full lane holds its space's plane claim; replicas never touch it (DESIGN.md sections 5, 8).

The ``stack`` fixture runs ``run_up`` for space ``alpha``: its lane is a full lane, so it holds
the claim. A second full lane for the space, started in the same process, is refused at start
(before it serves or touches the readiness file); a callout-only replica starts next to it.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from cotal_trio.broker.provision import mint_service_user
from cotal_trio.core.plane import (
    PLANE_KEY,
    PlaneRow,
    PlaneState,
    parse_row,
    plane_bucket,
)
from cotal_trio.lane.plane import ClaimRefused
from cotal_trio.lane.run import LaneInfo, run_lane
from cotal_trio.lane.spec import FullLane, LaneCommon, LaneSpec, ReplicaLane
from cotal_trio.natsio import Connection, kv_get, open_connection, open_loop
from cotal_trio.state import load_space

from tests.support.stack import SPACE, Stack, client

CEILING_S = 20


def lane_config(stack: Stack, *, callout_only: bool = False) -> LaneSpec:
    common = LaneCommon(server_url=stack.info.server_url)
    if callout_only:
        return ReplicaLane(space=SPACE, paths=stack.space_paths, common=common)
    return FullLane(space=SPACE, paths=stack.space_paths, common=common, idp_keys=dict, http_port=0)


@asynccontextmanager
async def store_reader(stack: Stack) -> AsyncIterator[Connection]:
    """A short-lived data-account service user that may read the space's auth bucket."""
    material = load_space(stack.space_paths.callout_json, SPACE)
    now = int(time.time())
    creds = mint_service_user(
        material, name="test-plane-reader",
        permissions={"pub": {"allow": ["$JS.API.>"]}, "sub": {"allow": ["_INBOX.>"]}},
        iat=now, exp=now + 120,
    )
    async with open_loop(), open_connection(
        stack.info.server_url, creds=creds, name="test-plane-reader", reconnect=False
    ) as conn:
        yield conn


async def plane_row(stack: Stack) -> tuple[PlaneRow, int]:
    async with store_reader(stack) as conn:
        entry = await kv_get(conn, plane_bucket(SPACE), PLANE_KEY)
    assert entry is not None
    return parse_row(entry.value), entry.revision


async def assert_serving(stack: Stack, actor: str) -> None:
    """The stack's lane still exchanges and admits a granted client."""
    stack.grant("alice", actor)
    bearer = await stack.bearer("alice", actor)
    async with client(stack, bearer) as conn:
        info = json.loads((await conn.request("$SYS.REQ.USER.INFO", b"")).data)
    assert info["data"]["user"].endswith(f"-{actor}")


async def test_stack_lane_holds_the_claim(stack: Stack) -> None:
    with trio.fail_after(CEILING_S):
        row, _ = await plane_row(stack)
    assert row.state is PlaneState.HELD
    assert row.generation == 1
    assert row.holder.startswith(f"{socket.gethostname()}:{os.getpid()}:")


async def test_second_full_lane_is_refused_and_first_keeps_serving(stack: Stack) -> None:
    with trio.fail_after(CEILING_S):
        held, _ = await plane_row(stack)
        readiness = stack.space_paths.auth_service_json.read_bytes()
        with pytest.RaisesGroup(
            pytest.RaisesExc(ClaimRefused, match=f"space {SPACE}: .*{held.holder}"),
            flatten_subgroups=True,
        ) as refused:
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(run_lane, lane_config(stack)))
                pytest.fail("a second full lane for the same space started")
        (error,) = [e for e in _leaves(refused.value) if isinstance(e, ClaimRefused)]
        assert error.space == SPACE and held.holder in error.reason
        # The refused lane wrote, scrubbed and removed nothing: the serving lane's file is intact.
        assert stack.space_paths.auth_service_json.read_bytes() == readiness
        after, _ = await plane_row(stack)
        assert (after.holder, after.generation, after.state) == (held.holder, held.generation, PlaneState.HELD)
        await assert_serving(stack, "cli")


async def test_callout_only_replica_starts_next_to_the_holder(stack: Stack) -> None:
    with trio.fail_after(CEILING_S):
        held, _ = await plane_row(stack)
        readiness = stack.space_paths.auth_service_json.read_bytes()
        async with trio.open_nursery() as nursery:
            info = await nursery.start(functools.partial(run_lane, lane_config(stack, callout_only=True)))
            assert info == LaneInfo(space=SPACE, url=None)
            await assert_serving(stack, "cli")
            nursery.cancel_scope.cancel()
        assert stack.space_paths.auth_service_json.read_bytes() == readiness
        after, _ = await plane_row(stack)
        # Same holder and generation: the replica neither took nor released the claim.
        assert (after.holder, after.generation, after.state) == (held.holder, held.generation, PlaneState.HELD)
        await assert_serving(stack, "agent")


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]
