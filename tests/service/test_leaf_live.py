"""Leaf nodes: the one supported shape, end to end, and the doctor's bypass warning (issue 17 item 5).

docs/deploy.md "Leaf nodes". A root made as docs/deploy.md makes one (``cotal space add
--new-root``, then ``--server`` to push the space), a hub node on 127.0.0.1 trusting it with a
leaf-node listener, and the space's full auth service on the hub. The leaf's config is
``cotal broker leaf-config``'s text (links of the system account and of the space's data
account, no JetStream):

* with no callout member connected to the leaf, a connect through the leaf with the sentinel
  and a fresh bearer is refused: the auth account's callout runs on the leaf, and the hub's
  callout members never see it;
* with a callout replica whose callout connection is on the leaf (``--callout-server``) and
  whose stores stay on the hub, ``cotal check`` through the leaf passes: minted with the grant
  (a publish within it comes back, one outside is refused), and a tampered bearer refused;
* an account pushed to the hub reaches the leaf's resolver (its links carry the system account),
  so a revocation pushed to the hub holds on the leaf too;
* ``cotal doctor auth`` is silent with no leaf and with that leaf and its replica, and warns
  while the leaf has no callout member connected (naming the replica to run); a plain leaf whose link
  carries a data-account user's creds admits a client with no credentials at all into the space's
  data account, and the doctor warns about it by name, naming ``cotal broker leaf-config``.

Only the nats-servers the test starts are stopped, by pid.
"""

from __future__ import annotations

import functools
import json
import os
import signal

import pytest
import trio

from cotal_trio.broker import provision
from cotal_trio.broker.config import Node, render_node
from cotal_trio.broker.process import free_port
from cotal_trio.natsio import open_connection, open_loop
from cotal_trio.ops.leaf_links import read_leaf_links
from cotal_trio.service.hosting import ServiceConfig, run_service
from cotal_trio.state import RootPaths, load_broker, load_space
from tests.support.cli_root import cotal
from tests.support.cluster import node

pytestmark = pytest.mark.broker

SPACE = "alpha"
CEILING_S = 60
BYPASS_WARNING = "does not trust the root's operator through the system account"


async def start_hub(nursery, tmp_path, paths: RootPaths) -> tuple[str, int]:
    """One hub node rendered from the root with a leaf-node listener; (client URL, leaf port)."""
    port, leaf_port = free_port(), free_port()
    hub = Node(
        name="hub", port=port, resolver_dir=tmp_path / "hub" / "resolver", jetstream_dir=tmp_path / "hub" / "js",
        leafnode_port=leaf_port,
    )
    config = tmp_path / "hub.conf"
    config.write_text(render_node(load_broker(paths.broker_json), hub, auth_timeout_s=None))
    await nursery.start(functools.partial(node, config, port))
    return f"nats://127.0.0.1:{port}", leaf_port


async def until_linked(paths: RootPaths, hub: str, leaf: str, account: str) -> None:
    """Until the hub reports ``leaf``'s link of ``account`` (bounded by the caller's ceiling)."""
    broker = load_broker(paths.broker_json)
    while not any(link.leaf == leaf and link.account == account for link in await read_leaf_links(hub, broker)):
        await trio.sleep(0.2)


async def doctor_warnings(capsys, paths: RootPaths, hub: str) -> list[dict]:
    """The doctor's leaf-node warnings (it stays healthy: they are warnings)."""
    code, out, err = await cotal(capsys, "doctor", "auth", "--json", "--root", str(paths.root), "--server", hub)
    assert code == 0, out + err
    return [f for f in json.loads(out)["findings"] if f["problem"].startswith("leaf node ")]


async def check(capsys, paths: RootPaths, server: str) -> tuple[int, str]:
    code, out, err = await cotal(capsys, "check", "--root", str(paths.root), "--space", SPACE, "--server", server)
    return code, out + "".join(line for line in err.splitlines(keepends=True) if "auth callout:" not in line)


async def test_a_connect_through_a_leaf_is_decided_by_the_replica_on_the_leaf(nursery, tmp_path, capsys):
    paths = RootPaths(tmp_path / "root")
    with trio.fail_after(CEILING_S):
        code, _, err = await cotal(capsys, "space", "add", SPACE, "--root", str(paths.root), "--new-root")
        assert code == 0, err
        hub, leaf_port = await start_hub(nursery, tmp_path, paths)
        code, out, err = await cotal(capsys, "space", "add", SPACE, "--root", str(paths.root), "--server", hub)
        assert code == 0 and "accounts pushed" in out, err
        await nursery.start(run_service, ServiceConfig(root=paths, server_url=hub, manifest=paths.spaces_manifest))
        while (await check(capsys, paths, hub))[0] != 0:
            await trio.sleep(0.2)  # until the full lane serves
        assert await doctor_warnings(capsys, paths, hub) == []  # no leaf at all

        port = free_port()
        code, text, err = await cotal(
            capsys, "broker", "leaf-config", "--root", str(paths.root), "--node", "leaf1", "--port", str(port),
            "--hub", f"nats-leaf://127.0.0.1:{leaf_port}",
        )
        assert (code, err) == (0, ""), err
        (tmp_path / "leaf1.conf").write_text(text)
        await nursery.start(functools.partial(node, tmp_path / "leaf1.conf", port))
        leaf = f"nats://127.0.0.1:{port}"
        data_account = load_space(paths.space(SPACE).callout_json, SPACE).data_account
        await until_linked(paths, hub, "leaf1", data_account)

        # the hub's callout members never see a connect made at the leaf
        code, out = await check(capsys, paths, leaf)
        assert code != 0 and "✗ connect with the sentinel creds and the bearer" in out, out
        assert "Authorization Violation" in out, out
        # and the doctor says so, naming the replica to run there
        warnings = await doctor_warnings(capsys, paths, hub)
        assert [(w["severity"], w["problem"].split(":")[0]) for w in warnings] == [
            ("warning", "leaf node leaf1 has no callout member of the space connected")
        ], warnings
        assert f"`cotal service run callout-replica --space {SPACE} --root {paths.root} --server <hub seeds> --callout-server {leaf}`" in warnings[0]["next"]

        # a replica answering the leaf's callout, its stores on the hub
        replica = ServiceConfig(root=paths, server_url=hub, space=SPACE, callout_only=True, callout_server=leaf)
        await nursery.start(run_service, replica)
        code, out = await check(capsys, paths, leaf)
        assert code == 0 and "check passed\n" in out, out
        for step in ("✓ connect with the sentinel creds and the bearer", "✓ publish and receive within the grant",
                     "✓ a publish outside the grant is refused", "✓ a tampered bearer is refused"):  # fmt: skip
            assert step in out, out
        assert await doctor_warnings(capsys, paths, hub) == []  # the supported shape

        # a push to the hub (re-signed accounts, as a revocation pushes them) reaches the leaf
        code, out, err = await cotal(capsys, "space", "add", SPACE, "--root", str(paths.root), "--server", hub)
        assert code == 0, err
        pushed = provision.load_space_accounts(paths, load_broker(paths.broker_json), SPACE).data_jwt
        stored = paths.root / "nodes" / "leaf1" / "resolver" / f"{data_account}.jwt"
        while not (stored.exists() and stored.read_text().strip() == pushed):
            await trio.sleep(0.2)

        # a plain leaf whose link carries a data-account user's creds: no callout at all
        bypass_port = free_port()
        creds = paths.root / "nodes" / "leaf1" / f"leaf-{SPACE}.creds"
        (tmp_path / "bypass.conf").write_text(
            f'server_name: bypass1\nlisten: "127.0.0.1:{bypass_port}"\n'
            f'leafnodes {{\n  remotes: [ {{ url: "nats-leaf://127.0.0.1:{leaf_port}", credentials: "{creds}" }} ]\n}}\n'
        )
        bypass_pid = await nursery.start(functools.partial(node, tmp_path / "bypass.conf", bypass_port))
        await until_linked(paths, hub, "bypass1", data_account)
        received: list[bytes] = []
        material = load_space(paths.space(SPACE).callout_json, SPACE)
        reader = provision.mint_service_user(material, name="test-reader", permissions={}, iat=0, exp=None)
        async with open_loop(), open_connection(hub, creds=reader, name="test-reader", reconnect=False) as inside, \
                open_connection(f"nats://127.0.0.1:{bypass_port}", name="anyone", reconnect=False) as anyone:  # fmt: skip
            await inside.subscribe(f"cotal.{SPACE}.>", on_message=lambda m: received.append(m.data))
            await inside.flush()
            while not received:  # bounded by CEILING_S: the interest crosses the link
                await anyone.publish(f"cotal.{SPACE}.chat.general", b"no credentials at all")
                await anyone.flush()
                await trio.sleep(0.2)
        warnings = await doctor_warnings(capsys, paths, hub)
        assert len(warnings) == 1 and BYPASS_WARNING in warnings[0]["problem"], warnings
        assert warnings[0]["severity"] == "warning" and warnings[0]["subject"] == f"space {SPACE}"
        assert "leaf node bypass1 links its account" in warnings[0]["problem"]
        assert "cotal broker leaf-config --node bypass1" in warnings[0]["next"]
        assert "--callout-server" in warnings[0]["next"]

        os.kill(bypass_pid, signal.SIGTERM)
        while any(link.leaf == "bypass1" for link in await read_leaf_links(hub, load_broker(paths.broker_json))):
            await trio.sleep(0.2)
        assert await doctor_warnings(capsys, paths, hub) == []
