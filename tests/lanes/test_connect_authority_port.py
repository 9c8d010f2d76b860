"""The callout's issued-authority port over a fake store (lanes/connect_authority.py; issue 6 item 6):
which store calls each case makes, with no broker."""

from __future__ import annotations

import pytest
import trio

from cotal_trio.core.bearer import ValidatedBearer
from cotal_trio.core.callout import ConnectGrant
from cotal_trio.core.connect_authority import accepted_token
from cotal_trio.core.errors import CodecError, RefusalCode, Refused, Unavailable
from cotal_trio.core.issued import IssuedRef, new_generation
from cotal_trio.core.ledger import LedgerKind
from cotal_trio.lanes.connect_authority import ConnectAuthority
from tests.core.test_connect_authority import EXP, NONCE, NOW, OWNER, SPACE, UID, _agent, _bearer, _row


class FakeStores:
    """The IssuedStores calls the port makes, recorded; ``accepted`` is what ``accepted_ref`` gives."""

    space = SPACE

    def __init__(self, accepted: IssuedRef | None = None, *, accept_error: Exception | None = None) -> None:
        self.calls: list[str] = []
        self.accepted, self.accept_error = accepted, accept_error

    async def accepted_ref(self, token, *, now):
        await trio.lowlevel.checkpoint()
        self.calls.append(f"accepted_ref {token}")
        return self.accepted

    async def resolve(self, ref, *, now):
        self.calls.append(f"resolve {ref.generation}")
        raise AssertionError("the evidence was read")

    def new_ref(self, *, owner, actor, uid, horizon):
        return IssuedRef(space=SPACE, owner=owner, actor=actor, uid=uid, generation=new_generation(horizon, bytes(12)))

    async def issue(self, evidence, *, now):
        self.calls.append(f"issue {evidence.ref.generation}")
        return evidence.ref

    async def accept(self, token, ref, *, now):
        self.calls.append(f"accept {token}")
        if self.accept_error is not None:
            raise self.accept_error

    async def retire(self, ref, *, now):
        self.calls.append(f"retire {ref.generation}")
        return True


GRANT = ConnectGrant(owner=OWNER, actor="cli", permissions=_agent(), exp=EXP)
TOKEN = accepted_token(NONCE, EXP)


async def _port(stores: FakeStores, *, now=NOW):
    return await ConnectAuthority(stores)(_bearer(), GRANT, _row(), NONCE, now)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "horizon", [NOW - 1, NOW, EXP - 1], ids=["past its horizon", "at its horizon", "another horizon"]
)
async def test_a_generation_that_cannot_be_reused_is_never_read(horizon):
    stale = IssuedRef(space=SPACE, owner=OWNER, actor="cli", uid=UID, generation=new_generation(horizon, bytes(12)))
    stores = FakeStores(stale)
    assert await _port(stores) is None
    assert stores.calls == [f"accepted_ref {TOKEN}"]  # no resolve, and no second generation


async def test_another_callers_row_under_the_token_gets_no_rows_and_no_read():
    other = IssuedRef(space=SPACE, owner=OWNER, actor="bot", uid=UID, generation=new_generation(EXP, bytes(12)))
    stores = FakeStores(other)
    assert await _port(stores) is None and stores.calls == [f"accepted_ref {TOKEN}"]


async def test_a_fresh_token_issues_then_accepts():
    stores = FakeStores()
    extra = await _port(stores)
    generation = new_generation(EXP, bytes(12))
    assert stores.calls == [f"accepted_ref {TOKEN}", f"issue {generation}", f"accept {TOKEN}"]
    assert extra is not None and len(extra.pub_allow) == 2 and len(extra.sub_allow) == 1


@pytest.mark.parametrize(
    "error", [Refused(RefusalCode.CONFLICT, "written"), Unavailable("no answer")], ids=["lost race", "store down"]
)
async def test_an_accepted_row_that_cannot_be_written_retires_the_generation_and_connects_without_rows(error):
    stores = FakeStores(accept_error=error)
    assert await _port(stores) is None
    generation = new_generation(EXP, bytes(12))
    assert stores.calls == [f"accepted_ref {TOKEN}", f"issue {generation}", f"accept {TOKEN}", f"retire {generation}"]


async def test_views_without_rows_touch_no_store():
    stores = FakeStores()
    bearer = ValidatedBearer(
        owner=OWNER, actor="cli", scope=("admin",), lifecycle_uid=UID, parent=None, view="admin", credential_id=None,
        iat=NOW, exp=EXP,
    )
    assert await ConnectAuthority(stores)(bearer, GRANT, _row(scope=("admin",)), NONCE, NOW) is None  # type: ignore[arg-type]
    assert stores.calls == []


def _seat_bearer() -> ValidatedBearer:
    return ValidatedBearer(
        owner=OWNER, actor="cli", scope=("run",), lifecycle_uid=UID, parent=None, view="manager-caller", credential_id=None,
        iat=NOW, exp=EXP, manager_instance_id="b" * 26,
    )


SEAT = _row(kind=LedgerKind.MANAGED, scope=("run",), parent=f"{OWNER}.boss")


class Ledger:
    """The fresh ledger reads the port makes, recorded; ``rows`` is what each read gives."""

    def __init__(self, rows=None, error: Exception | None = None) -> None:
        self.rows, self.error, self.reads = rows or (None, None), error, []

    async def __call__(self, owner, actor):
        await trio.lowlevel.checkpoint()
        self.reads.append((owner, actor))
        if self.error is not None:
            raise self.error
        return self.rows


def _verbs(extra) -> list[str]:
    return sorted(s.rsplit(".", 2)[-1] for s in extra.pub_allow if ".ep.v1." in s)


@pytest.mark.parametrize(
    ("rows", "error", "verbs"),
    [
        ((_row(scope=("run",), actor="boss"), None), None, ["endpoints", "run-start", "run-start-keyed", "run-submission-status"]),
        ((None, _row(kind=LedgerKind.MANAGED, scope=("run",), actor="boss")), None,
         ["endpoints", "run-start", "run-start-keyed", "run-submission-status"]),
        ((_row(scope=("admin",), actor="boss"), None), None, ["endpoints"]),  # admin's bypass does not count
        ((None, None), None, ["endpoints"]),  # the spawner is no longer granted
        (None, CodecError("corrupt row"), ["endpoints"]),  # an unreadable spawner row: a listing only
        # both kinds at once is a broken ledger (authorize_connect refuses that principal): no spawner
        ((_row(scope=("run",), actor="boss"), _row(kind=LedgerKind.MANAGED, scope=("run",), actor="boss")), None,
         ["endpoints"]),
    ],
    ids=["interactive spawner with run", "managed spawner with run", "admin spawner", "spawner gone", "spawner unreadable",
         "spawner with both rows"],
)
async def test_a_managed_run_seat_reads_its_spawner_fresh(rows, error, verbs):
    ledger = Ledger(rows, error)
    extra = await ConnectAuthority(FakeStores(), read_ledger=ledger)(_seat_bearer(), GRANT, SEAT, NONCE, NOW)  # type: ignore[arg-type]
    assert ledger.reads == [(OWNER, "boss")]
    assert extra is not None and _verbs(extra) == verbs


async def test_only_a_managed_run_seat_reads_the_ledger():
    ledger = Ledger()
    assert await ConnectAuthority(FakeStores(), read_ledger=ledger)(_bearer(), GRANT, _row(), NONCE, NOW) is not None  # type: ignore[arg-type]
    assert ledger.reads == []


async def test_without_a_ledger_port_a_managed_seat_gets_a_listing_only():
    extra = await ConnectAuthority(FakeStores())(_seat_bearer(), GRANT, SEAT, NONCE, NOW)  # type: ignore[arg-type]
    assert extra is not None and _verbs(extra) == ["endpoints"]
