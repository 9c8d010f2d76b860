"""stores/records.py on a real nats-server: both stores, manager rows, session TTLs, generic
records, the missing-store sentence, and the three permission sets as data-account users."""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import pytest
import trio

from cotal_trio.core.errors import RefusalCode, Refused, Unavailable
from cotal_trio.core.identity import mint_lifecycle_uid
from cotal_trio.core.managers import ManagerInstance
from cotal_trio.core.service_endpoints import ServiceEndpointRecord
from cotal_trio.core.sessions import ChatSession, new_chat_session, new_session_id
from cotal_trio.stores.records import (
    RecordsStore,
    StoresMissing,
    ensure_records_stores,
    manager_cli_permissions,
    merge_permissions,
    records_bucket,
    sessions_bucket,
)
from cotal_trio.lane.service_users import open_service_user, replica_store_permissions, store_permissions
from cotal_trio.natsio import Connection, KeyExists, kv_put, open_connection, open_loop
from cotal_trio.state import load_space
from tests.support.stack import SPACE, Stack
from tests.support.records import ttl_header

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

CEILING_S = 30
# A 1 s TTL is gone once the server's expiry timer has run; poll for it at most this long.
TTL_WAIT_S = 6.0
POLL_S = 0.25
ALICE = "u_" + "a" * 26
BOB = "u_" + "b" * 26
NOW = 1_767_225_600


def instance(owner: str = ALICE, actor: str = "mgr", *, label: str | None = None) -> ManagerInstance:
    return ManagerInstance(
        instance_id=mint_lifecycle_uid(os.urandom(20)), owner=owner, actor=actor, serve_epoch=1,
        registered_at=NOW, label=label,
    )


def session(owner: str = ALICE, *, now: int = NOW) -> ChatSession:
    return new_chat_session(
        session_id=new_session_id(os.urandom(32)), endpoint="chat", owner=owner, actor="cli", epoch=1, now=now,
    )


@pytest.fixture
async def conn(plain_broker: str) -> AsyncIterator[Connection]:
    async with open_loop(), open_connection(plain_broker, name="records") as connection:
        yield connection


@pytest.fixture
async def store(conn: Connection) -> RecordsStore:
    with trio.fail_after(CEILING_S):
        await ensure_records_stores(conn, SPACE)
    return RecordsStore(conn, SPACE)


async def stream_config(conn: Connection, bucket: str) -> dict:
    return json.loads((await conn.request(f"$JS.API.STREAM.INFO.KV_{bucket}", b"")).data)["config"]


async def test_ensure_creates_both_stores_with_history_1_and_ttls_and_is_idempotent(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_records_stores(conn, SPACE)
        await ensure_records_stores(conn, SPACE)
        configs = [await stream_config(conn, bucket) for bucket in (records_bucket(SPACE), sessions_bucket(SPACE))]
    assert [c["name"] for c in configs] == ["KV_cotal_records_alpha", "KV_cotal_sessions_alpha"]
    assert [(c["max_msgs_per_subject"], c["allow_msg_ttl"]) for c in configs] == [(1, True), (1, True)]


async def test_register_get_list_by_owner_and_retire(store: RecordsStore) -> None:
    a1, a2, b1 = instance(label="build box"), instance(actor="mgr2"), instance(BOB)
    with trio.fail_after(CEILING_S):
        for row in (a1, a2, b1):
            assert await store.register_manager(row) >= 1
        got = await store.get_manager(ALICE, a1.instance_id)
        alices = await store.list_managers(ALICE)
        everyone = await store.list_managers()
        assert await store.retire_manager(ALICE, a1.instance_id) is True
        assert await store.retire_manager(ALICE, a1.instance_id) is False
        assert await store.retire_manager(BOB, a2.instance_id) is False  # not Bob's
        after = await store.list_managers(ALICE)
        gone = await store.get_manager(ALICE, a1.instance_id)
    assert got == a1 and got.label == "build box"
    assert alices == sorted([a1, a2], key=lambda i: i.instance_id)
    assert everyone == sorted([a1, a2, b1], key=lambda i: i.key)
    assert after == [a2] and gone is None


async def test_register_is_create_only(store: RecordsStore) -> None:
    row = instance()
    with trio.fail_after(CEILING_S):
        first = await store.register_manager(row)
        with pytest.raises(Refused) as conflict:
            await store.register_manager(ManagerInstance(**{**_fields(row), "actor": "other", "serve_epoch": 2}))
        stored = await store.get_manager(ALICE, row.instance_id)
    assert first >= 1 and stored == row
    assert conflict.value.code is RefusalCode.CONFLICT
    assert conflict.value.detail == (
        f"manager instance {row.instance_id} is already registered to owner {ALICE} - register with a new"
        " instance id, or retire it first with `cotal manager retire`"
    )


async def test_a_retired_instance_id_can_be_registered_again(store: RecordsStore) -> None:
    row = instance()
    with trio.fail_after(CEILING_S):
        await store.register_manager(row)
        assert await store.retire_manager(ALICE, row.instance_id)
        await store.register_manager(row)
        assert await store.get_manager(ALICE, row.instance_id) == row


async def test_list_skips_an_unreadable_row_with_a_warning(store: RecordsStore, conn: Connection, caplog) -> None:
    good = instance()
    bad_key = f"mgr.{ALICE}.{'z' * 26}"
    with trio.fail_after(CEILING_S):
        await store.register_manager(good)
        await kv_put(conn, records_bucket(SPACE), bad_key, b'{"ver": 2}')
        listed = await store.list_managers(ALICE)
        read = await store.get_manager(ALICE, "z" * 26)
    assert listed == [good] and read is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "cotal.records"]
    assert len(warnings) == 2 and all(f"{bad_key} is unreadable and was skipped" in w for w in warnings)


async def test_session_is_written_with_ttl_exp_minus_now_plus_60(store: RecordsStore, conn: Connection) -> None:
    row = session()
    with trio.fail_after(CEILING_S):
        await store.open_session(row, now=NOW + 100)
        ttl = await ttl_header(conn, sessions_bucket(SPACE), row.key)
        got = await store.get_session(row.session_id)
        with pytest.raises(Refused) as conflict:
            await store.open_session(row, now=NOW)
        assert await store.retire_session(row.session_id) is True
        assert await store.retire_session(row.session_id) is False
        gone = await store.get_session(row.session_id)
    assert ttl == 3600 - 100 + 60
    assert got == row and gone is None
    assert conflict.value.code is RefusalCode.CONFLICT


async def test_session_row_leaves_the_store_when_its_ttl_ends(store: RecordsStore, conn: Connection) -> None:
    row = session()
    with trio.fail_after(CEILING_S):
        await store.open_session(row, now=row.exp + 59)  # exp - now + 60 = 1 s
        assert await ttl_header(conn, sessions_bucket(SPACE), row.key) == 1
        assert await store.get_session(row.session_id) == row
        waited = 0.0
        while await store.get_session(row.session_id) is not None:
            assert waited < TTL_WAIT_S, "the session row outlived its 1 s TTL"
            await trio.sleep(POLL_S)
            waited += POLL_S


async def test_generic_records_put_create_get_with_ttl(store: RecordsStore, conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        rev = await store.put_record("lifecycle.abc", b"one", ttl_s=960)
        rev2 = await store.put_record("lifecycle.abc", b"two")
        created = await store.create_record("consent.j1", b"c", ttl_s=360)
        with pytest.raises(KeyExists):
            await store.create_record("consent.j1", b"again")
        ttl = await ttl_header(conn, records_bucket(SPACE), "consent.j1")
        values = [await store.get_record(k) for k in ("lifecycle.abc", "consent.j1", "consent.none")]
    assert rev2 > rev >= 1 and created > rev2
    assert ttl == 360 and values == [b"two", b"c", None]


async def test_missing_stores_name_the_fix(conn: Connection) -> None:
    store = RecordsStore(conn, "nostores")
    calls = [
        store.register_manager(instance()), store.list_managers(ALICE), store.get_manager(ALICE, "a" * 26),
        store.retire_manager(ALICE, "a" * 26), store.open_session(session(), now=NOW),
        store.get_session("s" * 43), store.put_record("k", b"v"), store.get_record("k"),
    ]
    with trio.fail_after(CEILING_S):
        for call in calls:
            with pytest.raises(StoresMissing) as missing:
                await call
            assert isinstance(missing.value, Unavailable)
            assert str(missing.value).startswith("space nostores has no store cotal_")
            assert str(missing.value).endswith(
                " - start the space's full auth service once: it creates the stores"
            )


def _fields(row: ManagerInstance) -> dict:
    return {name: getattr(row, name) for name in ManagerInstance.__slots__}


# -- permissions, as data-account users of a running stack -------------------------------------


def as_user(stack: Stack, permissions: Callable[[str], dict] | dict, name: str) -> AbstractAsyncContextManager[Connection]:
    material = load_space(stack.space_paths.callout_json, SPACE)
    now = int(time.time())
    return open_service_user(
        material, stack.info.server_url, name=name, permissions=permissions, iat=now, exp=now + 120, reconnect=False
    )


async def denied(conn: Connection, call: Callable[[], Awaitable[object]]) -> str:
    """The broker's error for ``call``'s publish (a denied request gets no answer: cancelled then)."""
    before = conn.error_count
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        error = await conn.wait_error(after=before)
        nursery.cancel_scope.cancel()
    return error


async def test_permissions_full_replica_and_cli_users(stack: Stack) -> None:
    """The lane's own store users (``service_users``) and ``cotal manager``'s, each on its real list."""
    full = functools.partial(store_permissions, SPACE)
    row, sess = instance(), session(now=int(time.time()))
    with trio.fail_after(CEILING_S):
        async with open_loop():
            async with as_user(stack, full, "test:records-full") as conn:
                await ensure_records_stores(conn, SPACE)
                lane = RecordsStore(conn, SPACE)
                await lane.open_session(sess, now=time.time())
                await lane.put_record("lifecycle.x", b"r")
            async with as_user(stack, manager_cli_permissions(SPACE), "test:records-cli") as conn:
                cli = RecordsStore(conn, SPACE)
                await cli.register_manager(row)
                listed = await cli.list_managers(ALICE)
                cli_put = await denied(conn, lambda: cli.put_record("lifecycle.y", b"r"))  # manager rows only
            async with as_user(stack, functools.partial(replica_store_permissions, SPACE), "test:records-replica") as conn:
                replica = RecordsStore(conn, SPACE)
                reads = (await replica.get_manager(ALICE, row.instance_id), await replica.get_session(sess.session_id),
                         await replica.get_record("lifecycle.x"))
                replica_write = await denied(conn, lambda: replica.register_manager(instance()))
                replica_list = await denied(conn, lambda: replica.list_managers(ALICE))
    assert listed == [row] and reads == (row, sess, b"r")
    # nats-py lowercases the error text.
    assert cli_put == f'nats: permissions violation for publish to "$kv.cotal_records_{SPACE}.lifecycle.y"'
    assert replica_write.startswith(f'nats: permissions violation for publish to "$kv.cotal_records_{SPACE}.mgr.')
    assert replica_list == f'nats: permissions violation for publish to "$js.api.stream.info.kv_cotal_records_{SPACE}"'


def test_merge_permissions_is_an_ordered_union() -> None:
    merged = merge_permissions(
        {"pub": {"allow": ["a", "b"]}, "sub": {"allow": ["_INBOX.>"]}},
        {"pub": {"allow": ["b", "c"], "deny": ["d"]}, "sub": {"allow": ["_INBOX.>"]}},
    )
    assert merged == {"pub": {"allow": ["a", "b", "c"], "deny": ["d"]}, "sub": {"allow": ["_INBOX.>"]}}



# --- service endpoint registrations (issue 19 item 1; docs/http-api.md "Service endpoints") ----


def registration(owner: str = ALICE, *, epoch: int = 1) -> ServiceEndpointRecord:
    return ServiceEndpointRecord(
        endpoint="search", instance_id=mint_lifecycle_uid(os.urandom(20)), owner=owner, actor="svc",
        serve_epoch=epoch, registered_at=NOW, label=None,
    )  # fmt: skip


async def test_a_registration_is_create_only_then_compare_and_set_then_retired_at_its_revision(store: RecordsStore):
    with trio.fail_after(CEILING_S):
        assert await store.get_service_endpoint("search") is None
        first = registration()
        revision = await store.register_service_endpoint(first, last_revision=None)
        assert await store.get_service_endpoint("search") == (first, revision)
        with pytest.raises(Refused) as taken:  # a second create of the name: someone registered it meanwhile
            await store.register_service_endpoint(registration(BOB), last_revision=None)
        assert taken.value.code is RefusalCode.CONFLICT
        second = registration(epoch=2)
        newer = await store.register_service_endpoint(second, last_revision=revision)
        with pytest.raises(Refused) as stale:  # a write decided on the first revision
            await store.register_service_endpoint(registration(epoch=2), last_revision=revision)
        assert stale.value.code is RefusalCode.CONFLICT
        with pytest.raises(Refused) as stale:
            await store.retire_service_endpoint("search", last_revision=revision)
        assert stale.value.code is RefusalCode.CONFLICT
        assert await store.get_service_endpoint("search") == (second, newer)
        await store.retire_service_endpoint("search", last_revision=newer)
        assert await store.get_service_endpoint("search") is None
        assert await store.register_service_endpoint(first, last_revision=None) > newer  # the name is free again
