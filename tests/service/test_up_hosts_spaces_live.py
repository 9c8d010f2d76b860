"""``cotal up`` hosts every user-auth space of ``<root>/spaces.json``, live (issue 3 item 1).

The ``stack`` fixture is ``run_up`` on a real nats-server. ``cotal space add`` / ``remove`` (here
their functions, :func:`add_space` / :func:`remove_space`) change the manifest the running stack
hosts; the lane starts or stops without a restart.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trio

from cotal_trio.broker.process import free_port
from cotal_trio.broker.spaces import add_space, remove_space
from cotal_trio.core.errors import ConfigError
from cotal_trio.core.manifest import parse_manifest
from cotal_trio.service.embedded import UpConfig, run_up
from cotal_trio.service.pins import choose_pin
from cotal_trio.state import RootPaths, read_json

from tests.support.stack import SPACE, Stack, client
from tests.support.up_hosts import Other, applied, until_applied

pytestmark = pytest.mark.broker

OTHER = "beta"


async def test_up_lists_its_space_in_spaces_json(stack: Stack) -> None:
    manifest = parse_manifest(stack.paths.spaces_manifest.read_bytes())
    assert [e.space for e in manifest.spaces] == [SPACE]
    assert stack.info.manifest == stack.paths.spaces_manifest
    assert stack.info.spaces == (SPACE,)
    assert (await until_applied(stack.paths, lambda s: s.get(SPACE) == {"state": "serving"})) == {
        SPACE: {"state": "serving"}
    }


async def test_space_add_and_remove_are_live_in_a_running_up(stack: Stack) -> None:
    pin = await choose_pin(stack.paths, OTHER, idp_url=None)  # as `cotal space add` does
    added = await add_space(stack.paths, OTHER, now=time.time(), idp_pin=pin)
    assert added.server_url == stack.info.server_url and added.hosted
    t0 = trio.current_time()
    await until_applied(stack.paths, lambda s: s.get(OTHER) == {"state": "serving"})
    assert trio.current_time() - t0 < 2  # "serves again within 2 s of the manifest change"

    other = Other(stack, OTHER)
    other.grant("alice", "cli")
    # The new space is pinned to the root's development IdP, the one `cotal up` serves.
    assert read_json(other.paths.idp_json)["issuer"] == stack.info.pin.issuer
    beta_bearer = await other.bearer("alice", "cli")
    assert await other.connects(beta_bearer)
    # Its own keys: the stack's space refuses a bearer of the new space, and the reverse.
    stack.grant("alice", "cli")
    alpha_bearer = await stack.bearer("alice", "cli")
    assert not await other.connects(alpha_bearer)
    async with client(stack, alpha_bearer):
        pass

    await remove_space(stack.paths, OTHER, now=time.time(), lane_wait_s=10)
    spaces = await until_applied(stack.paths, lambda s: OTHER not in s)
    assert spaces == {SPACE: {"state": "serving"}}
    assert not other.paths.auth_service_json.exists()  # its lane removed its readiness file
    assert not await other.connects(beta_bearer)
    async with client(stack, alpha_bearer):  # the stack's own space never noticed
        pass


async def test_removing_ups_own_space_stops_it_and_up_keeps_running(stack: Stack) -> None:
    await remove_space(stack.paths, SPACE, now=time.time(), lane_wait_s=10)
    assert await until_applied(stack.paths, lambda s: SPACE not in s) == {}
    assert not stack.space_paths.auth_service_json.exists()
    await add_space(stack.paths, SPACE, now=time.time())
    await until_applied(stack.paths, lambda s: s.get(SPACE) == {"state": "serving"})
    stack.grant("alice", "cli")
    async with client(stack, await stack.bearer("alice", "cli")):
        pass


async def test_a_static_space_cannot_be_ups_space(tmp_path: Path, nats_server_bin: str) -> None:
    paths = RootPaths(tmp_path / "root")
    await add_space(paths, "frozen", static=True, now=time.time())  # no broker: provisions only
    config = UpConfig(paths=paths, space="frozen", port=free_port(), nats_server=nats_server_bin)
    with trio.fail_after(10), pytest.raises(ConfigError, match=r"space frozen is a static-auth space, .* `cotal space add frozen`"):
        await run_up(config)
    assert not paths.spaces_manifest.exists()


async def test_up_hosts_spaces_added_while_it_was_stopped(tmp_path: Path, nats_server_bin: str) -> None:
    paths = RootPaths(tmp_path / "root")
    pin = await choose_pin(paths, OTHER, idp_url=None)
    await add_space(paths, OTHER, now=time.time(), idp_pin=pin)  # no broker running: recorded, pushed at up
    config = UpConfig(paths=paths, space=SPACE, port=free_port(), nats_server=nats_server_bin)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(20):
            info = await nursery.start(functools.partial(run_up, config))
        assert info.spaces == (SPACE, OTHER)
        await until_applied(paths, lambda s: s == {SPACE: {"state": "serving"}, OTHER: {"state": "serving"}})
        stack = Stack(info=info, paths=paths)
        other = Other(stack, OTHER)
        other.grant("bob", "cli")
        assert await other.connects(await other.bearer("bob", "cli"))
        nursery.cancel_scope.cancel()


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _post_public(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_a_manifest_entry_gives_its_lane_a_public_face(stack: Stack) -> None:
    """Issue 3 item 2: "plus the public face its entry names"; changing the entry restarts the lane."""
    port = free_port()
    entry = {"space": SPACE, "exchangePublicPort": port, "exchangePublicUrl": "https://auth.example/alpha"}
    data = json.dumps({"version": 2, "spaces": [entry]}).encode()
    temp = stack.paths.spaces_manifest.with_name("spaces.json.new")
    temp.write_bytes(data)
    os.replace(temp, stack.paths.spaces_manifest)
    await until_applied(stack.paths, lambda s: applied(stack.paths)["manifestSha256"] == hashlib.sha256(data).hexdigest()
                        and s == {SPACE: {"state": "serving"}})
    base = f"http://127.0.0.1:{port}"
    status, health = await trio.to_thread.run_sync(_get, base + "/health")
    assert (status, health) == (200, {"ok": True, "issuer": f"urn:cotal:auth:{SPACE}"})
    status, doc = await trio.to_thread.run_sync(_get, base + "/.well-known/cotal-mesh")
    assert status == 200
    assert doc["space"] == SPACE and doc["server"] == stack.info.server_url
    assert doc["userAuth"]["endpoints"]["url"] == "https://auth.example/alpha"
    # The development IdP as `cotal up` serves it, under the space's pin.
    assert doc["userAuth"]["idp"] == {
        "url": stack.info.dev_idp_url, "issuer": stack.info.pin.issuer, "audience": stack.info.pin.audience,
    }
    assert doc["sentinelCreds"] == stack.sentinel_creds()
    # No capability on this face: the IdP token is the proof. The bearer it mints connects.
    stack.grant("alice", "cli")
    status, minted = await trio.to_thread.run_sync(
        _post_public, base + "/exchange", {"idpToken": stack.idp_token("alice"), "actor": "cli"}
    )
    assert status == 200, minted
    async with client(stack, minted["token"]):
        pass
    status, _ = await trio.to_thread.run_sync(_get, base + "/no-such-door")
    assert status == 404

    # Dropping the entry's public port restarts the lane without that listener.
    data = json.dumps({"version": 2, "spaces": [{"space": SPACE}]}).encode()
    temp.write_bytes(data)
    os.replace(temp, stack.paths.spaces_manifest)
    await until_applied(stack.paths, lambda s: applied(stack.paths)["manifestSha256"] == hashlib.sha256(data).hexdigest()
                        and s == {SPACE: {"state": "serving"}})
    with pytest.raises(OSError):
        await trio.to_thread.run_sync(_get, base + "/health")
