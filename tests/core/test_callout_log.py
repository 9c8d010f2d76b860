"""The callout's log lines, golden, exactly as spec "Callout deadlines" gives the format.

Core tests are sync tables (STYLE.md practice 24): a :class:`CalloutRecord` in, the exact line
out. :func:`parse_callout_line` reads every field back, so an operator's parser for the spec's
format also works on what we write; the responder's virtual-time tests use it too.
"""

from __future__ import annotations


import pytest

from cotal_trio.core.callout_log import (
    CalloutRecord,
    Outcome,
    Step,
    format_callout_line,
    format_dropped_line,
)
from tests.support.callout_log import parse_callout_line, parse_dropped_line

SPACE = "alpha"
REQ = "UCEXAMPLEUSERNKEY"
CID = 42
OWNER = "o4kxm2"
ACTOR = "cli"
SLOW_MS = 500


def _record(outcome=Outcome.MINTED, *, ms=(0, 1, 2, 0, 1), **changes) -> CalloutRecord:
    record = CalloutRecord(space=SPACE, req=REQ, cid=CID, owner=OWNER, actor=ACTOR, outcome=outcome)
    for step, millis in zip((Step.QUEUE, Step.VERIFY, Step.LEDGER, Step.POLICY, Step.SIGN), ms, strict=True):
        record.add(step, millis / 1000)
    for name, value in changes.items():
        setattr(record, name, value)
    return record


HEAD = f"space={SPACE} req={REQ} cid={CID} owner={OWNER} actor={ACTOR}"
SPEC_MS = "queue_ms=0 verify_ms=1 ledger_ms=2 policy_ms=0 sign_ms=1 total_ms=4"

GOLDEN = [
    (
        "minted, the spec's own example",
        _record(),
        f"auth callout: level=info outcome=minted {HEAD} {SPEC_MS}",
    ),
    (
        "denied adds the reason, quoted",
        _record(Outcome.DENIED, reason="bearer expired - exchange a fresh one"),
        f'auth callout: level=info outcome=denied {HEAD} {SPEC_MS} reason="bearer expired - exchange a fresh one"',
    ),
    (
        "denied escapes quotes and backslashes, folds a newline",
        _record(Outcome.DENIED, reason='row "a\\b" is\ncorrupt'),
        f'auth callout: level=info outcome=denied {HEAD} {SPEC_MS} reason="row \\"a\\\\b\\" is corrupt"',
    ),
    (
        "timeout adds the step it was in, and warns however fast",
        _record(Outcome.TIMEOUT, at=Step.LEDGER),
        f"auth callout: level=warn outcome=timeout {HEAD} {SPEC_MS} at=ledger",
    ),
    (
        "timeout before any step names the queue",
        _record(Outcome.TIMEOUT, ms=(1125, 0, 0, 0, 0)),
        f"auth callout: level=warn outcome=timeout {HEAD} queue_ms=1125 verify_ms=0 ledger_ms=0"
        " policy_ms=0 sign_ms=0 total_ms=1125 at=queue",
    ),
    (
        "shed adds how long the oldest waited and how many are ahead, and warns",
        _record(Outcome.SHED, ms=(0, 0, 0, 0, 0), waited_s=0.625, ahead=3),
        f"auth callout: level=warn outcome=shed {HEAD} queue_ms=0 verify_ms=0 ledger_ms=0"
        " policy_ms=0 sign_ms=0 total_ms=0 waited_ms=625 ahead=3",
    ),
    (
        "a bearer that did not verify leaves owner and actor as -",
        CalloutRecord(space=SPACE, req=REQ, cid=CID, outcome=Outcome.DENIED, reason="no user token presented"),
        f"auth callout: level=info outcome=denied space={SPACE} req={REQ} cid={CID} owner=- actor=-"
        ' queue_ms=0 verify_ms=0 ledger_ms=0 policy_ms=0 sign_ms=0 total_ms=0 reason="no user token presented"',
    ),
]


@pytest.mark.parametrize(("name", "record", "line"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_lines(name, record, line):
    assert format_callout_line(record, slow_ms=SLOW_MS) == line


@pytest.mark.parametrize(("name", "record", "line"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_parser_reads_every_field_back(name, record, line):
    fields = parse_callout_line(format_callout_line(record, slow_ms=SLOW_MS))
    durations = {f"{step}_ms": round(record.durations_s.get(step, 0.0) * 1000) for step in Step}
    expected = {
        "level": "warn" if record.outcome in (Outcome.TIMEOUT, Outcome.SHED) else "info",
        "outcome": str(record.outcome), "space": record.space, "req": record.req, "cid": record.cid,
        "owner": record.owner, "actor": record.actor, **durations, "total_ms": sum(durations.values()),
    }
    if record.outcome is Outcome.DENIED:
        expected["reason"] = record.reason.replace("\n", " ")
    elif record.outcome is Outcome.TIMEOUT:
        expected["at"] = str(record.at or Step.QUEUE)
    elif record.outcome is Outcome.SHED:
        expected |= {"waited_ms": round(record.waited_s * 1000), "ahead": record.ahead}
    assert fields == expected


LEVELS = [
    # (outcome, queue_ms, slow_ms, level): warn only when total_ms > slow_ms, or timeout/shed.
    (Outcome.MINTED, 500, 500, "info"),
    (Outcome.MINTED, 501, 500, "warn"),
    (Outcome.DENIED, 500, 500, "info"),
    (Outcome.DENIED, 501, 500, "warn"),
    (Outcome.MINTED, 0, 0, "info"),
    (Outcome.MINTED, 1, 0, "warn"),
    (Outcome.MINTED, 2000, 5000, "info"),
    (Outcome.TIMEOUT, 0, 500, "warn"),
    (Outcome.SHED, 0, 500, "warn"),
]


@pytest.mark.parametrize(("outcome", "queue_ms", "slow_ms", "level"), LEVELS)
def test_level_is_warn_above_slow_ms_or_for_timeout_and_shed(outcome, queue_ms, slow_ms, level):
    record = _record(outcome, ms=(queue_ms, 0, 0, 0, 0), reason="r")
    fields = parse_callout_line(format_callout_line(record, slow_ms=slow_ms))
    assert (fields["level"], fields["total_ms"]) == (level, queue_ms)


def test_steps_add_up_and_render_whole_milliseconds():
    record = CalloutRecord(space=SPACE, req=REQ, cid=CID)
    record.add(Step.LEDGER, 0.25)
    record.add(Step.LEDGER, 0.125)
    record.add(Step.SIGN, 0.03125)
    assert record.total_s() == 0.40625
    fields = parse_callout_line(format_callout_line(record, slow_ms=SLOW_MS))
    assert (fields["ledger_ms"], fields["sign_ms"], fields["total_ms"]) == (375, 31, 406)


DROPPED = [
    ("unsealed request (no Nats-Server-Xkey header)",
     'auth callout: level=warn outcome=dropped space=alpha reason="unsealed request (no Nats-Server-Xkey header)"'),
    ('a "quoted" \\ reason\nsplit',
     'auth callout: level=warn outcome=dropped space=alpha reason="a \\"quoted\\" \\\\ reason split"'),
]


@pytest.mark.parametrize(("reason", "line"), DROPPED)
def test_dropped_line(reason, line):
    assert format_dropped_line(SPACE, reason) == line
    assert parse_dropped_line(line) == {"space": SPACE, "reason": reason.replace("\n", " ")}


def test_every_kind_of_line_break_in_a_reason_keeps_one_line():
    record = CalloutRecord(space="s", req="U", cid=1, outcome=Outcome.DENIED, reason="a\rb\u2028c\nd")
    line = format_callout_line(record, slow_ms=500)
    assert len(line.splitlines()) == 1 and line.endswith('reason="a b c d"')
