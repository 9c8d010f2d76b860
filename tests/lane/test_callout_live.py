"""Issue 2 item 10 on a real nats-server: the whole path from exchange to admitted client.

Each test runs ``run_up`` (root, bundled broker, dev IdP, one lane) and connects like a user-mode
client: the space's sentinel creds, the bearer as ``auth_token``, the inbox nonce as ``name``.
"""

from __future__ import annotations

import base64
import logging
import json
import time

import pytest
import trio

from cotal_trio.core.bearer import BearerGrant, issue_bearer
from cotal_trio.core.identity import mint_lifecycle_uid
from cotal_trio.core.ledger import AGENT_EXCHANGE_REFUSAL, LedgerKind, LedgerRow, hash_actor_token, new_actor_token
from cotal_trio.state import load_issuer_keys, remove_row, write_row

from tests.support.stack import SPACE, client
from tests.support.callout_live import refused

pytestmark = pytest.mark.broker


async def test_admitted_with_exactly_the_granted_permissions(stack):
    stack.grant("alice", "cli", publish=("team.news",), subscribe=("team.>",))
    bearer = await stack.bearer("alice", "cli")
    received = trio.open_memory_channel(4)
    with trio.fail_after(10):
        async with client(stack, bearer) as conn:
            await conn.subscribe(f"cotal.{SPACE}.ch.team.>", on_message=received[0].send_nowait)
            await conn.publish(f"cotal.{SPACE}.ch.team.news", b"hello")
            await conn.flush()
            msg = await received[1].receive()
            assert (msg.subject, msg.data) == (f"cotal.{SPACE}.ch.team.news", b"hello")
            assert conn.error_count == 0
            await conn.publish(f"cotal.{SPACE}.ch.other", b"not granted")
            error = await conn.wait_error(after=0)
            assert "permissions violation" in error.lower() and "cotal.alpha.ch.other" in error


async def test_user_info_names_the_principal(stack):
    row = stack.grant("alice", "cli")
    bearer = await stack.bearer("alice", "cli")
    with trio.fail_after(10):
        async with client(stack, bearer) as conn:
            info = json.loads((await conn.request("$SYS.REQ.USER.INFO", b"")).data)
    assert info["data"]["user"] == f"{row.owner}-cli"


def _sign(key, header: dict, claims: dict) -> str:
    def b64(obj) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    signing_input = f"{b64(header)}.{b64(claims)}"
    signature = base64.urlsafe_b64encode(key.sign(signing_input.encode())).decode().rstrip("=")
    return f"{signing_input}.{signature}"


def _forged(stack, row, **changes) -> str:
    key = load_issuer_keys(stack.space_paths.issuer_json, SPACE).active
    now = int(time.time())
    claims = {
        "scope": list(row.scope), "ver": 1, "sub": row.owner, "iss": f"urn:cotal:auth:{SPACE}", "aud": SPACE,
        "iat": now, "nbf": now, "exp": now + 300,
        "act": {"owner": row.owner, "actor": row.actor, "scope": list(row.scope), "lifecycleUid": row.lifecycle_uid},
    }
    claims.update(changes)
    return _sign(key, {"alg": "EdDSA", "kid": key.kid}, claims)


def _tampered(token: str) -> str:
    head, body, sig = token.split(".")
    flipped = "A" if sig[5] != "A" else "B"
    return f"{head}.{body}.{sig[:5]}{flipped}{sig[6:]}"


REFUSED = {  # case -> (bearer to present, the denial reason the callout logs)
    "tampered": (lambda stack, row, good: _tampered(good), "bearer signature does not verify"),
    "expired": (
        lambda stack, row, good: _forged(stack, row, iat=int(time.time()) - 900, nbf=int(time.time()) - 900, exp=int(time.time()) - 60),
        "bearer expired",
    ),
    "wrong space": (lambda stack, row, good: _forged(stack, row, iss="urn:cotal:auth:beta", aud="beta"), "iss must be urn:cotal:auth:alpha"),
    "wrong audience": (lambda stack, row, good: _forged(stack, row, aud="beta"), "bearer is not for space alpha"),
    "no bearer": (lambda stack, row, good: None, "no user token presented"),
}


@pytest.mark.parametrize("case", list(REFUSED))
async def test_bad_bearers_are_refused(stack, case, caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")
    row = stack.grant("alice", "cli")
    good = await stack.bearer("alice", "cli")
    make_bearer, reason = REFUSED[case]
    with trio.fail_after(10), refused():
        async with client(stack, make_bearer(stack, row, good)):
            pass
    lines = [r.getMessage() for r in caplog.records if r.name == "cotal.callout"]
    assert len(lines) == 1 and " outcome=denied space=alpha " in lines[0], lines
    assert f'reason="{reason}' in lines[0] or reason in lines[0].split("reason=", 1)[1]


async def test_not_granted_actor_is_refused_at_exchange_and_at_connect(stack):
    stack.grant("alice", "cli")
    status, body = await stack.exchange({"idpToken": stack.idp_token("bob"), "actor": "cli"})
    assert status == 401
    assert body["error"].startswith('actor "cli" is not granted for this user - the mesh operator lets them in with `cotal actor grant cli --owner u_')
    row = stack.grant("alice", "cli")
    stranger = issue_bearer(
        BearerGrant(owner=stack.owner("bob"), actor="cli", scope=row.scope, lifecycle_uid=row.lifecycle_uid),
        key=load_issuer_keys(stack.space_paths.issuer_json, SPACE).active, space=SPACE, now=int(time.time()), ttl_s=60,
    )[0]
    with trio.fail_after(10), refused():
        async with client(stack, stranger):
            pass


async def test_revoked_actor_is_refused_on_its_next_connect(stack):
    row = stack.grant("alice", "cli")
    bearer = await stack.bearer("alice", "cli")
    with trio.fail_after(10):
        async with client(stack, bearer):
            pass
        assert remove_row(stack.space_paths, row.owner, "cli")
        with refused():
            async with client(stack, bearer):
                pass


async def test_regrant_rotates_the_lifecycle_and_old_bearers_stop(stack):
    stack.grant("alice", "cli")
    old = await stack.bearer("alice", "cli")
    stack.grant("alice", "cli")
    with trio.fail_after(10):
        with refused():
            async with client(stack, old):
                pass
        async with client(stack, await stack.bearer("alice", "cli")):
            pass


async def test_client_is_disconnected_when_its_bearer_expires(stack):
    stack.grant("alice", "cli")
    status, body = await stack.exchange({"idpToken": stack.idp_token("alice"), "actor": "cli", "ttlSec": 2})
    assert status == 200 and body["exp"] - time.time() <= 2.5
    with trio.fail_after(10):
        async with client(stack, body["token"]) as conn:
            start = trio.current_time()
            await conn.closed.wait()
            assert 0.5 < trio.current_time() - start < 4.5


async def test_managed_agent_exchanges_its_actor_token_and_connects(stack):
    parent = stack.grant("alice", "boss", publish=("tasks.>",), subscribe=("tasks.>",), scope=("spawn",))
    token = new_actor_token(bytes(range(32)))
    child = LedgerRow(
        kind=LedgerKind.MANAGED, owner=parent.owner, actor="worker", scope=("spawn",),
        allow_subscribe=("tasks.>",), allow_publish=("tasks.done",), role=None,
        parent=f"{parent.owner}.boss", label=None, token_hash=hash_actor_token(token),
        lifecycle_uid=mint_lifecycle_uid(bytes(20)), granted_at="2026-11-29T10:00:00Z",
    )
    write_row(stack.space_paths, child)
    status, body = await stack.exchange({"owner": parent.owner, "actor": "worker", "actorToken": "wrong"})
    assert (status, body["error"]) == (401, AGENT_EXCHANGE_REFUSAL)
    status, body = await stack.exchange({"owner": parent.owner, "actor": "worker", "actorToken": token})
    assert status == 200 and body["exp"] - time.time() <= 300
    with trio.fail_after(10):
        async with client(stack, body["token"]) as conn:
            await conn.publish(f"cotal.{SPACE}.ch.tasks.done", b"ok")
            await conn.flush()
            assert conn.error_count == 0


async def test_a_corrupt_ledger_row_denies_that_connect_and_the_lane_keeps_serving(stack, caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")
    row = stack.grant("alice", "cli")
    good = stack.grant("bob", "cli")
    bearer = await stack.bearer("alice", "cli")
    other = await stack.bearer("bob", "cli")
    (stack.space_paths.actors_dir / f"{row.owner}.cli.json").write_text("{not json")
    with trio.fail_after(10):
        with refused():
            async with client(stack, bearer):
                pass
        async with client(stack, other):
            pass
    lines = [r.getMessage() for r in caplog.records if r.name == "cotal.callout"]
    assert " outcome=denied " in lines[0] and f"ledger row {row.owner}.cli is corrupt" in lines[0]
    assert " outcome=minted " in lines[1] and f"owner={good.owner}" in lines[1]
