"""Issue 19 item 5: ``cotal login``'s polling against the development IdP over real HTTP, with one
clock the test owns for both sides (RFC 8628 section 3.5), so ``slow_down`` and ``expired_token``
happen without waiting.

:func:`run_device_login` takes its clock and sleep as ports; the dev IdP app takes the same clock.
The test's sleep moves the shared clock: by exactly what was asked, or less (a poll that comes
too early, which the IdP answers with ``slow_down``), or more (the laptop slept past the code's
lifetime, which the IdP answers with ``expired_token``). The sleeps the login asked for are the
assertion: 5 s, then 10 s after ``slow_down``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import urllib.request

import pytest
import trio
from quart import request
from quart_trio import QuartTrio

from cotal_trio.cli.login import run_device_login
from cotal_trio.core.device_flow import DeviceAuthorization
from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.devidp import DevicePolicy, build_dev_idp_app, create_dev_idp, mint_dev_token
from cotal_trio.http.idp_client import answer_user_code, fetch_session_token, request_device_code, sign_out
from cotal_trio.http.serve import serve_app
from cotal_trio.state import IdpPinRecord, save_idp_pin
from cotal_trio.state.login_sessions import LoginSession, save_session, session_path
from tests.support.cli_root import SPACE, cotal

CEILING_S = 20
T0 = 1_800_000_000.0
MATERIAL = create_dev_idp(lambda n: bytes(range(n)))


class SharedClock:
    """Unix seconds for the IdP and the login; ``sleep`` moves it by ``steps`` in turn (the
    asked-for seconds when the steps run out) and records what was asked."""

    def __init__(self, *steps: float) -> None:
        self.now, self.steps, self.asked = T0, list(steps), []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        self.now += self.steps.pop(0) if self.steps else seconds
        await trio.lowlevel.checkpoint()


async def _idp(nursery: trio.Nursery, clock: SharedClock, policy: DevicePolicy, *, polls: list | None = None) -> str:
    """The dev IdP served on a free port; ``polls``: answers ``(body, status)`` its first
    ``/device/token`` polls get instead (an IdP failing for a while), one each in turn."""
    app = build_dev_idp_app(MATERIAL, device=policy, clock=clock)

    @app.before_request
    async def failing():
        if polls and request.path == "/device/token":
            return polls.pop(0)
        return None

    port = await nursery.start(functools.partial(serve_app, app))
    return f"http://127.0.0.1:{port}"


async def _front(nursery: trio.Nursery, base: str, *, drop: set[int]) -> str:
    """A TCP front of ``base`` on a free port that closes its ``drop``-th connections (1-based)
    without a byte: a poll that loses its connection."""
    target = int(base.rsplit(":", 1)[1])
    accepted = 0

    async def pump(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await source.receive_some():
                await sink.send_all(data)
            await sink.send_eof()

    async def handle(client: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        async with client:
            if accepted in drop:
                return
            async with await trio.open_tcp_stream("127.0.0.1", target) as idp, trio.open_nursery() as pumps:
                pumps.start_soon(pump, client, idp)
                pumps.start_soon(pump, idp, client)

    (listener,) = await nursery.start(functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    return f"http://127.0.0.1:{listener.socket.getsockname()[1]}"


def _person(base: str, clock: SharedClock, *, approve: bool):
    """The ``show`` port: the person reads the code and approves (or denies) it at once."""

    async def show(authorization: DeviceAuthorization) -> None:
        bearer = mint_dev_token(MATERIAL, sub="alice", now=int(clock()))
        decide = functools.partial(answer_user_code, base, user_code=authorization.user_code, bearer=bearer, approve=approve)
        await trio.to_thread.run_sync(decide)

    return show


async def nobody(authorization: DeviceAuthorization) -> None:
    """The ``show`` port of a person who never answers the code."""
    await trio.lowlevel.checkpoint()


async def test_slow_down_adds_five_seconds_then_the_login_succeeds(nursery):
    clock = SharedClock(1)  # the first wait ends after 1 s of the 5 asked: too early
    base = await _idp(nursery, clock, DevicePolicy(interval_s=5, expires_in_s=600))
    with trio.fail_after(CEILING_S):
        signed = await run_device_login(base, space="alpha", client_id="cotal-cli", show=_person(base, clock, approve=True),
                                        clock=clock, sleep=clock.sleep)  # fmt: skip
        jwt = await trio.to_thread.run_sync(functools.partial(fetch_session_token, base, signed.session, relogin="x"))
    assert clock.asked == [5, 10]  # slow_down: the interval grew from 5 s to 10 s
    assert clock.now == T0 + 11
    assert jwt.count(".") == 2


async def test_expired_token_names_cotal_login_again(nursery):
    clock = SharedClock(700)  # the machine slept past the code's 600 s
    base = await _idp(nursery, clock, DevicePolicy(interval_s=5, expires_in_s=600))
    with trio.fail_after(CEILING_S), pytest.raises(ConfigError) as caught:
        await run_device_login(base, space="alpha", client_id="cotal-cli", show=nobody, clock=clock, sleep=clock.sleep)
    assert str(caught.value) == (
        "the user code expired before it was approved - run `cotal login --space alpha` again and approve the new"
        " code in time"
    )
    assert clock.asked == [5]  # one poll: the IdP said expired_token


async def test_an_unapproved_code_stops_polling_at_its_expiry(nursery):
    """The person never approves: polls every 5 s, and none after the code's 12 s lifetime."""
    clock = SharedClock()
    base = await _idp(nursery, clock, DevicePolicy(interval_s=5, expires_in_s=12))
    with trio.fail_after(CEILING_S), pytest.raises(ConfigError, match="the user code expired before it was approved"):
        await run_device_login(base, space="alpha", client_id="cotal-cli", show=nobody, clock=clock, sleep=clock.sleep)
    assert clock.asked == [5, 5]
    assert clock.now == T0 + 10


async def test_access_denied_names_cotal_login_again(nursery):
    clock = SharedClock()
    base = await _idp(nursery, clock, DevicePolicy(interval_s=5, expires_in_s=600))
    with trio.fail_after(CEILING_S), pytest.raises(ConfigError, match="denied at the IdP - run `cotal login --space alpha` again"):
        await run_device_login(base, space="alpha", client_id="cotal-cli", show=_person(base, clock, approve=False),
                               clock=clock, sleep=clock.sleep)  # fmt: skip


@pytest.mark.parametrize("failure", ["5xx", "lost-connection"])
async def test_a_poll_without_an_answer_is_retried_at_twice_the_interval(nursery, failure):
    """RFC 8628 3.5: a poll the IdP failed (503), or whose connection closed without an answer, is
    retried at a reduced frequency, and the login goes on to succeed: one failure is not the end."""
    clock = SharedClock()
    policy = DevicePolicy(interval_s=5, expires_in_s=600)
    if failure == "5xx":
        idp = base = await _idp(nursery, clock, policy, polls=[({"message": "overloaded"}, 503)])
    else:
        idp = await _idp(nursery, clock, policy)
        base = await _front(nursery, idp, drop={2})  # 1: /device/code; 2: the first poll
    with trio.fail_after(CEILING_S):
        signed = await run_device_login(base, space="alpha", client_id="cotal-cli", show=_person(idp, clock, approve=True),
                                        clock=clock, sleep=clock.sleep)  # fmt: skip
        jwt = await trio.to_thread.run_sync(functools.partial(fetch_session_token, idp, signed.session, relogin="x"))
    assert clock.asked == [5, 10]
    assert jwt.count(".") == 2


async def test_an_idp_failing_until_the_expiry_ends_the_login_as_unavailable(nursery):
    clock = SharedClock()
    base = await _idp(nursery, clock, DevicePolicy(interval_s=5, expires_in_s=30), polls=[({"message": "overloaded"}, 503)] * 9)
    with trio.fail_after(CEILING_S), pytest.raises(Unavailable) as caught:
        await run_device_login(base, space="alpha", client_id="cotal-cli", show=nobody, clock=clock, sleep=clock.sleep)
    assert str(caught.value) == (
        "the IdP did not answer the login's polls before the user code expired (HTTP 503: overloaded) - check that the"
        " IdP runs, then run `cotal login --space alpha` again"
    )
    assert clock.asked == [5, 10]  # polls at 5 s and 15 s; the next, at 35 s, would be past the 30 s lifetime


async def test_a_refused_poll_still_ends_the_login_at_once(nursery):
    clock = SharedClock()
    base = await _idp(nursery, clock, DevicePolicy(interval_s=5, expires_in_s=600),
                      polls=[({"error": "invalid_grant", "error_description": "unknown device code"}, 400)])  # fmt: skip
    with trio.fail_after(CEILING_S), pytest.raises(ConfigError) as caught:
        await run_device_login(base, space="alpha", client_id="cotal-cli", show=nobody, clock=clock, sleep=clock.sleep)
    assert str(caught.value) == ("the IdP refused the login (invalid_grant: unknown device code) - run `cotal login"
                                 " --space alpha` again")  # fmt: skip
    assert clock.asked == [5]


@pytest.mark.parametrize(("status", "revoked"), [(200, True), (401, True), (404, False), (403, False)])
async def test_sign_out_counts_only_an_answer_that_revoked(nursery, status, revoked):
    """`cotal logout` says "the session is revoked" only when the IdP said so: 200, or 401 (the
    session is already gone). Any other refusal (an IdP without /sign-out, 404; a forbidden one)
    keeps the session file and names the status, instead of claiming what did not happen."""
    app = QuartTrio("no-sign-out")

    @app.post("/sign-out")
    async def answer():
        return {"error": "nope"}, status

    base = f"http://127.0.0.1:{await nursery.start(functools.partial(serve_app, app))}"
    call = functools.partial(sign_out, base, "opaque-session")
    if revoked:
        await trio.to_thread.run_sync(call)
        return
    with pytest.raises(ConfigError) as refused:
        await trio.to_thread.run_sync(call)
    assert str(refused.value) == (f"the IdP at {base} refused the sign-out (HTTP {status}) - the session may still be"
                                  " live: sign out at the IdP itself, then delete the session file")  # fmt: skip


async def test_logout_keeps_the_session_file_when_the_idp_refuses_the_sign_out(nursery, root, capsys, tmp_path, monkeypatch):
    app = QuartTrio("no-sign-out")

    @app.post("/sign-out")
    async def answer():
        return {"error": "not found"}, 404

    base = f"http://127.0.0.1:{await nursery.start(functools.partial(serve_app, app))}"
    save_idp_pin(root.space.idp_json, IdpPinRecord(kind="oidc", url=base, issuer=base, audience=base, jwks_uri=f"{base}/jwks"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    path = session_path(os.environ, space=SPACE, issuer=base)
    save_session(path, LoginSession(space=SPACE, issuer=base, idp_url=base, session="s", created_at=1, expires_at=None))
    code, out, err = await cotal(capsys, "logout", "--space", SPACE, "--root", str(root.paths.root))
    assert (code, out) == (1, "")
    assert err == (f"cotal: the IdP at {base} refused the sign-out (HTTP 404) - the session may still be live: sign out"
                   f" at the IdP itself, then delete the session file {path}\n")  # fmt: skip
    assert path.exists()


async def test_the_device_page_says_pending_only_for_a_pending_code(nursery):
    """The development IdP's ``/device`` page (the ``verification_uri_complete`` `cotal login`
    prints) tells the person whether the code they hold is waiting, not "pending" for any text."""
    clock = SharedClock()
    base = await _idp(nursery, clock, DevicePolicy(interval_s=5, expires_in_s=600))
    issued = await trio.to_thread.run_sync(functools.partial(request_device_code, base, client_id="cotal-cli"))
    code = issued["user_code"]

    def page(user_code: str) -> dict:
        with urllib.request.urlopen(f"{base}/device?user_code={user_code}", timeout=5) as answer:
            return json.loads(answer.read())

    assert await trio.to_thread.run_sync(page, code) == {
        "user_code": code, "status": "pending", "approve": f"cotal dev-idp approve --user-code {code} --sub <you>"}
    assert await trio.to_thread.run_sync(page, "ZZZZ-ZZZZ") == {
        "user_code": "ZZZZ-ZZZZ", "status": "not pending",
        "fix": "no pending user code matches - check the code `cotal login` printed, or start `cotal login` again"}
