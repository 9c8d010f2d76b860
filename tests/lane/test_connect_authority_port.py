"""The callout's issued-authority port over a fake store (lane/callout/authority.py; issue 6 item 6):
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
from cotal_trio.lane.callout.authority import ConnectAuthority
from cotal_trio.core.profiles import agent_permissions
from cotal_trio.stores.issued import Resolved
from cotal_trio.natsio import WrongLastSequence
from tests.support.connect_authority import EXP, NONCE, NOW, OWNER, SPACE, UID, _agent, _bearer, _row


class FakeStores:
    """The IssuedStores calls the port makes, recorded; ``accepted`` is the row under the token
    (``issue_accepted`` writes it when there is none), ``issue_error`` what issuing raises."""

    space = SPACE

    def __init__(self, accepted: IssuedRef | None = None, *, issue_error: Exception | None = None) -> None:
        self.calls: list[str] = []
        self.accepted, self.issue_error = accepted, issue_error
        self.evidence: dict[IssuedRef, object] = {}
        self.random = 0

    async def accepted_ref(self, token, *, now):
        await trio.lowlevel.checkpoint()
        self.calls.append(f"accepted_ref {token}")
        return self.accepted

    async def resolve(self, ref, *, now):
        self.calls.append(f"resolve {ref.generation}")
        if ref not in self.evidence:
            raise AssertionError("the evidence was read")
        return Resolved(evidence=self.evidence[ref], attempt_revision=1)  # type: ignore[arg-type]

    def new_ref(self, *, owner, actor, uid, horizon):
        self.random += 1
        return IssuedRef(space=SPACE, owner=owner, actor=actor, uid=uid, generation=new_generation(horizon, bytes(11) + bytes([self.random])))

    def connect_writes(self, evidence, token, *, now):
        self.calls.append(f"connect_writes {evidence.ref.generation} {token}")
        self.evidence[evidence.ref] = evidence
        return [("evidence", b"", None), ("attempt", b"", None), ("accepted", b"", None)]

    def connect_outcome(self, evidence, outcomes):
        if isinstance(outcomes[2], Exception):
            return False
        self.accepted = evidence.ref
        return True

    async def issue_accepted(self, evidence, token, *, now):
        await trio.lowlevel.checkpoint()
        self.calls.append(f"issue_accepted {evidence.ref.generation} {token}")
        if self.issue_error is not None:
            raise self.issue_error
        self.evidence[evidence.ref] = evidence
        if self.accepted is not None:
            return False  # the write-once row is there already
        self.accepted = evidence.ref
        return True


GRANT = ConnectGrant(owner=OWNER, actor="cli", permissions=_agent(), exp=EXP)
TOKEN = accepted_token(NONCE, EXP)
FRESH = new_generation(EXP, bytes(11) + b"\x01")  # the first generation a FakeStores makes


async def _port(stores: FakeStores, *, now=NOW):
    return await ConnectAuthority(stores)(_bearer(), GRANT, _row(), NONCE, now)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "horizon", [NOW - 1, NOW, EXP - 1], ids=["past its horizon", "at its horizon", "another horizon"]
)
async def test_a_generation_that_cannot_be_reused_is_never_read(horizon):
    stale = IssuedRef(space=SPACE, owner=OWNER, actor="cli", uid=UID, generation=new_generation(horizon, bytes(12)))
    stores = FakeStores(stale)
    assert await _port(stores) is None
    # The row is found by the refused write-once create; no resolve, and the fresh generation is
    # named by no accepted row (it authorizes nothing and goes with its TTL).
    assert stores.calls == [f"issue_accepted {FRESH} {TOKEN}", f"accepted_ref {TOKEN}"]


async def test_another_callers_row_under_the_token_gets_no_rows_and_no_read():
    other = IssuedRef(space=SPACE, owner=OWNER, actor="bot", uid=UID, generation=new_generation(EXP, bytes(12)))
    stores = FakeStores(other)
    assert await _port(stores) is None
    assert stores.calls == [f"issue_accepted {FRESH} {TOKEN}", f"accepted_ref {TOKEN}"]


async def test_a_fresh_token_is_issued_and_accepted_in_one_call_with_no_read_first():
    """Issue 14 item 3: a fresh inbox nonce's accepted row is found by its create-only write."""
    stores = FakeStores()
    extra = await _port(stores)
    assert stores.calls == [f"issue_accepted {FRESH} {TOKEN}"]
    assert extra is not None and len(extra.pub_allow) == 2 and len(extra.sub_allow) == 1


async def test_the_same_nonce_again_reads_its_row_first_and_reuses_the_generation():
    stores = FakeStores()
    port = ConnectAuthority(stores)  # type: ignore[arg-type]
    first = await port(_bearer(), GRANT, _row(), NONCE, NOW)
    again = await port(_bearer(), GRANT, _row(), NONCE, NOW)
    assert first is not None and again == first
    assert stores.calls == [f"issue_accepted {FRESH} {TOKEN}", f"accepted_ref {TOKEN}", f"resolve {FRESH}"]


async def test_another_lanes_row_under_a_fresh_token_is_reused_after_the_refused_write():
    """A row this lane did not write (a replica's, or from before a restart) is found by the
    refused create and reused under the same rules as a read first."""
    stores = FakeStores()
    assert await ConnectAuthority(stores)(_bearer(), GRANT, _row(), NONCE, NOW) is not None  # type: ignore[arg-type]
    stores.calls.clear()
    extra = await ConnectAuthority(stores)(_bearer(), GRANT, _row(), NONCE, NOW)  # type: ignore[arg-type]
    second = new_generation(EXP, bytes(11) + b"\x02")
    assert stores.calls == [f"issue_accepted {second} {TOKEN}", f"accepted_ref {TOKEN}", f"resolve {FRESH}"]
    assert extra is not None and all(FRESH in s for s in extra.sub_allow)


@pytest.mark.parametrize(
    "error", [Refused(RefusalCode.CONFLICT, "written"), Unavailable("no answer")], ids=["generation taken", "store down"]
)
async def test_an_issuance_that_cannot_be_written_connects_without_rows(error):
    stores = FakeStores(issue_error=error)
    assert await _port(stores) is None
    assert stores.calls == [f"issue_accepted {FRESH} {TOKEN}"]


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


# -- sent along with the issuance row (issue 14 item 3) ---------------------------------------------


async def test_a_fresh_token_is_prepared_before_the_row_and_kept_when_the_recheck_grants_the_same():
    stores = FakeStores()
    port = ConnectAuthority(stores)  # type: ignore[arg-type]
    prepared = port.prepare(_bearer(), GRANT, _row(), NONCE, NOW)
    assert prepared is not None and [w[0] for w in prepared.writes] == ["evidence", "attempt", "accepted"]
    extra = await port.finish(prepared, [1, 2, 3], _bearer(), GRANT, _row(), NONCE, NOW)
    assert extra == prepared.extra and stores.calls == [f"connect_writes {FRESH} {TOKEN}"]
    assert port.prepare(_bearer(), GRANT, _row(), NONCE, NOW) is None  # the same nonce again: read first


async def test_a_recheck_that_grants_otherwise_keeps_no_prepared_rows():
    stores = FakeStores()
    port = ConnectAuthority(stores)  # type: ignore[arg-type]
    prepared = port.prepare(_bearer(), GRANT, _row(), NONCE, NOW)
    assert prepared is not None
    wider = ConnectGrant(owner=OWNER, actor="cli", permissions=_agent_with("ops.>"), exp=EXP)
    assert await port.finish(prepared, [1, 2, 3], _bearer(), wider, _row(), NONCE, NOW) is None
    caller = _bearer(view="manager-caller")
    issued = ConnectAuthority(FakeStores()).prepare(caller, GRANT, _row(), "ibx" + "9" * 10, NOW)  # type: ignore[arg-type]
    assert issued is not None and issued.plan.kind == "manager-caller"
    seat = _row(kind=LedgerKind.MANAGED)  # re-granted as a managed seat meanwhile: a listing plan now
    assert await port.finish(issued, [1, 2, 3], caller, GRANT, seat, "ibx" + "9" * 10, NOW) is None


async def test_a_prepared_token_that_had_its_row_goes_through_the_reuse_rules():
    other = IssuedRef(space=SPACE, owner=OWNER, actor="bot", uid=UID, generation=new_generation(EXP, bytes(12)))
    stores = FakeStores(other)
    port = ConnectAuthority(stores)  # type: ignore[arg-type]
    prepared = port.prepare(_bearer(), GRANT, _row(), NONCE, NOW)
    assert prepared is not None
    refused = WrongLastSequence("publish accepted: wrong last sequence", 10071)
    assert await port.finish(prepared, [1, 2, refused], _bearer(), GRANT, _row(), NONCE, NOW) is None
    assert stores.calls == [f"connect_writes {FRESH} {TOKEN}", f"accepted_ref {TOKEN}"]  # another caller's: no read


async def test_a_managed_run_seat_is_never_prepared():
    assert ConnectAuthority(FakeStores()).prepare(_seat_bearer(), GRANT, SEAT, NONCE, NOW) is None  # type: ignore[arg-type]


def _agent_with(channel: str):
    return agent_permissions(
        space=SPACE, owner=OWNER, actor="cli", allow_publish=("team.news", channel), allow_subscribe=("team.>",),
        inbox_nonce=NONCE,
    )
