"""The callout's issued-authority port over a space's issued stores (issue 6 item 6;
:mod:`cotal_trio.core.connect_authority`; docs/issued-authority.md "Issued authority at connect").

:class:`ConnectAuthority` is the responder's ``issue_authority`` port: awaited after the ledger
re-check, it returns the rows to add to the grant, or None for none. It reads the accepted row
under the connect's token; with one there it reuses that generation or gives no rows; with none
it issues a fresh generation (evidence, attempt ``active``) and then writes the accepted row.

A managed ``run`` seat's spawner row is read fresh through the ``read_ledger`` port first
(:func:`~cotal_trio.core.connect_authority.spawner_to_read`); an unreadable or absent spawner
row makes the seat a listing caller, never a refused connect.

A store that fails (missing, drifted, unreachable) or a lost race for the token costs the
connect its rows, never the connect: the credential is minted on the legacy rail, as one issued
before this existed (spec "User-auth manager callers": a failed issuance never retries on that
rail). Cancellation (the callout's deadline) propagates; rows left half-written authorize
nothing (the attempt is not active) and go with their TTL.
"""

from __future__ import annotations

import logging

import trio

from ..core.bearer import ValidatedBearer
from ..core.callout import ConnectGrant
from ..core.connect_authority import (
    AuthorityPlan,
    authority_rows,
    ceiling_of,
    plan_connect_authority,
    reusable,
    same_ceiling,
    spawner_to_read,
    widen,
)
from ..core.errors import CodecError, Refused, Unavailable
from ..core.issued import Evidence, IssuedRef
from ..core.ledger import LedgerRow
from ..core.profiles import Permissions
from .callout import ReadLedger
from .issued import IssuedStores

__all__ = ["ConnectAuthority"]

log = logging.getLogger("cotal.callout")

# Bound on retiring a generation whose accepted row lost a race (seconds, shielded).
RETIRE_S = 1.0


class ConnectAuthority:
    """``await port(bearer, grant, row, inbox_nonce, now) -> Permissions | None`` over ``stores``.

    Args:
        stores: the space's :class:`~cotal_trio.lanes.issued.IssuedStores` over the lane's store
            connection.
        read_ledger: the callout's ledger port, for a managed ``run`` seat's spawner row; without
            one no managed seat is issued (spec "User-auth manager callers").
    """

    def __init__(self, stores: IssuedStores, *, read_ledger: ReadLedger | None = None) -> None:
        self._stores, self._read_ledger = stores, read_ledger

    async def __call__(
        self, bearer: ValidatedBearer, grant: ConnectGrant, row: LedgerRow, inbox_nonce: str, now: float
    ) -> Permissions | None:
        """Trio: the rows to add to ``grant``, or None (no rows owed, or none to be had).

        A checkpoint only when rows are owed (``agent`` and ``manager-caller`` bearers).
        """
        spawner = await self._spawner(bearer, row)
        plan = plan_connect_authority(
            space=self._stores.space, bearer=bearer, row=row, inbox_nonce=inbox_nonce, spawner=spawner
        )
        if plan is None:
            return None
        try:
            return await self._rows(plan, grant.permissions, now)
        except (Refused, CodecError, Unavailable) as exc:
            log.warning(
                "auth callout: space=%s %s.%s gets no ep.v1 rows (%s generation): %s",
                plan.space, plan.owner, plan.actor, plan.kind, exc,
            )
            return None

    async def _spawner(self, bearer: ValidatedBearer, row: LedgerRow) -> LedgerRow | None:
        """The fresh row of a managed ``run`` seat's spawner (its one row, of either kind), or None:
        not such a seat, no ledger port, no row, rows of both kinds (a broken ledger, which the
        connect check refuses too) or an unreadable one (logged)."""
        principal = spawner_to_read(bearer, row)
        if principal is None or self._read_ledger is None:
            return None
        try:
            interactive, managed = await self._read_ledger(*principal)
        except (CodecError, Refused) as exc:
            log.warning("auth callout: space=%s spawner %s of %s unreadable: %s", self._stores.space, row.parent, row.principal, exc)
            return None
        if interactive is not None and managed is not None:  # a broken ledger: never a spawner
            log.warning("auth callout: space=%s spawner %s holds rows of both kinds", self._stores.space, row.parent)
            return None
        return managed if managed is not None else interactive

    async def _rows(self, plan: AuthorityPlan, permissions: Permissions, now: float) -> Permissions | None:
        ref = await self._stores.accepted_ref(plan.token, now=now)
        if ref is not None:
            return await self._reuse(plan, ref, permissions, now)
        fresh = self._stores.new_ref(owner=plan.owner, actor=plan.actor, uid=plan.uid, horizon=plan.horizon)
        extra = authority_rows(plan, fresh.generation)
        evidence = Evidence(ref=fresh, sources=(), permissions=ceiling_of(widen(permissions, extra)), expires_at=plan.horizon)
        await self._stores.issue(evidence, now=now)
        try:
            await self._stores.accept(plan.token, fresh, now=now)
        except BaseException:
            await self._retire_quietly(fresh, now)  # the token is someone else's now, or unwritten
            raise
        return extra

    async def _reuse(self, plan: AuthorityPlan, ref: IssuedRef, permissions: Permissions, now: float) -> Permissions | None:
        """The existing generation's rows if it may be reused (caller, horizon, ceiling), else None."""
        if not reusable(plan, ref, now=now):  # before any evidence read: a dead generation is never read
            log.info("auth callout: space=%s accepted row %s names another caller or horizon", plan.space, plan.token)
            return None
        evidence = (await self._stores.resolve(ref, now=now)).evidence
        extra = authority_rows(plan, ref.generation)
        return extra if same_ceiling(evidence, widen(permissions, extra)) else None

    async def _retire_quietly(self, ref: IssuedRef, now: float) -> None:
        with trio.move_on_after(RETIRE_S, shield=True):
            try:
                await self._stores.retire(ref, now=now)
            except Exception as exc:  # noqa: BLE001 - the original failure is what counts
                log.warning("auth callout: space=%s generation %s not retired: %s", self._stores.space, ref.generation, exc)

