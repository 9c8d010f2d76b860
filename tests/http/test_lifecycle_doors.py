"""The lifecycle doors (http/lifecycle_doors.py, stores/lifecycle.py; spec "Host-only routes").

A quart-trio app of the doors alone, behind a guard that runs the loopback face's transport
checks and reads the JSON body, driven through quart's test client. The ledger is real files
under ``tmp_path``; the records store and the auth bucket are small in-memory fakes of their
ports that log every write together with whether the row file existed at that moment, so the
order of the barrier's steps is asserted, not assumed.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from quart import request
from quart_trio import QuartTrio

from cotal_trio.core.errors import Unavailable
from cotal_trio.core.issuance import IssuanceRow, render_row
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.lifecycle import LifecycleRecord, LifecycleState, parse_record
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.http.errors import UNAVAILABLE, install_edge
from cotal_trio.http.transport import check_transport, read_json_body
from cotal_trio.http.lifecycle_doors import LifecycleDoors, routes
from cotal_trio.stores import lifecycle as lifecycle_lane
from cotal_trio.stores.issuance import MARKER_TTL_S
from cotal_trio.natsio import KvEntry
from cotal_trio.state import SpacePaths, read_principal, row_path, write_row
from tests.support.loopback import ceiling
from tests.support.lifecycle_doors import FakeRecords, FakeRows, Log, OWNER

SPACE = "alpha"
NOW = 1_800_000_000
UID = "a" * 26
OTHER_UID = "b" * 26
DATA_ACCOUNT = KeyPair.from_raw(Prefix.ACCOUNT, bytes(range(32))).public_key
OTHER_ACCOUNT = KeyPair.from_raw(Prefix.ACCOUNT, bytes(range(1, 33))).public_key
HEADERS = {"Content-Type": "application/json"}
NOT_EXECUTED = {"outcome": "not-executed"}


def _ledger_row(kind: LedgerKind, uid: str = UID, actor: str = "cli") -> LedgerRow:
    return LedgerRow(
        kind=kind, owner=OWNER, actor=actor, scope=("spawn",), allow_subscribe=(">",), allow_publish=(">",),
        token_hash="0" * 64 if kind is LedgerKind.MANAGED else None, lifecycle_uid=uid,
        granted_at="2026-11-29T10:00:00.000Z",
    )  # fmt: skip


def _issuance(uid: str, actor: str = "cli") -> bytes:
    return render_row(IssuanceRow(
        space=SPACE, owner=OWNER, actor=actor, lifecycle_uid=uid, credential_id=None, view=None, iat=NOW, exp=NOW + 300,
    ))  # fmt: skip


@dataclass
class Doors:
    paths: SpacePaths
    log: Log
    records: FakeRecords
    rows: FakeRows
    client: object

    async def post(self, path: str, body: object, headers: dict[str, str] = HEADERS) -> tuple[int, dict, object]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = await self.client.post(path, data=data, headers=headers)
        return response.status_code, await response.get_json(), response.headers

    def record(self) -> tuple[LifecycleRecord, int | None] | None:
        found = self.records.values.get(f"lifecycle.{UID}")
        return None if found is None else (parse_record(found[0]), found[1])


async def guard() -> object:
    """The loopback face's pre-checks a door gets (no capability in these tests)."""
    check_transport(request.headers)
    return await read_json_body()


def _doors(tmp_path: Path, kind: LedgerKind = LedgerKind.INTERACTIVE) -> Doors:
    paths = SpacePaths(SPACE, tmp_path / "space")
    log = Log(paths, kind)
    records, rows = FakeRecords(log), FakeRows(log)
    ctx = LifecycleDoors(
        space=SPACE, data_account=DATA_ACCOUNT, read_ledger=functools.partial(read_principal, paths), paths=paths,
        records=records, issuance=rows, clock=lambda: NOW + 0.5,
    )  # fmt: skip
    app = QuartTrio("test-lifecycle-doors")
    install_edge(app, routes=routes(ctx, guard=guard), unknown_path="unknown path")
    return Doors(paths, log, records, rows, app.test_client())


@pytest.fixture
def doors(tmp_path: Path) -> Doors:
    doors = _doors(tmp_path)
    write_row(doors.paths, _ledger_row(LedgerKind.INTERACTIVE))
    doors.rows.put(f"natkey.{OWNER}.cli.UA", _issuance(UID))
    doors.rows.put(f"natkey.{OWNER}.cli.UB", _issuance(OTHER_UID))
    doors.rows.put("natkey.UC", _issuance(UID))  # the upstream key form, from before the upgrade
    doors.rows.put(f"natkey.{OWNER}.cli.UD", b"not a row")
    doors.rows.put(f"natkey.{OWNER}.cli2.UE", _issuance(UID, actor="cli2"))  # another principal's
    return doors


OURS = (f"natkey.{OWNER}.cli.UA", "natkey.UC")
LEFT = [f"natkey.{OWNER}.cli.UB", f"natkey.{OWNER}.cli.UD", f"natkey.{OWNER}.cli2.UE"]


BODY = {"owner": OWNER, "actor": "cli", "lifecycleUid": UID}
RETIRE = "/interactive-lifecycle/retire"


# --- /interactive-lifecycle/retire ----------------------------------------------------------------


@ceiling
async def test_retire_writes_the_record_then_removes_the_row_then_withdraws(doors):
    status, body, headers = await doors.post(RETIRE, BODY)
    assert status == 200 and headers["Cache-Control"] == "no-store"
    assert body == {"outcome": "retired", "owner": OWNER, "actor": "cli", "lifecycleUid": UID, "withdrawn": 2}
    record, ttl_s = doors.record()
    assert record == LifecycleRecord(
        lifecycle_uid=UID, owner=OWNER, actor="cli", kind=LedgerKind.INTERACTIVE, state=LifecycleState.RETIRED, at=NOW,
    )  # fmt: skip
    assert ttl_s == 960
    # The barrier first, while the row still stands; the refusal (the row's removal) before the
    # withdrawal, so nothing the withdrawal does can keep the lifecycle granted (issue 15 item 1).
    # (The deletes run a few at a time, in no set order.)
    assert doors.log.events[0] == ("put", f"lifecycle.{UID}", True)
    assert sorted(doors.log.events[1:]) == sorted(("delete", key, False) for key in OURS)
    assert read_principal(doors.paths, OWNER, "cli") == (None, None)
    assert sorted(doors.rows.rows) == LEFT  # another lifecycle's, an unreadable one, another principal's
    assert doors.rows.marker_ttls == [MARKER_TTL_S, MARKER_TTL_S]
    # Found by two filtered listings: the principal's rows and the legacy ones, no other row read.
    assert sorted(doors.rows.read) == sorted([*OURS, f"natkey.{OWNER}.cli.UB", f"natkey.{OWNER}.cli.UD"])


@ceiling
async def test_a_second_retire_is_404_not_executed(doors):
    assert (await doors.post(RETIRE, BODY))[0] == 200
    doors.log.events.clear()
    status, body, _ = await doors.post(RETIRE, BODY)
    assert (status, body) == (404, {
        **NOT_EXECUTED,
        "error": f"{OWNER}.cli has no interactive ledger row in space alpha - nothing to retire;"
                 " check the principal with `cotal actor list`",
    })  # fmt: skip
    assert doors.log.events == []


@ceiling
async def test_a_rows_lifecycle_that_moved_on_is_409_and_nothing_changes(doors):
    write_row(doors.paths, _ledger_row(LedgerKind.INTERACTIVE, OTHER_UID))
    status, body, _ = await doors.post(RETIRE, BODY)
    assert (status, body["outcome"]) == (409, "not-executed")
    assert body["error"] == (
        f"the interactive ledger row of {OWNER}.cli holds lifecycle {OTHER_UID}, not {UID} - it was re-granted"
        " since; read its current lifecycle with `cotal actor list`"
    )
    assert doors.log.events == [] and read_principal(doors.paths, OWNER, "cli")[0].lifecycle_uid == OTHER_UID


@ceiling
async def test_the_interactive_door_leaves_a_managed_row_alone(tmp_path):
    doors = _doors(tmp_path, LedgerKind.MANAGED)
    write_row(doors.paths, _ledger_row(LedgerKind.MANAGED))
    status, body, _ = await doors.post(RETIRE, BODY)
    assert (status, body["outcome"]) == (404, "not-executed")
    assert "has no interactive ledger row" in body["error"] and doors.log.events == []


@pytest.mark.parametrize(
    ("body", "sentence"),
    [
        ({**BODY, "scope": ["spawn"]}, "unknown field 'scope' - the body is exactly {owner, actor, lifecycleUid}"),
        ([BODY], "the body must be a JSON object {owner, actor, lifecycleUid}"),
        ({**BODY, "lifecycleUid": "A" * 26}, "a lifecycle UID is 26 to 32 characters of a-z and 0-9"),
    ],
)
@ceiling
async def test_a_bad_body_is_400_not_executed(doors, body, sentence):
    status, answer, _ = await doors.post(RETIRE, body)
    assert (status, answer) == (400, {**NOT_EXECUTED, "error": sentence})
    assert doors.log.events == [] and read_principal(doors.paths, OWNER, "cli")[0] is not None


@ceiling
async def test_the_guard_runs_first_and_its_refusals_are_not_executed(doors):
    # spec "Host-only routes": every refusal before the barrier carries outcome "not-executed"
    status, body, _ = await doors.post(RETIRE, BODY, headers={"Content-Type": "text/plain"})
    assert (status, body) == (415, {**NOT_EXECUTED, "error": "send the exchange body as JSON with Content-Type: application/json"})
    status, body, _ = await doors.post(RETIRE, b"{not json")
    assert (status, body) == (400, {**NOT_EXECUTED, "error": "request body is not valid JSON"})
    status, body, _ = await doors.post(RETIRE, BODY, headers={**HEADERS, "Origin": "https://evil.example"})
    assert (status, body) == (403, {**NOT_EXECUTED, "error": "browser-origin requests are not served here"})
    assert doors.log.events == []


@ceiling
async def test_a_corrupt_row_is_409_not_executed(doors):
    row_path(doors.paths, LedgerKind.INTERACTIVE, OWNER, "cli").write_text("{")
    status, body, _ = await doors.post(RETIRE, BODY)
    assert (status, body["outcome"]) == (409, "not-executed")
    assert body["error"] == f"ledger row {OWNER}.cli is corrupt: it is not UTF-8 JSON - re-grant it with `cotal actor grant`"


@ceiling
async def test_a_store_failing_at_the_barrier_is_503_without_an_outcome(doors):
    doors.records.fail = Unavailable("records store down")
    status, body, headers = await doors.post(RETIRE, BODY)
    assert (status, body, headers["Retry-After"]) == (503, {"error": UNAVAILABLE}, "5")
    assert read_principal(doors.paths, OWNER, "cli")[0] is not None  # nothing after the barrier ran


@ceiling
@pytest.mark.parametrize(("fail", "left"), [("listing", None), ("delete", 2)])
async def test_a_failed_withdrawal_still_removes_the_row_so_the_lifecycle_is_refused(doors, fail, left):
    """Issue 15 item 1: the withdrawal used to come before the removal, so a withdrawal that
    failed (or ran out of the bound) left the row granting: the revoked actor kept connecting
    and the exchange kept minting. The row goes first. A failed withdrawal is then a partial
    retirement, answered 202 with the rows known left (None: the listing did not answer),
    not the generic 503 (issue 17 review item 3)."""
    doors.rows.fail = Unavailable("auth bucket down")
    if fail == "delete":  # the listing answers, the deletes do not
        real_entries = doors.rows.entries

        async def entries(pattern: str) -> list[KvEntry]:
            doors.rows.fail = None
            try:
                return await real_entries(pattern)
            finally:
                doors.rows.fail = Unavailable("auth bucket down")

        doors.rows.entries = entries
    status, body, headers = await doors.post(RETIRE, BODY)
    assert (status, headers["Cache-Control"]) == (202, "no-store")
    assert body == {
        **BODY, "outcome": "retired", "withdrawn": "partial", "withdrawnRows": 0, "rowsLeft": left,
        "rowsExpireWithinS": 905,
    }  # fmt: skip
    assert doors.record()[0].state is LifecycleState.RETIRED
    assert read_principal(doors.paths, OWNER, "cli") == (None, None)  # the next exchange and connect refuse
    assert sorted(doors.rows.rows) == sorted([*OURS, *LEFT])  # left to end on their TTL
    status, body, _ = await doors.post(RETIRE, BODY)
    assert (status, body["outcome"]) == (404, "not-executed")  # nothing left to retire


@ceiling
async def test_a_hung_row_removal_answers_at_its_bound_and_frees_the_doors(doors, monkeypatch):
    """Issue 17 review item 2: the removal ran in a thread that could not be abandoned, inside
    the shielded section, so a hung mount held the door (and the doors' lock) forever. Now it
    is abandoned at ``ROW_REMOVE_S``: a 503 without an outcome (unknown: the rename may still
    land), and the next door call is answered."""
    release = threading.Event()
    real = lifecycle_lane.remove_row_if_holds

    def hangs(*args: object) -> bool:
        release.wait(30)  # a hung disk, bounded so the thread ends even if the test fails
        return real(*args)

    monkeypatch.setattr(lifecycle_lane, "remove_row_if_holds", hangs)
    monkeypatch.setattr(lifecycle_lane, "ROW_REMOVE_S", 0.2, raising=False)
    monkeypatch.setattr(lifecycle_lane, "RETIRE_S", 1.0)
    try:
        status, body, _ = await doors.post(RETIRE, BODY)
        activate = await doors.post("/managed-lifecycle/activate", {**BODY, "accountPublicKey": DATA_ACCOUNT})
    finally:
        release.set()
    assert (status, body) == (503, {"error": UNAVAILABLE})
    assert doors.record()[0].state is LifecycleState.RETIRED  # the barrier had run
    assert activate[0] == 404  # the lock is free: no managed row, refused at once


def _left_aside(doors: Doors, uid: str) -> Path:
    """The row file renamed aside by a removal for ``uid`` that never finished (abandoned, or
    the process stopped): ``.<row>.<uid>.retiring.tmp``, which ledger reads skip."""
    path = row_path(doors.paths, LedgerKind.INTERACTIVE, OWNER, "cli")
    held = path.with_name(f".{path.name}.{uid}.retiring.tmp")
    os.rename(path, held)
    return held


@ceiling
async def test_a_retry_finishes_a_removal_left_aside_then_withdraws(doors):
    """The abandoned removal of this lifecycle's row got as far as the rename: the retry removes
    the held file and completes the retirement (its withdrawal had never run)."""
    held = _left_aside(doors, UID)
    status, body, _ = await doors.post(RETIRE, BODY)
    assert (status, body) == (200, {**BODY, "outcome": "retired", "withdrawn": 2})
    assert not held.exists() and read_principal(doors.paths, OWNER, "cli") == (None, None)
    assert sorted(doors.rows.rows) == LEFT


@ceiling
async def test_a_retry_puts_back_a_regranted_row_left_aside(doors):
    """The row held aside was a re-grant (another lifecycle): it goes back, and the retirement
    of the old lifecycle is refused 409, not-executed, with the grant intact."""
    write_row(doors.paths, _ledger_row(LedgerKind.INTERACTIVE, OTHER_UID))
    held = _left_aside(doors, UID)
    status, body, _ = await doors.post(RETIRE, BODY)
    assert (status, body["outcome"]) == (409, "not-executed")
    assert not held.exists() and read_principal(doors.paths, OWNER, "cli")[0].lifecycle_uid == OTHER_UID


@ceiling
async def test_a_row_regranted_during_the_retirement_stays(doors):
    """The row is re-granted right after the barrier: the retirement removes nothing, and still
    withdraws the retired lifecycle's issuance rows."""
    regranted = _ledger_row(LedgerKind.INTERACTIVE, OTHER_UID)
    real_put = doors.records.put_record

    async def put_then_regrant(key: str, value: bytes, *, ttl_s: int | None) -> None:
        await real_put(key, value, ttl_s=ttl_s)
        write_row(doors.paths, regranted)

    doors.records.put_record = put_then_regrant
    status, body, _ = await doors.post(RETIRE, BODY)
    assert (status, body["withdrawn"]) == (200, 2)
    assert read_principal(doors.paths, OWNER, "cli")[0] == regranted
    assert not [p for p in doors.paths.actors_dir.iterdir() if p.name.startswith(".")]  # nothing held aside


# --- /managed-lifecycle/retire and /managed-lifecycle/activate ----------------------------------------


@pytest.fixture
def managed(tmp_path: Path) -> Doors:
    doors = _doors(tmp_path, LedgerKind.MANAGED)
    write_row(doors.paths, _ledger_row(LedgerKind.MANAGED))
    doors.rows.put(f"natkey.{OWNER}.cli.UA", _issuance(UID))
    return doors


ACTIVATE = "/managed-lifecycle/activate"
ACTIVATE_BODY = {**BODY, "accountPublicKey": DATA_ACCOUNT}


@ceiling
async def test_activate_writes_an_active_record_once(managed):
    status, body, headers = await managed.post(ACTIVATE, ACTIVATE_BODY)
    assert (status, headers["Cache-Control"]) == (200, "no-store")
    assert body == {"outcome": "activated", "owner": OWNER, "actor": "cli", "lifecycleUid": UID}
    record, ttl_s = managed.record()
    assert (record.state, record.kind, record.at, ttl_s) == (LifecycleState.ACTIVE, LedgerKind.MANAGED, NOW, None)
    assert (await managed.post(ACTIVATE, ACTIVATE_BODY))[:2] == (200, body)
    assert managed.log.events == [("put", f"lifecycle.{UID}", True)]  # idempotent: written once


@ceiling
async def test_activate_for_another_account_is_403_naming_both(managed):
    status, body, _ = await managed.post(ACTIVATE, {**ACTIVATE_BODY, "accountPublicKey": OTHER_ACCOUNT})
    assert (status, body["outcome"]) == (403, "not-executed")
    assert body["error"] == (
        f"accountPublicKey {OTHER_ACCOUNT} is not the data account of space alpha ({DATA_ACCOUNT})"
        f" - ask the authority assigned to account {OTHER_ACCOUNT}, or send {DATA_ACCOUNT}"
    )
    assert managed.log.events == []


@ceiling
async def test_activate_needs_the_managed_row_of_that_lifecycle(managed, tmp_path):
    write_row(managed.paths, _ledger_row(LedgerKind.MANAGED, OTHER_UID))
    status, body, _ = await managed.post(ACTIVATE, ACTIVATE_BODY)
    assert (status, body["outcome"]) == (409, "not-executed") and f"holds lifecycle {OTHER_UID}" in body["error"]
    status, body, _ = await managed.post(ACTIVATE, {**ACTIVATE_BODY, "actor": "web"})
    assert (status, body["outcome"]) == (404, "not-executed")
    assert body["error"] == (
        f"{OWNER}.web has no managed ledger row in space alpha - grant the agent first"
        f" (`cotal actor grant web --owner {OWNER} --managed`)"
    )


@ceiling
async def test_managed_retire_then_activate_is_409(managed):
    assert (await managed.post(ACTIVATE, ACTIVATE_BODY))[0] == 200
    status, body, _ = await managed.post("/managed-lifecycle/retire", BODY)
    assert (status, body) == (200, {"outcome": "retired", "owner": OWNER, "actor": "cli", "lifecycleUid": UID, "withdrawn": 1})
    record, ttl_s = managed.record()
    assert (record.state, record.kind, ttl_s) == (LifecycleState.RETIRED, LedgerKind.MANAGED, 960)
    assert read_principal(managed.paths, OWNER, "cli") == (None, None) and managed.rows.rows == {}
    write_row(managed.paths, _ledger_row(LedgerKind.MANAGED))  # a stale row of the retired lifecycle
    status, body, _ = await managed.post(ACTIVATE, ACTIVATE_BODY)
    assert (status, body["outcome"]) == (409, "not-executed")
    assert body["error"] == (
        f"lifecycle {UID} of {OWNER}.cli is retired and cannot be activated again - respawn the agent for a fresh lifecycle"
    )


@ceiling
async def test_a_corrupt_record_is_503(managed):
    managed.records.values[f"lifecycle.{UID}"] = (b"{", None)
    status, body, _ = await managed.post(ACTIVATE, ACTIVATE_BODY)
    assert (status, body) == (503, {"error": UNAVAILABLE})


@ceiling
async def test_the_doors_take_post_only(doors):
    response = await doors.client.get(RETIRE)
    assert response.status_code == 405 and response.headers["Allow"] == "POST"


@ceiling
async def test_door_refusals_count_in_the_faces_window_and_stay_not_executed(tmp_path):
    from cotal_trio.core.windows import SlidingWindow
    from cotal_trio.http.faces import TOO_MANY_REFUSALS

    window = SlidingWindow(limit=2)
    paths = SpacePaths(SPACE, tmp_path / "space")
    log = Log(paths, LedgerKind.INTERACTIVE)
    ctx = LifecycleDoors(
        space=SPACE, data_account=DATA_ACCOUNT, read_ledger=functools.partial(read_principal, paths), paths=paths,
        records=FakeRecords(log), issuance=FakeRows(log), clock=lambda: NOW + 0.5,
    )  # fmt: skip
    app = QuartTrio("test-lifecycle-doors-window")
    install_edge(app, routes=routes(ctx, guard=guard, admit_refusal=window.try_acquire), unknown_path="unknown path")
    client = app.test_client()
    statuses = []
    for _ in range(3):  # no row: a refusal each time
        response = await client.post(RETIRE, data=json.dumps(BODY).encode(), headers=HEADERS)
        statuses.append((response.status_code, await response.get_json()))
    assert [status for status, _ in statuses] == [404, 404, 429]
    assert statuses[2][1] == {**NOT_EXECUTED, "error": TOO_MANY_REFUSALS}
    assert window.count(NOW + 0.5) == 2
