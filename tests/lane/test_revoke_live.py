"""Issue 15 item 1 on a real ``run_up``: a revoke refuses the principal whatever its withdrawal does.

The issue's run: ``cotal actor revoke`` answered ``unknown outcome (HTTP 503)`` after 30.9 s, and
the revoked actor kept connecting while the exchange kept minting its bearers. Why: the retire
door withdrew the lifecycle's issuance rows *before* it removed the ledger row, so a withdrawal
that failed or ran out of time ended the retirement with the row file still granting. Here the
withdrawal is made to fail, or to hang past the retirement's bound, on a real stack (bundled
broker, dev IdP, one full lane); the door's answer is a partial retirement either way (202,
``"withdrawn": "partial"``: it used to be the generic 503, an unknown outcome), and the next
exchange and the next connect of that principal are refused (spec "Host-only routes").
"""

from __future__ import annotations

import pytest
import trio

from cotal_trio.cli import main
from cotal_trio.core.errors import Unavailable
from cotal_trio.stores import lifecycle as lifecycle_lane
from cotal_trio.state import read_json, read_principal

from tests.support.stack import SPACE, _post, client
from tests.support.callout_live import refused

pytestmark = pytest.mark.broker

CEILING_S = 30


async def _fails(*args, **kwargs):
    raise Unavailable("the auth bucket did not answer")


async def _hangs(*args, **kwargs):
    await trio.sleep_forever()


@pytest.mark.parametrize("withdrawal", [_fails, _hangs], ids=["fails", "times-out"])
async def test_a_revoke_whose_withdrawal_fails_still_refuses_the_next_exchange_and_connect(stack, monkeypatch, withdrawal):
    row = stack.grant("alice", "cli")
    bearer = await stack.bearer("alice", "cli")
    service = read_json(stack.space_paths.auth_service_json)
    body = {"owner": row.owner, "actor": "cli", "lifecycleUid": row.lifecycle_uid}
    with trio.fail_after(CEILING_S):
        async with client(stack, bearer):
            pass  # admitted before the revoke
        monkeypatch.setattr(lifecycle_lane, "withdraw_issuance", withdrawal)
        monkeypatch.setattr(lifecycle_lane, "RETIRE_S", 2.0)
        retired = await trio.to_thread.run_sync(_post, service["url"] + "/interactive-lifecycle/retire", service["cap"], body)
        exchanged = await stack.exchange({"idpToken": stack.idp_token("alice"), "actor": "cli"})
        with refused():
            async with client(stack, bearer):
                pass
    assert retired == (202, {
        **body, "outcome": "retired", "withdrawn": "partial", "withdrawnRows": 0, "rowsLeft": None, "rowsExpireWithinS": 905,
    })  # the withdrawal's failure is still reported, as partial (its count unknown: it never listed)
    assert read_principal(stack.space_paths, row.owner, "cli") == (None, None)
    assert exchanged[0] == 401 and exchanged[1]["error"].startswith('actor "cli" is not granted for this user')


async def test_cotal_actor_revoke_with_a_failing_withdrawal_says_revoked_and_the_actor_is_refused(stack, monkeypatch, capsys):
    """The same through ``cotal actor revoke`` (the issue's command): revoked, exit 0, saying
    the issuance rows left end on their TTL, and the principal refused at its next exchange and
    connect (it used to print an unknown outcome and exit 1)."""
    row = stack.grant("alice", "cli")
    bearer = await stack.bearer("alice", "cli")
    monkeypatch.setattr(lifecycle_lane, "withdraw_issuance", _fails)
    with trio.fail_after(CEILING_S):
        capsys.readouterr()
        code = await trio.to_thread.run_sync(
            main, ["actor", "revoke", "cli", "--owner", row.owner, "--space", SPACE, "--root", str(stack.paths.root)]
        )
        out, _ = capsys.readouterr()
        exchanged = await stack.exchange({"idpToken": stack.idp_token("alice"), "actor": "cli"})
        with refused():
            async with client(stack, bearer):
                pass
    assert code == 0 and out == (
        f"revoked cli of owner {row.owner} (the running auth service retired lifecycle {row.lifecycle_uid} and"
        " withdrew 0 issuance rows; some were not withdrawn and expire within their TTL, at most 905 s)\n"
    )
    assert read_principal(stack.space_paths, row.owner, "cli") == (None, None)
    assert exchanged[0] == 401
