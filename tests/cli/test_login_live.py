"""Issue 19 item 5: ``cotal login`` as a person, end to end against ``cotal up``'s development IdP
and a real nats-server (spec "IdP compatibility": the device-code endpoints and an opaque
revocable session).

The person runs ``cotal login --space alpha`` (a real process), approves the printed code with
``cotal dev-idp approve``, and the session lands 0600 in their config folder; ``cotal exchange``
without ``--idp-token`` then mints a bearer that connects, and ``cotal check --actor`` passes on
it; a second login signs the session it replaces out. ``cotal logout`` revokes it at the IdP: a later exchange asks for ``cotal login``, and the old
session, put back, is refused by the IdP with the same remedy. A denied code ends the login with
``access_denied``'s sentence.
"""

from __future__ import annotations

import functools
import json
import shutil
import stat
import sys

import pytest
import trio

from cotal_trio.devidp import DevicePolicy
from cotal_trio.http.idp_client import SessionRejected, fetch_session_token
from tests.support.cli_root import cotal
from tests.support.login import round_trip, finish, person_env, session_files, start_login
from tests.support.stack import SPACE, client, start_stack

CEILING_S = 60
# A 1 s interval keeps the test short; the polling rules are the same (tests/core/test_device_flow.py).
POLICY = DevicePolicy(interval_s=1, expires_in_s=120)


@pytest.mark.broker
async def test_login_exchange_check_and_logout(nursery, tmp_path, nats_server_bin, capsys, monkeypatch):
    stack = await start_stack(nursery, tmp_path, nats_server_bin, dev_idp_device=POLICY)
    stack.grant("alice", "cli")
    env = person_env(tmp_path)
    for name in ("XDG_CONFIG_HOME", "HOME"):  # the in-process commands are the same person
        monkeypatch.setenv(name, env[name])
    where = ("--space", SPACE, "--root", str(stack.paths.root))
    with trio.fail_after(CEILING_S):
        code, out, err = await cotal(capsys, "exchange", "--actor", "cli", *where)
        assert (code, out) == (1, "")
        assert f"you are not logged in to space {SPACE} - run `cotal login --space {SPACE}`" in err

        process, user_code = await start_login(nursery, stack.paths.root, SPACE, env)
        approved = await cotal(capsys, "dev-idp", "approve", "--user-code", user_code, "--sub", "alice", *where)
        assert approved == (0, f"approved {user_code} for alice\n", "")
        code, out, err = await finish(process)
        assert code == 0, err
        (kept,) = session_files(tmp_path)
        assert f"logged in to space {SPACE} at {stack.info.pin.issuer}; the session is kept in {kept}" in out
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600

        code, bearer, err = await cotal(capsys, "exchange", "--actor", "cli", *where)
        assert code == 0, err
        async with client(stack, bearer.strip()) as conn:
            await round_trip(conn, SPACE)
        code, out, err = await cotal(capsys, "check", "--actor", "cli", *where)
        assert code == 0, err
        assert out.endswith("check passed\n")

        first = json.loads(kept.read_text())["session"]
        process, user_code = await start_login(nursery, stack.paths.root, SPACE, env)  # log in again
        await cotal(capsys, "dev-idp", "approve", "--user-code", user_code, "--sub", "alice", *where)
        assert (await finish(process))[0] == 0
        assert json.loads(kept.read_text())["session"] != first
        with pytest.raises(SessionRejected):  # the replaced session was signed out
            await trio.to_thread.run_sync(functools.partial(fetch_session_token, stack.info.dev_idp_url, first, relogin="x"))

        shutil.copy(kept, tmp_path / "kept-session.json")
        code, out, err = await cotal(capsys, "logout", *where)
        assert (code, err) == (0, "")
        assert out == f"logged out of space {SPACE}; the session is revoked and {kept} deleted\n"
        assert session_files(tmp_path) == []
        code, out, err = await cotal(capsys, "exchange", "--actor", "cli", *where)
        assert code == 1 and f"run `cotal login --space {SPACE}`" in err

        shutil.copy(tmp_path / "kept-session.json", kept)  # the revoked session, as a copy would hold it
        code, out, err = await cotal(capsys, "exchange", "--actor", "cli", *where)
    assert (code, out) == (1, "")
    assert "no longer accepts your login session (revoked, signed out or expired)" in err
    assert f"run `cotal login --space {SPACE}`" in err


async def _waiting_login(nursery, tmp_path, nats_server_bin) -> tuple[tuple[str, ...], trio.Process, str]:
    """A stack and a ``cotal login`` waiting for its code: the root flags, the process, the code."""
    stack = await start_stack(nursery, tmp_path, nats_server_bin, dev_idp_device=POLICY)
    process, user_code = await start_login(nursery, stack.paths.root, SPACE, person_env(tmp_path))
    return ("--space", SPACE, "--root", str(stack.paths.root)), process, user_code


@pytest.mark.broker
async def test_a_denied_code_ends_the_login(nursery, tmp_path, nats_server_bin, capsys):
    with trio.fail_after(CEILING_S):
        where, process, user_code = await _waiting_login(nursery, tmp_path, nats_server_bin)
        denied = await cotal(capsys, "dev-idp", "deny", "--user-code", user_code, "--sub", "alice", *where)
        assert denied == (0, f"denied {user_code}\n", "")
        code, _, err = await finish(process)
    assert code == 1
    assert f"the sign-in was denied at the IdP - run `cotal login --space {SPACE}` again and approve the code" in err
    assert session_files(tmp_path) == []



async def _approved_login(nursery, stack, env, capsys) -> tuple[int, str, str]:
    """One ``cotal login`` process whose code alice approves: its exit code, stdout and stderr."""
    process, user_code = await start_login(nursery, stack.paths.root, SPACE, env)
    where = ("--space", SPACE, "--root", str(stack.paths.root))
    await cotal(capsys, "dev-idp", "approve", "--user-code", user_code, "--sub", "alice", *where)
    return await finish(process)


@pytest.mark.broker
async def test_a_login_replaces_an_unreadable_session_file(nursery, tmp_path, nats_server_bin, capsys, monkeypatch):
    """A corrupt session file must not cost the person the session they just approved: the login
    writes the new one over it (there is no old session to sign out) and the exchange uses it."""
    stack = await start_stack(nursery, tmp_path, nats_server_bin, dev_idp_device=POLICY)
    stack.grant("alice", "cli")
    env = person_env(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", env["XDG_CONFIG_HOME"])  # the in-process exchange is the same person
    with trio.fail_after(CEILING_S):
        assert (await _approved_login(nursery, stack, env, capsys))[0] == 0
        (kept,) = session_files(tmp_path)
        kept.write_text("{")  # a torn or hand-edited file
        code, out, err = await _approved_login(nursery, stack, env, capsys)
        assert (code, err) == (0, ""), err
        assert f"the session is kept in {kept}" in out and stat.S_IMODE(kept.stat().st_mode) == 0o600
        code, bearer, err = await cotal(capsys, "exchange", "--actor", "cli", "--space", SPACE,
                                        "--root", str(stack.paths.root))  # fmt: skip
    assert code == 0, err
    async with client(stack, bearer.strip()) as conn:
        await round_trip(conn, SPACE)


@pytest.mark.broker
async def test_a_mistyped_user_code_names_the_fix_and_the_login_still_waits(nursery, tmp_path, nats_server_bin, capsys):
    with trio.fail_after(CEILING_S):
        where, process, user_code = await _waiting_login(nursery, tmp_path, nats_server_bin)
        typo = user_code[:-1] + ("A" if user_code[-1] != "A" else "B")
        code, out, err = await cotal(capsys, "dev-idp", "approve", "--user-code", typo, "--sub", "alice", *where)
        assert (code, out) == (1, "")
        assert err.endswith(f"refused /device/approve for user code {typo} (no pending user code matches - check the"
                            " code `cotal login` printed, or start `cotal login` again)\n")  # fmt: skip
        await cotal(capsys, "dev-idp", "approve", "--user-code", user_code, "--sub", "alice", *where)
        code, _, err = await finish(process)
    assert code == 0, err
    assert len(session_files(tmp_path)) == 1


@pytest.mark.broker
async def test_a_session_folder_that_cannot_be_written_is_named_before_the_code(nursery, tmp_path, nats_server_bin):
    """The person must not approve a code whose session then has nowhere to go (it would stay live
    at the IdP with no file to revoke it by): the folder is made, or refused, before the flow."""
    stack = await start_stack(nursery, tmp_path, nats_server_bin, dev_idp_device=POLICY)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    env = {**person_env(tmp_path), "XDG_CONFIG_HOME": str(blocker)}
    command = [sys.executable, "-m", "cotal_trio", "login", "--space", SPACE, "--root", str(stack.paths.root)]
    with trio.fail_after(CEILING_S):
        done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False, env=env)
    assert (done.returncode, done.stdout) == (1, b"")
    assert done.stderr.decode() == f"cotal: {blocker} exists and is not a folder - move it aside\n"
