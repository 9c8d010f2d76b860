"""Standalone callers' I/O: the mint's connection, surface, intent and footprint, and the host's
intent read (spec credential-authority "Standalone callers"; issue 6 item 7; docs/static-credentials.md).

The pure rules are :mod:`cotal_trio.core.callers`; ``cotal auth mint --endpoint`` (``cli/auth.py``)
runs these steps in this order, so a private create-only intent precedes native footprint work:

1. :func:`open_minter`: a temporary data-account user of the space, signed with the space's
   service signing key, holding :func:`~cotal_trio.core.callers.minter_permissions`, alive for
   :data:`MINTER_LIFETIME_S`.
2. :func:`fetch_surface`: ``describe`` asked of the endpoint itself, as the new principal.
3. :func:`ensure_issued_stores`, then :func:`create_intent` (create-only, per-message TTL; its
   outcome tells "not written" from "may exist").
4. :func:`provision_caller`: the space's streams and the principal's DM inbox durable.

An endpoint host calls :func:`check_caller_request` on each describe that carries
``Cotal-Caller-Jwt`` and on every other verb: the checks that need no intent first, then the
caller's intent read as the first message on its key (``STREAM.MSG.GET``, as
:class:`~cotal_trio.stores.issued.IssuedStores` reads evidence), then the intent-bound checks. The
data account it checks against is :func:`load_data_account` (the root's ``accounts.json``). The intent selects coordinates; it is no
wire grant, accepted-generation proof or live lifecycle check, and broker admission remains a
separate requirement.

Every async function here is trio-flavoured and a checkpoint, bounded by the caller's deadline
(no timeout parameters). Wall time comes in as ``now`` (unix seconds).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from cotal_trio.broker.provision import load_space_accounts, mint_service_user
from cotal_trio.core import natsjwt, wire
from cotal_trio.core.caller_checks import CallerIntent, DataAccount, check_caller_intent, check_caller_jwt
from cotal_trio.core.callers import (
    CALLER_JWT_HEADER,
    DESCRIBE,
    Intent,
    Surface,
    intent_key,
    intent_ttl_s,
    minter_permissions,
    render_intent,
)
from cotal_trio.core.errors import ConfigError, RefusalCode, Refused, Unavailable
from cotal_trio.natsio import (
    Connection,
    JetStreamError,
    Message,
    NoResponders,
    StreamDrift,
    SubjectConflict,
    ensure_stream,
    first_message,
    open_connection,
    publish_expecting,
)
from cotal_trio.state import RootPaths, SpaceMaterial, load_broker
from cotal_trio.stores.issued import issued_shapes
from cotal_trio.stores.streams import ensure_dm_inbox, ensure_space_streams, ensure_watches

__all__ = [
    "MINTER_LIFETIME_S",
    "STATIC_RECREATE_REMEDY",
    "IntentExists",
    "IntentNotCreated",
    "IntentUnsettled",
    "check_caller_request",
    "create_intent",
    "ensure_issued_stores",
    "fetch_surface",
    "load_data_account",
    "open_minter",
    "open_temporary_user",
    "provision_caller",
    "read_intent",
    "refusal_answer",
]

# The mint's temporary user expires after this long (seconds): it lives for one mint only.
MINTER_LIFETIME_S = 120
# A static space's drifted issued store: no `cotal up` serves it, so its own command recreates it.
STATIC_RECREATE_REMEDY = (
    "stop every process using the space's issued stores first (its endpoint hosts, and anything else reading "
    "them), then run `cotal auth recreate-issued-stores --space {space} <backup-dir>`"
)


class IntentExists(Refused):
    """The intent's key already holds an intent (CONFLICT): this create did not happen.

    Spec "Standalone callers".
    """


class IntentNotCreated(Unavailable):
    """The broker answered the create with a refusal (no store, JetStream off, ...): the intent
    was not written.

    Spec "Standalone callers".
    """


class IntentUnsettled(Unavailable):
    """The create was sent and not acknowledged (no answer, the connection closed): the intent
    may exist until ``expiresAt + 60``.

    Spec "Standalone callers".
    """


@asynccontextmanager
async def open_minter(
    material: SpaceMaterial, server_url: str, *, owner: str, actor: str, uid: str, endpoint: str,
    inbox_nonce: str, now: int,
) -> AsyncIterator[Connection]:
    """Trio-flavoured async context manager: the mint's temporary connection.

    A fresh data-account user (:func:`open_temporary_user`) with
    :func:`~cotal_trio.core.callers.minter_permissions` for ``<owner>.<actor>`` and lifecycle
    ``uid``. Must be entered inside an ``open_loop()``.

    Raises:
        Unavailable: as :func:`open_temporary_user`.
        Refused: BAD_REQUEST, a malformed name (a caller bug: the CLI checked them).

    Spec "Standalone callers".
    """
    permissions = minter_permissions(space=material.space, owner=owner, actor=actor, uid=uid, endpoint=endpoint,
                                     inbox_nonce=inbox_nonce).to_nats()  # fmt: skip
    async with open_temporary_user(material, server_url, name=f"cotal:caller-mint:{material.space}",
                                   permissions=permissions, inbox_nonce=inbox_nonce, now=now) as conn:  # fmt: skip
        yield conn


@asynccontextmanager
async def open_temporary_user(
    material: SpaceMaterial, server_url: str, *, name: str, permissions: dict, inbox_nonce: str, now: int,
) -> AsyncIterator[Connection]:
    """Trio-flavoured async context manager: a connection as a fresh data-account user of the
    space, signed by its service signing key, never written to disk, holding ``permissions``
    (NATS ``{pub, sub}``) and expiring ``MINTER_LIFETIME_S`` after ``now``; connected with name
    ``inbox_nonce`` and inbox prefix ``_INBOX_<inbox_nonce>``. Must be entered inside an
    ``open_loop()``.

    Raises:
        Unavailable: nothing reachable at ``server_url`` (the sentence names the fix), or the
            broker refused the connect or did not answer.

    Spec "Provisioning" / "Standalone callers".
    """
    creds = mint_service_user(material, name=name, permissions=permissions, iat=now, exp=now + MINTER_LIFETIME_S)
    connect = open_connection(server_url, creds=creds, name=inbox_nonce, inbox_prefix=f"_INBOX_{inbox_nonce}",
                              reconnect=False)  # fmt: skip
    try:
        conn = await connect.__aenter__()
    except (Unavailable, OSError) as exc:  # nothing listens there, it is no broker, or it refused us
        detail = str(exc).removeprefix(f"connect {server_url}: ")
        raise Unavailable(
            f"cannot reach the broker at {server_url} ({detail}) - start the root's broker (`cotal up`), or pass "
            "--server nats://host:port of a running one that trusts the space's account"
        ) from None
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_exit(connect)
        yield conn


async def fetch_surface(conn: Connection, *, space: str, endpoint: str, owner: str, actor: str) -> bytes | None:
    """Trio: ask ``endpoint`` to ``describe`` itself on ``cotal.S.ep.<endpoint>.describe.<o>.<a>``
    (empty body, no ``Cotal-Caller-Jwt``: the credential does not exist yet); its answer's payload,
    or None when nothing subscribes (the broker's no-responders status).

    Bounded by the caller's deadline (``cotal auth mint`` gives it 5 s).

    Raises:
        Unavailable: the connection closed, or no answer within natsio's 10 s cap.

    Spec "Standalone callers".
    """
    try:
        return (await conn.request(wire.ep_subject(space, endpoint, DESCRIBE, owner, actor), b"")).data
    except NoResponders:
        return None


async def ensure_issued_stores(conn: Connection, space: str) -> None:
    """Trio: create or verify ``KV_cotal_issued_<S>`` and ``KV_cotal_accepted_<S>`` in their
    current shape (:func:`~cotal_trio.stores.issued.issued_shapes`; a static space has no lane, so
    nothing else creates them).

    Raises:
        ConfigError: a store has another shape; the sentence names the differences and the
            static space's remedy (:data:`STATIC_RECREATE_REMEDY`). The store is left as it is.
        Unavailable: the broker or JetStream did not answer, or refused.

    Spec "Standalone callers".
    """
    for shape in issued_shapes(space):
        try:
            await ensure_stream(conn, shape)
        except StreamDrift as exc:
            raise ConfigError(
                f"space {space}'s store {exc.stream} has another shape than issued authority needs "
                f"({'; '.join(exc.differences)}) and is refused - " + STATIC_RECREATE_REMEDY.format(space=space)
            ) from None


async def create_intent(conn: Connection, intent: Intent, *, now: float) -> int:
    """Trio: write ``intent`` create-only on ``$KV.cotal_issued_<S>.intent.v1.<o>.<a>.<uid>`` with
    ``Nats-TTL: expiresAt + 60 - now``; its stream sequence.

    Cancellation: once the publish was handed to the connection, a cancelled create may have
    happened (the caller must treat it as :class:`IntentUnsettled`).

    Raises:
        IntentExists: the key already holds an intent (the broker refused the create: not written).
        IntentNotCreated: the broker answered with another refusal, or no store takes the subject
            (not written).
        IntentUnsettled: no acknowledgement (no answer, the connection closed): it may exist.

    Spec "Standalone callers".
    """
    subject = wire.kv_subject(wire.issued_bucket(intent.space), intent.key)
    try:
        return await publish_expecting(conn, subject, render_intent(intent), expected_last_subject_seq=0,
                                       ttl_s=intent_ttl_s(intent, now=now))  # fmt: skip
    except SubjectConflict:
        raise IntentExists(
            RefusalCode.CONFLICT,
            f"an issuance intent already exists for {intent.owner}.{intent.actor} lifecycle {intent.uid} - it is "
            "create-only and never issued twice; mint again for a fresh lifecycle UID",
        ) from None
    except Unavailable as exc:
        if isinstance(exc, JetStreamError):  # the broker answered no (a missing store included), with or without an err_code
            raise IntentNotCreated(f"the issuance intent was not created: {exc}") from exc
        raise IntentUnsettled(f"the issuance intent's create was not acknowledged ({exc}), so it may exist") from exc


async def read_intent(conn: Connection, *, space: str, owner: str, actor: str, uid: str) -> bytes | None:
    """Trio: the intent's bytes, read as the FIRST message on its key (so nothing written on the key
    later changes it), or None when there is none (never minted, or gone after its TTL).

    Raises:
        Refused: BAD_REQUEST for a malformed owner, actor or UID.
        Unavailable: the issued store is missing or the broker did not answer.

    Spec "Standalone callers".
    """
    bucket = wire.issued_bucket(space)
    msg = await first_message(conn, wire.kv_stream(bucket), wire.kv_subject(bucket, intent_key(owner, actor, uid)))
    return None if msg is None else msg.data


async def provision_caller(conn: Connection, space: str, owner: str, actor: str) -> None:
    """Trio: the native footprint: the space's message streams, presence, channel-registry and
    admission stores, the principal's bind-only DM inbox durable ``dm-<o>-<a>`` (no role, so no
    task queue) and its two watch readers (``stores/streams.ensure_watches``).

    Raises:
        ConfigError: a stream or durable exists with another shape (never changed).
        Unavailable: the broker or JetStream did not answer, or refused.

    Spec "Standalone callers".
    """
    await ensure_space_streams(conn, space)
    await ensure_dm_inbox(conn, space, owner, actor)
    await ensure_watches(conn, space, owner, actor)


def _caller_jwt(msg: Message) -> str:
    for name, value in (msg.headers or {}).items():
        if name.lower() == CALLER_JWT_HEADER.lower():
            return value
    raise Refused(RefusalCode.BAD_CREDENTIAL, f"standalone caller refused: the request carries no {CALLER_JWT_HEADER} header")


def load_data_account(paths: RootPaths, space: str) -> DataAccount:
    """Sync, blocking file reads: the space's data account as a host checks callers against it,
    from the root's ``accounts.json`` (verified against the operator signing key).

    ``cotal auth revoke-credential`` saves the re-signed account JWT there before it pushes it to
    the broker, so a host that loads it for each request (or whenever the file changes) sees a
    revocation no later than the broker does. A client of the data account cannot read its
    account JWT from the broker, so the root's file is the host's source.

    Raises:
        ConfigError: the root's broker or accounts file is missing or corrupt.

    Spec "Standalone callers"; docs/static-credentials.md "Host check".
    """
    accounts = load_space_accounts(paths, load_broker(paths.broker_json), space)
    return DataAccount.from_claims(natsjwt.verify(accounts.data_jwt))


async def check_caller_request(
    conn: Connection, msg: Message, *, space: str, endpoint: str, surface: Surface, account: DataAccount, now: int,
) -> CallerIntent:
    """Trio: what a host runs on a standalone caller's describe (with ``Cotal-Caller-Jwt``) or any
    other verb ``msg``: :func:`~cotal_trio.core.caller_checks.check_caller_jwt` on the header first (no
    intent is read for a request that fails it), then the intent read by the coordinates it
    verified (the subject's owner and actor, the ``lifecycle:`` tag), then
    :func:`~cotal_trio.core.caller_checks.check_caller_intent`.

    The intent selects coordinates; it is no wire grant, accepted-generation proof or live
    lifecycle check. Broker admission remains a separate requirement.

    Args:
        conn: a data-account connection allowed ``$JS.API.STREAM.MSG.GET.KV_cotal_issued_<S>``.
        space, endpoint, surface: the host's; account: the data account (:func:`load_data_account`,
            loaded fresh so revocations count); now: unix seconds.

    Raises:
        Refused: the request is refused (no header, a check failed, no intent); the sentence is
            safe to answer (:func:`refusal_answer`).
        Unavailable: the issued store is missing or the broker did not answer.

    Spec "Standalone callers".
    """
    caller = check_caller_jwt(_caller_jwt(msg), subject=msg.subject, space=space, endpoint=endpoint, surface=surface,
                              account=account, now=now)  # fmt: skip
    intent = await read_intent(conn, space=space, owner=caller.owner, actor=caller.actor, uid=caller.uid)
    if intent is None:
        raise Refused(RefusalCode.NOT_GRANTED, f"standalone caller refused: {msg.subject} has no issuance intent - mint the caller with `cotal auth mint --endpoint`")
    return check_caller_intent(caller, intent, space=space, endpoint=endpoint, surface=surface, account=account)


def refusal_answer(exc: Refused) -> bytes:
    """Sync: a host's answer to a refused request: ``{"ver": 1, "error": <sentence>, "code": <code>}``.

    Spec "Standalone callers".
    """
    return json.dumps({"ver": 1, "error": exc.detail, "code": exc.code.value}, separators=(",", ":")).encode()
