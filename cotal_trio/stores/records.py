"""A space's records and sessions stores: manager instances, lifecycle records, consents, chat
sessions (spec "Listener policy"; docs/managers-and-sessions.md).

Two KV buckets per space, both history 1 with per-message TTLs allowed, created (or verified)
by the full lane at start with :func:`ensure_records_stores`; replicas and the CLI create none:

* ``cotal_records_<space>`` (:func:`records_bucket`): manager instances ``mgr.<owner>.<instanceId>``
  (:mod:`cotal_trio.core.managers`), service endpoint registrations ``svcep.<endpoint>``
  (:mod:`cotal_trio.core.service_endpoints`), lifecycle records ``lifecycle.<lifecycleUid>`` and consents
  ``consent.<jti>`` (generic bytes through :meth:`RecordsStore.put_record` /
  :meth:`RecordsStore.create_record` / :meth:`RecordsStore.get_record`).
* ``cotal_sessions_<space>`` (:func:`sessions_bucket`): chat sessions ``s.<sessionId>``
  (:mod:`cotal_trio.core.sessions`), each written with the TTL ``exp - now + 60``.

A live manager instance is a present row; retiring deletes it with a delete marker that expires
after ``MARKER_TTL_S``, so the key leaves nothing behind. The lane's store users reach the
stores with :func:`~cotal_trio.lane.service_users.store_permissions` (a full lane: create,
read, write) and :func:`~cotal_trio.lane.service_users.replica_store_permissions` (a callout
replica: reads only); ``cotal manager`` with :func:`manager_cli_permissions` (the manager rows
only). :func:`merge_permissions` combines allow-lists.

Every async function here is trio-flavoured and a checkpoint, bounded by the caller's deadline
(no timeout parameters). Errors: a missing bucket is :class:`StoresMissing` (an
:class:`~cotal_trio.core.errors.Unavailable` whose sentence names the fix), any other broker
failure :class:`~cotal_trio.core.errors.Unavailable`. Wall time comes in as ``now`` arguments.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TypeVar

from cotal_trio.core import wire
from cotal_trio.core.errors import CodecError, RefusalCode, Refused, Unavailable
from cotal_trio.core.managers import (
    MANAGER_KEY_PREFIX,
    ManagerInstance,
    manager_key,
    owner_prefix,
    parse_manager_row,
    render_manager_row,
)
from cotal_trio.core.service_endpoints import (
    ServiceEndpointRecord,
    parse_service_row,
    record_key,
    render_service_row,
)
from cotal_trio.core.sessions import (
    ChatSession,
    parse_session_row,
    render_session_row,
    session_key,
    session_row_ttl_s,
)
from cotal_trio.natsio import (
    Connection,
    KeyExists,
    StreamNotFound,
    WrongRevision,
    ensure_bucket,
    kv_create,
    kv_delete_expiring,
    kv_get,
    kv_keys,
    kv_put,
    kv_update,
)

__all__ = [
    "MARKER_TTL_S",
    "RecordsStore",
    "StoresMissing",
    "ensure_records_stores",
    "manager_cli_permissions",
    "merge_permissions",
    "records_bucket",
    "sessions_bucket",
]

log = logging.getLogger("cotal.records")

# A retired row leaves a delete marker that lives this long (whole seconds), then nothing.
MARKER_TTL_S = 1
# A retirement re-reads the row after a concurrent change at most this many times.
RETIRE_ATTEMPTS = 3

Permissions = dict[str, dict[str, list[str]]]
T = TypeVar("T")


# The names come from the wire layout (core/wire.py): ``cotal_records_<space>`` holds manager
# instances, lifecycle records and consents; ``cotal_sessions_<space>`` chat sessions.
records_bucket = wire.records_bucket
sessions_bucket = wire.sessions_bucket


class StoresMissing(Unavailable):
    """The space's records or sessions bucket does not exist; the message names the fix."""


async def ensure_records_stores(conn: Connection, space: str, *, replicas: int = 1) -> None:
    """Trio: create both stores of ``space`` (history 1, per-message TTLs) at ``replicas`` copies,
    or verify them and scale them up to it (issue 17 item 1; :mod:`cotal_trio.stores.replicas`).

    Idempotent; a full lane calls it once at start, holding the plane claim.

    Args:
        conn: a data-account connection allowed the buckets' stream info, create and update
            (the full lane's store user, :func:`~cotal_trio.lane.service_users.store_permissions`).

    Raises:
        ConfigError: a bucket exists with another shape (the sentence names the fix).
        NoPlacement: the broker cannot place ``replicas`` copies.
        Unavailable: the broker or JetStream did not answer, or refused.
    """
    for bucket in (records_bucket(space), sessions_bucket(space)):
        await ensure_bucket(conn, bucket, history=1, allow_msg_ttl=True, replicas=replicas)


def _kv_publish(bucket: str, prefix: str = "") -> str:
    return f"$KV.{bucket}.{prefix}>"


def _msg_get(bucket: str) -> str:
    return f"$JS.API.STREAM.MSG.GET.KV_{bucket}"


def manager_cli_permissions(space: str) -> Permissions:
    """Sync: ``cotal manager``'s user: the manager rows of the records store only.

    Writes and deletes on ``$KV.cotal_records_<space>.mgr.>``, reads (``STREAM.MSG.GET``) and
    key listings (``STREAM.INFO`` with a subjects filter) of that bucket.
    """
    bucket = records_bucket(space)
    return {
        "pub": {"allow": [_kv_publish(bucket, MANAGER_KEY_PREFIX), _msg_get(bucket), f"$JS.API.STREAM.INFO.KV_{bucket}"]},
        "sub": {"allow": ["_INBOX.>"]},
    }


def merge_permissions(*parts: Mapping[str, Mapping[str, list[str]]]) -> Permissions:
    """Sync: the union of ``{"pub"|"sub": {"allow"|"deny": [subjects]}}`` permissions, in order,
    duplicates dropped."""
    merged: dict[str, dict[str, list[str]]] = {}
    for part in parts:
        for direction, lists in part.items():
            for kind, subjects in lists.items():
                target = merged.setdefault(direction, {}).setdefault(kind, [])
                target.extend(s for s in subjects if s not in target)
    return merged


class RecordsStore:
    """The records and sessions stores of ``space`` over one data-account connection.

    Args:
        conn: a connection allowed what the caller does (the lane's store user, module
            docstring; :func:`manager_cli_permissions` for ``cotal manager``).
        space: the space.
    """

    def __init__(self, conn: Connection, space: str) -> None:
        self._conn = conn
        self.space = space
        self.records = records_bucket(space)
        self.sessions = sessions_bucket(space)

    # -- manager instances ---------------------------------------------------------------------

    async def register_manager(self, instance: ManagerInstance) -> int:
        """Trio: create ``mgr.<owner>.<instanceId>`` holding ``instance`` (create-only); its revision.

        Raises:
            Refused: CONFLICT, the instance id is already registered to the owner.
            StoresMissing: the records store does not exist.
            Unavailable: the broker did not answer.
        """
        with self._errors(self.records):
            try:
                return await kv_create(self._conn, self.records, instance.key, render_manager_row(instance))
            except KeyExists:
                raise Refused(
                    RefusalCode.CONFLICT,
                    f"manager instance {instance.instance_id} is already registered to owner {instance.owner}"
                    " - register with a new instance id, or retire it first with `cotal manager retire`",
                ) from None

    async def get_manager(self, owner: str, instance_id: str) -> ManagerInstance | None:
        """Trio: the live instance, or None (never registered, retired, or an unreadable row,
        which is logged).

        Raises:
            CodecError: ``owner`` or ``instance_id`` is malformed (check them before).
            StoresMissing: the records store does not exist.
            Unavailable: the broker did not answer.
        """
        key = manager_key(owner, instance_id)
        with self._errors(self.records):
            entry = await kv_get(self._conn, self.records, key)
        return None if entry is None else self._parsed(key, entry.value, parse_manager_row)

    async def list_managers(self, owner: str | None = None) -> list[ManagerInstance]:
        """Trio: the live instances of ``owner`` (every owner's when None), sorted by key.

        One listing, then one read per key; rows that cannot be parsed are skipped with a
        warning.

        Raises:
            CodecError: ``owner`` is malformed.
            StoresMissing: the records store does not exist.
            Unavailable: the broker did not answer.
        """
        prefix = MANAGER_KEY_PREFIX if owner is None else owner_prefix(owner)
        found: list[ManagerInstance] = []
        with self._errors(self.records):
            for key in await kv_keys(self._conn, self.records, prefix=prefix):
                entry = await kv_get(self._conn, self.records, key)
                if entry is not None and (row := self._parsed(key, entry.value, parse_manager_row)) is not None:
                    found.append(row)
        return found

    async def retire_manager(self, owner: str, instance_id: str) -> bool:
        """Trio: delete the instance's row; False when it was not live.

        The delete is a compare-and-set on the revision read, with a marker that expires after
        ``MARKER_TTL_S``.

        Raises:
            CodecError: ``owner`` or ``instance_id`` is malformed.
            StoresMissing: the records store does not exist.
            Unavailable: the broker did not answer, or the row kept changing.
        """
        return await self._retire(self.records, manager_key(owner, instance_id))

    # -- service endpoints -----------------------------------------------------------------------

    async def get_service_endpoint(self, endpoint: str) -> tuple[ServiceEndpointRecord, int] | None:
        """Trio: the live registration ``svcep.<endpoint>`` and its revision, or None (never
        registered, retired, or an unreadable row, which is logged).

        Raises:
            Refused: BAD_REQUEST for a name :func:`~cotal_trio.core.service_endpoints.record_key` refuses.
            StoresMissing: the records store does not exist.
            Unavailable: the broker did not answer.
        """
        key = record_key(endpoint)
        with self._errors(self.records):
            entry = await kv_get(self._conn, self.records, key)
        if entry is None or (record := self._parsed(key, entry.value, parse_service_row)) is None:
            return None
        return record, entry.revision

    async def register_service_endpoint(self, record: ServiceEndpointRecord, *, last_revision: int | None) -> int:
        """Trio: store ``record`` under ``svcep.<endpoint>``: create-only when ``last_revision`` is
        None, else a compare-and-set on it; the new revision.

        Raises:
            Refused: CONFLICT, the name was registered or changed since it was read (read again).
            StoresMissing: the records store does not exist.
            Unavailable: the broker did not answer.
        """
        value = render_service_row(record)
        with self._errors(self.records):
            try:
                if last_revision is None:
                    return await kv_create(self._conn, self.records, record.key, value)
                return await kv_update(self._conn, self.records, record.key, value, last_revision=last_revision)
            except (KeyExists, WrongRevision):
                raise Refused(
                    RefusalCode.CONFLICT,
                    f"service endpoint {record.endpoint} was registered or changed meanwhile - send the request again",
                ) from None

    async def retire_service_endpoint(self, endpoint: str, *, last_revision: int) -> None:
        """Trio: delete the registration ``svcep.<endpoint>`` still at ``last_revision`` (the one
        the retirement decided on), with a marker that expires after ``MARKER_TTL_S``.

        Raises:
            Refused: BAD_REQUEST for a malformed name; CONFLICT, the row changed since it was read.
            StoresMissing: the records store does not exist.
            Unavailable: the broker did not answer.
        """
        key = record_key(endpoint)
        with self._errors(self.records):
            try:
                await kv_delete_expiring(self._conn, self.records, key, last_revision=last_revision, ttl_s=MARKER_TTL_S)
            except WrongRevision:
                raise Refused(
                    RefusalCode.CONFLICT, f"service endpoint {endpoint} changed meanwhile - send the request again"
                ) from None

    # -- chat sessions -------------------------------------------------------------------------

    async def open_session(self, row: ChatSession, *, now: float) -> int:
        """Trio: create ``s.<sessionId>`` (create-only) with TTL ``exp - now + 60``; its revision.

        Args:
            now: wall time, unix seconds (the TTL is counted from it).

        Raises:
            Refused: CONFLICT, the session id is taken (mint another id).
            StoresMissing: the sessions store does not exist.
            Unavailable: the broker did not answer.
        """
        ttl_s = session_row_ttl_s(row, now=now)
        with self._errors(self.sessions):
            try:
                return await kv_create(self._conn, self.sessions, row.key, render_session_row(row), ttl_s=ttl_s)
            except KeyExists:
                raise Refused(
                    RefusalCode.CONFLICT,
                    f"chat session id {row.session_id} is already open - open the session again with a new id",
                ) from None

    async def get_session(self, session_id: str) -> ChatSession | None:
        """Trio: the stored session, or None (never opened, retired, dropped after its TTL, or an
        unreadable row, which is logged). A row past ``exp`` but inside its grace minute is
        returned: judge it with :func:`~cotal_trio.core.sessions.check_session_for`.

        Raises:
            CodecError: ``session_id`` is malformed.
            StoresMissing: the sessions store does not exist.
            Unavailable: the broker did not answer.
        """
        key = session_key(session_id)
        with self._errors(self.sessions):
            entry = await kv_get(self._conn, self.sessions, key)
        return None if entry is None else self._parsed(key, entry.value, parse_session_row)

    async def retire_session(self, session_id: str) -> bool:
        """Trio: delete the session's row; False when it was not there.

        Raises:
            CodecError: ``session_id`` is malformed.
            StoresMissing: the sessions store does not exist.
            Unavailable: the broker did not answer, or the row kept changing.
        """
        return await self._retire(self.sessions, session_key(session_id))

    # -- generic records -----------------------------------------------------------------------

    async def put_record(self, key: str, value: bytes, *, ttl_s: int | None = None) -> int:
        """Trio: store ``value`` under ``key`` in the records store, unconditionally; its revision.

        Args:
            ttl_s: the row expires after this many whole seconds (>= 1), or never.

        Raises:
            ValueError: an invalid key or ``ttl_s``.
            StoresMissing: the records store does not exist.
            Unavailable: the broker did not answer.
        """
        with self._errors(self.records):
            return await kv_put(self._conn, self.records, key, value, ttl_s=ttl_s)

    async def create_record(self, key: str, value: bytes, *, ttl_s: int | None = None) -> int:
        """Trio: as :meth:`put_record`, only if ``key`` has no live value; its revision.

        Raises:
            KeyExists: ``key`` holds a live value (:class:`cotal_trio.natsio.KeyExists`).
            ValueError: an invalid key or ``ttl_s``.
            StoresMissing: the records store does not exist.
            Unavailable: the broker did not answer.
        """
        with self._errors(self.records):
            return await kv_create(self._conn, self.records, key, value, ttl_s=ttl_s)

    async def get_record(self, key: str) -> bytes | None:
        """Trio: the live value of ``key`` in the records store, or None.

        Raises:
            ValueError: an invalid key.
            StoresMissing: the records store does not exist.
            Unavailable: the broker did not answer.
        """
        with self._errors(self.records):
            entry = await kv_get(self._conn, self.records, key)
        return None if entry is None else entry.value

    # -- helpers -------------------------------------------------------------------------------

    async def _retire(self, bucket: str, key: str) -> bool:
        with self._errors(bucket):
            for _ in range(RETIRE_ATTEMPTS):
                entry = await kv_get(self._conn, bucket, key)
                if entry is None:
                    return False
                try:
                    await kv_delete_expiring(self._conn, bucket, key, last_revision=entry.revision, ttl_s=MARKER_TTL_S)
                    return True
                except WrongRevision:
                    continue  # rewritten since we read it: read again
        raise Unavailable(f"{key} in {bucket} kept changing while it was retired - retire it again")

    def _parsed(self, key: str, value: bytes, parse: Callable[[bytes], T]) -> T | None:
        try:
            return parse(value)
        except CodecError as exc:
            log.warning("space %s: %s is unreadable and was skipped (%s)", self.space, key, exc)
            return None

    @contextmanager
    def _errors(self, bucket: str) -> Iterator[None]:
        """Re-raise natsio's missing-bucket :class:`Unavailable` as :class:`StoresMissing`."""
        try:
            yield
        except StreamNotFound as exc:  # BucketMissing too: a publish no stream took
            raise StoresMissing(
                f"space {self.space} has no store {bucket} - start the space's full auth service once:"
                " it creates the stores"
            ) from exc
