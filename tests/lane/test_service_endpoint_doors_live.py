"""Issue 19 item 1, service endpoints, on a real nats-server (spec "Listener policy", "Callout
replicas"; docs/http-api.md "Service endpoints").

A ``cotal up`` stack with a public face, with and without ``--service-endpoints``: the doors are
404 without it; with it a person registers an endpoint, takes a ``service-host`` bearer, and the
host's connection through the callout receives the endpoint's calls on both rails and answers
each once, and can do nothing else (each checked by publishing or subscribing on the broker).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time

import pytest
import trio

from cotal_trio.broker.process import free_port
from cotal_trio.core.bearer import BearerGrant, issue_bearer
from cotal_trio.core.errors import Unavailable
from cotal_trio.core.identity import mint_lifecycle_uid
from cotal_trio.core.ledger import LedgerKind, LedgerRow, hash_actor_token
from cotal_trio.core.manifest import parse_manifest
from cotal_trio.core.service_endpoints import NOT_SERVING
from cotal_trio.core.views import ServiceEndpointBinding
from cotal_trio.lane.service_endpoints import open_store_user
from cotal_trio.service.embedded import UpConfig, run_up
from cotal_trio.state import RootPaths, load_issuer_keys, load_space, write_row
from tests.support.stack import SPACE, Stack, client, request_json

pytestmark = pytest.mark.broker

CEILING_S = 20


def refused():
    return pytest.RaisesGroup(pytest.RaisesExc(Unavailable, match="Authorization Violation"), flatten_subgroups=True)


async def _up(nursery, tmp_path, nats_server_bin: str, **flags) -> tuple[Stack, str]:
    paths = RootPaths(tmp_path / "root")
    port = free_port()
    config = UpConfig(
        paths=paths, space=SPACE, port=free_port(), auth_timeout_s=2, nats_server=nats_server_bin,
        exchange_public_port=port, **flags,
    )  # fmt: skip
    with trio.fail_after(CEILING_S):
        info = await nursery.start(functools.partial(run_up, config))
    return Stack(info=info, paths=paths), f"http://127.0.0.1:{port}"


async def _public(url: str, path: str, body: dict) -> tuple[int, dict]:
    return await trio.to_thread.run_sync(request_json, url + path, body)


def _callout_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "cotal.callout"]


async def _violation(conn, action) -> str:
    before = conn.error_count
    await action()
    with trio.fail_after(5):
        return (await conn.wait_error(after=before)).lower()


async def test_without_the_flag_both_doors_are_404_and_no_host_connects(nursery, tmp_path, nats_server_bin, caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")
    stack, url = await _up(nursery, tmp_path, nats_server_bin)
    row = stack.grant("alice", "svc", scope=("service-endpoint",))
    body = {"idpToken": stack.idp_token("alice"), "request": {"kind": "register", "actor": "svc", "endpoint": "search"}}
    for path in ("/service-endpoint-authority", "/service-endpoint-host"):
        status, answer = await _public(url, path, body)
        assert status == 404, (path, answer)
        assert "/service-endpoint" not in answer["error"]  # the unknown-path sentence lists no such door
    entry = parse_manifest(stack.paths.spaces_manifest.read_bytes()).spaces[0]
    assert not entry.service_endpoints
    # a service-host bearer signed with the space's own issuer key (no door mints one here) is
    # still denied: this lane hosts no service endpoints
    binding = ServiceEndpointBinding(endpoint="search", instance_id="s" * 26)
    grant = BearerGrant(
        owner=row.owner, actor="svc", scope=row.scope, lifecycle_uid=row.lifecycle_uid, view="service-host",
        service_endpoint=binding,
    )  # fmt: skip
    key = load_issuer_keys(stack.space_paths.issuer_json, SPACE).active
    bearer = issue_bearer(grant, key=key, space=SPACE, now=int(time.time()), ttl_s=120)[0]
    with trio.fail_after(CEILING_S), refused():
        async with client(stack, bearer):
            pass
    assert any(NOT_SERVING.split(" - ")[0] in line for line in _callout_lines(caplog))


@pytest.fixture
async def served(nursery, tmp_path, nats_server_bin):
    return await _up(nursery, tmp_path, nats_server_bin, service_endpoints=True)


async def _register(stack: Stack, url: str, sub: str, actor: str, endpoint: str = "search") -> dict:
    request = {"kind": "register", "actor": actor, "endpoint": endpoint, "label": "index"}
    status, answer = await _public(url, "/service-endpoint-authority", {"idpToken": stack.idp_token(sub), "request": request})
    assert status == 200, answer
    return answer


async def _host_bearer(stack: Stack, url: str, sub: str, actor: str, registration: dict) -> dict:
    body = {
        "idpToken": stack.idp_token(sub), "actor": actor, "endpoint": registration["endpoint"],
        "instanceId": registration["instanceId"],
    }  # fmt: skip
    status, answer = await _public(url, "/service-endpoint-host", body)
    assert status == 200, answer
    return answer


async def test_a_registered_host_serves_its_endpoint_and_nothing_else(served, caplog):
    caplog.set_level(logging.INFO, logger="cotal.callout")
    stack, url = served
    assert parse_manifest(stack.paths.spaces_manifest.read_bytes()).spaces[0].service_endpoints  # recorded, as the face
    stack.grant("alice", "svc", scope=("service-endpoint",))
    owner = stack.owner("alice")
    registration = await _register(stack, url, "alice", "svc")
    assert registration["owner"] == owner and registration["actor"] == "svc" and registration["serveEpoch"] == 1
    minted = await _host_bearer(stack, url, "alice", "svc", registration)
    assert (minted["endpoint"], minted["instanceId"], minted["owner"]) == ("search", registration["instanceId"], owner)

    material = load_space(stack.space_paths.callout_json, SPACE)
    caller_rights = {"pub": {"allow": [f"cotal.{SPACE}.ep.>"]}, "sub": {"allow": ["_INBOX.>"]}}
    calls: list[str] = []
    with trio.fail_after(CEILING_S):
        async with client(stack, minted["token"]) as host, open_store_user(
            material, stack.info.server_url, name="test-caller", permissions=caller_rights, iat=int(time.time()),
            reconnect=False,
        ) as caller:

            def answer(msg):
                calls.append(msg.subject)
                host.publish_nowait(msg.reply, json.dumps({"served": msg.subject}).encode())

            for subject in (f"cotal.{SPACE}.ep.search.*.*.*", f"cotal.{SPACE}.ep.v1.*.*.*.search.*"):
                await host.subscribe(subject, queue="search", on_message=answer)
            await host.flush()
            legacy = f"cotal.{SPACE}.ep.search.ping.{owner}.cli"
            issued = f"cotal.{SPACE}.ep.v1.g1.{owner}.cli.search.ping"
            for subject in (legacy, issued):
                reply = await caller.request(subject, b"{}")
                assert json.loads(reply.data) == {"served": subject}
            assert calls == [legacy, issued]
            # refused elsewhere: another endpoint's calls, the space's chat, a publish that is no reply
            error = await _violation(host, functools.partial(
                host.subscribe, f"cotal.{SPACE}.ep.other.*.*.*", on_message=answer))  # fmt: skip
            assert "permissions violation for subscription" in error
            error = await _violation(host, functools.partial(host.publish, f"cotal.{SPACE}.ch.team.news", b"x"))
            assert "permissions violation for publish" in error
            error = await _violation(host, functools.partial(host.publish, "_INBOX.unasked", b"x"))
            assert "permissions violation for publish" in error
            assert host.is_connected  # refusals deny the operation, never the connection

    # a bad credential is denied: garbage in place of the bearer, and an IdP token at the door
    with trio.fail_after(CEILING_S), refused():
        async with client(stack, minted["token"][:-4] + "AAAA"):
            pass
    status, answer = await _public(url, "/service-endpoint-host", {
        "idpToken": stack.idp_token("alice")[:-4] + "AAAA", "actor": "svc", "endpoint": "search",
        "instanceId": registration["instanceId"],
    })  # fmt: skip
    assert status == 401, answer

    # retired: the bearer minted before no longer connects, and the door mints no new one
    status, answer = await _public(url, "/service-endpoint-authority", {
        "idpToken": stack.idp_token("alice"),
        "request": {"kind": "retire", "actor": "svc", "endpoint": "search", "instanceId": registration["instanceId"]},
    })  # fmt: skip
    assert (status, answer) == (200, {"retired": True, "endpoint": "search", "instanceId": registration["instanceId"]})
    with trio.fail_after(CEILING_S), refused():
        async with client(stack, minted["token"]):
            pass
    assert any("no longer registered to this principal" in line for line in _callout_lines(caplog))
    status, answer = await _public(url, "/service-endpoint-host", {
        "idpToken": stack.idp_token("alice"), "actor": "svc", "endpoint": "search",
        "instanceId": registration["instanceId"],
    })  # fmt: skip
    assert status == 404 and "is not registered to svc" in answer["error"]


async def test_the_doors_refuse_with_the_error_shapes_of_the_other_doors(served):
    stack, url = served
    stack.grant("alice", "svc", scope=("service-endpoint",))
    stack.grant("alice", "plain", scope=("spawn",))
    stack.grant("bob", "svc", scope=("service-endpoint",))
    token = stack.idp_token("alice")
    cases = [
        ("/service-endpoint-authority", [], 400, "service-endpoint authority needs { idpToken, request }"),
        ("/service-endpoint-authority", {"idpToken": token, "request": {"kind": "register", "actor": "svc",
         "endpoint": "v1"}}, 400, "endpoint must be 1 to 64 characters"),
        ("/service-endpoint-authority", {"idpToken": token, "request": {"kind": "register", "actor": "plain",
         "endpoint": "search"}}, 403, "lacks scope service-endpoint"),
        ("/service-endpoint-authority", {"idpToken": token, "request": {"kind": "register", "actor": "nobody",
         "endpoint": "search"}}, 401, ""),
        ("/service-endpoint-host", {"idpToken": token, "actor": "svc", "endpoint": "search"}, 400,
         "/service-endpoint-host needs instanceId"),
        ("/service-endpoint-host", {"idpToken": token, "actor": "svc", "endpoint": "search", "instanceId": "x"},
         400, "instanceId must be the id"),
    ]  # fmt: skip
    for path, body, status, fragment in cases:
        got, answer = await _public(url, path, body)
        assert got == status and fragment in answer["error"], (body, got, answer)
    registration = await _register(stack, url, "alice", "svc")
    # the name is alice's: bob's registration is a conflict, and alice again takes the next epoch
    status, answer = await _public(url, "/service-endpoint-authority", {
        "idpToken": stack.idp_token("bob"), "request": {"kind": "register", "actor": "svc", "endpoint": "search"}})
    assert status == 409 and "registered to another principal" in answer["error"]
    again = await _register(stack, url, "alice", "svc")
    assert again["serveEpoch"] == 2 and again["instanceId"] != registration["instanceId"]
    # the first registration's host bearer is refused at the door (the name moved on)
    status, answer = await _public(url, "/service-endpoint-host", {
        "idpToken": token, "actor": "svc", "endpoint": "search", "instanceId": registration["instanceId"]})
    assert status == 404, answer
    # a service-host view is never minted by /exchange
    status, answer = await stack.exchange({"idpToken": token, "actor": "svc", "view": "service-host"})
    assert status == 400 and "POST /service-endpoint-host" in answer["error"]


async def test_a_managed_agent_hosts_an_endpoint_its_person_registered(served):
    """The agent arm: the person registers for their managed actor, the agent takes its own
    service-host bearer with its actor token and connects through the callout."""
    stack, url = served
    person = stack.grant("alice", "svc", scope=("service-endpoint",))
    token = "agent-secret-" + os.urandom(8).hex()
    agent = LedgerRow(
        kind=LedgerKind.MANAGED, owner=person.owner, actor="indexer", scope=("service-endpoint",),
        allow_subscribe=("team.>",), allow_publish=("team.>",), role=None, parent=person.principal, label=None,
        token_hash=hash_actor_token(token), lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
        granted_at="2026-11-29T10:00:00Z",
    )  # fmt: skip
    write_row(stack.space_paths, agent)
    registration = await _register(stack, url, "alice", "indexer", endpoint="index")
    assert registration["actor"] == "indexer"
    body = {"owner": person.owner, "actor": "indexer", "actorToken": token, "endpoint": "index",
            "instanceId": registration["instanceId"]}  # fmt: skip
    status, minted = await _public(url, "/service-endpoint-host", body)
    assert status == 200 and minted["exp"] - time.time() <= 300, minted
    with trio.fail_after(CEILING_S):
        async with client(stack, minted["token"]) as host:
            await host.subscribe(f"cotal.{SPACE}.ep.index.*.*.*", on_message=lambda msg: None)
            await host.flush()
            error = await _violation(host, functools.partial(
                host.subscribe, f"cotal.{SPACE}.ep.search.*.*.*", on_message=lambda msg: None))  # fmt: skip
            assert "permissions violation for subscription" in error
    status, answer = await _public(url, "/service-endpoint-host", {**body, "actorToken": "wrong"})
    assert status == 401, answer
    # the person asking for their agent's host bearer is told the agent takes it with its own
    # token (it was told to `cotal actor grant` it, which refuses a managed principal)
    by_person = {"idpToken": stack.idp_token("alice"), "actor": "indexer", "endpoint": "index",
                 "instanceId": registration["instanceId"]}  # fmt: skip
    status, answer = await _public(url, "/service-endpoint-host", by_person)
    assert (status, answer["error"]) == (401, (
        'actor "indexer" is a managed agent of this user, not an interactive actor - it takes its bearers '
        f"with its own actor token (owner, actor and actorToken; `cotal agent-bearer --owner {person.owner} "
        "--actor indexer --token-file <its token file>`)"
    )), answer
