"""The issuance store on a live mesh: stalling its bucket, reading what it holds, and the callout's log lines;
and a row file stalled while other steps run (``while_stalled``)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from cotal_trio.core.bearer import BearerGrant, issue_bearer
from cotal_trio.core.identity import derive_owner
from cotal_trio.core.plane import plane_bucket
from cotal_trio.lane.service_endpoints import open_store_user
from cotal_trio.natsio import Connection, open_loop
from cotal_trio.state import SpacePaths, load_issuer_keys, load_owner_secret, load_space, read_principal
from tests.support.callout_log import parse_callout_line
from tests.support.service import Mesh
from tests.support.stack import Stack, client


@asynccontextmanager
async def store_reader(space_paths: SpacePaths, server_url: str, space: str) -> AsyncIterator[Connection]:
    """A data-account connection of the test's own, allowed the JetStream API and the auth bucket."""
    permissions = {"pub": {"allow": ["$JS.API.>", f"$KV.{plane_bucket(space)}.>"]}, "sub": {"allow": ["_INBOX.>"]}}
    material = load_space(space_paths.callout_json, space)
    async with open_loop(), open_store_user(
        material, server_url, name="test:issuance-reader", permissions=permissions, iat=int(time.time()),
        reconnect=False,
    ) as conn:
        yield conn


def callout_lines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [parse_callout_line(r.getMessage()) for r in caplog.records
            if r.name == "cotal.callout" and r.getMessage().startswith("auth callout: level=")
            and "outcome=dropped" not in r.getMessage()]


def stall(path: Path) -> bytes:
    """Replace the row file at ``path`` by a FIFO: opening it blocks until a writer opens it.

    Returns the row's bytes, for :func:`release`.
    """
    data = path.read_bytes()
    fifo = path.with_name(path.name + ".fifo")
    os.mkfifo(fifo, 0o600)
    os.replace(fifo, path)
    return data


def release(path: Path, data: bytes) -> None:
    """Answer a read blocked on the FIFO at ``path`` with ``data``, and put the row file back."""
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)  # never blocks; wakes a reader waiting in open()
    try:
        os.write(fd, data)
        back = path.with_name(path.name + ".back")
        back.write_bytes(data)
        os.chmod(back, 0o600)
        os.replace(back, path)
    finally:
        os.close(fd)  # the reader sees the row, then end of file


def _bearer(mesh: Mesh, space: str, sub: str) -> str:
    """Grant ``sub``'s actor ``cli`` in ``space`` and sign its bearer with the space's issuer key
    (a replica serves no exchange)."""
    mesh.grant(space, sub, "cli")
    paths = mesh.paths.space(space)
    owner = derive_owner(load_owner_secret(paths.owner_secret_json), mesh.idp.issuer, sub)
    row, _ = read_principal(paths, owner, "cli")
    assert row is not None
    grant = BearerGrant(owner=owner, actor="cli", scope=row.scope, lifecycle_uid=row.lifecycle_uid)
    key = load_issuer_keys(paths.issuer_json, space).active
    return issue_bearer(grant, key=key, space=space, now=int(time.time()), ttl_s=120)[0]


class Timeline:
    """When each step answered, and whether the stalled read had been released by then."""

    def __init__(self, released: threading.Event) -> None:
        self.released = released
        self.seen: dict[str, tuple[object, bool]] = {}

    def note(self, name: str, value: object) -> None:
        self.seen[name] = (value, self.released.is_set())


async def meanwhile(stack: Stack, fast_token: str, bearer: str, timeline: Timeline) -> None:
    """While a stalled read holds: an exchange for ``fast_token`` and a connect with ``bearer``,
    each noted on ``timeline`` (its status, then ``"connected"``) with whether the read was released."""
    await trio.sleep(0.3)  # the stalled reads have begun by now
    timeline.note("exchange", (await stack.exchange({"idpToken": fast_token, "actor": "cli"}))[0])
    async with client(stack, bearer) as conn:
        await conn.flush()
    timeline.note("connect", "connected")


async def while_stalled(
    stack: Stack, path: Path, *, slow: Sequence[Callable[[Timeline], Awaitable[None]]], fast_token: str, bearer: str,
    stall_s: float, ceiling_s: float,
) -> Timeline:
    """The row file at ``path`` stalled (:func:`stall`) until a ``threading.Timer`` releases it
    ``stall_s`` later, while each ``slow`` step (given the timeline) and :func:`meanwhile` run in one
    nursery under ``trio.fail_after(ceiling_s)``: the timeline they noted. Joins the timer before
    it returns or raises, so the row is back in place either way."""
    released = threading.Event()
    data = stall(path)

    def answer_the_read() -> None:
        released.set()
        release(path, data)

    timeline = Timeline(released)
    timer = threading.Timer(stall_s, answer_the_read)
    timer.start()
    try:
        with trio.fail_after(ceiling_s):
            async with trio.open_nursery() as nursery:
                for step in slow:
                    nursery.start_soon(step, timeline)
                nursery.start_soon(meanwhile, stack, fast_token, bearer, timeline)
    finally:
        timer.join()
    return timeline
