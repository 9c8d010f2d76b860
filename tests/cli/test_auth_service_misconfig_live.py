"""Misconfiguration is named (issue 15 item 10): a callout user missing from ``auth_users``.

The broker holds an auth account JWT for space ``a`` whose ``authorization.auth_users`` does not
list the space's callout user (signed with the project's own ``sign_space_accounts``, for another
user key, as a hand-edited or stale JWT would be). The broker then sends the auth service's own
callout connection through the auth callout, which nothing answers, and refuses it with
``Authorization Violation``. ``cotal auth-service`` must say what is wrong and how to mend it:
re-push the space's accounts (``cotal space add`` re-signs and pushes them).

The lane names it where its callout connect is refused (lane/refusals.py), so a ``--spaces``
host shows the same sentence as the lane's ``retrying`` reason in ``.applied`` and its log,
while its other space keeps serving.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from cotal_trio.broker import provision
from cotal_trio.broker.accounts import open_system_connection, push_accounts
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.natsio import open_loop
from tests.support.service import AUTH_TIMEOUT_S, start_mesh, write_manifest
from tests.support.notify import Systemd

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

SPACE = "a"


async def _push_auth_account_without_the_callout_user(mesh) -> provision.AccountsRecord:
    """Push space a's auth account JWT with another user in ``auth_users``; the true record."""
    now = int(time.time())
    broker = provision.ensure_root(mesh.paths, iat=now)
    record = provision.load_space_accounts(mesh.paths, broker, SPACE)
    stranger = KeyPair.generate(Prefix.USER).public_key
    _, auth_jwt = provision.sign_space_accounts(dataclasses.replace(record, callout_user=stranger), broker, iat=now + 5)
    async with open_loop(), open_system_connection(mesh.server_url, broker) as system:
        await push_accounts(system, [auth_jwt])
    return record


async def test_a_callout_user_missing_from_auth_users_is_named_with_the_remedy(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str
):
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    record = await _push_auth_account_without_the_callout_user(mesh)
    root = str(mesh.paths.root)
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-m", "cotal_trio", "auth-service", "--space", SPACE, "--server", mesh.server_url,
             "--root", root, "--auth-timeout", str(AUTH_TIMEOUT_S)],
            capture_stdout=True, capture_stderr=True, check=False,
        )
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "cotal: " + _named(record, root, mesh.server_url)


async def _collect(unit: Systemd, scope: trio.CancelScope) -> None:
    """Receive every datagram into ``unit.seen`` until ``scope`` is cancelled."""
    with scope:
        while True:
            await unit.receive()


def _named(record: provision.AccountsRecord, root: str, server_url: str) -> str:
    return (
        f"space {SPACE}: the broker's auth account does not list the space's callout user in its auth_users "
        f"(account {record.auth_account}, user {record.callout_user}), so the broker refused the auth service's "
        f"own callout connection - re-push the space's accounts with `cotal space add {SPACE} --root {root} "
        f"--server {server_url}` (it re-signs them from the root)"
    )


async def test_a_hosted_space_missing_from_auth_users_is_named_in_applied_while_the_other_serves(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str, systemd: tuple[str, Systemd]
):
    """A ``--spaces`` host (under a fake systemd, tests/service/test_notify_live.py) names it as
    the lane's retrying reason in ``.applied``, its STATUS and its log; space b serves."""
    notify, unit = systemd
    collecting = trio.CancelScope()
    gist = f"retrying: {SPACE} (space {SPACE}: the broker's auth account does not list the space's callout user in"
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    record = await _push_auth_account_without_the_callout_user(mesh)
    root = str(mesh.paths.root)
    manifest = tmp_path / "spaces.json"
    write_manifest(manifest, SPACE, "b")
    applied = tmp_path / "spaces.json.applied"
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "cotal_trio", "auth-service", "--spaces", str(manifest), "--server", mesh.server_url,
         "--root", root, "--auth-timeout", str(AUTH_TIMEOUT_S)],
        stderr=subprocess.PIPE, env={**os.environ, "NOTIFY_SOCKET": notify},
    )
    try:
        with trio.fail_after(60):
            nursery.start_soon(_collect, unit, collecting)
            spaces: dict = {}
            while spaces.get(SPACE, {}).get("state") != "retrying" or spaces.get("b", {}).get("state") != "serving":
                await trio.sleep(0.05)
                try:
                    spaces = json.loads(applied.read_text())["spaces"]
                except (OSError, ValueError):
                    continue
            while not any(gist in status for status in unit.statuses()):  # the unit's STATUS says it too
                await trio.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            err = b""
            assert proc.stderr is not None
            while chunk := await proc.stderr.receive_some():
                err += chunk
            await proc.wait()
    finally:
        collecting.cancel()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert spaces[SPACE] == {"state": "retrying", "reason": _named(record, root, mesh.server_url)}
    assert spaces["b"] == {"state": "serving"}
    assert f"space {SPACE}: lane failed, retrying in 5 s: {_named(record, root, mesh.server_url)}" in err.decode()
    assert "Traceback" not in err.decode()
