"""A ledger read that stalls on a host door holds that door only, never the face (issue 15 item 7).

The loopback face serves the exchange and the host-only doors (spec "Host-only routes";
docs/host-doors.md) on the lane's one trio thread. The manager doors (``manager_doors.py``) and
the lifecycle doors (``lifecycle_doors.py``) read the principal's ledger rows before they decide;
each read runs in a worker thread with a limiter and is abandoned at the faces' ledger deadline
(``faces.LEDGER_READ_S``, shortened here), as the exchange's read is. The reader port blocks on a
``threading.Event`` for the stalled actors and a ``threading.Timer`` releases it ``STALL_S``
later, so the assertions see whether each answer came before the release.

Each test serves the real loopback face, with both door tables, by hypercorn on 127.0.0.1 and
speaks raw HTTP/1.1 to it.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from cotal_trio.core.ledger import LedgerKind
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.http import build_loopback_app
from cotal_trio.http.errors import UNAVAILABLE
from cotal_trio.http.lifecycle_doors import INTERACTIVE_RETIRE_PATH, MANAGED_ACTIVATE_PATH, MANAGED_RETIRE_PATH
from cotal_trio.http.lifecycle_doors import LifecycleDoors
from cotal_trio.http.lifecycle_doors import routes as lifecycle_routes
from cotal_trio.http.manager_doors import CONSENT_PATH, VERIFY_ENROLLMENT_PATH
from cotal_trio.http.manager_doors import routes as manager_routes
from cotal_trio.state import SpacePaths
from tests.support.ledger_stall import StallingLedger, _context, _race, short_deadline
from tests.support.lifecycle_doors import FakeRecords, FakeRows, Log
from tests.support.loopback import LIFECYCLE, OWNER, SPACE, _human_body, _request, _row
from tests.support.manager_doors import INSTANCE, MemoryRecords, _consent, _doors, _instance

__all__ = ["short_deadline"]  # the fixture, used by name

DATA_ACCOUNT = KeyPair.from_raw(Prefix.ACCOUNT, bytes(range(32))).public_key
HELPER_UID = "h" * 26  # another principal's lifecycle, activated meanwhile
NOT_EXECUTED = {"outcome": "not-executed"}
STALLED_503 = (503, {"error": UNAVAILABLE}, False)  # by the read's deadline, before the release
STALLED_LIFECYCLE_503 = (503, {**NOT_EXECUTED, "error": UNAVAILABLE}, False)  # before the barrier


class Face:
    """The loopback face over one stalling ledger, with both door tables and their stores."""

    def __init__(self, tmp_path: Path, stalled: set[str]) -> None:
        self.ledger = StallingLedger(stalled)
        for row in (
            _row(LedgerKind.INTERACTIVE, "mgr", scope=("supervise",)),
            _row(LedgerKind.MANAGED, "helper", lifecycle_uid=HELPER_UID, token_hash="0" * 64),
        ):
            self.ledger.rows[(row.kind, row.owner, row.actor)] = row
        paths = SpacePaths(SPACE, tmp_path / "space")
        log = Log(paths)
        self.lifecycle_records, self.rows = FakeRecords(log), FakeRows(log)
        self.manager_records = MemoryRecords(_instance())
        lifecycle = LifecycleDoors(
            space=SPACE, data_account=DATA_ACCOUNT, read_ledger=self.ledger, paths=paths,
            records=self.lifecycle_records, issuance=self.rows, clock=lambda: 1_800_000_000.5,
        )  # fmt: skip
        managers = _doors(self.manager_records, read_ledger=self.ledger)

        def lifecycle_table(guard, admit):
            return lifecycle_routes(lifecycle, guard=guard, admit_refusal=admit)

        def manager_table(guard, admit):
            return manager_routes(replace(managers, admit_refusal=admit), guard=guard)

        self.app = build_loopback_app(_context(self.ledger), doors=(lifecycle_table, manager_table))


def _enroll(actor: str) -> dict:
    return {"owner": OWNER, "request": {"kind": "enroll", "actor": actor, "instanceId": INSTANCE, "serveEpoch": 2,
                                        "agent": "worker"}}  # fmt: skip


def _target(actor: str, uid: str = LIFECYCLE, **extra) -> dict:
    return {"owner": OWNER, "actor": actor, "lifecycleUid": uid, **extra}


def _quiet(caplog) -> None:
    """No traceback anywhere, and the stalled read named in the log at warning."""
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert any("the actor ledger did not answer within 1 s" in m for m in caplog.messages)


EXCHANGE = ("exchange", _request("/exchange", _human_body("cli"), capability=True))


@pytest.mark.parametrize(
    ("stalled", "path", "body"),
    [("mgr", VERIFY_ENROLLMENT_PATH, _enroll("mgr")), ("mgr", CONSENT_PATH, _consent("mgr"))],
    ids=["verify-enrollment", "consent"],
)
async def test_a_stalled_read_on_a_manager_door_is_a_503_and_an_exchange_mints_meanwhile(
    short_deadline, caplog, tmp_path, stalled, path, body
):
    caplog.set_level(logging.WARNING, logger="cotal.http")
    face = Face(tmp_path, {stalled})
    answers = await _race(face.app, face.ledger, ("slow", _request(path, body, capability=True)), dict([EXCHANGE]))
    assert answers.got["exchange"][0] == 200 and answers.got["exchange"][1]["owner"] == OWNER
    assert not answers.got["exchange"][2]  # while the door's read was blocked
    assert answers.got["slow"] == STALLED_503
    assert face.manager_records.records == {}  # no consent was recorded
    _quiet(caplog)


@pytest.mark.parametrize(
    ("stalled", "path", "body"),
    [
        ("mgr", INTERACTIVE_RETIRE_PATH, _target("mgr")),
        ("worker", MANAGED_RETIRE_PATH, _target("worker")),
        ("worker", MANAGED_ACTIVATE_PATH, _target("worker", accountPublicKey=DATA_ACCOUNT)),
    ],
    ids=["interactive-retire", "managed-retire", "managed-activate"],
)
async def test_a_stalled_read_on_a_lifecycle_door_is_a_503_not_executed_and_holds_neither_face_nor_lock(
    short_deadline, caplog, tmp_path, stalled, path, body
):
    """The three doors share one lock; the stalled read gives it up at its deadline, so another
    principal's activation is answered before the read is released."""
    caplog.set_level(logging.WARNING, logger="cotal.http")
    face = Face(tmp_path, {stalled})
    activate = _request(MANAGED_ACTIVATE_PATH, _target("helper", HELPER_UID, accountPublicKey=DATA_ACCOUNT), capability=True)
    slow = ("slow", _request(path, body, capability=True))
    answers = await _race(face.app, face.ledger, slow, dict([EXCHANGE, ("activate", activate)]))
    assert answers.got["exchange"][0] == 200 and not answers.got["exchange"][2]
    assert answers.got["activate"] == (200, {"outcome": "activated", **_target("helper", HELPER_UID)}, False)
    assert answers.got["slow"] == STALLED_LIFECYCLE_503
    assert list(face.lifecycle_records.values) == [f"lifecycle.{HELPER_UID}"]  # the activation's only
    _quiet(caplog)
