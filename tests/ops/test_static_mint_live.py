"""Static minting on a real operator-mode nats-server (issue 6 items 3-4; docs/static-credentials.md).

A static space has no callout: the broker itself accepts the minted ``.creds`` (a user JWT signed by
the space's data-account signing key), enforces its permissions, and refuses it once
``cotal auth revoke-credential`` pushed the account with the key revoked.
"""

from __future__ import annotations

import json
import shlex
import time

import pytest
import trio

from cotal_trio.broker.spaces import add_space
from cotal_trio.core.errors import Unavailable
from cotal_trio.natsio import open_loop
from tests.support.cli_root import cotal
from tests.support.static_mint import STATIC, connect_receipt, static_space  # noqa: F401 - the fixture

pytestmark = pytest.mark.broker

CEILING_S = 40


async def _push_without_revocations(paths, url: str) -> None:
    from cotal_trio.broker.accounts import open_system_connection, push_accounts
    from cotal_trio.broker.provision import load_space_accounts, sign_space_accounts
    from cotal_trio.state import load_broker

    broker = load_broker(paths.broker_json)
    record = load_space_accounts(paths, broker, STATIC)
    from cotal_trio.core import natsjwt

    recorded = natsjwt.decode(record.data_jwt).claims["iat"]  # the same iat: the next re-sign is newer
    data_jwt, auth_jwt = sign_space_accounts(record, broker, iat=recorded)
    async with open_loop(), open_system_connection(url, broker) as conn:
        await push_accounts(conn, [data_jwt, auth_jwt])


def refused():
    return pytest.RaisesGroup(pytest.RaisesExc(Unavailable, match="Authorization Violation"), flatten_subgroups=True)


async def test_minted_static_creds_connect_publish_where_allowed_and_stop_once_revoked(static_space, capsys):
    url, paths = static_space
    root = ["--space", STATIC, "--root", str(paths.root)]
    with trio.fail_after(CEILING_S):
        code, out, err = await cotal(capsys, "auth", "mint", *root, "--label", "bot", "--allow-publish", "team.news",
                                     "--allow-subscribe", "team.>", "--server", url, "--json")  # fmt: skip
        assert code == 0, err
        receipt = json.loads(out)
        received, inbox = trio.open_memory_channel(4)
        async with open_loop(), connect_receipt(url, receipt) as conn:
            await conn.subscribe(f"cotal.{STATIC}.ch.team.>", on_message=received.send_nowait)
            await conn.publish(f"cotal.{STATIC}.ch.team.news", b"hello")
            await conn.flush()
            msg = await inbox.receive()
            assert (msg.subject, msg.data) == (f"cotal.{STATIC}.ch.team.news", b"hello")
            assert conn.error_count == 0
            await conn.publish(f"cotal.{STATIC}.ch.other", b"not granted")
            error = await conn.wait_error(after=0)
            assert "permissions violation" in error.lower() and f"cotal.{STATIC}.ch.other" in error

        code, out, err = await cotal(capsys, "doctor", "auth", *root, "--server", url)
        assert (code, out.splitlines()[-1]) == (0, "healthy"), out + err

        code, out, err = await cotal(capsys, "auth", "revoke-credential", "bot", *root, "--server", url, "--json")
        assert code == 0, err
        assert (json.loads(out)["pushedTo"], json.loads(out)["revocations"]) == (url, 1)
        with refused():
            async with open_loop(), connect_receipt(url, receipt):
                pass

        # The same identity, a new JWT issued after the revocation: connects again.
        code, out, err = await cotal(capsys, "auth", "mint", *root, "--label", "bot", "--replace", "--identity",
                                     receipt["path"], "--allow-publish", "team.news", "--server", url, "--json")  # fmt: skip
        assert code == 0, err
        again = json.loads(out)
        assert again["userKey"] == receipt["userKey"] and again["lifecycleUid"] != receipt["lifecycleUid"]
        async with open_loop(), connect_receipt(url, again) as conn:
            await conn.publish(f"cotal.{STATIC}.ch.team.news", b"back")
            await conn.flush()
            assert conn.error_count == 0


async def test_doctor_sees_the_broker_lose_a_revocation_and_names_the_fix(static_space, capsys):
    url, paths = static_space
    root = ["--space", STATIC, "--root", str(paths.root)]
    with trio.fail_after(CEILING_S):
        code, out, err = await cotal(capsys, "auth", "mint", *root, "--label", "gone", "--profile", "observer", "--json")
        assert code == 0, err
        receipt = json.loads(out)
        assert (await cotal(capsys, "auth", "revoke-credential", "gone", *root, "--server", url))[0] == 0
        # `cotal space add` re-signs the account and keeps its revocations (it lost them before).
        await add_space(paths, STATIC, static=True, server_url=url, now=time.time() + 2)
        with refused():
            async with open_loop(), connect_receipt(url, receipt):
                pass
        # A broker that lost the revocation some other way (an account JWT pushed without it):
        await _push_without_revocations(paths, url)
        async with open_loop(), connect_receipt(url, receipt):
            pass  # admitted again: the broker's account no longer revokes the key
        code, out, err = await cotal(capsys, "doctor", "auth", *root, "--server", url, "--json")
        report = json.loads(out)
        fix = f"cotal auth revoke-credential gone {' '.join(root)}"  # the label's current key: no --key
        assert (code, report["next"]) == (1, fix), out + err
        assert (await cotal(capsys, *shlex.split(fix)[1:], "--server", url))[0] == 0
        with refused():
            async with open_loop(), connect_receipt(url, receipt):
                pass
        code, out, err = await cotal(capsys, "doctor", "auth", *root, "--server", url)
        assert (code, out.splitlines()[-1]) == (0, "healthy"), out + err


async def test_doctor_names_a_broker_holding_other_accounts(static_space, capsys):  # noqa: F811
    url, paths = static_space
    with trio.fail_after(CEILING_S):
        # The root's record moves on without the broker (a re-sign while it was away).
        await add_space(paths, STATIC, static=True, server_url=None, now=time.time() + 2)
        code, out, err = await cotal(capsys, "doctor", "auth", "--root", str(paths.root), "--server", url, "--space", STATIC)
        lines = out.splitlines()
        accounts = paths.space(STATIC).accounts_json
        assert code == 1, out + err
        assert f"finding: space {STATIC}: the broker at {url} holds other account JWTs than {accounts} - cotal space add {STATIC} --static --root {paths.root}" in lines
        assert lines[-1] == f"next: cotal space add {STATIC} --static --root {paths.root}"


async def test_a_running_cotal_up_root_is_healthy(stack, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with trio.fail_after(CEILING_S):
        code, out, err = await cotal(capsys, "doctor", "auth", "--root", str(stack.paths.root), "--json")
    report = json.loads(out)
    assert (code, report["healthy"], report["findings"], report["notes"]) == (0, True, [], []), out + err
    assert [row["space"] for row in report["spaces"]] == ["alpha"]
