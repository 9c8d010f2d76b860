"""The I/O of the lifecycle doors: lifecycle records, row files, issuance rows (spec "Host-only routes").

The decisions are :mod:`cotal_trio.core.lifecycle`; the HTTP edge is
:mod:`cotal_trio.http.lifecycle_doors`. A retirement (:func:`retire_lifecycle`) runs, in order:

1. **the barrier**: write the retired record ``lifecycle.<lifecycleUid>`` in the records store
   (TTL 960 s). From here on a failure has no ``not-executed`` outcome;
2. withdraw the space's issuance rows ``natkey.*`` (``cotal_auth_<space>``) minted for that
   lifecycle (:func:`withdraw_issuance`), by compare-and-set on the revision read;
3. remove the principal's row file of that kind, only if it still holds that lifecycle UID
   (:func:`remove_row_if_holds`, on a worker thread): a row re-granted meanwhile stays;
4. withdraw again, reading only the issuance rows that appeared since step 2's listing.

Why this order. The callout writes a connect's issuance row first and checks the ledger row
after it, minting only while the row is there. So once step 3 has removed the row, no connect
of this lifecycle mints any more, and every one that minted before has its issuance row written
before step 4 lists the keys: step 4 leaves none behind. Step 2 comes before the removal so a
retirement that fails in steps 2 or 3 leaves the row in place, and the same call again (its
decision sees the row still holding the lifecycle) finishes the whole retirement. Only a failure
in step 4 leaves a remainder: rows minted between steps 2 and 3, which end on their own TTL
(at most the 900 s bearer cap plus 5 s). Issuance keys are create-only (a fresh user nkey per
connect), so a key step 2 read and found another lifecycle's needs no second read.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol

import trio

from ..core.errors import CodecError, Unavailable
from ..core.issuance import ISSUANCE_KEY_PREFIX, parse_row
from ..core.ledger import LedgerKind
from ..core.ledger import parse_row as parse_ledger_row
from ..core.lifecycle import (
    LifecycleRecord,
    LifecycleState,
    LifecycleTarget,
    holds_lifecycle,
    lifecycle_key,
    parse_record,
    record_ttl_s,
    render_record,
)
from ..natsio import WrongRevision
from ..state import SpacePaths, row_path
from .issuance import MARKER_TTL_S, RowStore

__all__ = [
    "RETIRE_S",
    "LifecycleRecords",
    "activate_lifecycle",
    "read_record",
    "remove_row_if_holds",
    "retire_lifecycle",
    "withdraw_issuance",
]

log = logging.getLogger("cotal.lifecycle")

# A retirement, once its barrier began, is shielded from cancellation for at most this long
# (seconds): a caller that hangs up does not leave it half done.
RETIRE_S = 30.0
# Hidden, with the temporary-file suffix: ledger folder scans skip it (state.files.TEMP_SUFFIX).
_HELD_SUFFIX = ".retiring.tmp"


class LifecycleRecords(Protocol):
    """The part of the records store (``lanes.records.RecordsStore``) the doors use; trio, each
    call a checkpoint, :class:`~cotal_trio.core.errors.Unavailable` when the store does not answer."""

    async def put_record(self, key: str, value: bytes, *, ttl_s: int | None) -> object:
        """Store ``value`` under ``key`` (replacing it), living ``ttl_s`` seconds (None: no TTL)."""
        ...

    async def get_record(self, key: str) -> bytes | None:
        """The live value under ``key``, or None."""
        ...


async def read_record(records: LifecycleRecords, lifecycle_uid: str) -> LifecycleRecord | None:
    """Trio: the lifecycle's record, or None.

    Raises:
        Unavailable: the store did not answer, or the record is corrupt (the store's fault, named).
    """
    key = lifecycle_key(lifecycle_uid)
    data = await records.get_record(key)
    if data is None:
        return None
    try:
        return parse_record(data)
    except CodecError as exc:
        raise Unavailable(f"the records store holds a corrupt {key} ({exc})") from exc


async def _write_record(records: LifecycleRecords, record: LifecycleRecord) -> None:
    await records.put_record(lifecycle_key(record.lifecycle_uid), render_record(record), ttl_s=record_ttl_s(record))


async def activate_lifecycle(records: LifecycleRecords, target: LifecycleTarget, *, now: float) -> LifecycleRecord:
    """Trio: write ``target``'s active managed record dated ``now`` (unix seconds); the record.

    Raises:
        Unavailable: the store did not answer (the record may or may not have landed).
    """
    record = LifecycleRecord.of(target, LedgerKind.MANAGED, LifecycleState.ACTIVE, now=now)
    await _write_record(records, record)
    return record


def remove_row_if_holds(paths: SpacePaths, kind: LedgerKind, target: LifecycleTarget) -> bool:
    """Blocking: remove the principal's row file of ``kind`` if it holds ``target``'s lifecycle.

    The file is first renamed aside (atomic), so a row written meanwhile is never the one read
    and removed; a file that holds another lifecycle (or is corrupt) is linked back, unless a
    newer row took its name in between. Call through ``trio.to_thread.run_sync``.

    Returns:
        True when this call removed the row; False when there was none, or it was not that
        lifecycle's.

    Raises:
        OSError: the folder could not be changed.
    """
    path = row_path(paths, kind, target.owner, target.actor)
    held = path.with_name(f".{path.name}.{target.lifecycle_uid}{_HELD_SUFFIX}")
    try:
        os.rename(path, held)
    except FileNotFoundError:
        return False
    ours = False
    try:
        row = parse_ledger_row(held.read_bytes(), kind=kind, owner=target.owner, actor=target.actor)
        ours = row.lifecycle_uid == target.lifecycle_uid
    except CodecError:
        pass
    finally:  # whatever failed, a row that is not ours goes back: a grant is never lost here
        if not ours:
            _put_back(held, path)
    if ours:
        os.unlink(held)
    return ours


def _put_back(held: Path, path: Path) -> None:
    """Blocking: return the renamed-aside row ``held`` to ``path`` unless a newer row took it."""
    try:
        os.link(held, path)
    except FileExistsError:
        os.unlink(held)  # a newer row was written meanwhile: it stands
        return
    except OSError:  # no hard links here: a plain rename, the newer row check done just before
        if not path.exists():
            os.rename(held, path)
            return
        os.unlink(held)
        return
    os.unlink(held)


async def withdraw_issuance(
    store: RowStore, target: LifecycleTarget, *, seen: frozenset[str] = frozenset()
) -> tuple[int, frozenset[str]]:
    """Trio: delete every issuance row minted for ``target``'s lifecycle.

    Lists ``natkey.*``, reads each row whose key is not in ``seen``, and deletes the matching
    ones by compare-and-set on the revision read, leaving a marker of ``MARKER_TTL_S``.
    Unreadable rows are left alone; a row changed since it was read (pruned, withdrawn) is not
    counted.

    Args:
        seen: keys an earlier pass already handled (issuance keys are create-only).

    Returns:
        ``(rows deleted, keys listed)``; pass the keys as ``seen`` to a later pass.

    Raises:
        Unavailable: the bucket is missing or the store did not answer.
    """
    withdrawn = 0
    keys = await store.keys(ISSUANCE_KEY_PREFIX)
    for key in keys:
        if key in seen:
            continue
        entry = await store.get(key)
        if entry is None:
            continue  # a marker
        try:
            row = parse_row(entry.value)
        except CodecError:
            continue
        if not holds_lifecycle(row, target):
            continue
        try:
            await store.delete(key, last_revision=entry.revision, ttl_s=MARKER_TTL_S)
        except WrongRevision:
            continue
        withdrawn += 1
    return withdrawn, frozenset(keys)


async def retire_lifecycle(
    target: LifecycleTarget, *, kind: LedgerKind, records: LifecycleRecords, issuance: RowStore,
    paths: SpacePaths, now: float,
) -> int:  # fmt: skip
    """Trio: retire ``target`` past the barrier (module docstring, steps 1-4); the number of
    issuance rows withdrawn.

    Shielded from cancellation and bounded by :data:`RETIRE_S`: once the barrier began it runs
    to the end or fails.

    Args:
        kind: the ledger kind whose row carries the lifecycle (its folder; the record's ``kind``).
        now: wall time, unix seconds (the record's ``at``).

    Raises:
        Unavailable: a step failed or the bound ran out; the retirement's outcome is unknown
            (calling again completes it).
    """
    with trio.move_on_after(RETIRE_S, shield=True) as scope:
        await _write_record(records, LifecycleRecord.of(target, kind, LifecycleState.RETIRED, now=now))
        withdrawn, seen = await withdraw_issuance(issuance, target)
        try:
            removed = await trio.to_thread.run_sync(remove_row_if_holds, paths, kind, target)
        except OSError as exc:
            raise Unavailable(f"the {kind.value} row file of {target.principal} could not be removed ({exc})") from exc
        late, _ = await withdraw_issuance(issuance, target, seen=seen)
        withdrawn += late
    if scope.cancelled_caught:
        raise Unavailable(f"retiring lifecycle {target.lifecycle_uid} took longer than {RETIRE_S:g} s")
    log.info(
        "space %s: retired %s lifecycle %s of %s (row %s, %d issuance rows withdrawn)", paths.space, kind.value,
        target.lifecycle_uid, target.principal, "removed" if removed else "already gone", withdrawn,
    )
    return withdrawn
