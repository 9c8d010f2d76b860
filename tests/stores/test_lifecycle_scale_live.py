"""Issue 15 item 1 on a real nats-server: retiring one principal costs what that principal has.

A JetStream nats-server with its monitoring port on 127.0.0.1 holds the auth bucket ``cotal_auth_alpha`` as the
full lane creates it, seeded with ``OTHERS`` (10^5) live issuance rows of other principals
(pipelined publishes, no acks), plus a few rows of the principal being retired: keyed by
principal (``natkey.<owner>.<actor>.<user nkey>``) and in the upstream form an earlier version
wrote (``natkey.<user nkey>``). :func:`~cotal_trio.stores.lifecycle.retire_lifecycle` then runs
against the real records store and a real ledger row file.

What is asserted is the work, not the time: the messages the retirement sent to the broker
(its requests, reads and deletes), counted by the broker itself (the connection's ``in_msgs`` in
``/connz``), are bounded by the principal's own rows (and the legacy rows), whatever the space
holds. The elapsed time is printed (numbers belong in bench/, the machine here is shared).
"""

from __future__ import annotations

import functools
import json
import os
import time
import urllib.request
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio

from cotal_trio.broker.process import free_port, run_nats_server
from cotal_trio.core.identity import mint_lifecycle_uid
from cotal_trio.core.issuance import IssuanceRow, parse_row, render_row
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.lifecycle import LifecycleTarget
from cotal_trio.core.nkeys import Prefix, encode_public_key
from cotal_trio.core.plane import plane_bucket
from cotal_trio.stores.issuance import issuance_store
from cotal_trio.stores.lifecycle import retire_lifecycle
from cotal_trio.stores.records import RecordsStore, ensure_records_stores
from cotal_trio.natsio import Connection, ensure_bucket, kv_get, open_connection, open_loop
from cotal_trio.state import SpacePaths, read_principal, write_row

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

SPACE = "alpha"
BUCKET = plane_bucket(SPACE)
OTHERS = 100_000  # rows of other principals in the space
OWNERS = 1_000  # ... spread over this many owners (OTHERS / OWNERS rows each)
CHUNK = 5_000  # publishes sent between flushes while seeding
CEILING_S = 120


def _owner(i: int) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz234567"
    digits = "".join(alphabet[(i >> (5 * k)) & 31] for k in range(6))
    return "u_" + digits + "a" * 20


OWNER = _owner(OWNERS + 7)  # not one of the others


def _user(i: int) -> str:
    return encode_public_key(Prefix.USER, i.to_bytes(32, "big"))


def _row(owner: str, actor: str, uid: str, now: int) -> bytes:
    return render_row(IssuanceRow(
        space=SPACE, owner=owner, actor=actor, lifecycle_uid=uid, credential_id=None, view=None, iat=now, exp=now + 600,
    ))  # fmt: skip


@pytest.fixture
async def broker(nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str) -> AsyncIterator[tuple[str, int]]:
    """A nats-server without auth, JetStream on, monitoring on 127.0.0.1: (URL, monitoring port)."""
    port, monitor = free_port(), free_port()
    config = tmp_path / "scale.conf"
    config.write_text(
        f'listen: "127.0.0.1:{port}"\nhttp: "127.0.0.1:{monitor}"\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
    )
    start = functools.partial(run_nats_server, config, executable=nats_server_bin, log_path=tmp_path / "scale.log", port=port)
    with trio.fail_after(15):
        await nursery.start(start)
    yield f"nats://127.0.0.1:{port}", monitor


def _connz_in_msgs(monitor: int, cid: int) -> int:
    """Blocking: the messages the broker has received from connection ``cid`` (``/connz``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/connz?cid={cid}", timeout=5) as response:
        return int(json.loads(response.read())["connections"][0]["in_msgs"])


async def _sent(conn: Connection, monitor: int) -> int:
    await conn.flush()
    return await trio.to_thread.run_sync(_connz_in_msgs, monitor, conn.client_id)


async def _stored(conn: Connection) -> int:
    info = json.loads((await conn.request(f"$JS.API.STREAM.INFO.KV_{BUCKET}", b"")).data)
    return int(info["state"]["messages"])


async def _seed_others(conn: Connection, now: int) -> None:
    """``OTHERS`` live rows of other principals, pipelined: publishes without a reply (JetStream
    stores them all the same), a flush every ``CHUNK``, then wait until the stream holds them."""
    uids = [mint_lifecycle_uid(os.urandom(20)) for _ in range(OWNERS)]
    headers = {"Nats-TTL": "660"}
    for i in range(OTHERS):
        owner, actor = _owner(i % OWNERS), "cli" if i % 2 else "cli2"
        conn.publish_nowait(f"$KV.{BUCKET}.natkey.{owner}.{actor}.{_user(i)}", _row(owner, actor, uids[i % OWNERS], now), headers)
        if i % CHUNK == CHUNK - 1:
            await conn.flush()
    await conn.flush()
    while await _stored(conn) < OTHERS:  # bounded by the test's ceiling
        await trio.sleep(0.05)


def _ledger_row(uid: str) -> LedgerRow:
    return LedgerRow(
        kind=LedgerKind.INTERACTIVE, owner=OWNER, actor="cli", scope=("spawn",), allow_subscribe=(">",),
        allow_publish=(">",), token_hash=None, lifecycle_uid=uid, granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )  # fmt: skip


async def test_retiring_one_principal_among_100k_rows_reads_only_its_own(broker: tuple[str, int], tmp_path: Path, capsys):
    url, monitor = broker
    now = int(time.time())
    uid, older = mint_lifecycle_uid(os.urandom(20)), mint_lifecycle_uid(os.urandom(20))
    paths = SpacePaths(SPACE, tmp_path / "space")
    write_row(paths, _ledger_row(uid))
    target = LifecycleTarget(owner=OWNER, actor="cli", lifecycle_uid=uid)
    ours = [f"natkey.{OWNER}.cli.{_user(OTHERS + i)}" for i in range(3)]  # keyed by principal
    legacy = [f"natkey.{_user(OTHERS + 10 + i)}" for i in range(2)]  # the upstream form, before the upgrade
    kept = {
        f"natkey.{OWNER}.cli.{_user(OTHERS + 20)}": _row(OWNER, "cli", older, now),  # an older lifecycle's
        f"natkey.{OWNER}.cli2.{_user(OTHERS + 21)}": _row(OWNER, "cli2", uid, now),  # another actor of the owner
        f"natkey.{_user(OTHERS + 22)}": _row(_owner(1), "cli", uid, now),  # a legacy row of someone else
    }
    with trio.fail_after(CEILING_S):
        async with open_loop(), open_connection(url, name="test-lifecycle-scale", reconnect=False) as conn:
            await ensure_bucket(conn, BUCKET, history=1, allow_msg_ttl=True)
            await ensure_records_stores(conn, SPACE)
            seeding = time.perf_counter()
            await _seed_others(conn, now)
            seeded_s = time.perf_counter() - seeding
            store = issuance_store(conn, SPACE)
            for key in [*ours, *legacy]:
                await store.create(key, _row(OWNER, "cli", uid, now), ttl_s=660)
            for key, value in kept.items():
                await store.create(key, value, ttl_s=660)
            before = await _sent(conn, monitor)
            started = time.perf_counter()
            withdrawn = await retire_lifecycle(
                target, kind=LedgerKind.INTERACTIVE, records=RecordsStore(conn, SPACE), issuance=store, paths=paths,
                now=time.time(),
            )  # fmt: skip
            elapsed_s = time.perf_counter() - started
            sent = await _sent(conn, monitor) - before
            left = {key: await kv_get(conn, BUCKET, key) for key in [*ours, *legacy, *kept]}
    with capsys.disabled():
        print(
            f"\nretired 1 principal among {OTHERS} rows of others: {elapsed_s * 1000:.1f} ms,"
            f" {sent} messages sent to the broker, {withdrawn} rows withdrawn (seeding took {seeded_s:.1f} s)"
        )
    assert withdrawn == len(ours) + len(legacy)
    assert all(left[key] is None for key in [*ours, *legacy])
    assert {key: parse_row(left[key].value) for key in kept} == {key: parse_row(value) for key, value in kept.items()}
    assert read_principal(paths, OWNER, "cli") == (None, None)
    # The broker's own count: the record, one listing each (the principal's keys, the legacy
    # keys), one read per key listed (the principal's 4, the 3 legacy rows), one delete per row
    # withdrawn; nothing per row of anyone else.
    principal_keys, legacy_keys = len(ours) + 1, len(legacy) + 1
    assert sent <= 1 + 2 + principal_keys + legacy_keys + withdrawn, sent
