"""Spaces on a running root: add, remove and list (DESIGN.md sections 4 and 9; issue 3 item 1).

Adding a space (:func:`add_space`)::

    ensure_root, ensure_space          keys created once, never again
    push data JWT, then auth JWT       $SYS.REQ.CLAIMS.UPDATE, each read back with LOOKUP
    <root>/spaces.json += {space}      version-2 manifest: a running host starts the lane
                                       (``replicas`` given: the entry's store copies, issue 17)

A space whose ``accounts.json`` existed before the call is re-signed first (:func:`resign_space`
gives a later ``iat``): it may have been pushed and deleted before, and a deleted account
ignores an identical JWT (reference nats-operator-mode.md pitfall P7). Re-signing a live
account is harmless (same claims, newer ``iat``; its users stay connected).

Removing a space (:func:`remove_space`)::

    <root>/spaces.json -= {space}      first, so a running host stops the lane
    (wait for <spaces.json>.applied)   optional: until the lane has fully stopped (not when
                                       the host that wrote it is gone: state/applied.py)
    delete the KV_cotal_* streams      as a short-lived data-account service user (pitfall P8:
                                       an account delete keeps its JetStream data)
    $SYS.REQ.CLAIMS.DELETE [auth, data] signed by the operator signing key

The space's material stays in the root, so a later add re-signs and re-pushes the same keys.

**Static spaces.** A static-auth space has no lane, so it is kept out of ``spaces.json`` (the
v2 manifest refuses unknown keys, so a ``"static"`` flag cannot live there). Its mode is
recorded in the space folder instead: ``<space folder>/mode.json`` = ``{"ver": 1, "mode":
"static"}``. A space without ``mode.json`` is a user-auth space. Adding a space again without
``static`` removes ``mode.json``; adding it with ``static`` removes it from ``spaces.json``.

The broker URL: ``server_url`` when given; else ``nats://127.0.0.1:<port of policy.json>`` when
``policy.json`` exists and something accepts TCP there; else nothing is pushed or deleted on a
broker (the result says so).

Concurrency: ``spaces.json`` is rewritten atomically (read, change, rename) but two concurrent
``space add`` runs on one root may lose one of the two entries; run them one at a time. The
up-lock of the root (:func:`cotal_trio.state.hold_root`) is NOT taken: ``cotal up`` holds it
while it runs, and these commands exist to change the set of spaces under a running ``cotal up``.

All async functions are trio-flavoured and bounded by the caller's deadline (wrap them in
``trio.fail_after``); they open their own :func:`cotal_trio.natsio.open_loop`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio

from cotal_trio import natsio
from cotal_trio.broker import provision
from cotal_trio.broker.accounts import (
    delete_accounts,
    lookup_subject,
    open_system_connection,
    push_accounts,
)
from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.core.identity import is_space
from cotal_trio.core.manifest import SpaceEntry, parse_manifest, render_manifest, replicas_problems
from cotal_trio.core.servers import join_servers, parse_servers
from cotal_trio.state import (
    BrokerMaterial,
    IdpPinRecord,
    RootPaths,
    SpaceMaterial,
    SpacePaths,
    atomic_write,
    load_broker,
    load_policy,
    load_space,
    read_json,
    remove_quietly,
    render_json,
    save_idp_pin,
)
from cotal_trio.state.applied import applied_path, read_applied
from cotal_trio.state.seeds import load_seeds
from cotal_trio.state.space_folders import require_space

__all__ = [
    "MODE_STATIC",
    "MODE_USER_AUTH",
    "SPACE_ADMIN_USER",
    "STORE_STREAM_PREFIX",
    "AddedSpace",
    "RemovedSpace",
    "add_space",
    "broker_holds",
    "delete_space_streams",
    "hosted_entries",
    "list_spaces",
    "mode_path",
    "open_space_admin",
    "remove_space",
    "resolve_server_url",
    "set_hosted",
    "space_mode",
]

MODE_STATIC = "static"
MODE_USER_AUTH = "user-auth"
MODE_FILE = "mode.json"
MODE_VERSION = 1
SPACE_ADMIN_USER = "cotal-space-admin"
STORE_STREAM_PREFIX = "KV_cotal_"
ADMIN_PERMISSIONS = {"pub": {"allow": ["$JS.API.>"]}, "sub": {"allow": ["_INBOX.>"]}}
ADMIN_LIFETIME_S = 60
PROBE_S = 1.0  # how long "is a broker listening on the policy port" may take
APPLIED_POLL_S = 0.1
STREAM_NAMES = "$JS.API.STREAM.NAMES"
STREAM_DELETE = "$JS.API.STREAM.DELETE."


@dataclass(frozen=True, slots=True)
class AddedSpace:
    """What :func:`add_space` did.

    Attributes:
        space: the space name.
        mode: ``"user-auth"`` or ``"static"``.
        server_url: the broker the accounts were pushed to, or None (no broker: nothing pushed).
        resigned: the account JWTs were re-signed before the push (the space existed before).
        data_jwt, auth_jwt: the account JWTs now recorded in ``accounts.json``.
        hosted: the space is listed in ``spaces.json``.
    """

    space: str
    mode: str
    server_url: str | None
    resigned: bool
    data_jwt: str
    auth_jwt: str
    hosted: bool


@dataclass(frozen=True, slots=True)
class RemovedSpace:
    """What :func:`remove_space` did.

    Attributes:
        space: the space name.
        server_url: the broker the accounts were deleted on, or None (no broker reached).
        was_hosted: the space was listed in ``spaces.json`` (now it is not).
        lane_stopped: ``.applied`` showed the lane gone (None: not waited for, no ``.applied``,
            or its host is gone).
        streams_deleted: names of the JetStream streams deleted.
        accounts_deleted: the broker held the accounts and deleted them.
        host_gone: ``"no host running (the last host, pid N, is gone)"`` when the host that
            wrote ``.applied`` no longer runs, so there was no lane to wait for; else None.
    """

    space: str
    server_url: str | None
    was_hosted: bool
    lane_stopped: bool | None
    streams_deleted: tuple[str, ...]
    accounts_deleted: bool
    host_gone: str | None = None


# -- files (blocking; called through trio.to_thread) -------------------------------------------


def mode_path(sp: SpacePaths) -> Path:
    """``<space folder>/mode.json``: present only for a static-auth space."""
    return sp.dir / MODE_FILE


def space_mode(sp: SpacePaths) -> str:
    """``"static"`` when ``mode.json`` says so, else ``"user-auth"`` (blocking file I/O).

    Raises:
        ConfigError: a corrupt ``mode.json``.
    """
    path = mode_path(sp)
    if not path.exists():
        return MODE_USER_AUTH
    obj = read_json(path)
    if obj.get("ver") != MODE_VERSION or obj.get("mode") != MODE_STATIC:
        raise ConfigError(
            f"{path} is corrupt - write {{\"ver\": 1, \"mode\": \"static\"}} or remove it for a "
            "user-auth space"
        )
    return MODE_STATIC


def _write_mode(sp: SpacePaths, static: bool) -> None:
    if static:
        atomic_write(mode_path(sp), render_json({"ver": MODE_VERSION, "mode": MODE_STATIC}))
    else:
        remove_quietly(mode_path(sp))


def hosted_entries(paths: RootPaths) -> list[SpaceEntry]:
    """The entries of ``spaces.json`` (none when it does not exist).

    Raises:
        ConfigError: unreadable, or refused by the manifest parser (its reasons are quoted).
    """
    path = paths.spaces_manifest
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigError(f"{path} is unreadable ({exc.strerror}) - check its permissions") from None
    try:
        return list(parse_manifest(data).spaces)
    except ConfigError as exc:
        raise ConfigError(f"{path} is refused ({exc}) - fix it by hand first") from None


def _write_manifest(paths: RootPaths, entries: list[SpaceEntry]) -> None:
    atomic_write(paths.spaces_manifest, render_manifest(entries))


def set_hosted(paths: RootPaths, space: str, hosted: bool, *, replicas: int | None = None) -> bool:
    """Add (keeping an existing entry as it is) or drop ``space`` in ``spaces.json``.

    Args:
        replicas: with ``hosted``, the entry's ``replicas`` (issue 17 item 1), set on a new or an
            existing entry; None keeps an existing entry's count (a new one gets 1).

    Returns:
        Whether the space was listed before. The file is written only when something changes.
    """
    entries = hosted_entries(paths)
    old = next((e for e in entries if e.space == space), None)
    if hosted:
        new = old or SpaceEntry(space=space)
        if replicas is not None:
            new = dataclasses.replace(new, replicas=replicas)
        if new != old:
            _write_manifest(paths, [*(e for e in entries if e.space != space), new])
    elif old is not None:
        _write_manifest(paths, [e for e in entries if e.space != space])
    return old is not None


def _provision(paths: RootPaths, space: str, static: bool, iat: int) -> tuple[BrokerMaterial, bool]:
    """ensure_root + ensure_space + mode.json; returns the broker material and whether the
    space's accounts existed before (so they may have been pushed: re-sign)."""
    broker = provision.ensure_root(paths, iat=iat)
    existed = paths.space(space).accounts_json.exists()
    provision.ensure_space(paths, broker, space, iat=iat)
    _write_mode(paths.space(space), static)
    return broker, existed


def _check_case_twin(paths: RootPaths, space: str) -> None:
    """Refuse a new space whose name differs from an existing one only in letter case: on a
    case-insensitive file system (macOS, a Windows share) both would be one folder.

    Raises:
        ConfigError: names the existing space.
    """
    try:
        names = [entry.name for entry in paths.spaces_dir.iterdir()]
    except FileNotFoundError:
        return
    for name in names:
        if name != space and is_space(name) and name.casefold() == space.casefold():
            raise ConfigError(
                f"space {space} differs from the root's space {name} only in letter case, and would share "
                "its folder on a case-insensitive file system - pick another name"
            )


def _check_same_mode(paths: RootPaths, space: str, static: bool) -> None:
    """Refuse a re-add that would change an existing space's mode (static <-> user-auth).

    A static space made user-auth by a bare re-add would be hosted while its minted files still
    connect, and mint would then refuse it; the other way round would drop a served space's lane.

    Raises:
        ConfigError: the space exists in the other mode; names the re-add that keeps it and the
            remove that changing it needs.
    """
    sp = paths.space(space)
    if not sp.callout_json.exists():
        return
    current, wanted = space_mode(sp), MODE_STATIC if static else MODE_USER_AUTH
    if current != wanted:
        keep = f"cotal space add {space}{' --static' if current == MODE_STATIC else ''}"
        raise ConfigError(
            f"space {space} is a {current} space - `{keep}` re-pushes it as it is; to make it a {wanted} space, "
            f"`cotal space remove {space}` first, then add it again"
        )


def _check_name(space: str) -> None:
    if not is_space(space):
        raise ConfigError(f"{space!r} is not a space name - use 1 to 64 letters, digits, _ and -")


def _check_replicas(replicas: int | None, static: bool) -> None:
    if replicas is None:
        return
    if static:
        raise ConfigError("--replicas sets a hosted space's store copies; a --static space has no lane - drop one of them")
    problems = replicas_problems(replicas, "--replicas", "pass")
    if problems:
        raise ConfigError(problems[0])


def _existing_space(paths: RootPaths, space: str) -> tuple[BrokerMaterial, SpacePaths]:
    _check_name(space)
    sp = require_space(paths, space)
    return load_broker(paths.broker_json), sp


# -- the broker URL ------------------------------------------------------------------------------


async def resolve_server_url(paths: RootPaths, server_url: str | None) -> str | None:
    """Trio: ``server_url`` (one URL or a comma-separated seed list); else the nodes recorded in
    ``<root>/broker/seeds.json`` (``cotal broker config``; issue 17 item 3) when one of them
    listens; else the root's broker by ``policy.json`` when it is listening; else None.

    Raises:
        ConfigError: ``server_url`` is empty or not a seed list (one sentence naming the fix), or
            ``seeds.json`` or ``policy.json`` is corrupt.
    """
    if server_url is not None:
        if not server_url.strip():
            raise ConfigError("--server is empty - pass nats://host:port, or leave it out for the root's broker")
        return join_servers(parse_servers(server_url))
    seeds = await trio.to_thread.run_sync(load_seeds, paths)
    if seeds:
        return join_servers(seeds) if await _any_listens(seeds) else None
    if not await trio.to_thread.run_sync(paths.policy_json.exists):
        return None
    policy = await trio.to_thread.run_sync(load_policy, paths.policy_json)
    url = f"nats://127.0.0.1:{policy.port}"
    return url if await _any_listens((url,)) else None


async def _any_listens(urls: tuple[str, ...]) -> bool:
    """Trio: does a TCP connect to one of ``urls`` succeed within :data:`PROBE_S` in all?"""
    with trio.move_on_after(PROBE_S):
        for url in urls:
            where = urlsplit(url)
            try:
                stream = await trio.open_tcp_stream(where.hostname or "127.0.0.1", where.port or 4222)
            except OSError:
                continue
            await stream.aclose()
            return True
    return False


# -- add -------------------------------------------------------------------------------------------


async def add_space(
    paths: RootPaths, space: str, *, static: bool = False, server_url: str | None = None, now: float,
    idp_pin: IdpPinRecord | None = None, replicas: int | None = None,
) -> AddedSpace:
    """Trio: provision ``space`` in the root, push its accounts, and host it (unless static).

    Args:
        static: a static-auth space (no lane): recorded in ``mode.json``, kept out of
            ``spaces.json``.
        server_url: the broker to push to (see :func:`resolve_server_url` for the default).
        now: unix seconds (``iat`` of anything signed).
        idp_pin: the IdP pin to record for a space that has none, before it is hosted (so a
            running host never starts its lane unpinned); an existing pin is kept.
        replicas: the ``replicas`` of the space's ``spaces.json`` entry (1..5; issue 17 item 1),
            None to keep an existing entry's (a new entry gets 1).

    Raises:
        ConfigError: a bad space name or replica count, or a count for a static space; a corrupt root file or ``spaces.json``; the broker
            refused a JWT or trusts another operator (nothing is added to ``spaces.json``).
        Unavailable: the broker did not answer, or LOOKUP disagreed with the push.
    """
    _check_name(space)
    _check_replicas(replicas, static)
    await trio.to_thread.run_sync(_check_case_twin, paths, space)
    await trio.to_thread.run_sync(_check_same_mode, paths, space, static)
    iat = int(now)
    url = await resolve_server_url(paths, server_url)
    await trio.to_thread.run_sync(hosted_entries, paths)  # refuse a broken manifest before writing
    broker, existed = await trio.to_thread.run_sync(_provision, paths, space, static, iat)
    if existed:
        record = await trio.to_thread.run_sync(
            lambda: provision.resign_space(paths, broker, space, iat=iat)
        )
    else:
        record = await trio.to_thread.run_sync(provision.load_space_accounts, paths, broker, space)
    if url is not None:
        async with natsio.open_loop(), open_system_connection(url, broker) as sys_conn:
            await push_accounts(sys_conn, [record.data_jwt, record.auth_jwt])
    if idp_pin is not None and not static:
        await trio.to_thread.run_sync(lambda: save_idp_pin(paths.space(space).idp_json, idp_pin, exclusive=True))
    await trio.to_thread.run_sync(lambda: set_hosted(paths, space, not static, replicas=replicas))
    return AddedSpace(
        space=space, mode=MODE_STATIC if static else MODE_USER_AUTH, server_url=url,
        resigned=existed, data_jwt=record.data_jwt, auth_jwt=record.auth_jwt, hosted=not static,
    )


# -- remove ----------------------------------------------------------------------------------------


def _lane_listed(paths: RootPaths, space: str) -> tuple[bool | None, str | None]:
    """Whether ``<spaces.json>.applied`` still lists ``space``, and the sentence saying its host
    is gone when the host that wrote it no longer runs (issue 15 item 11).

    Returns:
        ``(listed, None)`` while its writer runs (or names none); ``(None, None)`` when there is
        no readable ``.applied`` file; ``(None, "no host running (...)")`` when its writer is
        gone: nothing will drop the space from that file, so there is nothing to wait for.
    """
    try:
        applied = read_applied(applied_path(paths.spaces_manifest))
    except ConfigError:  # unreadable or not an `.applied` file: nothing to wait on
        return None, None
    if applied is None:
        return None, None
    if applied.gone is not None:
        return None, applied.gone
    return space in applied.report.spaces, None


async def _wait_lane_stopped(paths: RootPaths, space: str, wait_s: float) -> tuple[bool | None, str | None]:
    """Poll ``.applied`` until it no longer lists ``space``: ``(True, None)``; ``(False, None)``
    when ``wait_s`` ran out first; ``(None, gone)`` when there is no such file or its writer is
    gone (``gone``: the sentence saying so, or None)."""
    with trio.move_on_after(wait_s):
        while True:
            listed, gone = await trio.to_thread.run_sync(_lane_listed, paths, space)
            if listed is None:
                return None, gone
            if not listed:
                return True, None
            await trio.sleep(APPLIED_POLL_S)
    return False, None


async def _stream_names(conn: natsio.Connection) -> list[str]:
    names: list[str] = []
    while True:
        reply = _js_reply("listing streams", (await conn.request(
            STREAM_NAMES, json.dumps({"offset": len(names)}).encode()
        )).data)
        page = [n for n in reply.get("streams") or () if isinstance(n, str)]
        names += page
        if not page or len(names) >= int(reply.get("total") or 0):
            return names


def _js_reply(what: str, data: bytes) -> dict[str, Any]:
    try:
        reply = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise Unavailable(f"{what}: JetStream's reply is not JSON") from None
    if not isinstance(reply, dict):
        raise Unavailable(f"{what}: JetStream's reply is not a JSON object")
    error = reply.get("error")
    if isinstance(error, dict):
        raise Unavailable(f"{what}: JetStream refused: {error.get('description') or error}")
    return reply


@asynccontextmanager
async def open_space_admin(url: str, material: SpaceMaterial, *, now: float) -> AsyncIterator[natsio.Connection]:
    """Trio: a connection to ``url`` as a 60-second data-account service user of the space
    (``cotal-space-admin``, the JetStream API only: :data:`ADMIN_PERMISSIONS`), which a CLI
    command uses to delete or read the space's streams. Must run inside
    :func:`cotal_trio.natsio.open_loop`.

    Raises:
        Unavailable: the connect was refused or the broker did not answer.
    """
    iat = int(now)
    creds = provision.mint_service_user(
        material, name=SPACE_ADMIN_USER, permissions=ADMIN_PERMISSIONS, iat=iat,
        exp=iat + ADMIN_LIFETIME_S,
    )
    async with natsio.open_connection(url, creds=creds, name="cotal:space-admin", reconnect=False) as conn:
        yield conn


async def delete_space_streams(
    url: str, material: SpaceMaterial, *, now: float, prefix: str = STORE_STREAM_PREFIX
) -> tuple[str, ...]:
    """Trio: delete every stream of the space's data account whose name starts with ``prefix``.

    Connects as a 60-second data-account service user (``cotal-space-admin``, JetStream API
    only). Must run inside :func:`cotal_trio.natsio.open_loop`.

    Returns:
        The deleted streams' names, sorted.

    Raises:
        Unavailable: the connect was refused, or JetStream did not answer or refused.
    """
    async with open_space_admin(url, material, now=now) as conn:
        names = sorted(n for n in await _stream_names(conn) if n.startswith(prefix))
        for name in names:
            reply = _js_reply(f"deleting stream {name}", (await conn.request(STREAM_DELETE + name, b"")).data)
            if reply.get("success") is not True:
                raise Unavailable(f"deleting stream {name}: JetStream did not confirm it")
    return tuple(names)


async def broker_holds(sys_conn: natsio.Connection, account: str) -> bool:
    """Trio: whether LOOKUP returns a JWT for ``account`` (a deleted or unknown one returns none;
    so does a broker that does not answer). ``sys_conn``: :func:`open_system_connection`'s."""
    try:
        reply = await sys_conn.request(lookup_subject(account), b"")
    except Unavailable:
        return False
    return reply.data.strip().startswith(b"ey")


async def remove_space(
    paths: RootPaths, space: str, *, server_url: str | None = None, now: float,
    lane_wait_s: float = 0.0,
) -> RemovedSpace:
    """Trio: stop hosting ``space``, delete its store streams, then its accounts on the broker.

    The space's material stays in the root (a later :func:`add_space` re-signs and re-pushes).
    Idempotent: accounts the broker no longer holds are skipped.

    Args:
        server_url: the broker (see :func:`resolve_server_url`); with none reachable, only
            ``spaces.json`` changes.
        now: unix seconds.
        lane_wait_s: wait up to this long for ``<spaces.json>.applied`` to drop the space (a
            running host stopping its lane) before deleting anything on the broker; 0: no wait.

    Raises:
        ConfigError: a bad or unknown space name, a corrupt root file or ``spaces.json``, or the
            broker refused the delete.
        Unavailable: the broker or JetStream did not answer, or refused the admin user.
    """
    broker, sp = await trio.to_thread.run_sync(_existing_space, paths, space)
    material = await trio.to_thread.run_sync(load_space, sp.callout_json, space)
    url = await resolve_server_url(paths, server_url)
    was_hosted = await trio.to_thread.run_sync(set_hosted, paths, space, False)
    stopped, gone = await _wait_lane_stopped(paths, space, lane_wait_s) if lane_wait_s > 0 else (None, None)
    streams: tuple[str, ...] = ()
    deleted = False
    if url is not None:
        async with natsio.open_loop(), open_system_connection(url, broker) as sys_conn:
            if await broker_holds(sys_conn, material.data_account):
                streams = await delete_space_streams(url, material, now=now)
            held = [a for a in (material.auth_account, material.data_account)
                    if await broker_holds(sys_conn, a)]
            if held:
                await delete_accounts(sys_conn, provision.delete_accounts_claim(broker, held, iat=int(now)))
                deleted = True
    return RemovedSpace(
        space=space, server_url=url, was_hosted=was_hosted, lane_stopped=stopped,
        streams_deleted=streams, accounts_deleted=deleted, host_gone=gone,
    )


# -- list ------------------------------------------------------------------------------------------


def _space_name(folder_name: str) -> str | None:
    # A space's folder is its name (state/layout.py); an earlier-layout ``space.<hex>`` folder is
    # not listed until a start renames it (state/space_folders.py).
    return folder_name if is_space(folder_name) else None


def list_spaces(paths: RootPaths, *, hosted: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Every space folder of the root holding material, sorted by name (blocking file I/O).

    Args:
        hosted: the spaces to call hosted; None (the default) reads them from ``spaces.json``.
            A reader given them (what the host's ``.applied`` serves, issue 18 item 4) lists
            the root while ``spaces.json`` is refused.

    Returns:
        ``[{"space": name, "mode": "user-auth"|"static", "hosted": bool}]``; ``hosted`` means
        listed in ``spaces.json`` (or in ``hosted``).

    Raises:
        ConfigError: a ``mode.json`` is corrupt, or (``hosted`` None) ``spaces.json`` is.
    """
    hosted = {e.space for e in hosted_entries(paths)} if hosted is None else set(hosted)
    try:
        folders = sorted(paths.spaces_dir.iterdir())
    except FileNotFoundError:
        folders = []
    rows = []
    for folder in folders:
        name = _space_name(folder.name)
        if name is None or not paths.space(name).callout_json.exists():
            continue
        rows.append({"space": name, "mode": space_mode(paths.space(name)), "hosted": name in hosted})
    return sorted(rows, key=lambda row: row["space"])
