"""Issue 4 items 1 and 6 on a real nats-server: issuance rows, a stalled ledger, replicas.

* ``authorization { timeout: 1 }`` (``cotal up --auth-timeout 1``): one actor's ledger row is a
  FIFO, so reading it blocks for real until the test opens it 1.3 s later, as a hung disk would.
  That connect gets the ``timeout`` denial at about 0.75 s, no late allow and no issuance row,
  while five other clients connect meanwhile.
* A minted connect leaves ``natkey.<owner>.<actor>.<user nkey>`` in ``cotal_auth_<space>`` with the principal,
  the bearer's expiry and a per-message TTL.
* A callout-only replica writes rows too, and creates no store: before the full service has
  ever run for a space, its connects are denied with a reason naming that fix. A full lane
  prunes an expired row at start; a replica does not.

Rows are read with natsio as a data-account user minted for the test.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.callout import TIMEOUT_REASON
from cotal_trio.core.errors import Unavailable
from cotal_trio.core.identity import derive_owner
from cotal_trio.core.issuance import IssuanceRow, parse_row, render_row, store_missing_reason
from cotal_trio.core.plane import plane_bucket
from cotal_trio.lane.run import run_lane
from cotal_trio.lane.spec import FullLane, LaneCommon, ReplicaLane
from cotal_trio.natsio import Connection, is_bucket_missing, kv_get, kv_keys, kv_put
from cotal_trio.state import load_owner_secret
from tests.support.stack import SPACE, Stack, client, start_stack
from tests.support.service import AUTH_TIMEOUT_S, Mesh, refused, start_mesh
from tests.support.issuance import _bearer, callout_lines, release, stall, store_reader

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

CEILING_S = 30
STALL_S = 1.3
BUDGET_MS = 750  # authorization { timeout: 1 } less the 250 ms margin


@pytest.fixture
async def stack(nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str) -> AsyncIterator[Stack]:
    """``run_up`` as tests/support/stack.py's, with the broker's ``authorization { timeout: 1 }``."""
    yield await start_stack(nursery, tmp_path, nats_server_bin, auth_timeout_s=1)


async def ttl_header(conn: Connection, space: str, key: str) -> int:
    """The ``Nats-TTL`` the row under ``key`` was written with (a raw ``STREAM.MSG.GET``)."""
    bucket = plane_bucket(space)
    request = json.dumps({"last_by_subj": f"$KV.{bucket}.{key}"}).encode()
    message = json.loads((await conn.request(f"$JS.API.STREAM.MSG.GET.KV_{bucket}", request)).data)["message"]
    headers = base64.b64decode(message["hdrs"]).decode().split("\r\n")
    return int(next(line.split(":", 1)[1] for line in headers if line.lower().startswith("nats-ttl:")))


async def admitted(stack: Stack, bearer: str, finished: list[float], start: float) -> None:
    async with client(stack, bearer) as conn:
        await conn.flush()
    finished.append(trio.current_time() - start)


async def test_a_ledger_that_stalls_for_one_actor_times_out_at_the_deadline_and_leaves_no_row(stack, caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")
    slow_row = stack.grant("slow", "cli")
    slow = await stack.bearer("slow", "cli")
    others = []
    for sub in ("u1", "u2", "u3", "u4", "u5"):
        stack.grant(sub, "cli")
        others.append(await stack.bearer(sub, "cli"))
    path = stack.space_paths.actors_dir / f"{slow_row.owner}.cli.json"
    # Released by a thread of its own, so a read that held trio's thread could not stall forever.
    timer = threading.Timer(STALL_S, release, (path, stall(path)))
    finished: list[float] = []
    start = trio.current_time()
    timer.start()
    try:
        with trio.fail_after(CEILING_S):
            with refused():
                async with client(stack, slow):
                    pass
            denied_after = trio.current_time() - start
            async with trio.open_nursery() as clients:  # the slow actor's read is still blocked
                for bearer in others:
                    clients.start_soon(admitted, stack, bearer, finished, start)
    finally:
        timer.join()
    with trio.fail_after(CEILING_S):
        await trio.sleep(0.5)  # the blocked read has answered by now: its thread finds no one waiting
        lines = callout_lines(caplog)
        [timeout] = [line for line in lines if line["owner"] == slow_row.owner]
        minted = [line for line in lines if line["outcome"] == "minted"]
        async with store_reader(stack.space_paths, stack.info.server_url, SPACE) as conn:
            keys = await kv_keys(conn, plane_bucket(SPACE), prefix="natkey.")
        # Once the ledger answers again the same bearer connects, and gets its row.
        async with client(stack, slow):
            pass
    assert 0.7 <= denied_after < 0.95, denied_after  # the broker alone would refuse at 1.0
    assert (timeout["outcome"], timeout["at"]) == ("timeout", "ledger")
    assert BUDGET_MS <= timeout["total_ms"] < BUDGET_MS + 50
    assert len(finished) == 5 and max(finished) < STALL_S  # all five connected during the stall
    assert len(minted) == 5 and timeout["req"] not in {line["req"] for line in minted}
    # none for the stalled connect; keyed by principal (issue 15 item 1)
    assert keys == sorted(f"natkey.{line['owner']}.{line['actor']}.{line['req']}" for line in minted)
    assert TIMEOUT_REASON.startswith("timeout:")


async def test_a_minted_connect_leaves_its_row(stack, caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")
    row = stack.grant("alice", "cli")
    status, body = await stack.exchange({"idpToken": stack.idp_token("alice"), "actor": "cli"})
    assert status == 200
    with trio.fail_after(CEILING_S):
        written_after = int(time.time())
        async with client(stack, body["token"]):
            pass
        [line] = callout_lines(caplog)
        key = f"natkey.{row.owner}.cli.{line['req']}"  # keyed by principal (issue 15 item 1)
        async with store_reader(stack.space_paths, stack.info.server_url, SPACE) as conn:
            entry = await kv_get(conn, plane_bucket(SPACE), key)
            ttl_s = await ttl_header(conn, SPACE, key)
    assert line["outcome"] == "minted" and entry is not None
    stored = parse_row(entry.value)
    assert stored == IssuanceRow(
        space=SPACE, owner=row.owner, actor="cli", lifecycle_uid=row.lifecycle_uid, credential_id=None,
        view=None, iat=stored.iat, exp=body["exp"],
    )
    assert written_after - 1 <= stored.iat <= time.time()
    assert abs(ttl_s - (body["exp"] + 5 - stored.iat)) <= 1  # gone 5 s after the JWT's exp


def _lane(mesh: Mesh, space: str, *, callout_only: bool) -> functools.partial:
    common = LaneCommon(server_url=mesh.server_url, limits=CalloutLimits(auth_timeout_s=AUTH_TIMEOUT_S), reconnect=False)
    paths = mesh.paths.space(space)
    if callout_only:
        return functools.partial(run_lane, ReplicaLane(space=space, paths=paths, common=common))
    return functools.partial(run_lane, FullLane(space=space, paths=paths, common=common, idp_keys=dict))


def _expired_row(owner: str) -> bytes:
    now = int(time.time())
    return render_row(IssuanceRow(
        space="a", owner=owner, actor="cli", lifecycle_uid="a" * 26, credential_id=None, view=None,
        iat=now - 600, exp=now - 60,
    ))


async def test_a_replica_writes_rows_creates_no_store_and_prunes_nothing(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str, caplog,
):
    caplog.set_level(logging.INFO, logger="cotal.callout")
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    owner = derive_owner(load_owner_secret(mesh.paths.space("a").owner_secret_json), mesh.idp.issuer, "old")
    with trio.fail_after(CEILING_S):
        # Space b has never had its full service: a replica's connects are denied, naming the fix.
        async with trio.open_nursery() as lanes:
            await lanes.start(_lane(mesh, "b", callout_only=True))
            with refused():
                async with mesh.client("b", _bearer(mesh, "b", "alice")):
                    pass
            lanes.cancel_scope.cancel()
        [denied] = callout_lines(caplog)
        async with store_reader(mesh.paths.space("b"), mesh.server_url, "b") as conn:
            with pytest.raises(Unavailable) as missing:
                await kv_keys(conn, plane_bucket("b"))

        # Space a's full service runs once (it creates the store), then only a replica serves.
        async with trio.open_nursery() as lanes:
            await lanes.start(_lane(mesh, "a", callout_only=False))
            lanes.cancel_scope.cancel()
        async with store_reader(mesh.paths.space("a"), mesh.server_url, "a") as conn:
            # keyed by principal, and in the upstream form natkey.<user nkey> as an earlier version
            # wrote it: the sweep lists natkey.> and prunes both
            expired = (f"natkey.{owner}.cli.UEXPIRED", "natkey.UEXPIRED")
            for key in expired:
                await kv_put(conn, plane_bucket("a"), key, _expired_row(owner))
            async with trio.open_nursery() as lanes:
                await lanes.start(_lane(mesh, "a", callout_only=True))
                async with mesh.client("a", _bearer(mesh, "a", "alice")) as user:
                    await user.flush()
                await trio.sleep(0.5)
                lanes.cancel_scope.cancel()
            [minted] = callout_lines(caplog)[1:]
            replica_row = await kv_get(conn, plane_bucket("a"), f"natkey.{minted['owner']}.cli.{minted['req']}")
            kept = [await kv_get(conn, plane_bucket("a"), key) for key in expired]

            # A full lane prunes the expired row at start (a replica never did).
            async with trio.open_nursery() as lanes:
                await lanes.start(_lane(mesh, "a", callout_only=False))
                # The sweep runs in the lane's own task and the store has no event for a delete: poll.
                for key in expired:
                    while await kv_get(conn, plane_bucket("a"), key) is not None:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                lanes.cancel_scope.cancel()
    assert (denied["outcome"], denied["reason"]) == ("denied", store_missing_reason("b"))
    assert is_bucket_missing(missing.value)  # the replica created no store
    assert minted["outcome"] == "minted" and replica_row is not None
    assert parse_row(replica_row.value).space == "a" and parse_row(replica_row.value).actor == "cli"
    assert None not in kept
