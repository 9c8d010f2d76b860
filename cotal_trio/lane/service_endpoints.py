"""A space's service-endpoint admission: opened once, never closed (spec "Callout replicas").

A full auth service run with ``--service-endpoints`` (or as a lane whose manifest entry sets
``serviceEndpoints``) opens its space's admission: right after it holds the plane claim it
creates the row ``admission.service-endpoints`` in the space's auth bucket ``cotal_auth_<space>``
(:func:`open_admission`). The row is written create-only and nothing deletes it, so the space
admits service endpoints after the setting is dropped; only removing the space's stores removes
it. A callout-only replica cannot issue a service-endpoint connection, so before it subscribes
it reads the row and refuses the space (:func:`refuse_if_admitted`); a manifest writer asks the
same question with :func:`admits_service_endpoints`.

Row (version 1)::

    {"ver": 1, "openedAt": "2026-11-29T10:00:00Z", "holder": "host:1234:ab12cd34"}

A live value under the key is the admission, whatever it holds: an unreadable row still admits
(the replica refuses on the safe side) and only loses its ``openedAt`` in the refusal. A missing
bucket means the space has never been served by a full service, so it admits nothing; a replica
never creates the bucket.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import trio

from cotal_trio.core.errors import ConfigError, Refused, Unavailable, leaves
from cotal_trio.core.identity import check_space
from cotal_trio.core.manifest import format_utc
from cotal_trio.core.plane import plane_bucket
from cotal_trio.natsio import (
    Connection,
    KeyExists,
    StreamNotFound,
    kv_create,
    kv_get,
    open_loop,
)
from cotal_trio.state import RootPaths, SpaceMaterial, load_space, resolve_root
from cotal_trio.lane.service_users import open_service_user

__all__ = [
    "ADMISSION_KEY",
    "Admission",
    "admits_service_endpoints",
    "open_admission",
    "open_store_user",
    "parse_admission",
    "read_admission",
    "reader_permissions",
    "refuse_if_admitted",
    "render_admission",
]

ADMISSION_KEY = "admission.service-endpoints"
ROW_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """An open admission as read back.

    Attributes:
        opened_at: ``YYYY-MM-DDTHH:MM:SSZ`` when it was opened, or None when the row is
            unreadable (it admits all the same).
        holder: the plane-claim holder id of the service that opened it, or None.
    """

    opened_at: str | None
    holder: str | None


def render_admission(*, holder: str, now: float) -> bytes:
    """Sync: the row's bytes for ``holder`` opening the admission at ``now`` (unix seconds)."""
    row = {"ver": ROW_VERSION, "openedAt": format_utc(now), "holder": holder}
    return json.dumps(row, separators=(",", ":")).encode()


def parse_admission(value: bytes) -> Admission:
    """Sync: what a stored row says; never raises (any live row is an open admission)."""
    try:
        row = json.loads(value)
    except ValueError:
        row = None
    row = row if isinstance(row, dict) else {}
    return Admission(opened_at=_text(row.get("openedAt")), holder=_text(row.get("holder")))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def reader_permissions(space: str) -> dict[str, dict[str, list[str]]]:
    """Sync: the narrowest data-account permissions that read the row (and nothing else yet).

    ``kv_get`` is one ``STREAM.MSG.GET`` request on the bucket's stream, answered on the
    connection's ``_INBOX``.
    """
    return {
        "pub": {"allow": [f"$JS.API.STREAM.MSG.GET.KV_{plane_bucket(space)}"]},
        "sub": {"allow": ["_INBOX.>"]},
    }


def open_store_user(
    material: SpaceMaterial, server_url: str, *, name: str, permissions: Mapping[str, Any],
    iat: int, reconnect: bool,
) -> AbstractAsyncContextManager[Connection]:
    """Trio-flavoured async context manager: a connection as a fresh data-account service user
    with exactly ``permissions`` and no expiry, for one-off callers (the CLI's short-lived
    users); :func:`~cotal_trio.lane.service_users.open_service_user` with a mapping. Must be
    entered inside an ``open_loop()``.

    Args:
        name: the user's and the connection's name (the broker's monitoring shows it).
        permissions: ``{"pub": {...}, "sub": {...}}`` as :func:`~cotal_trio.broker.provision.mint_service_user` takes them.
        iat: unix seconds.
        reconnect: as :func:`~cotal_trio.natsio.open_connection`.

    Raises:
        Unavailable: the broker refused the connect or did not answer.
    """
    return open_service_user(
        material, server_url, name=name, permissions=permissions, iat=iat, exp=None, reconnect=reconnect
    )


async def read_admission(conn: Connection, space: str) -> Admission | None:
    """Trio: ``space``'s open admission, or None (no row, or no bucket yet). A checkpoint.

    Args:
        conn: a data-account connection allowed :func:`reader_permissions` (or more).

    Raises:
        Unavailable: the broker or JetStream did not answer.
    """
    try:
        entry = await kv_get(conn, plane_bucket(space), ADMISSION_KEY)
    except StreamNotFound:
        return None  # never served by a full service: nothing opened
    return None if entry is None else parse_admission(entry.value)


async def open_admission(conn: Connection, space: str, *, holder: str, now: float) -> Admission:
    """Trio: open ``space``'s admission (create-only); the admission now stored. A checkpoint.

    Call it holding the plane claim (the bucket exists). An admission already open is kept as
    it is, with its first ``openedAt``.

    Args:
        conn: the full lane's store connection.
        holder: this service's plane-claim holder id.
        now: wall time, unix seconds.

    Raises:
        Unavailable: the bucket is missing or the broker did not answer.
    """
    row = render_admission(holder=holder, now=now)
    try:
        await kv_create(conn, plane_bucket(space), ADMISSION_KEY, row)
        return parse_admission(row)
    except KeyExists:
        pass  # opened before; nothing closes it, and its first record stays
    stored = await read_admission(conn, space)
    if stored is None:  # only a deleted bucket or row gets here
        raise Unavailable(f"space {space}: the service-endpoint admission did not persist in {plane_bucket(space)}")
    return stored


async def refuse_if_admitted(conn: Connection, space: str) -> None:
    """Trio: return if ``space`` admits no service endpoints, else refuse it. A checkpoint.

    Raises:
        ConfigError: the space admits service endpoints (the sentence names it and the fix).
        Unavailable: the broker or JetStream did not answer.
    """
    admission = await read_admission(conn, space)
    if admission is None:
        return
    when = f"opened {admission.opened_at}" if admission.opened_at else "its record is unreadable"
    raise ConfigError(
        f"space {space} admits service endpoints ({when}), which a callout-only replica cannot"
        " serve - run the full auth service for it, or drop it from this replica's --space or manifest"
    )


async def admits_service_endpoints(
    space: str, *, server_url: str, root: RootPaths | str | os.PathLike[str] | None = None,
    clock: Callable[[], float] = time.time,
) -> bool:
    """Trio-flavoured: True when ``space`` admits service endpoints (upstream ``admitsServiceEndpoints``).

    A manifest writer's check (spec "Callout replicas"): a space whose full service has run with
    ``--service-endpoints``, or as a lane whose manifest entry sets ``serviceEndpoints``, admits
    them for good, and a callout-only replica refuses it. Connects to ``server_url`` as a fresh
    read-only data-account user of the space (from the root's material), reads the admission
    row and closes the connection. Call it from trio (it opens its own trio-asyncio loop); bound
    it with the caller's ``fail_after``/``move_on_after`` (no timeout parameter).

    Args:
        space: the space name.
        server_url: the broker, ``nats://host:port``, already trusting the space's accounts.
        root: the root (its :class:`~cotal_trio.state.RootPaths` or folder); None for
            ``$COTAL_ROOT``, else ``./.cotal``.
        clock: wall time, unix seconds (the user JWT's ``iat``).

    Raises:
        ConfigError: a malformed space name, or the space's material is missing or corrupt.
        Unavailable: the broker refused the connect or did not answer (not in a group).
    """
    try:
        check_space(space)
    except Refused as exc:
        raise ConfigError(f"space {space!r}: {exc.detail}") from None
    folder = None if root is None or isinstance(root, RootPaths) else os.fspath(root)
    paths = root if isinstance(root, RootPaths) else RootPaths(resolve_root(folder, os.environ))
    material = await trio.to_thread.run_sync(load_space, paths.space(space).callout_json, space)
    name = f"cotal:admission-check:{space}"
    try:
        async with open_loop(), open_store_user(
            material, server_url, name=name, permissions=reader_permissions(space), iat=int(clock()),
            reconnect=False,
        ) as conn:
            return await read_admission(conn, space) is not None
    except* Unavailable as group:  # the loop's nursery wraps it; a caller gets the one sentence
        first = leaves(group)[0]
        raise Unavailable(str(first)) from first
