"""Issue 15 item 11: the lane's self-probe (``lane/health.py``) and what ``GET /health`` says.

In process, no broker: the ledger port and the store connection are fakes that answer, fail or
hang on demand, and time is trio's virtual clock (``autojump_clock``), so the bounds are exact.
"""

from __future__ import annotations

import pytest
import trio
from quart_trio import QuartTrio

from cotal_trio.core.callout_log import CalloutRecord, Outcome, Step
from cotal_trio.core.errors import CodecError, Unavailable
from cotal_trio.http.errors import install_edge
from cotal_trio.lane import health
from cotal_trio.lane.health import PROBE_FAILURES, LaneHealth, LaneUnhealthy
from cotal_trio.stores.issuance import AuthBucketMissing
from cotal_trio.lane.faces import answer_health

BUDGET_S = 1.75


class Port:
    """A ledger port and an issuance store in one: ``mode`` None answers, "fail" raises, "hang"
    never answers, "store" and "no bucket" fail the store read."""

    def __init__(self) -> None:
        self.mode: str | None = None
        self.reads = 0

    async def read_ledger(self, owner: str, actor: str) -> tuple[None, None]:
        self.reads += 1
        if self.mode == "fail":
            raise CodecError(f"ledger row {owner}.{actor} is unreadable (Input/output error)")
        if self.mode == "hang":
            await trio.sleep_forever()
        return None, None

    async def get(self, key: str) -> None:
        if self.mode == "store":
            raise Unavailable("kv get cotal_auth_a natkey.cotal_probe: nats: connection closed")
        if self.mode == "no bucket":
            raise AuthBucketMissing("bucket cotal_auth_a does not exist")


def lane_health(port: Port) -> LaneHealth:
    return LaneHealth("a", read_ledger=port.read_ledger, store=port, budget_s=BUDGET_S)  # type: ignore[arg-type]


@pytest.mark.parametrize(("mode", "reason"), [
    (None, None),
    ("fail", "the ledger cannot be read (ledger row u_aaaaaaaaaaaaaaaaaaaaaaaaaa.cotal_probe is unreadable (Input/output error))"),
    ("hang", "a ledger read did not answer within 1.75 s"),
    ("store", "the issuance store does not answer (kv get cotal_auth_a natkey.cotal_probe: nats: connection closed)"),
    ("no bucket", None),
])
async def test_a_probe_names_what_does_not_answer(mode, reason, autojump_clock):
    port = Port()
    port.mode = mode
    start = trio.current_time()
    assert await lane_health(port).probe() == reason
    assert trio.current_time() - start == (BUDGET_S if mode == "hang" else 0)


async def test_three_failed_probes_in_a_row_end_the_lane_and_one_good_one_resets_the_count(autojump_clock):
    port = Port()
    probe = lane_health(port)
    port.mode = "fail"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe.run)
        await trio.sleep(health.PROBE_EVERY_S + 0.01)  # the first probe failed
        assert probe.reason is not None and port.reads == 1
        port.mode = None
        await trio.sleep(health.PROBE_RETRY_S)
        assert probe.reason is None and port.reads == 2  # passed: the count starts again
        nursery.cancel_scope.cancel()
    port.mode = "fail"
    start = trio.current_time()
    with pytest.RaisesGroup(pytest.RaisesExc(LaneUnhealthy, match=(
        r"^space a: the lane cannot answer connects - the ledger cannot be read .*"
        rf" \({PROBE_FAILURES} probes in a row\); it is restarted until that is mended$"
    ))):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe.run)
    assert trio.current_time() - start == pytest.approx(health.PROBE_EVERY_S + 2 * health.PROBE_RETRY_S)


async def test_a_connect_that_timed_out_at_the_ledger_step_probes_at_once(autojump_clock):
    port = Port()
    probe = lane_health(port)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe.run)
        await trio.sleep(0.1)
        assert port.reads == 0
        denied = CalloutRecord(space="a", req="U", cid=1, outcome=Outcome.DENIED, at=Step.LEDGER)
        probe.answered(denied)  # a denial is an answer: nothing to probe
        await trio.sleep(0.1)
        assert port.reads == 0
        probe.answered(CalloutRecord(space="a", req="U", cid=2, outcome=Outcome.TIMEOUT, at=Step.LEDGER))
        await trio.sleep(0.1)
        assert port.reads == 1
        nursery.cancel_scope.cancel()


async def test_health_says_why_while_the_last_probe_failed():
    port = Port()
    probe = lane_health(port)
    app = QuartTrio("test")

    async def ok() -> dict[str, object]:
        return {"ok": True, "issuer": "urn:cotal:auth:a"}

    install_edge(app, routes={"/health": {"GET": ok}, "/jwks": {"GET": ok}}, unknown_path="unknown path")
    answer_health(app, probe, "a")
    client = app.test_client()
    with trio.fail_after(10):
        assert (await client.get("/health")).status_code == 200
        port.mode = "fail"
        probe.reason = await probe.probe()  # as run() keeps it
        answer = await client.get("/health")
        assert answer.status_code == 503
        assert await answer.get_json() == {"ok": False, "issuer": "urn:cotal:auth:a", "reason": probe.reason}
        assert (await client.get("/jwks")).status_code == 200  # the other routes answer as before
        port.mode = None
        probe.reason = await probe.probe()
        assert (await client.get("/health")).status_code == 200


async def test_a_probe_contends_for_the_slots_of_the_lanes_ledger_reads(tmp_path):
    """Issue 15 item 11 after issue 14 item 4: the lane's port answers a principal whose row files
    are gone from two ``stat`` calls, with no thread slot. The probe's principal is such a one, so
    a probe through that inline path answered at once while the only slot was held by a read that
    never returns (a FIFO standing in for a hung disk). The probe's read must take a slot."""
    import os

    from cotal_trio.core.ledger import LedgerKind
    from cotal_trio.state import LedgerReader, RootPaths, write_row
    from cotal_trio.state.ledger_threads import read_in_threads
    from tests.support.ledger_files import row

    space = RootPaths(tmp_path).space("a")
    port = read_in_threads(LedgerReader(space), max_threads=1)  # the lane's port: its slots
    path = write_row(space, row(LedgerKind.INTERACTIVE, actor="cli"))
    fifo = path.with_name(path.name + ".fifo")
    os.mkfifo(fifo, 0o600)
    os.replace(fifo, path)
    probe = LaneHealth("a", read_ledger=port, store=Port(), budget_s=0.3)  # type: ignore[arg-type]
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(port, row(LedgerKind.INTERACTIVE).owner, "cli")  # holds the slot
                await trio.sleep(0.2)
                assert await probe.probe() == "a ledger read did not answer within 0.3 s"
                nursery.cancel_scope.cancel()
    finally:
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))  # the stuck open returns; the thread ends
