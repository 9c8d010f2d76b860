"""Misconfiguration is named (issue 15 item 10): a callout user missing from ``auth_users``.

The broker holds an auth account JWT for space ``a`` whose ``authorization.auth_users`` does not
list the space's callout user (signed with the project's own ``sign_space_accounts``, for another
user key, as a hand-edited or stale JWT would be). The broker then sends the auth service's own
callout connection through the auth callout, which nothing answers, and refuses it with
``Authorization Violation``. ``cotal auth-service`` must say what is wrong and how to mend it:
re-push the space's accounts (``cotal space add`` re-signs and pushes them).
"""

from __future__ import annotations

import dataclasses
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
from tests.lanes.test_auth_service_live import AUTH_TIMEOUT_S, start_mesh

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
    assert err.strip().splitlines()[-1] == (
        f"cotal: space {SPACE}: the broker's auth account {record.auth_account} does not list the space's callout "
        f"user {record.callout_user} in its auth_users, so the broker refused the auth service's own callout "
        f"connection - re-push the space's accounts with `cotal space add {SPACE} --root {root} --server "
        f"{mesh.server_url}` (it re-signs them from the root)"
    )
