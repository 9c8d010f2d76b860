"""A running embedded stack (``run_up``) on a real nats-server, and a client that uses it."""

from __future__ import annotations

import functools
import json
import os
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import Message

import pytest
import trio

from cotal_trio.broker.process import free_port
from cotal_trio.core.identity import derive_owner, mint_lifecycle_uid
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.devidp import DevIdpMaterial, mint_dev_token
from cotal_trio.service.embedded import UpConfig, UpInfo, run_up
from cotal_trio.natsio import Connection, open_connection, open_loop
from cotal_trio.state import RootPaths, SpacePaths, load_owner_secret, read_json, write_row

SPACE = "alpha"


@dataclass(frozen=True)
class Stack:
    """A running ``cotal up`` equivalent plus what a test client needs."""

    info: UpInfo
    paths: RootPaths

    @property
    def space_paths(self) -> SpacePaths:
        return self.paths.space(SPACE)

    def owner(self, sub: str) -> str:
        secret = load_owner_secret(self.space_paths.owner_secret_json)
        return derive_owner(secret, self.info.pin.issuer, sub)

    def grant(self, sub: str, actor: str, *, publish=("team.>",), subscribe=("team.>",), scope=("spawn",)) -> LedgerRow:
        row = LedgerRow(
            kind=LedgerKind.INTERACTIVE, owner=self.owner(sub), actor=actor, scope=tuple(scope),
            allow_subscribe=tuple(subscribe), allow_publish=tuple(publish), role=None, parent=None,
            label=None, token_hash=None, lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
            granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        write_row(self.space_paths, row)
        return row

    def idp_token(self, sub: str) -> str:
        material = DevIdpMaterial.from_json(self.paths.devidp_json.read_bytes())
        return mint_dev_token(material, sub=sub, now=int(time.time()))

    def sentinel_creds(self) -> str:
        return self.space_paths.sentinel_creds.read_text()

    async def exchange(self, body: dict) -> tuple[int, dict]:
        service = read_json(self.space_paths.auth_service_json)
        return await trio.to_thread.run_sync(_post, service["url"] + "/exchange", service["cap"], body)

    async def bearer(self, sub: str, actor: str, **extra) -> str:
        status, body = await self.exchange({"idpToken": self.idp_token(sub), "actor": actor, **extra})
        assert status == 200, body
        return body["token"]


def _post(url: str, cap: str, body: dict) -> tuple[int, dict]:
    status, answer, _ = post_answer(url, cap, body)
    return status, answer


def request_json(url: str, body: dict | None = None) -> tuple[int, dict]:
    """Blocking ``GET`` of ``url`` (or ``POST`` of ``body`` as JSON), with no capability:
    ``(status, JSON answer)``; an HTTP error status is an answer too."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def post_answer(url: str, cap: str, body: dict) -> tuple[int, dict, Message]:
    """``POST`` ``body`` as JSON with the capability: ``(status, JSON answer, headers)`` (blocking;
    the headers read case-insensitively)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {cap}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read()), exc.headers


@asynccontextmanager
async def client(stack: Stack, bearer: str | None, *, nonce: str | None = None) -> AsyncIterator[Connection]:
    """Connect as a user-mode client: sentinel creds + bearer, name = inbox nonce."""
    nonce = nonce or "ibx" + secrets.token_hex(8)
    async with open_loop(), open_connection(
        stack.info.server_url, creds=stack.sentinel_creds(), token=bearer, name=nonce,
        inbox_prefix=f"_INBOX_{nonce}", reconnect=False,
    ) as conn:
        yield conn


async def start_stack(
    nursery: trio.Nursery, tmp_path, nats_server_bin: str, *, auth_timeout_s: int = 2, **config_fields
) -> Stack:
    """``run_up`` in ``nursery`` on ``tmp_path/root``, a random broker port and the broker's
    ``authorization { timeout }`` of ``auth_timeout_s`` seconds; started within 20 s.
    ``config_fields`` are further :class:`UpConfig` fields (``idp_url``, ``dev_idp_device``)."""
    paths = RootPaths(tmp_path / "root")
    config = UpConfig(
        paths=paths, space=SPACE, port=free_port(), auth_timeout_s=auth_timeout_s, nats_server=nats_server_bin,
        **config_fields,
    )
    with trio.fail_after(20):
        info = await nursery.start(functools.partial(run_up, config))
    return Stack(info=info, paths=paths)


@pytest.fixture
async def stack(nursery: trio.Nursery, tmp_path, nats_server_bin: str) -> AsyncIterator[Stack]:
    """``run_up`` on a fresh root, a random broker port and a 2 s auth timeout."""
    yield await start_stack(nursery, tmp_path, nats_server_bin)
