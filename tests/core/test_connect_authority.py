"""Issued authority at connect, the pure part (core/connect_authority.py; issue 6 item 6)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cotal_trio.core.bearer import ValidatedBearer
from cotal_trio.core.connect_authority import (
    AuthorityMemo,
    accepted_token,
    authority_rows,
    ceiling_of,
    plan_connect_authority,
    reusable,
    same_ceiling,
    spawner_to_read,
    widen,
)
from cotal_trio.core.identity import derive_owner
from cotal_trio.core.issued import Evidence, IssuedRef, new_generation
from cotal_trio.core.ledger import LedgerKind
from cotal_trio.core.errors import CodecError
from cotal_trio.core.profiles import Permissions, agent_permissions
from cotal_trio.core.views import SessionBinding
from tests.support.connect_authority import EXP, NONCE, NOW, OWNER, SPACE, UID, _agent, _bearer, _row

GEN = new_generation(EXP, bytes(12))


def test_the_accepted_token_is_ours_over_the_nonce_and_the_expiry():
    expected = hashlib.sha256(f"cotal.accepted.v1\0{NONCE}\0{EXP}".encode()).hexdigest()[:32]
    assert accepted_token(NONCE, EXP) == expected
    assert accepted_token(NONCE, EXP + 1) != expected


def test_an_agent_gets_a_listing_generation_with_exactly_three_rows():
    plan = plan_connect_authority(space=SPACE, bearer=_bearer(), row=_row(), inbox_nonce=NONCE)
    assert plan is not None and (plan.kind, plan.horizon, plan.uid) == ("listing", EXP, UID)
    rows = authority_rows(plan, GEN)
    token = accepted_token(NONCE, EXP)
    assert rows.pub_allow == (
        f"cotal.{SPACE}.ep.v1.{GEN}.{OWNER}.cli.registry.endpoints",
        f"$JS.API.DIRECT.GET.KV_cotal_accepted_{SPACE}.$KV.cotal_accepted_{SPACE}.accepted.v1.{token}",
    )
    assert rows.sub_allow == (f"cotal.{SPACE}.ep.v1.{GEN}.{OWNER}.cli.registry.endpoints.reply.>",)


MANAGER_VERBS = ("run-start", "run-start-keyed", "run-submission-status")
SPAWNER = f"{OWNER}.boss"
OTHER_OWNER = derive_owner(bytes(32) + b"x", "https://idp.example", "mallory")
PLANS = [
    # (row kind, row scope, bearer scope, row parent, parent's fresh row) -> kind, extra verbs on `manager`
    ("interactive, no run", "interactive", ("spawn",), ("spawn",), None, None, "manager-caller", ()),
    ("interactive, run", "interactive", ("run",), ("run",), None, None, "manager-caller", MANAGER_VERBS),
    ("managed, run, parent with run", "managed", ("run",), ("run",), SPAWNER, ("run",), "manager-caller", MANAGER_VERBS),
    ("managed, run, managed parent with run", "managed", ("run",), ("run",), SPAWNER, ("run", "managed"), "manager-caller",
     MANAGER_VERBS),
    ("managed, no run", "managed", ("spawn",), ("spawn",), SPAWNER, ("run",), "listing", ()),
    ("managed, run not signed", "managed", ("run",), (), SPAWNER, ("run",), "listing", ()),
    ("managed, run, no parent", "managed", ("run",), ("run",), None, None, "listing", ()),
    ("managed, run, parent no longer granted", "managed", ("run",), ("run",), SPAWNER, None, "listing", ()),
    ("managed, run, parent without run", "managed", ("run",), ("run",), SPAWNER, ("spawn",), "listing", ()),
    # spec "User-auth manager callers": an admin parent's containment bypass does not count
    ("managed, run, admin parent without run", "managed", ("run",), ("run",), SPAWNER, ("admin",), "listing", ()),
    ("managed, run, admin parent with run", "managed", ("run",), ("run",), SPAWNER, ("admin", "run"), "manager-caller",
     MANAGER_VERBS),
]


def _parent_row(scope):
    if scope is None:
        return None
    kind = LedgerKind.MANAGED if "managed" in scope else LedgerKind.INTERACTIVE
    return _row(kind=kind, scope=tuple(s for s in scope if s != "managed"), actor="boss")


@pytest.mark.parametrize(
    ("name", "kind", "row_scope", "scope", "parent", "parent_scope", "expected", "verbs"), PLANS, ids=[p[0] for p in PLANS]
)
def test_a_manager_caller_view_is_issued_for_an_interactive_row_or_an_eligible_managed_seat(
    name, kind, row_scope, scope, parent, parent_scope, expected, verbs
):
    row = _row(kind=LedgerKind(kind), scope=row_scope, parent=parent)
    bearer = _bearer("manager-caller", scope)
    plan = plan_connect_authority(
        space=SPACE, bearer=bearer, row=row, inbox_nonce=NONCE, spawner=_parent_row(parent_scope)
    )
    assert plan is not None and plan.kind == expected and plan.horizon == EXP
    assert plan.requests == (("registry", "endpoints"), *(("manager", v) for v in verbs))


def test_only_a_managed_run_seat_with_a_spawner_needs_the_spawner_read():
    managed = _row(kind=LedgerKind.MANAGED, scope=("run",), parent=SPAWNER)
    assert spawner_to_read(_bearer("manager-caller", ("run",)), managed) == (OWNER, "boss")
    assert spawner_to_read(_bearer("manager-caller", ("spawn",)), managed) is None  # run not signed
    assert spawner_to_read(_bearer(None, ("run",)), managed) is None  # an agent: a listing anyway
    assert spawner_to_read(_bearer("manager-caller", ("run",)), _row(kind=LedgerKind.MANAGED, scope=("run",))) is None
    assert spawner_to_read(_bearer("manager-caller", ("run",)), _row(scope=("run",), parent=None)) is None


def test_a_spawner_of_another_owner_or_another_principal_does_not_count():
    row = _row(kind=LedgerKind.MANAGED, scope=("run",), parent=SPAWNER)
    bearer = _bearer("manager-caller", ("run",))
    for wrong in (_row(scope=("run",), actor="other"), _row(scope=("run",), actor="boss", owner=OTHER_OWNER)):
        plan = plan_connect_authority(space=SPACE, bearer=bearer, row=row, inbox_nonce=NONCE, spawner=wrong)
        assert plan is not None and plan.kind == "listing"
    assert spawner_to_read(bearer, _row(kind=LedgerKind.MANAGED, scope=("run",), parent=f"{OTHER_OWNER}.boss")) is None


@pytest.mark.parametrize("view", ["admin", "session-caller", "purger"])
def test_other_views_get_nothing(view):
    bearer = ValidatedBearer(
        owner=OWNER, actor="cli", scope=("admin",), lifecycle_uid=UID, parent=None, view=view, credential_id=None,
        iat=NOW, exp=EXP,
        session=SessionBinding(endpoint="chat", session_id="s" * 22, epoch=1, exp=EXP) if view == "session-caller" else None,
    )
    assert plan_connect_authority(space=SPACE, bearer=bearer, row=_row(scope=("admin",)), inbox_nonce=NONCE) is None


def _ref(**changes) -> IssuedRef:
    fields = dict(space=SPACE, owner=OWNER, actor="cli", uid=UID, generation=GEN)
    fields.update(changes)
    return IssuedRef(**fields)


REUSE = [
    ("same caller, live, this horizon", {}, NOW, True),
    ("another actor", {"actor": "bot"}, NOW, False),
    ("another uid", {"uid": "d" * 26}, NOW, False),
    ("another horizon", {"generation": new_generation(EXP - 1, bytes(12))}, NOW, False),
    ("at the horizon", {}, EXP, False),
]


@pytest.mark.parametrize(("name", "changes", "now", "ok"), REUSE, ids=[r[0] for r in REUSE])
def test_reuse_is_decided_before_the_evidence_is_read(name, changes, now, ok):
    plan = plan_connect_authority(space=SPACE, bearer=_bearer(), row=_row(), inbox_nonce=NONCE)
    assert reusable(plan, _ref(**changes), now=now) is ok


def test_the_ceiling_must_be_byte_identical():
    plan = plan_connect_authority(space=SPACE, bearer=_bearer(), row=_row(), inbox_nonce=NONCE)
    full = widen(_agent(), authority_rows(plan, GEN))
    evidence = Evidence(ref=_ref(), sources=(), permissions=ceiling_of(full), expires_at=EXP)
    assert same_ceiling(evidence, full)
    other = agent_permissions(
        space=SPACE, owner=OWNER, actor="cli", allow_publish=("team.other",), allow_subscribe=("team.>",), inbox_nonce=NONCE
    )
    assert not same_ceiling(evidence, widen(other, authority_rows(plan, GEN)))


def test_widen_appends_only_new_rows():
    plan = plan_connect_authority(space=SPACE, bearer=_bearer(), row=_row(), inbox_nonce=NONCE)
    extra = authority_rows(plan, GEN)
    full = widen(_agent(), extra)
    assert full.pub_allow == (*_agent().pub_allow, *extra.pub_allow)
    assert full.sub_allow == (*_agent().sub_allow, *extra.sub_allow)
    assert widen(full, extra) == full


# -- the memo (issue 14 item 4) -------------------------------------------------------------------


@given(
    # a nonce may also occur elsewhere in the grant's subjects (the owner's own characters)
    nonces=st.lists(st.from_regex(r"[a-z0-9_-]{8,14}", fullmatch=True) | st.just(OWNER[:8]) | st.just("registry"), min_size=1, max_size=4),
    generations=st.lists(st.binary(min_size=12, max_size=12), min_size=1, max_size=3),
    publish=st.sampled_from([(), ("team.news",), ("team.>", "ops.a")]),
    view=st.sampled_from([None, "manager-caller"]),
)
def test_the_memo_gives_exactly_the_rows_and_ceiling_built_afresh(nonces, generations, publish, view):
    """Built once per principal and grant, reused while unchanged: byte for byte what
    authority_rows and ceiling_of(widen(...)) give, for every nonce and generation."""
    memo = AuthorityMemo(capacity=2)
    for nonce in nonces * 2:  # each grant again, once it is memoized
        permissions = agent_permissions(
            space=SPACE, owner=OWNER, actor="cli", allow_publish=publish, allow_subscribe=("team.>",), inbox_nonce=nonce
        )
        plan = plan_connect_authority(space=SPACE, bearer=_bearer(view=view, scope=("run",)), row=_row(scope=("run",)), inbox_nonce=nonce)
        assert plan is not None
        for random12 in generations:
            generation = new_generation(EXP, random12)
            rows = memo.rows(plan, generation)
            assert rows == authority_rows(plan, generation)
            got = memo.ceiling(permissions, rows, nonce=nonce)
            assert got.canonical() == ceiling_of(widen(permissions, rows)).canonical()
            assert got == ceiling_of(widen(permissions, rows))


def test_the_memo_refuses_a_malformed_subject_as_ceiling_of_does():
    permissions = _agent()
    memo = AuthorityMemo()
    plan = plan_connect_authority(space=SPACE, bearer=_bearer(), row=_row(), inbox_nonce=NONCE)
    assert plan is not None
    with pytest.raises(CodecError):
        memo.ceiling(permissions, _raw(pub_allow=("a.>.b",)), nonce=NONCE)
    with pytest.raises(CodecError):
        ceiling_of(widen(permissions, _raw(pub_allow=("a.>.b",))))


def _raw(*, pub_allow: tuple[str, ...]) -> Permissions:
    """Permissions whose subjects were never checked (as a bug elsewhere could hand over)."""
    made = object.__new__(Permissions)
    for name, value in (("pub_allow", pub_allow), ("pub_deny", ()), ("sub_allow", ()), ("sub_deny", ())):
        object.__setattr__(made, name, value)
    return made
