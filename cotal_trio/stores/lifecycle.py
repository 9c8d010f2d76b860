"""The I/O of the lifecycle doors: lifecycle records, row files, issuance rows (spec "Host-only routes").

The decisions are :mod:`cotal_trio.core.lifecycle`; the HTTP edge is
:mod:`cotal_trio.http.lifecycle_doors`. A retirement (:func:`retire_lifecycle`) runs, in order:

1. **the barrier**: write the retired record ``lifecycle.<lifecycleUid>`` in the records store
   (TTL 960 s). From here on a failure has no ``not-executed`` outcome;
2. **the refusal**: remove the principal's row file of that kind, only if it still holds that
   lifecycle UID (:func:`remove_row_if_holds`, on a worker thread): a row re-granted meanwhile
   stays. From here on the exchange and the callout refuse the lifecycle (both read the row
   fresh), whatever happens next;
3. withdraw that lifecycle's issuance rows in ``cotal_auth_<space>`` (:func:`withdraw_issuance`),
   by compare-and-set on the revision read. The rows are keyed by principal
   (``natkey.<owner>.<actor>.<user nkey>``, :mod:`cotal_trio.core.issuance`), so one
   subject-filtered listing finds them: the step costs what the principal has, not what the
   space has (issue 15 item 1).

Why this order. The refusal must not wait on the withdrawal: the issue's run had a withdrawal
over 39,000 rows run out of the 30 s bound before the row was removed, so the revoked actor kept
connecting and the exchange kept minting its bearers. And one withdrawal after the removal
leaves no minted row behind: the callout writes a connect's issuance row (and awaits its ack)
before it checks the ledger row again, minting only while the row is there, so every connect
that minted had its row stored before step 2, hence before step 3 lists. A failure in steps 1
or 2 leaves the row, and the same call again (its decision sees the row still holding the
lifecycle) finishes the retirement. A failure in step 3 leaves the lifecycle refused with some
of its issuance rows in place; they end on their own TTL (at most the 900 s bearer cap plus
5 s): a partial retirement (:class:`WithdrawalUnfinished`), which the door answers 202 with the
rows left, not as an unknown outcome. The row's removal runs in a bounded worker thread
(:data:`ROW_REMOVE_S`); a removal abandoned or cut short after its rename leaves the row
renamed aside, and :func:`finish_held_rows`, run by the door before it reads the row, finishes
it at the next call retiring that lifecycle.

Rows in the upstream form ``natkey.<user nkey>`` (written before this key shape, or by a replica
not yet upgraded) are found by a second filtered listing, ``natkey.*``, which matches only
that form: a fallback, not a migration. After an upgrade it shrinks to nothing within those
rows' TTL, and the prune sweep lists both forms.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import trio

from cotal_trio.core.errors import CodecError, Unavailable
from cotal_trio.core.exchange import HUMAN_TTL_DEFAULT_S
from cotal_trio.core.issuance import EXPIRY_TOLERANCE_S, LEGACY_ROWS, parse_row, principal_rows
from cotal_trio.core.ledger import LedgerKind
from cotal_trio.core.ledger import parse_row as parse_ledger_row
from cotal_trio.core.lifecycle import (
    LifecycleRecord,
    LifecycleState,
    LifecycleTarget,
    holds_lifecycle,
    lifecycle_key,
    parse_record,
    record_ttl_s,
    render_record,
)
from cotal_trio.natsio import KvEntry, WrongRevision
from cotal_trio.state import SpacePaths, row_path
from cotal_trio.state.ledger_threads import BlockingCalls
from cotal_trio.stores.issuance import MARKER_TTL_S, RowStore

__all__ = [
    "LEFT_ROWS_EXPIRE_S",
    "PARTIAL",
    "RETIRE_S",
    "ROW_REMOVE_S",
    "LifecycleRecords",
    "WithdrawalUnfinished",
    "activate_lifecycle",
    "finish_held_rows",
    "read_record",
    "remove_row_if_holds",
    "retire_lifecycle",
    "withdraw_issuance",
]

log = logging.getLogger("cotal.lifecycle")

# A retirement, once its barrier began, is shielded from cancellation for at most this long
# (seconds): a caller that hangs up does not leave it half done.
RETIRE_S = 30.0
# The row file's removal (a rename, a read, an unlink) is abandoned after this long (seconds): a
# hung mount answers an unknown outcome then instead of holding the shielded section.
ROW_REMOVE_S = 5.0
# An issuance row left by an unfinished withdrawal ends on its TTL within this long (seconds):
# the longest bearer (900 s) plus the expiry tolerance (5 s).
LEFT_ROWS_EXPIRE_S = HUMAN_TTL_DEFAULT_S + EXPIRY_TOLERANCE_S
# The ``withdrawn`` of a partial retirement's answer (in place of the count).
PARTIAL = "partial"
# The withdrawal keeps at most this many deletes in flight (they are on distinct keys).
DELETES_IN_FLIGHT = 32
# Hidden, with the temporary-file suffix: ledger folder scans skip it (state.files.TEMP_SUFFIX).
_HELD_SUFFIX = ".retiring.tmp"


class LifecycleRecords(Protocol):
    """The part of the records store (``stores.records.RecordsStore``) the doors use; trio, each
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
    newer row took its name in between. Call through a bounded worker thread
    (:meth:`~cotal_trio.state.ledger_threads.BlockingCalls.run_within`); what an abandoned call
    leaves aside, :func:`finish_held_rows` finishes.

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


def finish_held_rows(paths: SpacePaths, kind: LedgerKind, target: LifecycleTarget) -> bool:
    """Blocking: finish what an earlier removal for ``target``'s lifecycle left renamed aside.

    A removal abandoned at :data:`ROW_REMOVE_S` normally finishes in its thread; one cut short
    (the process stopped, an unlink failed) leaves ``.<row>.<lifecycleUid>.retiring.tmp``, which
    ledger reads skip, so the principal reads as having no row. It is finished as the removal
    would have: a file holding that lifecycle (whose barrier had been written) is removed,
    anything else (a re-grant, a corrupt file) goes back unless a newer row took its name. One
    name is checked, not the folder listed, so a retry costs the same in any ledger. Call it
    before reading the row, through a bounded worker thread.

    Returns:
        True when a held row of ``target``'s lifecycle was removed here: that retirement had got
        past its step 2, and must still withdraw.

    Raises:
        OSError: the folder could not be changed.
    """
    path = row_path(paths, kind, target.owner, target.actor)
    held = path.with_name(f".{path.name}.{target.lifecycle_uid}{_HELD_SUFFIX}")
    try:
        row = parse_ledger_row(held.read_bytes(), kind=kind, owner=target.owner, actor=target.actor)
        ours = row.lifecycle_uid == target.lifecycle_uid
    except FileNotFoundError:
        return False  # nothing held (or its own removal, still running in its thread, just finished)
    except CodecError:
        ours = False
    try:
        if ours:
            os.unlink(held)
        else:
            _put_back(held, path)
    except FileNotFoundError:
        return False
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


@dataclass(slots=True)
class _Progress:
    """How far a withdrawal got: rows of the lifecycle listed (None until listed), deleted, and
    changed under it (pruned or withdrawn by someone else, so not left either)."""

    listed: int | None = None
    withdrawn: int = 0
    changed: int = 0

    def unfinished(self, target: LifecycleTarget, detail: str) -> WithdrawalUnfinished:
        left = None if self.listed is None else self.listed - self.withdrawn - self.changed
        return WithdrawalUnfinished(target, detail, withdrawn=self.withdrawn, left=left)


async def withdraw_issuance(store: RowStore, target: LifecycleTarget, *, progress: _Progress | None = None) -> int:
    """Trio: delete every issuance row minted for ``target``'s lifecycle; how many.

    Reads the principal's rows with one filtered listing (``natkey.<owner>.<actor>.>``) and the
    rows in the upstream form with another (``natkey.*``, module docstring), each then read once
    (:meth:`~cotal_trio.stores.issuance.RowStore.entries`); the rows of that lifecycle are deleted
    by compare-and-set on the revision read, leaving a marker of ``MARKER_TTL_S``, up to
    ``DELETES_IN_FLIGHT`` at a time. So the store requests are two listings plus one read per
    row of the principal (and per legacy row), plus one delete per row withdrawn: nothing per row
    of anyone else. Unreadable rows are left alone; a row changed since it was read (pruned,
    withdrawn) is not counted.

    ``progress`` (internal) is updated as it goes, so a caller whose bound ran out knows the counts.

    Raises:
        Unavailable: the bucket is missing or the store did not answer.
    """
    progress = progress if progress is not None else _Progress()
    entries = [
        *await store.entries(principal_rows(target.owner, target.actor)),
        *await store.entries(LEGACY_ROWS),
    ]
    ours = [entry for entry in entries if _holds(entry, target)]
    progress.listed = len(ours)
    failed: list[Unavailable] = []
    todo = iter(ours)

    async def deleter(scope: trio.CancelScope) -> None:
        for entry in todo:  # the deleters share one iterator: each row is deleted once
            try:
                await store.delete(entry.key, last_revision=entry.revision, ttl_s=MARKER_TTL_S)
            except WrongRevision:
                progress.changed += 1
                continue
            except Unavailable as exc:
                failed.append(exc)
                scope.cancel()
                return
            progress.withdrawn += 1

    async with trio.open_nursery() as nursery:
        for _ in range(min(DELETES_IN_FLIGHT, len(ours))):
            nursery.start_soon(deleter, nursery.cancel_scope)
    if failed:
        raise failed[0]
    return progress.withdrawn


def _holds(entry: KvEntry, target: LifecycleTarget) -> bool:
    try:
        return holds_lifecycle(parse_row(entry.value), target)
    except CodecError:
        return False  # not a row of ours to judge; the sweep counts it


class WithdrawalUnfinished(Unavailable):
    """Steps 1 and 2 of a retirement ran but step 3 did not finish: the lifecycle is retired and
    refused (the row is gone), and some of its issuance rows may be left, ending on their TTL
    within :data:`LEFT_ROWS_EXPIRE_S` (docs/host-doors.md, the 202 answer).

    Attributes:
        target: the lifecycle retired.
        withdrawn: issuance rows deleted before the withdrawal stopped.
        left: that lifecycle's rows listed and not deleted, or None when the listing itself did
            not answer (how many is unknown).
    """

    def __init__(self, target: LifecycleTarget, detail: str, *, withdrawn: int, left: int | None) -> None:
        super().__init__(
            f"lifecycle {target.lifecycle_uid} of {target.principal} is retired and refused, but its issuance rows"
            f" were not all withdrawn ({detail}); those left end on their TTL within {LEFT_ROWS_EXPIRE_S} s"
        )
        self.target, self.withdrawn, self.left = target, withdrawn, left

    def answer(self) -> dict[str, object]:
        """The retire doors' 202 body: ``{"outcome": "retired", owner, actor, lifecycleUid,
        "withdrawn": "partial", "withdrawnRows": n, "rowsLeft": n | None, "rowsExpireWithinS": 905}``."""
        return {
            **self.target.answer("retired"), "withdrawn": PARTIAL, "withdrawnRows": self.withdrawn,
            "rowsLeft": self.left, "rowsExpireWithinS": LEFT_ROWS_EXPIRE_S,
        }  # fmt: skip


async def retire_lifecycle(
    target: LifecycleTarget, *, kind: LedgerKind, records: LifecycleRecords, issuance: RowStore,
    paths: SpacePaths, now: float, threads: BlockingCalls | None = None,
) -> int:  # fmt: skip
    """Trio: retire ``target`` past the barrier (module docstring, steps 1-3); the number of
    issuance rows withdrawn.

    Shielded from cancellation and bounded by :data:`RETIRE_S`: once the barrier began it runs
    to the end or fails. The row's removal runs in a worker thread of ``threads`` abandoned at
    :data:`ROW_REMOVE_S` (a hung mount answers then, never holds the shielded section); what an
    abandoned removal leaves aside, :func:`finish_held_rows` finishes at the next call. The row
    is removed before the withdrawal, so a withdrawal that fails or runs out of time still
    leaves the lifecycle refused at the next exchange and connect.

    Args:
        kind: the ledger kind whose row carries the lifecycle (its folder; the record's ``kind``).
        now: wall time, unix seconds (the record's ``at``).
        threads: the worker threads the removal runs in (the doors' own); None: a fresh one-slot pool.

    Raises:
        WithdrawalUnfinished: the row is removed (the lifecycle refused) but the withdrawal
            failed or ran out of the bound; its counts say what is left.
        Unavailable: the record could not be written, the row file could not be removed, or the
            removal did not answer within :data:`ROW_REMOVE_S` (an unknown outcome: the rename
            may still land); the same call again completes the retirement.
    """
    calls = threads or BlockingCalls(max_threads=1)
    removing = (
        f"removing the {kind.value} row file of {target.principal} did not answer within {ROW_REMOVE_S:g} s"
        " (a stalled disk?) - the outcome is unknown; call again"
    )
    removed = refused = False
    progress = _Progress()
    with trio.move_on_after(RETIRE_S, shield=True) as scope:
        await _write_record(records, LifecycleRecord.of(target, kind, LifecycleState.RETIRED, now=now))
        try:
            removed = await calls.run_within(ROW_REMOVE_S, removing, remove_row_if_holds, paths, kind, target)
        except OSError as exc:
            raise Unavailable(f"the {kind.value} row file of {target.principal} could not be removed ({exc})") from exc
        refused = True  # the row no longer holds this lifecycle (removed now, or moved on before)
        try:
            withdrawn = await withdraw_issuance(issuance, target, progress=progress)
        except Unavailable as exc:
            raise progress.unfinished(target, str(exc)) from exc
    if scope.cancelled_caught:
        slow = f"took longer than {RETIRE_S:g} s"
        if refused:
            raise progress.unfinished(target, slow)
        raise Unavailable(f"retiring lifecycle {target.lifecycle_uid} {slow} before its row was known removed; call again")
    log.info(
        "space %s: retired %s lifecycle %s of %s (row %s, %d issuance rows withdrawn)", paths.space, kind.value,
        target.lifecycle_uid, target.principal, "removed" if removed else "already gone", withdrawn,
    )
    return withdrawn
