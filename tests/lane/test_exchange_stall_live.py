"""Issue 15 item 7 on a real nats-server: a stalled exchange read never holds the lane.

``run_up`` (tests/support/stack.py ``stack``, ``authorization { timeout: 2 }``) serves the
callout and the loopback exchange of one space on one trio thread. One actor's interactive
ledger row is replaced by a FIFO, so the exchange's read of it blocks for real, as a hung disk
would, until a ``threading.Timer`` answers it ``STALL_S`` later. Meanwhile another principal's
exchange mints and a client connects through the same lane's callout; the stalled exchange is
answered 503 at the faces' ledger deadline (shortened here to ``DEADLINE_S``), before the read
is released, with no traceback in the log.
"""

from __future__ import annotations

import functools
import logging

import pytest
import trio

from cotal_trio.http import faces
from cotal_trio.http.errors import UNAVAILABLE
from tests.support.stack import Stack
from tests.support.issuance import Timeline, while_stalled

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

CEILING_S = 30
STALL_S = 5.0
DEADLINE_S = 1.5


async def _slow_exchange(stack: Stack, token: str, timeline: Timeline) -> None:
    timeline.note("slow", await stack.exchange({"idpToken": token, "actor": "cli"}))


async def test_a_stalled_exchange_read_holds_neither_another_exchange_nor_the_callout(stack, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(faces, "LEDGER_READ_S", DEADLINE_S, raising=False)
    slow_row = stack.grant("slow", "cli")
    stack.grant("fast", "cli")
    stack.grant("other", "cli")
    bearer = await stack.bearer("other", "cli")
    slow_token, fast_token = stack.idp_token("slow"), stack.idp_token("fast")
    path = stack.space_paths.actors_dir / f"{slow_row.owner}.cli.json"
    timeline = await while_stalled(stack, path, slow=[functools.partial(_slow_exchange, stack, slow_token)],
                                   fast_token=fast_token, bearer=bearer, stall_s=STALL_S, ceiling_s=CEILING_S)
    assert timeline.seen["exchange"] == (200, False)  # minted while the read was blocked
    assert timeline.seen["connect"] == ("connected", False)  # the callout answered meanwhile too
    assert timeline.seen["slow"] == ((503, {"error": UNAVAILABLE}), False)  # by its deadline
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert any("the actor ledger did not answer within 1.5 s" in m for m in caplog.messages)
    with trio.fail_after(CEILING_S):  # once the disk answers, the same actor exchanges again
        status, _ = await stack.exchange({"idpToken": stack.idp_token("slow"), "actor": "cli"})
    assert status == 200
