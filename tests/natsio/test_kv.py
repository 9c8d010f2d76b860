"""natsio KV against a real nats-server with JetStream: CAS, TTL, markers, bucket shape, errors,
key listing, self-expiring deletes and the missing-bucket test."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import trio

from cotal_trio.core.errors import AuthServiceError, ConfigError, Unavailable
from cotal_trio.natsio import (
    Connection,
    KeyExists,
    KvEntry,
    WrongRevision,
    delete_bucket,
    ensure_bucket,
    is_bucket_missing,
    kv_create,
    kv_delete,
    kv_delete_expiring,
    kv_get,
    kv_keys,
    kv_put,
    kv_update,
    open_connection,
    open_loop,
)

CEILING_S = 20
# A 1 s TTL is gone once the server's expiry timer has run: 1 s plus its scan slack.
TTL_WAIT_S = 2.5


@pytest.fixture
async def conn(plain_broker: str) -> AsyncIterator[Connection]:
    async with open_loop(), open_connection(plain_broker, name="kv") as connection:
        yield connection


async def test_create_get_update_and_cas_conflict(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, "rows")
        assert await kv_get(conn, "rows", "plane") is None
        rev1 = await kv_create(conn, "rows", "plane", b"gen-1")
        assert await kv_get(conn, "rows", "plane") == KvEntry(key="plane", value=b"gen-1", revision=rev1)
        with pytest.raises(KeyExists) as exists:
            await kv_create(conn, "rows", "plane", b"other")
        rev2 = await kv_update(conn, "rows", "plane", b"gen-2", last_revision=rev1)
        with pytest.raises(WrongRevision) as stale:
            await kv_update(conn, "rows", "plane", b"late", last_revision=rev1)
        entry = await kv_get(conn, "rows", "plane")
    assert rev2 > rev1 >= 1
    assert entry == KvEntry(key="plane", value=b"gen-2", revision=rev2)
    assert exists.value.key == "plane" and isinstance(exists.value, AuthServiceError)
    assert (stale.value.key, stale.value.revision) == ("plane", rev1)


async def test_delete_then_create_again(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, "rows", history=5)
        rev = await kv_put(conn, "rows", "natkey.UA", b"")
        assert await kv_get(conn, "rows", "natkey.UA") == KvEntry(key="natkey.UA", value=b"", revision=rev)
        with pytest.raises(WrongRevision):
            await kv_delete(conn, "rows", "natkey.UA", last_revision=rev + 7)
        await kv_delete(conn, "rows", "natkey.UA", last_revision=rev)
        assert await kv_get(conn, "rows", "natkey.UA") is None
        await kv_delete(conn, "rows", "natkey.UA")  # deleting a deleted key is fine
        again = await kv_create(conn, "rows", "natkey.UA", b"back")
        with pytest.raises(WrongRevision):  # the CAS names a tombstone's revision, not a value's
            await kv_update(conn, "rows", "natkey.UA", b"x", last_revision=rev)
        entry = await kv_get(conn, "rows", "natkey.UA")
    assert again == rev + 3  # put, delete, delete, create: the tombstone was the expected seq
    assert entry == KvEntry(key="natkey.UA", value=b"back", revision=again)


async def test_a_rollup_is_refused_so_one_writable_key_cannot_purge_the_bucket(conn: Connection) -> None:
    # A user allowed to publish one key could otherwise erase every key with Nats-Rollup: all
    # (NATS permissions cannot filter headers): our buckets refuse rollups, purges included.
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, "rows")
        await kv_put(conn, "rows", "theirs", b"keep")
        await kv_put(conn, "rows", "mine", b"v")
        for rollup in ("all", "sub"):
            ack = json.loads((await conn.request("$KV.rows.mine", b"", headers={"Nats-Rollup": rollup})).data)
            assert ack["error"]["err_code"] == 10111, ack  # "rollup not permitted"
        assert (await kv_get(conn, "rows", "theirs")).value == b"keep"
        assert (await kv_get(conn, "rows", "mine")).value == b"v"


async def test_ensure_bucket_takes_rollups_away_from_an_existing_bucket(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        created = await conn.request(
            "$JS.API.STREAM.CREATE.KV_old",
            json.dumps({"name": "KV_old", "subjects": ["$KV.old.>"], "max_msgs_per_subject": 1, "allow_rollup_hdrs": True,
                        "allow_msg_ttl": True, "deny_delete": True, "discard": "new"}).encode(),
        )  # fmt: skip
        assert json.loads(created.data)["config"]["allow_rollup_hdrs"] is True
        await ensure_bucket(conn, "old")
        info = json.loads((await conn.request("$JS.API.STREAM.INFO.KV_old", b"")).data)
    assert info["config"]["allow_rollup_hdrs"] is False


async def test_put_with_ttl_expires(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, "sessions")
        await kv_put(conn, "sessions", "short", b"bye", ttl_s=1)
        await kv_put(conn, "sessions", "kept", b"stay")
        rev = await kv_create(conn, "sessions", "created", b"c", ttl_s=1)
        updated = await kv_update(conn, "sessions", "kept", b"stay2", last_revision=2, ttl_s=60)
        assert (await kv_get(conn, "sessions", "short")) is not None
        await trio.sleep(TTL_WAIT_S)
        assert await kv_get(conn, "sessions", "short") is None
        assert await kv_get(conn, "sessions", "created") is None
        kept = await kv_get(conn, "sessions", "kept")
        recreated = await kv_create(conn, "sessions", "created", b"again")
    assert rev == 3 and kept == KvEntry(key="kept", value=b"stay2", revision=updated)
    assert recreated > updated


async def test_server_marker_after_ttl_reads_as_missing_and_can_be_created(conn: Connection) -> None:
    # With subject delete markers the server leaves `Nats-Marker-Reason` where the value was:
    # nats-py's KeyValue.get returns that marker as a value and create() fails (pitfall 11).
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, "claims", marker_ttl_s=60)
        first = await kv_create(conn, "claims", "plane", b"holder-a", ttl_s=1)
        await trio.sleep(TTL_WAIT_S)
        assert await kv_get(conn, "claims", "plane") is None
        second = await kv_create(conn, "claims", "plane", b"holder-b", ttl_s=30)
        entry = await kv_get(conn, "claims", "plane")
    assert first == 1
    assert second == 3  # seq 2 is the server's marker: create expected it, not 0
    assert entry == KvEntry(key="plane", value=b"holder-b", revision=3)


async def test_ensure_bucket_is_idempotent_and_refuses_drift(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, "auth", history=1, max_age_s=3600)
        await kv_put(conn, "auth", "k", b"v")
        await ensure_bucket(conn, "auth", history=1, max_age_s=3600)
        await ensure_bucket(conn, "auth", history=3)  # history and max age do not matter
        with pytest.raises(ConfigError, match="allow_direct"):
            await ensure_bucket(conn, "auth", direct=True)
        with pytest.raises(ConfigError, match="allow_msg_ttl"):
            await ensure_bucket(conn, "auth", allow_msg_ttl=False)
        assert (await kv_get(conn, "auth", "k")) is not None  # refusing touched nothing
        await ensure_bucket(conn, "direct", direct=True, allow_msg_ttl=False)
        await ensure_bucket(conn, "direct", direct=True, allow_msg_ttl=False)
        with pytest.raises(Unavailable, match="per-message TTL is disabled"):
            await kv_put(conn, "direct", "k", b"v", ttl_s=5)
        create = json.dumps({"name": "KV_odd", "subjects": ["odd.>"]}).encode()
        await conn.request("$JS.API.STREAM.CREATE.KV_odd", create)
        with pytest.raises(ConfigError, match="not a KV bucket"):
            await ensure_bucket(conn, "odd")
        await delete_bucket(conn, "auth")
        await delete_bucket(conn, "auth")  # missing: fine
        with pytest.raises(Unavailable, match="stream not found"):
            await kv_get(conn, "auth", "k")
        with pytest.raises(Unavailable):
            await kv_put(conn, "auth", "k", b"v")


async def test_invalid_arguments_are_refused_before_any_io(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, "rows")
        for bad_ttl in (0, -1, 0.5, True):
            with pytest.raises(ValueError, match="ttl_s"):
                await kv_put(conn, "rows", "k", b"v", ttl_s=bad_ttl)  # type: ignore[arg-type]
        for bad_key in ("", ".a", "a.", "a..b", "a b", "a.*", ">"):
            with pytest.raises(ValueError, match="invalid key"):
                await kv_get(conn, "rows", bad_key)
        with pytest.raises(ValueError, match="invalid bucket"):
            await ensure_bucket(conn, "a.b")
        with pytest.raises(ValueError, match="last_revision"):
            await kv_update(conn, "rows", "k", b"v", last_revision=0)
        with pytest.raises(ValueError, match="history"):
            await ensure_bucket(conn, "rows", history=65)
        with pytest.raises(ValueError, match="marker_ttl_s"):
            await ensure_bucket(conn, "m", allow_msg_ttl=False, marker_ttl_s=5)
        with pytest.raises(ValueError):
            KvEntry(key="k", value=b"", revision=0)
        assert await kv_get(conn, "rows", "k") is None


async def test_closed_connection_is_unavailable(plain_broker: str) -> None:
    with trio.fail_after(CEILING_S):
        async with open_loop():
            async with open_connection(plain_broker) as conn:
                await ensure_bucket(conn, "rows")
            with pytest.raises(Unavailable, match="closed"):
                await kv_get(conn, "rows", "k")
            with pytest.raises(Unavailable, match="closed"):
                await kv_create(conn, "rows", "k", b"v")
            with pytest.raises(Unavailable, match="closed"):
                await ensure_bucket(conn, "rows")
        # and once the lane's loop is gone too
        with pytest.raises(Unavailable, match="closed"):  # the connection or its loop
            await kv_put(conn, "rows", "k", b"v")


async def test_caller_deadline_bounds_a_call(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, "rows")
        with trio.move_on_after(0) as scope:
            await kv_put(conn, "rows", "k", b"v")
        assert scope.cancelled_caught
        with trio.move_on_after(5):
            assert await kv_get(conn, "rows", "k") is None  # the cancelled put never ran


# -- key listing, self-expiring deletes, a missing bucket (natsio/_kv_keys.py) ---------------------


async def test_keys_under_a_prefix_include_markers_until_they_expire(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, "auth")
        for key in ("natkey.UB", "natkey.UA", "plane", "natkeyx.UC"):
            await kv_put(conn, "auth", key, b"v")
        assert await kv_keys(conn, "auth", prefix="natkey.") == ["natkey.UA", "natkey.UB"]
        assert await kv_keys(conn, "auth") == ["natkey.UA", "natkey.UB", "natkeyx.UC", "plane"]
        entry = await kv_get(conn, "auth", "natkey.UA")
        assert entry is not None
        await kv_delete_expiring(conn, "auth", "natkey.UA", last_revision=entry.revision, ttl_s=1)
        assert await kv_get(conn, "auth", "natkey.UA") is None
        assert await kv_keys(conn, "auth", prefix="natkey.") == ["natkey.UA", "natkey.UB"]  # its marker
        await trio.sleep(TTL_WAIT_S)
        assert await kv_keys(conn, "auth", prefix="natkey.") == ["natkey.UB"]  # nothing left behind
        assert await kv_keys(conn, "auth", prefix="none.") == []
    with pytest.raises(ValueError, match="ending in '.'"):
        await kv_keys(conn, "auth", prefix="natkey")


async def test_a_delete_expecting_no_message_fences_off_a_create_in_flight(conn: Connection) -> None:
    """The withdrawal's fence: a marker expecting revision 0 lands on an empty key, and a create
    that was sent expecting the same (natsio's first attempt) is refused after it. On a key that
    holds a value the fence is refused instead."""
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, "auth")
        await kv_delete_expiring(conn, "auth", "natkey.UF", last_revision=0, ttl_s=60)
        late = await conn.request(
            "$KV.auth.natkey.UF", b"row", headers={"Nats-Expected-Last-Subject-Sequence": "0", "Nats-TTL": "60"}
        )
        assert json.loads(late.data)["error"]["err_code"] == 10071
        assert await kv_get(conn, "auth", "natkey.UF") is None
        rev = await kv_create(conn, "auth", "natkey.UR", b"row", ttl_s=60)
        with pytest.raises(WrongRevision) as refused:
            await kv_delete_expiring(conn, "auth", "natkey.UR", last_revision=0, ttl_s=60)
        assert (refused.value.key, refused.value.revision) == ("natkey.UR", 0)
        with pytest.raises(WrongRevision):
            await kv_delete_expiring(conn, "auth", "natkey.UR", last_revision=rev + 1, ttl_s=1)
        assert await kv_get(conn, "auth", "natkey.UR") is not None
    with pytest.raises(ValueError):
        await kv_delete_expiring(conn, "auth", "natkey.UR", last_revision=-1, ttl_s=1)
    with pytest.raises(ValueError):
        await kv_delete_expiring(conn, "auth", "natkey.UR", last_revision=rev, ttl_s=0)


async def test_a_missing_bucket_is_told_apart(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        with pytest.raises(Unavailable) as create:
            await kv_create(conn, "absent", "natkey.UA", b"row", ttl_s=5)
        with pytest.raises(Unavailable) as listing:
            await kv_keys(conn, "absent", prefix="natkey.")
        with pytest.raises(Unavailable) as read:
            await kv_get(conn, "absent", "natkey.UA")
        await ensure_bucket(conn, "nottl", allow_msg_ttl=False)
        with pytest.raises(Unavailable, match="per-message TTL is disabled") as other:
            await kv_put(conn, "nottl", "k", b"v", ttl_s=5)
    assert [is_bucket_missing(e.value) for e in (create, listing, read)] == [True, True, True]
    assert "stream not found" in str(listing.value)
    assert not is_bucket_missing(other.value)

