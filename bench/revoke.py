#!/usr/bin/env python3
"""Benchmark: retiring one principal's lifecycle in a space full of other principals' rows (issue 15 item 1).

Usage::

    python bench/revoke.py [--others 100000] [--owners 1000] [--own 10] [--repeats 5]

What it does:

1. Starts a nats-server (JetStream, no auth, monitoring on 127.0.0.1) on free ports with its
   state in a temporary folder, and creates the auth bucket ``cotal_auth_alpha`` and the records
   stores as the full lane creates them.
2. Seeds ``--others`` live issuance rows of ``--owners`` other principals, keyed
   ``natkey.<owner>.<actor>.<user nkey>``, with pipelined publishes (no acks, a flush every
   5000), and waits until the stream holds them.
3. ``--repeats`` times: writes the principal's ledger row file and ``--own`` issuance rows of
   its lifecycle (plus one in the upstream form ``natkey.<user nkey>``), then times
   :func:`~cotal_trio.stores.lifecycle.retire_lifecycle` (the record, the row file's removal, the
   withdrawal) and reads how many messages the broker received from the connection meanwhile
   (``/connz`` ``in_msgs``).
4. Prints every run and the median. It asserts nothing about timing; the connection's message
   count is the figure that must not grow with ``--others``.

Only 127.0.0.1 is used; the nats-server is stopped by this process and the folder removed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cotal_trio.broker.process import free_port, run_nats_server  # noqa: E402
from cotal_trio.core.identity import mint_lifecycle_uid  # noqa: E402
from cotal_trio.core.issuance import IssuanceRow, issuance_key, render_row  # noqa: E402
from cotal_trio.core.ledger import LedgerKind, LedgerRow  # noqa: E402
from cotal_trio.core.lifecycle import LifecycleTarget  # noqa: E402
from cotal_trio.core.nkeys import Prefix, encode_public_key  # noqa: E402
from cotal_trio.core.plane import plane_bucket  # noqa: E402
from cotal_trio.stores.issuance import issuance_store  # noqa: E402
from cotal_trio.stores.lifecycle import retire_lifecycle  # noqa: E402
from cotal_trio.stores.records import RecordsStore, ensure_records_stores  # noqa: E402
from cotal_trio.natsio import Connection, ensure_bucket, open_connection, open_loop  # noqa: E402
from cotal_trio.state import SpacePaths, write_row  # noqa: E402

SPACE = "alpha"
BUCKET = plane_bucket(SPACE)
CHUNK = 5_000
_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"


def owner_of(i: int) -> str:
    return "u_" + "".join(_ALPHABET[(i >> (5 * k)) & 31] for k in range(6)) + "b" * 20


def user_of(i: int) -> str:
    return encode_public_key(Prefix.USER, i.to_bytes(32, "big"))


def row_of(owner: str, uid: str, now: int) -> bytes:
    return render_row(IssuanceRow(
        space=SPACE, owner=owner, actor="cli", lifecycle_uid=uid, credential_id=None, view=None, iat=now, exp=now + 600,
    ))  # fmt: skip


def in_msgs(monitor: int, cid: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/connz?cid={cid}", timeout=5) as response:
        return int(json.loads(response.read())["connections"][0]["in_msgs"])


async def sent(conn: Connection, monitor: int) -> int:
    await conn.flush()
    return await trio.to_thread.run_sync(in_msgs, monitor, conn.client_id)


async def stored(conn: Connection) -> int:
    info = json.loads((await conn.request(f"$JS.API.STREAM.INFO.KV_{BUCKET}", b"")).data)
    return int(info["state"]["messages"])


async def seed(conn: Connection, args: argparse.Namespace, now: int) -> float:
    started = time.perf_counter()
    uids = [mint_lifecycle_uid(os.urandom(20)) for _ in range(args.owners)]
    for i in range(args.others):
        owner = owner_of(i % args.owners)
        subject = f"$KV.{BUCKET}.natkey.{owner}.cli.{user_of(i)}"
        conn.publish_nowait(subject, row_of(owner, uids[i % args.owners], now), {"Nats-TTL": "3600"})
        if i % CHUNK == CHUNK - 1:
            await conn.flush()
    await conn.flush()
    with trio.fail_after(120):
        while await stored(conn) < args.others:
            await trio.sleep(0.05)
    return time.perf_counter() - started


async def run(args: argparse.Namespace, tmp: Path) -> None:
    port, monitor = free_port(), free_port()
    config = tmp / "bench.conf"
    config.write_text(f'listen: "127.0.0.1:{port}"\nhttp: "127.0.0.1:{monitor}"\njetstream {{ store_dir: "{tmp / "js"}" }}\n')
    async with trio.open_nursery() as nursery:
        pid = await nursery.start(functools.partial(run_nats_server, config, log_path=tmp / "nats.log", port=port))
        print(f"nats-server pid {pid} on 127.0.0.1:{port}; {args.others} rows of {args.owners} other owners")
        async with open_loop(), open_connection(f"nats://127.0.0.1:{port}", name="bench-revoke", reconnect=False) as conn:
            await ensure_bucket(conn, BUCKET, history=1, allow_msg_ttl=True)
            await ensure_records_stores(conn, SPACE)
            now = int(time.time())
            print(f"seeded in {await seed(conn, args, now):.1f} s")
            paths, owner, store = SpacePaths(SPACE, tmp / "space"), owner_of(args.owners + 1), issuance_store(conn, SPACE)
            times_ms: list[float] = []
            for repeat in range(args.repeats):
                uid = mint_lifecycle_uid(os.urandom(20))
                write_row(paths, LedgerRow(
                    kind=LedgerKind.INTERACTIVE, owner=owner, actor="cli", scope=("spawn",), allow_subscribe=(">",),
                    allow_publish=(">",), token_hash=None, lifecycle_uid=uid,
                    granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                ))  # fmt: skip
                base = 10 * args.others + repeat * (args.own + 1)
                for i in range(args.own):
                    await store.create(issuance_key(owner, "cli", user_of(base + i)), row_of(owner, uid, now), ttl_s=3600)
                await store.create(f"natkey.{user_of(base + args.own)}", row_of(owner, uid, now), ttl_s=3600)
                before = await sent(conn, monitor)
                started = time.perf_counter()
                withdrawn = await retire_lifecycle(
                    LifecycleTarget(owner=owner, actor="cli", lifecycle_uid=uid), kind=LedgerKind.INTERACTIVE,
                    records=RecordsStore(conn, SPACE), issuance=store, paths=paths, now=time.time(),
                )  # fmt: skip
                elapsed_ms = (time.perf_counter() - started) * 1000
                messages = await sent(conn, monitor) - before
                times_ms.append(elapsed_ms)
                print(
                    f"run {repeat + 1}: retired in {elapsed_ms:.1f} ms, {withdrawn} rows withdrawn,"
                    f" {messages} messages to the broker"
                )
        median_ms = statistics.median(times_ms)
        print(f"median {median_ms:.1f} ms over {args.repeats} runs ({args.others} rows of others in the space)")
        nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--others", type=int, default=100_000, help="issuance rows of other principals")
    parser.add_argument("--owners", type=int, default=1_000, help="how many other owners they belong to")
    parser.add_argument("--own", type=int, default=10, help="rows of the retired lifecycle (keyed by principal)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cotal-bench-revoke-") as tmp:
        trio.run(run, args, Path(tmp))


if __name__ == "__main__":
    main()
