"""One lane's metrics (cotal_trio/lane/metrics.py; issue 4 item 7), without a broker.

The exposition is parsed back with prometheus-client's own parser and every value asserted
exactly: the metrics object on its own, fed by a responder on fake messages and virtual time,
and served by the loopback face (no capability on ``GET /metrics``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from cotal_trio.core.callout_log import CalloutRecord, Outcome, Step
from cotal_trio.core.limits import ConnectLimiter, ConnectLimits, Limit, Limited
from cotal_trio.http import build_loopback_app
from cotal_trio.lane.callout.ports import AnswerPorts, ConnectPorts
from cotal_trio.lane.callout.responder import CalloutResponder, CalloutStatistics
from cotal_trio.lane.metrics import CALLOUT_SECONDS_BUCKETS, CONTENT_TYPE, LaneMetrics, MetricsSummary, read_summary

from tests.support.loopback import HEADERS, _context, _human_body, _post

from tests.support.kv_fakes import FakeBucket
from tests.support.callout_requests import KEYS, NOW, VERIFIER, _row
from tests.support.responder import LIMITS, _message

SPACE = "alpha"
OWNER = "u_" + "a" * 26
CEILING_S = 10


def samples(metrics: LaneMetrics) -> dict[tuple[str, frozenset], float]:
    """``{(sample name, labels): value}`` of the exposition, ``_created`` series left out."""
    body, content_type = metrics.exposition()
    assert content_type == CONTENT_TYPE
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if not s.name.endswith("_created")
    }


def key(name: str, **labels: str) -> tuple[str, frozenset]:
    return name, frozenset({"space": SPACE, **labels}.items())


def record(outcome: Outcome, **steps_s: float) -> CalloutRecord:
    done = CalloutRecord(space=SPACE, req="UREQ", cid=1, owner="u_owner", actor="cli", outcome=outcome)
    for step, seconds in steps_s.items():
        done.add(Step(step), seconds)
    return done


def histogram(counts_le: dict[float, int], count: int, total_s: float) -> dict[tuple[str, frozenset], float]:
    """The duration histogram's samples: cumulative bucket counts (unlisted bounds as the one below)."""
    series, running = {}, 0
    for bound in CALLOUT_SECONDS_BUCKETS:
        running = counts_le.get(bound, running)
        series[key("cotal_callout_duration_seconds_bucket", le=str(bound))] = running
    series[key("cotal_callout_duration_seconds_bucket", le="+Inf")] = count
    series[key("cotal_callout_duration_seconds_count")] = count
    series[key("cotal_callout_duration_seconds_sum")] = total_s
    return series


def at_rest() -> dict[tuple[str, frozenset], float]:
    """Every series of a fresh lane, all zero (no exchange answer has a series yet)."""
    return {
        **{key("cotal_callout_answers_total", outcome=str(o)): 0 for o in Outcome},
        **{key("cotal_connect_limit_denials_total", bucket=b): 0 for b in ("actor", "owner", "host")},
        **{key("cotal_connect_limit_buckets", bucket=b): 0 for b in ("actor", "owner", "host")},
        **histogram({}, 0, 0.0),
        key("cotal_callout_queue_depth"): 0, key("cotal_callout_in_flight"): 0, key("cotal_callout_dropped_total"): 0,
    }


def test_a_fresh_lane_exposes_every_series_at_zero():
    assert samples(LaneMetrics(SPACE)) == at_rest()


def test_every_counter_series_has_its_created_sample():
    """The operator guide: every counter exports ``_created`` (issue 18 item 8), the ones read at
    scrape time too (the drops and the connect-limit denials): the lane's start time, seconds."""
    metrics = LaneMetrics(SPACE, created=1_800_000_123.5)
    metrics.exchange_answered("human", 200)
    body, _ = metrics.exposition()
    families = list(text_string_to_metric_families(body.decode()))
    created = {(s.name, frozenset(s.labels.items())) for f in families for s in f.samples if s.name.endswith("_created")}
    totals = {(s.name.removesuffix("_total") + "_created", frozenset(s.labels.items()))
              for f in families if f.type == "counter" for s in f.samples if s.name.endswith("_total")}
    assert totals and created >= totals
    read_at_scrape = ("cotal_callout_dropped_created", "cotal_connect_limit_denials_created")
    scrape_time = {(s.name, s.labels.get("bucket")): s.value for f in families for s in f.samples if s.name in read_at_scrape}
    assert scrape_time == {
        ("cotal_callout_dropped_created", None): 1_800_000_123.5,
        **{("cotal_connect_limit_denials_created", bucket): 1_800_000_123.5 for bucket in ("actor", "owner", "host")},
    }


def test_answers_limits_exchanges_and_the_responder_gauges_read_back_exactly():
    metrics = LaneMetrics(SPACE)
    metrics.callout_answered(record(Outcome.MINTED, queue=0.001, verify=0.001, ledger=0.002))  # 4 ms
    metrics.callout_answered(record(Outcome.DENIED, verify=0.25))
    metrics.callout_answered(record(Outcome.TIMEOUT, queue=0.5, ledger=1.25))  # 1.75 s: the deadline
    metrics.callout_answered(record(Outcome.SHED, verify=0.0))
    metrics.exchange_answered("human", 200)
    metrics.exchange_answered("human", 200)
    metrics.exchange_answered("agent", 429)
    metrics.exchange_answered("none", 401)
    limiter = ConnectLimiter(ConnectLimits(actor_per_minute=1, host_per_minute=2))
    assert limiter.charge_principal(OWNER, "cli", 0.0) is None
    assert limiter.charge_principal(OWNER, "cli", 1.0).limit == "actor"
    assert limiter.charge_principal(OWNER, "cli", 2.0).limit == "actor"
    assert [limiter.charge_host("10.0.0.9", 0.0) for _ in range(3)][-1].limit == "host"
    metrics.watch(
        lambda: CalloutStatistics(answered={}, dropped=3, waiting=5, in_flight=2), limits=limiter.statistics,
    )
    assert samples(metrics) == {
        **at_rest(),
        **{key("cotal_callout_answers_total", outcome=str(o)): 1 for o in Outcome},
        **histogram({0.001: 1, 0.005: 2, 0.25: 3, 2.0: 4}, 4, 0.004 + 0.25 + 1.75 + 0.0),
        key("cotal_connect_limit_denials_total", bucket="actor"): 2,
        key("cotal_connect_limit_denials_total", bucket="host"): 1,
        key("cotal_connect_limit_buckets", bucket="actor"): 1,
        key("cotal_connect_limit_buckets", bucket="owner"): 1,
        key("cotal_connect_limit_buckets", bucket="host"): 1,
        key("cotal_exchange_answers_total", arm="human", status="200"): 2,
        key("cotal_exchange_answers_total", arm="agent", status="429"): 1,
        key("cotal_exchange_answers_total", arm="none", status="401"): 1,
        key("cotal_callout_queue_depth"): 5, key("cotal_callout_in_flight"): 2, key("cotal_callout_dropped_total"): 3,
    }


def test_the_exposition_names_no_principal():
    metrics = LaneMetrics(SPACE)
    metrics.callout_answered(record(Outcome.DENIED, verify=0.001))
    body, _ = metrics.exposition()
    assert b"u_owner" not in body and b"cli" not in body and b"UREQ" not in body


def test_a_re_added_lane_starts_from_zero_and_does_not_collide():
    first = LaneMetrics(SPACE)
    first.exchange_answered("agent", 200)
    second = LaneMetrics(SPACE)  # same space, same process: its own registry
    assert samples(second) == at_rest()
    assert samples(first)[key("cotal_exchange_answers_total", arm="agent", status="200")] == 1


@pytest.mark.parametrize(
    "call",
    [lambda m: m.exchange_answered("robot", 200), lambda m: m.exchange_answered("human", 42)],
    ids=["arm", "status"],
)
def test_a_label_outside_its_closed_set_is_a_caller_bug(call):
    with pytest.raises(ValueError):
        call(LaneMetrics(SPACE))


def test_read_summary_reads_its_own_space_only():
    alpha, beta = LaneMetrics(SPACE), LaneMetrics("beta")
    alpha.callout_answered(record(Outcome.MINTED))
    alpha.callout_answered(record(Outcome.MINTED))
    alpha.callout_answered(record(Outcome.SHED))
    alpha.watch(lambda: CalloutStatistics(answered={}, dropped=0, waiting=4, in_flight=1))
    beta.callout_answered(record(Outcome.DENIED))
    text = alpha.exposition()[0].decode() + beta.exposition()[0].decode()
    assert read_summary(alpha.exposition()[0].decode(), SPACE) == MetricsSummary(
        answers={"minted": 2, "denied": 0, "timeout": 0, "shed": 1}, in_flight=1, queue_depth=4,
    )
    assert read_summary(text, "gamma") == MetricsSummary()
    with pytest.raises(ValueError):
        read_summary("this is { not prometheus", SPACE)


async def test_a_responder_feeds_its_lanes_metrics(nursery, autojump_clock: trio.testing.MockClock):
    """A and B at t=0, C at 0.25; the workers start at 1.125 (budget 1.0 s). A and B waited
    1.125 s and time out; C waited 0.875 s and is minted. Queue and in-flight read live."""
    metrics = LaneMetrics(SPACE)
    seen: list[dict] = []

    async def read_ledger(owner: str, actor: str):
        seen.append(samples(metrics))
        return _row(), None

    answers: list[bytes] = []
    all_answered = trio.Event()

    def publish(reply: str, payload: bytes) -> None:
        answers.append(payload)
        if len(answers) == 3:
            all_answered.set()

    responder = CalloutResponder(
        AnswerPorts(keys=KEYS, limits=LIMITS, clock=lambda: NOW + trio.current_time(), publish=publish,
                    on_answer=metrics.callout_answered),
        ConnectPorts(verifier=VERIFIER, read_ledger=read_ledger, store=FakeBucket()),
    )  # fmt: skip
    metrics.watch(responder.statistics)
    with trio.fail_after(CEILING_S):
        for cid, at in ((1, 0.0), (2, 0.0), (3, 0.25)):
            await trio.sleep_until(at)
            responder.on_message(_message(cid))
        queued = samples(metrics)
        await trio.sleep_until(1.125)
        await nursery.start(responder.run)
        await all_answered.wait()
    assert (queued[key("cotal_callout_queue_depth")], queued[key("cotal_callout_in_flight")]) == (3, 0)
    assert (seen[0][key("cotal_callout_queue_depth")], seen[0][key("cotal_callout_in_flight")]) == (0, 1)
    assert samples(metrics) == at_rest() | {
        key("cotal_callout_answers_total", outcome="minted"): 1,
        key("cotal_callout_answers_total", outcome="timeout"): 2,
        **histogram({1.0: 1, 2.0: 3}, 3, 1.125 + 1.125 + 0.875),
    }


async def test_the_loopback_face_serves_metrics_without_a_capability():
    metrics = LaneMetrics(SPACE)
    metrics.callout_answered(record(Outcome.DENIED))
    client = build_loopback_app(_context(), metrics=metrics.exposition).test_client()
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE
    assert await response.get_data() == metrics.exposition()[0]
    assert (await client.post("/metrics")).status_code == 405
    plain = build_loopback_app(_context()).test_client()
    assert (await plain.get("/metrics")).status_code == 404


async def test_exchange_answers_of_the_loopback_face_reach_the_lane_metrics():
    metrics = LaneMetrics(SPACE)
    client = build_loopback_app(replace(_context(), metrics=metrics.exchange_answered)).test_client()
    await _post(client, _human_body())
    await _post(client, _human_body(actor="ghost"))
    await _post(client, _human_body(), {**HEADERS, "Origin": "https://evil.example"})
    limited = replace(_context(), metrics=metrics.exchange_answered, peek_limits=_actor_limited)
    status, _, _ = await _post(build_loopback_app(limited).test_client(), _human_body())
    assert status == 429
    counts = {k: v for k, v in samples(metrics).items() if k[0] == "cotal_exchange_answers_total"}
    assert counts == {
        key("cotal_exchange_answers_total", arm="human", status="200"): 1,
        key("cotal_exchange_answers_total", arm="human", status="401"): 1,
        key("cotal_exchange_answers_total", arm="none", status="403"): 1,
        key("cotal_exchange_answers_total", arm="human", status="429"): 1,
    }


def _actor_limited(owner: str, actor: str) -> Limited:
    return Limited(limit=Limit.ACTOR, retry_after_s=7, per_minute=60, owner=owner, actor=actor)
