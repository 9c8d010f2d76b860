"""Issue 3 item 6, "Service endpoints admission", on a real nats-server (spec "Callout replicas").

The ``mesh`` fixture (three provisioned spaces ``a``, ``b``, ``c``, their accounts pushed to an
operator-mode broker) comes from ``test_auth_service_live``. ``.applied`` is awaited through
:meth:`Host.wait_written`, never by sleeping; every test has a ``fail_after`` ceiling.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio

import cotal_trio
from cotal_trio.broker import provision
from cotal_trio.broker.accounts import open_system_connection
from cotal_trio.cli import main
from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.bearer import BearerGrant, issue_bearer
from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.core.identity import derive_owner, mint_lifecycle_uid
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.plane import plane_bucket
from cotal_trio.service.host import Host, HostConfig, run_host
from cotal_trio.lane.spec import LaneCommon
from cotal_trio.service.hosting import FullLanes, ReplicaLanes, ServiceConfig, lane_factory, run_service
from cotal_trio.lane.service_endpoints import (
    ADMISSION_KEY,
    Admission,
    open_store_user,
    parse_admission,
    reader_permissions,
    render_admission,
)
from cotal_trio.natsio import kv_get, open_loop
from cotal_trio.state import (
    atomic_write,
    load_issuer_keys,
    load_owner_secret,
    load_space,
    write_row,
)
from tests.support import service as auth_live
from tests.support.service import AUTH_TIMEOUT_S, Mesh, until

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

mesh = auth_live.mesh  # the fixture: spaces a, b, c provisioned and pushed

CEILING_S = 40
LIMITS = CalloutLimits(auth_timeout_s=AUTH_TIMEOUT_S)


def service(mesh: Mesh, space: str, **flags) -> ServiceConfig:
    return ServiceConfig(root=mesh.paths, server_url=mesh.server_url, space=space, limits=LIMITS, **flags)


async def run_for_a_while(config: ServiceConfig) -> None:
    """Start the service, then stop it cleanly (the plane claim is released)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(run_service, config)
        nursery.cancel_scope.cancel()


async def admission_row(mesh: Mesh, space: str) -> tuple[dict, int] | None:
    """The stored row and its revision, read as a read-only data-account user of ``space``."""
    material = load_space(mesh.paths.space(space).callout_json, space)
    async with open_loop(), open_store_user(
        material, mesh.server_url, name="test:reader", permissions=reader_permissions(space),
        iat=int(time.time()), reconnect=False,
    ) as conn:
        entry = await kv_get(conn, plane_bucket(space), ADMISSION_KEY)
    return None if entry is None else (json.loads(entry.value), entry.revision)


def admits(mesh: Mesh, space: str):
    return cotal_trio.admits_service_endpoints(space, server_url=mesh.server_url, root=mesh.paths)


def bearer_for(mesh: Mesh, space: str, sub: str, actor: str) -> str:
    """Grant ``sub``/``actor`` in ``space``'s ledger and sign its bearer (no exchange face needed)."""
    sp = mesh.paths.space(space)
    owner = derive_owner(load_owner_secret(sp.owner_secret_json), mesh.idp.issuer, sub)
    row = LedgerRow(
        kind=LedgerKind.INTERACTIVE, owner=owner, actor=actor, scope=("spawn",),
        allow_subscribe=("team.>",), allow_publish=("team.>",), role=None, parent=None,
        label=None, token_hash=None, lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
        granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    write_row(sp, row)
    grant = BearerGrant(owner=owner, actor=actor, scope=row.scope, lifecycle_uid=row.lifecycle_uid)
    key = load_issuer_keys(sp.issuer_json, space).active
    return issue_bearer(grant, key=key, space=space, now=int(time.time()), ttl_s=120)[0]


def refused_for(space: str):
    return pytest.RaisesGroup(
        pytest.RaisesExc(ConfigError, match=f"^space {space} admits service endpoints \\(opened "),
        flatten_subgroups=True,
    )


async def test_a_full_service_opens_the_admission(mesh: Mesh):
    with trio.fail_after(CEILING_S):
        before = time.time()
        await run_for_a_while(service(mesh, "a", service_endpoints=True))
        row, revision = await admission_row(mesh, "a")
        assert row.keys() == {"ver", "openedAt", "holder"} and row["ver"] == 1
        opened = datetime.strptime(row["openedAt"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        assert int(before) <= opened <= time.time()
        assert row["holder"].split(":")[1] == str(os.getpid())
        assert await admits(mesh, "a") is True

        # A second run with the flag keeps the first record as it is (create-only).
        await run_for_a_while(service(mesh, "a", service_endpoints=True))
        assert await admission_row(mesh, "a") == (row, revision)

        # Never served: no bucket at all. Served without the flag: a bucket, no record.
        assert await admits(mesh, "b") is False
        await run_for_a_while(service(mesh, "c"))
        assert await admission_row(mesh, "c") is None
        assert await admits(mesh, "c") is False


async def test_the_refusal_stays_after_the_setting_is_dropped(mesh: Mesh):
    with trio.fail_after(CEILING_S):
        await run_for_a_while(service(mesh, "a", service_endpoints=True))
        stored = await admission_row(mesh, "a")
        await run_for_a_while(service(mesh, "a"))  # the flag dropped: nothing closes the admission
        assert await admission_row(mesh, "a") == stored
        assert await admits(mesh, "a") is True

        # A single-space replica refuses to start, naming the space.
        with refused_for("a"):
            await run_for_a_while(service(mesh, "a", callout_only=True))

        # A replica of a space without the admission starts (it reads, and writes only issuance rows).
        await run_for_a_while(service(mesh, "b", callout_only=True))


async def test_a_callout_host_names_the_admitted_space_and_serves_the_others(
    mesh: Mesh, nursery: trio.Nursery, tmp_path: Path,
):
    manifest = tmp_path / "host" / "spaces.json"
    manifest.parent.mkdir()
    # The entry's serviceEndpoints is ignored by a callout-only host (it reads only `space`).
    atomic_write(manifest, json.dumps({"version": 2, "spaces": [
        {"space": "a", "serviceEndpoints": False}, {"space": "b"},
    ]}).encode())
    with trio.fail_after(CEILING_S):
        await run_for_a_while(service(mesh, "a", service_endpoints=True))
        start_lane = lane_factory(root=mesh.paths, common=LaneCommon(server_url=mesh.server_url, limits=LIMITS), lanes=ReplicaLanes())
        host: Host = await nursery.start(run_host, HostConfig(
            manifest=manifest, start_lane=start_lane, callout_only=True, backstop_s=600,
        ))
        spaces = await until(host, manifest, lambda s: s.get("a", {}).get("state") == "retrying"
                             and s.get("b", {}).get("state") == "serving")
        assert spaces["a"]["reason"].startswith("space a admits service endpoints (opened "), spaces
        assert "full auth service" in spaces["a"]["reason"]

        # b is served by this replica alone. No full service has run for b, so it has no store,
        # and the replica, which creates none, denies its connects (no issuance row can be
        # written) until the full service has run once (spec "Callout replicas").
        bearer = bearer_for(mesh, "b", "alice", "cli")
        with auth_live.refused():
            async with mesh.client("b", bearer):
                pass
        await run_for_a_while(service(mesh, "b"))
        async with mesh.client("b", bearer) as conn:
            await conn.flush()


async def test_a_manifest_entry_opens_the_admission(mesh: Mesh, nursery: trio.Nursery, tmp_path: Path):
    manifest = tmp_path / "spaces.json"
    atomic_write(manifest, json.dumps({"version": 2, "spaces": [
        {"space": "a", "serviceEndpoints": True}, {"space": "b"},
    ]}).encode())
    with trio.fail_after(CEILING_S):
        start_lane = lane_factory(root=mesh.paths, common=LaneCommon(server_url=mesh.server_url, limits=LIMITS), lanes=FullLanes())
        host: Host = await nursery.start(run_host, HostConfig(manifest=manifest, start_lane=start_lane, backstop_s=600))
        await until(host, manifest, lambda s: all(s.get(x, {}).get("state") == "serving" for x in "ab"))
        assert await admits(mesh, "a") is True
        assert await admits(mesh, "b") is False


async def test_a_replica_that_loses_its_store_connection_ends(mesh: Mesh):
    """The broker kicks the replica's store connection alone: the single-space lane ends."""
    broker = provision.ensure_root(mesh.paths, iat=int(time.time()))
    with trio.fail_after(CEILING_S):
        with pytest.RaisesGroup(
            pytest.RaisesExc(Unavailable, match="^space b: the broker closed the store connection"),
            flatten_subgroups=True,
        ):
            async with trio.open_nursery() as nursery:
                await nursery.start(run_service, service(mesh, "b", callout_only=True))
                async with open_loop(), open_system_connection(mesh.server_url, broker) as system:
                    connz = json.loads((await system.request("$SYS.REQ.SERVER.PING.CONNZ", b"{}")).data)
                    server_id = connz["server"]["id"]
                    [cid] = [c["cid"] for c in connz["data"]["connections"] if c.get("name") == "cotal:auth-store:b"]
                    await system.request(f"$SYS.REQ.SERVER.{server_id}.KICK", json.dumps({"cid": cid}).encode())


async def test_admits_service_endpoints_needs_the_space_material(mesh: Mesh):
    with trio.fail_after(CEILING_S):
        with pytest.raises(ConfigError, match="callout.json"):
            await admits(mesh, "ghost")
        with pytest.raises(ConfigError, match="space 'bad name'"):
            await admits(mesh, "bad name")


async def test_admits_service_endpoints_without_a_broker(mesh: Mesh):
    with trio.fail_after(CEILING_S), pytest.raises(Unavailable, match="connect nats://127.0.0.1:1"):
        await cotal_trio.admits_service_endpoints("a", server_url="nats://127.0.0.1:1", root=mesh.paths)


@pytest.mark.parametrize(("flags", "words"), [
    (["--space", "a", "--callout-only"], ("--service-endpoints", "--callout-only", "drop")),
    (["--spaces", "m.json"], ("--service-endpoints", "--space only", '"serviceEndpoints": true')),
])
def test_the_flag_is_refused_where_it_cannot_apply(flags, words, capsys, tmp_path):
    argv = ["auth-service", "--server", "nats://127.0.0.1:4222", "--root", str(tmp_path), *flags]
    assert main([*argv, "--service-endpoints"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cotal: "), err
    assert all(word in err for word in words), err


@pytest.mark.parametrize(("value", "expected"), [
    (render_admission(holder="h:1:ab", now=1767225600.9), Admission(opened_at="2026-01-01T00:00:00Z", holder="h:1:ab")),
    (b"not json", Admission(opened_at=None, holder=None)),
    (b'["a list"]', Admission(opened_at=None, holder=None)),
    (b'{"openedAt": 5, "holder": ""}', Admission(opened_at=None, holder=None)),
])
def test_any_stored_row_reads_as_an_open_admission(value, expected):
    assert parse_admission(value) == expected
