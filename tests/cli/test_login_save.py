"""Issue 19 item 5: ``cotal login`` keeps the new session before it signs the old one out, so a
new session that cannot be written costs the person nothing (spec "IdP compatibility": an opaque
revocable session).

A real ``cotal login`` process against the development IdP, served here as the space's pinned
IdP, under a real file-system condition the root user cannot bypass: a file-size limit
(``RLIMIT_FSIZE``, the shape of a full disk or quota: the write fails with ``EFBIG``), or a folder
where the session file goes. The old session must still be accepted by the IdP afterwards, its
file unchanged, and the sentence must say so and name the fix.
"""

from __future__ import annotations

import functools
import resource
import time

import trio
from quart import request

from cotal_trio.cli.login import run_device_login
from cotal_trio.core.device_flow import DeviceAuthorization
from cotal_trio.devidp import DevicePolicy, build_dev_idp_app, mint_dev_token
from cotal_trio.http.idp_client import SessionRejected, answer_user_code, fetch_session_token
from cotal_trio.http.serve import serve_app
from cotal_trio.state import IdpPinRecord, save_idp_pin
from cotal_trio.state.login_sessions import LoginSession, save_session, session_path
from tests.support.cli_root import SPACE
from tests.support.login import finish, person_env, start_login

CEILING_S = 30
# A 1 s interval keeps the test short; the polling rules are tests/core/test_device_flow.py's.
POLICY = DevicePolicy(interval_s=1, expires_in_s=60)
# Smaller than any session file (about 250 bytes), larger than nothing else the login writes.
FILE_LIMIT_BYTES = 64


def _limit_file_size() -> None:
    """In the login process, before exec: no file may grow past FILE_LIMIT_BYTES (Python ignores
    SIGXFSZ, so the write fails with EFBIG instead of killing the process)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT_BYTES, FILE_LIMIT_BYTES))


async def _pinned_idp(nursery: trio.Nursery, root, *, refuse_sign_out: bool = False) -> tuple[str, list[str]]:
    """The development IdP served on a free port and pinned as the space's IdP: its base URL, and
    the sessions it has been asked to sign out, in order (filled as they come). With
    ``refuse_sign_out`` it answers every sign-out 503 (an IdP briefly down)."""
    app = build_dev_idp_app(root.idp, device=POLICY)
    signed_out: list[str] = []

    @app.before_request
    async def note_sign_out() -> tuple[dict[str, str], int] | None:
        if request.path == "/sign-out":
            signed_out.append(request.headers.get("Authorization", "").removeprefix("Bearer "))
            if refuse_sign_out:
                return {"error": "temporarily_unavailable"}, 503
        return None

    base = f"http://127.0.0.1:{await nursery.start(functools.partial(serve_app, app))}"
    save_idp_pin(root.space.idp_json, IdpPinRecord(kind="oidc", url=base, issuer=base, audience=base, jwks_uri=f"{base}/jwks"))
    return base, signed_out


def _approve(base: str, root, user_code: str) -> None:
    """Alice approves ``user_code`` at the IdP (blocking HTTP)."""
    bearer = mint_dev_token(root.idp, sub="alice", now=int(time.time()))
    answer_user_code(base, user_code=user_code, bearer=bearer, approve=True)


async def _earlier_session(base: str, root, path) -> LoginSession:
    """A live session at the IdP, kept at ``path`` as an earlier ``cotal login`` would have."""

    async def show(authorization: DeviceAuthorization) -> None:
        await trio.to_thread.run_sync(_approve, base, root, authorization.user_code)

    signed = await run_device_login(base, space=SPACE, client_id="cotal-cli", show=show)
    earlier = LoginSession(space=SPACE, issuer=base, idp_url=base, session=signed.session, created_at=int(time.time()), expires_at=None)
    save_session(path, earlier)
    return earlier


async def _still_accepted(base: str, session: str) -> bool:
    try:
        await trio.to_thread.run_sync(functools.partial(fetch_session_token, base, session, relogin="x"))
    except SessionRejected:
        return False
    return True


async def test_a_session_that_cannot_be_written_keeps_the_earlier_one(nursery, root, tmp_path):
    base, signed_out = await _pinned_idp(nursery, root)
    env = {**person_env(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    path = session_path(env, space=SPACE, issuer=base)
    with trio.fail_after(CEILING_S):
        earlier = await _earlier_session(base, root, path)
        kept = path.read_bytes()
        process, user_code = await start_login(nursery, root.paths.root, SPACE, env, preexec_fn=_limit_file_size)
        await trio.to_thread.run_sync(_approve, base, root, user_code)
        code, out, err = await finish(process)
        assert await _still_accepted(base, earlier.session)  # the old session was not signed out first
        (new,) = signed_out  # the new one, which nothing could revoke later, was
        assert new != earlier.session and not await _still_accepted(base, new)
    # stdout holds at most the prompt's last lines start_login had not read yet: never a login
    assert code == 1 and "logged in" not in out, (out, err)
    assert err == (f"cotal: cannot keep the new login session in {path} (File too large) - your earlier session is"
                   f" kept (not signed out); raise the file-size limit (ulimit -f), then run `cotal login --space"
                   f" {SPACE}` again\n")  # fmt: skip
    assert path.read_bytes() == kept
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left


async def test_a_folder_where_the_session_goes_signs_the_new_session_out(nursery, root, tmp_path):
    """No earlier session (the path is a folder, say a mistaken `mkdir`): the new session cannot be
    renamed into place, is signed out, and the sentence names the path."""
    base, signed_out = await _pinned_idp(nursery, root)
    env = person_env(tmp_path)
    path = session_path(env, space=SPACE, issuer=base)
    path.mkdir(parents=True)
    with trio.fail_after(CEILING_S):
        process, user_code = await start_login(nursery, root.paths.root, SPACE, env)
        await trio.to_thread.run_sync(_approve, base, root, user_code)
        code, out, err = await finish(process)
        (new,) = signed_out
        assert not await _still_accepted(base, new)
    assert code == 1 and "logged in" not in out, (out, err)  # as above: the prompt's tail at most
    assert err == (f"cotal: cannot keep the new login session in {path} (Is a directory) - the new session is signed"
                   f" out; check that path and its folder, then run `cotal login --space {SPACE}` again\n")  # fmt: skip
    assert path.is_dir() and sorted(p.name for p in path.parent.iterdir()) == [path.name]



async def test_an_earlier_session_the_idp_would_not_sign_out_is_named(nursery, root, tmp_path):
    """The login succeeded and replaced the file, but the IdP would not sign the earlier session
    out (it answers 503): that session stays live at the IdP with no file left to sign it out
    from, so the login says so on stderr instead of nothing, and still succeeds."""
    base, signed_out = await _pinned_idp(nursery, root, refuse_sign_out=True)
    env = person_env(tmp_path)
    path = session_path(env, space=SPACE, issuer=base)
    with trio.fail_after(CEILING_S):
        earlier = await _earlier_session(base, root, path)
        process, user_code = await start_login(nursery, root.paths.root, SPACE, env)
        await trio.to_thread.run_sync(_approve, base, root, user_code)
        code, out, err = await finish(process)
        assert signed_out == [earlier.session] and await _still_accepted(base, earlier.session)
    assert code == 0 and out.endswith(f"logged in to space {SPACE} at {base}; the session is kept in {path}\n"), out
    assert err == (f"cotal: warning: your earlier login session for space {SPACE} was not signed out: the IdP at"
                   f" {base} failed to sign out (HTTP 503) - it stays live at the IdP until it expires or you end it"
                   " there\n")  # fmt: skip
