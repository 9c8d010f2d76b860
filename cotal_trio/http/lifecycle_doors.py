"""The loopback face's lifecycle doors (spec "Host-only routes"; docs/host-doors.md).

* ``POST /interactive-lifecycle/retire`` ``{owner, actor, lifecycleUid}``: retire the lifecycle of
  the principal's interactive row (``cotal actor grant``/``revoke``);
* ``POST /managed-lifecycle/activate`` ``{owner, actor, lifecycleUid, accountPublicKey}``: record
  a managed lifecycle as active (idempotent);
* ``POST /managed-lifecycle/retire`` ``{owner, actor, lifecycleUid}``: retire the lifecycle of the
  principal's managed row.

:func:`routes` returns these for :func:`~cotal_trio.http.errors.install_edge`. Each handler
first awaits the face's ``guard`` (transport checks, the capability, the JSON body: the door
never checks the capability itself), then decides in :mod:`cotal_trio.core.lifecycle` and does
the I/O through :mod:`cotal_trio.stores.lifecycle`. Every refusal before the barrier is a
:class:`~cotal_trio.core.errors.Refused` carrying ``"outcome": "not-executed"``; a failure after
the barrier began and before the row's removal is an :class:`~cotal_trio.core.errors.Unavailable`
(503, no outcome: unknown); a withdrawal that did not finish after the removal is a 202
``"withdrawn": "partial"`` (the lifecycle is refused; the rows left end on their TTL).

The three doors share one ``trio.Lock`` per :func:`routes` call, so an activation's read and
write never interleave with a retirement of the same space (the full lane is the only writer of
lifecycle records).

The ledger read blocks on a disk, so it runs in a worker thread of the doors' own
:class:`~cotal_trio.state.ledger_threads.BlockingCalls` (at most
:data:`~cotal_trio.http.faces.LEDGER_THREADS` at once, apart from the exchange's) and is
abandoned at :data:`~cotal_trio.http.faces.LEDGER_READ_S`, as the exchange's read is (issue 15
item 7): a stalled row file holds its own request and the lock only until then, never the lane's
trio thread. That read comes before the barrier, so its 503 carries ``"outcome":
"not-executed"`` (:func:`_fresh_row`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from cotal_trio.core.errors import CodecError, RateLimited, RefusalCode, Refused, Unavailable
from cotal_trio.core.ledger import LedgerKind, LedgerRow, ReadRows
from cotal_trio.core.lifecycle import (
    NOT_EXECUTED,
    LifecycleTarget,
    activated_answer,
    check_activation,
    check_retirable,
    corrupt_row_refusal,
    parse_activate_body,
    parse_retire_body,
    retired_answer,
)
from cotal_trio.http import faces
from cotal_trio.http.errors import UNAVAILABLE, Handler, Rejected
from cotal_trio.http.faces import TOO_MANY_REFUSALS
from cotal_trio.stores.issuance import RowStore
from cotal_trio.stores.lifecycle import (
    LifecycleRecords,
    PARTIAL,
    WithdrawalUnfinished,
    activate_lifecycle,
    finish_held_rows,
    read_record,
    retire_lifecycle,
)
from cotal_trio.state import SpacePaths
from cotal_trio.state.ledger_threads import BlockingCalls

__all__ = [
    "INTERACTIVE_RETIRE_PATH",
    "LIFECYCLE_PATHS",
    "MANAGED_ACTIVATE_PATH",
    "MANAGED_RETIRE_PATH",
    "Guard",
    "LifecycleDoors",
    "routes",
]

LOGGER = logging.getLogger("cotal.http")

INTERACTIVE_RETIRE_PATH = "/interactive-lifecycle/retire"
MANAGED_ACTIVATE_PATH = "/managed-lifecycle/activate"
MANAGED_RETIRE_PATH = "/managed-lifecycle/retire"
LIFECYCLE_PATHS = (INTERACTIVE_RETIRE_PATH, MANAGED_ACTIVATE_PATH, MANAGED_RETIRE_PATH)
_NO_STORE = {"Cache-Control": "no-store"}

Guard = Callable[[], Awaitable[object]]
"""``await guard()``: the face's pre-checks for a host door; returns the decoded JSON body or
raises (``Rejected``/``Refused``)."""


def _ledger_threads() -> BlockingCalls:
    return BlockingCalls(max_threads=faces.LEDGER_THREADS)


@dataclass(frozen=True, slots=True, kw_only=True)
class LifecycleDoors:
    """The ports of one space's lifecycle doors.

    Attributes:
        space: the space name (named in refusals).
        data_account: the space's assigned data account ``A…`` (``SpaceMaterial.data_account``).
        read_ledger: :data:`~cotal_trio.core.ledger.ReadRows`, a fresh read per call; blocking,
            so the doors call it only from a worker thread of :attr:`threads`.
        paths: the space's files (the row files a retirement removes).
        records: the records store ``cotal_records_<space>`` (``stores.records.RecordsStore``).
        issuance: the space's issuance rows ``cotal_auth_<space>`` (``stores.issuance.issuance_store``).
        clock: wall time, unix seconds (a record's ``at``).
        threads: the worker threads the ledger reads run in, at most
            :data:`~cotal_trio.http.faces.LEDGER_THREADS` at once; fresh for each instance.
    """

    space: str
    data_account: str
    read_ledger: ReadRows
    paths: SpacePaths
    records: LifecycleRecords
    issuance: RowStore
    clock: Callable[[], float]
    threads: BlockingCalls = field(init=False, repr=False, compare=False, default_factory=_ledger_threads)


async def _fresh_row(ctx: LifecycleDoors, target: LifecycleTarget, kind: LedgerKind) -> LedgerRow | None:
    """Trio: the principal's row of ``kind``, read in a worker thread within
    ``faces.LEDGER_READ_S`` (read at each call).

    Raises:
        Refused: CONFLICT with ``not-executed`` when a row of the principal is corrupt.
        Rejected: 503 ``{"outcome": "not-executed", "error": UNAVAILABLE}`` with ``Retry-After:
            5`` when the read did not answer within the bound (nothing was done: the barrier
            comes after it); :data:`~cotal_trio.http.faces.LEDGER_STALLED` is logged at warning.
    """
    limit_s = faces.LEDGER_READ_S
    stalled = faces.LEDGER_STALLED.format(s=limit_s)
    try:
        rows = await ctx.threads.run_within(limit_s, stalled, ctx.read_ledger, target.owner, target.actor)
    except CodecError as corrupt:
        raise corrupt_row_refusal(corrupt) from None
    except Unavailable as unanswered:
        LOGGER.warning("auth-service: a dependency is unavailable: %s", unanswered)
        raise Rejected(503, UNAVAILABLE, {"Retry-After": "5"}, fields=NOT_EXECUTED) from None
    interactive, managed = rows
    return managed if kind is LedgerKind.MANAGED else interactive


def _refusal_logged(door: str, refusal: Refused) -> None:
    LOGGER.warning("auth-service: refused %s: %s", door, refusal.detail)


async def _finish_held(ctx: LifecycleDoors, target: LifecycleTarget, kind: LedgerKind) -> bool:
    """Trio: :func:`~cotal_trio.stores.lifecycle.finish_held_rows` in a worker thread within
    ``faces.LEDGER_READ_S``; True when a held row of this lifecycle was removed.

    Raises:
        Rejected: 503 with ``not-executed`` when it did not answer or failed, as a stalled read.
    """
    limit_s = faces.LEDGER_READ_S
    try:
        return await ctx.threads.run_within(
            limit_s, faces.LEDGER_STALLED.format(s=limit_s), finish_held_rows, ctx.paths, kind, target,
        )  # fmt: skip
    except (Unavailable, OSError) as unanswered:
        LOGGER.warning("auth-service: a dependency is unavailable: %s", unanswered)
        raise Rejected(503, UNAVAILABLE, {"Retry-After": "5"}, fields=NOT_EXECUTED) from None


async def _retire(ctx: LifecycleDoors, body: object, kind: LedgerKind) -> dict[str, Any]:
    """Decide, then run the barrier; the 200 body, or a partial retirement's (202, see
    :func:`routes`).

    A removal that an earlier call abandoned (its row left renamed aside) is finished first; when
    it held this very lifecycle, that call had got past the row's removal, so this one runs the
    retirement again (the record rewritten, no row to remove, the withdrawal) instead of 404.

    Raises:
        Refused: before the barrier, with ``not-executed``.
        Unavailable: after the barrier began (503, no outcome: unknown).
    """
    target = parse_retire_body(body)
    resumed = await _finish_held(ctx, target, kind)
    row = await _fresh_row(ctx, target, kind)
    if not (resumed and row is None):
        check_retirable(target, row, kind=kind, space=ctx.space)
    try:
        withdrawn = await retire_lifecycle(
            target, kind=kind, records=ctx.records, issuance=ctx.issuance, paths=ctx.paths, now=ctx.clock(),
            threads=ctx.threads,
        )  # fmt: skip
    except WithdrawalUnfinished as partial:
        LOGGER.warning("auth-service: %s", partial)
        return partial.answer()
    return retired_answer(target, withdrawn=withdrawn)


async def _activate(ctx: LifecycleDoors, body: object) -> dict[str, Any]:
    target, account = parse_activate_body(body)
    row = await _fresh_row(ctx, target, LedgerKind.MANAGED)
    record = await read_record(ctx.records, target.lifecycle_uid)
    write = check_activation(target, account, data_account=ctx.data_account, space=ctx.space, row=row, record=record)
    if write:
        await activate_lifecycle(ctx.records, target, now=ctx.clock())
    return activated_answer(target)


def routes(
    ctx: LifecycleDoors, *, guard: Guard, admit_refusal: Callable[[float], bool] | None = None
) -> dict[str, dict[str, Handler]]:
    """The three lifecycle doors of one space, for ``install_edge`` (module docstring).

    Args:
        ctx: the space's ports.
        guard: the loopback face's pre-checks; every handler awaits it first and decides on the
            body it returns.
        admit_refusal: the face's shared refused-request window (called with the wall time once
            per door refusal, ``True`` while it fits); once full a refusal answers 429
            :data:`~cotal_trio.http.faces.TOO_MANY_REFUSALS`, still with ``"outcome":
            "not-executed"`` (nothing was done). None: never throttled here.

    Returns:
        ``{path: {"POST": handler}}``; each handler answers ``(body, 200, {"Cache-Control":
        "no-store"})`` (202 for a partial retirement: retired and refused, some issuance rows
        left to their TTL, ``"withdrawn": "partial"``) or raises for the edge (``Refused`` 4xx with ``"outcome":
        "not-executed"``, ``Unavailable`` 503). Each call has its own lock.
    """
    lock = trio.Lock()

    def door(name: str, decide: Callable[[object], Awaitable[dict[str, Any]]]) -> Handler:
        async def handle() -> tuple[dict[str, Any], int, dict[str, str]]:
            try:  # the face's pre-checks refuse before the barrier too (spec "Host-only routes")
                body = await guard()
            except RateLimited:
                raise
            except Refused as refusal:
                raise Refused(refusal.code, refusal.detail, fields={**refusal.fields, **NOT_EXECUTED}) from None
            except Rejected as rejected:
                raise Rejected(rejected.status, rejected.sentence, rejected.headers, fields=NOT_EXECUTED) from None
            try:
                async with lock:
                    answer = await decide(body)
            except Refused as refusal:
                _refusal_logged(name, refusal)
                if admit_refusal is None or admit_refusal(ctx.clock()):
                    raise
                raise Refused(RefusalCode.RATE_LIMITED, TOO_MANY_REFUSALS, fields=refusal.fields) from None
            # a partial retirement is done as far as refusing goes, not in full: 202 tells it apart
            return answer, 202 if answer.get("withdrawn") == PARTIAL else 200, dict(_NO_STORE)

        return handle

    def retire_of(kind: LedgerKind) -> Callable[[object], Awaitable[dict[str, Any]]]:
        async def decide(body: object) -> dict[str, Any]:
            return await _retire(ctx, body, kind)

        return decide

    async def activate(body: object) -> dict[str, Any]:
        return await _activate(ctx, body)

    return {
        INTERACTIVE_RETIRE_PATH: {"POST": door("an interactive retirement", retire_of(LedgerKind.INTERACTIVE))},
        MANAGED_ACTIVATE_PATH: {"POST": door("a managed activation", activate)},
        MANAGED_RETIRE_PATH: {"POST": door("a managed retirement", retire_of(LedgerKind.MANAGED))},
    }
