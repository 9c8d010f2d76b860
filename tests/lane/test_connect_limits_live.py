"""Connect limits on a real nats-server (spec "Connect limits"; issue 4, "Tests").

Each test runs ``run_up`` (the ``stack`` fixture) and connects like a user-mode client. The
lane's limiter runs on trio time, and these tests run trio on a ``MockClock`` at real speed,
so a test can **hold** trio time nearly still (:func:`held`) around a burst of real connects:
then "61 connects in a minute" means exactly that, however long the connects take, and the
callout and the exchange see one instant, so their ``retry-after`` seconds must agree exactly.
While held, each real second moves trio time by :data:`HELD_RATE` s (far less than one
connect's refill), and a held section's ceiling is :data:`CEILING_S` real seconds.

The limits are the spec's defaults (60 a minute per actor, 600 per owner, 60 per host).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import Message

import pytest
import trio
import trio.testing

from cotal_trio.core.errors import Unavailable
from cotal_trio.state import read_json
from tests.support.callout_log import parse_callout_line

from tests.support.stack import Stack, client, post_answer

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

HELD_RATE = 1e-4  # trio seconds per real second while held
CEILING_S = 120  # real seconds


@pytest.fixture
def clock(mock_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    """Trio's clock for the whole test (the stack included), running at real speed."""
    mock_clock.rate = 1.0
    return mock_clock


@pytest.fixture(autouse=True)
def _capture(caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")


@contextmanager
def held(clock: trio.testing.MockClock) -> Iterator[None]:
    """Hold trio time nearly still inside the block, with a ceiling of ``CEILING_S`` real s."""
    clock.rate = HELD_RATE
    try:
        with trio.fail_after(CEILING_S * HELD_RATE):
            yield
    finally:
        clock.rate = 1.0


async def admitted(stack: Stack, bearer: str) -> bool:
    """Connect once: True when the broker admits the client, False on Authorization Violation."""
    try:
        async with client(stack, bearer) as conn:
            await conn.flush()
    except BaseExceptionGroup as group:
        violation, rest = group.split(lambda e: isinstance(e, Unavailable) and "Authorization Violation" in str(e))
        if violation is None or rest is not None:
            raise
        return False
    return True


async def exchange(stack: Stack, sub: str, actor: str) -> tuple[int, dict, Message]:
    service = read_json(stack.space_paths.auth_service_json)
    body = {"idpToken": stack.idp_token(sub), "actor": actor}
    return await trio.to_thread.run_sync(post_answer, service["url"] + "/exchange", service["cap"], body)


def denied_lines(caplog) -> list[dict]:
    lines = [r.getMessage() for r in caplog.records if r.name == "cotal.callout"]
    return [parse_callout_line(line) for line in lines if " outcome=denied " in line]


def rate_limited_429(limit: str, seconds: int, error: str) -> dict:
    return {"code": "RATE_LIMITED", "retryAfterSeconds": seconds, "limit": limit, "error": error}


async def test_the_61st_connect_of_an_actor_in_a_minute_is_refused_and_the_exchange_says_so(
    stack: Stack, clock, caplog
):
    owner = stack.grant("alice", "cli").owner
    bearer = await stack.bearer("alice", "cli")
    with held(clock):
        answers = [await admitted(stack, bearer) for _ in range(61)]
        status, body, headers = await exchange(stack, "alice", "cli")
    assert answers == [True] * 60 + [False]
    [line] = denied_lines(caplog)
    assert (line["owner"], line["actor"], line["level"]) == (owner, "cli", "info")
    assert line["reason"].startswith(f"RATE_LIMITED retry-after 1s actor=cli owner={owner} limit=actor: ")
    sentence = 'actor "cli" connected more than 60 times in the last minute - stop its reconnect loop and retry after 1s'
    assert (status, body, headers["Retry-After"]) == (429, rate_limited_429("actor", 1, sentence), "1")
    await trio.sleep(1)  # one connect back (real time again)
    assert await admitted(stack, bearer)


async def test_the_601st_connect_across_an_owners_actors_is_refused(stack: Stack, clock, caplog):
    actors = [f"a{n}" for n in range(11)]
    rows = [stack.grant("bob", actor) for actor in actors]
    owner = rows[0].owner
    bearers = [await stack.bearer("bob", actor) for actor in actors]
    with held(clock):
        answers = [await admitted(stack, bearer) for bearer in bearers[:10] for _ in range(60)]
        last = await admitted(stack, bearers[10])
        status, body, headers = await exchange(stack, "bob", "a10")
        other = await exchange(stack, "carol", "cli")  # not bob's: not limited (and not granted)
    assert answers == [True] * 600 and last is False
    [line] = denied_lines(caplog)
    assert (line["owner"], line["actor"]) == (owner, "a10")
    assert line["reason"].startswith(f"RATE_LIMITED retry-after 1s actor=a10 owner={owner} limit=owner: ")
    sentence = (
        f'the actors of owner {owner} connected more than 600 times in the last minute, actor "a10" included'
        " - stop their reconnect loops and retry after 1s"
    )
    assert (status, body, headers["Retry-After"]) == (429, rate_limited_429("owner", 1, sentence), "1")
    assert other[0] == 401


async def test_a_host_presenting_bad_bearers_is_limited_at_61_without_touching_an_actor(
    stack: Stack, clock, caplog
):
    owner = stack.grant("dave", "cli").owner
    bearer = await stack.bearer("dave", "cli")
    with held(clock):
        bad = [await admitted(stack, "not-a-jwt") for _ in range(61)]
        status, _, _ = await exchange(stack, "dave", "cli")  # the actor is not limited
        good = [await admitted(stack, bearer) for _ in range(60)]  # its whole minute is there
    assert (bad, good, status) == ([False] * 61, [True] * 60, 200)
    lines = denied_lines(caplog)
    assert [(line["owner"], line["actor"]) for line in lines] == [("-", "-")] * 61
    assert all(line["reason"].startswith("bearer is not a compact JWS") for line in lines[:60])
    assert lines[60]["reason"].startswith("RATE_LIMITED retry-after 1s host=127.0.0.1 limit=host: ")
    assert owner not in "".join(line["reason"] for line in lines)
