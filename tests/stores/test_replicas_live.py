"""Issue 17 item 1 on real nats-servers: a space's stores at the replica count its entry asks for.

The root is made as docs/deploy.md makes one (``cotal space add --new-root``, then ``cotal space
add --server URL --replicas N`` once the broker runs), and the space's full lane is the one
``cotal auth-service --spaces`` builds (:func:`~cotal_trio.service.hosting.lane_factory`):

* one node: ``replicas`` 3 is refused at the lane's start with one sentence naming the fix
  (JetStream's err_code 10074), and ``replicas`` 1 serves with every store R1;
* three nodes on 127.0.0.1 (rendered with the root's route secret): ``replicas`` 3 creates
  every store R3, and an R1 store made before (as an earlier version's lane left it) is
  scaled to R3 with its rows and its durables; a count above the nodes is refused (10005);
  ``cotal doctor auth`` and ``cotal status`` show each store's count and leader, and a store
  below the wanted count is a doctor finding with its fix.

Only the nats-servers the tests start are stopped (their nursery, by pid).
"""

from __future__ import annotations

import collections
import functools
import json
import time
from contextlib import AbstractAsyncContextManager

import pytest
import trio

from cotal_trio.broker.provision import mint_service_user
from cotal_trio.broker.config import Cluster, Node, render_node, route_secret, write_config
from cotal_trio.broker.process import free_port, run_nats_server
from cotal_trio.core import wire
from cotal_trio.core.errors import ConfigError
from cotal_trio.core.manifest import SpaceEntry
from cotal_trio.lane.spec import LaneCommon
from cotal_trio.natsio import (
    Connection, ensure_bucket, ensure_consumer, ensure_stream, js_api, kv_get, kv_put, open_connection, open_loop,
)
from cotal_trio.service.hosting import FullLanes, ServiceConfig, lane_factory, run_service
from cotal_trio.state import RootPaths, load_broker, load_space
from cotal_trio.stores.replicas import read_store_replicas, space_stream_names
from cotal_trio.stores.streams import message_stream_shape
from tests.support.cli_root import cotal
from tests.support.cluster import js_admin

pytestmark = pytest.mark.broker

SPACE = "alpha"
CEILING_S = 60
NODES = ("n1", "n2", "n3")


def unplaceable(replicas: int, stream: str, broker_says: str, verb: str = "CREATE") -> str:
    return (
        f"space {SPACE} asks for replicas {replicas}, and the broker cannot place {replicas} copies of a store"
        f" (request $JS.API.STREAM.{verb}.{stream}: {broker_says}) - lower \"replicas\" in the space's entry"
        f" of spaces.json (`cotal space add {SPACE} --replicas 1` on a single node), or run a cluster of at"
        f" least {replicas} nodes"
    )


async def new_root(capsys, tmp_path) -> RootPaths:
    paths = RootPaths(tmp_path / "root")
    code, _, err = await cotal(capsys, "space", "add", SPACE, "--root", str(paths.root), "--new-root")
    assert (code, err) == (0, ""), err
    return paths


async def push(capsys, paths: RootPaths, url: str, replicas: int) -> None:
    code, out, err = await cotal(
        capsys, "space", "add", SPACE, "--root", str(paths.root), "--server", url, "--replicas", str(replicas)
    )
    assert code == 0 and "accounts pushed" in out, err
    assert out.splitlines()[-1] == f"  stores: replicas {replicas} (its full lane creates them so, or scales them up, at its start)"


def entry_of(paths: RootPaths) -> SpaceEntry:
    manifest = json.loads(paths.spaces_manifest.read_text())
    (raw,) = manifest["spaces"]
    return SpaceEntry(space=raw["space"], replicas=raw.get("replicas", 1))


def full_lane(paths: RootPaths, url: str):
    """The startable ``cotal auth-service --spaces`` runs for the space's entry in spaces.json."""
    start = lane_factory(root=paths, common=LaneCommon(server_url=url, reconnect=False), lanes=FullLanes())
    return start(entry_of(paths))


def admin(paths: RootPaths, url: str) -> AbstractAsyncContextManager[Connection]:
    """A short-lived data-account user of the space allowed the JetStream API (tests/support/cluster.py)."""
    return js_admin(paths, SPACE, url)


def leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


async def refused_start(paths: RootPaths, url: str) -> ConfigError:
    with pytest.RaisesGroup(pytest.RaisesExc(ConfigError), flatten_subgroups=True) as refused:
        async with trio.open_nursery() as nursery:
            await nursery.start(full_lane(paths, url))
            pytest.fail("the lane started")
    (error,) = [e for e in leaves(refused.value) if isinstance(e, ConfigError)]
    return error


# -- one node ------------------------------------------------------------------------------------


@pytest.fixture
async def one_node(nursery, tmp_path, capsys, nats_server_bin) -> tuple[RootPaths, str]:
    with trio.fail_after(CEILING_S):
        paths = await new_root(capsys, tmp_path)
        port = free_port()
        conf = write_config(paths, load_broker(paths.broker_json), port=port, auth_timeout_s=None)
        await nursery.start(functools.partial(run_nats_server, conf, executable=nats_server_bin,
                                              log_path=paths.broker_log, port=port))  # fmt: skip
    return paths, f"nats://127.0.0.1:{port}"


async def test_three_replicas_on_one_node_are_refused_at_start_with_the_fix(one_node, capsys):
    paths, url = one_node
    with trio.fail_after(CEILING_S):
        await push(capsys, paths, url, 3)
        assert entry_of(paths).replicas == 3
        error = await refused_start(paths, url)
        assert str(error) == unplaceable(
            3, f"KV_{wire.auth_bucket(SPACE)}", "replicas > 1 not supported in non-clustered mode (err_code 10074)"
        )
        async with open_loop(), admin(paths, url) as conn:
            assert await read_store_replicas(conn, SPACE) == []  # the refused create made nothing


async def test_a_single_space_service_takes_the_count_of_the_roots_entry(one_node, capsys):
    """``cotal auth-service --space S`` (no manifest) creates S's stores at the count the root's
    spaces.json entry records (``cotal space add S --replicas 3``), as a manifest host's lane does:
    3 on one node is refused with the same sentence. (It used 1 whatever the entry said.)"""
    paths, url = one_node
    with trio.fail_after(CEILING_S):
        await push(capsys, paths, url, 3)
        with pytest.RaisesGroup(pytest.RaisesExc(ConfigError), flatten_subgroups=True) as refused:
            async with trio.open_nursery() as nursery:
                await nursery.start(run_service, ServiceConfig(root=paths, server_url=url, space=SPACE))
                pytest.fail("the service started")
    (error,) = [e for e in leaves(refused.value) if isinstance(e, ConfigError)]
    assert str(error) == unplaceable(
        3, f"KV_{wire.auth_bucket(SPACE)}", "replicas > 1 not supported in non-clustered mode (err_code 10074)"
    )


async def test_one_replica_on_one_node_serves_with_every_store_r1(one_node, capsys, nursery):
    paths, url = one_node
    with trio.fail_after(CEILING_S):
        await push(capsys, paths, url, 1)
        assert "replicas" not in paths.spaces_manifest.read_text()  # 1 is the default, not written
        await nursery.start(full_lane(paths, url))
        async with open_loop(), admin(paths, url) as conn:
            stores = await read_store_replicas(conn, SPACE)
    assert [s.stream for s in stores] == list(space_stream_names(SPACE))
    assert {s.replicas for s in stores} == {1}
    assert all(s.leader for s in stores)
    code, out, err = await cotal(capsys, "status", "--root", str(paths.root), "--server", url)
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if line.startswith(f"{SPACE}  serving")]
    assert line.endswith("  stores R1 (leader cotal)")


def _info_observer(paths: RootPaths, url: str) -> AbstractAsyncContextManager[Connection]:
    """A data-account user that sees every ``$JS.API.STREAM.INFO.*`` request of the account: the
    broker delivers the lane's requests to it as to JetStream."""
    material = load_space(paths.space(SPACE).callout_json, SPACE)
    now = int(time.time())
    creds = mint_service_user(
        material, name="test-info-observer", permissions={"pub": {"allow": []}, "sub": {"allow": ["$JS.API.STREAM.INFO.>"]}},
        iat=now, exp=now + 600,
    )  # fmt: skip
    return open_connection(url, creds=creds, name="test-info-observer", reconnect=False)


async def test_a_full_lane_start_asks_each_stream_its_info_once(one_node, capsys, nursery):
    """The stores' count for the lane's one "more copies" warning comes from the ensures that just
    created or checked each stream, not from a second STREAM.INFO of every stream (the broker's
    view: a subscriber on the account's STREAM.INFO subjects). A key listing (STREAM.INFO with a
    subjects filter: the issuance sweep's) is not a stream's info and is not counted."""
    paths, url = one_node
    seen: list[str] = []
    with trio.fail_after(CEILING_S):
        await push(capsys, paths, url, 1)
        async with open_loop(), _info_observer(paths, url) as observer:
            await observer.subscribe("$JS.API.STREAM.INFO.>", on_message=lambda msg: seen.append(msg.subject)
                                     if b"subjects_filter" not in msg.data else None)  # not a key listing (the sweep's)
            await observer.flush()
            await nursery.start(full_lane(paths, url))
            await observer.flush()
    assert collections.Counter(seen) == {f"$JS.API.STREAM.INFO.{name}": 1 for name in space_stream_names(SPACE)}


async def test_space_add_refuses_a_bad_count_and_a_static_space(tmp_path, capsys):
    paths = await new_root(capsys, tmp_path)
    before = paths.spaces_manifest.read_bytes()
    code, out, err = await cotal(capsys, "space", "add", SPACE, "--root", str(paths.root), "--replicas", "7")
    assert (code, out) == (1, "")
    assert err == (
        "cotal: --replicas 7 is outside 1-5 - pass a count from 1 to 5 (more than 1 needs a cluster of at least"
        " that many nodes)\n"
    )
    code, out, err = await cotal(capsys, "space", "add", "beta", "--root", str(paths.root), "--static", "--replicas", "3")
    assert (code, out) == (1, "")
    assert err == "cotal: --replicas sets a hosted space's store copies; a --static space has no lane - drop one of them\n"
    assert paths.spaces_manifest.read_bytes() == before
    code, _, err = await cotal(capsys, "space", "add", SPACE, "--root", str(paths.root), "--replicas", "3")
    assert code == 0, err
    assert entry_of(paths).replicas == 3
    code, _, err = await cotal(capsys, "space", "add", SPACE, "--root", str(paths.root))  # no flag: the count stays
    assert code == 0, err
    assert entry_of(paths).replicas == 3


# -- three nodes ---------------------------------------------------------------------------------


@pytest.fixture
async def three_nodes(nursery, tmp_path, capsys, nats_server_bin) -> tuple[RootPaths, list[str]]:
    """A root whose broker is three rendered nodes on 127.0.0.1 (one JetStream cluster)."""
    with trio.fail_after(CEILING_S):
        paths = await new_root(capsys, tmp_path)
        broker = load_broker(paths.broker_json)
        ports = {name: (free_port(), free_port()) for name in NODES}
        routes = tuple(f"nats-route://127.0.0.1:{cluster}" for _, cluster in ports.values())
        secret = route_secret(paths)
        urls = []
        for name, (port, cluster_port) in ports.items():
            node = Node(
                name=name, port=port, resolver_dir=tmp_path / name / "resolver", jetstream_dir=tmp_path / name / "js",
                cluster=Cluster(port=cluster_port, routes=routes, secret=secret),
            )  # fmt: skip
            conf = tmp_path / f"{name}.conf"
            conf.write_text(render_node(broker, node, auth_timeout_s=None))
            await nursery.start(functools.partial(run_nats_server, conf, executable=nats_server_bin,
                                                  log_path=tmp_path / f"{name}.log", port=port))  # fmt: skip
            urls.append(f"nats://127.0.0.1:{port}")
        await _meta_leader(paths, urls[0], capsys)
    return paths, urls


async def _meta_leader(paths: RootPaths, url: str, capsys) -> None:
    """Push the space, then wait (bounded) until JetStream places an R3 stream: the routes met and
    a meta leader is elected."""
    await push(capsys, paths, url, 1)
    async with open_loop(), admin(paths, url) as conn:
        for _ in range(100):
            try:
                await ensure_bucket(conn, "probe", replicas=3)
                await js_api(conn, "$JS.API.STREAM.DELETE.KV_probe")
                return
            except Exception:  # noqa: BLE001 - no meta leader or peers yet; bounded
                await trio.sleep(0.2)
    pytest.fail("the three nodes formed no JetStream cluster within 20 s")


async def test_three_replicas_on_three_nodes_create_and_scale_every_store(three_nodes, capsys, caplog, nursery):
    paths, urls = three_nodes
    auth_stream = f"KV_{wire.auth_bucket(SPACE)}"
    chat = wire.all_streams(SPACE)[0]
    with trio.fail_after(CEILING_S):
        async with open_loop(), admin(paths, urls[0]) as conn:
            # As an earlier version's lane left them: the auth bucket R1 with a row, a message
            # stream R1 with a durable on it.
            await ensure_bucket(conn, wire.auth_bucket(SPACE), history=1, allow_msg_ttl=True)
            await kv_put(conn, wire.auth_bucket(SPACE), "kept.row", b"before")
            assert await ensure_stream(conn, message_stream_shape(chat)) == 1
            await ensure_consumer(conn, chat.name, "kept", chat.subject, {"ack_policy": "explicit"})
            before = {s.stream: s.replicas for s in await read_store_replicas(conn, SPACE)}
        assert before == {auth_stream: 1, chat.name: 1}
        await push(capsys, paths, urls[1], 3)  # through another node
        code, out, err = await cotal(capsys, "doctor", "auth", "--root", str(paths.root), "--server", urls[0])
        assert code == 1, err
        fix = "restart the space's full auth service: it scales its stores to R3 at its start"
        for stream in (auth_stream, chat.name):
            assert (
                f"finding: space {SPACE}: its store {stream} keeps 1 copy where its spaces.json entry asks for"
                f" replicas 3 - {fix}"
            ) in out.splitlines()
        async with trio.open_nursery() as lanes:
            await lanes.start(full_lane(paths, urls[0]))
            async with open_loop(), admin(paths, urls[2]) as conn:
                stores = await read_store_replicas(conn, SPACE)
                assert [s.stream for s in stores] == list(space_stream_names(SPACE))
                assert {s.stream: s.replicas for s in stores} == dict.fromkeys(space_stream_names(SPACE), 3)
                assert all(s.leader in NODES for s in stores), stores
                entry = await kv_get(conn, wire.auth_bucket(SPACE), "kept.row")
                assert entry is not None and entry.value == b"before"  # scaled, not recreated
                consumer = await js_api(conn, f"$JS.API.CONSUMER.INFO.{chat.name}.kept")
                assert len(consumer["cluster"]["replicas"]) == 2  # the durable followed its stream to R3
            code, out, err = await cotal(capsys, "doctor", "auth", "--root", str(paths.root), "--server", urls[1])
            assert "keeps 1 copy" not in out
            lines = out.splitlines()
            summary_line = next(line for line in lines if line.startswith("  stores R"))
            assert summary_line.startswith("  stores R3 (leader") and summary_line.endswith(", replicas 3 wanted")
            listed = [line.split() for line in lines if line.startswith("    KV_") or line.startswith("    COTAL_")]
            assert [row[0] for row in listed] == list(space_stream_names(SPACE))
            assert all(row[1] == "R3" and row[2] == "leader" and row[3] in NODES for row in listed), listed
            code, out, err = await cotal(capsys, "doctor", "auth", "--json", "--root", str(paths.root), "--server", urls[1])
            (row,) = json.loads(out)["spaces"]
            assert row["stores"]["wanted"] == 3
            assert {s["stream"]: s["replicas"] for s in row["stores"]["stores"]} == dict.fromkeys(space_stream_names(SPACE), 3)
            assert {s["current"] for s in row["stores"]["stores"]} == {2}
            seeds = ",".join(urls)
            code, out, err = await cotal(capsys, "status", "--root", str(paths.root), "--server", seeds)
            assert code == 0, err
            (line,) = [line for line in out.splitlines() if line.startswith(f"{SPACE}  serving")]
            assert "  stores R3 (leader" in line and "below" not in line
            code, out, err = await cotal(capsys, "status", "--json", "--root", str(paths.root), "--server", seeds)
            (space,) = json.loads(out)["spaces"]
            assert [s["replicas"] for s in space["stores"]["stores"]] == [3] * len(space_stream_names(SPACE))
            assert all(s["leader"] in NODES for s in space["stores"]["stores"])
            lanes.cancel_scope.cancel()  # the lane stops and releases its plane claim
        await push(capsys, paths, urls[0], 5)  # more copies than nodes: refused at start (err_code 10005)
        error = await refused_start(paths, urls[0])
        assert str(error) == unplaceable(5, auth_stream, "no suitable peers for placement (err_code 10005)", "UPDATE")
        # Fewer than the stores have: left as they are, one warning names them (never scaled down).
        await push(capsys, paths, urls[0], 1)
        await nursery.start(full_lane(paths, urls[0]))
        async with open_loop(), admin(paths, urls[1]) as conn:
            assert {s.replicas for s in await read_store_replicas(conn, SPACE)} == {3}
    (warning,) = [r.getMessage() for r in caplog.records if "keep more copies" in r.getMessage()]
    assert warning.startswith(f"space {SPACE}: COTAL_CHAT_{SPACE} (R3), ")
    assert warning.endswith(
        " keep more copies than its replicas 1 and are left as they are - raise \"replicas\" in its entry of"
        " spaces.json to match, or scale them down by hand (nats stream edit --replicas)"
    )
    assert warning.count("(R3)") == len(space_stream_names(SPACE))
