"""A mesh of spaces served by one `cotal auth service` process on a real broker: provisioning,
the manifest, and waits on what it serves."""

from __future__ import annotations

import functools
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio

from cotal_trio.broker import provision
from cotal_trio.broker.accounts import open_system_connection, push_accounts
from cotal_trio.broker.config import write_config
from cotal_trio.broker.process import free_port, run_nats_server
from cotal_trio.core.errors import Unavailable
from cotal_trio.core.identity import derive_owner, mint_lifecycle_uid
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.devidp import DevIdpMaterial, create_dev_idp, mint_dev_token
from cotal_trio.natsio import Connection, open_connection, open_loop
from cotal_trio.service.host import Host
from cotal_trio.state import (
    IdpPinRecord,
    RootPaths,
    atomic_write,
    load_owner_secret,
    read_json,
    save_idp_pin,
    write_row,
)
from tests.support.stack import _post

SPACES = ("a", "b", "c")
AUTH_TIMEOUT_S = 1


@dataclass(frozen=True)
class Mesh:
    """A root with three spaces, its broker's URL, and what a client of each space needs."""

    paths: RootPaths
    idp: DevIdpMaterial
    server_url: str

    def grant(self, space: str, sub: str, actor: str) -> None:
        sp = self.paths.space(space)
        owner = derive_owner(load_owner_secret(sp.owner_secret_json), self.idp.issuer, sub)
        write_row(sp, LedgerRow(
            kind=LedgerKind.INTERACTIVE, owner=owner, actor=actor, scope=("spawn",),
            allow_subscribe=("team.>",), allow_publish=("team.>",), role=None, parent=None,
            label=None, token_hash=None, lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
            granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        ))

    async def bearer(self, space: str, sub: str, actor: str) -> str:
        """A bearer from ``space``'s loopback face (its ``auth-service.json``)."""
        service = read_json(self.paths.space(space).auth_service_json)
        body = {"idpToken": mint_dev_token(self.idp, sub=sub, now=int(time.time())), "actor": actor}
        status, reply = await trio.to_thread.run_sync(_post, service["url"] + "/exchange", service["cap"], body)
        assert status == 200, reply
        return reply["token"]

    @asynccontextmanager
    async def client(self, space: str, bearer: str) -> AsyncIterator[Connection]:
        """A user-mode client of ``space``: its sentinel creds, the bearer, a name nonce."""
        nonce = "ibx" + secrets.token_hex(8)
        creds = self.paths.space(space).sentinel_creds.read_text()
        async with open_loop(), open_connection(
            self.server_url, creds=creds, token=bearer, name=nonce, inbox_prefix=f"_INBOX_{nonce}",
            reconnect=False,
        ) as conn:
            yield conn

    async def admitted(self, space: str, bearer: str) -> None:
        async with self.client(space, bearer) as conn:
            await conn.flush()


def refused():
    """A refused connect: ``Unavailable`` (Authorization Violation) inside the client's group."""
    return pytest.RaisesGroup(
        pytest.RaisesExc(Unavailable, match="Authorization Violation"), flatten_subgroups=True
    )


def provision_root(root: Path) -> tuple[RootPaths, DevIdpMaterial]:
    """ensure_root + ensure_space for each space, one dev IdP pinned for all (as `cotal up`)."""
    paths, now = RootPaths(root), int(time.time())
    broker = provision.ensure_root(paths, iat=now)
    idp = create_dev_idp(os.urandom)
    atomic_write(paths.devidp_json, idp.to_json().encode())
    pin = IdpPinRecord(kind="dev", url="", issuer=idp.issuer, audience=idp.audience, jwks_uri="")
    for space in SPACES:
        provision.ensure_space(paths, broker, space, iat=now)
        save_idp_pin(paths.space(space).idp_json, pin)
    return paths, idp


async def start_mesh(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str, *,
    auth_timeout_s: float = AUTH_TIMEOUT_S, spaces: tuple[str, ...] = SPACES,
) -> tuple[Mesh, int]:
    """The ``mesh`` fixture's root (spaces a, b, c provisioned, ``spaces`` pushed to an
    operator-mode broker running in ``nursery`` with an ``auth_timeout_s`` seconds authorization
    timeout), and the broker's pid."""
    paths, idp = provision_root(tmp_path / "root")
    material = provision.ensure_root(paths, iat=int(time.time()))
    port = free_port()
    conf = write_config(paths, material, port=port, auth_timeout_s=auth_timeout_s)
    start = functools.partial(run_nats_server, conf, executable=nats_server_bin, log_path=paths.broker_log, port=port)
    url = f"nats://127.0.0.1:{port}"
    with trio.fail_after(20):
        pid = await nursery.start(start)
        async with open_loop(), open_system_connection(url, material) as system:
            for space in spaces:
                record = provision.load_space_accounts(paths, material, space)
                await push_accounts(system, (record.data_jwt, record.auth_jwt))
    return Mesh(paths=paths, idp=idp, server_url=url), pid


@pytest.fixture
async def mesh(nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str) -> AsyncIterator[Mesh]:
    """The provisioned root, its operator-mode broker, and every space's accounts pushed."""
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    yield mesh


def write_manifest(path: Path, *spaces: str) -> None:
    atomic_write(path, json.dumps({"version": 2, "spaces": [{"space": s} for s in spaces]}).encode())


def applied_spaces(host_manifest: Path) -> dict[str, dict]:
    return json.loads(host_manifest.with_name(host_manifest.name + ".applied").read_text())["spaces"]


async def until(host: Host, manifest: Path, done: Callable[[dict[str, dict]], bool]) -> dict[str, dict]:
    """Await ``.applied`` writes until ``done(spaces)`` holds; the spaces then."""
    while not done(spaces := applied_spaces(manifest)):
        await host.wait_written()
    return spaces


def serving(*names: str) -> Callable[[dict[str, dict]], bool]:
    return lambda spaces: sorted(spaces) == sorted(names) and all(s["state"] == "serving" for s in spaces.values())


SPACE = "a"


async def until_state(host: Host, manifest: Path, state: str, reason: str = "") -> dict:
    """Await ``.applied`` until space a is in ``state`` with a reason starting with ``reason``."""
    while True:
        status = applied_spaces(manifest).get(SPACE, {})
        if status.get("state") == state and status.get("reason", "").startswith(reason):
            return status
        await host.wait_written()
