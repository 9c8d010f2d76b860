"""``cotal exchange`` and ``cotal agent-bearer`` read the exchange's 429 ``RATE_LIMITED``.

Spec "Connect limits": a CLI command prints the service's sentence and a remedy naming the
bucket (only that actor, or the whole account), and exits 2 under ``DEPENDENCY_UNAVAILABLE``;
``--json`` carries ``RATE_LIMITED``, the seconds and ``limit`` in ``error.cause``;
``cotal agent-bearer`` prints ``retry-after <n>`` on stdout. The service is the real loopback
face (as in ``test_client.py``) whose connect limits are a real limiter the test drains.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
from dataclasses import replace

import pytest
import trio

from cotal_trio.cli.client import ExchangeRateLimited
from cotal_trio.core.limits import ConnectLimiter, ConnectLimits
from cotal_trio.http import build_loopback_app, serve_app
from cotal_trio.http.client import ExchangeRefused
from cotal_trio.state import write_json

from tests.support.cli_root import Root
from tests.support.cli_client import SUB, _context, _cotal, _idp_token, _managed

AT = 0.0  # the limiter's clock stands still: the service's answers are exact


@pytest.fixture
def limiter() -> ConnectLimiter:
    return ConnectLimiter(ConnectLimits(actor_per_minute=2, owner_per_minute=3))


@pytest.fixture
async def service(root: Root, nursery: trio.Nursery, limiter: ConnectLimiter) -> str:
    """The loopback face with connect limits, published in ``auth-service.json``."""
    cap = secrets.token_hex(32)
    peek = functools.partial(_peek, limiter)
    app = build_loopback_app(replace(_context(root, cap), peek_limits=peek))
    port = await nursery.start(functools.partial(serve_app, app))
    url = f"http://127.0.0.1:{port}"
    write_json(root.space.auth_service_json, {"ver": 1, "url": url, "pid": os.getpid(), "cap": cap})
    return url


def _peek(limiter: ConnectLimiter, owner: str, actor: str):
    return limiter.peek_principal(owner, actor, AT)


def _drain(limiter: ConnectLimiter, owner: str, actor: str, n: int) -> None:
    for _ in range(n):
        limiter.charge_principal(owner, actor, AT)


ACTOR_REMEDY = 'cotal: only actor "cli" is limited (its owner\'s other actors can still connect) - run this again after 30s, not before'
OWNER_REMEDY = "cotal: the whole account is limited: every actor of this owner shares its connects - run this again after 20s, not before"


async def test_exchange_prints_the_sentence_and_the_actor_remedy_and_exits_2(root, service, limiter, capsys):
    root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
    _drain(limiter, root.owner_of(SUB), "cli", 2)
    code, out, err = await _cotal(root, capsys, "exchange", "--actor", "cli", "--idp-token", _idp_token(root))
    assert (code, out) == (2, "")
    sentence = 'actor "cli" connected more than 2 times in the last minute - stop its reconnect loop and retry after 30s'
    assert err.splitlines()[-2:] == [f"cotal: {sentence}", ACTOR_REMEDY]


async def test_exchange_json_carries_rate_limited_the_seconds_and_the_bucket(root, service, limiter, capsys):
    root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
    owner = root.owner_of(SUB)
    _drain(limiter, owner, "a", 2)
    _drain(limiter, owner, "b", 1)  # the owner's three are gone; cli never connected
    code, out, err = await _cotal(root, capsys, "exchange", "--actor", "cli", "--idp-token", _idp_token(root), "--json")
    assert code == 2 and "cotal:" not in err
    sentence = (
        f'the actors of owner {owner} connected more than 3 times in the last minute, actor "cli" included'
        " - stop their reconnect loops and retry after 20s"
    )
    assert json.loads(out) == {"error": {
        "code": "DEPENDENCY_UNAVAILABLE", "message": sentence, "remedy": OWNER_REMEDY.removeprefix("cotal: "),
        "status": 429, "cause": {"code": "RATE_LIMITED", "retryAfterSeconds": 20, "limit": "owner", "error": sentence},
    }}  # fmt: skip


async def test_agent_bearer_prints_retry_after_on_stdout_and_exits_2(root, service, limiter, capsys, tmp_path):
    token_file = _managed(root, capsys, tmp_path)
    owner = root.owner_of(SUB)
    _drain(limiter, owner, "worker", 2)
    code, out, err = await _cotal(
        root, capsys, "agent-bearer", "--owner", owner, "--actor", "worker", "--token-file", str(token_file)
    )
    assert (code, out) == (2, "retry-after 30\n")
    assert err.splitlines()[-1] == ACTOR_REMEDY.replace('"cli"', '"worker"')
    assert err.splitlines()[-2].startswith('cotal: actor "worker" connected more than 2 times in the last minute')


async def test_agent_bearer_json_carries_rate_limited_and_prints_nothing_else(root, service, limiter, capsys, tmp_path):
    token_file = _managed(root, capsys, tmp_path)
    owner = root.owner_of(SUB)
    _drain(limiter, owner, "worker", 2)
    code, out, err = await _cotal(
        root, capsys, "agent-bearer", "--owner", owner, "--actor", "worker", "--token-file", str(token_file), "--json"
    )
    assert code == 2 and "cotal:" not in err
    error = json.loads(out)["error"]  # stdout is the JSON object alone
    assert (error["code"], error["status"], error["remedy"]) == (
        "DEPENDENCY_UNAVAILABLE", 429, ACTOR_REMEDY.replace('"cli"', '"worker"').removeprefix("cotal: "),
    )
    assert {k: error["cause"][k] for k in ("code", "retryAfterSeconds", "limit")} == {
        "code": "RATE_LIMITED", "retryAfterSeconds": 30, "limit": "actor",
    }


async def test_agent_bearer_json_prints_the_bearer_object(root, service, limiter, capsys, tmp_path):
    token_file = _managed(root, capsys, tmp_path)
    owner = root.owner_of(SUB)
    code, out, _ = await _cotal(
        root, capsys, "agent-bearer", "--owner", owner, "--actor", "worker", "--token-file", str(token_file), "--json"
    )
    answer = json.loads(out)
    assert code == 0 and sorted(answer) == ["exp", "owner", "token"] and answer["owner"] == owner


@pytest.mark.parametrize(
    "body",
    [
        {"error": "too many refused exchanges - wait a minute and retry"},
        {"code": "RATE_LIMITED", "retryAfterSeconds": 0, "limit": "actor", "error": "x"},
        {"code": "RATE_LIMITED", "retryAfterSeconds": True, "limit": "actor", "error": "x"},
        {"code": "RATE_LIMITED", "retryAfterSeconds": 5, "limit": "host", "error": "x"},
    ],
    ids=["refusal budget", "zero seconds", "not an int", "not a principal bucket"],
)
def test_only_the_typed_connect_limit_429_is_read_as_a_rate_limit(body):
    assert ExchangeRateLimited.of(ExchangeRefused(429, body["error"], body), "cli") is None
