"""The exchange tells the client about connect limits (spec "Connect limits"; issue 4 item 5).

While an actor or its owner is out of connects, ``POST /exchange`` for that actor answers 429
``{"code": "RATE_LIMITED", "retryAfterSeconds": n, "limit": "actor"|"owner", "error": ...}``
with ``Retry-After: n``, on both faces and both arms, and it is not a refused exchange. The
face only peeks (``ExchangeContext.peek_limits``): it spends nothing. Here the limiter is a real
:class:`~cotal_trio.core.limits.ConnectLimiter` on a clock the test moves, charged directly the
way the callout charges it.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from cotal_trio.core.limits import ConnectLimiter, Limit
from cotal_trio.core.windows import REFUSAL_LIMIT
from cotal_trio.http import build_loopback_app
from tests.support.loopback import (
    AGENT_SECRET,
    HEADERS,
    OWNER,
    FixedClock,
    _context,
    _human_body,
    ceiling,
    _post as _post_loopback,
)
from tests.support.public_face import JSON_ONLY, _app, _post as _post_public

AGENT_BODY = {"owner": OWNER, "actor": "worker", "actorToken": AGENT_SECRET}
CLI_LIMITED = {
    "code": "RATE_LIMITED", "retryAfterSeconds": 1, "limit": "actor",
    "error": 'actor "cli" connected more than 60 times in the last minute - stop its reconnect loop and retry after 1s',
}  # fmt: skip
WORKER_OWNER_LIMITED = {
    "code": "RATE_LIMITED", "retryAfterSeconds": 1, "limit": "owner",
    "error": f'the actors of owner {OWNER} connected more than 600 times in the last minute, actor "worker"'
             " included - stop their reconnect loops and retry after 1s",
}  # fmt: skip


class Limits:
    """A limiter and the monotonic clock its peeks read (the lane's trio clock, stood still)."""

    def __init__(self) -> None:
        self.limiter, self.clock = ConnectLimiter(), FixedClock(0.0)

    def peek(self, owner: str, actor: str):
        return self.limiter.peek_principal(owner, actor, self.clock())

    def drain(self, actor: str, n: int) -> None:
        for _ in range(n):
            self.limiter.charge_principal(OWNER, actor, self.clock())

    def drain_owner(self) -> None:
        for n in range(10):
            self.drain(f"other{n}", 60)


def _loopback(limits: Limits):
    return build_loopback_app(replace(_context(), peek_limits=limits.peek)).test_client()


def _public(limits: Limits):
    return _app(replace(_context(), peek_limits=limits.peek)).test_client()


FACES = {
    "loopback": (_loopback, lambda client, body: _post_loopback(client, body, HEADERS)),
    "public": (_public, lambda client, body: _post_public(client, body, headers=JSON_ONLY)),
}
CASES = [
    ("human", lambda limits: limits.drain("cli", 60), _human_body, CLI_LIMITED),
    ("agent", lambda limits: limits.drain_owner(), lambda: AGENT_BODY, WORKER_OWNER_LIMITED),
]


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize(("arm", "drain", "body", "expected"), CASES, ids=[c[0] for c in CASES])
@ceiling
async def test_while_limited_the_exchange_answers_the_typed_429(face, arm, drain, body, expected, caplog):
    build, post = FACES[face]
    limits = Limits()
    client = build(limits)
    status, _, _ = await post(client, body())
    assert status == 200  # not limited yet
    drain(limits)
    before = limits.limiter.statistics()
    with caplog.at_level(logging.INFO, logger="cotal.http"):
        status, answer, response = await post(client, body())
    assert (status, answer, response.headers["Retry-After"]) == (429, expected, "1")
    assert limits.limiter.statistics() == before  # the exchange peeked: nothing spent, nothing counted
    assert f"auth-service: rate-limited {arm} exchange: {expected['error']}" in caplog.messages
    limits.clock.now = 1.0  # a connect is back
    assert (await post(client, body()))[0] == 200


@pytest.mark.parametrize("face", FACES)
@ceiling
async def test_a_limited_answer_is_not_a_refused_exchange(face):
    """More 429s than the refusal budget holds, then a refusal still gets its own reason."""
    build, post = FACES[face]
    limits = Limits()
    client = build(limits)
    limits.drain("cli", 60)
    assert [(await post(client, _human_body()))[0] for _ in range(REFUSAL_LIMIT + 1)] == [429] * (REFUSAL_LIMIT + 1)
    status, answer, _ = await post(client, _human_body(actor="ghost"))
    assert status == 401 and answer["error"].startswith('actor "ghost" is not granted')


@ceiling
async def test_a_bad_credential_is_refused_as_before_while_its_actor_is_limited():
    """The limit is told only to a caller whose credential is good (it names an actor)."""
    limits = Limits()
    limits.drain("worker", 60)
    client = _loopback(limits)
    status, answer, _ = await _post_loopback(client, {**AGENT_BODY, "actorToken": "wrong"})
    assert status == 401 and "code" not in answer
    status, answer, _ = await _post_loopback(client, AGENT_BODY)
    assert (status, answer["limit"]) == (429, "actor")
    assert limits.limiter.level(Limit.ACTOR, f"{OWNER}.worker", 0.0) == 0.0
