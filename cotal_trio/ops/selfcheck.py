"""``cotal check``: the whole user-auth path against a running root, step by step.

Steps (issue 2 item 9): find the running auth service; get an IdP token (minted by the
development IdP, or given); exchange it for a bearer; connect with the sentinel creds and the
bearer; publish and receive within the grant (the principal's own DM subject, which every agent
grant carries); publish outside it and see the broker refuse; connect with a tampered bearer and
see the callout refuse. The first failing step ends the check and names itself.

The broker is given as seed URLs (issue 17 items 3 and 6: a cluster root has no ``policy.json``,
so the command line passes ``--server``); each connect goes through the first seed that answers,
since nats-py's first connect tries one server of its pool only when it may not reconnect.

With the development IdP and no token given, the check grants its own throwaway actor
(``cotal_check`` for IdP subject ``cotal-check``, no channels) and revokes it when done.
"""

from __future__ import annotations

import functools
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import trio

from cotal_trio.core.errors import AuthServiceError, ConfigError, Unavailable, leaves
from cotal_trio.core.identity import derive_owner, mint_lifecycle_uid
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.core.profiles import dm_subject
from cotal_trio.devidp import DevIdpMaterial, mint_dev_token
from cotal_trio.http.client import post_exchange, read_service
from cotal_trio.natsio import Connection, Message, open_connection, open_loop
from cotal_trio.state import RootPaths, SpacePaths, load_idp_pin, load_owner_secret, remove_row, write_row

__all__ = ["CHECK_ACTOR", "CHECK_SUBJECT", "CheckFailed", "run_check"]

CHECK_ACTOR = "cotal_check"
CHECK_SUBJECT = "cotal-check"
STEP_CEILING_S = 10
T = TypeVar("T")


class CheckFailed(AuthServiceError):
    """A step of the check failed: ``step`` names it, the message says why."""

    def __init__(self, step: str, reason: str) -> None:
        super().__init__(f"{step}: {reason}" if step else reason)
        self.step = step


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where the check runs and as whom (``servers``: the broker's seed URLs, in order)."""

    servers: tuple[str, ...]
    sentinel_creds: str
    space: str
    owner: str
    actor: str


Report = Callable[[str], None]


def _tampered(token: str) -> str:
    head, body, signature = token.split(".")
    flipped = "A" if signature[10] != "A" else "B"
    return f"{head}.{body}.{signature[:10]}{flipped}{signature[11:]}"


def _grant_check_actor(paths: RootPaths, space: str, issuer: str) -> LedgerRow:
    space_paths = paths.space(space)
    owner = derive_owner(load_owner_secret(space_paths.owner_secret_json), issuer, CHECK_SUBJECT)
    row = LedgerRow(
        kind=LedgerKind.INTERACTIVE, owner=owner, actor=CHECK_ACTOR, scope=(), allow_subscribe=(),
        allow_publish=(), role=None, parent=None, label="cotal check (temporary)", token_hash=None,
        lifecycle_uid=mint_lifecycle_uid(os.urandom(20)),
        granted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    write_row(space_paths, row)
    return row


@asynccontextmanager
async def _client(target: Target, bearer: str) -> AsyncIterator[Connection]:
    nonce = "ibx" + secrets.token_hex(8)
    async with open_loop(), _first_answering(
        target.servers, creds=target.sentinel_creds, token=bearer, name=nonce,
        inbox_prefix=f"_INBOX_{nonce}", reconnect=False,
    ) as conn:
        yield conn


@asynccontextmanager
async def _first_answering(servers: Sequence[str], **options: Any) -> AsyncIterator[Connection]:
    """A connection through the first of ``servers`` that answers; a refusal is not retried.

    Raises:
        Unavailable: no server answered (naming each), or the broker refused the connect.
    """
    unreachable: list[str] = []
    async with AsyncExitStack() as stack:
        conn = None
        for url in servers:
            try:
                conn = await stack.enter_async_context(open_connection(url, **options))
            except* Unavailable as group:
                if any("Authorization Violation" in str(e) for e in leaves(group)):
                    raise  # a refusal: every node of the cluster would give the same answer
                unreachable += [str(e) for e in leaves(group)]
            if conn is not None:
                break
        if conn is None:
            raise Unavailable("; ".join(unreachable) or "no broker URL was given")
        yield conn


def _failure(step: str, error: BaseException) -> CheckFailed:
    """One CheckFailed naming ``step``; an inner step that already named itself wins."""
    found = leaves(error)
    named = [e for e in found if isinstance(e, CheckFailed) and e.step]
    if named:
        return named[0]
    reason = "; ".join(dict.fromkeys(str(e) or type(e).__name__ for e in found))
    return CheckFailed(step, reason)


async def _step(report: Report, name: str, action: Callable[[], Awaitable[T]]) -> T:
    """Run one step under its ceiling and report it; CheckFailed names the step on failure."""
    try:
        with trio.fail_after(STEP_CEILING_S):
            result = await action()
    except* (AuthServiceError, trio.TooSlowError, OSError) as group:
        raise _failure(name, group) from None
    report(f"✓ {name}")
    return result


async def _exchange(space_paths: SpacePaths, idp_token: str, actor: str) -> dict[str, Any]:
    service = read_service(space_paths)
    body = {"idpToken": idp_token, "actor": actor}
    return await trio.to_thread.run_sync(functools.partial(post_exchange, service.url, service.cap, body))


async def _within_and_outside(target: Target, bearer: str, report: Report) -> None:
    connect = "connect with the sentinel creds and the bearer"
    try:
        async with _client(target, bearer) as conn:
            report(f"✓ {connect}")
            # a DM to itself, sent as itself (the two tokens after the recipient name the sender)
            subject = dm_subject(target.space, target.owner, target.actor).removesuffix(">") + f"{target.owner}.{target.actor}"
            await _step(report, "publish and receive within the grant", functools.partial(_round_trip, conn, subject))
            await _step(report, "a publish outside the grant is refused", functools.partial(_outside, conn, target.space))
    except* (AuthServiceError, OSError) as group:
        raise _failure(connect, group) from None


async def _round_trip(conn: Connection, subject: str) -> None:
    send, receive = trio.open_memory_channel[Message](1)
    await conn.subscribe(subject, on_message=send.send_nowait)
    await conn.flush()
    await conn.publish(subject, b"cotal check")
    msg = await receive.receive()
    if msg.data != b"cotal check":
        raise CheckFailed("", "the message came back changed")


async def _outside(conn: Connection, space: str) -> None:
    before = conn.error_count
    await conn.publish(f"cotal.{space}.check.outside-the-grant", b"must be refused")
    error = await conn.wait_error(after=before)
    if "permissions violation" not in error.lower():
        raise CheckFailed("", f"expected a permissions violation, got: {error}")


async def _tampered_refused(target: Target, bearer: str) -> None:
    refused = False
    try:
        async with _client(target, _tampered(bearer)):
            pass
    except* AuthServiceError as group:
        refused = any("Authorization Violation" in str(e) for e in leaves(group))
        if not refused:
            raise
    if not refused:
        raise CheckFailed("", "the broker admitted a tampered bearer")


async def run_check(
    paths: RootPaths, space: str, *, servers: Sequence[str], report: Report,
    idp_token: str | None = None, actor: str | None = None,
) -> None:
    """Run every step, reporting ``✓ <step>`` lines; raises CheckFailed at the first failure.

    Args:
        servers: the broker's seed URLs, ``nats://host:port``; each connect goes through the
            first that answers.

    Raises:
        CheckFailed: a step failed (the message names it).
        ConfigError: a real IdP is pinned and no ``idp_token``/``actor`` was given, or the root
            is missing or corrupt.
    """
    space_paths = paths.space(space)
    pin = load_idp_pin(space_paths.idp_json)
    if idp_token is None and pin.kind != "dev":
        raise ConfigError(
            f"space {space} pins the IdP {pin.issuer} - run `cotal login --space {space}` and pass --actor"
            " (or pass --idp-token and --actor)"
        )
    if (idp_token is None) != (actor is None):
        raise ConfigError(
            "pass --actor with --idp-token or after `cotal login` (or neither, with the development IdP)"
        )
    read_service(space_paths)
    report("✓ the auth service is running")
    row = None if idp_token else _grant_check_actor(paths, space, pin.issuer)
    try:
        if idp_token is None:
            idp_token = mint_dev_token(DevIdpMaterial.from_json(paths.devidp_json.read_bytes()), sub=CHECK_SUBJECT, now=int(time.time()), ttl_s=300)
            report("✓ IdP token from the development IdP")
        answer = await _step(report, "exchange the IdP token for a bearer", functools.partial(_exchange, space_paths, idp_token, actor or CHECK_ACTOR))
        target = Target(
            servers=tuple(servers),
            sentinel_creds=space_paths.sentinel_creds.read_text(), space=space,
            owner=answer["owner"], actor=actor or CHECK_ACTOR,
        )
        await _within_and_outside(target, answer["token"], report)
        await _step(report, "a tampered bearer is refused", functools.partial(_tampered_refused, target, answer["token"]))
    finally:
        if row is not None:
            remove_row(space_paths, row.owner, row.actor)
