"""CalloutResponder admission and deadlines on fake NATS messages and virtual time.

Spec "Callout deadlines": a request's deadline is the broker timeout less 250 ms, counted from
receipt; a request still unanswered then gets the signed ``timeout:`` denial; a new request is
shed at once while the oldest waiting request has waited more than half that budget; requests
start oldest first, at most ``max_in_flight`` at a time.

How time passes here, honestly. The responder's decision path is synchronous: a worker takes a
request and runs it to its answer without yielding, unless it is cancelled. The queue can still
age in two ways that both happen in production, and both are driven by ``autojump_clock``:

* Nothing takes requests yet. ``on_message`` runs (the subscription callback) before the worker
  pool is started, then the test sleeps, then starts ``run``. Any time the workers are slower to
  get the CPU than messages arrive looks like this.
* A step blocks the thread. The fake ledger port models a step that holds trio's thread with
  ``MockClock.jump(seconds)``: the read returns ``seconds`` later in virtual time, and meanwhile
  no other task (no worker, no callback) ran. Requests queued behind it age by exactly that.
  (In a lane the ledger read itself runs in a worker thread, ``read_in_threads``; verifying and
  signing do hold the thread.)

Every mint also writes its issuance row into an in-memory bucket (``FakeBucket``, instant
unless a test gives it latency) and then reads the ledger again. That re-check read is instant
and counted apart (``Lane.rechecks``): ``ledger_s`` and ``ledger_reads`` are each request's
first read.

What cannot be observed: more than one request in progress at once. Since a request never
yields between its steps, ``in_flight`` is 1 whenever any port is called, whatever
``max_in_flight`` is, so these tests use ``max_in_flight=1`` and check order, not parallelism.

The limits are chosen so that every time is exact in binary floating point: auth timeout
1.25 s, so the budget is 1.0 s and shedding starts past 0.5 s of waiting.
"""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from cotal_trio.core import natsjwt
from cotal_trio.core.admission import SKEW_WINDOW
from cotal_trio.core.callout import SERVER_XKEY_HEADER, TIMEOUT_REASON
from cotal_trio.core.errors import Unavailable
from cotal_trio.core.issuance import IssuanceRow, exists_reason, render_row, store_missing_reason, write_failed_reason
from cotal_trio.core.limits import ConnectLimiter, ConnectLimits
from cotal_trio.lane.callout.responder import CALLOUT_SUBJECT, QUEUE_CAPACITY
from cotal_trio.lane.callout.responder import CALLOUT_SUBJECT, QUEUE_CAPACITY
from cotal_trio.stores.issuance import AuthBucketMissing, RowExpiries, prune_rows
from cotal_trio.natsio import Message
from tests.support.callout_requests import (
    KEYS,
    NOW,
    OWNER,
    SERVER,
    SERVER_X,
    SPACE,
    UID,
    VERIFIER,
    _claims,
    _row,
    _sealed,
    signed_with,
)
from tests.support.callout_log import parse_dropped_line
from tests.support.kv_fakes import FakeBucket
from tests.support.responder import BEARER, CEILING_S, LIMITS, Lane, _answer, _lines, _message, _user

BUDGET_S = 1.0
assert LIMITS.budget_s == BUDGET_S
NO_TOKEN_REASON = "no user token presented (auth_token empty) - connect with a bearer from the exchange"
UNSEALED_REASON = "unsealed request (no Nats-Server-Xkey header)"


def _timings(lines: list[dict]) -> list[tuple]:
    keys = ("cid", "outcome", "level", "queue_ms", "ledger_ms", "total_ms")
    return [tuple(line[k] for k in keys) for line in lines]


def _dropped(caplog) -> list[dict]:
    return [parse_dropped_line(r.getMessage()) for r in caplog.records if "outcome=dropped" in r.getMessage()]


@pytest.fixture(autouse=True)
def _capture(caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")


async def test_a_burst_is_answered_oldest_first(nursery, autojump_clock, caplog):
    """Five requests at t=0, each ledger read blocking 125 ms: answered in arrival order, each
    waiting exactly as long as the ones ahead of it took."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, ledger_s=0.125)
        await nursery.start(lane.responder.run)
        for cid in range(1, 6):
            lane.responder.on_message(_message(cid))
        await lane.wait_published(5)
        assert trio.current_time() == 0.625
    assert lane.answers() == [(f"_INBOX.r.{cid}", "jwt", cid * 0.125) for cid in range(1, 6)]
    assert [t for t, _ in lane.ledger_reads] == [0.0, 0.125, 0.25, 0.375, 0.5]
    assert [(s.waiting, s.in_flight) for _, s in lane.ledger_reads] == [(4, 1), (3, 1), (2, 1), (1, 1), (0, 1)]
    assert _timings(_lines(caplog)) == [
        (1, "minted", "info", 0, 125, 125),
        (2, "minted", "info", 125, 125, 250),
        (3, "minted", "info", 250, 125, 375),
        (4, "minted", "info", 375, 125, 500),  # exactly slow_ms: still info
        (5, "minted", "warn", 500, 125, 625),  # past slow_ms
    ]
    assert lane.wall_reads == 5  # the wall clock is read once per request
    user = natsjwt.verify(_answer(lane.published[0][1])["nats"]["jwt"])
    assert (user["sub"], user["iat"]) == (_user(1), NOW)


async def test_a_queue_behind_a_slow_ledger_read_times_out(nursery, autojump_clock, caplog):
    """A, B, C at t=0; each ledger read blocks 500 ms; budget 1.0 s.

    A is minted at 0.5. B starts at 0.5 and its read ends at 1.0, its deadline: it gets the
    timeout denial. C starts at 1.0, already at its deadline, and stops before its first step,
    so it never reads the ledger.
    """
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, ledger_s=0.5)
        await nursery.start(lane.responder.run)
        for cid in (1, 2, 3):
            lane.responder.on_message(_message(cid))
        await lane.wait_published(3)
        assert trio.current_time() == 1.0
    assert lane.answers() == [
        ("_INBOX.r.1", "jwt", 0.5),
        ("_INBOX.r.2", TIMEOUT_REASON, 1.0),
        ("_INBOX.r.3", TIMEOUT_REASON, 1.0),
    ]
    assert [t for t, _ in lane.ledger_reads] == [0.0, 0.5]
    lines = _lines(caplog)
    assert _timings(lines) == [
        (1, "minted", "info", 0, 500, 500),
        (2, "timeout", "warn", 500, 500, 1000),
        (3, "timeout", "warn", 1000, 0, 1000),
    ]
    assert lines[2]["at"] == "queue"
    assert lane.responder.statistics().answered == {"minted": 1, "denied": 0, "timeout": 2, "shed": 0}


async def test_a_deadline_passing_inside_a_step_stops_the_request_at_its_next_step(nursery, autojump_clock, caplog):
    """One request whose ledger read blocks 1.125 s, past its 1.0 s deadline. Spec: its work
    stops at its next step and the line names the step it was in, ``at=ledger``. It stopped
    before its issuance row: none was sent."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, ledger_s=1.125)
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))
        await lane.wait_published(1)
    assert lane.answers() == [("_INBOX.r.1", TIMEOUT_REASON, 1.125)]
    assert lane.store.events == [] and lane.store.held() == {}
    [line] = _lines(caplog)
    assert _timings([line]) == [(1, "timeout", "warn", 0, 1125, 1125)]
    assert line["at"] == "ledger"


async def test_requests_that_waited_out_the_budget_in_the_queue_get_the_timeout_denial(
    nursery, autojump_clock, caplog
):
    """A and B at t=0, C at 0.125, D at 0.25; the workers start at 1.125.

    A and B waited 1.125 s and C exactly the 1.0 s budget: each gets the signed timeout denial
    with ``at=queue`` and no ledger read. D waited 0.875 s, inside its budget, and is minted.
    """
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        for cid, at in ((1, 0.0), (2, 0.0), (3, 0.125), (4, 0.25)):
            await trio.sleep_until(at)
            lane.responder.on_message(_message(cid))
        await trio.sleep_until(1.125)
        assert lane.published == []
        await nursery.start(lane.responder.run)
        await lane.wait_published(4)
        assert trio.current_time() == 1.125
    assert lane.answers() == [
        ("_INBOX.r.1", TIMEOUT_REASON, 1.125),
        ("_INBOX.r.2", TIMEOUT_REASON, 1.125),
        ("_INBOX.r.3", TIMEOUT_REASON, 1.125),
        ("_INBOX.r.4", "jwt", 1.125),
    ]
    assert [t for t, _ in lane.ledger_reads] == [1.125]
    lines = _lines(caplog)
    assert [(line["cid"], line["outcome"], line["level"], line["queue_ms"], line["total_ms"], line.get("at"))
            for line in lines] == [
        (1, "timeout", "warn", 1125, 1125, "queue"),
        (2, "timeout", "warn", 1125, 1125, "queue"),
        (3, "timeout", "warn", 1000, 1000, "queue"),
        (4, "minted", "warn", 875, 875, None),
    ]
    assert [_answer(p)["sub"] for _, p, _ in lane.published] == [_user(cid) for cid in (1, 2, 3, 4)]


async def test_the_deadline_is_kept_while_workers_are_stuck(nursery, autojump_clock, caplog):
    """Spec "Callout deadlines": past its deadline a request gets the timeout denial, and
    nothing after it. A at t=0 takes the one worker, whose ledger read then waits 1.5 s deaf to
    cancellation; B arrives at 0.125 and C at 0.25, queued behind it. Each is answered at its
    own deadline (1.0, 1.125, 1.25), A with ``at=ledger``, B and C with ``at=queue``, not when
    the worker comes back at 1.5; the worker then sends nothing for A."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, stuck_s=1.5)
        await nursery.start(lane.responder.run)
        for cid, at in ((1, 0.0), (2, 0.125), (3, 0.25)):
            await trio.sleep_until(at)
            lane.responder.on_message(_message(cid))
        await lane.wait_published(3)
        assert trio.current_time() == 1.25
        await trio.sleep(2)
        stats = lane.responder.statistics()
    assert lane.answers() == [
        ("_INBOX.r.1", TIMEOUT_REASON, 1.0),
        ("_INBOX.r.2", TIMEOUT_REASON, 1.125),
        ("_INBOX.r.3", TIMEOUT_REASON, 1.25),
    ]
    assert [t for t, _ in lane.ledger_reads] == [0.0]  # B and C never started
    lines = _lines(caplog)
    assert [(line["cid"], line["outcome"], line["at"], line["queue_ms"], line["total_ms"]) for line in lines] == [
        (1, "timeout", "ledger", 0, 1000),
        (2, "timeout", "queue", 1000, 1000),
        (3, "timeout", "queue", 1000, 1000),
    ]
    assert (stats.answered, stats.waiting, stats.in_flight) == (
        {"minted": 0, "denied": 0, "timeout": 3, "shed": 0}, 0, 0,
    )
    assert lane.store.events == []


async def test_the_deadline_keeper_wakes_early_by_the_lag_it_saw(nursery, autojump_clock, caplog):
    """A at t=0 holds the one worker (its read deaf to cancellation until 1.5); B arrives at 0.5.
    From 0.96875 something holds trio's thread for 0.0625 s, so the keeper, due at 1.0 for A,
    runs at 1.03125: A's denial is 31.25 ms late. The keeper keeps that lag as its lead (halving
    every 10 s from its next wake on) and wakes for B 31.25 ms early, so B's denial leaves
    before B's deadline instead of after it."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, stuck_s=1.5)
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))

        async def hog() -> None:
            await trio.sleep_until(0.96875)
            autojump_clock.jump(0.0625)  # holds the thread: no other task runs meanwhile

        nursery.start_soon(hog)
        await trio.sleep_until(0.5)
        lane.responder.on_message(_message(2))
        await lane.wait_published(2)
    [(reply_a, answer_a, at_a), (reply_b, answer_b, at_b)] = lane.answers()
    assert (reply_a, answer_a, at_a) == ("_INBOX.r.1", TIMEOUT_REASON, 1.03125)
    assert (reply_b, answer_b) == ("_INBOX.r.2", TIMEOUT_REASON)
    assert at_b == 1.5 - 0.03125  # early by the lag it saw


async def test_a_request_answered_early_by_the_keeper_stops_before_its_row(nursery, autojump_clock, caplog):
    """The keeper's lead makes its denial leave a little before the deadline; the request's
    work must stop then, not at the deadline. A (read deaf to cancellation until 1.5) plus a
    31.25 ms hog teach the keeper a 31.25 ms lead. C arrives at 2.0 (deadline 3.0); its read
    would return at 2.99, inside the deadline. The keeper denies C at 2.96875 and cancels its
    worker there: no issuance row is written for a connect already refused."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, waits=[(1.5, True), (0.99, False)])
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))

        async def hog() -> None:
            await trio.sleep_until(0.96875)
            autojump_clock.jump(0.0625)

        nursery.start_soon(hog)
        await trio.sleep_until(2.0)
        lane.responder.on_message(_message(3))
        await lane.wait_published(2)
        await trio.sleep(2)
    assert lane.answers() == [("_INBOX.r.1", TIMEOUT_REASON, 1.03125), ("_INBOX.r.3", TIMEOUT_REASON, 2.96875)]
    assert lane.store.events == [] and lane.rechecks == []
    assert lane.responder.statistics().in_flight == 0


async def test_a_backlog_of_past_deadlines_teaches_the_keeper_no_lead(nursery, autojump_clock, caplog):
    """Requests whose deadlines passed before the workers and the keeper started (A, B at 0,
    started at 1.125) are expired at once; that is a backlog, not a late wake-up, and must not
    become a lead. D, at 2.0 with its read deaf to cancellation until 3.5, is denied exactly at
    its deadline, 3.0."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, waits=[(1.5, True)])
        lane.responder.on_message(_message(1))
        lane.responder.on_message(_message(2))
        await trio.sleep_until(1.125)
        await nursery.start(lane.responder.run)
        await lane.wait_published(2)
        await trio.sleep_until(2.0)
        lane.responder.on_message(_message(4))
        await lane.wait_published(3)
    assert lane.answers() == [
        ("_INBOX.r.1", TIMEOUT_REASON, 1.125), ("_INBOX.r.2", TIMEOUT_REASON, 1.125), ("_INBOX.r.4", TIMEOUT_REASON, 3.0),
    ]


async def test_the_keeper_wakes_early_by_the_pass_it_will_run(nursery, autojump_clock, caplog):
    """Each timeout denial costs 1 ms here (the publish moves the clock). 50 requests queued at 0
    behind a stuck worker are all due at 1.0: that pass runs 1.0 to 1.051 and teaches the cost.
    50 more at 2.0, due at 3.0: the keeper starts their pass 50 ms early, so every denial leaves
    by its deadline (before: 3.0 to 3.05, the last 49 after it)."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, waits=[(5.0, True)])
        publish = lane.responder._publish

        def costly(reply: str, payload: bytes) -> None:
            publish(reply, payload)
            autojump_clock.jump(0.001)

        lane.responder._publish = costly
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))  # holds the one worker until 5.0, deaf to cancellation
        await trio.sleep(0)
        for cid in range(2, 51):
            lane.responder.on_message(_message(cid))
        await lane.wait_published(50)
        await trio.sleep_until(2.0)
        for cid in range(51, 101):
            lane.responder.on_message(_message(cid))
        await lane.wait_published(100)
    second = [at for reply, answer, at in lane.answers()[50:]]
    assert {answer for _, answer, _ in lane.answers()} == {TIMEOUT_REASON}
    assert max(second) <= 3.0
    assert min(second) >= 3.0 - 0.1  # early by the pass, no more than KEEPER_MAX_LEAD_S


async def test_the_drain_estimate_learns_from_every_request_that_leaves(nursery, autojump_clock, caplog):
    """Requests answered at the queue (spent: read past their deadline) free the worker as a mint
    does: each is one answer the drain estimate counts (it counted only full worker answers)."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, ledger_s=0.125)
        lane.responder.on_message(_message(1))
        lane.responder.on_message(_message(2))
        await trio.sleep_until(1.125)  # both past their deadline before any worker runs
        await nursery.start(lane.responder.run)
        await lane.wait_published(2)
    assert [answer for _, answer, _ in lane.answers()] == [TIMEOUT_REASON, TIMEOUT_REASON]
    assert lane.responder._drain.seconds_per_answer == 0.0


async def test_a_row_withdrawal_does_not_hold_the_worker(nursery, autojump_clock, caplog):
    """One worker. A's issuance row is created at 0 and lands at 1.5, past A's 1.0 deadline, and
    every delete takes 0.75 s, so withdrawing A's row ends at 2.5. B, queued at 0.75 without a
    bearer, is answered at 1.0, right after A's timeout denial (inside its own 1.75 deadline),
    not at 2.5 after the withdrawal: that runs in a task of its own."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, store=FakeBucket(latency_s={"create": 1.5, "delete": 0.75}))
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))
        await trio.sleep_until(0.75)
        lane.responder.on_message(_message(2, token=None))
        await lane.wait_published(2)
        assert trio.current_time() == 1.0
        await trio.sleep(5)
    key = f"natkey.{OWNER}.cli.{_user(1)}"
    assert lane.answers() == [("_INBOX.r.1", TIMEOUT_REASON, 1.0), ("_INBOX.r.2", NO_TOKEN_REASON, 1.0)]
    assert lane.store.events == [
        (1.5, "create", key, "stored"), (1.75, "delete", key, "refused at 0"), (2.5, "delete", key, "marker at 1"),
    ]
    assert lane.store.held() == {}


async def test_a_request_is_shed_at_once_while_the_oldest_waited_past_half_the_budget(
    nursery, autojump_clock, caplog
):
    """A at t=0 (nothing takes it). B at 0.25 and C at exactly 0.5 (half the budget, not more)
    are queued. D at 0.625 is answered inside ``on_message``, before anything else runs, with
    the timeout denial and a ``shed`` line: the oldest waited 625 ms, three are ahead."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        for cid, at in ((1, 0.0), (2, 0.25), (3, 0.5)):
            await trio.sleep_until(at)
            lane.responder.on_message(_message(cid))
            assert lane.published == []
        await trio.sleep_until(0.625)
        lane.responder.on_message(_message(4))
        assert lane.answers() == [("_INBOX.r.4", TIMEOUT_REASON, 0.625)]  # no checkpoint since the call
        assert lane.responder.statistics().waiting == 3
        [shed] = _lines(caplog)
        assert shed == {
            "level": "warn", "outcome": "shed", "space": SPACE, "req": _user(4), "cid": 4,
            "owner": "-", "actor": "-", "queue_ms": 0, "verify_ms": 0, "ledger_ms": 0, "policy_ms": 0,
            "sign_ms": 0, "total_ms": 0, "waited_ms": 625, "ahead": 3,
        }
        await nursery.start(lane.responder.run)
        await lane.wait_published(4)
        # Once the queue has drained, a new request is queued and answered again.
        lane.responder.on_message(_message(5))
        await lane.wait_published(5)
        assert trio.current_time() == 0.625
    assert [(reply, answer) for reply, answer, _ in lane.answers()[1:]] == [
        (f"_INBOX.r.{cid}", "jwt") for cid in (1, 2, 3, 5)
    ]
    assert [(line["cid"], line["outcome"], line["queue_ms"]) for line in _lines(caplog)[1:]] == [
        (1, "minted", 625), (2, "minted", 375), (3, "minted", 125), (5, "minted", 0),
    ]


async def test_a_full_channel_sheds(nursery, autojump_clock, caplog):
    """QUEUE_CAPACITY requests queued at t=0 fill the queue: the next one is shed although
    nobody has waited at all, and every queued one is still answered once workers run (one
    actor's connect limits raised to match, so every queued one is minted)."""
    with trio.fail_after(CEILING_S):
        roomy = ConnectLimits(actor_per_minute=QUEUE_CAPACITY, owner_per_minute=QUEUE_CAPACITY)
        lane = Lane(autojump_clock, connect_limits=ConnectLimiter(roomy))
        for cid in range(1000, 1000 + QUEUE_CAPACITY):  # one user key each, as the broker makes them
            lane.responder.on_message(_message(cid))
        assert lane.published == []
        lane.responder.on_message(_message(2))
        assert lane.answers() == [("_INBOX.r.2", TIMEOUT_REASON, 0.0)]
        [shed] = _lines(caplog)
        assert (shed["cid"], shed["outcome"], shed["waited_ms"], shed["ahead"]) == (2, "shed", 0, QUEUE_CAPACITY)
        assert lane.responder.statistics().waiting == QUEUE_CAPACITY
        await nursery.start(lane.responder.run)
        await lane.wait_published(QUEUE_CAPACITY + 1)
        assert trio.current_time() == 0.0
    assert {answer for _, answer, _ in lane.answers()[1:]} == {"jwt"}
    stats = lane.responder.statistics()
    assert stats.answered == {"minted": QUEUE_CAPACITY, "denied": 0, "timeout": 0, "shed": 1}
    assert (stats.waiting, stats.in_flight, stats.dropped) == (0, 0, 0)


async def test_statistics_count_every_outcome(nursery, autojump_clock, caplog):
    """At t=0: A (good), B (no bearer), C (unsealed), E (good, its ledger read blocks 500 ms).
    At 0.625: D is shed, N (no reply subject) is shed unanswered, U (unsealed) is dropped.
    Then the workers run: A minted, B denied, C dropped, E times out at 1.125."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, ledger_s=[0.0, 0.5])
        responder = lane.responder
        assert responder.statistics().answered == {"minted": 0, "denied": 0, "timeout": 0, "shed": 0}
        for msg in (_message(1), _message(2, token=None), _message(3, sealed=False), _message(5)):
            responder.on_message(msg)
        await trio.sleep_until(0.625)
        for msg in (_message(4), _message(6, reply=None), _message(7, sealed=False)):
            responder.on_message(msg)
        stats = responder.statistics()
        assert stats.answered == {"minted": 0, "denied": 0, "timeout": 0, "shed": 1}
        assert (stats.dropped, stats.waiting, stats.in_flight) == (1, 4, 0)
        await nursery.start(responder.run)
        await lane.wait_published(4)
        assert trio.current_time() == 1.125
        await trio.sleep(1)  # E's worker, which the keeper's denial cut short, ends at its next step
    assert lane.answers() == [
        ("_INBOX.r.4", TIMEOUT_REASON, 0.625),
        ("_INBOX.r.1", "jwt", 0.625),
        ("_INBOX.r.2", NO_TOKEN_REASON, 0.625),
        ("_INBOX.r.5", TIMEOUT_REASON, 1.125),
    ]
    stats = responder.statistics()
    assert stats.answered == {"minted": 1, "denied": 1, "timeout": 1, "shed": 1}
    assert (stats.dropped, stats.waiting, stats.in_flight) == (2, 0, 0)
    lines = _lines(caplog)
    assert [(line["cid"], line["outcome"], line["level"], line["queue_ms"], line["total_ms"]) for line in lines] == [
        (4, "shed", "warn", 0, 0),
        (1, "minted", "warn", 625, 625),
        (2, "denied", "warn", 625, 625),
        (5, "timeout", "warn", 625, 1125),
    ]
    assert lines[2]["reason"] == NO_TOKEN_REASON
    assert _dropped(caplog) == [{"space": SPACE, "reason": UNSEALED_REASON}] * 2


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        (_message(1, sealed=False), UNSEALED_REASON),
        (Message(CALLOUT_SUBJECT, "_INBOX.r.1", natsjwt.encode(_claims(), SERVER, iat=NOW).encode(),
                 _sealed()[1]), "request is not a valid sealed authorization request: "),
    ],
    ids=["no xkey header", "not sealed"],
)
async def test_a_dropped_request_gets_no_answer_and_one_line(nursery, autojump_clock, caplog, msg, reason):
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        await nursery.start(lane.responder.run)
        lane.responder.on_message(msg)
        await trio.sleep(1)
    assert lane.published == [] and lane.ledger_reads == [] and _lines(caplog) == []
    [dropped] = _dropped(caplog)
    assert dropped["space"] == SPACE and dropped["reason"].startswith(reason)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    stats = lane.responder.statistics()
    assert (stats.dropped, stats.waiting, sum(stats.answered.values())) == (1, 0, 0)


async def test_a_request_without_a_reply_subject_is_not_answered(nursery, autojump_clock, caplog):
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1, reply=None))
        await trio.sleep(1)
        assert trio.current_time() == 1
    assert lane.published == [] and lane.ledger_reads == [] and caplog.records == []
    stats = lane.responder.statistics()
    assert (stats.dropped, stats.waiting, sum(stats.answered.values())) == (0, 0, 0)


async def test_a_broker_timeout_unlike_ours_is_warned_about_once(nursery, autojump_clock, caplog):
    """The broker stamps ``exp = iat + timeout``; 10 s against our 1.25 s is named, once."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        await nursery.start(lane.responder.run)
        for cid in (1, 2):
            lane.responder.on_message(_message(cid, broker_timeout_s=10))
        await lane.wait_published(2)
    warnings = [r.getMessage() for r in caplog.records if "authorization timeout is" in r.getMessage()]
    assert warnings == [
        f"auth callout: space={SPACE} the broker's authorization timeout is 10s but this auth "
        "service uses 1.25s - start it with --auth-timeout 10"
    ]
    assert [line["outcome"] for line in _lines(caplog)] == ["minted", "minted"]


async def test_each_distinct_broker_timeout_is_warned_about_so_a_hostile_one_hides_no_real_one(
    nursery, autojump_clock, caplog
):
    """One request stamped with a 10 s timeout, then the broker's real 4 s: both are named, once
    each (a single flag was used up by the first)."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        await nursery.start(lane.responder.run)
        for cid, timeout_s in ((1, 10), (2, 4), (3, 4), (4, 10)):
            lane.responder.on_message(_message(cid, broker_timeout_s=timeout_s))
        await lane.wait_published(4)
    warnings = [r.getMessage() for r in caplog.records if "authorization timeout is" in r.getMessage()]
    assert [w.split(" is ")[1].split("s ")[0] for w in warnings] == ["10", "4"]


# -- issuance rows (issue 4 items 1 and 6) ------------------------------------------------------

BEARER_EXP = VERIFIER.validate(BEARER, space=SPACE, now=NOW).exp
NOT_GRANTED = (
    f'actor "cli" is not granted in this space for owner {OWNER} - the mesh operator lets it in with'
    f" `cotal actor grant cli --owner {OWNER}`"
)


def _issued_row() -> bytes:
    """The row a mint of ``BEARER`` at wall ``NOW`` writes, in its stored bytes."""
    return render_row(IssuanceRow(
        space=SPACE, owner=OWNER, actor="cli", lifecycle_uid=UID, credential_id=None, view=None,
        iat=NOW, exp=BEARER_EXP,
    ))


async def test_a_mint_writes_its_issuance_row_first_then_rechecks_then_answers(nursery, autojump_clock, caplog):
    """The row's create takes 250 ms: the re-check reads the ledger once it has landed, and the
    answer follows. The row holds exactly the documented fields, with the minted JWT's iat/exp,
    and a TTL ending 5 s after exp."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, store=FakeBucket(latency_s={"create": 0.25}))
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))
        await lane.wait_published(1)
    key = f"natkey.{OWNER}.cli.{_user(1)}"
    assert lane.answers() == [("_INBOX.r.1", "jwt", 0.25)]
    assert (lane.store.events, lane.rechecks) == ([(0.25, "create", key, "stored")], [0.25])
    assert lane.store.live() == {key: _issued_row()}
    assert _issued_row() == (
        '{"ver":1,"space":"alpha","owner":"%s","actor":"cli","lifecycleUid":"%s","credentialId":null,'
        '"view":null,"iat":%d,"exp":%d}' % (OWNER, UID, NOW, BEARER_EXP)
    ).encode()
    user = natsjwt.verify(_answer(lane.published[0][1])["nats"]["jwt"])
    assert (user["sub"], user["iat"], user["exp"]) == (_user(1), NOW, BEARER_EXP)
    assert lane.store._messages[key].ttl_s == BEARER_EXP + 5 - NOW
    [line] = _lines(caplog)
    assert (line["outcome"], line["ledger_ms"], line["total_ms"]) == ("minted", 250, 250)


async def test_an_existing_row_is_a_signed_denial_and_stays(nursery, autojump_clock, caplog):
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        key = f"natkey.{OWNER}.cli.{_user(1)}"
        lane.store.put(key, b"an earlier answer's row")
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))
        await lane.wait_published(1)
    assert lane.answers() == [("_INBOX.r.1", exists_reason(_user(1)), 0.0)]
    assert lane.store.live() == {key: b"an earlier answer's row"}
    assert lane.rechecks == [] and [e[3] for e in lane.store.events] == ["refused"]
    [line] = _lines(caplog)
    assert (line["outcome"], line["reason"]) == ("denied", exists_reason(_user(1)))


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (AuthBucketMissing("bucket cotal_auth_alpha does not exist"), store_missing_reason(SPACE)),
        (Unavailable("publish x: nats: connection closed"), write_failed_reason(SPACE, "publish x: nats: connection closed")),
    ],
    ids=["no store (a replica before the full service ran)", "store down"],
)
async def test_a_failed_row_write_is_a_signed_denial(nursery, autojump_clock, caplog, error, reason):
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, store=FakeBucket(fail=error))
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))
        await lane.wait_published(1)
    assert lane.answers() == [("_INBOX.r.1", reason, 0.0)]
    assert lane.rechecks == []
    [line] = _lines(caplog)
    assert (line["outcome"], line["reason"]) == ("denied", reason)


async def test_a_deadline_during_the_row_write_is_a_timeout_and_leaves_no_row(nursery, autojump_clock, caplog):
    """Budget 1.0 s; the create is sent at 0 and lands at 1.5. The deadline cancels the request
    at 1.0: the timeout denial goes out then, with ``at=ledger``. The row lands at 1.5 all the
    same; the withdrawal's fence is ordered after it and refused, so the row is read back and
    deleted. Nothing is published after the denial, ever, and the key ends up holding nothing."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, store=FakeBucket(latency_s={"create": 1.5}))
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))
        await lane.wait_published(1)
        assert trio.current_time() == 1.0
        await trio.sleep(4)
        assert lane.store.held() == {}
        assert lane.responder.statistics().in_flight == 0
    key = f"natkey.{OWNER}.cli.{_user(1)}"
    assert lane.answers() == [("_INBOX.r.1", TIMEOUT_REASON, 1.0)]
    assert lane.store.events == [
        (1.5, "create", key, "stored"), (1.5, "delete", key, "refused at 0"), (1.5, "delete", key, "marker at 1"),
    ]
    assert lane.rechecks == []
    [line] = _lines(caplog)
    assert (line["outcome"], line["at"], line["ledger_ms"], line["total_ms"]) == ("timeout", "ledger", 1000, 1000)


@pytest.mark.parametrize(
    ("recheck", "reason"),
    [
        (lambda: (None, None), NOT_GRANTED),
        (lambda: (_row(lifecycle_uid="b" * 26), None),
         "the actor was re-granted or revoked since this bearer was issued - exchange a fresh bearer"),
    ],
    ids=["revoked", "re-granted"],
)
async def test_the_recheck_after_the_row_catches_a_revoke(nursery, autojump_clock, caplog, recheck, reason):
    """The first ledger read grants; the actor is revoked (or re-granted) before the re-check,
    which denies. The answer goes out at 0; the row is withdrawn after it (deletes take 0.5 s)."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, store=FakeBucket(latency_s={"delete": 0.5}))
        lane.recheck_rows = recheck
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))
        await lane.wait_published(1)
        await trio.sleep(5)
        assert lane.store.held() == {}
    key = f"natkey.{OWNER}.cli.{_user(1)}"
    assert lane.answers() == [("_INBOX.r.1", reason, 0.0)]
    assert lane.rechecks == [0.0]
    assert lane.store.events == [
        (0.0, "create", key, "stored"), (0.5, "delete", key, "refused at 0"), (1.0, "delete", key, "marker at 1"),
    ]
    [line] = _lines(caplog)
    assert (line["outcome"], line["reason"]) == ("denied", reason)


@pytest.mark.parametrize(
    ("recalled", "recheck", "first_reads", "answer"),
    [
        ((_row(), None), lambda: (_row(), None), 0, "jwt"),
        # stale: revoked since it was read; the real read after the row denies
        ((_row(), None), lambda: (None, None), 0, NOT_GRANTED),
        # stale the other way: re-granted since; it does not grant, so the ledger is read first
        ((_row(lifecycle_uid="b" * 26), None), lambda: (_row(), None), 1, "jwt"),
        ((None, None), lambda: (_row(), None), 1, "jwt"),
    ],
    ids=["grants", "revoked-since", "regranted-since", "not-granted-then"],
)
async def test_remembered_rows_skip_the_first_read_only_when_they_grant(
    nursery, autojump_clock, caplog, recalled, recheck, first_reads, answer
):
    """``recall_ledger``: rows remembered from an earlier read (possibly stale). When they grant,
    the first read is skipped and the decision is the real read's after the issuance row; when
    they do not, the ledger is read first as usual. Never a mint the real read would refuse."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, recall=recalled)
        lane.recheck_rows = recheck
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))
        await lane.wait_published(1)
        await trio.sleep(1)
    assert [reply_answer[:2] for reply_answer in lane.answers()] == [("_INBOX.r.1", answer)]
    assert (len(lane.ledger_reads), lane.rechecks) == (first_reads, [0.0])
    if answer != "jwt":
        assert lane.store.held() == {}  # the row was withdrawn


async def test_kept_rows_and_withdrawn_ones_are_noted_so_the_sweep_reads_neither(nursery, autojump_clock, caplog):
    """The sweep need not read the rows the callout kept: their expiry (the bearer's ``exp``) is
    noted. Nor the key of a row withdrawn after a re-check denial: it holds a marker that lives
    as long as the row would have. A sweep right after reads no key."""
    with trio.fail_after(CEILING_S):
        expiries = RowExpiries()
        lane = Lane(autojump_clock, row_expiries=expiries)
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))
        await lane.wait_published(1)
        lane.recheck_rows = lambda: (None, None)
        lane.responder.on_message(_message(2))
        await lane.wait_published(2)
        await trio.sleep(0.5)
        noted = (expiries.get(f"natkey.{OWNER}.cli.{_user(1)}"), expiries.get(f"natkey.{OWNER}.cli.{_user(2)}"))
        reads = []
        real_get = lane.store.get

        async def counting_get(key):
            reads.append(key)
            return await real_get(key)

        lane.store.get = counting_get
        assert await prune_rows(lane.store, now=NOW + 1, expiries=expiries) == 0
    bearer_exp = natsjwt.decode(BEARER).claims["exp"]
    assert [a[1] for a in lane.answers()] == ["jwt", NOT_GRANTED]
    assert noted == (bearer_exp, bearer_exp)
    assert reads == []

# -- the broker's deadline (issue 14 item 1) ----------------------------------------------------
#
# The wall clock is NOW + virtual time. The broker stamps iat and exp = iat + its timeout and gives
# up in [exp, exp + 1). A request 1.5 s or more past its iat on arrival is proven late: its deadline
# is the earlier of receipt + 1.0 and exp - 0.25. Where a test needs a late request with a live
# broker deadline it is stamped NOW - 2 by a broker with a 3 s timeout (exp NOW + 1: deadline 0.75).

GAVE_UP_REASON = "the broker's authorization timeout passed before the answer (cid {cid})"


async def test_a_request_read_after_the_broker_gave_up_costs_provenance_only(nursery, autojump_clock, caplog):
    """Stamped 3 s before it is read (a paused process, a stalled socket): exp passed a second
    ago, so the broker has surely given up. It is dropped with its line at provenance, before
    its bearer: no answer, no ledger read, no row. (A pin: this one was dropped before too.)"""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1, issued_at=NOW - 3))
        await trio.sleep(2)
    assert lane.published == [] and lane.ledger_reads == [] and lane.store.events == []
    assert _lines(caplog) == []
    assert _dropped(caplog) == [{"space": SPACE, "reason": "request expired before it was read"}]
    assert lane.responder.statistics().dropped == 1


@pytest.mark.parametrize(("arrives", "issued_at"), [(0.875, NOW - 1), (0.0, NOW - 2)], ids=["1.875 s old", "2 s old"])
async def test_a_request_whose_brokers_budget_is_spent_gets_the_timeout_denial_at_once(
    nursery, autojump_clock, caplog, arrives, issued_at
):
    """Proven late (1.5 s or more past its stamp) and read past exp - 0.25, though our own
    deadline (receipt + 1.0) is far off, while the broker may still wait (until exp + 1 at the
    latest): the signed timeout denial goes out at once, ``at=queue``, with no ledger read and
    no row. (It was minted before.)"""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        await nursery.start(lane.responder.run)
        await trio.sleep_until(arrives)
        lane.responder.on_message(_message(1, issued_at=issued_at))
        await lane.wait_published(1)
    assert lane.answers() == [("_INBOX.r.1", TIMEOUT_REASON, arrives)]
    assert lane.ledger_reads == [] and lane.store.events == []
    [line] = _lines(caplog)
    assert (line["outcome"], line["at"], line["queue_ms"], line["total_ms"]) == ("timeout", "queue", 0, 0)


async def test_a_fresh_request_late_in_its_stamps_second_is_counted_from_receipt(nursery, autojump_clock, caplog):
    """A broker with a 1 s timeout stamps NOW (exp NOW + 1) and sends at NOW + 0.875: its give-up
    is at NOW + 1.875, which the stamp cannot tell from NOW + 1. Read at once, the request is
    within the stamp's second, so its deadline counts from receipt and it is minted; taking exp
    as the give-up would have refused it (and a quarter of such a broker's fresh connects)."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, ledger_s=0.125)
        await nursery.start(lane.responder.run)
        await trio.sleep_until(0.875)
        lane.responder.on_message(_message(1, issued_at=NOW, broker_timeout_s=1))
        await lane.wait_published(1)
    assert lane.answers() == [("_INBOX.r.1", "jwt", 1.0)]


async def test_a_row_written_past_the_brokers_deadline_is_withdrawn_and_nothing_minted(nursery, autojump_clock, caplog):
    """Stamped NOW - 2 (exp NOW + 1), read at 0: the broker's deadline is 0.75, ours 1.0. The
    issuance row's create lands at 0.875, after it: the timeout denial goes out at 0.75 and the
    row is withdrawn. (Before, the mint went out at 0.875, inside our own budget but after the
    broker's.)"""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, store=FakeBucket(latency_s={"create": 0.875}))
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1, issued_at=NOW - 2, broker_timeout_s=3))
        await lane.wait_published(1)
        await trio.sleep(3)
    assert lane.answers() == [("_INBOX.r.1", TIMEOUT_REASON, 0.75)]
    assert lane.store.held() == {} and lane.rechecks == []
    [line] = _lines(caplog)
    assert (line["outcome"], line["at"]) == ("timeout", "ledger")


async def test_a_step_that_holds_the_thread_past_the_brokers_timeout_answers_nothing(nursery, autojump_clock, caplog):
    """Stamped NOW - 2 (exp NOW + 1): the broker gives up by 2.0 at the latest. The ledger read
    holds the thread until 2.125: no mint and no denial either (nobody waits for it), a dropped
    line, no row. (It was a timeout denial sent after the broker's timeout before.)"""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, ledger_s=2.125)
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1, issued_at=NOW - 2, broker_timeout_s=3))
        await trio.sleep(3)
    assert lane.published == [] and lane.store.events == []
    assert _lines(caplog) == []
    assert _dropped(caplog) == [{"space": SPACE, "reason": GAVE_UP_REASON.format(cid=1)}]


async def test_the_keeper_answers_a_stuck_request_at_the_brokers_deadline(nursery, autojump_clock, caplog):
    """Stamped NOW - 2 (exp NOW + 1), read at 0, its ledger read deaf to cancellation until 1.5:
    the keeper's timeout denial leaves at the broker's deadline, 0.75, not at ours, 1.0."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, stuck_s=1.5)
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1, issued_at=NOW - 2, broker_timeout_s=3))
        await lane.wait_published(1)
        await trio.sleep(2)
    assert lane.answers() == [("_INBOX.r.1", TIMEOUT_REASON, 0.75)]
    assert lane.store.events == []


async def test_a_broker_clock_ahead_of_ours_is_named_once_and_bounded(nursery, autojump_clock, caplog):
    """Requests stamped 3 s in our future, in SKEW_WINDOW + 2 distinct seconds: the skew is learned
    at the SKEW_WINDOW-th and named once; deadlines count at most 2 s of it, so they come from
    receipt here (exp + 1 - 0.25 - 2 is 3.75 s away) and all are minted."""
    with trio.fail_after(CEILING_S + SKEW_WINDOW + 2):  # a second apart
        lane = Lane(autojump_clock)
        await nursery.start(lane.responder.run)
        for cid in range(1, SKEW_WINDOW + 3):
            lane.responder.on_message(_message(cid, issued_at=NOW + int(trio.current_time()) + 3))
            await lane.wait_published(cid)
            await trio.sleep(1.0)
    warnings = [r.getMessage() for r in caplog.records if "stamped" in r.getMessage()]
    assert warnings == [
        f"auth callout: space={SPACE} requests arrive stamped 3.0s after this host's clock - the broker's clock "
        "and this host's differ; deadlines allow for at most 2.0s of it, so synchronise the clocks (NTP)"
    ]
    assert [line["outcome"] for line in _lines(caplog)] == ["minted"] * (SKEW_WINDOW + 2)


# -- goodput under overload (issue 14 item 2) ----------------------------------------------------


async def test_a_queue_the_budget_cannot_drain_sheds_before_anyone_waited(nursery, autojump_clock, caplog):
    """Each ledger read holds the thread 125 ms: answers leave every 0.125 s while busy (A and B
    teach it). Half the 1.0 s budget is 4 answers. C..G are queued at once (nobody has waited yet,
    and the one worker's slot is free, so C takes it): H would get a slot only after 5 answers,
    0.625 s, and is shed at once instead of queued to time out."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, ledger_s=0.125)
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))
        lane.responder.on_message(_message(2))
        await lane.wait_published(2)
        assert trio.current_time() == 0.25
        for cid in (3, 4, 5, 6, 7, 8):
            lane.responder.on_message(_message(cid))
        assert lane.answers()[2:] == [("_INBOX.r.8", TIMEOUT_REASON, 0.25)]
        await lane.wait_published(8)
    assert [answer for _, answer, _ in lane.answers()] == ["jwt", "jwt", TIMEOUT_REASON, *["jwt"] * 5]
    shed = [line for line in _lines(caplog) if line["outcome"] == "shed"]
    assert [(line["cid"], line["waited_ms"], line["ahead"]) for line in shed] == [(8, 0, 5)]


# -- requests that are absurd inside (issue 15 item 2) ------------------------------------------


def _raw_message(cid: int, claims_text: str | bytes) -> Message:
    """A request whose claims are ``claims_text`` verbatim, validly signed by the broker's key and
    sealed to the space's xkey: it passes every check before the JSON parser."""
    token = signed_with(SERVER, claims_text)
    return Message(CALLOUT_SUBJECT, f"_INBOX.r.{cid}", SERVER_X.seal(token.encode(), KEYS.xkey.public_key),
                   {SERVER_XKEY_HEADER: SERVER_X.public_key})


ABSURD = {
    "2,000 deep": '{"nats":' + "[" * 2000 + "]" * 2000 + "}",
    "100,000 deep, unclosed": '{"nats":' + "[" * 100_000,
    "a 5,000-digit number": '{"iat":' + "9" * 5000 + "}",
    "100,000 deep, closed (past the size bound)": '{"nats":' + "[" * 100_000 + "]" * 100_000 + "}",
}


@pytest.mark.parametrize("path", ["worker", "shed", "deadline keeper"])
async def test_absurd_requests_are_dropped_on_every_path_and_the_next_one_is_answered(
    nursery, autojump_clock, caplog, path
):
    """Each absurd request is decoded by a worker, by the shed path (on_message, while the oldest
    waited past half the budget) or by the deadline keeper (queued behind a stuck worker until
    its deadline). Before: RecursionError or ValueError escaped that task and took the lane's
    nursery down. Now each is a drop with its line and a good request right after is minted."""
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, waits=[(1.5, True)] if path != "worker" else None)
        await nursery.start(lane.responder.run)
        if path != "worker":
            lane.responder.on_message(_message(100))  # holds the one worker until 1.5
            await trio.sleep(0)
        if path == "shed":
            lane.responder.on_message(_message(101))  # waits in the queue
            await trio.sleep_until(0.625)
        for cid, text in enumerate(ABSURD.values(), start=1):
            lane.responder.on_message(_raw_message(cid, text))
        await trio.sleep_until(2.0)
        lane.responder.on_message(_message(9))
        await trio.sleep(1)
    assert [r for r, a, _ in lane.answers() if a == "jwt"][-1] == "_INBOX.r.9"
    assert {reply for reply, _, _ in lane.answers()}.isdisjoint({f"_INBOX.r.{cid}" for cid in (1, 2, 3, 4)})
    assert [d["reason"] for d in _dropped(caplog)] == [
        "request is not a valid sealed authorization request: the JWT claims nests deeper than 64",
        "request is not a valid sealed authorization request: the JWT claims nests deeper than 64",
        "request is not a valid sealed authorization request: a JWT number has more than 20 digits",
        "request is larger than 262144 bytes",
    ]


async def test_a_decode_failure_of_any_kind_is_a_drop(nursery, autojump_clock, caplog, monkeypatch):
    """Whatever a decoder might raise that no bound foresaw (here a MemoryError out of the JSON
    parser) is still this request's drop with a line, not the lane's end."""
    real_loads = natsjwt.json.loads

    def loads(text, **kwargs):
        if '"boom"' in text:
            raise MemoryError
        return real_loads(text, **kwargs)

    monkeypatch.setattr(natsjwt.json, "loads", loads)
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock)
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_raw_message(1, '{"boom":1}'))
        lane.responder.on_message(_message(2))
        await lane.wait_published(1)
    assert lane.answers() == [("_INBOX.r.2", "jwt", 0.0)]
    assert _dropped(caplog) == [{"space": SPACE, "reason": "request could not be decoded (MemoryError)"}]


async def test_a_backlog_that_expires_together_is_answered_in_one_pass(nursery, autojump_clock, caplog):
    """A at 0 holds the one worker (deaf to cancellation until 1.5); 200 more arrive at 0, all due
    at 1.0. A task watching from 1.0 on, once per scheduler pass, sees none or all of the 200
    denials, never a part: the keeper answers the whole backlog in one pass. (Before, one denial
    left per pass, so behind a busy thread the last went out long after its deadline.)"""
    seen: list[int] = []
    with trio.fail_after(CEILING_S):
        lane = Lane(autojump_clock, stuck_s=1.5)
        await nursery.start(lane.responder.run)
        lane.responder.on_message(_message(1))
        await trio.sleep(0)
        for cid in range(2, 202):
            lane.responder.on_message(_message(cid))

        async def watch() -> None:
            await trio.sleep_until(1.0)
            while len(lane.published) < 201:
                seen.append(len(lane.published))
                await trio.lowlevel.checkpoint()
            seen.append(len(lane.published))

        nursery.start_soon(watch)
        await lane.wait_published(201)
        assert trio.current_time() == 1.0
    assert set(seen) <= {0, 201}, sorted(set(seen))
    assert {answer for _, answer, _ in lane.answers()} == {TIMEOUT_REASON}
