"""A lane's issuance rows: written before each mint, withdrawn unless minted, pruned (DESIGN.md 6, 8).

The row and its rules are :mod:`cotal_trio.core.issuance`; this module does the I/O, through a
small port (:class:`RowStore`: the space's auth bucket ``cotal_auth_<space>``), so the callout's
virtual-time tests run on an in-memory bucket.

Per request (an :class:`Issuance`, made by the callout responder before the request's deadline
scope):

1. :meth:`Issuance.write` creates ``natkey.<owner>.<actor>.<user nkey>`` create-only, with a per-message TTL that
   ends ``EXPIRY_TOLERANCE_S`` after the JWT's ``exp``. The bucket always allows such TTLs: the
   full service's plane keeper creates it with ``allow_msg_ttl`` and refuses a bucket without
   (:func:`~cotal_trio.natsio.ensure_bucket`). An existing row is a
   :class:`~cotal_trio.core.errors.Refused`, a failed write an :class:`IssuanceFailed`; the
   responder answers both with a signed denial. A create refused because the stream has no
   leader (an election after a lost node) is sent again until the caller's ``retry_until``.
2. The responder then checks authority again and answers, and calls :meth:`Issuance.keep` only
   when that answer is a mint.
3. A row sent but not kept (the deadline cancelled the request during the write or after it,
   the re-check denied, a bug) is withdrawn by :meth:`Issuance.settle`, shielded and bounded by
   ``WITHDRAW_S``, in a task of the responder's after the request's answer has been published: issue 4 item 1, "a
   request whose issuance row was not written by the deadline leaves no row behind", while the
   denial still goes out at the deadline. A create that was cancelled may still land, so the
   withdrawal first writes a delete marker that expects the key to hold no message. A stream
   stores one connection's publishes in the order they were sent: if our create was sent, it is
   stored first and the marker is refused, and the row is then read back and deleted only if it
   still holds exactly our bytes, by compare-and-set on its revision. (A read alone may be
   answered before the create is stored.) If the marker is stored, nothing of ours was sent, and
   a create expecting an empty key could not land after it. Markers carry TTLs, so the key ends
   up holding nothing.

The full service also prunes rows past their expiry at start and every ``PRUNE_EVERY_S``
(:func:`cotal_trio.lane.sweep.run_issuance_sweep`); replicas hold no sweep (spec "Callout replicas"), and rows carry
their own TTL. A sweep lists the keys, then reads only the rows whose expiry it does not know:
the lane notes each row it writes, and each row a sweep reads, in :class:`RowExpiries`, so a
busy lane's sweep is one listing, not one read per live row. Unknown rows (a replica's, or from
before a restart) are read at most ``PRUNE_READS_PER_S`` a second, so a sweep over many rows is
spread out instead of competing with the callout in one burst. Replicas write rows over their store user
(:func:`~cotal_trio.lane.service_users.replica_store_permissions`) and create no store, so
on a space whose full service never ran the write fails with :class:`IssuanceFailed` naming the
fix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import trio

from cotal_trio.core.errors import CodecError, RefusalCode, Refused, Unavailable
from cotal_trio.core.issuance import (
    EXPIRY_TOLERANCE_S,
    ISSUANCE_KEY_PREFIX,
    IssuanceRow,
    exists_reason,
    is_expired,
    issuance_key,
    parse_row,
    render_row,
    row_ttl_s,
    store_missing_reason,
    write_failed_reason,
)
from cotal_trio.core.plane import plane_bucket
from cotal_trio.natsio import (
    Connection,
    KeyExists,
    KvEntry,
    StoreUnreachable,
    StreamNotFound,
    WrongRevision,
    kv_create,
    kv_delete_expiring,
    kv_entries,
    kv_get,
    kv_keys,
)

__all__ = [
    "RETRY_GAP_S",
    "WITHDRAW_S",
    "AuthBucketMissing",
    "Issuance",
    "IssuanceFailed",
    "KvRowStore",
    "RowExpiries",
    "RowStore",
    "issuance_store",
    "prune_rows",
    "should_retry",
]

log = logging.getLogger("cotal.issuance")

# The shielded withdrawal of a row that must not stay gets this long (seconds). It runs after the
# request's answer, so it does not eat into the broker's budget.
WITHDRAW_S = 2.0
# A create refused with "no stream leader" is sent again no sooner than this after the last one
# was sent (seconds). Each refused create also waits natsio's STREAM.INFO probe (PROBE_S, 0.5 s
# when the stream has no leader), so the attempts come about that far apart.
RETRY_GAP_S = 0.1
# A pruned or withdrawn row leaves a delete marker that lives this long (whole seconds).
MARKER_TTL_S = 1
# A sweep reads rows it knows nothing of at most this many a second.
PRUNE_READS_PER_S = 200.0
# How many rows' expiries a lane remembers (about 100 bytes each).
EXPIRIES_CAPACITY = 65536


class RowExpiries:
    """The expiry (``exp``, unix seconds) of issuance rows this lane wrote or read, by key.

    Bounded at ``capacity`` keys, the oldest noted forgotten first; a forgotten row is read
    again by the next sweep. Sync, trio's thread only.
    """

    def __init__(self, capacity: int = EXPIRIES_CAPACITY) -> None:
        self._capacity = capacity
        self._exp: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._exp)

    def note(self, key: str, exp: int) -> None:
        """Remember that the row under ``key`` expires at ``exp``."""
        self._exp.pop(key, None)
        if len(self._exp) >= self._capacity:
            del self._exp[next(iter(self._exp))]
        self._exp[key] = exp

    def get(self, key: str) -> int | None:
        """The remembered ``exp`` of ``key``, or None."""
        return self._exp.get(key)

    def forget(self, key: str) -> None:
        """Drop ``key`` (its row is gone, or being withdrawn)."""
        self._exp.pop(key, None)

    def keep_only(self, keys: set[str]) -> None:
        """Drop every key not in ``keys`` (rows the server has expired)."""
        for key in [k for k in self._exp if k not in keys]:
            del self._exp[key]


class AuthBucketMissing(Unavailable):
    """The auth bucket does not exist (raised by a :class:`RowStore`).

    Not :class:`cotal_trio.natsio.BucketMissing` (a ``StreamNotFound`` from a publish no stream
    took): a RowStore re-raises that, and JetStream's 10059, as this one (:func:`_as_missing`), so
    issuance catches one class whatever the broker answered."""


class IssuanceFailed(Unavailable):
    """The issuance row could not be written; the message is the denial reason (names the fix)."""


class RowStore(Protocol):
    """The auth bucket as issuance uses it: JetStream KV semantics, one connection's writes in
    the order they were sent. Every method is a trio checkpoint.

    Errors: :class:`AuthBucketMissing` when the bucket does not exist, else
    :class:`~cotal_trio.core.errors.Unavailable` when the broker does not answer.
    """

    async def create(self, key: str, value: bytes, *, ttl_s: int) -> int:
        """Store ``value`` if ``key`` has no live value; the revision. Raises KeyExists."""
        ...

    async def get(self, key: str) -> KvEntry | None:
        """The live value of ``key``, or None."""
        ...

    async def delete(self, key: str, *, last_revision: int, ttl_s: int) -> int:
        """A delete marker living ``ttl_s`` if ``key``'s last message is ``last_revision``
        (0: no message at all). Raises WrongRevision."""
        ...

    async def keys(self, prefix: str) -> list[str]:
        """The keys under ``prefix`` that hold any message (live or marker)."""
        ...

    async def entries(self, pattern: str) -> list[KvEntry]:
        """The live values whose keys match ``pattern`` (NATS wildcards), found by one
        subject-filtered listing: the cost is the matching keys, not the bucket's."""
        ...


@dataclass(frozen=True, slots=True)
class KvRowStore:
    """:class:`RowStore` over a lane's store connection (natsio KV)."""

    conn: Connection
    bucket: str

    async def create(self, key: str, value: bytes, *, ttl_s: int) -> int:
        with _bucket_errors(self.bucket):
            return await kv_create(self.conn, self.bucket, key, value, ttl_s=ttl_s)

    async def get(self, key: str) -> KvEntry | None:
        with _bucket_errors(self.bucket):
            return await kv_get(self.conn, self.bucket, key)

    async def delete(self, key: str, *, last_revision: int, ttl_s: int) -> int:
        with _bucket_errors(self.bucket):
            return await kv_delete_expiring(self.conn, self.bucket, key, last_revision=last_revision, ttl_s=ttl_s)

    async def keys(self, prefix: str) -> list[str]:
        with _bucket_errors(self.bucket):
            return await kv_keys(self.conn, self.bucket, prefix=prefix)

    async def entries(self, pattern: str) -> list[KvEntry]:
        with _bucket_errors(self.bucket):
            return await kv_entries(self.conn, self.bucket, pattern)


@contextmanager
def _bucket_errors(bucket: str) -> Iterator[None]:
    """Re-raise natsio's missing-bucket :class:`Unavailable` as :class:`AuthBucketMissing`."""
    try:
        yield
    except StreamNotFound as exc:  # BucketMissing too: a publish no stream took
        raise AuthBucketMissing(f"bucket {bucket} does not exist ({exc})") from exc


def issuance_store(conn: Connection, space: str) -> KvRowStore:
    """The issuance :class:`RowStore` of ``space`` over a store connection: ``cotal_auth_<space>``."""
    return KvRowStore(conn, plane_bucket(space))


@dataclass(frozen=True, slots=True)
class _Sent:
    key: str
    value: bytes
    ttl_s: int


def should_retry(sent_at: float, now: float, retry_until: float) -> bool:
    """Sync: whether a create refused for want of a stream leader is sent again (see
    :meth:`Issuance.write`): the next one, ``RETRY_GAP_S`` after the last was sent at
    ``sent_at``, still leaves before ``retry_until``. All trio times, seconds."""
    return max(now, sent_at + RETRY_GAP_S) < retry_until


class Issuance:
    """One callout request's issuance row; made by :func:`open_issuance`.

    Args:
        store: the space's auth bucket.
        space: the space (for the denial reasons).
        expiries: where a kept row's expiry is noted for the sweep (the lane's), or None.
    """

    def __init__(self, store: RowStore, space: str, *, expiries: RowExpiries | None = None) -> None:
        self._store, self._space, self._expiries = store, space, expiries
        self._sent: _Sent | None = None
        self._exp = 0
        self._kept = False

    async def write(self, user_nkey: str, row: IssuanceRow, *, now: float, retry_until: float | None = None) -> None:
        """Trio: create ``natkey.<owner>.<actor>.<user_nkey>`` (the row's principal) holding ``row``,
        create-only (a checkpoint).

        Call it at most once. Cancellation: the row may still land; :meth:`settle` withdraws it
        unless :meth:`keep` is called.

        A create refused because the bucket's stream has no leader (``StoreUnreachable``: a
        JetStream election after a node was lost, issue 17) is sent again, ``RETRY_GAP_S`` apart
        at least, until ``retry_until``: no stream took it (the broker answered "no
        responders"), so a second create cannot find our own row, and a connect that arrives
        in the last second or two of an election is minted once the new leader answers instead
        of being denied. Attempts are cut at ``retry_until`` (the write then fails as the last
        attempt did); any other failure is not retried. The callout passes a limit inside the
        request's deadline (spec "Callout deadlines"), so a retried row still gets a signed answer
        in time.

        Args:
            user_nkey: the broker's user key for this connect.
            row: the row (:func:`~cotal_trio.core.issuance.issuance_row`).
            now: wall time, unix seconds (the TTL is counted from it).
            retry_until: trio time (seconds) until which a leaderless refusal is retried, or None
                to try once.

        Raises:
            Refused: BAD_REQUEST, the row already exists (:func:`~cotal_trio.core.issuance.exists_reason`).
            IssuanceFailed: the bucket is missing or the write failed (the reason names the fix).
            CodecError: ``user_nkey`` is not a user key.
        """
        key, value = issuance_key(row.owner, row.actor, user_nkey), render_row(row)
        ttl_s = row_ttl_s(row, now=now)
        self._exp = row.exp
        self._sent = _Sent(key, value, ttl_s)  # before sending: a cancelled create may still land
        try:
            await self._create_retrying(key, value, ttl_s, retry_until)
        except KeyExists:
            self._sent = None  # the server refused ours; the row there is not ours to withdraw
            raise Refused(RefusalCode.BAD_REQUEST, exists_reason(user_nkey)) from None
        except AuthBucketMissing as exc:
            self._sent = None  # no stream took it
            raise IssuanceFailed(store_missing_reason(self._space)) from exc
        except StoreUnreachable as exc:
            self._sent = None  # every create was answered "no responders": no stream took one
            raise IssuanceFailed(write_failed_reason(self._space, str(exc))) from exc
        except Unavailable as exc:  # a create cut at the limit may still land: settle withdraws it
            raise IssuanceFailed(write_failed_reason(self._space, str(exc))) from exc

    async def _create_retrying(self, key: str, value: bytes, ttl_s: int, retry_until: float | None) -> None:
        """The create, sent again after each leaderless refusal until ``retry_until`` (see
        :meth:`write`). Raises the last refusal (``StoreUnreachable``: nothing landed), or
        ``Unavailable`` when the last create was cut at the limit (it may land)."""
        sent_at = trio.current_time()
        try:
            await self._store.create(key, value, ttl_s=ttl_s)
            return
        except StoreUnreachable as exc:
            last: StoreUnreachable = exc
        while retry_until is not None and should_retry(sent_at, trio.current_time(), retry_until):
            await trio.sleep_until(sent_at + RETRY_GAP_S)
            with trio.move_on_at(retry_until) as attempt:
                sent_at = trio.current_time()
                try:
                    await self._store.create(key, value, ttl_s=ttl_s)
                    return
                except StoreUnreachable as exc:
                    last = exc
            if attempt.cancelled_caught:  # cut in flight: this create may yet land
                raise Unavailable(f"{last} (the create sent again was not answered by the limit)") from last
        raise last

    def keep(self) -> None:
        """Sync: the request was answered with a mint; its row stays (until its TTL)."""
        self._kept = True
        if self._sent is not None and self._expiries is not None:
            self._expiries.note(self._sent.key, self._exp)

    @property
    def unsettled(self) -> bool:
        """Sync: a row was sent and not kept, so :meth:`settle` has a withdrawal to make."""
        return self._sent is not None and not self._kept

    async def settle(self) -> None:
        """Trio: withdraw the row unless kept (module docstring, step 3); idempotent.

        Shielded and bounded by ``WITHDRAW_S``; a store failure is logged, never raised, so it
        may run in a task of its own after the answer went out (the callout's withdrawals).
        """
        sent, self._sent = self._sent, None
        if sent is None or self._kept:
            return
        if self._expiries is not None:
            # The key ends up holding a marker that lives as long as the row would have (or
            # nothing of ours): the sweep need not read it before then.
            self._expiries.note(sent.key, self._exp)
        with trio.move_on_after(WITHDRAW_S, shield=True) as scope:
            try:
                await _withdraw(self._store, sent)
            except Unavailable as exc:
                log.warning("space %s: issuance row %s not withdrawn (%s); it expires on its TTL", self._space, sent.key, exc)
        if scope.cancelled_caught:
            log.warning(
                "space %s: issuance row %s not withdrawn within %g s; it expires on its TTL",
                self._space, sent.key, WITHDRAW_S,
            )


async def _withdraw(store: RowStore, sent: _Sent) -> None:
    """Leave no row of ours under ``sent.key`` (module docstring, step 3).

    Raises:
        Unavailable: the store did not answer.
    """
    try:
        # Lands only if the key holds no message; our create, if it is still on its way, expects
        # the same and so is refused after it. The marker lives as long as the row would have.
        await store.delete(sent.key, last_revision=0, ttl_s=sent.ttl_s)
        return
    except WrongRevision:
        pass  # something landed first: ours, or not
    entry = await store.get(sent.key)
    if entry is None or entry.value != sent.value:
        return  # gone already, or another request's row
    try:
        await store.delete(sent.key, last_revision=entry.revision, ttl_s=MARKER_TTL_S)
    except WrongRevision:
        pass  # changed since we read it: no longer ours


async def prune_rows(store: RowStore, *, now: float, expiries: RowExpiries | None = None) -> int:
    """Trio: delete the issuance rows past their expiry at ``now`` (unix seconds); how many.

    Lists ``natkey.>``, so rows in both key forms are pruned (:mod:`cotal_trio.core.issuance`,
    Key). Rows whose expiry ``expiries`` knows and which are not yet due are not read. Each other row
    is read (at most ``PRUNE_READS_PER_S`` reads a second) and, when past its expiry, deleted
    by compare-and-set on the revision read, with a marker that expires after
    ``MARKER_TTL_S``. A row that cannot be parsed is left alone (counted in one warning).

    Raises:
        AuthBucketMissing: the bucket does not exist.
        Unavailable: the store did not answer.
    """
    pruned = unreadable = 0
    keys = await store.keys(ISSUANCE_KEY_PREFIX)
    if expiries is not None:
        expiries.keep_only(set(keys))
    pace = trio.current_time()
    for key in keys:
        known = None if expiries is None else expiries.get(key)
        if known is not None and now < known + EXPIRY_TOLERANCE_S:
            continue
        await trio.sleep_until(pace)
        pace = max(pace, trio.current_time()) + 1 / PRUNE_READS_PER_S
        entry = await store.get(key)
        if entry is None:
            continue  # a marker
        try:
            row = parse_row(entry.value)
        except CodecError:
            unreadable += 1
            continue
        if not is_expired(row, now=now):
            if expiries is not None:
                expiries.note(key, row.exp)
            continue
        try:
            await store.delete(key, last_revision=entry.revision, ttl_s=MARKER_TTL_S)
            pruned += 1
        except WrongRevision:
            pass  # rewritten since we read it
        if expiries is not None:
            expiries.forget(key)
    if unreadable:
        log.warning("issuance prune: %d unreadable natkey rows left alone", unreadable)
    return pruned
