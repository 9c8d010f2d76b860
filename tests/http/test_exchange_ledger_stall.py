"""A ledger read that stalls holds its own exchange, never the face (issue 15 item 7).

The faces read ledger rows through an awaited port, each read in a worker thread with a limiter
and abandoned at the read's deadline (``faces.LEDGER_READ_S``), as the callout does
(``read_in_threads``). Here the reader port blocks on a ``threading.Event`` for one actor; a
``threading.Timer`` releases it, so a read that held trio's thread would freeze the test (and the
face) only until then, and the assertions see by when each answer came.

Each test serves the real face with hypercorn on 127.0.0.1 and speaks raw HTTP/1.1 to it.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from cotal_trio.core.errors import Refused
from cotal_trio.core.ledger import LedgerKind
from cotal_trio.http import build_loopback_app, faces
from cotal_trio.http.errors import UNAVAILABLE
from tests.support.loopback import AGENT_SECRET, OWNER, _human_body, _ledger, _request
from tests.support.public_face import _app
from tests.support.ledger_stall import StallingLedger, _context, _race
from tests.support.ledger_stall import short_deadline  # noqa: F401 - fixtures


async def test_a_stalled_human_read_is_a_503_and_other_exchanges_mint_meanwhile(short_deadline, caplog):
    caplog.set_level(logging.WARNING, logger="cotal.http")
    ledger = StallingLedger({"ops"})  # not cli: the agent's spawner
    ledger.rows[(LedgerKind.INTERACTIVE, OWNER, "ops")] = replace(ledger.rows[(LedgerKind.INTERACTIVE, OWNER, "cli")], actor="ops")
    agent = {"owner": OWNER, "actor": "worker", "actorToken": AGENT_SECRET}
    answers = await _race(
        build_loopback_app(_context(ledger)), ledger,
        ("slow", _request("/exchange", _human_body("ops"), capability=True)),
        {"human": _request("/exchange", _human_body("cli"), capability=True),
         "agent": _request("/exchange", agent, capability=True)},
    )  # fmt: skip
    assert answers.got["human"][:1] == (200,) and answers.got["human"][1]["owner"] == OWNER
    assert answers.got["agent"][:1] == (200,)
    assert not answers.got["human"][2] and not answers.got["agent"][2]  # both while the read was blocked
    assert answers.got["slow"] == (503, {"error": UNAVAILABLE}, False)  # by its deadline, not the release
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []  # no traceback anywhere
    assert any("actor ledger did not answer" in m for m in caplog.messages)


async def test_a_stalled_agent_read_on_the_public_face_is_a_503_and_a_human_mints_meanwhile(short_deadline, caplog):
    caplog.set_level(logging.WARNING, logger="cotal.http")
    ledger = StallingLedger({"worker"})
    agent = {"owner": OWNER, "actor": "worker", "actorToken": AGENT_SECRET}
    answers = await _race(
        _app(_context(ledger)), ledger,
        ("slow", _request("/exchange", agent, capability=False)),
        {"human": _request("/exchange", _human_body("cli"), capability=False)},
    )
    assert answers.got["human"][0] == 200 and not answers.got["human"][2]
    assert answers.got["slow"] == (503, {"error": UNAVAILABLE}, False)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_stalled_read_on_a_credential_route_is_a_503_too(short_deadline, caplog):
    """``/manager-instances`` (mesh_routes) authenticates through the same awaited ledger step."""
    caplog.set_level(logging.WARNING, logger="cotal.http")
    ledger = StallingLedger({"ops"})
    ledger.rows[(LedgerKind.INTERACTIVE, OWNER, "ops")] = replace(ledger.rows[(LedgerKind.INTERACTIVE, OWNER, "cli")], actor="ops")
    answers = await _race(
        _app(_context(ledger)), ledger,
        ("slow", _request("/manager-instances", _human_body("ops"), capability=False)),
        {"human": _request("/exchange", _human_body("cli"), capability=False)},
    )  # fmt: skip
    assert answers.got["human"][0] == 200 and not answers.got["human"][2]
    assert answers.got["slow"] == (503, {"error": UNAVAILABLE}, False)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_the_stock_authorizer_reads_the_interactive_row():
    """The stock hook (moved out of core: the read is the shell's, the decision core's)."""
    rows = _ledger()
    authorize = faces.stock_authorizer(lambda owner, actor: (rows.get((LedgerKind.INTERACTIVE, owner, actor)), None))
    assert authorize(OWNER, "cli") == rows[(LedgerKind.INTERACTIVE, OWNER, "cli")]
    with pytest.raises(Refused, match=f"cotal actor grant ops --owner {OWNER}"):
        authorize(OWNER, "ops")
