"""The event schema's pure builders and the watch view's fold (issue 7 items 1-2; docs/events.md).

Sync tables (STYLE.md practice 24): a record or a sequence of events in, exact values out.
"""

from __future__ import annotations

import json

import pytest

from cotal_trio.core.callout_log import CalloutRecord, Outcome, Step
from cotal_trio.core.events import (
    SLOW_CONSUMER_CODE,
    SeqFilter,
    SpaceView,
    WatchModel,
    callout_event,
    exchange_event,
    hello_event,
    lane_event,
    limit_of,
    manifest_applied,
    manifest_refused,
    nearest_rank,
    slow_consumer_reason,
    stamped,
    view_for,
)
from cotal_trio.core.limits import Limit, Limited

SPACE = "alpha"
REQ = "UCEXAMPLEUSERNKEY"
TIMES = {Step.QUEUE: 0.0004, Step.VERIFY: 0.0012, Step.LEDGER: 0.0021, Step.POLICY: 0.0002, Step.SIGN: 0.0009}
MS = {"queueMs": 0, "verifyMs": 1, "ledgerMs": 2, "policyMs": 0, "signMs": 1, "totalMs": 5}
BASE = {"type": "callout", "space": SPACE, "req": REQ, "cid": 7, **MS}
LIMITED = Limited(limit=Limit.ACTOR, retry_after_s=3, per_minute=60, owner="u_abc", actor="cli").reason()
HOST_LIMITED = Limited(limit=Limit.HOST, retry_after_s=1, per_minute=60, host="10.0.0.9").reason()


def _record(outcome: Outcome, **fields: object) -> CalloutRecord:
    record = CalloutRecord(space=SPACE, req=REQ, cid=7, outcome=outcome, **fields)
    for step, seconds in TIMES.items():
        record.add(step, seconds)
    return record


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (_record(Outcome.MINTED, owner="u_abc", actor="cli"),
         {**BASE, "outcome": "minted", "owner": "u_abc", "actor": "cli", "limited": False}),
        (_record(Outcome.DENIED, reason="no token - exchange a bearer first"),
         {**BASE, "outcome": "denied", "owner": "-", "actor": "-", "limited": False,
          "reason": "no token - exchange a bearer first"}),
        (_record(Outcome.DENIED, owner="u_abc", actor="cli", reason=LIMITED),
         {**BASE, "outcome": "denied", "owner": "u_abc", "actor": "cli", "limited": True, "limit": "actor",
          "reason": LIMITED}),
        (_record(Outcome.DENIED, reason=HOST_LIMITED),
         {**BASE, "outcome": "denied", "owner": "-", "actor": "-", "limited": True, "limit": "host",
          "reason": HOST_LIMITED}),
        (_record(Outcome.TIMEOUT, at=Step.LEDGER),
         {**BASE, "outcome": "timeout", "owner": "-", "actor": "-", "limited": False, "step": "ledger"}),
        (_record(Outcome.TIMEOUT),
         {**BASE, "outcome": "timeout", "owner": "-", "actor": "-", "limited": False, "step": "queue"}),
        (_record(Outcome.SHED, waited_s=1.0304, ahead=40),
         {**BASE, "outcome": "shed", "owner": "-", "actor": "-", "limited": False, "waitedMs": 1030, "ahead": 40}),
    ],
    ids=["minted", "denied", "limited-actor", "limited-host", "timeout-ledger", "timeout-queue", "shed"],
)
def test_callout_event_has_the_log_lines_fields(record, expected):
    event = callout_event(record)
    assert event == expected
    assert json.loads(json.dumps(event)) == expected  # plain JSON values only


def test_limit_of_reads_only_the_limit_reason_format():
    assert limit_of(LIMITED) == "actor"
    assert limit_of(Limited(limit=Limit.OWNER, retry_after_s=9, per_minute=600, owner="u_a", actor="b").reason()) == "owner"
    assert limit_of("an actor named RATE_LIMITED retry-after 3s limit=actor: is not a limit") is None
    assert limit_of(None) is None


def test_lane_manifest_exchange_and_stamp():
    assert lane_event(SPACE, "retrying", "broker gone") == {
        "type": "lane", "space": SPACE, "state": "retrying", "reason": "broker gone"}
    with pytest.raises(ValueError, match="'sleeping' is not a lane event state"):
        lane_event(SPACE, "sleeping")
    assert manifest_applied(sha256="ab" * 32, spaces=["b", "a"], added=["b"], removed=[], changed=("a",)) == {
        "type": "manifest", "space": None, "outcome": "applied", "sha256": "ab" * 32, "spaces": ["a", "b"],
        "added": ["b"], "removed": [], "changed": ["a"]}
    assert manifest_refused("version must be 2") == {
        "type": "manifest", "space": None, "outcome": "refused", "reason": "version must be 2"}
    assert exchange_event(SPACE, arm="human", face="public", status=429) == {
        "type": "exchange", "space": SPACE, "arm": "human", "face": "public", "status": 429}
    with pytest.raises(ValueError, match="'side' is not an exchange face"):
        exchange_event(SPACE, arm="human", face="side", status=200)
    assert list(stamped({"type": "lane", "space": "a"}, seq=3, at=1.5)) == ["seq", "at", "type", "space"]
    assert (SLOW_CONSUMER_CODE, slow_consumer_reason(1024)) == (
        1008, "slow consumer: more than 1024 events behind - reconnect")


@pytest.mark.parametrize(
    ("event", "space", "shown"),
    [
        ({"type": "callout", "space": "alpha"}, "alpha", {"type": "callout", "space": "alpha"}),
        ({"type": "callout", "space": "beta"}, "alpha", None),
        ({"type": "exchange", "space": "beta"}, "alpha", None),
        ({"type": "manifest", "space": None}, "alpha", {"type": "manifest", "space": None}),
        # Found by the fresh-user check: a lane that cannot start has no face of its own, so the
        # other faces carry its reason (every face's capability is the root holder's)
        ({"type": "lane", "space": "beta", "state": "retrying", "reason": "x"}, "alpha",
         {"type": "lane", "space": "beta", "state": "retrying", "reason": "x"}),
        ({"type": "lane", "space": "alpha", "state": "retrying", "reason": "x"}, "alpha",
         {"type": "lane", "space": "alpha", "state": "retrying", "reason": "x"}),
        ({"type": "callout", "space": "beta"}, None, {"type": "callout", "space": "beta"}),
    ],
)
def test_view_for_streams_own_space_host_events_and_every_lane_state(event, space, shown):
    assert view_for(event, space) == shown


def test_hello_shows_every_lane_with_its_reason():
    lanes = {"beta": {"state": "retrying", "reason": "no pin"}, "alpha": {"state": "serving", "reason": None}}
    assert hello_event("alpha", lanes, seq=41, at=2.0) == {
        "seq": 41, "at": 2.0, "type": "hello", "space": "alpha",
        "lanes": {"alpha": {"state": "serving", "reason": None}, "beta": {"state": "retrying", "reason": "no pin"}},
    }
    assert hello_event(None, lanes, seq=0, at=0.0)["lanes"]["beta"] == {"state": "retrying", "reason": "no pin"}


def test_nearest_rank():
    assert nearest_rank(range(1, 101), 50) == 50
    assert nearest_rank(range(1, 101), 99) == 99
    assert nearest_rank([7], 99) == 7
    assert nearest_rank([4, 1, 3, 2], 50) == 2
    assert nearest_rank([], 50) is None


def test_seq_filter_dedupes_per_process():
    seqs = SeqFilter()
    assert [seqs.fresh(100, 1), seqs.fresh(100, 2), seqs.fresh(100, 1), seqs.fresh(200, 1)] == [True, True, False, True]


def test_seq_filter_dedupes_the_faces_of_one_process():
    """A second face's hello may arrive after the first face already passed on later seqs: it
    is below the highest seen, yet the process did not restart (its other face is open)."""
    seqs = SeqFilter()
    seqs.opened(100)
    assert seqs.hello(100, 0) is False
    assert [seqs.fresh(100, seq) for seq in (1, 2, 3)] == [True, True, True]
    seqs.opened(100)  # connected when seq 2 was the last assigned; its hello comes after seq 3
    assert seqs.hello(100, 2) is False
    assert [seqs.fresh(100, 3), seqs.fresh(100, 4), seqs.fresh(100, 4)] == [False, True, False]
    seqs.closed(100)
    assert [seqs.fresh(100, 4), seqs.fresh(100, 5)] == [False, True]


def test_seq_filter_starts_a_restarted_process_afresh():
    """In a container the service is pid 1 on every start: its new hello is below the highest
    seq seen for pid 1, on pid 1's only open face, so pid 1's seqs count from the start again."""
    seqs = SeqFilter()
    seqs.opened(1)
    assert seqs.hello(1, 0) is False
    assert sum(seqs.fresh(1, seq) for seq in range(1, 101)) == 100
    seqs.closed(1)
    seqs.opened(1)
    assert seqs.hello(1, 0) is True
    assert sum(seqs.fresh(1, seq) for seq in range(1, 101)) == 100
    assert seqs.fresh(1, 100) is False
    seqs.closed(1)
    seqs.opened(1)  # restarted again, and 150 events assigned before the watcher reconnected
    assert seqs.hello(1, 150) is False  # not below the highest: every seq it will stream is new anyway
    assert [seqs.fresh(1, 151), seqs.fresh(1, 151)] == [True, False]


def _callout(at: float, outcome: str, total_ms: int, space: str = SPACE, **extra: object) -> dict:
    return {"seq": 0, "at": at, "type": "callout", "space": space, "outcome": outcome, "totalMs": total_ms, **extra}


def test_watch_model_numbers():
    """Rates over the last 10 s, nearest-rank p50/p99 over the last 60 s, limit denials since
    start, the last five denial reasons newest first; lane states from hello and lane events."""
    model = WatchModel()
    model.add(hello_event(SPACE, {SPACE: {"state": "starting", "reason": None}}, seq=0, at=0.0))
    model.connected(SPACE, True)
    model.add(lane_event(SPACE, "serving"))
    for i in range(100):  # t = 940.0 .. 989.5, totalMs 1..100: 19 inside the rate window (980, 990]
        model.add(_callout(940.0 + i / 2, "minted", i + 1))
    model.add(_callout(985.0, "denied", 3, reason="no token", limited=False))
    for i in range(6):
        model.add(_callout(986.0 + i / 10, "denied", 2, reason=f"RATE_LIMITED {i}", limited=True))
    model.add(_callout(900.0, "timeout", 1750))  # older than 60 s at now=990: forgotten
    [view] = model.views(990.0)
    assert view == SpaceView(
        space=SPACE, connected=True, state="serving", reason=None,
        rates={"minted": 1.9, "denied": 0.7, "timeout": 0.0, "shed": 0.0},
        p50_ms=47, p99_ms=99, limit_denials=6,
        denials=("RATE_LIMITED 5", "RATE_LIMITED 4", "RATE_LIMITED 3", "RATE_LIMITED 2", "RATE_LIMITED 1"),
    )
    # 107 totals in (930, 990]: 1, 2 x7, 3 x2, then v at rank v + 7: rank ceil(53.5) = 54 is 47,
    # rank ceil(105.93) = 106 is 99


def test_watch_model_only_shows_the_given_spaces_and_ignores_foreign_shapes():
    model = WatchModel(["alpha"], only=True)
    model.add(lane_event("beta", "serving"))
    model.add(_callout(1.0, "minted", 3, space="beta"))
    model.add({"type": "callout", "space": "alpha", "at": "soon", "outcome": "minted", "totalMs": 1})
    model.add({"type": "mystery", "space": "alpha"})
    [view] = model.views(2.0)
    assert (view.space, view.connected, view.state, view.p50_ms, view.rates["minted"]) == ("alpha", False, "unknown", None, 0.0)


def test_a_failing_event_never_fails_the_answer(caplog):
    """STYLE practice 10: a bug building an event loses that event, never the callout answer or
    the exchange answer (their metrics are still counted)."""
    from cotal_trio.lane.events import EventBus, callout_hook, exchange_hook

    counted: list[object] = []
    hook = callout_hook(counted.append, EventBus())
    hook(object())  # not a CalloutRecord: building its event fails
    assert len(counted) == 1 and "lost the event of one callout answer" in caplog.text

    class Broken:
        def publish(self, event):
            raise RuntimeError("a bus bug")

    exchange = exchange_hook(lambda arm, status: counted.append((arm, status)), Broken(), space="alpha", face="loopback")
    exchange("human", 200)
    assert counted[-1] == ("human", 200) and "lost the event of one exchange answer" in caplog.text
