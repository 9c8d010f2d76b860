"""``cotal actor grant``/``revoke`` through a running auth service's lifecycle door
(cotal_trio/cli/actor.py, cli/_actor_service.py; spec "Host-only routes").

The "service" is the lifecycle doors plus ``GET /health`` served by hypercorn on 127.0.0.1
(port 0), behind a guard that checks the media type and the capability as the loopback face
does, and published through an ``auth-service.json`` the way a lane publishes it. Its stores are
real: a nats-server with JetStream (``plain_broker``) holding ``cotal_auth_default`` and
``cotal_records_default``. ``main`` blocks, so it runs in a worker thread.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import pytest
import trio
from quart import request
from quart_trio import QuartTrio

from cotal_trio.cli import main
from cotal_trio.core.bearer import space_issuer
from cotal_trio.core.errors import RefusalCode, Refused, Unavailable
from cotal_trio.core.issuance import IssuanceRow, render_row
from cotal_trio.core.ledger import LedgerKind, ReadRows
from cotal_trio.core.ledger import render_row as render_ledger_row
from cotal_trio.core.lifecycle import LifecycleState, parse_record
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.core.plane import plane_bucket
from cotal_trio.http.errors import UNAVAILABLE, install_edge
from cotal_trio.http.transport import check_transport, read_json_body
from cotal_trio.http.lifecycle_doors import LifecycleDoors, routes
from cotal_trio.http.serve import serve_app
from cotal_trio.stores.issuance import KvRowStore, issuance_store
from cotal_trio.stores.records import RecordsStore, ensure_records_stores, records_bucket
from cotal_trio.natsio import Connection, delete_bucket, ensure_bucket, kv_get, open_connection, open_loop
from cotal_trio.state import load_space, read_principal, row_path, write_json

from tests.support.cli_root import SPACE, Root

pytestmark = [pytest.mark.broker]

SUB = "alice"
CEILING_S = 20


@dataclass
class Service:
    """A running door service for the root's space, and its stores."""

    url: str
    conn: Connection
    records: RecordsStore

    async def minted(self, owner: str, lifecycle_uid: str, seed: int) -> str:
        """An issuance row of that lifecycle, as the callout writes one; its key."""
        user = KeyPair.from_raw(Prefix.USER, bytes([seed]) * 32).public_key
        now = int(time.time())
        row = IssuanceRow(
            space=SPACE, owner=owner, actor="cli", lifecycle_uid=lifecycle_uid, credential_id=None, view=None,
            iat=now, exp=now + 300,
        )  # fmt: skip
        await issuance_store(self.conn, SPACE).create(f"natkey.{user}", render_row(row), ttl_s=310)
        return f"natkey.{user}"

    async def issuance(self, key: str) -> bytes | None:
        entry = await kv_get(self.conn, plane_bucket(SPACE), key)
        return None if entry is None else entry.value


def _guard(cap: str) -> Callable[[], object]:
    async def guard() -> object:
        check_transport(request.headers)
        if request.headers.get("Authorization") != f"Bearer {cap}":
            raise Refused(RefusalCode.BAD_CAPABILITY, "missing/invalid exchange capability")
        return await read_json_body()

    return guard


def _app(root: Root, conn: Connection, cap: str, *, read_ledger: ReadRows | None, doors: bool, issuer: str) -> QuartTrio:
    ctx = LifecycleDoors(
        space=SPACE, data_account=load_space(root.space.callout_json, SPACE).data_account,
        read_ledger=read_ledger or functools.partial(read_principal, root.space), paths=root.space,
        records=RecordsStore(conn, SPACE), issuance=issuance_store(conn, SPACE), clock=time.time,
    )  # fmt: skip

    async def health() -> dict:
        return {"ok": True, "issuer": issuer}

    app = QuartTrio("test-actor-doors")
    table = {"/health": {"GET": health}, **(routes(ctx, guard=_guard(cap)) if doors else {})}
    install_edge(app, routes=table, unknown_path="unknown path - /health, /exchange")
    return app


@asynccontextmanager
async def serving(
    root: Root, broker: str, *, read_ledger: ReadRows | None = None, doors: bool = True, issuer: str | None = None,
) -> AsyncIterator[Service]:  # fmt: skip
    """Serve the doors and publish ``auth-service.json`` (removed again at the end)."""
    cap = secrets.token_hex(32)
    async with open_loop(), open_connection(broker, name="test-actor-doors", reconnect=False) as conn:
        await ensure_bucket(conn, plane_bucket(SPACE), history=1, allow_msg_ttl=True)
        await ensure_records_stores(conn, SPACE)
        app = _app(root, conn, cap, read_ledger=read_ledger, doors=doors, issuer=issuer or space_issuer(SPACE))
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(serve_app, app))
            url = f"http://127.0.0.1:{port}"
            write_json(root.space.auth_service_json, {"ver": 1, "url": url, "pid": os.getpid(), "cap": cap})
            try:
                yield Service(url=url, conn=conn, records=RecordsStore(conn, SPACE))
            finally:
                root.space.auth_service_json.unlink()
                nursery.cancel_scope.cancel()


async def _cotal(root: Root, capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await trio.to_thread.run_sync(main, [*argv, "--root", str(root.paths.root)])
    out, err = capsys.readouterr()
    return code, out, err


def _interactive(root: Root):
    return read_principal(root.space, root.owner_of(SUB), "cli")[0]


async def test_a_regrant_retires_the_old_lifecycle_through_the_service(root, plain_broker, capsys):
    with trio.fail_after(CEILING_S):
        assert root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")[0] == 0
        old = _interactive(root)
        async with serving(root, plain_broker) as service:
            key = await service.minted(old.owner, old.lifecycle_uid, 1)
            code, out, err = await _cotal(root, capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
            record = parse_record(await service.records.get_record(f"lifecycle.{old.lifecycle_uid}"))
            left = await service.issuance(key)
    new = _interactive(root)
    assert code == 0 and "cotal:" not in err  # (stderr has the in-process service's own log line)
    assert out == (
        f"the running auth service retired lifecycle {old.lifecycle_uid} and withdrew 1 issuance rows\n"
        f"granted cli to owner {old.owner} (interactive, lifecycle {new.lifecycle_uid})\n"
    )
    assert new.lifecycle_uid != old.lifecycle_uid
    assert (record.state, record.owner, record.actor) == (LifecycleState.RETIRED, old.owner, "cli")
    assert left is None


async def test_a_revoke_retires_through_the_service(root, plain_broker, capsys):
    with trio.fail_after(CEILING_S):
        root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
        old = _interactive(root)
        async with serving(root, plain_broker) as service:
            await service.minted(old.owner, old.lifecycle_uid, 2)
            await service.minted(old.owner, old.lifecycle_uid, 3)
            code, out, _ = await _cotal(root, capsys, "actor", "revoke", "cli", "--sub", SUB, "--json")
            stored = await service.records.get_record(f"lifecycle.{old.lifecycle_uid}")
    assert code == 0
    assert json.loads(out) == {
        "owner": old.owner, "actor": "cli", "removed": True, "retiredLifecycle": old.lifecycle_uid, "withdrawn": 2,
    }  # fmt: skip
    assert read_principal(root.space, old.owner, "cli") == (None, None)
    assert parse_record(stored).state is LifecycleState.RETIRED


async def test_a_not_executed_refusal_is_printed_and_changes_nothing(root, plain_broker, capsys):
    """The service reads the row as re-granted by someone else meanwhile: 409 not-executed."""
    root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
    old = _interactive(root)
    moved = type(old)(**{**{f: getattr(old, f) for f in old.__slots__}, "lifecycle_uid": "z" * 26})

    def regranted_meanwhile(owner: str, actor: str):
        return moved, None

    with trio.fail_after(CEILING_S):
        async with serving(root, plain_broker, read_ledger=regranted_meanwhile) as service:
            code, out, err = await _cotal(root, capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
            stored = await service.records.get_record(f"lifecycle.{old.lifecycle_uid}")
    assert (code, out) == (1, "")
    assert err.splitlines()[-1] == (
        f"cotal: the auth service did not retire lifecycle {old.lifecycle_uid} of {old.owner}.cli (nothing changed):"
        f" the interactive ledger row of {old.owner}.cli holds lifecycle {'z' * 26}, not {old.lifecycle_uid}"
        " - it was re-granted since; read its current lifecycle with `cotal actor list`"
    )
    assert _interactive(root) == old and stored is None  # no new row, no record


async def test_a_failure_after_the_barrier_is_an_unknown_outcome_naming_actor_list(root, plain_broker, capsys):
    """The records store is gone: the door answers 503 without an outcome."""
    root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
    old = _interactive(root)
    with trio.fail_after(CEILING_S):
        async with serving(root, plain_broker) as service:
            await delete_bucket(service.conn, records_bucket(SPACE))
            code, out, err = await _cotal(root, capsys, "actor", "revoke", "cli", "--sub", SUB)
    assert (code, out) == (1, "")
    assert err.splitlines()[-1] == (
        f"cotal: retiring lifecycle {old.lifecycle_uid} of {old.owner}.cli through the auth service at {service.url}"
        f" has an unknown outcome (HTTP 503: {UNAVAILABLE}) - check with `cotal actor list` whether the row still"
        " holds that lifecycle, then run this command again"
    )
    assert _interactive(root) == old  # the barrier failed before anything else ran


async def _cannot_delete(self, key: str, *, last_revision: int, ttl_s: int) -> int:
    raise Unavailable("the auth bucket did not answer")


async def test_a_partial_retirement_says_the_actor_is_revoked_and_how_many_rows_expire(root, plain_broker, capsys, monkeypatch):
    """Issue 17 review item 3: the row is removed but the withdrawal fails. The door answers 202
    ``"withdrawn": "partial"``; the revoke says the actor is revoked and how many issuance rows
    end on their TTL (it used to print an unknown outcome, and a retry answered 404)."""
    root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
    old = _interactive(root)
    with trio.fail_after(CEILING_S):
        async with serving(root, plain_broker) as service:
            await service.minted(old.owner, old.lifecycle_uid, 4)
            await service.minted(old.owner, old.lifecycle_uid, 5)
            monkeypatch.setattr(KvRowStore, "delete", _cannot_delete)
            code, out, err = await _cotal(root, capsys, "actor", "revoke", "cli", "--sub", SUB)
            root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")  # a fresh grant, then again
            new = _interactive(root)
            await service.minted(new.owner, new.lifecycle_uid, 6)
            code_json, out_json, _ = await _cotal(root, capsys, "actor", "revoke", "cli", "--sub", SUB, "--json")
    assert (code, code_json) == (0, 0) and "cotal:" not in err
    assert out == (
        f"revoked cli of owner {old.owner} (the running auth service retired lifecycle {old.lifecycle_uid} and"
        " withdrew 0 issuance rows; 2 more were not withdrawn and expire within their TTL, at most 905 s)\n"
    )
    assert json.loads(out_json) == {
        "owner": old.owner, "actor": "cli", "removed": True, "retiredLifecycle": new.lifecycle_uid,
        "withdrawn": "partial", "withdrawnRows": 0, "rowsLeft": 1, "rowsExpireWithinS": 905,
    }  # fmt: skip
    assert read_principal(root.space, old.owner, "cli") == (None, None)


async def test_a_service_without_the_door_is_an_unknown_outcome(root, plain_broker, capsys):
    root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
    old = _interactive(root)
    with trio.fail_after(CEILING_S):
        async with serving(root, plain_broker, doors=False):
            code, _, err = await _cotal(root, capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
    assert code == 1
    assert "has an unknown outcome (HTTP 404: unknown path - /health, /exchange) - check with `cotal actor list`" in err
    assert _interactive(root) == old


async def test_a_health_check_for_another_space_is_no_running_service(root, plain_broker, capsys):
    root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
    old = _interactive(root)
    with trio.fail_after(CEILING_S):
        async with serving(root, plain_broker, issuer=space_issuer("other")) as service:
            code, out, _ = await _cotal(root, capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
            stored = await service.records.get_record(f"lifecycle.{old.lifecycle_uid}")
    assert code == 0 and out.startswith("granted cli") and stored is None  # the files, as before
    assert _interactive(root).lifecycle_uid != old.lifecycle_uid


async def test_a_readiness_file_nobody_answers_edits_the_files(root, capsys):
    root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
    with trio.socket.socket() as sock:  # a bound port that listens to nothing: connection refused
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        write_json(root.space.auth_service_json, {"ver": 1, "url": f"http://127.0.0.1:{port}", "pid": os.getpid(), "cap": "c" * 64})
        with trio.fail_after(CEILING_S):
            code, out, _ = await _cotal(root, capsys, "actor", "revoke", "cli", "--sub", SUB)
    assert (code, out) == (0, f"revoked cli of owner {root.owner_of(SUB)}\n")
    assert read_principal(root.space, root.owner_of(SUB), "cli") == (None, None)


async def test_a_revoke_through_the_service_removes_a_managed_row_of_the_same_principal(root, plain_broker, capsys):
    # A broken ledger (both kinds for one principal): revoke removes both, as without a service.
    with trio.fail_after(CEILING_S):
        root.run(capsys, "actor", "grant", "cli", "--sub", SUB, "--full")
        old = _interactive(root)
        managed = replace(old, kind=LedgerKind.MANAGED, token_hash="0" * 64, parent=None)
        path = row_path(root.space, LedgerKind.MANAGED, old.owner, "cli")
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.write_bytes(render_ledger_row(managed))  # write_row refuses a second kind
        async with serving(root, plain_broker):
            code, out, _ = await _cotal(root, capsys, "actor", "revoke", "cli", "--sub", SUB, "--json")
    assert code == 0 and json.loads(out)["removed"] is True
    assert read_principal(root.space, old.owner, "cli") == (None, None)
