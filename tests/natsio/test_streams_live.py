"""natsio streams against a real nats-server: exact shapes, drift, first/last message, expected
sequences and write-once, TTL, the broker refusing deletes and purges, backup and delete."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import pytest
import trio

from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.natsio import (
    Connection,
    StreamDrift,
    StreamShape,
    SubjectConflict,
    backup_stream,
    delete_stream,
    ensure_stream,
    first_message,
    is_bucket_missing,
    last_message,
    open_connection,
    open_loop,
    publish_expecting,
    stream_config,
)

CEILING_S = 20
APPEND_ONLY = StreamShape(name="KV_log", subjects=("$KV.log.>",), allow_direct=False, max_msgs_per_subject=-1)
WRITE_ONCE = StreamShape(
    name="KV_once", subjects=("$KV.once.>",), allow_direct=True, max_msgs_per_subject=1, discard_new_per_subject=True
)


@pytest.fixture
async def conn(plain_broker: str) -> AsyncIterator[Connection]:
    async with open_loop(), open_connection(plain_broker, name="streams") as connection:
        yield connection


async def _api(conn: Connection, subject: str, body: dict | None = None) -> dict:
    reply = await conn.request(subject, json.dumps(body or {}).encode())
    return json.loads(reply.data)


async def test_a_stream_is_created_with_exactly_the_shape(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        assert await stream_config(conn, "KV_log") is None
        await ensure_stream(conn, APPEND_ONLY)
        await ensure_stream(conn, WRITE_ONCE)
        await ensure_stream(conn, APPEND_ONLY)  # idempotent
        log, once = await stream_config(conn, "KV_log"), await stream_config(conn, "KV_once")
    flags = ("storage", "retention", "discard", "max_age", "max_msgs", "max_bytes", "max_msg_size", "allow_direct",
             "allow_rollup_hdrs", "deny_delete", "deny_purge", "max_msgs_per_subject", "allow_msg_ttl")  # fmt: skip
    assert {f: log[f] for f in flags} == {
        "storage": "file", "retention": "limits", "discard": "new", "max_age": 0, "max_msgs": -1, "max_bytes": -1,
        "max_msg_size": -1, "allow_direct": False, "allow_rollup_hdrs": False, "deny_delete": True, "deny_purge": True,
        "max_msgs_per_subject": -1, "allow_msg_ttl": True,
    }  # fmt: skip
    assert log.get("discard_new_per_subject", False) is False and log["subjects"] == ["$KV.log.>"]
    assert {f: once[f] for f in flags} == {
        "storage": "file", "retention": "limits", "discard": "new", "max_age": 0, "max_msgs": -1, "max_bytes": -1,
        "max_msg_size": -1, "allow_direct": True, "allow_rollup_hdrs": False, "deny_delete": True, "deny_purge": True,
        "max_msgs_per_subject": 1, "allow_msg_ttl": True,
    }  # fmt: skip
    assert once["discard_new_per_subject"] is True
    assert APPEND_ONLY.drift(log) == () and WRITE_ONCE.drift(once) == ()


async def test_a_drifted_stream_is_refused_and_left_as_it_is(conn: Connection) -> None:
    loose = {**APPEND_ONLY.config(), "deny_delete": False, "deny_purge": False, "allow_rollup_hdrs": True}
    with trio.fail_after(CEILING_S):
        assert "error" not in await _api(conn, "$JS.API.STREAM.CREATE.KV_log", loose)
        with pytest.raises(StreamDrift) as drift:
            await ensure_stream(conn, APPEND_ONLY)
        after = await stream_config(conn, "KV_log")
    assert drift.value.stream == "KV_log"
    assert drift.value.differences == (
        "deny_delete is false, not true", "deny_purge is false, not true", "allow_rollup_hdrs is true, not false",
    )
    assert isinstance(drift.value, ConfigError)
    assert (after["deny_delete"], after["allow_rollup_hdrs"]) == (False, True)


async def test_first_and_last_message_on_a_subject(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_stream(conn, APPEND_ONLY)
        assert await first_message(conn, "KV_log", "$KV.log.k") is None
        one = await publish_expecting(conn, "$KV.log.k", b"one", expected_last_subject_seq=0, ttl_s=30)
        await publish_expecting(conn, "$KV.log.other", b"x", expected_last_subject_seq=None, ttl_s=None)
        two = await publish_expecting(conn, "$KV.log.k", b"two", expected_last_subject_seq=None, ttl_s=None)
        first, last = await first_message(conn, "KV_log", "$KV.log.k"), await last_message(conn, "KV_log", "$KV.log.k")
    assert (first.seq, first.subject, first.data) == (one, "$KV.log.k", b"one")
    assert first.headers == {"Nats-TTL": "30", "Nats-Expected-Last-Subject-Sequence": "0"}
    assert (last.seq, last.data, last.headers) == (two, b"two", {})
    assert first.time.endswith("Z")


async def test_expected_sequences_and_write_once(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_stream(conn, APPEND_ONLY)
        await ensure_stream(conn, WRITE_ONCE)
        seq = await publish_expecting(conn, "$KV.log.a", b"1", expected_last_subject_seq=0, ttl_s=None)
        with pytest.raises(SubjectConflict) as again:
            await publish_expecting(conn, "$KV.log.a", b"2", expected_last_subject_seq=0, ttl_s=None)
        moved = await publish_expecting(conn, "$KV.log.a", b"3", expected_last_subject_seq=seq, ttl_s=None)
        with pytest.raises(SubjectConflict):
            await publish_expecting(conn, "$KV.log.a", b"4", expected_last_subject_seq=seq, ttl_s=None)
        await publish_expecting(conn, "$KV.once.t", b"first", expected_last_subject_seq=None, ttl_s=30)
        with pytest.raises(SubjectConflict):  # no expectation: the per-subject limit refuses it
            await publish_expecting(conn, "$KV.once.t", b"second", expected_last_subject_seq=None, ttl_s=30)
        kept = await last_message(conn, "KV_once", "$KV.once.t")
    assert (again.value.subject, again.value.expected) == ("$KV.log.a", 0)
    assert moved > seq and kept.data == b"first"


async def test_the_broker_refuses_message_deletes_and_purges(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_stream(conn, APPEND_ONLY)
        seq = await publish_expecting(conn, "$KV.log.k", b"evidence", expected_last_subject_seq=0, ttl_s=None)
        deleted = await _api(conn, "$JS.API.STREAM.MSG.DELETE.KV_log", {"seq": seq})
        purged = await _api(conn, "$JS.API.STREAM.PURGE.KV_log", {"filter": "$KV.log.k"})
        purged_all = await _api(conn, "$JS.API.STREAM.PURGE.KV_log", {})
        rollup = await conn.request("$KV.log.k", b"rolled", {"Nats-Rollup": "sub"})
        first = await first_message(conn, "KV_log", "$KV.log.k")
    assert deleted["error"]["err_code"] == 10057  # message delete not permitted
    assert purged["error"]["err_code"] == purged_all["error"]["err_code"] == 10110  # stream purge not permitted
    assert "error" in json.loads(rollup.data)  # rollup not permitted
    assert (first.seq, first.data) == (seq, b"evidence")


async def test_a_message_ttl_removes_it(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_stream(conn, APPEND_ONLY)
        await publish_expecting(conn, "$KV.log.short", b"x", expected_last_subject_seq=0, ttl_s=1)
        assert await first_message(conn, "KV_log", "$KV.log.short") is not None
        while await first_message(conn, "KV_log", "$KV.log.short") is not None:  # bounded by fail_after
            await trio.sleep(0.25)
        # The key is free again: a create on it succeeds (the horizon check is what refuses it).
        assert await publish_expecting(conn, "$KV.log.short", b"y", expected_last_subject_seq=0, ttl_s=1) > 1


async def test_backup_then_delete(conn: Connection, tmp_path) -> None:
    folder = tmp_path / "backup"
    with trio.fail_after(CEILING_S):
        await ensure_stream(conn, APPEND_ONLY)
        await publish_expecting(conn, "$KV.log.a", b"\x00bin", expected_last_subject_seq=0, ttl_s=60)
        await publish_expecting(conn, "$KV.log.b", b"two", expected_last_subject_seq=None, ttl_s=None)
        assert await backup_stream(conn, "KV_log", folder) == 2
        with pytest.raises(ConfigError, match="already exists - back up into an empty folder"):
            await backup_stream(conn, "KV_log", folder)
        assert await delete_stream(conn, "KV_log") is True
        assert await delete_stream(conn, "KV_log") is False
        assert await stream_config(conn, "KV_log") is None
        with pytest.raises(ConfigError, match="does not exist"):
            await backup_stream(conn, "KV_log", tmp_path / "other")
        with pytest.raises(Unavailable) as missing:
            await first_message(conn, "KV_log", "$KV.log.a")
    assert is_bucket_missing(missing.value)
    config = json.loads((folder / "KV_log.config.json").read_text())
    assert config["deny_delete"] is True and config["name"] == "KV_log"
    lines = [json.loads(line) for line in (folder / "KV_log.jsonl").read_text().splitlines()]
    assert [(m["seq"], m["subject"], base64.b64decode(m["data"])) for m in lines] == [(1, "$KV.log.a", b"\x00bin"), (2, "$KV.log.b", b"two")]
    assert lines[0]["headers"] == {"Nats-TTL": "60", "Nats-Expected-Last-Subject-Sequence": "0"} and lines[1]["headers"] == {}


def test_a_shape_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="stream name"):
        StreamShape(name="a.b", subjects=("a",), allow_direct=False, max_msgs_per_subject=-1)
    with pytest.raises(ValueError, match="max_msgs_per_subject"):
        StreamShape(name="ab", subjects=("a",), allow_direct=False, max_msgs_per_subject=0)
    with pytest.raises(ValueError, match="subjects"):
        StreamShape(name="ab", subjects=(), allow_direct=False, max_msgs_per_subject=1)


@pytest.mark.parametrize("field", ["sources", "mirror", "republish", "subject_transform"])
def test_a_stream_that_takes_or_sends_messages_elsewhere_has_drifted(field):
    # A store that sources messages from another stream would let others add rows to it.
    from cotal_trio.stores.issued import issued_shapes

    issued, _ = issued_shapes("alpha")
    assert issued.drift(issued.config()) == ()
    assert issued.drift({**issued.config(), field: {"name": "ELSEWHERE"}}) == (f"{field} is set",)
