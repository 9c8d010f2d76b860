"""Issue 4, "Tests": flood 200 connects at a stalled lane with ``maxInFlight`` 32, on a real nats-server.

Spec "Callout deadlines": a request's deadline is the broker's ``authorization { timeout }`` less
250 ms, counted from receipt; requests start oldest first, at most ``maxInFlight`` at a time;
while the oldest request still waiting for a slot has waited more than half the budget, a new
request gets the ``timeout:`` denial at once (``outcome=shed``), as it does once the queue would take
more than half the budget to drain at the observed rate (issue 14 item 2). Each answered request
logs one ``auth callout:`` line.

The stack is conftest's ``stack``: ``run_up`` with ``authorization { timeout: 2 }``, whose lane
runs the default ``CalloutLimits()``: a 1750 ms budget, ``max_in_flight`` 32, ``slow_ms`` 500, and
a ledger port reading in at most 32 worker threads (``read_in_threads``). Why 2 s and not the 1 s
of test_issuance_live: while the lane is stalled each request holds its slot until its deadline,
so a request waits ``budget - maxInFlight / rate`` for a slot at ``rate`` arrivals a second, and
the shed rule fires only above ``2 * maxInFlight / budget`` arrivals a second: 85/s with a 750 ms
budget, which a loaded 2-core machine does not always sustain, 37/s with 1750 ms.

How the lane stalls, for real: as in test_issuance_live, every row file the flood's principals
read is replaced by a FIFO, so a ledger read blocks in ``open()`` as on a hung disk. The first 32
requests take the 32 slots and the 32 ledger threads and block there; each is cancelled at its
deadline (``timeout at=ledger``) but its abandoned read keeps its thread, so every later request
waits for a thread until its own deadline. Connects arrive at up to 100 a second: the queue ages
past half the budget and new requests are shed. Once 33 requests timed out (so every read blocked
on a FIFO belongs to a request past its deadline, see :func:`unstall`) the rows are put back; the
threads come free and the requests still queued are minted, each inside its budget.

The clients run in a process of their own (``python -m tests.lane.test_flood_live``), as real
clients do: the lane's trio thread then runs the lane alone, so how late a deadline is delivered
is the lane's own doing, not 200 nats-py clients'.

Connect limits: the lane's are the spec's defaults (``run_up`` does not set them): 60 connects a
minute per actor, 600 per owner. The 200 connects are spread over eight principals (four owners
with two actors each), 25 connects each, so no bucket refuses one (no line is a denial).

Asserted, by the spec's rules: shed lines exist, each at ``level=warn`` with every slot taken
(``waited_ms`` past half the budget, or sooner by the drain-rate rule); every timeout names its step; no minted answer passes the
budget, no timeout denial passes it by more than :data:`LATE_MS`; lines plus dropped requests are
200; each client connected or got ``Authorization Violation``, none waited past the broker's
timeout plus a second, and only clients whose answer was a mint connected; at most 32 requests
were in progress (the lane's ``/metrics``), and the metrics count what the lines say; and no
issuance write cancelled by a deadline left a coroutine that was never awaited.

Not asserted: that every client with a minted line connected, or that the broker logged every
denial. The deadline counts from the lane's receipt, which lags the broker's send while the
lane's thread is busy; beside a CPU-heavy benchmark an answer inside the lane's deadline has
reached the broker after its own timeout (up to 4 of 128 denials in a run), and the broker then
refuses the client itself. The test prints how many.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import secrets
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.callout import TIMEOUT_REASON
from cotal_trio.core.errors import Unavailable
from cotal_trio.natsio import open_connection, open_loop
from cotal_trio.state import read_json

from tests.support.stack import SPACE, Stack, client
from tests.support.issuance import stall

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

LIMITS = CalloutLimits()  # what run_up gives the lane of a stack with the broker's 2 s timeout
AUTH_TIMEOUT_S = 2  # conftest's stack: authorization { timeout: 2 }
assert LIMITS.auth_timeout_s == AUTH_TIMEOUT_S
MAX_IN_FLIGHT = 32
assert LIMITS.max_in_flight == MAX_IN_FLIGHT
BUDGET_MS = 1750  # the timeout less the 250 ms margin
assert round(LIMITS.budget_s * 1000) == BUDGET_MS
HALF_BUDGET_MS = BUDGET_MS // 2  # 875: the shed threshold, exact in whole ms
SLOW_MS = LIMITS.slow_ms  # 500: a line past it logs at warn
# How far past the budget a timeout denial may leave, which log rounding (half a millisecond)
# does not cover. A deadline is a cancel scope: trio delivers it when the cancelled task next
# runs, after the scheduler pass in progress, and a request cancelled inside its issuance write
# waits one more pass for its asyncio task to end (``run_aio``). Right after the rows come back
# that pass is some sixty requests' reads, rows and signatures, and on a 2-core machine shared
# with other processes it stretches further. Measured on one: 15-125 ms late beside a CPU-heavy
# benchmark and two CPU-bound processes (and 200 ms once, in a trial with a 1 s timeout). The
# allowance is the spec's whole margin, 250 ms, there to absorb exactly this: a timeout line's
# total stays below the broker's timeout. A minted answer gets no allowance at all: the lane
# checks the deadline before it answers, so a minted line's total (a sum of steps rounded once)
# never passes the budget.
LATE_MS = 250

CONNECTS = 200
PRINCIPALS = tuple((f"user{n}", actor) for n in range(4) for actor in ("cli", "bot"))  # 25 connects each
PACE_S = 0.01  # one connect launched every 10 ms, on a fixed schedule: 200 over 2 s
HANG_S = AUTH_TIMEOUT_S + 1.0  # no client waits longer than the broker's timeout plus a second
CEILING_S = 20
REPO = Path(__file__).resolve().parents[2]  # the flood process runs ``-m tests.lane.test_flood_live`` from here

# The spec's line, field by field (spec "Callout deadlines"): the fixed fields in order, then the
# outcome's own suffix. Written here from the spec, not shared with the code under test.
STEPS = ("queue", "verify", "ledger", "policy", "sign")
LINE = re.compile(
    r"auth callout: level=(?P<level>info|warn) outcome=(?P<outcome>minted|denied|timeout|shed)"
    r" space=(?P<space>\S+) req=(?P<req>U[A-Z2-7]{55}) cid=(?P<cid>\d+)"
    r" owner=(?P<owner>\S+) actor=(?P<actor>\S+)"
    + "".join(rf" {step}_ms=(?P<{step}_ms>\d+)" for step in STEPS)
    + r" total_ms=(?P<total_ms>\d+)"
    r'(?: reason="(?P<reason>(?:[^"\\]|\\.)*)"'
    r"| at=(?P<at>queue|verify|ledger|policy|sign)"
    r"| waited_ms=(?P<waited_ms>\d+) ahead=(?P<ahead>\d+))?"
)
SUFFIX = {"minted": set(), "denied": {"reason"}, "timeout": {"at"}, "shed": {"waited_ms", "ahead"}}
INTS = {"cid", "total_ms", "waited_ms", "ahead", *(f"{step}_ms" for step in STEPS)}


def parse(text: str, levelno: int) -> dict:
    """One ``auth callout:`` line's fields (ints as ints); the record's level must match ``level=``."""
    match = LINE.fullmatch(text)
    assert match is not None, f"not the spec's line: {text!r}"
    fields = {k: v for k, v in match.groupdict().items() if v is not None}
    assert set(fields) & {"reason", "at", "waited_ms", "ahead"} == SUFFIX[fields["outcome"]], text
    assert levelno == (logging.WARNING if fields["level"] == "warn" else logging.INFO), text
    return {k: int(v) if k in INTS else v for k, v in fields.items()}


class Lines:
    """The lane's ``cotal.callout`` lines, parsed as they arrive (caplog's list only grows)."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self._caplog, self._seen = caplog, 0
        self.answered: list[dict] = []
        self.dropped: list[str] = []

    def read(self) -> int:
        """Parse the records since the last call; return how many requests have a line."""
        records = self._caplog.records
        for record in records[self._seen:]:
            text = record.getMessage()
            if record.name != "cotal.callout" or not text.startswith("auth callout: level="):
                continue
            if "outcome=dropped" in text:
                self.dropped.append(text)
            else:
                self.answered.append(parse(text, record.levelno))
        self._seen = len(records)
        return len(self.answered) + len(self.dropped)

    def count(self, outcome: str) -> int:
        return sum(line["outcome"] == outcome for line in self.answered)


# -- the stall ------------------------------------------------------------------------------------


def unstall(path: Path, data: bytes) -> None:
    """Undo :func:`~tests.support.issuance.stall`: put the row file back, then end every
    read blocked on the FIFO with end of file.

    Unlike tests/support/issuance.py's ``release`` (one reader, handed the row), many reads block on
    each FIFO here, so none is handed the row: opening a writer first wakes the reads blocked in
    ``open()``, which then wait for data; the row file replaces the FIFO, so a read that starts
    from now on reads the row; closing the writer gives the blocked reads end of file. The
    blocked reads are the first 32 requests' (they took every ledger thread, and no thread came
    free since) and the test calls this only once a 33rd request timed out, so each of them is
    past its deadline and abandoned: what they read is dropped. (A request inside its budget that
    read end of file would be denied for a corrupt row: the test would see a ``denied`` line.)
    """
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)  # never blocks; wakes the reads blocked in open()
    try:
        back = path.with_name(path.name + ".back")
        back.write_bytes(data)
        os.chmod(back, 0o600)
        os.replace(back, path)
    finally:
        os.close(fd)


async def unstall_after_33_timeouts(lines: Lines, rows: dict[Path, bytes]) -> None:
    """Put the rows back once a 33rd request timed out (see :func:`unstall`)."""
    lines.read()
    while lines.count("timeout") <= MAX_IN_FLIGHT:  # noqa: ASYNC110 - log records have no event
        await trio.sleep(0.01)
        lines.read()
    for path in list(rows):
        unstall(path, rows.pop(path))


# -- the clients (in a process of their own) ------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """One client's connect: ``connected`` (with its broker client id), ``refused`` (with the
    broker's text), ``hung`` (no verdict within ``HANG_S``) or ``failed`` (anything else)."""

    kind: str
    seconds: float
    cid: int | None = None
    error: str = ""


def _refusal(exc: BaseException) -> str | None:
    """The broker's refusal text when every leaf of ``exc`` is one, else None."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for inner in e.exceptions:
                walk(inner)
        else:
            leaves.append(e)

    walk(exc)
    # A callout's denial and the broker's own timeout refusal both reach the client as
    # Authorization Violation; nats-py may instead see the broker hang up (natsio pitfall P5).
    if leaves and all(
        isinstance(e, Unavailable) and ("Authorization Violation" in str(e) or "did not confirm CONNECT" in str(e))
        for e in leaves
    ):
        return " | ".join(sorted({str(e) for e in leaves}))
    return None


async def connect_once(server_url: str, creds: str, bearer: str, results: list[Result]) -> None:
    """One user-mode client with a fresh nonce, as conftest's ``client`` (on the flood's loop)."""
    nonce = "ibx" + secrets.token_hex(8)
    start = trio.current_time()
    try:
        with trio.fail_after(HANG_S):
            async with open_connection(
                server_url, creds=creds, token=bearer, name=nonce, inbox_prefix=f"_INBOX_{nonce}", reconnect=False,
            ) as conn:
                await conn.flush()
                cid, seconds = conn.client_id, trio.current_time() - start
        results.append(Result("connected", seconds, cid=cid))
    except trio.TooSlowError:
        results.append(Result("hung", trio.current_time() - start))
    except Exception as exc:  # noqa: BLE001 - a refusal, or the test fails naming it
        why = _refusal(exc)
        results.append(Result("refused" if why else "failed", trio.current_time() - start, error=why or repr(exc)))


async def flood(server_url: str, creds: str, bearers: list[str]) -> list[Result]:
    """``CONNECTS`` clients, one launched every ``PACE_S`` on a fixed schedule (no drift under load)."""
    results: list[Result] = []
    async with open_loop(), trio.open_nursery() as clients:
        start = trio.current_time()
        for n in range(CONNECTS):
            await trio.sleep_until(start + n * PACE_S)
            clients.start_soon(connect_once, server_url, creds, bearers[n % len(bearers)], results)
    return results


def _flood_process() -> None:
    """``python -m tests.lane.test_flood_live``: :func:`flood` with the JSON job on stdin
    (``serverUrl``, ``creds``, ``bearers``); each client's :class:`Result` as JSON on stdout."""
    job = json.load(sys.stdin)
    results = trio.run(flood, job["serverUrl"], job["creds"], job["bearers"])
    json.dump([dataclasses.asdict(result) for result in results], sys.stdout)


async def run_flood(stack: Stack, bearers: list[str]) -> list[Result]:
    """:func:`flood` in a process of its own (bounded by the caller's deadline)."""
    job = {"serverUrl": stack.info.server_url, "creds": stack.sentinel_creds(), "bearers": bearers}
    done = await trio.run_process(
        [sys.executable, "-m", __name__], stdin=json.dumps(job).encode(), capture_stdout=True,
        capture_stderr=True, cwd=str(REPO), check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return [Result(**fields) for fields in json.loads(done.stdout)]


# -- the lane's metrics ---------------------------------------------------------------------------


def _scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """``GET <url>/metrics`` (the loopback face, no capability): ``{(name, labels): value}``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        body = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def _series(name: str, **labels: str) -> tuple[str, frozenset]:
    return name, frozenset({"space": SPACE, **labels}.items())


async def watch_in_flight(url: str, seen: list[float]) -> None:
    """Scrape the lane's in-flight gauge every 50 ms until cancelled."""
    while True:
        samples = await trio.to_thread.run_sync(_scrape, url)
        seen.append(samples[_series("cotal_callout_in_flight")])
        await trio.sleep(0.05)


# -- the test -------------------------------------------------------------------------------------


async def test_a_flood_at_a_stalled_lane_sheds_and_answers_nothing_late(stack, caplog, recwarn):
    caplog.set_level(logging.INFO, logger="cotal.callout")
    url = read_json(stack.space_paths.auth_service_json)["url"]
    bearers, paths = [], []
    with trio.fail_after(CEILING_S):
        for sub, actor in PRINCIPALS:
            row = stack.grant(sub, actor)
            bearers.append(await stack.bearer(sub, actor))
            paths.append(stack.space_paths.actors_dir / f"{row.owner}.{actor}.json")
    lines = Lines(caplog)
    in_flight: list[float] = []
    rows = {path: stall(path) for path in paths}
    try:
        with trio.fail_after(CEILING_S):
            async with trio.open_nursery() as tasks:
                tasks.start_soon(watch_in_flight, url, in_flight)
                tasks.start_soon(unstall_after_33_timeouts, lines, rows)
                results = await run_flood(stack, bearers)
                tasks.cancel_scope.cancel()
    finally:
        for path in list(rows):  # the flood never got to 33 timeouts: free the blocked threads all the same
            unstall(path, rows.pop(path))
    with trio.fail_after(CEILING_S):
        # Every connect has its line (the clients have their verdicts; a line follows its answer
        # at once, a broker's own timeout could come first); then the lane's counts at rest.
        while lines.read() < CONNECTS:  # noqa: ASYNC110
            await trio.sleep(0.05)
        await trio.sleep(0.2)
        lines.read()
        flood_lines, dropped = list(lines.answered), list(lines.dropped)
        samples = await trio.to_thread.run_sync(_scrape, url)
        # The lane recovered: a fresh connect is minted.
        async with client(stack, bearers[0]) as conn:
            await conn.flush()
        lines.read()
    # The broker logs a callout's denial only while it still waits for the answer.
    broker_log = stack.paths.broker_log.read_text()
    broker_denials = broker_log.count(f"Auth callout service returned an error: {TIMEOUT_REASON}")
    outcomes = Counter(line["outcome"] for line in flood_lines)
    kinds = Counter(result.kind for result in results)
    sheds = [line for line in flood_lines if line["outcome"] == "shed"]
    timeouts = [line for line in flood_lines if line["outcome"] == "timeout"]
    minted = [line for line in flood_lines if line["outcome"] == "minted"]
    connected = {result.cid for result in results if result.kind == "connected"}
    print(  # the run's shape, for a report (pytest -n0 -s)
        f"\noutcomes {dict(outcomes)} clients {dict(kinds)} max in flight {max(in_flight, default=None)}"
        f" timeouts at {dict(Counter(line['at'] for line in timeouts))}"
        f" max total_ms: minted {max((line['total_ms'] for line in minted), default=None)}"
        f" timeout {max((line['total_ms'] for line in timeouts), default=None)}"
        f" shed {max((line['total_ms'] for line in sheds), default=None)}"
        f" shed waited_ms {min((line['waited_ms'] for line in sheds), default=None)}.."
        f"{max((line['waited_ms'] for line in sheds), default=None)}"
        f" ahead >= {min((line['ahead'] for line in sheds), default=None)}"
        f" slowest client {max(result.seconds for result in results):.3f}s"
        f" denials the broker logged {broker_denials}, minted too late for it {len(minted) - len(connected)}"
    )

    # Every connect reached the lane once and was answered: nothing dropped (every request came
    # from the broker, sealed) and nothing denied (valid bearers, no connect limit reached).
    assert len(flood_lines) + len(dropped) == CONNECTS
    assert dropped == []
    assert set(outcomes) <= {"minted", "timeout", "shed"}, outcomes
    assert len({line["req"] for line in flood_lines}) == CONNECTS  # one line per connect
    assert {line["space"] for line in flood_lines} == {SPACE}

    # Shed lines appear only while every slot was taken: once the oldest waiter passed half the
    # budget (waited_ms is that wait rounded to whole ms, so "more than 875 ms" reads as at least
    # 875), or earlier, once a new request would wait more than half the budget for a slot at the
    # rate answers left (issue 14 item 2; here the stalled requests leave at their deadlines,
    # about as fast as they came). ahead counts the queued requests and those in progress.
    assert sheds, f"nothing was shed: {dict(outcomes)}"
    for line in sheds:
        assert line["level"] == "warn", line
        assert MAX_IN_FLIGHT <= line["ahead"] <= CONNECTS, line
        assert (line["owner"], line["actor"]) == ("-", "-"), line  # answered before the bearer check

    # The stall timed out the first 32 requests and at least one more; each names its step.
    assert len(timeouts) > MAX_IN_FLIGHT
    for line in timeouts:
        assert line["level"] == "warn" and line["at"] in STEPS, line

    # No answer after any deadline: a mint only inside the budget; a timeout denial as soon as
    # the lane ran again (LATE_MS); a shed at once.
    assert [line for line in minted if line["total_ms"] > BUDGET_MS] == []
    late = [line for line in flood_lines if line["total_ms"] > BUDGET_MS + LATE_MS]
    assert late == [], f"{len(late)} answers past the {BUDGET_MS} ms budget, e.g. {late[:3]}"
    assert all(line["total_ms"] < HALF_BUDGET_MS for line in sheds)
    for line in flood_lines:
        slow = line["total_ms"] > SLOW_MS or line["outcome"] in ("timeout", "shed")
        assert line["level"] == ("warn" if slow else "info"), line

    # The clients: each connected or was refused (by the lane's denial, or by the broker's own
    # timeout), none hung, and none connected without a minted answer.
    assert [r for r in results if r.kind not in ("connected", "refused")] == []
    assert len(results) == CONNECTS
    assert max(result.seconds for result in results) < HANG_S
    assert connected <= {line["cid"] for line in minted}
    assert broker_denials <= len(timeouts) + len(sheds) <= kinds["refused"]

    # At most maxInFlight in progress at once, and the stall filled every slot.
    assert max(in_flight) == MAX_IN_FLIGHT
    # The lane's metrics count what its lines say, with nothing left queued or in progress.
    assert {o: samples[_series("cotal_callout_answers_total", outcome=o)] for o in SUFFIX} == {
        o: outcomes[o] for o in SUFFIX
    }
    assert samples[_series("cotal_callout_dropped_total")] == 0
    assert (samples[_series("cotal_callout_in_flight")], samples[_series("cotal_callout_queue_depth")]) == (0, 0)
    # The lane recovered from the stall: the connect after the flood was minted.
    assert [line["outcome"] for line in lines.answered[len(flood_lines):]] == ["minted"]
    # Deadlines cancel issuance writes in flight; a cancelled write leaves no coroutine behind
    # that was created and never run (Python warns when it collects one). recwarn records every
    # warning, so the module's ResourceWarning rule is checked here too.
    assert [
        f"{w.category.__name__}: {w.message}" for w in recwarn
        if issubclass(w.category, ResourceWarning) or "was never awaited" in str(w.message)
    ] == []


if __name__ == "__main__":
    _flood_process()
