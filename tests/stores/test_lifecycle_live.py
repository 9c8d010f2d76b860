"""The lifecycle doors on a real nats-server (http/lifecycle_doors.py, stores/lifecycle.py).

An operator-mode broker with space ``a`` provisioned and its accounts pushed (the mesh of
test_auth_service_live); the space's auth bucket ``cotal_auth_a`` and records store
``cotal_records_a`` are created as the full lane creates them, through a data-account store
user minted for the test. The doors run in a quart-trio app of their own (the loopback face's
wiring is not under test here) over the real stores and the real ledger files.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
from quart import request
from quart_trio import QuartTrio

from cotal_trio.core.identity import derive_owner, mint_lifecycle_uid
from cotal_trio.core.issuance import IssuanceRow, issuance_key, parse_row, render_row
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.lifecycle import LifecycleState, LifecycleTarget, parse_record
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.core.plane import plane_bucket
from cotal_trio.http.errors import install_edge
from cotal_trio.http.transport import check_transport, read_json_body
from cotal_trio.http.lifecycle_doors import LifecycleDoors, routes
from cotal_trio.stores.issuance import issuance_store
from cotal_trio.stores.lifecycle import retire_lifecycle
from cotal_trio.stores.records import (
    RecordsStore,
    ensure_records_stores,
    records_bucket,
)
from cotal_trio.lane.service_users import open_service_user, store_permissions
from cotal_trio.natsio import Connection, ensure_bucket, kv_get, open_loop
from cotal_trio.state import load_owner_secret, load_space, read_principal, row_path, write_row
from tests.support.service import Mesh, start_mesh

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

SPACE = "a"
CEILING_S = 30
HEADERS = {"Content-Type": "application/json"}


@dataclass
class Live:
    """Space ``a``'s real stores and ledger, and a test client of the doors over them."""

    mesh: Mesh
    conn: Connection
    doors: LifecycleDoors
    client: object

    @property
    def paths(self):
        return self.mesh.paths.space(SPACE)

    def owner(self, sub: str) -> str:
        return derive_owner(load_owner_secret(self.paths.owner_secret_json), self.mesh.idp.issuer, sub)

    def grant(self, sub: str, actor: str, kind: LedgerKind) -> LedgerRow:
        row = LedgerRow(
            kind=kind, owner=self.owner(sub), actor=actor, scope=("spawn",), allow_subscribe=(">",),
            allow_publish=(">",), token_hash="0" * 64 if kind is LedgerKind.MANAGED else None,
            lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
            granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )  # fmt: skip
        write_row(self.paths, row)
        return row

    async def minted(self, row: LedgerRow, seed: int) -> str:
        """Write an issuance row for ``row``'s lifecycle as the callout does; its key."""
        user = KeyPair.from_raw(Prefix.USER, bytes([seed]) * 32).public_key
        now = int(time.time())
        issued = IssuanceRow(
            space=SPACE, owner=row.owner, actor=row.actor, lifecycle_uid=row.lifecycle_uid, credential_id=None,
            view=None, iat=now, exp=now + 300,
        )  # fmt: skip
        key = issuance_key(row.owner, row.actor, user)
        await self.doors.issuance.create(key, render_row(issued), ttl_s=310)
        return key

    async def post(self, path: str, body: dict) -> tuple[int, dict]:
        response = await self.client.post(path, data=json.dumps(body).encode(), headers=HEADERS)
        return response.status_code, await response.get_json()

    async def record_ttl_s(self, key: str) -> int | None:
        """The ``Nats-TTL`` the record under ``key`` was written with (a raw ``STREAM.MSG.GET``)."""
        bucket = records_bucket(SPACE)
        ask = json.dumps({"last_by_subj": f"$KV.{bucket}.{key}"}).encode()
        message = json.loads((await self.conn.request(f"$JS.API.STREAM.MSG.GET.KV_{bucket}", ask)).data)["message"]
        if "hdrs" not in message:
            return None
        lines = base64.b64decode(message["hdrs"]).decode().split("\r\n")
        return next((int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("nats-ttl:")), None)


async def _guard() -> object:
    check_transport(request.headers)
    return await read_json_body()


@asynccontextmanager
async def _store(mesh: Mesh) -> AsyncIterator[Connection]:
    """A full lane's store user for space ``a``, on its real list (:func:`store_permissions`)."""
    material = load_space(mesh.paths.space(SPACE).callout_json, SPACE)
    now = int(time.time())
    async with open_service_user(
        material, mesh.server_url, name="test:lifecycle-store", iat=now, exp=now + 300, reconnect=False,
        permissions=functools.partial(store_permissions, SPACE),
    ) as conn:
        yield conn


@pytest.fixture
async def live(nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str) -> AsyncIterator[Live]:
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    async with open_loop(), _store(mesh) as conn:
        with trio.fail_after(CEILING_S):
            await ensure_bucket(conn, plane_bucket(SPACE), history=1, allow_msg_ttl=True)
            await ensure_records_stores(conn, SPACE)
        paths = mesh.paths.space(SPACE)
        doors = LifecycleDoors(
            space=SPACE, data_account=load_space(paths.callout_json, SPACE).data_account,
            read_ledger=functools.partial(read_principal, paths), paths=paths, records=RecordsStore(conn, SPACE),
            issuance=issuance_store(conn, SPACE), clock=time.time,
        )  # fmt: skip
        app = QuartTrio("test-lifecycle-live")
        install_edge(app, routes=routes(doors, guard=_guard), unknown_path="unknown path")
        yield Live(mesh=mesh, conn=conn, doors=doors, client=app.test_client())


async def test_the_interactive_door_retires_a_lifecycle_on_the_real_stores(live: Live):
    with trio.fail_after(CEILING_S):
        row = live.grant("alice", "cli", LedgerKind.INTERACTIVE)
        other = live.grant("bob", "cli", LedgerKind.INTERACTIVE)
        ours = [await live.minted(row, 1), await live.minted(row, 2)]
        theirs = await live.minted(other, 3)
        body = {"owner": row.owner, "actor": "cli", "lifecycleUid": row.lifecycle_uid}
        before = int(time.time())
        status, answer = await live.post("/interactive-lifecycle/retire", body)
        after = int(time.time())
        stored = await live.doors.records.get_record(f"lifecycle.{row.lifecycle_uid}")
        ttl_s = await live.record_ttl_s(f"lifecycle.{row.lifecycle_uid}")
        left = [await kv_get(live.conn, plane_bucket(SPACE), key) for key in ours]
        kept = await kv_get(live.conn, plane_bucket(SPACE), theirs)
        again = await live.post("/interactive-lifecycle/retire", body)
    assert (status, answer) == (200, {**body, "outcome": "retired", "withdrawn": 2})
    record = parse_record(stored)
    assert (record.state, record.kind, record.owner, record.actor) == (
        LifecycleState.RETIRED, LedgerKind.INTERACTIVE, row.owner, "cli",
    )  # fmt: skip
    assert before <= record.at <= after and ttl_s == 960
    assert not row_path(live.paths, LedgerKind.INTERACTIVE, row.owner, "cli").exists()
    assert left == [None, None]
    assert kept is not None and parse_row(kept.value).lifecycle_uid == other.lifecycle_uid
    assert read_principal(live.paths, other.owner, "cli")[0] == other  # bob's row untouched
    assert again == (404, {
        "outcome": "not-executed",
        "error": f"{row.owner}.cli has no interactive ledger row in space a - nothing to retire;"
                 " check the principal with `cotal actor list`",
    })  # fmt: skip


async def test_a_managed_lifecycle_is_activated_then_retired_and_stays_retired(live: Live):
    with trio.fail_after(CEILING_S):
        row = live.grant("alice", "worker", LedgerKind.MANAGED)
        key = await live.minted(row, 4)
        body = {"owner": row.owner, "actor": "worker", "lifecycleUid": row.lifecycle_uid}
        activate = {**body, "accountPublicKey": live.doors.data_account}
        activated = await live.post("/managed-lifecycle/activate", activate)
        active_ttl_s = await live.record_ttl_s(f"lifecycle.{row.lifecycle_uid}")
        active = parse_record(await live.doors.records.get_record(f"lifecycle.{row.lifecycle_uid}"))
        retired = await live.post("/managed-lifecycle/retire", body)
        gone = await kv_get(live.conn, plane_bucket(SPACE), key)
        write_row(live.paths, row)  # the same lifecycle's row back: still retired
        refused = await live.post("/managed-lifecycle/activate", activate)
        state = parse_record(await live.doors.records.get_record(f"lifecycle.{row.lifecycle_uid}")).state
    assert activated == (200, {**body, "outcome": "activated"})
    assert (active.state, active.kind, active_ttl_s) == (LifecycleState.ACTIVE, LedgerKind.MANAGED, None)
    assert retired == (200, {**body, "outcome": "retired", "withdrawn": 1}) and gone is None
    assert refused[0] == 409 and refused[1]["outcome"] == "not-executed"
    assert "is retired and cannot be activated again" in refused[1]["error"]
    assert state is LifecycleState.RETIRED


async def test_a_retirement_runs_over_the_full_lanes_own_store_user(live: Live):
    """The store requests a retirement makes (issue 15 item 1) all ride the full lane's store user
    (issue 15 item 4): a user minted with exactly :func:`store_permissions` retires a lifecycle
    among others' rows (a refused request would get no answer and run into the ceiling)."""
    material = load_space(live.paths.callout_json, SPACE)
    with trio.fail_after(CEILING_S):
        row = live.grant("alice", "cli", LedgerKind.INTERACTIVE)
        other = live.grant("bob", "cli", LedgerKind.INTERACTIVE)
        ours, theirs = await live.minted(row, 5), await live.minted(other, 6)
        now = int(time.time())
        async with open_service_user(
            material, live.mesh.server_url, name="test:lifecycle-store", iat=now, exp=now + 120, reconnect=False,
            permissions=functools.partial(store_permissions, SPACE),
        ) as conn:
            withdrawn = await retire_lifecycle(
                LifecycleTarget(owner=row.owner, actor="cli", lifecycle_uid=row.lifecycle_uid),
                kind=LedgerKind.INTERACTIVE, records=RecordsStore(conn, SPACE), issuance=issuance_store(conn, SPACE),
                paths=live.paths, now=time.time(),
            )  # fmt: skip
        left, kept = await kv_get(live.conn, plane_bucket(SPACE), ours), await kv_get(live.conn, plane_bucket(SPACE), theirs)
    assert withdrawn == 1 and left is None and kept is not None
    assert read_principal(live.paths, row.owner, "cli") == (None, None)
