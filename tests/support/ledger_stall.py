"""A ledger that stalls on demand, and the race of an exchange against its deadline."""

from __future__ import annotations

import functools
import json
import threading
from dataclasses import replace

import pytest
import trio

from cotal_trio.core.ledger import LedgerKind
from cotal_trio.http import faces, serve_app
from tests.support.loopback import NOW, FixedClock, _http, _ledger, _context as loopback_context

STALL_S = 6.0  # the blocked read is released after this
DEADLINE_S = 1.0  # the faces' ledger read deadline in these tests
CEILING_S = 20


class StallingLedger:
    """``read_ledger`` over the test rows that blocks for ``stalled`` actors until released."""

    def __init__(self, stalled: set[str]) -> None:
        self.rows = _ledger()
        self.stalled = stalled
        self.released = threading.Event()

    def __call__(self, owner: str, actor: str):
        if actor in self.stalled:
            self.released.wait(STALL_S * 2)
        return self.rows.get((LedgerKind.INTERACTIVE, owner, actor)), self.rows.get((LedgerKind.MANAGED, owner, actor))


def _context(ledger: StallingLedger):
    return replace(loopback_context(clock=FixedClock(NOW)), read_ledger=ledger)


class Answers:
    """Each answer's status, body and whether the stalled read was released when it came."""

    def __init__(self, ledger: StallingLedger) -> None:
        self.ledger = ledger
        self.got: dict[str, tuple[int, dict, bool]] = {}

    async def post(self, name: str, port: int, request: bytes) -> None:
        status, _, body = await _http(port, request)
        self.got[name] = (status, json.loads(body), self.ledger.released.is_set())


@pytest.fixture
def short_deadline(monkeypatch):
    monkeypatch.setattr(faces, "LEDGER_READ_S", DEADLINE_S, raising=False)


async def _race(app, ledger: StallingLedger, slow: tuple[str, bytes], others: dict[str, bytes]) -> Answers:
    answers = Answers(ledger)
    timer = threading.Timer(STALL_S, ledger.released.set)
    timer.start()
    try:
        with trio.fail_after(CEILING_S):
            async with trio.open_nursery() as nursery:
                port = await nursery.start(functools.partial(serve_app, app))
                async with trio.open_nursery() as clients:
                    clients.start_soon(answers.post, slow[0], port, slow[1])
                    await trio.sleep(0.3)  # the slow request is in its read by now
                    for name, request in others.items():
                        clients.start_soon(answers.post, name, port, request)
                nursery.cancel_scope.cancel()
    finally:
        ledger.released.set()
        timer.cancel()
    return answers
