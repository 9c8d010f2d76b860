"""``cotal check`` (issue 2 item 9) against a running stack on a real nats-server."""

from __future__ import annotations

import pytest

from cotal_trio.ops.selfcheck import CHECK_ACTOR, CheckFailed, run_check
from cotal_trio.state import list_rows

from tests.support.stack import SPACE

pytestmark = pytest.mark.broker

STEPS = [
    "✓ the auth service is running",
    "✓ IdP token from the development IdP",
    "✓ exchange the IdP token for a bearer",
    "✓ connect with the sentinel creds and the bearer",
    "✓ publish and receive within the grant",
    "✓ a publish outside the grant is refused",
    "✓ a tampered bearer is refused",
]


async def test_check_passes_every_step_and_cleans_up(stack):
    lines: list[str] = []
    await run_check(stack.paths, SPACE, servers=[stack.info.server_url], report=lines.append)
    assert lines == STEPS
    rows, corrupt = list_rows(stack.space_paths)
    assert [r.actor for r in rows] == [] and corrupt == []


async def test_check_with_a_given_token_names_the_failing_step(stack):
    stack.grant("alice", "cli")
    lines: list[str] = []
    with pytest.raises(CheckFailed) as failed:
        await run_check(stack.paths, SPACE, servers=[stack.info.server_url], report=lines.append, idp_token=stack.idp_token("bob"), actor="cli")
    assert failed.value.step == "exchange the IdP token for a bearer"
    assert 'actor "cli" is not granted for this user' in str(failed.value)
    assert lines == ["✓ the auth service is running"]


async def test_check_as_a_granted_actor(stack):
    stack.grant("alice", "cli", publish=(), subscribe=())
    lines: list[str] = []
    await run_check(stack.paths, SPACE, servers=[stack.info.server_url], report=lines.append, idp_token=stack.idp_token("alice"), actor="cli")
    assert lines == [STEPS[0], *STEPS[2:]]
    assert CHECK_ACTOR not in {r.actor for r in list_rows(stack.space_paths)[0]}
