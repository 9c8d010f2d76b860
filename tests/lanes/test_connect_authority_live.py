"""Issued authority at connect on a running lane and a real nats-server (issue 6 item 6; spec
credential-authority "User-auth manager callers"; docs/issued-authority.md "Issued authority at connect")."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest
import trio

from cotal_trio.core.connect_authority import accepted_token
from cotal_trio.core.identity import mint_lifecycle_uid
from cotal_trio.core.issued import ceiling_from_native, horizon_of
from cotal_trio.core.ledger import LedgerKind, LedgerRow, hash_actor_token, new_actor_token
from cotal_trio.core.profiles import agent_permissions
from cotal_trio.lanes.issued import IssuedStores
from cotal_trio.lanes.service_endpoints import open_store_user
from cotal_trio.natsio import Connection, open_loop
from cotal_trio.state import load_space, write_row
from tests.lanes.conftest import SPACE, Stack, client
from tests.lanes.test_views_live import _register

pytestmark = pytest.mark.broker


def _exp(bearer: str) -> int:
    payload = bearer.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["exp"]


@asynccontextmanager
async def _stores(stack: Stack) -> AsyncIterator[IssuedStores]:
    material = load_space(stack.space_paths.callout_json, SPACE)
    permissions = {"pub": {"allow": ["$JS.API.>"]}, "sub": {"allow": ["_INBOX.>"]}}
    async with open_loop(), open_store_user(
        material, stack.info.server_url, name="test-issued-reader", permissions=permissions, iat=int(time.time()),
        reconnect=False,
    ) as conn:
        yield IssuedStores(conn, SPACE)


async def _permissions(conn: Connection) -> dict:
    """The connected user's JWT permissions as the broker reports them (``$SYS.REQ.USER.INFO``),
    each list sorted (the broker's order is not the JWT's)."""
    info = json.loads((await conn.request("$SYS.REQ.USER.INFO", b"")).data)["data"]["permissions"]
    return {"pub": {"allow": sorted(info["publish"]["allow"])}, "sub": {"allow": sorted(info["subscribe"]["allow"])}}


def _agent(row, nonce: str) -> dict:
    return agent_permissions(
        space=SPACE, owner=row.owner, actor=row.actor, allow_publish=row.allow_publish,
        allow_subscribe=row.allow_subscribe, inbox_nonce=nonce,
    ).to_nats()  # fmt: skip


def _extra(got: dict, base: dict) -> tuple[set[str], set[str]]:
    return set(got["pub"]["allow"]) - set(base["pub"]["allow"]), set(got["sub"]["allow"]) - set(base["sub"]["allow"])


async def test_an_agent_connect_gets_a_listing_generation_reused_on_the_same_nonce(stack):
    row = stack.grant("alice", "cli", scope=())
    bearer, nonce = await stack.bearer("alice", "cli"), "ibx" + "a1" * 8
    token = accepted_token(nonce, _exp(bearer))
    with trio.fail_after(20):
        async with client(stack, bearer, nonce=nonce) as conn:
            first = await _permissions(conn)
        async with _stores(stack) as stores:
            ref = await stores.accepted_ref(token, now=time.time())
            assert ref is not None and (ref.owner, ref.actor, ref.uid) == (row.owner, "cli", row.lifecycle_uid)
            assert horizon_of(ref.generation) == _exp(bearer)
            evidence = (await stores.resolve(ref, now=time.time())).evidence
        async with client(stack, bearer, nonce=nonce) as conn:
            again = await _permissions(conn)
    g = ref.generation
    pub, sub = _extra(first, _agent(row, nonce))
    assert pub == {
        f"cotal.{SPACE}.ep.v1.{g}.{row.owner}.cli.registry.endpoints",
        f"$JS.API.DIRECT.GET.KV_cotal_accepted_{SPACE}.$KV.cotal_accepted_{SPACE}.accepted.v1.{token}",
    }
    assert sub == {f"cotal.{SPACE}.ep.v1.{g}.{row.owner}.cli.registry.endpoints.reply.>"}
    assert evidence.expires_at == _exp(bearer) and evidence.sources == ()
    assert evidence.permissions.canonical() == ceiling_from_native(first).canonical()
    assert again == first  # the same generation, reused


async def test_a_changed_ceiling_under_the_same_nonce_gets_no_listing_rows(stack):
    row = stack.grant("alice", "cli", scope=())
    bearer, nonce = await stack.bearer("alice", "cli"), "ibx" + "b2" * 8
    with trio.fail_after(20):
        async with client(stack, bearer, nonce=nonce) as conn:
            first = await _permissions(conn)
        wider = replace(row, allow_publish=("team.>", "ops.>"))  # same incarnation, other channels
        write_row(stack.space_paths, wider)
        async with client(stack, bearer, nonce=nonce) as conn:
            again = await _permissions(conn)
    assert len(_extra(first, _agent(row, nonce))[0]) == 2
    assert _extra(again, _agent(wider, nonce)) == (set(), set())  # connected, without the rows
    assert f"cotal.{SPACE}.ch.ops.>" in again["pub"]["allow"]


async def test_a_manager_caller_view_is_issued_with_its_own_generation_and_rows(stack):
    stack.grant("alice", "mgr", scope=("supervise",))
    row = stack.grant("alice", "cli", scope=("run",))
    instance = await _register(stack, "alice", "mgr")
    status, body = await stack.exchange({"idpToken": stack.idp_token("alice"), "actor": "cli", "view": "manager-caller"})
    assert status == 200, body
    bearer, nonce = body["token"], "ibx" + "c3" * 8
    token = accepted_token(nonce, _exp(bearer))
    with trio.fail_after(20):
        async with client(stack, bearer, nonce=nonce) as conn:
            got = await _permissions(conn)
        async with _stores(stack) as stores:
            ref = await stores.accepted_ref(token, now=time.time())
            assert ref is not None
            evidence = (await stores.resolve(ref, now=time.time())).evidence
    g, prefix = ref.generation, f"cotal.{SPACE}.ep.v1.{ref.generation}.{row.owner}.cli"
    verbs = ("registry.endpoints", "manager.run-start", "manager.run-start-keyed", "manager.run-submission-status")
    assert set(got["pub"]["allow"]) == {
        f"cotal.{SPACE}.mgr.{instance}.call",
        *(f"{prefix}.{v}" for v in verbs),
        f"$JS.API.DIRECT.GET.KV_cotal_accepted_{SPACE}.$KV.cotal_accepted_{SPACE}.accepted.v1.{token}",
        "$SYS.REQ.USER.INFO",
    }
    assert set(got["sub"]["allow"]) == {f"_INBOX_{nonce}.>", *(f"{prefix}.{v}.reply.>" for v in verbs)}
    assert horizon_of(g) == _exp(bearer) and evidence.permissions.canonical() == ceiling_from_native(got).canonical()


def _seat(stack: Stack, spawner: LedgerRow, actor: str, token: str) -> LedgerRow:
    row = LedgerRow(
        kind=LedgerKind.MANAGED, owner=spawner.owner, actor=actor, scope=("run",), allow_subscribe=("team.>",),
        allow_publish=("team.>",), role=None, parent=spawner.principal, label=None, token_hash=hash_actor_token(token),
        lifecycle_uid=mint_lifecycle_uid(os.urandom(20)), granted_at="2026-11-29T10:00:00Z",
    )  # fmt: skip
    write_row(stack.space_paths, row)
    return row


async def _seat_verbs(stack: Stack, seat: LedgerRow, token: str) -> set[str]:
    """The ``ep.v1`` verbs a managed seat's ``manager-caller`` connect is given."""
    body = {"owner": seat.owner, "actor": seat.actor, "actorToken": token, "view": "manager-caller"}
    status, answer = await stack.exchange(body)
    assert status == 200, answer
    with trio.fail_after(20):
        async with client(stack, answer["token"]) as conn:
            got = await _permissions(conn)
    return {s.split(f".{seat.actor}.", 1)[1] for s in got["pub"]["allow"] if ".ep.v1." in s}


async def test_a_managed_run_seat_is_issued_only_when_its_spawner_holds_run(stack):
    """Spec "User-auth manager callers": a managed seat with ``run`` gets the bound verbs only when
    its direct parent's fresh same-owner grant holds ``run``; an admin parent's containment
    bypass does not count, and a re-grant of the parent without ``run`` bites the next connect."""
    stack.grant("alice", "mgr", scope=("supervise",))
    await _register(stack, "alice", "mgr")
    boss = stack.grant("alice", "boss", scope=("run",))
    chief = stack.grant("alice", "chief", scope=("admin",))
    token = new_actor_token(os.urandom(32))
    bound = {"registry.endpoints", "manager.run-start", "manager.run-start-keyed", "manager.run-submission-status"}
    worker = _seat(stack, boss, "worker", token)
    assert await _seat_verbs(stack, worker, token) == bound
    assert await _seat_verbs(stack, _seat(stack, chief, "helper", token), token) == {"registry.endpoints"}
    stack.grant("alice", "boss", scope=("admin",))  # re-granted without run: the seat's next connect lists only
    assert await _seat_verbs(stack, worker, token) == {"registry.endpoints"}
