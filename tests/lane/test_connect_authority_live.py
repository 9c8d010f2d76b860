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

from cotal_trio.core.bearer import ValidatedBearer
from cotal_trio.core.callout import ConnectGrant
from cotal_trio.core.connect_authority import accepted_token
from cotal_trio.core.identity import mint_lifecycle_uid
from cotal_trio.core.issued import accepted_key, attempt_key, ceiling_from_native, evidence_key, horizon_of
from cotal_trio.core.ledger import LedgerKind, LedgerRow, hash_actor_token, new_actor_token
from cotal_trio.core.profiles import agent_permissions
from cotal_trio.lane.callout.authority import ConnectAuthority
from cotal_trio.stores.issued import IssuedStores
from cotal_trio.lane.service_endpoints import open_store_user
from cotal_trio.natsio import Connection, first_message, open_loop
from cotal_trio.natsio._native import NATIVE_VERSION
from cotal_trio.broker.accounts import open_system_connection
from cotal_trio.state import load_broker, load_space, write_row
from tests.support.stack import SPACE, Stack, client
from tests.support.connect_authority_live import _count_paths, _register

pytestmark = pytest.mark.broker


def _exp(bearer: str) -> int:
    payload = bearer.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["exp"]


@asynccontextmanager
async def _stores(stack: Stack, *, writes: bool = False) -> AsyncIterator[IssuedStores]:
    material = load_space(stack.space_paths.callout_json, SPACE)
    writable = [f"$KV.cotal_issued_{SPACE}.>", f"$KV.cotal_accepted_{SPACE}.>"] if writes else []
    permissions = {"pub": {"allow": ["$JS.API.>", *writable]}, "sub": {"allow": ["_INBOX.>"]}}
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


# -- issue 14 item 3: one round trip, the attempt written active, a connect never answered --------


class _Counting:
    """The lane's store connection, counting the JetStream requests and the round trips."""

    def __init__(self, conn: Connection) -> None:
        self._conn, self.requests, self.round_trips = conn, [], 0

    async def request(self, subject, payload, headers=None):
        answer = (await self.request_many(((subject, payload, headers),)))[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def request_many(self, requests):
        self.requests.extend(subject for subject, _, _ in requests)
        self.round_trips += 1
        return await self._conn.request_many(requests)


def _connect_of(stack: Stack, row: LedgerRow, bearer: str, nonce: str) -> tuple[ValidatedBearer, ConnectGrant]:
    """What the callout hands its port for an agent connect of ``row`` under ``nonce``."""
    validated = ValidatedBearer(
        owner=row.owner, actor=row.actor, scope=row.scope, lifecycle_uid=row.lifecycle_uid, parent=None, view=None,
        credential_id=None, iat=int(time.time()), exp=_exp(bearer),
    )  # fmt: skip
    permissions = agent_permissions(
        space=SPACE, owner=row.owner, actor=row.actor, allow_publish=row.allow_publish,
        allow_subscribe=row.allow_subscribe, inbox_nonce=nonce,
    )  # fmt: skip
    return validated, ConnectGrant(owner=row.owner, actor=row.actor, permissions=permissions, exp=_exp(bearer))


async def test_a_fresh_nonce_is_issued_in_one_round_trip_of_three_writes_and_a_reconnect_reads_first(stack):
    """Issue 14 item 3: evidence, attempt ``active`` and the accepted row leave together, their
    acks awaited together: 3 JetStream requests in 1 round trip, no read first. The same nonce
    again reads its row (and the generation's two rows) and reuses the generation."""
    row = stack.grant("alice", "cli", scope=())
    bearer, nonce = await stack.bearer("alice", "cli"), "ibx" + "e5" * 8
    validated, grant = _connect_of(stack, row, bearer, nonce)
    with trio.fail_after(20):
        async with _stores(stack, writes=True) as stores:
            counting = _Counting(stores._conn)
            port = ConnectAuthority(IssuedStores(counting, SPACE))  # type: ignore[arg-type]
            first = await port(validated, grant, row, nonce, time.time())
            assert first is not None
            assert (len(counting.requests), counting.round_trips) == (3, 1)
            assert [s.split(".")[1] for s in counting.requests] == [f"cotal_issued_{SPACE}"] * 2 + [f"cotal_accepted_{SPACE}"]
            ref = await stores.accepted_ref(accepted_token(nonce, _exp(bearer)), now=time.time())
            assert ref is not None and (await stores.resolve(ref, now=time.time())).attempt_revision >= 1  # active
            counting.requests.clear()
            again = await port(validated, grant, row, nonce, time.time())
    assert again == first
    assert [s.split(".")[5] for s in counting.requests] == [f"KV_cotal_accepted_{SPACE}", f"KV_cotal_issued_{SPACE}", f"KV_cotal_issued_{SPACE}"]


async def test_a_generation_whose_connect_was_never_answered_authorizes_nothing_and_goes_with_its_ttl(stack):
    """Issue 14 item 3's invariant, on a real nats-server: the callout's port wrote a fresh
    generation (evidence, attempt ``active`` in one write, accepted row) and the connect was
    never answered (no credential minted). No other connect is given that generation, a client
    publishing on its request subject is refused by the broker, and every row of it is gone
    once its TTL ends (grace 1 s here instead of 60, so it ends within the test)."""
    row = stack.grant("alice", "cli", scope=())
    bearer = await stack.bearer("alice", "cli", ttlSec=4)
    nonce, other = "ibx" + "f6" * 8, "ibx" + "a7" * 8
    validated, grant = _connect_of(stack, row, bearer, nonce)
    with trio.fail_after(30):
        async with _stores(stack, writes=True) as stores:
            short = IssuedStores(stores._conn, SPACE, grace_s=1)
            extra = await ConnectAuthority(short)(validated, grant, row, nonce, time.time())
            assert extra is not None  # ... and the answer never goes out
            ref = await stores.accepted_ref(accepted_token(nonce, _exp(bearer)), now=time.time())
            assert ref is not None
            unanswered = f"cotal.{SPACE}.ep.v1.{ref.generation}.{row.owner}.cli.registry.endpoints"
            assert unanswered in extra.pub_allow
            async with client(stack, bearer, nonce=other) as conn:
                got = await _permissions(conn)
                assert not any(ref.generation in s for s in (*got["pub"]["allow"], *got["sub"]["allow"]))
                assert any(".ep.v1." in s for s in got["pub"]["allow"])  # it got a generation of its own
                errors = conn.error_count
                await conn.publish(unanswered, b"{}")
                await conn.flush()
                assert "permissions violation" in (await conn.wait_error(after=errors)).lower()
            rows = [
                (f"KV_cotal_issued_{SPACE}", f"$KV.cotal_issued_{SPACE}.{evidence_key(ref)}"),
                (f"KV_cotal_issued_{SPACE}", f"$KV.cotal_issued_{SPACE}.{attempt_key(ref)}"),
                (f"KV_cotal_accepted_{SPACE}", f"$KV.cotal_accepted_{SPACE}.{accepted_key(ref_token(nonce, bearer))}"),
            ]
            for stream, subject in rows:  # bounded by fail_after: the TTL (exp + 1 - now), then a poll
                while await first_message(stores._conn, stream, subject) is not None:
                    await trio.sleep(0.25)
    assert time.time() >= _exp(bearer)


def ref_token(nonce: str, bearer: str) -> str:
    return accepted_token(nonce, _exp(bearer))


async def _connz(stack: Stack) -> list[dict]:
    """The broker's CONNZ connections."""
    broker = load_broker(stack.paths.broker_json)
    async with open_loop(), open_system_connection(stack.info.server_url, broker) as system:
        reply = await system.request("$SYS.REQ.SERVER.PING.CONNZ", json.dumps({"limit": 4096}).encode())
    return json.loads(reply.data)["data"]["connections"]


async def _store_messages(stack: Stack) -> tuple[int, int]:
    """How many messages the lane's store connection and its issuer session have published
    (the broker's CONNZ): ``(store, issuer)``."""
    connections = await _connz(stack)
    [store] = [c for c in connections if c.get("name") == f"cotal:auth-store:{SPACE}"]
    issuer = sum(c["in_msgs"] for c in connections if c.get("name") == f"cotal:issuer:{SPACE}")
    return store["in_msgs"], issuer


async def test_an_agent_mint_costs_the_store_four_messages(stack, monkeypatch):
    """Issue 14 item 3, counted by the broker: a fresh nonce's mint with its listing generation
    publishes exactly the issuance row (on the store connection), the evidence, the attempt
    (written ``active`` once) and the accepted row (found by its create-only write, no read
    first; on the issuer session, issue 15 item 4): 1 + 3 messages, where it was 6 (accepted
    read, row, evidence, attempt ``prepared``, attempt ``active``, accepted row). The least of
    three tries, so the lane's own periodic writes (its plane lease) cannot add one. Every
    connect took the prepared path (the writes sent beside the issuance row, kept by
    ``ConnectAuthority.finish``), never the port awaited after the re-check, which costs the
    same messages in two round trips."""
    paths = _count_paths(monkeypatch)
    stack.grant("alice", "cli", scope=())
    bearer = await stack.bearer("alice", "cli")
    counts = []
    with trio.fail_after(30):
        async with client(stack, bearer):  # the principal's rows are read and remembered
            pass
        for _ in range(3):
            before = await _store_messages(stack)
            async with client(stack, bearer) as conn:  # a fresh nonce
                assert any(".ep.v1." in s for s in (await _permissions(conn))["pub"]["allow"])
            after = await _store_messages(stack)
            counts.append((after[0] - before[0], after[1] - before[1]))
    assert min(counts) == (1, 3), counts
    assert len(paths["prepared"]) == 4 and None not in paths["prepared"], paths
    assert paths["after the re-check"] == []


async def test_the_lanes_connections_at_connect_are_trio_native(stack):
    """Issue 14: the callout connection (subscription, replies), the store session (issuance
    row) and the issuer session (issued-authority writes) speak NATS on trio sockets, without
    the asyncio bridge: the broker's CONNZ shows each with the native connection's CONNECT
    version, and an agent connect over them is minted with its rows."""
    stack.grant("alice", "cli", scope=())
    bearer = await stack.bearer("alice", "cli")
    with trio.fail_after(30):
        async with client(stack, bearer) as conn:
            assert any(".ep.v1." in s for s in (await _permissions(conn))["pub"]["allow"])
        versions = {c.get("name"): c.get("version") for c in await _connz(stack)}
    for name in (f"cotal:auth-service:{SPACE}", f"cotal:auth-store:{SPACE}", f"cotal:issuer:{SPACE}"):
        assert versions[name] == NATIVE_VERSION, (name, versions)


async def test_a_regrant_between_two_connects_gets_the_second_its_rows(stack):
    """Reviewer, issue 14 item 3: the writes sent beside the issuance row were made from the
    remembered rows, as stale as the principal's last connect. A re-grant since (same incarnation,
    wider channels) left the fresh nonce's accepted row written with the old ceiling: that connect
    got no rows, and every later connect under the nonce failed the identical-ceiling rule. The
    writes are now prepared only when a ``stat`` confirms the remembered rows; else the port is
    awaited after the re-check, from the fresh row."""
    row = stack.grant("alice", "cli", scope=())
    bearer, nonce = await stack.bearer("alice", "cli"), "ibx" + "d4" * 8
    with trio.fail_after(20):
        async with client(stack, bearer):  # the principal's rows are read and remembered
            pass
        wider = replace(row, allow_publish=("team.>", "ops.>"))
        write_row(stack.space_paths, wider)
        async with client(stack, bearer, nonce=nonce) as conn:
            got = await _permissions(conn)
        async with client(stack, bearer, nonce=nonce) as conn:
            again = await _permissions(conn)
    assert f"cotal.{SPACE}.ch.ops.>" in got["pub"]["allow"]
    assert len(_extra(got, _agent(wider, nonce))[0]) == 2  # its listing rows, from the fresh row
    assert again == got  # the same generation, reused under the nonce
