"""natsio ``kv_entries`` against a real nats-server: one subject-filtered listing, then a read per
key it lists (natsio/_kv_keys.py; issue 15 item 1, the withdrawal of one principal's rows)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from cotal_trio.core.errors import Unavailable
from cotal_trio.natsio import (
    ENTRIES_IN_FLIGHT,
    Connection,
    KvEntry,
    ensure_bucket,
    is_bucket_missing,
    kv_delete,
    kv_entries,
    kv_put,
    open_connection,
    open_loop,
)

CEILING_S = 20


@pytest.fixture
async def conn(plain_broker: str) -> AsyncIterator[Connection]:
    async with open_loop(), open_connection(plain_broker, name="kv-entries") as connection:
        yield connection


async def test_the_entries_matching_a_pattern_by_whole_tokens(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, "auth")
        revisions = {}
        for key in ("natkey.o.cli.UB", "natkey.o.cli.UA", "natkey.o.cli2.UC", "natkey.o.cl.UD", "natkey.p.cli.UE",
                    "natkey.UF", "natkey.UG", "plane", "natkeyx.o.cli.UH"):  # fmt: skip
            revisions[key] = await kv_put(conn, "auth", key, key.encode())
        await kv_delete(conn, "auth", "natkey.UG")  # a tombstone is no entry
        principal = await kv_entries(conn, "auth", "natkey.o.cli.>")
        legacy = await kv_entries(conn, "auth", "natkey.*")
        owners = await kv_entries(conn, "auth", "natkey.*.cli.>")
        none = await kv_entries(conn, "auth", "natkey.q.cli.>")
    assert principal == [
        KvEntry(key=key, value=key.encode(), revision=revisions[key]) for key in ("natkey.o.cli.UA", "natkey.o.cli.UB")
    ]  # not cli2, not cl: a token matches whole
    assert [entry.key for entry in legacy] == ["natkey.UF"]  # one token only: never a keyed row
    assert [entry.key for entry in owners] == ["natkey.o.cli.UA", "natkey.o.cli.UB", "natkey.p.cli.UE"]
    assert none == []


async def test_more_keys_than_reads_in_flight_are_all_read(conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await ensure_bucket(conn, "auth")
        count = 3 * ENTRIES_IN_FLIGHT + 1
        for i in range(count):
            await kv_put(conn, "auth", f"natkey.o.cli.U{i:04d}", str(i).encode())
        found = await kv_entries(conn, "auth", "natkey.o.cli.>")
    assert [entry.value for entry in found] == [str(i).encode() for i in range(count)]


@pytest.mark.parametrize("pattern", ["natkey.>.x", ">", "natkey..x", "natkey.a*", "natkey.o cli.>", ""])
async def test_a_malformed_pattern_is_refused_before_any_request(conn: Connection, pattern: str) -> None:
    with pytest.raises(ValueError, match="invalid key pattern"):
        await kv_entries(conn, "auth", pattern)


async def test_a_missing_bucket_is_told_apart(conn: Connection) -> None:
    with trio.fail_after(CEILING_S), pytest.raises(Unavailable) as missing:
        await kv_entries(conn, "absent", "natkey.*")
    assert is_bucket_missing(missing.value)
