"""Profiles on a live lane: a provisioned space, minted clients and the refusals of their subjects."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from cotal_trio.broker.provision import mint_service_user
from cotal_trio.core.profiles import profile_permissions
from cotal_trio.natsio import Connection, open_connection, open_loop
from cotal_trio.state import load_space
from cotal_trio.stores.streams import ensure_dm_inbox, ensure_space_streams, ensure_task_queue
from tests.support.stack import SPACE, Stack

CEILING_S = 30
DM = f"COTAL_DM_{SPACE}"
PRESENCE = f"cotal_presence_{SPACE}"
ADMISSION = f"cotal_admission_{SPACE}"
RUN = "r" * 26
OTHER_RUN = "q" * 26


@asynccontextmanager
async def minted(stack: Stack, profile: str | None, **context) -> AsyncIterator[Connection]:
    """A connection as a fresh data-account user of ``profile`` (None: a test-only user allowed
    everything, to set up and to look)."""
    nonce = "tst" + secrets.token_hex(8)
    if profile is None:
        permissions = {"pub": {"allow": [">"]}, "sub": {"allow": [">"]}}
    else:
        permissions = profile_permissions(profile, space=SPACE, inbox_nonce=nonce, **context).to_nats()
    material = load_space(stack.space_paths.callout_json, SPACE)
    now = int(time.time())
    creds = mint_service_user(material, name=f"test-{profile}", permissions=permissions, iat=now, exp=now + 300)
    async with open_loop(), open_connection(
        stack.info.server_url, creds=creds, name=nonce, inbox_prefix=f"_INBOX_{nonce}", reconnect=False
    ) as conn:
        yield conn


def nonce_of(conn: Connection) -> str:
    """The connection's ``name`` (the inbox nonce ``minted`` chose)."""
    return conn._nc.options["name"]


async def provision(stack: Stack, principals=(), roles=()) -> None:
    async with minted(stack, "provisioner") as conn:
        await ensure_space_streams(conn, SPACE)
        for owner, actor in principals:
            await ensure_dm_inbox(conn, SPACE, owner, actor)
        for role in roles:
            await ensure_task_queue(conn, SPACE, role)
        assert conn.error_count == 0, conn.last_error


async def refused(conn: Connection, subject: str, payload: bytes = b"") -> None:
    """Publishing ``subject`` is refused by the broker (a permissions violation naming it)."""
    before = conn.error_count
    await conn.publish(subject, payload)
    error = await conn.wait_error(after=before)
    # nats-py lowercases the broker's -ERR text
    assert f'permissions violation for publish to "{subject.lower()}"' in error.lower(), error


async def refused_subscription(conn: Connection, subject: str) -> None:
    before = conn.error_count
    await conn.subscribe(subject, on_message=lambda _: None)
    error = await conn.wait_error(after=before)
    assert f'permissions violation for subscription to "{subject.lower()}"' in error.lower(), error


async def js(conn: Connection, subject: str, body: dict | None = None) -> dict:
    return json.loads((await conn.request(subject, b"" if body is None else json.dumps(body).encode())).data)
