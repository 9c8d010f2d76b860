"""Views, managers, chat sessions and the host-only doors of a running lane, on a real nats-server
(spec "Listener policy", "Proxy attribution", "Host-only routes"; docs/views.md,
docs/managers-and-sessions.md, docs/host-doors.md)."""

from __future__ import annotations

import functools
import logging

import pytest
import trio

from cotal_trio.broker.process import free_port
from cotal_trio.service.embedded import UpConfig, run_up
from cotal_trio.lane.callout.views import INSTANCE_GONE, SESSION_GONE
from cotal_trio.state import RootPaths
from tests.support.stack import SPACE, Stack, client, request_json
from tests.support.connect_authority_live import _loopback, _register

pytestmark = pytest.mark.broker


def refused():
    from cotal_trio.core.errors import Unavailable

    return pytest.RaisesGroup(pytest.RaisesExc(Unavailable, match="Authorization Violation"), flatten_subgroups=True)


async def _violation(conn, subject: str) -> str:
    before = conn.error_count
    await conn.publish(subject, b"x")
    return await conn.wait_error(after=before)


async def _allowed(conn, subject: str) -> None:
    before = conn.error_count
    await conn.publish(subject, b"x")
    await conn.flush()
    await trio.sleep(0.2)  # a permissions violation arrives asynchronously
    assert conn.error_count == before, subject


def _callout_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "cotal.callout"]


async def test_a_manager_caller_reaches_its_one_manager_until_it_is_retired(stack, caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")
    stack.grant("alice", "mgr", scope=("supervise",))
    stack.grant("alice", "cli", scope=("spawn",))
    status, body = await stack.exchange({"idpToken": stack.idp_token("alice"), "actor": "cli", "view": "manager-caller"})
    assert status == 401 and "no live manager" in body["error"]
    instance = await _register(stack, "alice", "mgr")
    status, body = await stack.exchange({"idpToken": stack.idp_token("alice"), "actor": "cli", "view": "manager-caller"})
    assert status == 200 and body["managerInstanceId"] == instance
    bearer = body["token"]
    with trio.fail_after(15):
        async with client(stack, bearer) as conn:
            await _allowed(conn, f"cotal.{SPACE}.mgr.{instance}.call")
            await _allowed(conn, f"cotal.{SPACE}.mgr.{instance}.status")  # a spawn holder's view
            error = await _violation(conn, f"cotal.{SPACE}.ch.team.news")
            assert "permissions violation" in error.lower()
    status, body = await _loopback(
        stack, "/manager-service-authority",
        {"idpToken": stack.idp_token("alice"), "request": {"kind": "retire", "actor": "mgr", "instanceId": instance}},
    )
    assert (status, body) == (200, {"retired": True, "instanceId": instance})
    with trio.fail_after(15), refused():
        async with client(stack, bearer):
            pass
    assert any(INSTANCE_GONE.format(id=instance) in line for line in _callout_lines(caplog))


async def test_a_channel_writer_view_needs_admin_at_the_exchange_and_at_connect(stack, caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")
    row = stack.grant("bob", "ops", scope=("admin",))
    status, body = await stack.exchange({"idpToken": stack.idp_token("bob"), "actor": "ops", "view": "channel-writer"})
    assert status == 200, body
    with trio.fail_after(15):
        async with client(stack, body["token"]) as conn:
            await _allowed(conn, f"cotal.{SPACE}.ctl.channels.set")
            assert "permissions violation" in (await _violation(conn, f"cotal.{SPACE}.ch.team.news")).lower()
    stack.grant("carol", "ops", scope=("spawn",))
    status, refusal = await stack.exchange({"idpToken": stack.idp_token("carol"), "actor": "ops", "view": "channel-writer"})
    assert status == 401 and "needs ledger scope admin" in refusal["error"]
    # The row loses admin (same incarnation): the callout re-checks the view's scope.
    from dataclasses import replace

    from cotal_trio.state import write_row

    write_row(stack.space_paths, replace(row, scope=("spawn",)))
    with trio.fail_after(15), refused():
        async with client(stack, body["token"]):
            pass
    assert any("admin" in line and "outcome=denied" in line for line in _callout_lines(caplog))


@pytest.fixture
async def public_stack(nursery, tmp_path, nats_server_bin: str):
    paths = RootPaths(tmp_path / "root")
    port = free_port()
    config = UpConfig(
        paths=paths, space=SPACE, port=free_port(), auth_timeout_s=2, nats_server=nats_server_bin,
        exchange_public_port=port,
    )  # fmt: skip
    with trio.fail_after(20):
        info = await nursery.start(functools.partial(run_up, config))
    yield Stack(info=info, paths=paths), f"http://127.0.0.1:{port}"


async def _public(url: str, path: str, body: dict) -> tuple[int, dict]:
    return await trio.to_thread.run_sync(request_json, url + path, body)


async def test_a_chat_session_bearer_reaches_its_session_until_it_is_retired(public_stack, caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")
    stack, url = public_stack
    stack.grant("alice", "cli")
    credential = {"idpToken": stack.idp_token("alice"), "actor": "cli"}
    status, opened = await _public(url, "/chat-session/open", {**credential, "endpoint": "helper"})
    assert status == 200 and opened["endpoint"] == "helper" and opened["epoch"] == 1 and len(opened["sessionId"]) == 43
    session = opened["sessionId"]
    status, minted = await _public(url, "/chat-session/bearer", {**credential, "sessionId": session})
    assert status == 200 and minted["sessionId"] == session and minted["exp"] <= opened["exp"]
    with trio.fail_after(15):
        async with client(stack, minted["token"]) as conn:
            await _allowed(conn, f"cotal.{SPACE}.session.{session}.in")
            assert "permissions violation" in (await _violation(conn, f"cotal.{SPACE}.session.{session}.out")).lower()
    stack.grant("mallory", "cli")
    status, body = await _public(url, "/chat-session/bearer", {"idpToken": stack.idp_token("mallory"), "actor": "cli", "sessionId": session})
    assert status == 401 and "no open chat session" in body["error"]
    status, body = await _public(url, "/chat-session/retire", {**credential, "sessionId": session})
    assert (status, body) == (200, {"retired": True, "sessionId": session})
    with trio.fail_after(15), refused():
        async with client(stack, minted["token"]):
            pass
    assert any(SESSION_GONE.format(id=session) in line for line in _callout_lines(caplog))
    status, body = await _public(url, "/chat-session/bearer", {**credential, "sessionId": session})
    assert status == 401


async def test_the_host_only_doors_are_served_on_the_loopback_face_alone(public_stack):
    stack, url = public_stack
    row = stack.grant("alice", "cli")
    # verify-enrollment: the manager actor's scope comes from the ledger; no instance yet: 412
    stack.grant("alice", "mgr", scope=("supervise",))
    owner = stack.owner("alice")
    request = {"kind": "enroll", "actor": "mgr", "instanceId": "a" * 26, "serveEpoch": 1, "agent": "worker"}
    status, body = await _loopback(stack, "/manager-service-authority/verify-enrollment", {"owner": owner, "request": request})
    assert status == 412, body
    instance = await _register(stack, "alice", "mgr")
    status, body = await _loopback(
        stack, "/manager-service-authority/verify-enrollment", {"owner": owner, "request": {**request, "instanceId": instance}}
    )
    assert (status, body) == (200, {"authorized": True, "owner": owner, "actor": "mgr", "instanceId": instance, "serveEpoch": 1})
    # the opt-in consent door is not served without toolResultConsent
    status, body = await _loopback(stack, "/tool-result-consent/issue", {})
    assert status == 404
    # a retirement through the door: the row file goes, the answer says what was done
    target = {"owner": owner, "actor": "cli", "lifecycleUid": row.lifecycle_uid}
    status, body = await _loopback(stack, "/interactive-lifecycle/retire", target)
    assert status == 200 and body["outcome"] == "retired", body
    assert not (stack.space_paths.actors_dir / f"{owner}.cli.json").exists()
    status, body = await _loopback(stack, "/interactive-lifecycle/retire", target)
    assert status == 404 and body["outcome"] == "not-executed"
    # the capability gates every door, and the public face serves none of them
    status, body = await _loopback(stack, "/interactive-lifecycle/retire", target, cap="0" * 64)
    assert status == 401 and body["outcome"] == "not-executed"
    for path in ("/interactive-lifecycle/retire", "/manager-service-authority/verify-enrollment", "/tool-result-human-proof/verify"):
        status, body = await _public(url, path, target)
        assert status == 404, (path, body)
