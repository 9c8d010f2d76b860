"""Issue 15 item 7 on a real nats-server: a stalled host-door read never holds the lane.

``run_up`` (tests/support/stack.py ``stack``, ``authorization { timeout: 2 }``) serves the
callout, the loopback exchange and the host-only doors (spec "Host-only routes") of one space on
one trio thread. A manager actor's interactive ledger row is replaced by a FIFO, so the reads of
``/manager-service-authority/verify-enrollment`` and ``/interactive-lifecycle/retire`` block for
real, as a hung disk would, until a ``threading.Timer`` answers them ``STALL_S`` later.
Meanwhile another principal's exchange mints and a client connects through the same lane's
callout; each stalled door answers 503 at the faces' ledger deadline (shortened here to
``DEADLINE_S``), the retirement with ``"outcome": "not-executed"`` (its barrier never began),
before the read is released, with no traceback in the log. Once the row answers again, the same
retirement completes.
"""

from __future__ import annotations

import functools
import logging

import pytest
import trio

from cotal_trio.http import faces
from cotal_trio.http.errors import UNAVAILABLE
from cotal_trio.http.lifecycle_doors import INTERACTIVE_RETIRE_PATH
from cotal_trio.http.manager_doors import VERIFY_ENROLLMENT_PATH
from cotal_trio.state import read_json
from tests.support.stack import Stack, post_answer
from tests.support.issuance import Timeline, while_stalled

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

CEILING_S = 30
STALL_S = 5.0
DEADLINE_S = 1.5
INSTANCE = "k" * 26


async def _door(stack: Stack, path: str, body: dict) -> tuple[int, dict]:
    service = read_json(stack.space_paths.auth_service_json)
    status, answer, _ = await trio.to_thread.run_sync(post_answer, service["url"] + path, service["cap"], body)
    return status, answer


async def _slow(stack: Stack, name: str, path: str, body: dict, timeline: Timeline) -> None:
    timeline.note(name, await _door(stack, path, body))


async def test_stalled_door_reads_hold_neither_an_exchange_nor_the_callout(stack, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(faces, "LEDGER_READ_S", DEADLINE_S, raising=False)
    slow_row = stack.grant("slow", "mgr", scope=("supervise",))
    stack.grant("fast", "cli")
    stack.grant("other", "cli")
    bearer = await stack.bearer("other", "cli")
    fast_token = stack.idp_token("fast")
    enroll = {"owner": slow_row.owner, "request": {"kind": "enroll", "actor": "mgr", "instanceId": INSTANCE,
                                                   "serveEpoch": 1, "agent": "worker"}}  # fmt: skip
    retire = {"owner": slow_row.owner, "actor": "mgr", "lifecycleUid": slow_row.lifecycle_uid}
    path = stack.space_paths.actors_dir / f"{slow_row.owner}.mgr.json"
    slow = [functools.partial(_slow, stack, "enroll", VERIFY_ENROLLMENT_PATH, enroll),
            functools.partial(_slow, stack, "retire", INTERACTIVE_RETIRE_PATH, retire)]
    timeline = await while_stalled(stack, path, slow=slow, fast_token=fast_token, bearer=bearer, stall_s=STALL_S,
                                   ceiling_s=CEILING_S)
    assert timeline.seen["exchange"] == (200, False)  # minted while the reads were blocked
    assert timeline.seen["connect"] == ("connected", False)  # the callout answered meanwhile too
    assert timeline.seen["enroll"] == ((503, {"error": UNAVAILABLE}), False)  # by its deadline
    assert timeline.seen["retire"] == ((503, {"outcome": "not-executed", "error": UNAVAILABLE}), False)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert any("the actor ledger did not answer within 1.5 s" in m for m in caplog.messages)
    with trio.fail_after(CEILING_S):  # once the disk answers, the same retirement completes
        status, answer = await _door(stack, INTERACTIVE_RETIRE_PATH, retire)
    assert (status, answer["outcome"]) == (200, "retired")
    assert not path.exists()
