"""Plane claim decisions (DESIGN.md section 8): sync tables, exact boundary times, no mocks."""

from __future__ import annotations

import json

import pytest

from cotal_trio.core.errors import CodecError, ConfigError
from cotal_trio.core.plane import (
    Acquire,
    Lease,
    PlaneRow,
    PlaneState,
    Refuse,
    decide_acquire,
    decide_renew,
    must_fence,
    parse_row,
    plane_bucket,
    release,
    render_row,
)

LEASE = Lease(lease_s=15.0, margin_s=2.0)
ME = "me:1:aa"
OTHER = "other-host:42:bb"
T0 = 1_767_225_600.0


def row(gen=3, holder=OTHER, state=PlaneState.HELD, at=T0, lease_s=15.0) -> PlaneRow:
    return PlaneRow(generation=gen, holder=holder, state=state, renewed_at=at, lease_s=lease_s)


def mine(gen: int, now: float, lease_s: float = 15.0) -> PlaneRow:
    return row(gen=gen, holder=ME, at=now, lease_s=lease_s)


# -- decide_acquire -----------------------------------------------------------------------------

ACQUIRE_TABLE = [
    # (label, current, now, expected Acquire)
    ("no row: create generation 1", None, T0, Acquire("create", mine(1, T0))),
    ("released: update generation + 1", (row(state=PlaneState.RELEASED), 9), T0,
     Acquire("update", mine(4, T0), 9)),
    ("released just now is taken at once", (row(state=PlaneState.RELEASED, at=T0), 9), T0,
     Acquire("update", mine(4, T0), 9)),
    ("held, unrenewed exactly a full lease: reclaim", (row(), 5), T0 + 15.0,
     Acquire("update", mine(4, T0 + 15.0), 5)),
    ("held, unrenewed longer: reclaim", (row(gen=7), 5), T0 + 100.0,
     Acquire("update", mine(8, T0 + 100.0), 5)),
    ("stored bytes are parsed", (render_row(row(state=PlaneState.RELEASED)), 2), T0,
     Acquire("update", mine(4, T0), 2)),
    ("the row's longer lease is waited out", (row(lease_s=30.0), 5), T0 + 30.0,
     Acquire("update", mine(4, T0 + 30.0), 5)),
    ("held by this holder, renewed now (its earlier start, stopped): taken back at once",
     (mine(3, T0), 6), T0, Acquire("update", mine(4, T0), 6)),
    ("held by this holder in the future (skew): taken back at once", (mine(3, T0 + 5), 6), T0,
     Acquire("update", mine(4, T0), 6)),
]


@pytest.mark.parametrize(("current", "now", "expected"), [c[1:] for c in ACQUIRE_TABLE],
                         ids=[c[0] for c in ACQUIRE_TABLE])
def test_decide_acquire_takes(current, now, expected):
    assert decide_acquire(current, holder=ME, now=now, lease=LEASE) == expected


REFUSE_TABLE = [
    # (label, current, now, reclaim_at)
    ("held, renewed now", row(), T0, T0 + 15.0),
    ("held, just under a full lease", row(), T0 + 14.999, T0 + 15.0),
    ("held, past our fence point but not a full lease", row(), T0 + 13.0, T0 + 15.0),
    ("held, renewed in the future (skew)", row(at=T0 + 5), T0, T0 + 20.0),
    ("held with a longer lease than ours", row(lease_s=30.0), T0 + 29.9, T0 + 30.0),
    ("held with a shorter lease: ours is waited", row(lease_s=3.0), T0 + 14.0, T0 + 15.0),
]


@pytest.mark.parametrize(("stored", "now", "reclaim_at"), [c[1:] for c in REFUSE_TABLE],
                         ids=[c[0] for c in REFUSE_TABLE])
def test_decide_acquire_refuses_a_fresh_holder(stored, now, reclaim_at):
    decision = decide_acquire((stored, 5), holder=ME, now=now, lease=LEASE)
    assert isinstance(decision, Refuse)
    assert decision.holder == OTHER and decision.reclaim_at == reclaim_at
    wait = f"{max(stored.lease_s, 15.0):g}"
    assert decision.reason.startswith(
        f"space held by {OTHER} (generation 3) - stop that auth service, or wait {wait} s after"
        " it stops renewing"
    )


def test_refusal_sentence_exact():
    decision = decide_acquire((row(), 5), holder=ME, now=T0 + 4.25, lease=LEASE)
    assert decision == Refuse(
        f"space held by {OTHER} (generation 3) - stop that auth service, or wait 15 s after it"
        " stops renewing (last renewed 4.2 s ago)",
        holder=OTHER,
        reclaim_at=T0 + 15.0,
    )


@pytest.mark.parametrize("stored", [
    b"", b"not json", b"\xff", b"[]", b'{"v": 2}',
    json.dumps({"v": 1, "generation": 1, "holder": "x", "state": "held", "renewedAt": 1.0}).encode(),
    json.dumps({"v": 1, "generation": 1, "holder": "x", "state": "held", "renewedAt": 1.0,
                "leaseS": 15.0, "extra": 1}).encode(),
    json.dumps({"v": 1, "generation": 0, "holder": "x", "state": "held", "renewedAt": 1.0,
                "leaseS": 15.0}).encode(),
    json.dumps({"v": 1, "generation": 1, "holder": "x", "state": "taken", "renewedAt": 1.0,
                "leaseS": 15.0}).encode(),
])
def test_decide_acquire_refuses_an_unreadable_row(stored):
    decision = decide_acquire((stored, 5), holder=ME, now=T0 + 1e6, lease=LEASE)
    assert isinstance(decision, Refuse) and decision.holder is None and decision.reclaim_at is None
    assert decision.reason.startswith("the plane claim row is unreadable (")
    assert "delete it once no auth service serves the space" in decision.reason


# -- renew, fence, release ------------------------------------------------------------------------


def test_decide_renew_moves_renewed_at_only():
    held = mine(4, T0)
    assert decide_renew(held, now=T0 + 5.0, lease=LEASE) == mine(4, T0 + 5.0)


def test_decide_renew_refuses_a_released_row():
    with pytest.raises(ValueError, match="only a held claim"):
        decide_renew(release(mine(4, T0)), now=T0, lease=LEASE)


FENCE_TABLE = [
    # (now - last_renewed_at, lease, fence?)
    (0.0, LEASE, False),
    (5.0, LEASE, False),          # one renewal period: normal renewal time
    (12.999, LEASE, False),
    (13.0, LEASE, True),          # exactly lease - margin
    (14.0, LEASE, True),
    (1.19, Lease(1.5, 0.3), False),
    (1.2, Lease(1.5, 0.3), True),
    (15.0, Lease(15.0, 0.0), True),
]


@pytest.mark.parametrize(("elapsed", "lease", "fence"), FENCE_TABLE)
def test_must_fence(elapsed, lease, fence):
    assert must_fence(100.0, now=100.0 + elapsed, lease=lease) is fence


def test_fence_comes_before_any_reclaim():
    # The first time a contender may reclaim is after the holder's fence point, by the margin.
    last = T0
    first_reclaim = next(
        T0 + step / 100 for step in range(3000)
        if isinstance(decide_acquire((row(holder=OTHER, at=last), 1), holder=ME, now=T0 + step / 100,
                                     lease=LEASE), Acquire)
    )
    first_fence = next(T0 + step / 100 for step in range(3000)
                       if must_fence(last, now=T0 + step / 100, lease=LEASE))
    assert (first_fence, first_reclaim) == (T0 + 13.0, T0 + 15.0)


def test_release():
    assert release(mine(4, T0)) == row(gen=4, holder=ME, state=PlaneState.RELEASED)


# -- Lease ----------------------------------------------------------------------------------------


def test_lease_defaults():
    lease = Lease()
    assert (lease.lease_s, lease.margin_s, lease.renew_every_s, lease.fence_after_s) == (
        15.0, 2.0, 5.0, 13.0
    )


@pytest.mark.parametrize(("lease_s", "margin_s"), [
    (0.0, 0.0), (-1.0, 0.0), (float("inf"), 1.0), (15.0, -0.1), (15.0, 10.0), (15.0, 20.0),
    (True, 0.0),
])
def test_lease_rejects(lease_s, margin_s):
    with pytest.raises(ConfigError):
        Lease(lease_s, margin_s)


# -- row codec ------------------------------------------------------------------------------------


def test_render_row_exact_and_round_trip():
    held = row(gen=2, holder="h:1:ab", at=T0 + 0.25)
    data = render_row(held)
    assert data == (
        b'{"v":1,"generation":2,"holder":"h:1:ab","state":"held",'
        b'"renewedAt":1767225600.25,"leaseS":15.0}'
    )
    assert parse_row(data) == held
    assert parse_row(render_row(release(held))).state is PlaneState.RELEASED


def test_parse_row_accepts_integer_times():
    data = b'{"v":1,"generation":1,"holder":"h","state":"released","renewedAt":5,"leaseS":15}'
    assert parse_row(data) == row(gen=1, holder="h", state=PlaneState.RELEASED, at=5.0)


GOOD = {"v": 1, "generation": 1, "holder": "h", "state": "held", "renewedAt": 1.0, "leaseS": 15.0}


@pytest.mark.parametrize(("data", "match"), [
    (b"\xff", "not UTF-8 JSON"),
    (b"{", "not UTF-8 JSON"),
    (b'"x"', "not a JSON object"),
    (json.dumps({**GOOD, "v": 2}).encode(), "version 2"),
    (json.dumps({**GOOD, "v": True}).encode(), "version True"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "holder"}).encode(), "missing \\['holder'\\]"),
    (json.dumps({**GOOD, "x": 1}).encode(), "unknown \\['x'\\]"),
    (json.dumps({**GOOD, "state": ["held"]}).encode(), "state must be"),
    (json.dumps({**GOOD, "generation": True}).encode(), "out of range"),
    (json.dumps({**GOOD, "generation": 1.0}).encode(), "out of range"),
    (json.dumps({**GOOD, "holder": ""}).encode(), "out of range"),
    (json.dumps({**GOOD, "holder": "a\nb"}).encode(), "out of range"),
    (json.dumps({**GOOD, "renewedAt": "1"}).encode(), "renewedAt must be"),
    (json.dumps({**GOOD, "leaseS": 0}).encode(), "out of range"),
    (b'{"v":1,"generation":1,"holder":"h","state":"held","renewedAt":NaN,"leaseS":15}', "NaN"),
    (b'{"v":1,"v":1,"generation":1,"holder":"h","state":"held","renewedAt":1,"leaseS":15}',
     "'v' twice"),
])
def test_parse_row_rejects(data, match):
    with pytest.raises(CodecError, match=match):
        parse_row(data)


def test_plane_bucket():
    assert plane_bucket("alpha") == "cotal_auth_alpha"
